"""Length extrapolation of byte-level language models: train at 512 bytes, read 16k.

The LM study's models (``study_lm.py``: byte-level King James Bible, width 64, 2 layers,
2 heads, every mixer at the parameter count of softmax with a 4x MLP) trained at 512 bytes,
then scored on 16,384-byte windows of the validation split, one forward pass over the whole
window (recurrent mixers: their chunked form, which carries the state as decoding would;
softmax: the exact blockwise form, ``O(T)`` memory). Reported: the mean next-byte loss in
position buckets (powers of two, up to 16k) with the standard error over the evaluated
windows, and each bucket's change against the last bucket inside the training length
(positions 256-511), paired per window.

The published picture (e.g. the RetNet, GLA, Mamba and Mamba-2 papers' extrapolation
figures; Press et al. 2022 for RoPE): softmax attention with RoPE degrades sharply past its
training length, while gated linear-time models (Mamba, GLA, RetNet) keep a flat or falling
loss far beyond it. Sliding-window attention extrapolates by construction (it never sees
more than its window).

    python experiments/studies/study_extrapolation.py           # full size (about 50 process-minutes)
    python experiments/studies/study_extrapolation.py --smoke   # tiny, for CI

Writes ``<out>/extrapolation.json`` (runs, curves, per-bucket losses) and
``<out>/extrapolation.csv`` (one row per mixer and bucket), and prints the table.
"""

from __future__ import annotations

import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _study_utils as su  # noqa: E402

# Mamba and Gated DeltaNet (2-3x slower to train here) were left out for time on 2 shared
# cores; ``--mixers softmax,...,mamba`` adds them (finished runs are reused).
FULL = dict(mixers=("softmax", "local", "gla", "retnet", "mamba2"),
            corpus="kjv", d_model=64, num_layers=2, num_heads=2, reference_mlp_ratio=4.0,
            seq_len=512, batch=8, steps=400, lr=3e-3, eval_batches=8, eval_len=16384,
            eval_windows=8)
SMOKE = dict(mixers=("softmax", "gla"), corpus="kjv", d_model=32, num_layers=1, num_heads=2,
             reference_mlp_ratio=8 / 3, seq_len=32, batch=4, steps=10, lr=3e-3, eval_batches=2,
             eval_len=128, eval_windows=2)
VOCAB = 256  # bytes


