"""Measuring one case at one length: compile, time, memory; each (case, T) in a subprocess.

Each (case, T) runs in its own subprocess (``bench_ops.py --worker``), so its peak resident
memory (``ru_maxrss``) is its own. Functions are compiled ahead of time; below T=16k the best
of 3 calls after a warm-up call, from 16k on one call. ``*_cpu_s`` is the process CPU time
(``time.process_time``, all threads) of the same calls: on a shared machine wall time above
CPU time / threads means the process waited.

Skipping: a (case, T) whose estimated forward memory exceeds ``mem_limit_gb`` is not started;
fwd+bwd is not run when its estimate does, when XLA's compiled memory plan (arguments +
temporaries + outputs) does, or when the forward time suggests it would overrun the budget;
a subprocess is killed after ``3 * budget`` seconds. Each skip is recorded with its reason.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

from .cases import CASES, DIMS, SMOKE_DIMS, Dims

GB = 1 << 30
# The command line that hosts the worker (``--worker SPEC``).
ENTRY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench_ops.py")


def time_calls(fn, *args, repeats=3, warmup=True) -> tuple[float, float]:
  """Best wall and best process-CPU seconds of ``repeats`` calls, after a warm-up call."""
  import jax
  if warmup:
    jax.block_until_ready(fn(*args))
  wall = cpu = float("inf")
  for _ in range(repeats):
    t0, c0 = time.perf_counter(), time.process_time()
    jax.block_until_ready(fn(*args))
    wall = min(wall, time.perf_counter() - t0)
    cpu = min(cpu, time.process_time() - c0)
  return wall, cpu


def matmul_gflops(n: int = 2048) -> float:
  """The machine's own float32 ``n x n`` matmul rate, GFLOP/s."""
  import jax
  import jax.numpy as jnp
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
  f = jax.jit(lambda a: a @ a)
  return 2 * n**3 / time_calls(f, a, repeats=5)[0] / 1e9


def _rss_gb():
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB


def plan_gb(compiled) -> float | None:
  """XLA's memory plan of a compiled function (arguments + temporaries + outputs), GB."""
  try:
    m = compiled.memory_analysis()
    return (m.argument_size_in_bytes + m.temp_size_in_bytes + m.output_size_in_bytes
            - m.alias_size_in_bytes) / GB
  except Exception:  # not every backend/version reports it
    return None


def _device_peak_gb():
  import jax
  try:
    stats = jax.devices()[0].memory_stats() or {}
  except Exception:
    stats = {}
  peak = stats.get("peak_bytes_in_use")
  return None if peak is None else peak / GB


def grad_fn(fn, argnums):
  """The gradient of ``sum(fn(...))`` (in float32) in ``argnums``: the fwd+bwd timed."""
  import jax
  import jax.numpy as jnp
  return jax.grad(lambda *a: jnp.sum(fn(*a).astype(jnp.float32)), argnums=argnums)


