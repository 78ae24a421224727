"""The per-channel in-chunk scores, two ways, in the ops that use them (CPU).

Issue 27 item 5. Each op's chunk form is compiled once per score implementation (patched
into ``engines.chunks`` while it is traced, :func:`_compile`) and timed in one process with the calls
interleaved (every round times every entry once, after a warm-up round; best kept), so ratios
compare calls made under the same machine load; the float32 2048^2 matmul rate is measured
before and after in the same run. B=1, H=4, K=V=64, float32, each op's default chunk length.

* ``kda_<config>``: KDA as the op runs it (``a = None``: the engine knows ``a = -k`` and
  computes two of the four score matrices, :func:`~linear_attention.engines.dplr.terms.dplr_chunk_terms`);
  ``kda_general_a``: the general engine given ``a = -k`` explicitly (``ops.dplr_attention``;
  the four matrices, what KDA ran before), with the default scores.
* ``gla_<config>``, ``rwkv7_<config>``, ``deltaproduct_<config>`` (2 steps a token): the op's
  chunk form with each implementation.
* configs (:data:`CONFIGS`): :func:`~linear_attention.engines.chunks.intra_scores` and
  :func:`~linear_attention.engines.chunks.intra_scores_by_diagonals` at its default sub-chunk length
  or at a fixed one (``by_diagonals_s4``, ``_s8``).

Wall and process CPU time (``time.process_time``) of forward and forward+backward (the
gradient of ``sum(o)`` in every input). On one thread, as the studies run::

  XLA_FLAGS="--xla_cpu_multi_thread_eigen=false" python experiments/bench/bench_scores.py \\
      --groups kda,gla,rwkv7 --configs intra_scores,by_diagonals      # bench_scores_cpu.json
  # results/bench_scores_cpu_subchunks.json: --configs intra_scores,by_diagonals_s4,by_diagonals_s8
  # results/bench_scores_cpu_deltaproduct.json: --groups deltaproduct

(write every flag with its ``--``: a bare token makes XLA drop the flags after it; and
``--intra_op_parallelism_threads=1`` is no XLA flag: jaxlib 0.10.2 stops on it as unknown).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "experiments")]  # the package, configs/, bench/

import linear_attention  # noqa: E402,F401  first: its XLA flags need a backend not yet started
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from experiments import outputs  # noqa: E402
from bench.measure import grad_fn, matmul_gflops, time_calls  # noqa: E402

from linear_attention import ops  # noqa: E402
from linear_attention.io import write_json  # noqa: E402
from linear_attention.ops import dplr  # noqa: E402
from linear_attention.engines import chunks  # noqa: E402

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


# The score implementations compared: (function, sub-chunk length of the by-diagonals one;
# None: its default). Each op is compiled with the implementation patched in (_compile).
CONFIGS = {
    "intra_scores": ("intra_scores", None),
    "by_diagonals": ("intra_scores_by_diagonals", None),
    "by_diagonals_s4": ("intra_scores_by_diagonals", 4),
    "by_diagonals_s8": ("intra_scores_by_diagonals", 8),
}


def kda_entries(t: int, configs) -> dict:
  """``{name: (fn, args, config)}``: KDA as the op runs it (``a = None``) with each score
  implementation, and the general engine with ``a = -k`` and the default scores (before)."""
  q, k, v, beta, g = _inputs(t)

  def general(q, k, v, beta, g):
    wk, a, b = dplr._kda_map(k, beta, g, jnp.float32)
    return ops.dplr_attention(q, wk, v, a, b, g, form="chunk")

  fast = lambda q, k, v, beta, g: ops.kda(q, k, v, beta, g, form="chunk")
  out = {"kda_general_a": (general, (q, k, v, beta, g), None)}
  out.update({f"kda_{c}": (fast, (q, k, v, beta, g), c) for c in configs})
  return out


def deltaproduct_entries(t: int, configs) -> dict:
  """Gated DeltaProduct, 2 steps a token (``a = None``), with each implementation."""
  q, k, v, beta, g = _inputs(t, 4)
  k2 = jnp.stack([k, jnp.roll(k, 1, axis=1)], axis=3)
  v2 = jnp.stack([v, -v], axis=3)
  b2 = jnp.stack([beta, 1 - beta], axis=-1)
  op = lambda q, k, v, g: ops.gated_deltaproduct(q, k, v, b2, g[..., 0], form="chunk")
  return {f"deltaproduct_{c}": (op, (q, k2, v2, g), c) for c in configs}


def rwkv7_entries(t: int, configs) -> dict:
  """RWKV-7's chunk form (the general engine: ``a`` is not ``-k``) with each implementation."""
  r, k, v, beta, g = _inputs(t, 2)
  kappa = jax.random.normal(jax.random.PRNGKey(3), k.shape)
  kappa = kappa / jnp.linalg.norm(kappa, axis=-1, keepdims=True)
  icl = jnp.broadcast_to(beta[..., None], k.shape)
  op = lambda r, k, v, g: ops.rwkv7(r, k, v, g, kappa, icl, form="chunk")
  return {f"rwkv7_{c}": (op, (r, k, v, g), c) for c in configs}


