"""Selective copying with a long spread: where a time-invariant model should fail (issue 30).

The synthetic study (``study_synthetic.py``) trains selective copying at T=64 (16 data tokens
in 48 slots, then 16 markers): there Mamba and S4D end level (about 0.78 each), because 48
slots hold few enough offsets for a fixed kernel to learn them. At T=256 with 16 tokens a
pilot stayed at chance for 1000 steps, too slow for 2 shared cores. This study keeps the
paper's layout (``data.SelectiveCopying``: data tokens at random ordered positions of the
first ``T - N`` slots, then ``N`` markers, vocabulary 16) and makes the spread large against
the number of tokens instead: ``N`` = 4 data tokens among ``T - N`` = 124 slots at T=128, so
where the i-th token sits varies over about 100 positions. The recipe is the synthetic
study's (d 64, 2 layers, short conv 3, lr 3e-3 constant after a warmup), batch 32, early
stopping at 0.99 validation accuracy.

Every run keeps its validation curve (every ``eval_every`` steps). A run stopped before its
last step (``--collect`` while training, or a deadline) is tested at its newest checkpoint and
says so (``stopped_at``). The claim (``experiments/studies/claims.py``) is a row of the synthetic
study's table: the Mamba paper's selective-copying claim at this spread.

    python experiments/studies/study_selective_copying.py            # Mamba and S4D at T=128, N=4
    python experiments/studies/study_selective_copying.py --collect  # the runs finished so far
    python experiments/studies/study_selective_copying.py --smoke    # tiny, for CI

Writes ``<out>/selective_copying.json`` (config, every run with its curves and test
accuracy) and ``<out>/selective_copying.csv`` (one row per mixer), and prints the table.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _study_utils as su  # noqa: E402

NAME = "selective_copying"
FULL = dict(mixers=("mamba", "s4d"), seq_len=128, num_tokens=4, batch=32, d_model=64,
            lr=3e-3, short_conv=3, steps=2000, warmup=50, eval_every=50, log_every=25,
            eval_batches=4, test_batches=8, test_batch=64)
SMOKE = dict(FULL, seq_len=32, num_tokens=2, batch=8, d_model=16, steps=10, warmup=2,
             eval_every=5, log_every=5, eval_batches=1, test_batches=1, test_batch=8)
PAPER = dict(seq_len=4096, num_tokens=16, batch=64, steps=400_000)
CHANCE = 1 / 14  # the 16-token vocabulary less the noise and marker tokens


def flags(size: dict) -> tuple[str, ...]:
  """The ``--config.*`` flags every run of ``size`` trains with (the mixer is the point)."""
  s = size
  values = {"data.seq_len": s["seq_len"], "data.num_tokens": s["num_tokens"],
            "data.batch_size": s["batch"], "model.d_model": s["d_model"], "optim.lr": s["lr"],
            "optim.schedule": "constant", "train.steps": s["steps"],
            "optim.warmup_steps": s["warmup"], "train.eval_every": s["eval_every"],
            "train.log_every": s["log_every"], "train.eval_batches": s["eval_batches"],
            "train.checkpoint_every": s["eval_every"], "model.short_conv": s["short_conv"],
            "train.early_stop_metric": "accuracy", "train.early_stop_value": 0.99}
  return tuple(f"--config.{k}={su.flag_text(v)}" for k, v in values.items())


def score(row: dict, size: dict) -> None:
  """Adds the test accuracy of ``row``'s run (a ``train_grid`` row) at its newest checkpoint;
  a run stopped part-way says where (``stopped_at``). A run with no checkpoint is left as is."""
  from linear_attention.train import checkpoint, results
  stopped_at = None if row["status"] == "done" else checkpoint.newest_step_on_disk(
      row["workdir"])
  if row["status"] != "done" and not stopped_at:
    return
  res = results.evaluate_checkpoint(row["workdir"], {"batch_size": size["test_batch"]},
                                    num_batches=size["test_batches"], split="test")
  n = size["test_batch"] * size["test_batches"] * size["num_tokens"]
  row.update(step=res["step"], test_accuracy=res["accuracy"], test_tokens=n,
             test_se=su.binomial_se(res["accuracy"], n), train_sequences=res["step"] * size["batch"],
             stopped_at=stopped_at)


def main() -> int:
  t0 = time.time()
  p = su.study_args(__doc__, NAME)
  p.add_argument("--mixers", default=None, help="comma-separated (default: mamba,s4d)")
  args = p.parse_args()
  size = dict(SMOKE if args.smoke else FULL)
  size["steps"] = su.scaled_steps(size["steps"], args)
  if args.mixers:
    size["mixers"] = tuple(args.mixers.split(","))
  rows = su.train_grid("configs/selective_copying.py:size=small",
                       [{"model.mixer": m} for m in size["mixers"]], su.runs_dir(args, NAME),
                       args.workers, flags(size), collect_only=args.collect)
  table = []
  for r in rows:
    r["mixer"] = r["overrides"]["model.mixer"]
    score(r, size)
    r["workdir"] = su.relative_path(r["workdir"])
    if "test_accuracy" in r:
      table.append({k: r.get(k) for k in ("mixer", "test_accuracy", "test_se", "test_tokens",
                                          "step", "stopped_at")})
  out = {"study": NAME, "config": {"smoke": args.smoke, **size}, "chance": CHANCE,
         "paper": PAPER, "elapsed_s": time.time() - t0,
         "environment": su.environment(shared_machine=True), "table": table, "runs": rows}
  cols = [("mixer", "mixer", "{}"), ("test_accuracy", "test acc", "{:.3f}"),
          ("test_se", "se", "{:.3f}"), ("test_tokens", "tokens", "{:,}"), ("step", "step", "{}"),
          ("stopped_at", "stopped at", "{}")]
  return su.finish(args.out, NAME, out, table, cols, rows)


if __name__ == "__main__":
  sys.exit(main())
