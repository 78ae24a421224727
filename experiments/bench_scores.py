"""The per-channel in-chunk scores, two ways, in the ops that use them (CPU).

Issue 27 item 5. Two comparisons, each timed in one process with the calls interleaved
(every round times every entry once, after a warm-up round; best kept), so ratios compare
calls made under the same machine load; the float32 2048^2 matmul rate is measured in the
same run. B=1, H=4, K=V=64, float32, each op's default chunk length on this backend.

* ``kda``: KDA's chunk form as the op runs it (``a = None``: the engine knows ``a = -k`` and
  computes two of the four score matrices, :func:`~linear_attention.common.dplr_chunk_terms`)
  against the general engine given ``a = -k`` explicitly (``ops.dplr_attention``; the four
  scores, what KDA ran before).
* ``gla``: GLA's chunk form with its in-chunk scores from
  :func:`~linear_attention.common.intra_scores` (sub-chunks of 8, one matmul per row
  sub-chunk against all columns; its own gradient) against
  :func:`~linear_attention.common.intra_scores_by_diagonals` (the DPLR engine's), swapped in
  through ``common.intra_scores_vector``.
* ``scores_*``: the scores alone at GLA's shapes (one row and one column input), to separate
  them from the rest of the op.

Wall and process CPU time (``time.process_time``) of forward and forward+backward (the
gradient of ``sum(o)`` in every input). On one thread, as the studies run::

  XLA_FLAGS="--xla_cpu_multi_thread_eigen=false" \\
      python experiments/bench_scores.py

(write every flag with its ``--``: a bare token makes XLA drop the flags after it; and
``--intra_op_parallelism_threads=1`` is no XLA flag: jaxlib 0.10.2 stops on it as unknown).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import linear_attention  # noqa: E402,F401  first: its XLA flags need a backend not yet started
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from bench.measure import grad_fn, matmul_gflops, time_calls  # noqa: E402

from linear_attention import common, ops  # noqa: E402
from linear_attention.io import write_json  # noqa: E402
from linear_attention.ops import dplr  # noqa: E402

B, H, D = 1, 4, 64


def _inputs(t: int, seed: int = 0):
  ks = jax.random.split(jax.random.PRNGKey(seed), 5)
  unit = lambda x: x / jnp.linalg.norm(x, axis=-1, keepdims=True)
  q = unit(jax.random.normal(ks[0], (B, t, H, D)))
  k = unit(jax.random.normal(ks[1], (B, t, H, D)))
  v = jax.random.normal(ks[2], (B, t, H, D))
  beta = jax.nn.sigmoid(jax.random.normal(ks[3], (B, t, H)))
  g = jax.nn.log_sigmoid(jax.random.normal(ks[4], (B, t, H, D))) / 16
  return q, k, v, beta, g


def kda_entries(t: int) -> dict:
  """``{name: (fn, args)}``: KDA's fast path and the general engine with ``a = -k``."""
  q, k, v, beta, g = _inputs(t)

  def general(q, k, v, beta, g):
    wk, a, b = dplr._kda_map(k, beta, g, jnp.float32)
    return ops.dplr_attention(q, wk, v, a, b, g, form="chunk")

  fast = lambda q, k, v, beta, g: ops.kda(q, k, v, beta, g, form="chunk")
  return {"kda_a_is_minus_k": (fast, (q, k, v, beta, g)),
          "kda_general_a": (general, (q, k, v, beta, g))}


SCORES = {"intra_scores": common.intra_scores,
          "by_diagonals": common.intra_scores_by_diagonals}


def _vector(fn):
  return lambda q, k, gc: fn(q[..., None, :, :], k[..., None, :, :], gc)[..., 0, 0, :, :]


def gla_entries(t: int, chunk: int) -> dict:
  """GLA's chunk form with either score function, and the scores alone at its shapes."""
  q, k, v, _, g = _inputs(t, 1)
  out = {}
  for name, fn in SCORES.items():
    def op(q, k, v, g, fn=fn):
      # Traced (and compiled) while the module attribute points at ``fn``: see _compile.
      return ops.gla(q, k, v, g, form="chunk", chunk_size=chunk)
    out[f"gla_{name}"] = (op, (q, k, v, g), fn)
  n = t // chunk
  split = lambda x: jnp.swapaxes(x, 1, 2).reshape(B, H, n, chunk, D)
  gc = jnp.cumsum(split(g), axis=3)
  for name, fn in SCORES.items():
    out[f"scores_{name}_c{chunk}"] = (_vector(fn), (split(q), split(k), gc), fn)
  return out


