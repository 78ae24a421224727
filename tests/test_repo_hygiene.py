"""The repository stays clean: no script writes a committed file unless asked (the rule of
``experiments/outputs.py``), and no tracked file names a machine's folders.

The scripts run in a copy of the working tree that is its own git repository, all of them
in one Python process (``runpy``, so JAX is imported once): a real smoke run where one is
cheap, ``--help`` (which still imports the script and builds its parser) where a run
trains models or compiles every kernel, each such script listed in ``HELP_ONLY`` with the
reason; every script of ``experiments/`` must be in one of the two lists.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

from tests import helpers

# script -> (arguments, accepted exit codes)
SMOKE = {
    "experiments/bench/bench_decode.py": (["--smoke", "--reps", "1"], {0}),
    "experiments/bench/bench_delta_inverse.py": (["--smoke"], {0}),
    "experiments/bench/bench_engine.py": (["--smoke", "--seq_lens", "256"], {0}),
    "experiments/bench/grouped_memory.py": (["--smoke"], {0}),
    "experiments/bench/bench_loglinear.py": (["--smoke", "--repeats", "1"], {0}),
    "experiments/bench/param_table.py": ([], {0}),
    # Without the compile plugins it stops at once (2); with them it compiles no case.
    "experiments/checks/compile_report.py": (["--targets", "h200", "--cases", "no-such-case"],
                                             {0, 2}),
    "experiments/studies/claims.py": ([], {0}),
    "experiments/studies/study_approximation.py": (["--smoke"], {0}),
    "experiments/studies/run_studies.py": (["--dry-run", "--only", "cost"], {0}),
    "experiments/demo.py": (["--seq", "64", "--heads", "2", "--dim", "16"], {0}),
}
HELP_ONLY = {
    **{f"experiments/studies/study_{s}.py": "trains or measures for minutes; its smoke mode "
       "runs in tests/test_notebooks.py, into runs/smoke"
       for s in ("cost", "extrapolation", "hybrid", "listops", "lm", "mqar",
                 "selective_copying", "synthetic")},
    "experiments/studies/study_frontier.py": "trains for about a minute at its smoke size; "
                                             "tests/test_study_frontier.py runs it",
    "experiments/probes/probe_mamba2_induction.py": "trains models (no smoke mode)",
    "experiments/probes/hybrid_diagnosis.py": "trains models (no smoke mode)",
    "experiments/probes/probe_numerics.py": "prints only; measures at T = 800 for minutes",
    "experiments/bench/bench_ops.py": "its smoke mode compiles every case (minutes); "
                                      "tests/test_bench.py traces the cases",
    "experiments/bench/bench_delta_forms.py": "times at 1k-16k tokens (no smoke mode)",
    "experiments/bench/bench_hub.py": "needs torch and transformers (the hf extra), which "
                                      "the main suite does not install",
    "experiments/bench/bench_scale.py": "trains on 4 fake devices (no smoke mode)",
    "experiments/bench/bench_scores.py": "times at 4k tokens (no smoke mode)",
    "experiments/bench/bench_train.py": "trains the studies' models (no smoke mode)",
    "experiments/bench/softmax_baseline.py": "times up to 4k tokens (no smoke mode)",
    "experiments/checks/gpu_check.py": "its CPU smoke mode interprets every kernel (minutes); "
                                       "tests/kernels covers them",
    "experiments/checks/gpu_check_flash.py": "the same, for flash attention",
}

DRIVER = r"""
import json, runpy, sys, time, traceback
codes = {}
for script, args in json.loads(sys.argv[1]):
  sys.argv = [script] + args
  start = time.perf_counter()
  try:
    runpy.run_path(script, run_name="__main__")
    code = 0
  except SystemExit as e:
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
  except Exception:
    traceback.print_exc()
    code = "raised"
  codes[script] = code
  print(f"{script}: exit {code} ({time.perf_counter() - start:.1f}s)", file=sys.stderr, flush=True)
