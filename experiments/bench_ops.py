"""Benchmark of the ops: time, throughput and peak memory against sequence length.

Each (case, T) runs in its own subprocess, so its peak resident memory
(``ru_maxrss``) is its own. The float32 2048x2048 matmul rate is measured in the
same run, and every case reports its GFLOP/s and the ratio to that rate, since
shared machines drift. Results go to ``<out>/bench_ops.json``; a table is printed.

    python experiments/bench_ops.py                      # all cases, T in 1k..64k
    python experiments/bench_ops.py --cases chunk,naive_softmax --seqs 1024,4096
    python experiments/bench_ops.py --smoke              # tiny, for CI

FLOP counts are those of the algorithm as written (masked-out work included),
forward only; fwd+bwd GFLOP/s use 3x the forward count.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

B, H, D = 1, 4, 64
CHUNK = 64
GB = 1 << 30


def _engine_case(form, decay):
  """The diagonal-decay engine (``decay``: none | scalar | vector) in one form."""

  def build(t, rng):
    import jax
    import jax.numpy as jnp
    from linear_attention import ops
    kq, kk, kv, kg = jax.random.split(rng, 4)
    q, k, v = (jax.random.normal(x, (B, t, H, D)) for x in (kq, kk, kv))
    shape = {"none": None, "scalar": (B, t, H), "vector": (B, t, H, D)}[decay]
    args = (q, k, v) if shape is None else (q, k, v, -jax.random.uniform(kg, shape))
    fn = lambda *a: ops.decay_linear_attention(*a, form=form, chunk_size=CHUNK)
    return fn, args

  return build


def _linear_case(form):
  def build(t, rng):
    import jax
    from linear_attention import ops
    kq, kk, kv = jax.random.split(rng, 3)
    q, k, v = (jax.random.normal(x, (B, t, H, D)) for x in (kq, kk, kv))
    return (lambda q, k, v: ops.linear_attention(q, k, v, form=form, chunk_size=CHUNK)), (q, k, v)

  return build


def _softmax_case(implementation):
  def build(t, rng):
    import jax
    from linear_attention import ops
    kq, kk, kv = jax.random.split(rng, 3)
    q, k, v = (jax.random.normal(x, (B, t, H, D)) for x in (kq, kk, kv))
    fn = lambda q, k, v: ops.softmax_attention(q, k, v, causal=True, implementation=implementation)
    return fn, (q, k, v)

  return build


def _chunk_flops(t):
  # Per head and token: QK^T and AV inside the chunk (2C(K+V)), the chunk's
  # state (2KV) and the read of the incoming state (2KV).
  return B * H * t * (2 * CHUNK * 2 * D + 4 * D * D)


def _quadratic_flops(t):
  return B * H * 2 * t * t * 2 * D  # QK^T and AV over the full T x T


# name -> (builder, forward FLOPs(T) or None, estimated peak bytes(T) of fwd+bwd)
CASES = {
    "chunk": (_engine_case("chunk", "none"), _chunk_flops, lambda t: 0),
    "recurrent": (_engine_case("recurrent", "none"), lambda t: B * H * t * 4 * D * D,
                  lambda t: 3 * B * H * t * D * D * 4),
    "parallel": (_engine_case("parallel", "none"), _quadratic_flops,
                 lambda t: 4 * B * H * t * t * 4),
    "linear_elu_chunk": (_linear_case("chunk"), _chunk_flops, lambda t: 0),
    "chunk_scalar_decay": (_engine_case("chunk", "scalar"), _chunk_flops, lambda t: 0),
    "chunk_vector_decay": (_engine_case("chunk", "vector"), _chunk_flops, lambda t: 0),
    "naive_softmax": (_softmax_case("naive"), _quadratic_flops,
                      lambda t: 4 * B * H * t * t * 4),
    "blockwise_softmax": (_softmax_case("blockwise"), _quadratic_flops, lambda t: 0),
}


def _time(fn, *args, repeats=3):
  """Best wall time of ``repeats`` runs after one compile-and-warm-up run."""
  import jax
  jax.block_until_ready(fn(*args))
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    best = min(best, time.perf_counter() - t0)
  return best


def matmul_gflops(n=2048):
  """The machine's own float32 matmul rate, GFLOP/s."""
  import jax
  import jax.numpy as jnp
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
  f = jax.jit(lambda a: a @ a)
  return 2 * n**3 / _time(f, a, repeats=5) / 1e9


