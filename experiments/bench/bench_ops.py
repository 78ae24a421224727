"""Benchmark of the ops: time, throughput and peak memory against sequence length.

The cases, FLOP counts, measurement and report live in ``experiments/bench/``; this is the
command line. Every case reports its GFLOP/s and their ratio to the machine's float32 matmul
rate, measured in the same run (shared machines drift), and process CPU time beside wall
time for the same reason. Results go to ``<out>/bench_ops.json``
(``bench_ops_<group>.json`` for one group, ``bench_ops_custom.json`` with ``--cases``,
``bench_ops_<tag>.json`` with ``--tag``, ``*_smoke.json`` with ``--smoke``), and a table is
printed.

    python experiments/bench/bench_ops.py                       # every case, default lengths
    python experiments/bench/bench_ops.py --group gated         # foundation|gated|ssm|sparse|2025|all
    python experiments/bench/bench_ops.py --cases chunk,naive_softmax --seqs 1024,4096
    python experiments/bench/bench_ops.py --smoke --group all   # tiny, one subprocess, for CI
    python experiments/bench/bench_ops.py --plan --group ssm    # XLA memory plans only, runs nothing
    python experiments/bench/bench_ops.py --report results/bench_ops_gated.json results/bench_ops_ssm.json

Groups: ``foundation`` (the diagonal-decay engine, ELU linear attention, softmax baselines,
step latency), ``gated`` (GLA, RetNet, HGRN2, RWKV-6, Mamba-2/SSD, DeltaNet, Gated DeltaNet
in chunk, recurrent and parallel forms), ``ssm`` (the scan engine, Mamba's selective scan in
every form, RG-LRU, S4D), ``sparse`` (sliding window, Longformer, BigBird, Linformer, with
naive softmax as the baseline).

Default lengths per case (``--seqs`` overrides them all): linear-time forms 1k..64k;
recurrent forms of matrix-state variants and every parallel form 1k and 4k (the delta rule's
parallel form, cubic as written, 1k only); naive softmax up to 16k; token-by-token scans of
the elementwise state-space ops 1k..16k. Skipping and timing rules: ``bench/measure.py``.
``--smoke`` runs every case at T=256 in one subprocess compiled at XLA's lowest optimisation
level (compilation is most of its time); it exits non-zero if a case fails.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "experiments")]  # the package, bench/

from experiments import outputs  # noqa: E402
from bench import cases as cases_lib  # noqa: E402
from bench import measure  # noqa: E402
from bench import report  # noqa: E402


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--group", default="all", choices=list(cases_lib.GROUPS))
  p.add_argument("--cases", default=None, help="comma-separated case names (overrides --group)")
  p.add_argument("--seqs", default=None, help="comma-separated lengths for every case "
                 "(default: each case's own list)")
  p.add_argument("--budget", type=float, default=60.0, help="seconds per case and length")
  p.add_argument("--mem-limit-gb", type=float, default=16.0)
  outputs.add_out(p, "", what="output folder")
  p.add_argument("--tag", default=None,
                 help="write <out>/bench_ops_<tag>.json instead of the default name")
  p.add_argument("--smoke", action="store_true", help=f"T={cases_lib.SMOKE_T}, small sparse "
                 "sizes, all cases in one subprocess, for CI")
  p.add_argument("--list", action="store_true", help="print the cases and their lengths")
  p.add_argument("--plan", action="store_true",
                 help="print XLA's memory plan per case and length (compile only), run nothing")
  p.add_argument("--report", nargs="+", metavar="JSON",
                 help="print the table of result files (merged), run nothing")
  p.add_argument("--worker", help=argparse.SUPPRESS)
  a = p.parse_args(argv)
  if a.worker:
    measure.worker(a.worker)
    return 0
  if a.report:
    try:
      report.print_report(a.report)
    except ValueError as e:
      p.error(str(e))
    return 0
  names = a.cases.split(",") if a.cases else cases_lib.GROUPS[a.group]
  unknown = [c for c in names if c not in cases_lib.CASES]
  if unknown:
    p.error(f"unknown --cases {unknown}; valid: {list(cases_lib.CASES)}")
  seqs = None if a.seqs is None else [int(s) for s in a.seqs.split(",")]
  if a.list:
    for c in names:
      print(f"{c:24s} {cases_lib.CASES[c].group:10s} {seqs or list(cases_lib.CASES[c].seqs)}")
    return 0

  import linear_attention  # noqa: F401  (its XLA flags, before the backend starts)
  if a.plan:
    measure.plans(names, seqs, a.mem_limit_gb)
    return 0
  t_start = time.perf_counter()
  mm = measure.matmul_gflops(512 if a.smoke else 2048)
  print(f"float32 matmul: {mm:.1f} GFLOP/s", flush=True)

  def finish(r):
    r["matmul_gflops"] = mm
    if r.get("fwd_gflops"):
      r["pct_matmul"] = 100 * r["fwd_gflops"] / mm
    return r

  results, worker_flags = [], os.environ.get("XLA_FLAGS", "")
  if a.smoke:
    # One subprocess for every case, compiled at XLA's lowest optimisation level:
    # compilation is most of the time at this size (about half of it goes), and smoke
    # timings mean nothing anyway.
    if "xla_backend_optimization_level" not in worker_flags:
      worker_flags = (worker_flags + " --xla_backend_optimization_level=0").strip()
    spec = {"cases": names, "T": cases_lib.SMOKE_T, "budget": a.budget,
            "mem_limit_gb": a.mem_limit_gb, "smoke": True}
    env = dict(os.environ, XLA_FLAGS=worker_flags)
    results = [finish(r) for r in measure.run_worker(spec, max(600.0, a.budget * 3), env)]
    print(report.table(results), flush=True)
  else:
    for c in names:
      for t in seqs or cases_lib.CASES[c].seqs:
        results.append(finish(measure.run_one(c, t, a.budget, a.mem_limit_gb)))
        print(report.table(results[-1:]).splitlines()[-1], flush=True)
    print("\n" + report.table(results))

  steps = {}
  if a.group in ("foundation", "all") and not a.cases:
    steps = {str(pos): measure.step_latency(pos) for pos in ([128] if a.smoke else [1024, 65536])}
    for pos, secs in steps.items():
      print(f"linear attention step at position {pos}: {1e6 * secs:.1f} us")

  path = os.path.join(a.out, report.file_name(a.group, bool(a.cases), a.tag, a.smoke))
  report.write(path, results, cases_lib.SMOKE_DIMS if a.smoke else cases_lib.DIMS,
               matmul_gflops=mm, step_s=steps, group=a.group, smoke=a.smoke,
               worker_xla_flags=worker_flags, budget_s=a.budget, mem_limit_gb=a.mem_limit_gb,
               elapsed_s=time.perf_counter() - t_start)
  print(f"wrote {path} after {time.perf_counter() - t_start:.0f}s")
  failed = [r for r in results if str(r.get("skipped", "")).startswith("failed")]
  if a.smoke and failed:
    print(f"smoke: {len(failed)} case(s) failed: {[r['case'] for r in failed]}")
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
