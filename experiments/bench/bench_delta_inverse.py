"""The delta rule's chunk form: the written-out VJP of the UT-transform inverse against
automatic differentiation of the same inverse, in one process.

``chunks.unit_lower_inverse`` carries a ``custom_vjp`` (``dL = -X^T dX X^T``); its
undecorated function (``.fun``) is what automatic differentiation would replay (six levels
of reshapes, diagonals and concatenations). Both are timed on DeltaNet's forward+backward,
interleaved, with JAX's caches cleared at every swap: the jitted ``delta._forward`` keeps its
first trace otherwise, and an A/B in one process would compare a version with itself.

H=2, K=V=32 (the studies' heads), B*T = 4096 tokens, float32. Writes JSON and prints the
table: best-of-``repeats`` times per pair, the median ratio, and the compiled gradient's HLO
size.

  python experiments/bench/bench_delta_inverse.py
  python experiments/bench/bench_delta_inverse.py --smoke
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import jax
import jax.numpy as jnp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "experiments")]  # the package, configs/, bench/

from experiments import outputs  # noqa: E402
from bench.measure import time_calls  # noqa: E402
from linear_attention import ops  # noqa: E402
from linear_attention.io import write_json  # noqa: E402
from linear_attention.engines import chunks  # noqa: E402


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--smoke", action="store_true", help="T = 64, 256; one pair, 2 repeats")
  p.add_argument("--pairs", type=int, default=3, help="interleaved (autodiff, written) pairs")
  p.add_argument("--repeats", type=int, default=15, help="timed calls per measurement (best)")
  outputs.add_out(p, "bench_delta_inverse_cpu.json")
  a = p.parse_args(argv)
  lengths = (64, 256) if a.smoke else (64, 256, 4096)
  pairs, repeats = (1, 2) if a.smoke else (a.pairs, a.repeats)
  written = chunks.unit_lower_inverse
  variants = {"autodiff": written.fun, "written": written}
  rows = []
  try:
    for t in lengths:
      b = max(1, 4096 // t)
      ks = jax.random.split(jax.random.PRNGKey(0), 4)
      q, k, v = (jax.random.normal(x, (b, t, 2, 32)) for x in ks[:3])
      k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
      beta = jax.nn.sigmoid(jax.random.normal(ks[3], (b, t, 2)))
      loss = lambda q, k, v, beta: jnp.sum(ops.delta_rule(q, k, v, beta) ** 2)
      grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
      times = {name: [] for name in variants}
      hlo = {}
      for _ in range(pairs):
        for name, fn in variants.items():
          chunks.unit_lower_inverse = fn
          jax.clear_caches()
          hlo[name] = len(grad.lower(q, k, v, beta).compile().as_text().splitlines())
          times[name].append(time_calls(grad, q, k, v, beta, repeats=repeats)[0] * 1e3)
      ratio = statistics.median(x / y for x, y in zip(times["autodiff"], times["written"]))
      rows.append(dict(T=t, B=b, autodiff_ms=times["autodiff"], written_ms=times["written"],
                       speedup=ratio, hlo_lines=hlo))
  finally:
    chunks.unit_lower_inverse = written
    jax.clear_caches()
  print(f"{'T':>6} {'B':>4} {'autodiff ms':>24} {'written ms':>24} {'speed-up':>9} {'HLO lines':>12}")
  for r in rows:
    fmt = lambda xs: "/".join(f"{x:.1f}" for x in xs)
    print(f"{r['T']:>6} {r['B']:>4} {fmt(r['autodiff_ms']):>24} {fmt(r['written_ms']):>24} "
          f"{r['speedup']:>8.2f}x {r['hlo_lines']['autodiff']:>5}->{r['hlo_lines']['written']:<5}")
  write_json(a.out, dict(backend=jax.default_backend(), jax=jax.__version__,
                         cpus=os.cpu_count(), xla_flags=os.environ.get("XLA_FLAGS", ""),
                         load_avg_end=os.getloadavg(),
                         smoke=a.smoke, pairs=pairs, repeats=repeats, rows=rows))


if __name__ == "__main__":
  main()
