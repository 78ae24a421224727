"""Cost study: time and peak memory against sequence length, and decode latency.

For each op (forward, and forward + backward of ``sum(o)``) and each sequence
length ``T``, one subprocess compiles and times the op, so that its peak
resident memory (``ru_maxrss``) is its own. Three memory numbers are kept:
``peak_rss_gb`` (the whole process, JAX runtime included), ``rss_delta_gb``
(peak minus the resident size after JAX started, before the inputs existed)
and ``xla_gb`` (XLA's own account of the compiled program: arguments, outputs
and temporaries). Shapes: batch 1, 4 heads, head dim 64 (256 channels for the
channel-wise recurrences), chunk 64, float32.

Lengths grow until a case would pass its per-case time cap (predicted from the
last two points) or XLA's memory estimate passes ``--mem-limit-gb``; the
quadratic softmax cases stop at ``--max-quadratic-t``. Log-log slopes of time
and memory against ``T`` are fitted over ``T >= --fit-min-t`` (short lengths
are dominated by fixed overheads) and printed: about 1 for the linear forms,
about 2 for naive softmax.

Decode latency: each op's ``*_step`` at several context positions, with a
state (or cache) of the size the op carries at that position. Recurrent ops
carry a fixed-size state, so their step is the same computation at every
position; softmax decoding reads a KV cache of ``p + 1`` tokens (timed with
``jax.nn.dot_product_attention``, one query against the cache; the ops
package has no softmax step); sliding window reads a fixed window.

    python experiments/studies/study_cost.py                     # full size
    python experiments/studies/study_cost.py --cap 20 --seqs 1024,4096,16384,65536
    python experiments/studies/study_cost.py --smoke             # tiny, for CI

Writes ``<out>/cost.json`` and ``<out>/cost.csv``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _study_utils as su  # noqa: E402

B, H, D = 1, 4, 64
CHANNELS = H * D  # width of the channel-wise recurrences (selective scan, RG-LRU)
STATE_N = 16  # selective-scan state size per channel (Mamba-1's default)
CHUNK = 64
WINDOW = 256
GB = 1 << 30


def _rand(key, n):
  import jax
  return jax.random.split(key, n)


def _qkv(key, t):
  import jax
  kq, kk, kv = _rand(key, 3)
  return tuple(jax.random.normal(x, (B, t, H, D)) for x in (kq, kk, kv))


def _linear(t, key):
  from linear_attention import ops
  return (lambda q, k, v: ops.linear_attention(q, k, v, feature_map="elu", chunk_size=CHUNK),
          _qkv(key, t))


def _decay(kind):
  def build(t, key):
    import jax
    from linear_attention import ops
    k1, k2 = _rand(key, 2)
    shape = (B, t, H) if kind == "scalar" else (B, t, H, D)
    log_decay = -jax.random.uniform(k2, shape, minval=0.01, maxval=0.5)
    fn = lambda q, k, v, g: ops.decay_linear_attention(q, k, v, g, chunk_size=CHUNK)
    return fn, _qkv(k1, t) + (log_decay,)
  return build


def _gla(t, key):
  import jax
  from linear_attention import ops
  k1, k2 = _rand(key, 2)
  log_g = jax.nn.log_sigmoid(jax.random.normal(k2, (B, t, H, D))) / 16
  return (lambda q, k, v, g: ops.gla(q, k, v, g, chunk_size=CHUNK)), _qkv(k1, t) + (log_g,)


def _ssd(t, key):
  import jax
  from linear_attention import ops
  kx, kdt, ka, kb, kc = _rand(key, 5)
  x = jax.random.normal(kx, (B, t, H, D))
  dt = jax.random.uniform(kdt, (B, t, H), minval=1e-3, maxval=0.1)
  a = -jax.random.uniform(ka, (H,), minval=1.0, maxval=16.0)
  bm, cm = (jax.random.normal(k_, (B, t, 1, D)) for k_ in (kb, kc))
  return (lambda x, dt, a, bm, cm: ops.ssd(x, dt, a, bm, cm, chunk_size=CHUNK)), (x, dt, a, bm, cm)


def _deltanet(t, key):
  import jax
  from linear_attention import ops
  k1, k2 = _rand(key, 2)
  beta = jax.nn.sigmoid(jax.random.normal(k2, (B, t, H)))
  fn = lambda q, k, v, beta: ops.deltanet(q, k, v, beta, chunk_size=CHUNK, normalize_qk=True)
  return fn, _qkv(k1, t) + (beta,)


def _selective_scan(t, key):
  import jax
  import jax.numpy as jnp
  from linear_attention import ops
  kx, kdt, kb, kc = _rand(key, 4)
  x = jax.random.normal(kx, (B, t, CHANNELS))
  dt = jax.random.normal(kdt, (B, t, CHANNELS)) - 4.0
  a = -jnp.broadcast_to(jnp.arange(1, STATE_N + 1, dtype=jnp.float32), (CHANNELS, STATE_N))
  bm, cm = (jax.random.normal(k_, (B, t, STATE_N)) for k_ in (kb, kc))
  fn = lambda x, dt, a, bm, cm: ops.selective_scan(x, dt, a, bm, cm, chunk_size=CHUNK)
  return fn, (x, dt, a, bm, cm)


def _rg_lru(t, key):
  import jax
  from linear_attention import ops
  kx, kr, ki, kl = _rand(key, 4)
  x, gr, gi = (jax.random.normal(k_, (B, t, CHANNELS)) for k_ in (kx, kr, ki))
  lam = jax.random.uniform(kl, (CHANNELS,), minval=2.0, maxval=6.0)
  return (lambda x, gr, gi, lam: ops.rg_lru(x, gr, gi, lam, chunk_size=CHUNK)), (x, gr, gi, lam)


def _sliding(t, key):
  from linear_attention import ops
  return (lambda q, k, v: ops.sliding_window_attention(q, k, v, window=WINDOW, causal=True),
          _qkv(key, t))


def _softmax(algorithm):
  def build(t, key):
    from linear_attention import ops
    fn = lambda q, k, v: ops.softmax_attention(q, k, v, causal=True, algorithm=algorithm)
    return fn, _qkv(key, t)
  return build


# name -> (builder, quadratic in T)
CASES = {
    "linear_chunk": (_linear, False),
    "decay_scalar_chunk": (_decay("scalar"), False),
    "decay_vector_chunk": (_decay("vector"), False),
    "gla": (_gla, False),
    "ssd": (_ssd, False),
    "deltanet": (_deltanet, False),
    "selective_scan": (_selective_scan, False),
    "rg_lru": (_rg_lru, False),
    "sliding_window": (_sliding, False),
    "naive_softmax": (_softmax("naive"), True),
    "blockwise_softmax": (_softmax("blockwise"), True),
}
MODES = ("fwd", "fwdbwd")


def _rss_gb():
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB


def _timed(fn, args, cap_s, repeats):
  """Runs ``fn(*args)`` ``repeats`` times, or fewer where the next run would pass the cap.

  Returns:
    The list of run times (at least one).
  """
  import jax
  times = []
  while len(times) < repeats:
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
    if sum(times) + times[-1] > cap_s:
      break
  return times


def worker(case: str, t: int, mode: str, cap_s: float, mem_limit_gb: float) -> None:
  """Measures one case at one length in one mode; prints a ``RESULT {json}`` line."""
  import jax
  import jax.numpy as jnp
  jax.devices()
  base = _rss_gb()
  build, _ = CASES[case]
  fn, args = build(t, jax.random.PRNGKey(0))
  if mode == "fwdbwd":
    fwd = fn
    fn = jax.grad(lambda *a: jnp.sum(fwd(*a).astype(jnp.float32)), argnums=tuple(range(len(args))))
  res = {"case": case, "T": t, "mode": mode}
  t0 = time.perf_counter()
  compiled = jax.jit(fn).lower(*args).compile()
  res["compile_s"] = time.perf_counter() - t0
  try:
    m = compiled.memory_analysis()
    res["xla_gb"] = (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
                     - m.alias_size_in_bytes) / GB
  except Exception:  # not every backend reports it
    res["xla_gb"] = None
  if res["xla_gb"] is not None and res["xla_gb"] > mem_limit_gb:
    res["skipped"] = f"XLA needs {res['xla_gb']:.1f} GB > {mem_limit_gb} GB"
  else:
    # At least two runs where they fit the cap: the first run at a new size also
    # pays for first-touch page faults of its buffers.
    times = _timed(compiled, args, cap_s, repeats=2 if t >= 262144 else 3)
    res.update(time_s=min(times), times_s=times, repeats=len(times))
  res["base_rss_gb"] = base
  res["peak_rss_gb"] = _rss_gb()
  res["rss_delta_gb"] = res["peak_rss_gb"] - base
  print("RESULT " + json.dumps(res), flush=True)


# name -> (step builder, O(1) state); a builder maps a position to (fn, args, state bytes).
def _decode_cases():
  def linear(p, key):
    import jax
    from linear_attention import ops
    q, k, v = (x[:, 0] for x in _qkv(key, 1))
    s = jax.random.normal(key, (B, H, D, D + 1))  # ELU features: F = D; +1 column for z
    return ops.linear_attention_step, (s, q, k, v)

  def decay(kind):
    def build(p, key):
      import jax
      from linear_attention import ops
      q, k, v = (x[:, 0] for x in _qkv(key, 1))
      g = -jax.random.uniform(key, (B, H) if kind == "scalar" else (B, H, D))
      s = jax.random.normal(key, (B, H, D, D))
      return ops.decay_linear_attention_step, (s, q, k, v, g)
    return build

  def gla(p, key):
    import jax
    from linear_attention import ops
    q, k, v = (x[:, 0] for x in _qkv(key, 1))
    g = jax.nn.log_sigmoid(jax.random.normal(key, (B, H, D))) / 16
    s = jax.random.normal(key, (B, H, D, D))
    return ops.gla_step, (s, q, k, v, g)

  def ssd(p, key):
    import jax
    from linear_attention import ops
    x = jax.random.normal(key, (B, H, D))
    dt = jax.random.uniform(key, (B, H), minval=1e-3, maxval=0.1)
    a = -jax.random.uniform(key, (H,), minval=1.0, maxval=16.0)
    bm = cm = jax.random.normal(key, (B, 1, D))
    s = jax.random.normal(key, (B, H, D, D))
    return ops.ssd_step, (s, x, dt, a, bm, cm)

  def deltanet(p, key):
    import jax
    from linear_attention import ops
    q, k, v = (x[:, 0] for x in _qkv(key, 1))
    beta = jax.nn.sigmoid(jax.random.normal(key, (B, H)))
    s = jax.random.normal(key, (B, H, D, D))
    fn = lambda s, q, k, v, beta: ops.deltanet_step(s, q, k, v, beta, normalize_qk=True)
    return fn, (s, q, k, v, beta)

  def selective_scan(p, key):
    import jax
    import jax.numpy as jnp
    from linear_attention import ops
    x = dt = jax.random.normal(key, (B, CHANNELS))
    a = -jnp.broadcast_to(jnp.arange(1, STATE_N + 1, dtype=jnp.float32), (CHANNELS, STATE_N))
    bm = cm = jax.random.normal(key, (B, STATE_N))
    s = jax.random.normal(key, (B, CHANNELS, STATE_N))
    return ops.selective_scan_step, (s, x, dt, a, bm, cm)

  def rg_lru(p, key):
    import jax
    from linear_attention import ops
    x = jax.random.normal(key, (B, CHANNELS))
    lam = jax.random.uniform(key, (CHANNELS,), minval=2.0, maxval=6.0)
    s = jax.random.normal(key, (B, CHANNELS))
    return (lambda s, x, lam: ops.rg_lru_step(s, x, x, x, lam)), (s, x, lam)

  def sliding(p, key):
    import jax
    import jax.numpy as jnp
    from linear_attention import ops
    q, k, v = (x[:, 0] for x in _qkv(key, 1))
    kc, vc = _qkv(key, WINDOW)[:2]
    cache = ops.SlidingWindowCache(kc, vc, jnp.asarray(p, jnp.int32))
    return (lambda c, q, k, v: ops.sliding_window_step(c, q, k, v, window=WINDOW)), (cache, q, k, v)

  def softmax_kv(p, key):
    import jax
    kq, kk, kv = _rand(key, 3)
    q = jax.random.normal(kq, (B, 1, H, D))
    kc, vc = (jax.random.normal(x, (B, p + 1, H, D)) for x in (kk, kv))
    fn = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, implementation="xla")
    return fn, (q, kc, vc)

  return {"linear_step": linear, "decay_scalar_step": decay("scalar"),
          "decay_vector_step": decay("vector"), "gla_step": gla, "ssd_step": ssd,
          "deltanet_step": deltanet, "selective_scan_step": selective_scan,
          "rg_lru_step": rg_lru, "sliding_window_step": sliding, "softmax_kv_cache": softmax_kv}


DECODE = _decode_cases()


def decode_worker(ops_: list[str], positions: list[int], cap_s: float,
                  mem_limit_gb: float) -> None:
  """Times each op's decoding step at each position; prints one ``RESULT`` line per pair."""
  import jax
  for op, p in ((o, q) for o in ops_ for q in positions):
    fn, args = DECODE[op](p, jax.random.PRNGKey(0))
    nbytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(args))
    res = {"op": op, "position": p, "input_state_mib": nbytes / 2**20}
    if nbytes / GB > mem_limit_gb:
      res["skipped"] = f"state/cache {nbytes / GB:.1f} GB > {mem_limit_gb} GB"
    else:
      f = jax.jit(fn)
      jax.block_until_ready(f(*args))
      times = _timed(f, args, cap_s, repeats=50)
      times.sort()
      res.update(median_s=times[len(times) // 2], min_s=times[0], repeats=len(times))
    print("RESULT " + json.dumps(res), flush=True)
    del args


def _subprocess(cmd: list[str], timeout_s: float) -> tuple[list[dict], str | None]:
  """Runs a worker; returns its RESULT records and an error string (or None)."""
  try:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
  except subprocess.TimeoutExpired as e:
    stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
    recs = [json.loads(l[7:]) for l in stdout.splitlines() if l.startswith("RESULT ")]
    return recs, f"over {timeout_s:.0f}s"
  recs = [json.loads(l[7:]) for l in out.stdout.splitlines() if l.startswith("RESULT ")]
  err = None
  if out.returncode != 0:
    tail = (out.stderr.strip().splitlines() or ["?"])[-1]
    err = f"exit {out.returncode}: {tail[:200]}"
  return recs, err


def run_case(case: str, mode: str, seqs: list[int], cap_s: float, mem_limit_gb: float,
             max_quadratic_t: int, log=print) -> list[dict]:
  """All lengths of one case and mode, ascending, stopping where the cap would be passed."""
  quadratic = CASES[case][1]
  out, stop = [], None
  for t in seqs:
    if stop is None and quadratic and t > max_quadratic_t:
      stop = f"T > --max-quadratic-t {max_quadratic_t}"
    if stop:
      out.append({"case": case, "T": t, "mode": mode, "skipped": stop})
      continue
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", case, str(t), mode,
           str(cap_s), str(mem_limit_gb)]
    recs, err = _subprocess(cmd, timeout_s=3 * cap_s + 180)
    r = recs[0] if recs else {"case": case, "T": t, "mode": mode, "skipped": err or "no result"}
    out.append(r)
    log(_row(r))
    if "skipped" in r:
      stop = "after: " + r["skipped"]
      continue
    # Predict the next length's time from the local slope (at least 1, 2 if quadratic).
    done = [x for x in out if "time_s" in x]
    slope = 2.0 if quadratic else 1.0
    if len(done) >= 2:
      local = su.loglog_slope([x["T"] for x in done[-2:]], [x["time_s"] for x in done[-2:]])
      slope = max(slope, local or slope)
    nxt = [s for s in seqs if s > t]
    if nxt:
      pred = r["time_s"] * (nxt[0] / t) ** slope
      if pred > cap_s:
        stop = f"predicted {pred:.0f}s > cap {cap_s:.0f}s"
  return out


def _row(r: dict) -> str:
  if "skipped" in r:
    return f"{r['case']:20s} {r['mode']:6s} {r['T']:8d}  skipped: {r['skipped']}"
  return (f"{r['case']:20s} {r['mode']:6s} {r['T']:8d} {1e3 * r['time_s']:10.1f} ms "
          f"{1e6 * r['time_s'] / r['T']:8.2f} us/tok  peak {r['peak_rss_gb']:6.2f} GB  "
          f"delta {r['rss_delta_gb']:6.2f} GB  xla {r['xla_gb'] or float('nan'):6.2f} GB")


def fit_slopes(results: list[dict], fit_min_t: int) -> list[dict]:
  """Log-log slopes of time, XLA memory and RSS growth against ``T`` per case and mode.

  Fitted over the measured points with ``T >= fit_min_t`` (all points if fewer
  than two qualify).
  """
  out = []
  for case in CASES:
    for mode in MODES:
      pts = [r for r in results if r["case"] == case and r["mode"] == mode and "time_s" in r]
      use = [r for r in pts if r["T"] >= fit_min_t]
      use = use if len(use) >= 2 else pts
      ts = [r["T"] for r in use]
      out.append({"case": case, "mode": mode, "n_points": len(use),
                  "T_range": [min(ts), max(ts)] if ts else None,
                  "time_slope": su.loglog_slope(ts, [r["time_s"] for r in use]),
                  "xla_mem_slope": su.loglog_slope(ts, [r.get("xla_gb") for r in use]),
                  "rss_delta_slope": su.loglog_slope(ts, [r["rss_delta_gb"] for r in use]),
                  "max_T": max((r["T"] for r in pts), default=None)})
  return out


def slope_table(slopes: list[dict]) -> str:
  fmt = lambda x: f"{x:6.2f}" if x is not None else "     -"
  lines = [f"{'case':20s} {'mode':6s} {'T range':>17s} {'time':>6s} {'xla mem':>7s} "
           f"{'rss':>6s}  (log-log slopes)"]
  for s in slopes:
    rng = f"{s['T_range'][0]}-{s['T_range'][1]}" if s["T_range"] else "-"
    lines.append(f"{s['case']:20s} {s['mode']:6s} {rng:>17s} {fmt(s['time_slope'])} "
                 f"{fmt(s['xla_mem_slope']):>7s} {fmt(s['rss_delta_slope'])}")
  return "\n".join(lines)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--cases", default=",".join(CASES))
  p.add_argument("--modes", default=",".join(MODES))
  p.add_argument("--seqs", default="1024,2048,4096,8192,16384,32768,65536,262144,1048576")
  p.add_argument("--max-quadratic-t", type=int, default=65536,
                 help="longest T for the quadratic (softmax) cases")
  p.add_argument("--cap", type=float, default=60.0, help="seconds per case and length")
  p.add_argument("--mem-limit-gb", type=float, default=6.0)
  p.add_argument("--fit-min-t", type=int, default=4096)
  p.add_argument("--decode-ops", default=",".join(DECODE))
  p.add_argument("--positions", default="1024,4096,16384,65536,262144,1048576")
  p.add_argument("--shared-machine", action="store_true",
                 help="record that other jobs shared the CPU during the run")
  p.add_argument("--out", default=None,
                 help="results folder (default: runs/results/studies/cost; runs/smoke/studies/cost "
                      "with --smoke; the committed one only when named: --out results/studies/cost)")
  p.add_argument("--smoke", action="store_true", help="tiny sizes, for CI (under a minute)")
  p.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
  p.add_argument("--decode-worker", nargs=4, help=argparse.SUPPRESS)
  a = p.parse_args(argv)
  a.out = a.out or su.default_out("cost", a.smoke)
  if a.worker:
    c, t, mode, cap, mem = a.worker
    return worker(c, int(t), mode, float(cap), float(mem))
  if a.decode_worker:
    ops_, pos, cap, mem = a.decode_worker
    return decode_worker(ops_.split(","), [int(x) for x in pos.split(",")], float(cap),
                         float(mem))
  if a.smoke:
    a.cases, a.seqs, a.cap, a.fit_min_t = "linear_chunk,naive_softmax", "256,512", 5.0, 0
    a.decode_ops, a.positions = "linear_step,softmax_kv_cache", "256,1024"
  cases, modes = a.cases.split(","), a.modes.split(",")
  for name, given, valid in (("--cases", cases, CASES), ("--modes", modes, MODES),
                             ("--decode-ops", a.decode_ops.split(","), DECODE)):
    bad = [x for x in given if x and x not in valid]
    if bad:
      raise SystemExit(f"unknown {name} {bad}; valid: {list(valid)}")
  seqs = sorted(int(s) for s in a.seqs.split(","))
  positions = sorted(int(s) for s in a.positions.split(","))
  t0 = time.perf_counter()
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from bench.measure import matmul_gflops  # the machine's own matmul rate, for context
  mm = matmul_gflops(512 if a.smoke else 2048)
  print(f"float32 matmul: {mm:.1f} GFLOP/s")
  results = []
  for c in cases:
    for mode in modes:
      results += run_case(c, mode, seqs, a.cap, a.mem_limit_gb, a.max_quadratic_t)
  # Decoding needs no RSS isolation: one subprocess per op (all ops in one for --smoke).
  decode = []
  decode_ops = list(filter(None, a.decode_ops.split(",")))
  for group in ([decode_ops] if a.smoke else [[op] for op in decode_ops]):
    cmd = [sys.executable, os.path.abspath(__file__), "--decode-worker", ",".join(group),
           ",".join(map(str, positions)), str(a.cap), str(a.mem_limit_gb)]
    recs, err = _subprocess(cmd, timeout_s=len(group) * len(positions) * (2 * a.cap + 60) + 60)
    done = {(r["op"], r["position"]) for r in recs}
    recs += [{"op": op, "position": q, "skipped": err or "no result"}
             for op in group for q in positions if (op, q) not in done]
    decode += recs
    for r in recs:
      print(f"decode {r['op']:20s} {r['position']:8d} " + (
          f"skipped: {r['skipped']}" if "skipped" in r else
          f"{1e6 * r['median_s']:10.1f} us  state {r['input_state_mib']:9.2f} MiB"), flush=True)
  slopes = fit_slopes(results, a.fit_min_t)
  decode_slopes = {}
  for op in sorted({r["op"] for r in decode}):
    pts = [r for r in decode if r["op"] == op and "median_s" in r]
    use = [r for r in pts if r["position"] >= a.fit_min_t] or pts
    decode_slopes[op] = su.loglog_slope([r["position"] for r in use],
                                        [r["median_s"] for r in use])
  print("\n" + slope_table([x for x in slopes if x["case"] in cases and x["mode"] in modes]))
  print("\ndecode latency slope vs position: " + ", ".join(
      f"{k} {v:.2f}" if v is not None else f"{k} -" for k, v in decode_slopes.items()))
  config = {"B": B, "H": H, "D": D, "channels": CHANNELS, "state_n": STATE_N, "chunk": CHUNK,
            "window": WINDOW, "dtype": "float32", "cases": cases, "modes": modes, "seqs": seqs,
            "positions": positions, "cap_s": a.cap, "mem_limit_gb": a.mem_limit_gb,
            "max_quadratic_t": a.max_quadratic_t, "fit_min_t": a.fit_min_t, "smoke": a.smoke,
            "fwdbwd": "gradient of sum(o) with respect to every input",
            "time": "min over up to 3 runs (2 at T >= 256k; fewer if the cap is hit) after "
                    "compilation",
            "decode_time": "median over up to 50 steps after one warm-up"}
  out = {"study": "cost", "config": config,
         "environment": su.environment(shared_machine=a.shared_machine),
         "matmul_gflops": mm, "elapsed_s": time.perf_counter() - t0, "results": results,
         "slopes": slopes, "decode": decode, "decode_slopes": decode_slopes}
  path = os.path.join(a.out, "cost.json")
  su.write_json(path, out)
  su.write_csv(os.path.join(a.out, "cost.csv"), results,
               ["case", "mode", "T", "time_s", "peak_rss_gb", "rss_delta_gb", "xla_gb",
                "compile_s", "skipped"])
  print(f"wrote {path} ({time.perf_counter() - t0:.0f}s)")


if __name__ == "__main__":
  main()