def _compile(fn, args, scores_fn=None):
  """Forward and fwd+bwd compiled ahead of time, with ``common.intra_scores_vector`` pointing
  at ``scores_fn`` while they are traced (GLA reads it at trace time)."""
  saved = common.intra_scores_vector
  if scores_fn is not None:
    common.intra_scores_vector = _vector(scores_fn)
    jax.clear_caches()  # the op's inner jit would reuse its trace with the other scores
  try:
    argnums = tuple(range(len(args)))
    return (jax.jit(fn).lower(*args).compile(),
            jax.jit(grad_fn(fn, argnums)).lower(*args).compile())
  finally:
    common.intra_scores_vector = saved
    jax.clear_caches()


def time_entries(entries: dict, repeats: int) -> dict:
  """``{name: {fwd_s, fwdbwd_s, fwd_cpu_s, fwdbwd_cpu_s}}``, best of ``repeats`` interleaved
  rounds after a warm-up round."""
  compiled = {}
  for name, (fn, args, *scores_fn) in entries.items():
    args = jax.block_until_ready(args)
    compiled[name] = (args, _compile(fn, args, *scores_fn))
  best = {name: dict(fwd_s=float("inf"), fwdbwd_s=float("inf"), fwd_cpu_s=float("inf"),
                     fwdbwd_cpu_s=float("inf")) for name in entries}
  for round_ in range(repeats + 1):
    for name, (args, fns) in compiled.items():
      for part, f in zip(("fwd", "fwdbwd"), fns):
        wall, cpu = time_calls(f, *args, repeats=1, warmup=False)
        if round_:
          best[name][f"{part}_s"] = min(best[name][f"{part}_s"], wall)
          best[name][f"{part}_cpu_s"] = min(best[name][f"{part}_cpu_s"], cpu)
  return best


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--seq_len", type=int, default=4096)
  p.add_argument("--groups", default="kda,gla", help="of kda, gla")
  p.add_argument("--gla_chunk", type=int, default=64, help="GLA's chunk length (its default)")
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--out", default="results/bench_scores_cpu.json")
  a = p.parse_args(argv)
  groups = a.groups.split(",")
  entries = {}
  if "kda" in groups:
    entries.update(kda_entries(a.seq_len))
  if "gla" in groups:
    entries.update(gla_entries(a.seq_len, a.gla_chunk))
  mm = matmul_gflops()
  rows = time_entries(entries, a.repeats)
  mm_after = matmul_gflops()
  out = dict(machine=platform.processor() or platform.machine(), cpus=os.cpu_count(),
             backend=jax.default_backend(), jax=jax.__version__,
             matmul_gflops_before=mm, matmul_gflops_after=mm_after,
             xla_flags=os.environ.get("XLA_FLAGS", ""), B=B, H=H, D=D, T=a.seq_len,
             kda_chunk=dplr.resolve_chunk_size(None), gla_chunk=a.gla_chunk,
             repeats=a.repeats, rows=rows, load_average=os.getloadavg(),
             time=time.strftime("%Y-%m-%d %H:%M:%S"))
  write_json(a.out, out)
  print(f"matmul {mm:.1f} / {mm_after:.1f} GFLOP/s (2048^2 float32, before / after); "
        f"T={a.seq_len} B={B} H={H} D={D}; XLA_FLAGS={out['xla_flags']!r}")
  print(f"{'entry':28s} | {'fwd ms':>8s} {'CPU':>8s} | {'f+b ms':>8s} {'CPU':>8s}")
  for name, r in rows.items():
    print(f"{name:28s} | {r['fwd_s']*1e3:8.1f} {r['fwd_cpu_s']*1e3:8.1f} | "
          f"{r['fwdbwd_s']*1e3:8.1f} {r['fwdbwd_cpu_s']*1e3:8.1f}")
  print(f"wrote {a.out}")


if __name__ == "__main__":
  main()
