"""ListOps (Long Range Arena, Tay et al. 2020), reduced size: test accuracy per mixer.

Classify the value (0-9) of a nested MIN/MAX/MED/SUM_MOD expression
(``data.ListOps``) with a bidirectional encoder and mean pooling. LRA uses
expressions of 500-2000 tokens and reports accuracies of about 36-38% for the
Transformer and most efficient variants (Linformer 35.7, Performer 18.0 in
its table 1, BigBird 36.1, Longformer 35.6), with chance at about 10% and a
majority-class baseline near 17%. Here the expressions are shorter and the
training far shorter (``FULL``) to fit 2 CPU cores, with the same width,
depth, learning rate and steps for every mixer. Causal mixers run causally
(the classifier then reads the whole sequence through mean pooling);
``longformer``, ``bigbird`` and ``linformer`` are the encoder mixers.

    python experiments/studies/study_listops.py           # full size (about 20 minutes on 2 cores)
    python experiments/studies/study_listops.py --smoke   # tiny, for CI

Writes ``<out>/listops.json`` (runs with curves, the table, the majority-class
rate of the test set) and ``<out>/listops.csv``, and prints the table.
"""

from __future__ import annotations

import collections
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _study_utils as su  # noqa: E402

from linear_attention.nn import registry  # noqa: E402

MIXERS = registry.select(study="listops")

FULL = dict(mixers=MIXERS, d_model=64, num_layers=2, num_heads=2, seq_len=128, batch=32,
            max_depth=5, max_args=5, min_length=32, max_length=128, steps=400, lr=3e-3,
            test_batches=16)
SMOKE = dict(mixers=("softmax", "linformer"), d_model=32, num_layers=1, num_heads=2, seq_len=64,
             batch=8, max_depth=3, max_args=3, min_length=8, max_length=64, steps=10, lr=3e-3,
             test_batches=1)


def majority_rate(config_data: dict, num_batches: int) -> float:
  """The share of the most common label in the test batches (what a constant guess scores)."""
  from linear_attention import data
  ds = data.make_dataset(config_data)
  counts = collections.Counter()
  for b in ds.eval_batches("test", num_batches):
    counts.update(int(x) for x in b["label"])
  return max(counts.values()) / sum(counts.values())


def main() -> int:
  t0 = time.time()
  args = su.study_args(__doc__, "listops").parse_args()
  size = dict(SMOKE if args.smoke else FULL)
  size["steps"] = su.scaled_steps(size["steps"], args)
  data_fields = ("seq_len", "max_depth", "max_args", "min_length", "max_length")
  flags = tuple(f"--config.data.{k}={size[k]}" for k in data_fields) + (
      f"--config.data.batch_size={size['batch']}", f"--config.model.d_model={size['d_model']}",
      f"--config.model.num_layers={size['num_layers']}",
      f"--config.model.num_heads={size['num_heads']}", f"--config.optim.lr={size['lr']}",
      *su.schedule_flags(size["steps"], 4))
  rows = su.train_grid("configs/listops.py:size=small", [{"model.mixer": m} for m in size["mixers"]],
                       su.runs_dir(args, "listops"), args.workers, flags)

  from linear_attention.train import results
  table = []
  for r in rows:
    if r["status"] != "done":
      continue
    test = results.evaluate_checkpoint(r["workdir"], num_batches=size["test_batches"],
                                       split="test")
    r["test"] = test
    table.append({"mixer": r["overrides"]["model.mixer"], "num_params": r["metrics"]["num_params"],
                  "validation_accuracy": r["metrics"]["validation_accuracy"],
                  "test_accuracy": test["accuracy"], "test_loss": test["loss"]})

  dcfg = {"task": "listops", "batch_size": size["batch"], **{k: size[k] for k in data_fields}}
  out = {"study": "listops", "config": {"smoke": args.smoke, **size},
         "elapsed_s": time.time() - t0,
         "majority_class_rate": majority_rate(dcfg, size["test_batches"]),
         "environment": su.environment(shared_machine=None), "table": table, "runs": rows}
  cols = [("mixer", "mixer", "{}"), ("num_params", "params", "{:,}"),
          ("validation_accuracy", "val acc", "{:.3f}"), ("test_accuracy", "test acc", "{:.3f}")]
  print(f"majority class rate on the test batches: {out['majority_class_rate']:.3f}")
  return su.finish(args.out, "listops", out, table, cols, rows)


if __name__ == "__main__":
  sys.exit(main())
