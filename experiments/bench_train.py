"""Training throughput (tokens/s) of a language model per mixer and sequence length.

Default: a 4-layer, d_model-256 byte-level LM (random tokens) at T=512 and T=4096 for
softmax, gla, mamba2 and hawk, one jitted AdamW step (the trainer's own step) timed after
compilation. Writes JSON under ``--results`` and prints a table with ratios vs softmax.

  python experiments/bench_train.py                      # the full setting (an accelerator)
  python experiments/bench_train.py --seq_lens=64 --batch_tokens=512 --d_model=32 \\
      --num_layers=1 --steps=2                           # a quick check on CPU
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import jax
import numpy as np
from flax import nnx

from linear_attention import models
from linear_attention.io import write_json
from linear_attention.nn import registry
from linear_attention.train import optim, trainer


def bench_one(mixer: str, seq_len: int, batch: int, d_model: int, num_layers: int,
              num_heads: int, steps: int, dtype: str, vocab: int = 256) -> dict:
  """Tokens/s of ``steps`` timed train steps (after one warm-up step that compiles)."""
  mcfg = dict(mixer=mixer, pattern="", d_model=d_model, num_layers=num_layers,
              num_heads=num_heads, mlp_ratio=8 / 3, tie_embeddings=True, mixer_kwargs={},
              pooling="mean", dtype=dtype)
  model = trainer.create_model(mcfg, vocab, "lm", None, seed=0)
  ocfg = dict(lr=1e-3, warmup_steps=10, final_lr_ratio=0.1, weight_decay=0.1, b1=0.9,
              b2=0.95, eps=1e-8, clip_norm=1.0)
  opt = optim.make_optimizer(model, ocfg, total_steps=steps + 1)
  graphdef, state = nnx.split((model, opt))
  train_fn, _ = trainer._make_steps(graphdef, "lm", None, None, None)
  rng = np.random.default_rng(0)
  toks = rng.integers(0, vocab, (batch, seq_len + 1)).astype(np.int32)
  b = {"inputs": jax.numpy.asarray(toks[:, :-1]), "targets": jax.numpy.asarray(toks[:, 1:]),
       "mask": jax.numpy.ones((batch, seq_len), np.float32)}
  t0 = time.perf_counter()
  state, m = train_fn(state, b)
  jax.block_until_ready(m["loss"])
  compile_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  for _ in range(steps):
    state, m = train_fn(state, b)
  jax.block_until_ready(m["loss"])
  dt = (time.perf_counter() - t0) / steps
  return {"mixer": mixer, "seq_len": seq_len, "batch": batch, "step_s": dt,
          "tokens_per_s": batch * seq_len / dt, "compile_s": compile_s,
          "loss": float(m["loss"]), "num_params": models.count_params(model)}


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--mixers", default=",".join(registry.select(study="bench_train")))
  p.add_argument("--seq_lens", default="512,4096")
  p.add_argument("--batch_tokens", type=int, default=32768, help="batch = batch_tokens // T")
  p.add_argument("--d_model", type=int, default=256)
  p.add_argument("--num_layers", type=int, default=4)
  p.add_argument("--num_heads", type=int, default=4)
  p.add_argument("--steps", type=int, default=10)
  p.add_argument("--dtype", default="float32", choices=sorted(trainer.DTYPES))
  p.add_argument("--results", default="results")
  a = p.parse_args()
  mixers = a.mixers.split(",")
  rows = []
  for t in [int(x) for x in a.seq_lens.split(",")]:
    batch = max(a.batch_tokens // t, 1)
    for mx in mixers:
      r = bench_one(mx, t, batch, a.d_model, a.num_layers, a.num_heads, a.steps, a.dtype)
      rows.append(r)
      print(f"{mx:>8} T={t:<6} {r['tokens_per_s']:>12,.0f} tok/s  (compile {r['compile_s']:.1f}s)",
            flush=True)
  base = {r["seq_len"]: r["tokens_per_s"] for r in rows if r["mixer"] == "softmax"}
  for r in rows:
    r["ratio_vs_softmax"] = r["tokens_per_s"] / base[r["seq_len"]] if r["seq_len"] in base else None
  print(f"\n{'mixer':>8} {'T':>6} {'tokens/s':>12} {'vs softmax':>10}")
  for r in rows:
    ratio = f"{r['ratio_vs_softmax']:.2f}x" if r["ratio_vs_softmax"] else "-"
    print(f"{r['mixer']:>8} {r['seq_len']:>6} {r['tokens_per_s']:>12,.0f} {ratio:>10}")
  out = os.path.join(a.results, f"bench_train_{jax.default_backend()}.json")
  write_json(out, {"args": vars(a), "backend": jax.default_backend(),
                   "device": str(jax.devices()[0]), "jax": jax.__version__,
                   "host": platform.node(), "rows": rows})
  print(f"wrote {out}")


if __name__ == "__main__":
  main()
