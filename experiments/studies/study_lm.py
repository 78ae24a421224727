"""Language modelling on real text: every causal mixer at equal parameters and equal tokens.

Byte-level language models on two corpora (``data.TextDataset``): the King
James Bible (``kjv``, every causal mixer) and the source of Python's standard
library (``python_stdlib``, six representative mixers at the committed size,
for lack of time; ``FULL["corpus_mixers"]``). Every mixer gets the same width, depth, heads, learning
rate, batch, sequence length and number of steps (so the same training
tokens), and the MLP width that brings its parameter count to that of the
softmax model with a 4x MLP (``models.matched_mlp_ratio``; with a smaller
reference MLP, RWKV-6's mixer alone would exceed the budget at width 64). Reported: validation bits per
byte, training tokens per second (each run single-threaded, two at a time on
2 cores), and the loss curves.

The published picture this is compared against (e.g. the GLA paper, Yang et
al. 2023, table 2; the Mamba paper's scaling laws): at equal parameters and
tokens, gated linear-time models (GLA, Mamba, Mamba-2, Gated DeltaNet) come
close to or match softmax attention, while ungated linear attention and
fixed random-feature maps (Performer) are clearly worse.

    python experiments/studies/study_lm.py            # full size (about 40 minutes on 2 cores)
    python experiments/studies/study_lm.py --smoke    # tiny, for CI
    python experiments/studies/study_lm.py --corpora kjv \
        --mixers softmax,gla,mamba2,hawk,linear --softmax-conv --lrs 1e-3,3e-3 \
        --seeds 0,1,2 --steps-scale 4       # round 4's re-run (issue 40): not run yet

With ``--seeds`` and ``--lrs`` each (mixer, rate) trains once per seed; the table keeps, per
(corpus, mixer), the rate with the lowest mean bits per byte over its seeds, with the
between-seed standard error (``bpb_se``, None for one seed) and every seed's figure.
``--softmax-conv`` adds softmax with the short convolution (width 4) that Mamba has built in,
as the mixer ``softmax+conv``.

Writes ``<out>/lm.json`` (runs, curves, table) and ``<out>/lm.csv`` (the
table), and prints the table.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _study_utils as su  # noqa: E402

from linear_attention.nn import registry  # noqa: E402

# ``corpus_mixers``: a smaller set for a corpus, where the budget ran out (2 cores, one session).
FULL = dict(mixers=None, corpora=("kjv", "python_stdlib"),
            corpus_mixers={"python_stdlib": registry.select(study="lm_corpus")}, d_model=64, num_layers=2,
            num_heads=2, reference_mlp_ratio=4.0, seq_len=256, batch=16, steps=300, lr=3e-3,
            eval_batches=16)
SMOKE = dict(mixers=("softmax", "gla"), corpora=("kjv",), d_model=32, num_layers=1,
             num_heads=2, reference_mlp_ratio=8 / 3, seq_len=32, batch=4, steps=10, lr=3e-3,
             eval_batches=2)
VOCAB = 256  # bytes


def mixer_label(overrides: dict) -> str:
  """The mixer a run stands for: its ``model.mixer``, ``+conv`` with a short convolution."""
  return overrides["model.mixer"] + ("+conv" if overrides.get("model.short_conv") else "")


def seed_table(done: list[dict], default_lr: float) -> list[dict]:
  """One row per (corpus, mixer) of the finished runs ``done``: the learning rate with the
  lowest mean validation bits per byte over its seeds, that mean (``bits_per_byte``), its
  between-seed standard error (``bpb_se``; None for one seed), the seeds and their figures,
  and the median training tokens/s of the first seed."""
  groups: dict[tuple, list[dict]] = {}
  for r in done:
    o = r["overrides"]
    groups.setdefault((o["data.corpus"], mixer_label(o), o.get("optim.lr", default_lr)),
                      []).append(r)
  best: dict[tuple, tuple] = {}
  for (corpus, m, lr), runs in groups.items():
    runs.sort(key=lambda r: su.seed_of(r["overrides"]))
    mean, se = su.seed_mean_se([r["metrics"]["validation_bits_per_byte"] for r in runs])
    if (corpus, m) not in best or mean < best[(corpus, m)][1]:
      best[(corpus, m)] = (lr, mean, se, runs)
  table = []
  for (corpus, m), (lr, mean, se, runs) in best.items():
    tps = [c["tokens_per_s"] for c in runs[0]["train_curve"] if c.get("tokens_per_s")]
    table.append({"corpus": corpus, "mixer": m, "num_params": runs[0]["metrics"]["num_params"],
                  "mlp_ratio": runs[0]["overrides"]["model.mlp_ratio"], "lr": lr,
                  "bits_per_byte": mean, "bpb_se": se, "n_seeds": len(runs),
                  "seeds": [su.seed_of(r["overrides"]) for r in runs],
                  "seed_bits_per_byte": [r["metrics"]["validation_bits_per_byte"] for r in runs],
                  "lr_bits_per_byte": {str(k[2]): su.seed_mean_se(
                      [r["metrics"]["validation_bits_per_byte"] for r in g])[0]
                      for k, g in groups.items() if k[:2] == (corpus, m)},
                  "tokens_per_s": statistics.median(tps) if tps else None})
  return table


def main() -> int:
  t0 = time.time()
  p = su.study_args(__doc__, "lm")
  su.add_seeds_flag(p)
  p.add_argument("--mixers", help="comma-separated mixers (default: the size's)")
  p.add_argument("--corpora", help="comma-separated corpora (default: the size's)")
  p.add_argument("--lrs", help="comma-separated learning rates, each trained per mixer and "
                 "seed; the table keeps the best mean (default: the size's one rate)")
  p.add_argument("--softmax-conv", action="store_true",
                 help="add softmax with a short convolution of width 4 (softmax+conv)")
  args = p.parse_args()
  size = dict(SMOKE if args.smoke else FULL)
  size["steps"] = su.scaled_steps(size["steps"], args)
  if args.mixers:
    size["mixers"] = tuple(args.mixers.split(","))
    size["corpus_mixers"] = {}
  if args.corpora:
    size["corpora"] = tuple(args.corpora.split(","))
  size["seeds"] = su.parse_seeds(args.seeds)
  lrs = tuple(float(x) for x in args.lrs.split(",")) if args.lrs else None
  from linear_attention import models, nn

  size = dict(size, mixers=tuple(size["mixers"] or nn.CAUSAL_MIXERS))
  mixers = size["mixers"]
  points = []
  for corpus in size["corpora"]:
    chosen = list(size.get("corpus_mixers", {}).get(corpus) or mixers)
    for m in chosen + (["softmax+conv"] if args.softmax_conv else []):
      base = m.split("+")[0]
      ratio = models.matched_mlp_ratio(VOCAB, size["d_model"], size["num_layers"], mixer=base,
                                       num_heads=size["num_heads"],
                                       reference_mlp_ratio=size["reference_mlp_ratio"])
      point = {"data.corpus": corpus, "model.mixer": base, "model.mlp_ratio": ratio}
      if m == "softmax+conv":
        point["model.short_conv"] = 4
      for lr in lrs or (None,):
        for seed in size["seeds"]:
          points.append({**point, **({"optim.lr": lr} if lr else {}),
                         **su.seed_overrides(seed)})
  steps = size["steps"]
  flags = (f"--config.data.seq_len={size['seq_len']}", f"--config.data.batch_size={size['batch']}",
           f"--config.model.d_model={size['d_model']}",
           f"--config.model.num_layers={size['num_layers']}",
           f"--config.model.num_heads={size['num_heads']}", f"--config.optim.lr={size['lr']}",
           *su.schedule_flags(steps, size["eval_batches"]))
  rows = su.train_grid("configs/text_lm.py:size=small", points, su.runs_dir(args, "lm"),
                       args.workers, flags)

  table = seed_table([r for r in rows if r["status"] == "done"], size["lr"])
  for row in table:
    ref = next((x for x in table if x["corpus"] == row["corpus"] and x["mixer"] == "softmax"), None)
    if ref and ref["tokens_per_s"] and row["tokens_per_s"]:
      row["speed_vs_softmax"] = row["tokens_per_s"] / ref["tokens_per_s"]
      row["bpb_vs_softmax"] = row["bits_per_byte"] - ref["bits_per_byte"]

  out = {"study": "lm", "config": {"smoke": args.smoke, **size},
         "elapsed_s": time.time() - t0,
         "training_tokens": size["batch"] * size["seq_len"] * steps,
         "environment": su.environment(shared_machine=None), "table": table, "runs": rows}
  cols = [("corpus", "corpus", "{}"), ("mixer", "mixer", "{}"), ("num_params", "params", "{:,}"),
          ("bits_per_byte", "val bits/byte", "{:.3f}"), ("bpb_vs_softmax", "vs softmax", "{:+.3f}"),
          ("tokens_per_s", "train tok/s", "{:,.0f}"), ("speed_vs_softmax", "speed/softmax", "{:.2f}")]
  return su.finish(args.out, "lm", out, table, cols, rows)


if __name__ == "__main__":
  sys.exit(main())