def gla_entries(t: int, chunk: int, configs) -> dict:
  """GLA's chunk form with each score implementation."""
  q, k, v, _, g = _inputs(t, 1)
  op = lambda q, k, v, g: ops.gla(q, k, v, g, form="chunk", chunk_size=chunk)
  return {f"gla_{c}": (op, (q, k, v, g), c) for c in configs}


def _compile(fn, args, config=None):
  """Forward and fwd+bwd compiled ahead of time with the score implementation ``config``
  (a key of :data:`CONFIGS`) patched into ``engines.chunks`` while they are traced: GLA and
  log-linear call ``chunks.intra_scores_vector``, the DPLR engine
  ``chunks.intra_scores_by_diagonals``, both looked up at trace time."""
  saved = (chunks.intra_scores_vector, chunks.intra_scores_by_diagonals,
           chunks._diagonal_subchunk)
  if config is not None:
    name, sub = CONFIGS[config]
    fn_scores = saved[1] if name == "intra_scores_by_diagonals" else getattr(chunks, name)
    chunks.intra_scores_by_diagonals = fn_scores
    chunks.intra_scores_vector = (
        lambda q, k, gc: fn_scores(q[..., None, :, :], k[..., None, :, :], gc)[..., 0, 0, :, :])
    if sub is not None:
      chunks._diagonal_subchunk = lambda c: chunks._subchunk_size(c, sub)
  jax.clear_caches()  # the ops' inner jits would reuse a trace made with other scores
  try:
    argnums = tuple(range(len(args)))
    return (jax.jit(fn).lower(*args).compile(),
            jax.jit(grad_fn(fn, argnums)).lower(*args).compile())
  finally:
    (chunks.intra_scores_vector, chunks.intra_scores_by_diagonals,
     chunks._diagonal_subchunk) = saved
    jax.clear_caches()


def time_entries(entries: dict, repeats: int) -> dict:
  """``{name: {fwd_s, fwdbwd_s, fwd_cpu_s, fwdbwd_cpu_s}}``, best of ``repeats`` interleaved
  rounds after a warm-up round."""
  compiled = {}
  for name, (fn, args, config) in entries.items():
    args = jax.block_until_ready(args)
    compiled[name] = (args, _compile(fn, args, config))
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
  p.add_argument("--groups", default="kda,gla", help="of kda, gla, rwkv7, deltaproduct")
  p.add_argument("--gla_chunk", type=int, default=64, help="GLA's chunk length (its default)")
  p.add_argument("--configs", default="intra_scores,by_diagonals",
                 help=f"score implementations, of {list(CONFIGS)}")
  p.add_argument("--repeats", type=int, default=5)
  outputs.add_out(p, "bench_scores_cpu.json")
  a = p.parse_args(argv)
  groups = a.groups.split(",")
  entries = {}
  if "kda" in groups:
    entries.update(kda_entries(a.seq_len, a.configs.split(",")))
  if "deltaproduct" in groups:
    entries.update(deltaproduct_entries(a.seq_len, a.configs.split(",")))
  if "rwkv7" in groups:
    entries.update(rwkv7_entries(a.seq_len, a.configs.split(",")))
  if "gla" in groups:
    entries.update(gla_entries(a.seq_len, a.gla_chunk, a.configs.split(",")))
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
