"""Which exact softmax is fastest here: the naive and blockwise XLA paths of
``ops.softmax_attention`` against ``jax.nn.dot_product_attention``, per length.

Times forward and forward+backward (median of ``--reps`` runs after a warm-up)
of causal attention, float32, B=1, H=4, D=64, for each T, and writes JSON::

    python experiments/bench/softmax_baseline.py [--lengths 256,512,1024,2048,4096]
        [--out results/softmax_baseline_cpu.json]

The result picks ``ops.softmax.NAIVE_MAX_LEN`` (the longest T for which
``algorithm=None`` takes the naive path) on CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "experiments", "checks")]  # gpu_check's timer

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from linear_attention import ops  # noqa: E402
from linear_attention.io import write_json  # noqa: E402
from experiments import outputs  # noqa: E402
from gpu_check import timeit  # noqa: E402  (one timer for the experiments)


IMPLS = {
    "naive": lambda q, k, v: ops.softmax_attention(q, k, v, causal=True, algorithm="naive"),
    "blockwise": lambda q, k, v: ops.softmax_attention(q, k, v, causal=True,
                                                       algorithm="blockwise"),
    "jax.nn.dot_product_attention": lambda q, k, v: jax.nn.dot_product_attention(
        q, k, v, is_causal=True, implementation="xla"),
}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--lengths", default="256,512,1024,2048,4096")
  p.add_argument("--reps", type=int, default=5)
  outputs.add_out(p, "softmax_baseline_cpu.json")
  args = p.parse_args(argv)
  b, h, d = 1, 4, 64
  out = {"backend": jax.default_backend(), "jax": jax.__version__, "shape": dict(B=b, H=h, D=d),
         "dtype": "float32", "causal": True, "ms": {}}
  for t in (int(x) for x in args.lengths.split(",")):
    keys = jax.random.split(jax.random.PRNGKey(t), 3)
    q, k, v = (jax.random.normal(x, (b, t, h, d), jnp.float32) for x in keys)
    row = {}
    for name, fn in IMPLS.items():
      grad = jax.jit(jax.grad(lambda q, k, v, fn=fn: jnp.sum(fn(q, k, v)), argnums=(0, 1, 2)))
      row[name] = {"fwd": timeit(jax.jit(fn), q, k, v, reps=args.reps),
                   "fwd_bwd": timeit(grad, q, k, v, reps=args.reps)}
    row["fastest_fwd_bwd"] = min(IMPLS, key=lambda n: row[n]["fwd_bwd"])
    out["ms"][str(t)] = row
    print(t, json.dumps(row), flush=True)
  write_json(args.out, out)
  print(f"wrote {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
