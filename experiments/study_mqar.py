"""Associative recall study: multi-query associative recall (MQAR) per mixer and width.

The Zoology setting (Arora, Eyuboglu et al. 2023, "Zoology: measuring and
improving recall in efficient language models", section 3 and figure 2):
vocabulary 8192, two layers, one model per (mixer, width) trained on a mixture
of sequence lengths 64, 128 and 256 with 4, 8 and 16 key-value pairs
(``configs/mqar.py`` with ``data.mixture``), then evaluated on each setting
separately. The learning rate is swept per (mixer, width) and the best one is
reported, as Zoology does. Zoology's finding: attention solves MQAR at every
width, while gated/recurrent models need a large state (width) to approach it,
and accuracy tracks the size of the recurrent state.

State size (the x axis of Zoology's figure) is measured, not computed by hand:
the number of floats in the model's decode cache (``model.init_cache(1, T)``)
for a sequence of length ``T``: the key-value cache for attention (which grows
with ``T``), the recurrent states (and short-convolution windows) otherwise.

Budget: 2 CPU cores. The committed run (``FULL``) trains each mixer at one
width (64) and one learning rate on 32,000 examples, about 200x fewer than
Zoology's; ``--widths`` and ``--lrs`` run Zoology's grid where there is time.
The best learning rate per (mixer, width) is picked by mean accuracy.

    python experiments/study_mqar.py              # full size (about 70 minutes on 2 cores)
    python experiments/study_mqar.py --widths 64,128,256 --lrs 1e-3,3e-3   # Zoology's grid
    python experiments/study_mqar.py --smoke      # tiny, for CI

Writes ``<out>/mqar.json`` (every run with its curves and per-setting
accuracies, and the best-learning-rate table) and ``<out>/mqar.csv`` (the
table), and prints the table.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _study_utils as su  # noqa: E402

MIXERS = ("softmax", "linear", "retnet", "gla", "mamba", "mamba2", "deltanet", "gated_deltanet",
          "hawk")

# What was run for the committed results: one width and learning rate per mixer, 32k
# training examples. Zoology's grid is ``--widths 64,128,256 --lrs 1e-3,3e-3`` (and far more
# examples: ``--steps-scale``); each added width or rate is another 9 runs.
FULL = dict(mixers=MIXERS, widths=(64,), lrs=(3e-3,),
            settings=((64, 4), (128, 8), (256, 16)), vocab=8192, batch=16, steps=2000,
            eval_batches=8, eval_batch_size=64)
SMOKE = dict(mixers=("softmax", "gla"), widths=(32,), lrs=(3e-3,),
             settings=((16, 2), (32, 4)), vocab=64, batch=8, steps=20, eval_batches=1,
             eval_batch_size=8)


def state_floats(workdir: str, seq_len: int) -> int:
  """Floats in the decode cache of the run's model for one sequence of ``seq_len`` tokens."""
  import jax
  import numpy as np
  from linear_attention import data
  from linear_attention.train import trainer

  config = trainer.load_config(workdir)
  ds = data.make_dataset(config.data)

  def cache():
    model = trainer.create_model(config.model, ds.vocab_size, ds.kind, None, 0)
    return model.init_cache(1, seq_len)

  shapes = jax.eval_shape(cache)
  leaves = [x for x in jax.tree.leaves(shapes) if x.ndim > 0]  # skip position counters
  return int(sum(np.prod(x.shape) for x in leaves))


def main() -> int:
  t0 = time.time()
  p = su.study_args(__doc__, "mqar")
  p.add_argument("--widths", help="comma-separated model widths (default: the size's)")
  p.add_argument("--lrs", help="comma-separated learning rates (default: the size's)")
  args = p.parse_args()
  size = dict(SMOKE if args.smoke else FULL)
  if args.widths:
    size["widths"] = tuple(int(w) for w in args.widths.split(","))
  if args.lrs:
    size["lrs"] = tuple(float(x) for x in args.lrs.split(","))
  size["steps"] = su.scaled_steps(size["steps"], args)
  mixture = ",".join(f"{t}:{n}" for t, n in size["settings"])
  max_len = max(t for t, _ in size["settings"])
  points = [{"model.mixer": m, "model.d_model": d, "optim.lr": lr}
            for m in size["mixers"] for d in size["widths"] for lr in size["lrs"]]
  flags = (f"--config.data.mixture={mixture}", f"--config.data.seq_len={max_len}",
           f"--config.data.vocab_size={size['vocab']}",
           f"--config.data.batch_size={size['batch']}",
           "--config.model.num_heads=2", *su.schedule_flags(size["steps"], 2))
  rows = su.train_grid("configs/mqar.py:size=small", points, su.runs_dir(args, "mqar"),
                       args.workers, flags)

  from linear_attention.train import trainer
  for r in rows:
    if r["status"] != "done":
      continue
    r["settings"] = []
    for t, n in size["settings"]:
      res = trainer.evaluate_checkpoint(
          r["workdir"], {"mixture": "", "seq_len": t, "num_kv_pairs": n,
                         "batch_size": size["eval_batch_size"]},
          num_batches=size["eval_batches"], split="test")
      r["settings"].append({"seq_len": t, "num_kv_pairs": n, "accuracy": res["accuracy"],
                            "loss": res["loss"], "state_floats": state_floats(r["workdir"], t)})
    r["mean_accuracy"] = sum(s["accuracy"] for s in r["settings"]) / len(r["settings"])

  table = []
  for m in size["mixers"]:
    for d in size["widths"]:
      cands = [r for r in rows if r["overrides"]["model.mixer"] == m
               and r["overrides"]["model.d_model"] == d and "mean_accuracy" in r]
      if not cands:
        continue
      best = max(cands, key=lambda r: r["mean_accuracy"])
      row = {"mixer": m, "d_model": d, "best_lr": best["overrides"]["optim.lr"],
             "num_params": best["metrics"]["num_params"], "mean_accuracy": best["mean_accuracy"],
             "lr_accuracies": {str(c["overrides"]["optim.lr"]): c["mean_accuracy"] for c in cands}}
      for s in best["settings"]:
        row[f"acc_{s['seq_len']}"] = s["accuracy"]
        row[f"state_{s['seq_len']}"] = s["state_floats"]
      table.append(row)

  out = {"study": "mqar", "config": {"smoke": args.smoke, **size},
         "elapsed_s": time.time() - t0,
         "training_examples": size["batch"] * size["steps"],
         "environment": su.environment(shared_machine=None), "table": table, "runs": rows}
  lens = [t for t, _ in size["settings"]]
  cols = ([("mixer", "mixer", "{}"), ("d_model", "d", "{}"), ("best_lr", "lr", "{:g}")]
          + [(f"acc_{t}", f"acc@{t}", "{:.3f}") for t in lens]
          + [("mean_accuracy", "mean", "{:.3f}"), (f"state_{max_len}", f"state@{max_len}", "{}")])
  return su.finish(args.out, "mqar", out, table, cols, rows)


if __name__ == "__main__":
  sys.exit(main())