def worker(case, t, budget_s):
  """Measures one case at one length; prints a JSON line."""
  import jax
  import jax.numpy as jnp
  build, flops, _ = CASES[case]
  fn, args = build(t, jax.random.PRNGKey(0))
  fwd = jax.jit(fn)
  loss = lambda *a: jnp.sum(fn(*a).astype(jnp.float32))
  bwd = jax.jit(jax.grad(loss, argnums=tuple(range(len(args)))))
  res = {"case": case, "T": t}
  t0 = time.perf_counter()
  res["fwd_s"] = _time(fwd, *args, repeats=1 if t >= 16384 else 3)
  # Skip fwd+bwd if the forward alone suggests it would overrun the budget.
  if 3 * res["fwd_s"] * 4 + (time.perf_counter() - t0) < budget_s:
    res["fwdbwd_s"] = _time(bwd, *args, repeats=1 if t >= 16384 else 3)
  f = flops(t) if flops else None
  if f:
    res["fwd_gflops"] = f / res["fwd_s"] / 1e9
    if "fwdbwd_s" in res:
      res["fwdbwd_gflops"] = 3 * f / res["fwdbwd_s"] / 1e9
  res["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB
  print("RESULT " + json.dumps(res), flush=True)


def step_latency(position):
  """Seconds per decoding step of ELU linear attention after ``position`` tokens."""
  import jax
  from linear_attention import ops
  kq, kk, kv = jax.random.split(jax.random.PRNGKey(0), 3)
  q, k, v = (jax.random.normal(x, (B, position, H, D)) for x in (kq, kk, kv))
  _, state = jax.jit(lambda q, k, v: ops.linear_attention(q, k, v, return_state=True))(q, k, v)
  step = jax.jit(lambda q, k, v, s: ops.linear_attention_step(q, k, v, s))
  return _time(step, q[:, -1], k[:, -1], v[:, -1], state, repeats=50)


def run_one(case, t, budget_s, mem_limit_gb):
  """Runs :func:`worker` in a subprocess; returns its result or why it was skipped."""
  est = CASES[case][2](t) / GB
  if est > mem_limit_gb:
    return {"case": case, "T": t, "skipped": f"needs ~{est:.0f} GB > {mem_limit_gb} GB"}
  cmd = [sys.executable, __file__, "--worker", case, str(t), str(budget_s)]
  try:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=budget_s * 3)
  except subprocess.TimeoutExpired:
    return {"case": case, "T": t, "skipped": f"over {budget_s * 3}s"}
  for line in out.stdout.splitlines():
    if line.startswith("RESULT "):
      return json.loads(line[7:])
  return {"case": case, "T": t, "skipped": "failed: " + out.stderr.strip().splitlines()[-1][:200]}


def table(results, mm):
  rows = [f"{'case':22s} {'T':>6s} {'fwd ms':>9s} {'fwd+bwd ms':>11s} {'us/tok f+b':>10s} "
          f"{'fwd GF/s':>9s} {'%mm':>5s} {'peak GB':>8s}"]
  for r in results:
    if "skipped" in r:
      rows.append(f"{r['case']:22s} {r['T']:6d}  skipped: {r['skipped']}")
      continue
    fb = r.get("fwdbwd_s")
    gf = r.get("fwd_gflops")
    rows.append(
        f"{r['case']:22s} {r['T']:6d} {1e3 * r['fwd_s']:9.2f} "
        f"{(1e3 * fb if fb else float('nan')):11.2f} "
        f"{(1e6 * fb / r['T'] if fb else float('nan')):10.2f} "
        f"{(gf or float('nan')):9.1f} {(100 * gf / mm if gf else float('nan')):5.0f} "
        f"{r['peak_rss_gb']:8.2f}")
  return "\n".join(rows)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--cases", default=",".join(CASES))
  p.add_argument("--seqs", default="1024,4096,16384,65536")
  p.add_argument("--budget", type=float, default=60.0, help="seconds per case and length")
  p.add_argument("--mem-limit-gb", type=float, default=16.0)
  p.add_argument("--out", default="results")
  p.add_argument("--smoke", action="store_true", help="tiny sizes, for CI")
  p.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
  a = p.parse_args(argv)
  if a.worker:
    return worker(a.worker[0], int(a.worker[1]), float(a.worker[2]))
  cases = a.cases.split(",")
  unknown = [c for c in cases if c not in CASES]
  if unknown:
    raise SystemExit(f"unknown --cases {unknown}; valid: {list(CASES)}")
  seqs = [128, 256] if a.smoke else [int(s) for s in a.seqs.split(",")]
  mm = matmul_gflops(512 if a.smoke else 2048)
  print(f"float32 matmul: {mm:.1f} GFLOP/s")
  results = []
  for c in cases:
    for t in seqs:
      results.append(run_one(c, t, a.budget, a.mem_limit_gb))
      print(table(results[-1:], mm).splitlines()[-1], flush=True)
  print("\n" + table(results, mm))
  steps = {p: step_latency(p) for p in ([128] if a.smoke else [1024, 65536])}
  for pos, secs in steps.items():
    print(f"linear attention step at position {pos}: {1e6 * secs:.1f} us")
  os.makedirs(a.out, exist_ok=True)
  path = os.path.join(a.out, "bench_ops.json")
  with open(path, "w") as f:
    json.dump({"matmul_gflops": mm, "step_s": steps, "B": B, "H": H, "D": D, "chunk": CHUNK,
               "results": results}, f, indent=1)
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
