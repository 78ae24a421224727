"""Compile report: every Pallas kernel compiled for GPU and TPU targets without a device.

For each target (H200, A100, TPU v5e, v6e by default) and each case of
``tests.kernels.aot`` (chunk decay, flash attention, linear scan;
forward and backward; bf16 and f32; every mode; the gpu_check shapes and a
small odd one) prints one table: kernel, case, compiles or the error, and on
GPU the shared memory, registers and spilled bytes of each Pallas kernel of
the case (fwd/states/bwd, fwd/dq/dkv). Writes the same as JSON::

    python experiments/checks/compile_report.py [--targets h200,a100,v5e,v6e]
        [--cases chunk_decay] [--python .venv312-compile/bin/python]
        [--out results/compile_report.json] [--merge]

Needs jax >= 0.11 with jax-cuda13-plugin (GPU targets; ptxas on PATH) and
libtpu (TPU targets); ``--python`` names an interpreter that has them when
this one does not (e.g. the compile venv of ``.ci/run``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # the package and experiments/

from tests.kernels import aot  # noqa: E402
from experiments import outputs  # noqa: E402
from linear_attention.io import write_json  # noqa: E402


def _short(error: str | None) -> str:
  """The first line of a compiler error, trimmed for a table cell."""
  if not error:
    return ""
  line = error.strip().splitlines()[0]
  return line if len(line) <= 110 else line[:107] + "..."


def table(target: str, results: dict[str, dict]) -> str:
  """One text table for ``target``: a row per Pallas kernel of each case."""
  gpu = aot.platform_of(target) == "gpu"
  head = f"{'kernel':16s} {'case':34s} {'result':8s}"
  if gpu:
    head += f" {'pallas kernel':28s} {'smem B':>8s} {'regs':>5s} {'spill B':>8s}"
  lines = [f"== {target} ==", head, "-" * len(head)]
  for name, r in results.items():
    kernel, case = name.split("/", 1)
    status = "compiles" if r["ok"] else "ERROR"
    rows = sorted(r.get("kernels", {}).items()) if gpu else []
    if not rows or not r["ok"]:
      extra = "" if r["ok"] else "  " + _short(r["error"])
      lines.append(f"{kernel:16s} {case:34s} {status:8s}{extra}")
      continue
    for kname, s in rows:
      spill = s.get("spill_stores", 0) + s.get("spill_loads", 0)
      lines.append(f"{kernel:16s} {case:34s} {status:8s} {kname:28s} "
                   f"{s.get('shared_memory', '-'):>8} {s.get('registers', '-'):>5} {spill:>8}")
  ok = sum(r["ok"] for r in results.values())
  lines.append(f"{ok}/{len(results)} cases compile for {target}")
  return "\n".join(lines)


# What each kind of target needs beside jax >= 0.11: the import name of its compiler plugin.
PLUGINS = {"gpu": ("jax_cuda13_plugin", "jax-cuda13-plugin"), "tpu": ("libtpu", "libtpu")}


def missing(python: str, targets: list[str]) -> list[str]:
  """What ``python`` lacks to compile for ``targets`` (empty: nothing), asked in one call."""
  code = ("import importlib.util as u, jax; print(jax.__version__); "
          "print(' '.join(m for m in %r if u.find_spec(m)))"
          % [PLUGINS[k][0] for k in PLUGINS])
  p = subprocess.run([python, "-c", code], capture_output=True, text=True)
  if p.returncode:
    return [f"an interpreter with jax ({python} failed: {p.stderr.strip().splitlines()[-1:]})"]
  version, found = (p.stdout.splitlines() + ["", ""])[:2]
  out = []
  if tuple(int(x) for x in version.split(".")[:2]) < (0, 11):
    out.append(f"jax >= 0.11 (found {version})")
  for kind in sorted({aot.platform_of(t) for t in targets}):
    module, package = PLUGINS[kind]
    if module not in found.split():
      out.append(f"{package} for the {kind.upper()} targets")
  return out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--targets", default="h200,a100,v5e,v6e",
                 help="comma-separated subset of " + ",".join(aot.TARGETS))
  p.add_argument("--cases", default="",
                 help="only cases whose name contains each of these comma-separated strings")
  p.add_argument("--python", default=sys.executable,
                 help="interpreter with jax >= 0.11 and the plugin/libtpu")
  outputs.add_out(p, "compile_report.json")
  p.add_argument("--merge", action="store_true",
                 help="replace only these targets' cases in the existing --out, keep the rest")
  args = p.parse_args(argv)
  names = [n for n in aot.CASES if all(part in n for part in args.cases.split(","))]
  targets = args.targets.split(",")
  unknown = [t for t in targets if t not in aot.TARGETS]
  if unknown:
    p.error(f"--targets must be a subset of {','.join(aot.TARGETS)}, got {unknown}")
  lacking = missing(args.python, targets)
  if lacking:
    print(f"compile_report: {args.python} lacks {'; '.join(lacking)}. Install them "
          "(pip install 'jax>=0.11' jax-cuda13-plugin jax-cuda13-pjrt libtpu; Python 3.12), or "
          "name an interpreter that has them "
          "with --python; nothing was compiled or written.", file=sys.stderr)
    return 2
  env_jax = subprocess.run([args.python, "-c", "import jax; print(jax.__version__)"],
                           capture_output=True, text=True).stdout.strip()
  report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "jax": env_jax, "targets": {}}
  failed = 0
  t0 = time.perf_counter()
  # Every target's cases in one pool of children, one a core.
  every = aot.run_targets({t: names for t in targets}, timeout=3000,
                          python=args.python)
  for target, results in every.items():
    report["targets"][target] = {"seconds": time.perf_counter() - t0, "cases": results}
    failed += sum(not r["ok"] for r in results.values())
    print(table(target, results) + "\n", flush=True)
  print(f"({time.perf_counter() - t0:.0f}s for all targets)", flush=True)
  if args.merge and os.path.exists(args.out):
    with open(args.out) as f:
      old = json.load(f)
    for target, entry in report["targets"].items():
      cases = dict(old["targets"].get(target, {}).get("cases", {}), **entry["cases"])
      old["targets"][target] = dict(entry, cases=cases)  # seconds: this run's cases only
    old.setdefault("updates", []).append(
        {"date": report["date"], "jax": env_jax, "targets": args.targets, "cases": args.cases})
    report = old
  write_json(args.out, report)
  print(f"wrote {args.out}; {failed} case(s) failed")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