def measure(name: str, t: int, budget_s: float, mem_limit_gb: float, bwd_skip: str | None,
            smoke: bool = False) -> dict:
  """Times case ``name`` at length ``t`` in this process; returns its result record.

  Args:
    name: a key of ``CASES``.
    t: the sequence length.
    budget_s: seconds; fwd+bwd is skipped when the forward time says it would take longer.
    mem_limit_gb: fwd or fwd+bwd is skipped when XLA's memory plan exceeds it.
    bwd_skip: a reason to skip fwd+bwd found before (a memory estimate), or None.
    smoke: ``SMOKE_DIMS`` and one timed call (compilation is most of a smoke run).

  Returns:
    ``case, T, group, backend``, the ``fwd_*`` and ``fwdbwd_*`` times (wall, CPU, per token,
    GFLOP/s, compile, XLA plan), ``peak_rss_gb``, ``op_rss_gb``, ``peak_device_gb`` (on
    GPU/TPU), or ``skipped`` / ``fwdbwd_skipped`` with the reason.
  """
  import jax
  case = CASES[name]
  dims = SMOKE_DIMS if smoke else DIMS
  res = {"case": name, "T": t, "group": case.group, "backend": jax.default_backend()}
  fn, args, argnums = case.build(t, dims, jax.random.PRNGKey(0))
  args = jax.block_until_ready(args)
  res["base_rss_gb"] = _rss_gb()  # inputs built, nothing compiled yet
  # Long runs: one timed call and no warm-up (compiled ahead of time, so the first call
  # compiles nothing); short ones: best of 3 after a warm-up.
  long_run = smoke or t >= 16384
  repeats, runs = (1, 1) if long_run else (3, 4)
  t0 = time.perf_counter()

  fwd = jax.jit(fn).lower(*args).compile()
  res["fwd_compile_s"] = time.perf_counter() - t0
  res["fwd_plan_gb"] = plan = plan_gb(fwd)
  if plan is not None and plan > mem_limit_gb:
    res["skipped"] = f"forward: XLA plans {plan:.3g} GB > {mem_limit_gb:g} GB"
    return res
  res["fwd_s"], res["fwd_cpu_s"] = time_calls(fwd, *args, repeats=repeats, warmup=not long_run)

  # fwd+bwd: skipped if an estimate, XLA's plan or the forward time says so.
  if bwd_skip:
    res["fwdbwd_skipped"] = bwd_skip
  elif 3 * res["fwd_s"] * runs + (time.perf_counter() - t0) >= budget_s:
    res["fwdbwd_skipped"] = (f"forward {res['fwd_s']:.1f}s suggests fwd+bwd over the "
                             f"{budget_s:g}s budget")
  else:
    t1 = time.perf_counter()
    bwd = jax.jit(grad_fn(fn, argnums)).lower(*args).compile()
    res["fwdbwd_compile_s"] = time.perf_counter() - t1
    res["fwdbwd_plan_gb"] = plan = plan_gb(bwd)
    if plan is not None and plan > mem_limit_gb:
      res["fwdbwd_skipped"] = f"XLA plans {plan:.3g} GB > {mem_limit_gb:g} GB"
    else:
      res["fwdbwd_s"], res["fwdbwd_cpu_s"] = time_calls(bwd, *args, repeats=repeats,
                                                        warmup=not long_run)

  f = case.flops(t, dims) if case.flops else None
  for part in ("fwd", "fwdbwd"):
    if f"{part}_s" in res:
      res[f"{part}_us_per_token"] = 1e6 * res[f"{part}_s"] / t
      if f:
        res[f"{part}_gflops"] = (3 if part == "fwdbwd" else 1) * f / res[f"{part}_s"] / 1e9
  if f:
    res["fwd_flops"] = f
  res["peak_rss_gb"] = _rss_gb()
  res["op_rss_gb"] = res["peak_rss_gb"] - res["base_rss_gb"]
  dev = _device_peak_gb()
  if dev is not None:
    res["peak_device_gb"] = dev
  return res


def plans(cases: list[str], seqs: list[int] | None, mem_limit_gb: float) -> list[dict]:
  """XLA's memory plans (GB) of fwd and fwd+bwd per (case, T), compiled only.

  Inputs are abstract (``jax.eval_shape``), so nothing of size T is allocated: a cheap way
  to see which lengths ``mem_limit_gb`` will skip.

  Returns:
    ``{"case", "T", "fwd_plan_gb", "fwdbwd_plan_gb", "over"}`` or ``{"case", "T", "failed"}``
    per (case, T), printed as they come.
  """
  import jax
  from .report import fmt
  print(f"{'case':24s} {'T':>6s} {'fwd GB':>8s} {'f+b GB':>8s}  "
        f"(XLA plans; limit {mem_limit_gb:g} GB)")
  out = []
  for name in cases:
    case = CASES[name]
    for t in seqs or case.seqs:
      box = {}

      def inputs(case=case, t=t, box=box):
        box["fn"], args, box["argnums"] = case.build(t, DIMS, jax.random.PRNGKey(0))
        return args

      try:
        args = jax.eval_shape(inputs)
        f = plan_gb(jax.jit(box["fn"]).lower(*args).compile())
        fb = plan_gb(jax.jit(grad_fn(box["fn"], box["argnums"])).lower(*args).compile())
        over = [p for p, x in (("fwd", f), ("fwd+bwd", fb)) if x is not None and x > mem_limit_gb]
        out.append({"case": name, "T": t, "fwd_plan_gb": f, "fwdbwd_plan_gb": fb, "over": over})
        print(f"{name:24s} {t:6d} {fmt(f, width=8)} {fmt(fb, width=8)}"
              + (f"  would skip {' and '.join(over)}" if over else ""), flush=True)
      except Exception as e:
        msg = (str(e).strip().splitlines() or [""])[-1][:150]
        out.append({"case": name, "T": t, "failed": f"{type(e).__name__}: {msg}"})
        print(f"{name:24s} {t:6d}  failed: {type(e).__name__}: {msg}", flush=True)
  return out


