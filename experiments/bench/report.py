"""The benchmark's table and result files: one file per run, merged for reading.

A result file (``<out>/bench_ops*.json``) holds the run's machine (``backend``, ``device``,
``jax``), its float32 ``matmul_gflops``, ``step_s`` (decode step latency by position), the
sizes (``B, H, D, CH, N, S4D_N, chunk``, ``sizes``), the run's settings and ``results``: one
record per (case, T) as :func:`.measure.measure` returns it. It reports numbers; it does not
judge them.
"""

from __future__ import annotations

import dataclasses
import json
import os

from linear_attention.io import write_json

from .cases import Dims

SPARSE_SIZES = ("window", "globals", "bb_block", "bb_window", "bb_random", "bb_global",
                "linformer_k")


def fmt(x, scale=1.0, width=9, prec=2) -> str:
  """``x * scale`` right-aligned in ``width`` with ``prec`` decimals; ``-`` for None."""
  return f"{'-' if x is None else format(scale * x, f'.{prec}f'):>{width}s}"


def table(results: list[dict]) -> str:
  """One line per (case, T): times, per-token times, GFLOP/s, % of matmul, memory."""
  rows = [f"{'case':24s} {'T':>6s} {'fwd ms':>9s} {'cpu ms':>9s} {'f+b ms':>9s} {'cpu ms':>9s} "
          f"{'us/tok f':>8s} {'us/tok fb':>9s} {'fwd GF/s':>8s} {'%mm':>4s} {'fb GF/s':>7s} "
          f"{'peak GB':>7s} {'op GB':>6s} {'plan GB':>7s}"]
  for r in results:
    if "skipped" in r:
      rows.append(f"{r['case']:24s} {r['T']:6d}  skipped: {r['skipped']}")
      continue
    g = r.get
    plan = g("fwdbwd_plan_gb", g("fwd_plan_gb"))
    rows.append(
        f"{r['case']:24s} {r['T']:6d} {fmt(g('fwd_s'), 1e3)} {fmt(g('fwd_cpu_s'), 1e3)} "
        f"{fmt(g('fwdbwd_s'), 1e3)} {fmt(g('fwdbwd_cpu_s'), 1e3)} "
        f"{fmt(g('fwd_us_per_token'), width=8)} {fmt(g('fwdbwd_us_per_token'))} "
        f"{fmt(g('fwd_gflops'), width=8, prec=1)} {fmt(g('pct_matmul'), width=4, prec=0)} "
        f"{fmt(g('fwdbwd_gflops'), width=7, prec=1)} "
        f"{fmt(g('peak_device_gb', g('peak_rss_gb')), width=7)} "
        f"{fmt(g('op_rss_gb'), width=6)} {fmt(plan, width=7)}")
    if "fwdbwd_skipped" in r:
      rows[-1] += f"  (fwd+bwd skipped: {r['fwdbwd_skipped']})"
  return "\n".join(rows)


def file_name(group: str, custom_cases: bool, tag: str | None, smoke: bool) -> str:
  """``bench_ops[_<group>|_custom|_<tag>][_smoke].json``: a partial run never overwrites the
  full run's ``bench_ops.json``."""
  name = ("bench_ops_custom.json" if custom_cases else
          "bench_ops.json" if group == "all" else f"bench_ops_{group}.json")
  if tag:
    name = f"bench_ops_{tag}.json"
  return name.replace(".json", "_smoke.json") if smoke else name


def write(path: str, results: list[dict], dims: Dims, *, matmul_gflops: float,
          step_s: dict, **settings) -> str:
  """Writes a result file (see the module docstring).

  Args:
    path: the file.
    results: the (case, T) records.
    dims: the sizes the cases ran at.
    matmul_gflops: the machine's float32 matmul rate in the same run.
    step_s: decode step seconds by position (``{"1024": ...}``), or empty.
    **settings: the run's settings (group, budget, flags, elapsed time), stored as given.

  Returns:
    ``path``.
  """
  import jax
  sizes = dataclasses.asdict(dims)
  return write_json(path, {
      "backend": jax.default_backend(), "device": str(jax.devices()[0]), "jax": jax.__version__,
      "matmul_gflops": matmul_gflops, "step_s": step_s,
      "B": dims.B, "H": dims.H, "D": dims.D, "CH": dims.C, "N": dims.N, "S4D_N": dims.M,
      "chunk": dims.chunk, "sizes": {k: sizes[k] for k in SPARSE_SIZES},
      **settings, "results": results})


def merge(paths: list[str]) -> tuple[list[dict], dict, list[float | None]]:
  """The records of several result files, later files winning per (case, T).

  Returns:
    ``(results, step_s, matmul_gflops)``: the merged records (each with its file's
    ``matmul_gflops``), the merged step latencies, and each file's matmul rate.
  """
  merged, steps, mm = {}, {}, []
  for p in paths:
    if not os.path.isfile(p):
      raise ValueError(f"--report file {p!r} not found.")
    with open(p) as f:
      d = json.load(f)
    mm.append(d.get("matmul_gflops"))
    steps.update(d.get("step_s") or {})
    for r in d["results"]:
      r.setdefault("matmul_gflops", d.get("matmul_gflops"))
      merged[(r["case"], r["T"])] = r
  return list(merged.values()), steps, mm


def print_report(paths: list[str]) -> list[dict]:
  """Prints the merged table of result files (and their step latencies); returns the records."""
  results, steps, mm = merge(paths)
  print("matmul GFLOP/s of the files: " + ", ".join(f"{m:.1f}" for m in mm if m))
  print(table(results))
  for pos, secs in steps.items():
    print(f"linear attention step at position {pos}: {1e6 * secs:.1f} us")
  return results
