"""Runs the forms of a few core ops on one small problem; prints agreement and timings.

    python experiments/demo.py            # B=2, T=1000, H=4, D=64
    python experiments/demo.py --seq 300  # smaller

The ops: the diagonal-decay engine (no decay, a decay per head, per channel), linear
attention with the ``elu`` and ``favor+`` feature maps, and causal softmax attention (naive
and blockwise); every other op's forms are checked against each other by the conformance
tests (``tests/ops/conformance.py``) and timed by ``experiments/bench/bench_ops.py``. For each op,
the first form listed is the reference; the table shows each form's largest difference
from it, relative to the reference's largest magnitude (outputs and, where there is one,
the final state), and its jitted forward time. ``--out DIR`` also writes
``DIR/demo.json`` (nothing is written without it, so a run never overwrites the committed
``results/demo.json``).
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp

from linear_attention import ops
from linear_attention.io import write_json


def _timed(fn, *args):
  fn = jax.jit(fn)
  jax.block_until_ready(fn(*args))
  t0 = time.perf_counter()
  out = jax.block_until_ready(fn(*args))
  return out, time.perf_counter() - t0


def _max_diff(a, b):
  """Largest absolute difference over all leaves, relative to the leaf's largest value."""
  leaves = zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
  return max(float(jnp.max(jnp.abs(x.astype(jnp.float32) - y.astype(jnp.float32)))
                   / (float(jnp.max(jnp.abs(y.astype(jnp.float32)))) + 1e-30))
             for x, y in leaves)


def cases(b, t, h, d, key):
  """``[(op name, {form name: fn(*args)}, args)]`` for the demo's ops."""
  kq, kk, kv, kg, kf = jax.random.split(key, 5)
  q, k = (0.5 * jax.random.normal(x, (b, t, h, d)) for x in (kq, kk))
  v = jax.random.normal(kv, (b, t, h, d))
  g_head = -jax.random.uniform(kg, (b, t, h))
  g_chan = -jax.random.uniform(kg, (b, t, h, d))
  forms = ("parallel", "chunk", "recurrent")
  out = []

  def engine(g):
    return {f: (lambda q, k, v, g, f=f: ops.decay_linear_attention(
        q, k, v, g, form=f, return_state=True)) for f in forms}

  out.append(("engine, no decay", engine(None), (q, k, v, None)))
  out.append(("engine, decay per head", engine(g_head), (q, k, v, g_head)))
  out.append(("engine, decay per channel", engine(g_chan), (q, k, v, g_chan)))
  for fmap in ("elu", "favor+"):
    out.append((f"linear attention ({fmap})", {
        f: (lambda q, k, v, f=f, fmap=fmap: ops.linear_attention(
            q, k, v, feature_map=fmap, key=kf, form=f, return_state=True)) for f in forms
    }, (q, k, v)))
  out.append(("softmax attention (causal)", {
      impl: (lambda q, k, v, impl=impl: ops.softmax_attention(
          q, k, v, causal=True, algorithm=impl)) for impl in ("naive", "blockwise")
  }, (q, k, v)))
  return out


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--batch", type=int, default=2)
  p.add_argument("--seq", type=int, default=1000)
  p.add_argument("--heads", type=int, default=4)
  p.add_argument("--dim", type=int, default=64)
  p.add_argument("--out", default=None,
                 help="write DIR/demo.json (default: print only; results/ holds the committed one)")
  a = p.parse_args(argv)
  print(f"jax {jax.__version__} on {jax.default_backend()}; "
        f"B={a.batch} T={a.seq} H={a.heads} D={a.dim}\n")
  print(f"{'op':32s} {'form':12s} {'rel. diff vs first':>20s} {'fwd ms':>9s}")
  rows = []
  for name, fns, args in cases(a.batch, a.seq, a.heads, a.dim, jax.random.PRNGKey(0)):
    ref = None
    for form, fn in fns.items():
      out, secs = _timed(fn, *args)
      diff = 0.0 if ref is None else _max_diff(out, ref)
      ref = out if ref is None else ref
      rows.append({"op": name, "form": form, "max_rel_diff": diff, "fwd_ms": 1e3 * secs})
      print(f"{name:32s} {form:12s} {diff:20.2e} {1e3 * secs:9.2f}")
  worst = max(r["max_rel_diff"] for r in rows)
  print(f"\nall forms agree to {worst:.1e} (float32)")
  if a.out is not None:
    write_json(os.path.join(a.out, "demo.json"), rows)
    print(f"wrote {os.path.join(a.out, 'demo.json')}")


if __name__ == "__main__":
  main()