def worker(spec: str) -> None:
  """Measures the cases of ``spec`` (JSON) at one length; prints one ``RESULT`` line each."""
  import linear_attention  # noqa: F401  first: its XLA flags need a backend not yet started
  spec = json.loads(spec)
  for name in spec["cases"]:
    try:
      res = measure(name, spec["T"], spec["budget"], spec["mem_limit_gb"], spec.get("bwd_skip"),
                    spec.get("smoke", False))
    except Exception as e:  # one broken case must not hide the others
      msg = (str(e).strip().splitlines() or [""])[-1][:200]
      res = {"case": name, "T": spec["T"], "group": CASES[name].group,
             "skipped": f"failed: {type(e).__name__}: {msg}"}
    print("RESULT " + json.dumps(res), flush=True)


def step_latency(position: int, dims: Dims = DIMS) -> float:
  """Seconds per decoding step of ELU linear attention after ``position`` tokens."""
  import jax
  from linear_attention import ops
  q, k, v = (jax.random.normal(key, (dims.B, position, dims.H, dims.D))
             for key in jax.random.split(jax.random.PRNGKey(0), 3))
  _, state = jax.jit(lambda q, k, v: ops.linear_attention(q, k, v, return_state=True))(q, k, v)
  step = jax.jit(ops.linear_attention_step)
  return time_calls(step, state, q[:, -1], k[:, -1], v[:, -1], repeats=50)[0]


def run_worker(spec: dict, timeout: float, env=None) -> list[dict]:
  """Runs ``spec`` in a worker subprocess; a case that did not report is recorded as skipped."""
  cmd = [sys.executable, ENTRY, "--worker", json.dumps(spec)]

  def results(stdout, why_missing):
    done = [json.loads(ln[7:]) for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    got = {r["case"] for r in done}
    return done + [{"case": c, "T": spec["T"], "group": CASES[c].group, "skipped": why_missing}
                   for c in spec["cases"] if c not in got]

  try:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
  except subprocess.TimeoutExpired as e:
    stdout = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout or ""
    return results(stdout, f"over {timeout:g}s (killed)")
  err = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1][:200]
  return results(out.stdout, f"failed (exit {out.returncode}): {err}")


def run_one(case: str, t: int, budget_s: float, mem_limit_gb: float) -> dict:
  """Runs one (case, T) in a subprocess; returns its result or why it was skipped."""
  c = CASES[case]
  est = c.fwd_mem(t, DIMS) / GB
  if est > mem_limit_gb:
    return {"case": case, "T": t, "group": c.group,
            "skipped": f"forward needs ~{est:.3g} GB > {mem_limit_gb:g} GB (estimate)"}
  est = c.fwdbwd_mem(t, DIMS) / GB
  bwd_skip = f"needs ~{est:.3g} GB > {mem_limit_gb:g} GB (estimate)" if est > mem_limit_gb else None
  spec = {"cases": [case], "T": t, "budget": budget_s, "mem_limit_gb": mem_limit_gb,
          "bwd_skip": bwd_skip}
  return run_worker(spec, budget_s * 3)[0]
