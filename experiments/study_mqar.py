"""Associative recall study: multi-query associative recall (MQAR), Zoology's figure 2 at CPU scale.

The Zoology setting (Arora, Eyuboglu et al. 2023, "Zoology: measuring and
improving recall in efficient language models", section 3 and figure 2):
vocabulary 8192, two layers, one model per (mixer, width, setting) where a
setting is (sequence length, key-value pairs) = (64, 4) or (128, 8), zero
filler between the queries (Zoology's ``random_non_queries=False``), the
learning rate swept per point and the best one reported. Zoology's finding:
attention solves MQAR at every width, while the recurrent models need a large
state to approach it, and accuracy tracks the size of the recurrent state.

The recipe, the same for every mixer: a short causal convolution (width 3)
before every mixer (``model.short_conv``), which gives each mixer the
previous-token path that recall needs; Zoology's current configs wrap every
mixer the same way. A separate row group trains softmax attention without it,
to show what the path is worth. Constant learning rate after a 10% warmup
(the phase transition needs the rate still high when the previous-token head
forms) and early stopping at 0.99 validation accuracy, as Zoology does.

State size (the x axis of Zoology's figure) is measured, not computed by hand:
the floats in the model's decode cache (``model.init_cache(1, T)``) for one
sequence of ``T`` tokens: the key-value cache for attention (which grows with
``T``), the recurrent states and convolution windows otherwise.

Accuracy is on at least 1,024 fresh test queries per point, with its binomial
standard error ``sqrt(p (1 - p) / n)``.

Budget: 2 CPU cores. ``FULL`` trains at most 1,000 steps of 64 sequences
(64,000 examples) per point, against Zoology's 100,000 examples for 64 epochs
(6.4M examples); the JSON says so. The learning-rate sweep (``--lrs``) trains
the first rate on the whole grid, then each later rate only where the first did
not solve the point (validation accuracy below the early-stopping threshold):
a solved point cannot improve, so a second rate goes where it can change the
answer. Finished runs are reused when a study is rerun, so a larger grid can be
completed later with the same command.

    python experiments/study_mqar.py              # full size
    python experiments/study_mqar.py --lrs 1e-3,3e-3 --widths 64,128,256   # larger grid
    python experiments/study_mqar.py --lrs 3e-3,1e-3 --mixers mamba,hawk --widths 64  # a subset
    python experiments/study_mqar.py --smoke      # tiny, for CI

Writes ``<out>/mqar.json`` (every run with its curves and per-setting
accuracies, the best-learning-rate table and the budget against Zoology's)
and ``<out>/mqar.csv`` (the table), and prints the table.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _study_utils as su  # noqa: E402

from linear_attention.nn import registry  # noqa: E402

MIXERS = registry.select(study="mqar")

FULL = dict(mixers=MIXERS, widths=(64, 128), lrs=(3e-3, 1e-3),
            settings=((64, 4), (128, 8)), vocab=8192, batch=64, steps=1000, eval_every=100,
            eval_batches=2, short_conv=3, no_conv_mixers=("softmax",), early_stop=0.99,
            test_queries=1024, eval_batch_size=64)
SMOKE = dict(mixers=("softmax", "gla"), widths=(32,), lrs=(3e-3,), settings=((32, 4),),
             vocab=64, batch=8, steps=20, eval_every=10, eval_batches=1, short_conv=3,
             no_conv_mixers=("softmax",), early_stop=0.99, test_queries=16, eval_batch_size=8)
# Zoology's figure 2: 100k training examples, 64 epochs; widths 64-512; 4 learning rates.
PAPER = dict(train_examples=100_000 * 64, widths=(64, 128, 256, 512), learning_rates=4)


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


def points_of(size: dict) -> list[dict]:
  """Every (learning rate, width, setting, recipe, mixer) as override dicts, in the order
  they run: an interrupted study has whole (rate, width) grids over every mixer, the
  smallest width and the first rate first."""
  pts = []
  for lr in size["lrs"]:
    for d in size["widths"]:
      for t, n in size["settings"]:
        for conv, mixers in ((size["short_conv"], size["mixers"]), (0, size["no_conv_mixers"])):
          for m in mixers:
            pts.append({"model.mixer": m, "model.short_conv": conv, "data.seq_len": t,
                        "data.num_kv_pairs": n, "model.d_model": d, "optim.lr": lr})
  return pts


def setting_key(overrides: dict) -> tuple:
  """A grid point without its learning rate: (mixer, short conv, T, width)."""
  return tuple(overrides[k] for k in ("model.mixer", "model.short_conv", "data.seq_len",
                                      "model.d_model"))


def later_lr_points(points: list[dict], first_rows: list[dict], threshold: float) -> list[dict]:
  """The points at learning rates after the first whose first-rate run did not reach
  ``threshold`` validation accuracy (or has not finished)."""
  first_lr = points[0]["optim.lr"]
  solved = {setting_key(r["overrides"]) for r in first_rows if r["status"] == "done"
            and r["metrics"].get("validation_accuracy", 0.0) >= threshold}
  return [p for p in points if p["optim.lr"] != first_lr and setting_key(p) not in solved]


def main() -> int:
  t0 = time.time()
  p = su.study_args(__doc__, "mqar")
  p.add_argument("--widths", help="comma-separated model widths (default: the size's)")
  p.add_argument("--lrs", help="comma-separated learning rates, the first trained everywhere "
                 "(default: the size's)")
  p.add_argument("--mixers", help="comma-separated mixers (default: the size's)")
  args = p.parse_args()
  size = dict(SMOKE if args.smoke else FULL)
  if args.mixers:
    chosen = tuple(args.mixers.split(","))
    unknown = sorted(set(chosen) - set(size["mixers"]))
    if unknown:
      raise ValueError(f"--mixers must be among {', '.join(size['mixers'])}; got {unknown}.")
    size["mixers"] = chosen
    size["no_conv_mixers"] = tuple(m for m in size["no_conv_mixers"] if m in chosen)
  if args.widths:
    size["widths"] = tuple(int(w) for w in args.widths.split(","))
  if args.lrs:
    size["lrs"] = tuple(float(x) for x in args.lrs.split(","))
  size["steps"] = su.scaled_steps(size["steps"], args)
  points = points_of(size)
  steps = size["steps"]
  flags = (f"--config.data.vocab_size={size['vocab']}", "--config.data.random_non_queries=False",
           f"--config.data.batch_size={size['batch']}", "--config.model.num_heads=2",
           "--config.optim.schedule=constant", f"--config.train.steps={steps}",
           f"--config.optim.warmup_steps={max(steps // 10, 1)}",
           f"--config.train.eval_every={size['eval_every']}",
           f"--config.train.log_every={max(steps // 20, 1)}",
           f"--config.train.eval_batches={size['eval_batches']}",
           f"--config.train.checkpoint_every={steps}",
           "--config.train.early_stop_metric=accuracy",
           f"--config.train.early_stop_value={size['early_stop']}")
  grid = lambda pts: su.train_grid("configs/mqar.py:size=small", pts, su.runs_dir(args, "mqar"),
                                   args.workers, flags, collect_only=args.collect)
  first_lr = size["lrs"][0]
  rows = grid([p for p in points if p["optim.lr"] == first_lr])
  later = later_lr_points(points, rows, size["early_stop"])
  rows += grid(later) if later else []

  from linear_attention.train import trainer
  for r in rows:
    if r["status"] != "done":
      continue
    o = r["overrides"]
    t, n = o["data.seq_len"], o["data.num_kv_pairs"]
    per_batch = size["eval_batch_size"] * n
    num_batches = -(-size["test_queries"] // per_batch)
    res = trainer.evaluate_checkpoint(r["workdir"], {"batch_size": size["eval_batch_size"]},
                                      num_batches=num_batches, split="test")
    queries = num_batches * per_batch
    r.update(test_accuracy=res["accuracy"], test_queries=queries,
             test_se=su.binomial_se(res["accuracy"], queries), test_loss=res["loss"],
             state_floats=state_floats(r["workdir"], t),
             steps_run=r["metrics"]["step"], stopped_early=r["metrics"].get("stopped_early"))

  table = []
  groups = [(m, size["short_conv"]) for m in size["mixers"]]
  groups += [(m, 0) for m in size["no_conv_mixers"]]
  for m, conv in groups:
    for t, n in size["settings"]:
      for d in size["widths"]:
        cands = [r for r in rows if "test_accuracy" in r and r["overrides"]["model.mixer"] == m
                 and r["overrides"]["model.short_conv"] == conv
                 and r["overrides"]["data.seq_len"] == t and r["overrides"]["model.d_model"] == d]
        if not cands:
          continue
        best = max(cands, key=lambda r: r["test_accuracy"])
        table.append({
            "mixer": m, "short_conv": conv, "seq_len": t, "num_kv_pairs": n, "d_model": d,
            "best_lr": best["overrides"]["optim.lr"], "accuracy": best["test_accuracy"],
            "se": best["test_se"], "test_queries": best["test_queries"],
            "state_floats": best["state_floats"], "steps_run": best["steps_run"],
            "num_params": best["metrics"]["num_params"],
            "lr_accuracies": {str(c["overrides"]["optim.lr"]): c["test_accuracy"] for c in cands}})

  examples = size["batch"] * steps
  out = {"study": "mqar", "config": {"smoke": args.smoke, **size},
         "elapsed_s": time.time() - t0,
         "budget": {"training_examples_max": examples, "steps_max": steps,
                    "tokens_max": {str(t): examples * t for t, _ in size["settings"]},
                    "paper": PAPER,
                    "fraction_of_paper_examples": examples / PAPER["train_examples"],
                    "note": "early stopping at the accuracy threshold ends solved runs sooner"},
         "environment": su.environment(shared_machine=True), "table": table, "runs": rows}
  cols = [("mixer", "mixer", "{}"), ("short_conv", "conv", "{}"), ("seq_len", "T", "{}"),
          ("num_kv_pairs", "pairs", "{}"), ("d_model", "d", "{}"), ("best_lr", "lr", "{:g}"),
          ("accuracy", "acc", "{:.3f}"), ("se", "se", "{:.3f}"), ("steps_run", "steps", "{}"),
          ("state_floats", "state", "{:,}")]
  return su.finish(args.out, "mqar", out, table, cols, rows)


if __name__ == "__main__":
  sys.exit(main())
