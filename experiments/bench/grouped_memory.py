"""Compiled memory of grouped value heads against repeated q/k (no timing).

Issue 37 item 3: the delta-rule and DPLR ops take ``q, k`` with fewer heads than ``v``
(Qwen3-Next: 16 key heads, 32 value heads) without repeating ``q, k`` per value head. This
compiles each op's chunk form both ways at a Qwen3-Next shape (B=1, T=4096, Hk=16, Hv=32,
K=V=128, float32 by default), forward and forward+backward (gradients of every input),
and records XLA's ``memory_analysis()``: temp (scratch) bytes, argument bytes and output
bytes. "repeated" is the caller doing ``jnp.repeat(q, 2, axis=2)`` (and k) before the op,
inside the same jit, as ``nn.GatedDeltaNet`` did before. Compiles only: nothing runs.

  python experiments/bench/grouped_memory.py                 # -> runs/results/grouped_memory_cpu.json
  python experiments/bench/grouped_memory.py --smoke         # T = 256, 4 / 8 heads, K = V = 32
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "experiments")]

import linear_attention  # noqa: E402,F401  first: its XLA flags need a backend not yet started
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from experiments import outputs  # noqa: E402
from linear_attention import ops  # noqa: E402

MIB = 2 ** 20


def _ops(chunk):
  """``name -> (fn(q, k, v, beta, g), per-channel gate)`` for each op measured."""
  return {
      "gated_deltanet": (lambda q, k, v, beta, g: ops.gated_deltanet(
          q, k, v, beta, g, form="chunk", chunk_size=chunk), False),
      "kda": (lambda q, k, v, beta, g: ops.kda(q, k, v, beta, g, form="chunk",
                                               chunk_size=chunk), True),
  }


def _memory(fn, args):
  m = jax.jit(fn).lower(*args).compile().memory_analysis()
  return dict(temp_mib=m.temp_size_in_bytes / MIB, argument_mib=m.argument_size_in_bytes / MIB,
              output_mib=m.output_size_in_bytes / MIB)


def measure(b, t, hk, hv, dk, dv, dtype, chunk):
  rows = []
  spec = lambda *s: jax.ShapeDtypeStruct(s, dtype)
  for name, (op, per_channel) in _ops(chunk).items():
    gate = spec(b, t, hv, dk) if per_channel else spec(b, t, hv)
    args = (spec(b, t, hk, dk), spec(b, t, hk, dk), spec(b, t, hv, dv), spec(b, t, hv), gate)
    repeat = lambda x: jnp.repeat(x, hv // hk, axis=2)
    calls = {"grouped": op,
             "repeated": lambda q, k, *a, op=op: op(repeat(q), repeat(k), *a)}
    for way, fn in calls.items():
      loss = lambda *a, fn=fn: jnp.sum(fn(*a).astype(jnp.float32))
      row = dict(op=name, way=way)
      row["forward"] = _memory(fn, args)
      row["forward_backward"] = _memory(jax.grad(loss, argnums=(0, 1, 2, 3, 4)), args)
      rows.append(row)
      print(f"{name:>15} {way:>9}  forward temp {row['forward']['temp_mib']:9.1f} MiB   "
            f"forward+backward temp {row['forward_backward']['temp_mib']:9.1f} MiB", flush=True)
  return rows


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--smoke", action="store_true", help="T = 256, Hk = 4, Hv = 8, K = V = 32")
  p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  p.add_argument("--chunk", type=int, default=64, help="chunk_size of the chunk forms")
  outputs.add_out(p, "grouped_memory_cpu.json")
  a = p.parse_args(argv)
  shape = ((1, 256, 4, 8, 32, 32) if a.smoke else (1, 4096, 16, 32, 128, 128))
  rows = measure(*shape, jnp.dtype(a.dtype), a.chunk)
  out = dict(backend=jax.default_backend(), jax=jax.__version__, dtype=a.dtype,
             chunk=a.chunk, shape=dict(zip(("B", "T", "Hk", "Hv", "K", "V"), shape)), rows=rows)
  os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
  with open(a.out, "w") as f:
    json.dump(out, f, indent=1)
  print("wrote", a.out)


if __name__ == "__main__":
  main()
