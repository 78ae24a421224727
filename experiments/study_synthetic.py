"""The Mamba paper's synthetic tasks: selective copying and induction heads, per mixer.

Gu & Dao 2023 ("Mamba", section 4.1, tables 1-2 and figure/table 2 on
extrapolation):

* **Selective copying**: copy the 16 data tokens scattered among noise, in
  order (``data.SelectiveCopying``). The paper's claim: time-invariant models
  (S4, and convolutions) fail, input-dependent (selective) ones solve it
  (S6/Mamba 99.8%).
* **Induction heads**: after the trigger, recall what followed its first
  occurrence (``data.InductionHeads``), trained at length 256 and tested at
  longer lengths. The paper's claim: Mamba solves it and extrapolates to
  4000x the training length, while attention (absolute or rotary positions)
  fails beyond about 2x.

Both are trained at a reduced size for 2 CPU cores (``FULL``: shorter
selective-copying sequences than the paper's 4096 and far fewer steps), with
the same width, depth and learning rate for every mixer. Induction-head models
are then evaluated on test sequences of 256 to 16384 tokens
(``trainer.evaluate_checkpoint``).

    python experiments/study_synthetic.py           # full size (about 40 minutes on 2 cores)
    python experiments/study_synthetic.py --smoke   # tiny, for CI

Writes ``<out>/synthetic.json`` (every run, curves, the extrapolation grid) and
``<out>/synthetic.csv`` (one row per mixer), and prints the table.
"""

from __future__ import annotations

import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _study_utils as su  # noqa: E402

MIXERS = ("softmax", "linear", "retnet", "gla", "mamba", "mamba2", "deltanet", "gated_deltanet",
          "hawk", "s4d")

FULL = dict(
    mixers=MIXERS, d_model=64, lr=3e-3,
    copying=dict(seq_len=256, num_tokens=16, batch=32, steps=400),
    induction=dict(seq_len=256, batch=16, steps=600),
    test_lengths=(256, 512, 1024, 2048, 4096, 8192, 16384), test_examples=32,
    test_tokens_per_batch=32768)
SMOKE = dict(
    mixers=("softmax", "mamba"), d_model=32, lr=3e-3,
    copying=dict(seq_len=32, num_tokens=4, batch=8, steps=20),
    induction=dict(seq_len=32, batch=8, steps=20),
    test_lengths=(32, 128), test_examples=8, test_tokens_per_batch=512)


def _flags(size: dict, task: dict) -> tuple[str, ...]:
  return (f"--config.data.seq_len={task['seq_len']}", f"--config.data.batch_size={task['batch']}",
          f"--config.model.d_model={size['d_model']}", f"--config.optim.lr={size['lr']}",
          *su.schedule_flags(task["steps"], 4))


def main() -> int:
  t0 = time.time()
  args = su.study_args(__doc__, "synthetic").parse_args()
  size = dict(SMOKE if args.smoke else FULL)
  for task in ("copying", "induction"):
    size[task] = dict(size[task], steps=su.scaled_steps(size[task]["steps"], args))
  root = su.runs_dir(args, "synthetic")
  points = [{"model.mixer": m} for m in size["mixers"]]
  cp = size["copying"]
  copy_rows = su.train_grid("configs/selective_copying.py:size=small", points,
                            os.path.join(root, "selective_copying"), args.workers,
                            _flags(size, cp) + (f"--config.data.num_tokens={cp['num_tokens']}",))
  ind_rows = su.train_grid("configs/induction_heads.py:size=small", points,
                           os.path.join(root, "induction_heads"), args.workers,
                           _flags(size, size["induction"]))

  from linear_attention.train import trainer
  for r in ind_rows:
    if r["status"] != "done":
      continue
    r["extrapolation"] = []
    for t in size["test_lengths"]:
      b = max(1, min(size["test_examples"], size["test_tokens_per_batch"] // t))
      res = trainer.evaluate_checkpoint(r["workdir"], {"seq_len": t, "batch_size": b},
                                        num_batches=math.ceil(size["test_examples"] / b),
                                        split="test")
      r["extrapolation"].append({"seq_len": t, "accuracy": res["accuracy"],
                                 "examples": b * math.ceil(size["test_examples"] / b)})
      print(f"induction heads {r['overrides']['model.mixer']:>15} T={t:>6}: "
            f"accuracy {res['accuracy']:.3f}", flush=True)

  table = []
  for m in size["mixers"]:
    row = {"mixer": m}
    c = next(r for r in copy_rows if r["overrides"]["model.mixer"] == m)
    i = next(r for r in ind_rows if r["overrides"]["model.mixer"] == m)
    if c["status"] == "done":
      row.update(copying_accuracy=c["metrics"]["validation_accuracy"],
                 num_params=c["metrics"]["num_params"])
    for e in i.get("extrapolation", []):
      row[f"induction_{e['seq_len']}"] = e["accuracy"]
    table.append(row)

  out = {"study": "synthetic", "config": {"smoke": args.smoke, **size},
         "elapsed_s": time.time() - t0,
         "environment": su.environment(shared_machine=None), "table": table,
         "selective_copying": copy_rows, "induction_heads": ind_rows}
  cols = ([("mixer", "mixer", "{}"), ("num_params", "params", "{:,}"),
           ("copying_accuracy", "sel.copy", "{:.3f}")]
          + [(f"induction_{t}", f"ind@{t}", "{:.2f}") for t in size["test_lengths"]])
  return su.finish(args.out, "synthetic", out, table, cols, copy_rows + ind_rows)


if __name__ == "__main__":
  sys.exit(main())