print("CODES " + json.dumps(codes))
"""


def _scripts() -> set[str]:
  """Every runnable script under ``experiments/`` (one with a ``__main__`` guard)."""
  out = set()
  for folder, _, files in os.walk(os.path.join(helpers.ROOT, "experiments")):
    for f in files:
      path = os.path.join(folder, f)
      if f.endswith(".py") and 'if __name__ == "__main__"' in open(path).read():
        out.add(os.path.relpath(path, helpers.ROOT))
  return out


def _git(cwd, *args) -> str:
  return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                        check=True).stdout


def test_every_script_is_listed_once():
  assert not set(SMOKE) & set(HELP_ONLY)
  assert _scripts() == set(SMOKE) | set(HELP_ONLY), _scripts() ^ (set(SMOKE) | set(HELP_ONLY))


def test_no_script_writes_a_tracked_file(tmp_path):
  """The working tree copied into a fresh repository, every script run there: ``git status``
  shows nothing new or changed afterwards (outputs went under the ignored ``runs/``)."""
  copy = tmp_path / "repo"
  for rel in _git(helpers.ROOT, "ls-files", "--cached", "--others", "--exclude-standard",
                  "-z").split("\0"):
    src = os.path.join(helpers.ROOT, rel)
    if rel and os.path.isfile(src):
      os.makedirs(copy / os.path.dirname(rel), exist_ok=True)
      shutil.copy2(src, copy / rel)
  _git(copy, "init", "-q")
  _git(copy, "add", "-A")
  _git(copy, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "copy")
  runs = [(s, a) for s, (a, _) in SMOKE.items()] + [(s, ["--help"]) for s in HELP_ONLY]
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(copy))
  p = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(runs)], cwd=copy, env=env,
                     capture_output=True, text=True, timeout=1800)
  lines = [l for l in p.stdout.splitlines() if l.startswith("CODES ")]
  assert p.returncode == 0 and lines, (p.stdout + p.stderr)[-4000:]
  codes = json.loads(lines[-1][len("CODES "):])
  wrong = {s: c for s, c in codes.items()
           if c not in (SMOKE[s][1] if s in SMOKE else {0})}
  assert not wrong, (wrong, p.stderr[-4000:])
  status = _git(copy, "status", "--porcelain", "--untracked-files=all")
  assert status == "", f"scripts changed the repository:\n{status}"
  assert os.path.isdir(copy / "runs" / "results"), "no script wrote its default output"


# An absolute path into a machine's own folders: temporary, home and work directories.
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:tmp|root|work|home|Users|private|mnt|scratch)/"
                          r"|(?<![\w.~-])/var/(?:folders)/")  # grouped: this line no match


def test_no_tracked_file_holds_a_machine_path():
  offenders = []
  for rel in _git(helpers.ROOT, "ls-files", "-z").split("\0"):
    path = os.path.join(helpers.ROOT, rel)
    if not rel or not os.path.isfile(path):
      continue
    with open(path, "rb") as f:
      data = f.read()
    if b"\0" in data:
      continue  # binary
    for i, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
      if MACHINE_PATH.search(line):
        offenders.append(f"{rel}:{i}: {line.strip()[:120]}")
  assert not offenders, "machine paths in tracked files:\n" + "\n".join(offenders)


def test_compile_report_says_at_once_what_it_lacks(tmp_path):
  """Without jax >= 0.11 and the compile plugins: exit 2 in seconds, naming each, nothing
  written (it used to fail every case after minutes and overwrite the committed report)."""
  python = tmp_path / "python"
  python.write_text("#!/bin/sh\necho 0.10.2\necho\n")  # an interpreter with old jax, no plugins
  python.chmod(0o755)
  out = tmp_path / "report.json"
  p = subprocess.run([sys.executable, "experiments/checks/compile_report.py", "--python",
                      str(python), "--out", str(out)], cwd=helpers.ROOT, capture_output=True,
                     text=True, timeout=120)
  assert p.returncode == 2, p.stderr
  for need in ("jax >= 0.11 (found 0.10.2)", "jax-cuda13-plugin for the GPU targets",
               "libtpu for the TPU targets", "nothing was compiled or written"):
    assert need in p.stderr, p.stderr
  assert not out.exists()
