"""Log-linear attention's chunk form against the plain chunk forms it extends, in one process.

Issue 27: the chunk form of ``ops.loglinear_ssd`` (scalar decay per head) and
``ops.loglinear_gla`` (per-channel decay), a dense in-chunk part plus one matmul per
chunk level of the Fenwick tree (:func:`linear_attention.ops.loglinear._chunk_fenwick`),
against ``ops.ssd`` and ``ops.gla`` (form="chunk") on the same inputs, and against the
previous chunk form (one engine pass per level, stacked on the batch axis; still the path
of packed segments and initial states) called on the same arrays. Target: log-linear within
3x of the plain op at 4k, forward and forward+backward.

Shapes as ``experiments/bench/cases.py``: B=1, H=4, D=64 (SSD: P = N = 64, one group of
B, C), 64-token chunks, L=17 levels, float32. Every ratio divides times of the same run;
the machine's 2048^2 matmul rate is recorded beside them. ``*_ms`` are best wall times,
``*_cpu_ms`` the process CPU time of the same calls (all threads); ratios use wall time.

  python experiments/bench/bench_loglinear.py              # T = 1k, 4k, 16k
  python experiments/bench/bench_loglinear.py --smoke      # T = 256, one call each
  # one core (XLA_FLAGS is recorded in the JSON):
  XLA_FLAGS="--xla_cpu_multi_thread_eigen=false" \
      python experiments/bench/bench_loglinear.py --out results/bench_loglinear_cpu_1core.json
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "experiments")]  # the package, configs/, bench/

from experiments import outputs  # noqa: E402
from bench.cases import CASES, DIMS  # noqa: E402
from bench.measure import grad_fn, matmul_gflops, time_calls  # noqa: E402

from linear_attention import ops  # noqa: E402
from linear_attention.io import write_json  # noqa: E402
from linear_attention import common  # noqa: E402
from linear_attention.ops import gated, loglinear  # noqa: E402


def _old_chunk(q, k, v, g, lam):
  """The previous chunk form (every level an engine pass) on checked, scaled inputs."""
  b, t = q.shape[:2]
  levels = lam.shape[-1]
  s0 = jnp.zeros((b, q.shape[2], levels, q.shape[3], v.shape[3]), q.dtype)
  pos0 = jnp.zeros((b,), jnp.int32)
  seg_info = loglinear._positions(b, t, None, pos0)
  o, _ = loglinear._chunk(q, k, v, common.floor_log_decay(g), lam, s0, pos0, seg_info,
                          chunk_size=min(DIMS.chunk, t), has_initial=False,
                          implementation=None)
  return o


def old_loglinear_ssd(x, dt, A, B, C, lam):
  q, k, v, g, _ = gated._ssd_inputs(x, dt, A, B, C, None, None, False)
  return _old_chunk(q, k, v, g, lam)


def old_loglinear_gla(q, k, v, g, lam):
  return _old_chunk(q * q.shape[-1] ** -0.5, k, v, g, lam)


def _cases(t):
  """``{name: (fn, args, argnums)}`` at length ``t``; the SSD pair shares its inputs, and so
  does the GLA pair (GLA's case inputs plus the level weights)."""
  key = jax.random.PRNGKey(0)
  ssd, ssd_args, ssd_argnums = CASES["ssd_chunk"].build(t, DIMS, key)
  ll, ll_args, ll_argnums = CASES["loglinear_ssd_chunk"].build(t, DIMS, key)
  ll_args = ssd_args + ll_args[5:]  # the same x, dt, A, B, C
  gla, gla_args, gla_argnums = CASES["gla_chunk"].build(t, DIMS, key)
  lam = jax.nn.softplus(jax.random.normal(jax.random.fold_in(key, 99),
                                          gla_args[0].shape[:3] + (DIMS.L,)))
  chunk = dict(form="chunk", chunk_size=DIMS.chunk)
  ll_gla = lambda q, k, v, g, lam: ops.loglinear_gla(q, k, v, g, lam, **chunk)
  gla_argnums5 = gla_argnums + (4,)
  return {
      "ssd": (ssd, ssd_args, ssd_argnums),
      "loglinear_ssd": (ll, ll_args, ll_argnums),
      "loglinear_ssd_old": (old_loglinear_ssd, ll_args, ll_argnums),
      "gla": (gla, gla_args, gla_argnums),
      "loglinear_gla": (ll_gla, gla_args + (lam,), gla_argnums5),
      "loglinear_gla_old": (old_loglinear_gla, gla_args + (lam,), gla_argnums5),
  }


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--smoke", action="store_true", help="T = 256, one timed call")
  p.add_argument("--lengths", type=int, nargs="*", default=None)
  p.add_argument("--repeats", type=int, default=3, help="timed calls (best) below 16k")
  outputs.add_out(p, "bench_loglinear_cpu.json")
  a = p.parse_args(argv)
  lengths = a.lengths or ((256,) if a.smoke else (1024, 4096, 16384))
  rate = matmul_gflops()
  rows = []
  for t in lengths:
    repeats = 1 if (a.smoke or t >= 16384) else a.repeats
    row = {"T": t}
    for name, (fn, args, argnums) in _cases(t).items():
      for kind, f in (("fwd", fn), ("fwdbwd", grad_fn(fn, argnums))):
        compiled = jax.jit(f).lower(*args).compile()
        wall, cpu = time_calls(compiled, *args, repeats=repeats)
        row[f"{name}_{kind}_ms"], row[f"{name}_{kind}_cpu_ms"] = 1e3 * wall, 1e3 * cpu
    for kind in ("fwd", "fwdbwd"):
      for ll, base in (("loglinear_ssd", "ssd"), ("loglinear_ssd_old", "ssd"),
                       ("loglinear_gla", "gla"), ("loglinear_gla_old", "gla")):
        row[f"{ll}_over_{base}_{kind}"] = row[f"{ll}_{kind}_ms"] / row[f"{base}_{kind}_ms"]
    rows.append(row)
    print(f"T={t} done", flush=True)

  cols = (("ssd", None), ("loglinear_ssd", "ssd"), ("loglinear_ssd_old", "ssd"),
          ("gla", None), ("loglinear_gla", "gla"), ("loglinear_gla_old", "gla"))
  print(f"matmul rate {rate:.1f} GFLOP/s; ms (ratio to the plain op of the same run)")
  for kind in ("fwd", "fwdbwd"):
    print(f"\n{kind:>7} " + " ".join(f"{c:>24}" for c, _ in cols))
    for r in rows:
      cells = [f"{r[f'{c}_{kind}_ms']:.1f}" + (f" ({r[f'{c}_over_{b}_{kind}']:.2f}x)" if b else "")
               for c, b in cols]
      print(f"{r['T']:>7} " + " ".join(f"{x:>24}" for x in cells))
  write_json(a.out, dict(backend=jax.default_backend(), jax=jax.__version__,
                         cpus=os.cpu_count(), xla_flags=os.environ.get("XLA_FLAGS", ""),
                         load_avg_end=os.getloadavg(), matmul_gflops=rate, smoke=a.smoke,
                         dims=dict(B=DIMS.B, H=DIMS.H, D=DIMS.D, chunk=DIMS.chunk, L=DIMS.L),
                         rows=rows))


if __name__ == "__main__":
  main()