def bucket_edges(train_len: int, eval_len: int) -> list[int]:
  """Bucket boundaries: 0, then powers of two from ``train_len / 32`` (at least 1) up to
  ``eval_len`` (which is appended when it is not a power of two)."""
  e = max(1, train_len // 32)
  edges = [0]
  while e < eval_len:
    edges.append(e)
    e *= 2
  return edges + [eval_len]


def window_losses(workdir: str, eval_len: int, num_windows: int):
  """Per-position next-byte loss (nats) of the run's model on the first ``num_windows``
  non-overlapping windows of ``eval_len`` bytes of the validation split: ``[W, eval_len]``."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx

  from linear_attention import data
  from linear_attention.train import results

  model, config, _ = results.load_model(workdir)
  arr = data.make_dataset(config.data).split_data("validation")
  available = (len(arr) - 1) // eval_len
  if available < num_windows:
    raise ValueError(f"eval_windows must be <= {available} (validation bytes {len(arr)} / "
                     f"eval_len {eval_len}), got {num_windows}.")
  graphdef, state = nnx.split(model)

  @jax.jit
  def loss_fn(state, x, y):
    logits = nnx.merge(graphdef, state)(x).astype(jnp.float32)
    return -jnp.take_along_axis(jax.nn.log_softmax(logits), y[..., None], axis=-1)[..., 0]

  out = []
  for w in range(num_windows):  # one window at a time: 16k positions of softmax fit easily
    seg = np.asarray(arr[w * eval_len: w * eval_len + eval_len + 1], np.int32)
    out.append(np.asarray(loss_fn(state, jnp.asarray(seg[None, :-1]), jnp.asarray(seg[None, 1:])))[0])
  return np.stack(out)


def bucket_rows(mixer: str, losses, edges: list[int], train_len: int) -> list[dict]:
  """One row per bucket: mean loss, standard error over windows, and the paired change
  against the last bucket inside the training length."""
  import numpy as np
  w = losses.shape[0]
  per = np.stack([losses[:, a:b].mean(1) for a, b in zip(edges[:-1], edges[1:])], 1)  # [W, K]
  ref = max(i for i, b in enumerate(edges[1:]) if b <= train_len)
  se = lambda x: float(np.std(x, ddof=1) / math.sqrt(w)) if w > 1 else float("nan")  # noqa: E731
  rows = []
  for i, (a, b) in enumerate(zip(edges[:-1], edges[1:])):
    d = per[:, i] - per[:, ref]
    rows.append({"mixer": mixer, "start": a, "stop": b, "beyond_training": a >= train_len,
                 "loss": float(per[:, i].mean()), "se": se(per[:, i]),
                 "bits_per_byte": float(per[:, i].mean() / math.log(2)),
                 "delta_vs_trained": float(d.mean()), "delta_se": se(d), "windows": w})
  return rows


def summarize(rows: list[dict], train_len: int) -> dict:
  """Per mixer: the bucket of lowest loss (where the loss stops falling), and the worst and
  last buckets beyond the training length against the last bucket inside it."""
  beyond = [r for r in rows if r["beyond_training"]]
  best = min(rows, key=lambda r: r["loss"])
  worst = max(beyond, key=lambda r: r["delta_vs_trained"]) if beyond else None
  last = beyond[-1] if beyond else None
  return {"mixer": rows[0]["mixer"], "train_len": train_len,
          "lowest_loss_bucket": f"{best['start']}-{best['stop']}",
          "loss_trained_end": next(r["loss"] for r in rows if r["stop"] == train_len),
          "loss_last": last["loss"] if last else None,
          "delta_last": last["delta_vs_trained"] if last else None,
          "delta_last_se": last["delta_se"] if last else None,
          "delta_worst": worst["delta_vs_trained"] if worst else None,
          "delta_worst_se": worst["delta_se"] if worst else None,
          "worst_bucket": f"{worst['start']}-{worst['stop']}" if worst else None}


def main() -> int:
  t0 = time.time()
  p = su.study_args(__doc__, "extrapolation")
  p.add_argument("--mixers", help="comma-separated mixers (default: the size's)")
  p.add_argument("--eval-len", type=int, default=None,
                 help="bytes per evaluation window (default: the size's 16,384; KJV's "
                      "validation split holds 12 such windows, 50 of 4,096)")
  p.add_argument("--eval-windows", type=int, default=None,
                 help="validation windows evaluated per model (default: the size's); more "
                      "windows give the paired loss changes a smaller SE")
  args = p.parse_args()
  size = dict(SMOKE if args.smoke else FULL)
  if args.mixers:
    size["mixers"] = tuple(args.mixers.split(","))
  if args.eval_len is not None:
    size["eval_len"] = args.eval_len
  if args.eval_windows is not None:
    if args.eval_windows < 2:
      raise ValueError(f"--eval-windows must be >= 2 (a paired SE needs two), got "
                       f"{args.eval_windows}.")
    size["eval_windows"] = args.eval_windows
  size["steps"] = su.scaled_steps(size["steps"], args)
  from linear_attention import models

  points = [{"data.corpus": size["corpus"], "model.mixer": m,
             "model.mlp_ratio": models.matched_mlp_ratio(
                 VOCAB, size["d_model"], size["num_layers"], mixer=m,
                 num_heads=size["num_heads"], reference_mlp_ratio=size["reference_mlp_ratio"])}
            for m in size["mixers"]]
  steps = size["steps"]
  flags = (f"--config.data.seq_len={size['seq_len']}", f"--config.data.batch_size={size['batch']}",
           f"--config.model.d_model={size['d_model']}",
           f"--config.model.num_layers={size['num_layers']}",
           f"--config.model.num_heads={size['num_heads']}", f"--config.optim.lr={size['lr']}",
           f"--config.train.checkpoint_every={steps}",
           *su.schedule_flags(steps, size["eval_batches"]))
  rows = su.train_grid("configs/text_lm.py:size=small", points, su.runs_dir(args, "extrapolation"),
                       args.workers, flags, collect_only=args.collect)

  edges = bucket_edges(size["seq_len"], size["eval_len"])
  table, summary = [], []
  for r in rows:
    if r["status"] != "done":
      continue
    t = time.time()
    losses = window_losses(r["workdir"], size["eval_len"], size["eval_windows"])
    b = bucket_rows(r["overrides"]["model.mixer"], losses, edges, size["seq_len"])
    for x in b:
      x["num_params"] = r["metrics"]["num_params"]
    r["buckets"], r["eval_s"] = b, time.time() - t
    table += b
    summary.append(summarize(b, size["seq_len"]))
    r["workdir"] = su.relative_path(r["workdir"])

  tokens = size["batch"] * size["seq_len"] * steps
  out = {"study": "extrapolation", "config": {"smoke": args.smoke, **size, "bucket_edges": edges},
         "elapsed_s": time.time() - t0, "training_tokens": tokens,
         "budget": {"training_tokens": tokens, "steps": steps,
                    "note": "the papers train 100M-1.3B-parameter models on 15-100B tokens at "
                            f"2k-8k context; this is a width-{size['d_model']}, "
                            f"{size['num_layers']}-layer byte model on {tokens:,} bytes"},
         "environment": su.environment(shared_machine=True), "summary": summary,
         "table": table, "runs": rows}
  cols = [("mixer", "mixer", "{}"), ("start", "from", "{}"), ("stop", "to", "{}"),
          ("loss", "loss", "{:.3f}"), ("se", "se", "{:.3f}"),
          ("delta_vs_trained", "vs last trained", "{:+.3f}"), ("delta_se", "se", "{:.3f}")]
  return su.finish(args.out, "extrapolation", out, table, cols, rows)


if __name__ == "__main__":
  sys.exit(main())
