"""The chunk engine against the textbook chunked form, and GLA's chunk form against its scan.

Issue 17's targets, measured in one process so that every ratio compares calls made under
the same machine load:

* ``linear``: ``ops.linear_attention(feature_map="identity", normalize=False)`` (the decay
  engine with no decay) against the textbook chunked form a user writes first (64-token
  chunks; masked ``q k^T v`` inside a chunk; ``k^T v`` per chunk; a ``lax.scan`` carrying
  the state; ``q`` times the entering state), written below as :func:`textbook`. Forward
  and forward+backward at each T; target: the engine 1.25x faster at every T in 1k-64k,
  and its forward at 4k at 30% or more of the same run's 2048^2 matmul rate.
* ``gla``: ``ops.gla`` chunk form against its recurrent form at 4k (target: fwd+bwd 3x
  faster, forward at 20% of the matmul rate, backward at most 3x the forward).

B=1, H=4, D=64, float32, causal. GFLOP/s count the chunk algorithm as written
(``bench.flops.chunk``: in-chunk ``QK^T`` and ``AV``, the chunk state and its read).

  python experiments/bench/bench_engine.py                 # T = 1k, 4k, 16k, 64k
  python experiments/bench/bench_engine.py --smoke         # T = 256, 1k (a quick check)
  # one core, as the studies' training workers run (XLA_FLAGS is recorded in the JSON):
  XLA_FLAGS="--xla_cpu_multi_thread_eigen=false" \
      python experiments/bench/bench_engine.py --out results/bench_engine_cpu_1core.json
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import jax
import jax.numpy as jnp
from jax import lax

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "experiments")]  # the package, configs/, bench/

from experiments import outputs  # noqa: E402
from bench import flops as flops_lib  # noqa: E402
from bench.cases import Dims  # noqa: E402
from bench.measure import grad_fn, matmul_gflops, time_calls  # noqa: E402

from linear_attention import ops  # noqa: E402
from linear_attention.io import write_json  # noqa: E402

B, H, D, CHUNK = 1, 4, 64, 64


def textbook(q, k, v, chunk: int = CHUNK):
  """Causal linear attention without normaliser, chunked as the papers write it.

  ``q, k, v``: ``[B, T, H, D]`` with ``T`` a multiple of ``chunk``; returns ``[B, T, H, D]``.
  """
  b, t, h, d = q.shape
  n = t // chunk
  split = lambda x: x.reshape(b, n, chunk, h, d).transpose(1, 0, 3, 2, 4)  # [N, B, H, C, D]
  qc, kc, vc = split(q * d**-0.5), split(k), split(v)
  mask = jnp.tril(jnp.ones((chunk, chunk), bool))

  def body(state, x):
    qi, ki, vi = x
    scores = jnp.where(mask, qi @ jnp.swapaxes(ki, -1, -2), 0.0)
    o = scores @ vi + qi @ state
    return state + jnp.swapaxes(ki, -1, -2) @ vi, o

  _, o = lax.scan(body, jnp.zeros((b, h, d, d), q.dtype), (qc, kc, vc))
  return o.transpose(1, 0, 3, 2, 4).reshape(b, t, h, d)


def engine(q, k, v):
  """The library's form of the same computation (the decay engine's chunk form, no decay)."""
  return ops.linear_attention(q, k, v, feature_map="identity", normalize=False, causal=True)


def gla(form):
  def f(q, k, v, g):
    return ops.gla(q, k, v, g, form=form)
  return f


def _time(fn, args, argnums, repeats):
  """Forward and fwd+bwd best wall seconds, compiled ahead of time."""
  fwd = jax.jit(fn).lower(*args).compile()
  bwd = jax.jit(grad_fn(fn, argnums)).lower(*args).compile()
  return (time_calls(fwd, *args, repeats=repeats)[0],
          time_calls(bwd, *args, repeats=repeats)[0])


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--smoke", action="store_true", help="T = 256, 1k only")
  p.add_argument("--seq_lens", default=None, help="comma-separated lengths")
  p.add_argument("--gla_len", type=int, default=4096)
  outputs.add_out(p, "bench_engine_cpu.json")
  a = p.parse_args(argv)
  lens = ([int(x) for x in a.seq_lens.split(",")] if a.seq_lens
          else [256, 1024] if a.smoke else [1024, 4096, 16384, 65536])
  gla_len = 256 if a.smoke else a.gla_len
  dims = Dims(B=B, H=H, D=D, chunk=CHUNK)

  mm = matmul_gflops()
  rows = []
  for t in lens:
    keys = jax.random.split(jax.random.PRNGKey(t), 3)
    q, k, v = (jax.random.normal(kk, (B, t, H, D), jnp.float32) for kk in keys)
    reps = 3 if t < 16384 else 1
    tb = _time(textbook, (q, k, v), (0, 1, 2), reps)
    en = _time(engine, (q, k, v), (0, 1, 2), reps)
    f = flops_lib.chunk(t, dims)
    rows.append(dict(case="linear", T=t, textbook_fwd_s=tb[0], textbook_fwdbwd_s=tb[1],
                     engine_fwd_s=en[0], engine_fwdbwd_s=en[1],
                     speedup_fwd=tb[0] / en[0], speedup_fwdbwd=tb[1] / en[1],
                     engine_fwd_of_matmul=f / en[0] / 1e9 / mm,
                     textbook_fwd_of_matmul=f / tb[0] / 1e9 / mm))
    print(f"T={t}: textbook {tb[0]*1e3:.1f}/{tb[1]*1e3:.1f} ms, engine {en[0]*1e3:.1f}/"
          f"{en[1]*1e3:.1f} ms", flush=True)

  keys = jax.random.split(jax.random.PRNGKey(7), 4)
  q, k, v = (jax.random.normal(kk, (B, gla_len, H, D), jnp.float32) for kk in keys[:3])
  g = jax.nn.log_sigmoid(jax.random.normal(keys[3], (B, gla_len, H, D)) + 3.0) / 16
  ch = _time(gla("chunk"), (q, k, v, g), (0, 1, 2, 3), 3)
  rec = _time(gla("recurrent"), (q, k, v, g), (0, 1, 2, 3), 3)
  f = flops_lib.chunk(gla_len, dims)
  gla_row = dict(case="gla", T=gla_len, chunk_fwd_s=ch[0], chunk_fwdbwd_s=ch[1],
                 recurrent_fwd_s=rec[0], recurrent_fwdbwd_s=rec[1],
                 speedup_fwdbwd=rec[1] / ch[1], chunk_fwd_of_matmul=f / ch[0] / 1e9 / mm,
                 chunk_bwd_over_fwd=(ch[1] - ch[0]) / ch[0])

  out = dict(machine=platform.processor() or platform.machine(), cpus=os.cpu_count(),
             backend=jax.default_backend(), jax=jax.__version__, matmul_gflops=mm,
             xla_flags=os.environ.get("XLA_FLAGS", ""),
             B=B, H=H, D=D, chunk=CHUNK, dtype="float32", linear=rows, gla=gla_row,
             time=time.strftime("%Y-%m-%d %H:%M:%S"))
  write_json(a.out, out)
  print(f"\nmatmul {mm:.1f} GFLOP/s (2048^2 float32, same run)")
  print("   T  textbook fwd  engine fwd  speedup | textbook f+b  engine f+b  speedup | "
        "engine fwd % of matmul")
  for r in rows:
    print(f"{r['T']:>6}  {r['textbook_fwd_s']*1e3:10.2f}ms {r['engine_fwd_s']*1e3:9.2f}ms "
          f"{r['speedup_fwd']:7.2f}x | {r['textbook_fwdbwd_s']*1e3:10.2f}ms "
          f"{r['engine_fwdbwd_s']*1e3:9.2f}ms {r['speedup_fwdbwd']:7.2f}x | "
          f"{100*r['engine_fwd_of_matmul']:5.1f}%")
  r = gla_row
  print(f"\nGLA T={r['T']}: chunk {r['chunk_fwd_s']*1e3:.1f}/{r['chunk_fwdbwd_s']*1e3:.1f} ms, "
        f"recurrent {r['recurrent_fwd_s']*1e3:.1f}/{r['recurrent_fwdbwd_s']*1e3:.1f} ms "
        f"(fwd/fwd+bwd); chunk fwd+bwd {r['speedup_fwdbwd']:.2f}x faster; chunk fwd "
        f"{100*r['chunk_fwd_of_matmul']:.1f}% of matmul; backward {r['chunk_bwd_over_fwd']:.2f}x "
        f"the forward")
  print(f"wrote {a.out}")


if __name__ == "__main__":
  main()
