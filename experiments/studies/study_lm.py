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


def main() -> int:
  t0 = time.time()
  args = su.study_args(__doc__, "lm").parse_args()
  size = dict(SMOKE if args.smoke else FULL)
  size["steps"] = su.scaled_steps(size["steps"], args)
  from linear_attention import models, nn

  size = dict(size, mixers=tuple(size["mixers"] or nn.CAUSAL_MIXERS))
  mixers = size["mixers"]
  points = []
  for corpus in size["corpora"]:
    for m in size.get("corpus_mixers", {}).get(corpus) or mixers:
      ratio = models.matched_mlp_ratio(VOCAB, size["d_model"], size["num_layers"], mixer=m,
                                       num_heads=size["num_heads"],
                                       reference_mlp_ratio=size["reference_mlp_ratio"])
      points.append({"data.corpus": corpus, "model.mixer": m, "model.mlp_ratio": ratio})
  steps = size["steps"]
  flags = (f"--config.data.seq_len={size['seq_len']}", f"--config.data.batch_size={size['batch']}",
           f"--config.model.d_model={size['d_model']}",
           f"--config.model.num_layers={size['num_layers']}",
           f"--config.model.num_heads={size['num_heads']}", f"--config.optim.lr={size['lr']}",
           *su.schedule_flags(steps, size["eval_batches"]))
  rows = su.train_grid("configs/text_lm.py:size=small", points, su.runs_dir(args, "lm"),
                       args.workers, flags)

  table = []
  for r in rows:
    if r["status"] != "done":
      continue
    tps = [c["tokens_per_s"] for c in r["train_curve"] if c.get("tokens_per_s")]
    table.append({"corpus": r["overrides"]["data.corpus"], "mixer": r["overrides"]["model.mixer"],
                  "num_params": r["metrics"]["num_params"],
                  "mlp_ratio": r["overrides"]["model.mlp_ratio"],
                  "bits_per_byte": r["metrics"]["validation_bits_per_byte"],
                  "tokens_per_s": statistics.median(tps) if tps else None})
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
