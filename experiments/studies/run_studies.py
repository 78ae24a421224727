"""Reruns every study at full size, then re-executes every notebook.

One command for the whole of ``results/studies/`` and ``notebooks/``. By default it writes
under ``runs/`` (ignored by git, the rule of ``experiments/outputs.py``): the studies into
``runs/results/studies``, and ``--notebooks-only`` (which reads the committed results) the
claims and the executed notebooks into ``runs/results/``. The committed results and
notebooks are replaced only when asked, with ``--results results/studies``:

1. each study's command (the table below; the same as in
   ``results/studies/README.md``), one after another, each writing
   ``<results>/<study>/``. The training studies (mqar, synthetic, lm,
   listops, extrapolation, hybrid, selective_copying) reuse the finished runs
   under ``runs/studies/<study>/``, so an interrupted rerun resumes where it
   stopped; cost and approximation are measured afresh. A study that fails (or has a failed run) is reported and
   the others still run;
2. the claims table (``experiments/studies/claims.py``): printed and written to
   ``<results>/claims.json``;
3. every notebook under ``notebooks/`` executed top to bottom (nbclient,
   ``LA_RESULTS_DIR=<results>``) and saved with its outputs into
   ``<results>/notebooks/``; in place (``notebooks/``) only with
   ``--results results/studies``, so the committed ones keep the committed results'
   outputs.

Each study's output goes to ``runs/studies/logs/<study>.log``. Stopping this command (``kill``,
Ctrl-C) stops the running study, whose trainers save checkpoints first; it then exits 3, and
the same command again resumes.

    python experiments/studies/run_studies.py                          # everything, into runs/results
    python experiments/studies/run_studies.py --results results/studies  # everything, committed
    python experiments/studies/run_studies.py --only mqar,synthetic    # two studies, then the notebooks
    python experiments/studies/run_studies.py --notebooks-only         # the notebooks, into runs/results
    python experiments/studies/run_studies.py --notebooks-only --results results/studies  # in place
    python experiments/studies/run_studies.py --dry-run                # print the commands
    python experiments/studies/run_studies.py --collect --only mqar    # what has finished so far
    python experiments/studies/run_studies.py --smoke                  # tiny, into runs/smoke/studies
    python experiments/studies/run_studies.py --smoke --results ../la-smoke  # tiny, outside the repo

The full sizes take hours on 2 CPU cores: MQAR's 48-point grid at its first
learning rate alone took about 12 process-hours here (one XLA thread per run,
runs sharing the cores with other work), and its decay-init sweep (``FULL``:
the "slow" init for Mamba, Mamba-2 and Hawk at every setting and width) adds 12
points of 15-60 process-minutes each (Mamba is the slowest); the other training
studies about 90 minutes each at most (extrapolation: 7 runs of 400 steps, then 8
forward passes of 16k bytes per model; hybrid: 3 MQAR runs of up to 500 steps at 4 layers
and 3 LM runs; selective_copying: 2 runs of up to 2000 steps, 17 and 12 process-minutes measured),
cost about 25 minutes, approximation about 10. The committed MQAR results hold the init sweep's points that fitted
(see ``results/studies/README.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time

from linear_attention.train import lifeline  # no JAX: --help stays fast

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_RESULTS = os.path.join(REPO_ROOT, "results", "studies")  # the committed results
RUNS_RESULTS = os.path.join(REPO_ROOT, "runs", "results")  # the default output (gitignored)
NOTEBOOKS = os.path.join(REPO_ROOT, "notebooks")
RUNS = os.path.join(REPO_ROOT, "runs", "studies")  # the training studies' runs (their --runs)
LOGS = os.path.join(RUNS, "logs")

# study -> its full-size command (arguments after the interpreter); each also takes --out and,
# with --smoke, --smoke. Keep in step with results/studies/README.md.
STUDIES = {
    "cost": ("experiments/studies/study_cost.py", "--cap", "20", "--seqs",
             "1024,2048,4096,8192,16384,32768,65536,262144,1048576", "--positions",
             "1024,4096,16384,65536,262144,1048576", "--mem-limit-gb", "6", "--shared-machine"),
    "approximation": ("experiments/studies/study_approximation.py",),
    "mqar": ("experiments/studies/study_mqar.py",),
    "synthetic": ("experiments/studies/study_synthetic.py",),
    "lm": ("experiments/studies/study_lm.py",),
    "listops": ("experiments/studies/study_listops.py",),
    "extrapolation": ("experiments/studies/study_extrapolation.py",),
    "hybrid": ("experiments/studies/study_hybrid.py",),
    "selective_copying": ("experiments/studies/study_selective_copying.py",),
}
# The index last: it shows the claims of every study. selective_copying has no notebook of its
# own: synthetic.ipynb plots it and shows its claim.
NOTEBOOK_ORDER = ("cost", "approximation", "mqar", "synthetic", "lm", "listops", "extrapolation",
                  "hybrid", "index")




def collects(study: str) -> bool:
  """Whether the study's script honours ``--collect`` (passes it on to ``train_grid``); a
  script that only parses the shared flag would train instead."""
  with open(os.path.join(REPO_ROOT, STUDIES[study][0])) as f:
    return "collect_only=args.collect" in f.read()


def study_runs(study: str, smoke: bool) -> str:
  """Where ``study`` keeps its training runs: its default ``--runs``
  (``_study_utils.runs_dir``), ``runs/studies/<study>[-smoke]``."""
  return os.path.join(RUNS, study + ("-smoke" if smoke else ""))


def _rel(path: str) -> str:
  return os.path.relpath(path, REPO_ROOT)


def finished_runs(root: str) -> int:
  """The training runs under ``root`` that finished (``sweep_status.json`` says ``done``), at
  any depth: synthetic and hybrid keep one sweep per task."""
  from linear_attention.sweep import STATUS_FILE
  n = 0
  for path, dirs, files in os.walk(root):
    if STATUS_FILE in files:
      dirs[:] = []  # a run's own folders (checkpoints, ...) hold no other run
      try:
        with open(os.path.join(path, STATUS_FILE)) as f:
          n += json.load(f).get("status") == "done"
      except (OSError, ValueError, AttributeError):  # unreadable: not a finished run
        pass
  return n


def study_command(study: str, results: str, smoke: bool, collect: bool = False) -> list[str]:
  """The command line that runs ``study`` into ``<results>/<study>``."""
  args = list(STUDIES[study])
  if smoke:  # the smoke size replaces the full size's own arguments
    args = [args[0], "--smoke"]
  if collect:
    args.append("--collect")
  return [sys.executable, *args, "--out", os.path.join(results, study)]


STOPPED: list[str] = []  # the stop signals received while a study ran


def run_study(study: str, results: str, smoke: bool, dry_run: bool,
              collect: bool = False) -> tuple[int, float]:
  """Runs one study; returns its exit status and wall time in seconds."""
  cmd = study_command(study, results, smoke, collect)
  print(f"[{study}] {' '.join(cmd[1:])}", flush=True)
  if dry_run:
    return 0, 0.0
  os.makedirs(LOGS, exist_ok=True)
  log_path = os.path.join(LOGS, f"{study}{'-smoke' if smoke else ''}.log")
  t0 = time.time()
  with open(log_path, "w") as log:
    # A session of its own: a stop (kill, or Ctrl-C in the terminal) reaches this process
    # only, which passes each one on; the study's sweep then has its trainers save
    # checkpoints, and this waits for it. Before, a kill of this process left the study
    # training, orphaned.
    # If this process is killed outright, the lifeline stops the study (its trainers save).
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, **lifeline.popen_kwargs())

    def forward(signum, frame):
      del frame
      STOPPED.append(signal.Signals(signum).name)
      proc.send_signal(signal.SIGTERM)

    old = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
      rc = proc.wait()
    finally:
      for sig, handler in old.items():
        signal.signal(sig, handler)
  dt = time.time() - t0
  print(f"[{study}] exit {rc} after {dt / 60:.1f} min (log: {_rel(log_path)})",
        flush=True)
  return rc, dt


def execute_notebook(name: str, results: str | None, out_dir: str,
                     timeout_s: int) -> str | None:
  """Executes ``notebooks/<name>.ipynb`` against ``results``; returns an error, or None.

  ``results`` None: the notebooks' own default, the committed ``../results/studies``.
  """
  import nbclient
  import nbformat
  path = os.path.join(NOTEBOOKS, f"{name}.ipynb")
  nb = nbformat.read(path, as_version=4)
  if results is None:  # the kernel inherits the environment
    os.environ.pop("LA_RESULTS_DIR", None)
  else:
    os.environ["LA_RESULTS_DIR"] = os.path.abspath(results)
  for cell in nb.cells:  # a failed run must not leave the last run's outputs below it
    if cell.cell_type == "code":
      cell.outputs, cell.execution_count = [], None
  client = nbclient.NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                                   resources={"metadata": {"path": NOTEBOOKS}})
  error = None
  try:
    client.execute()
  except Exception as e:  # noqa: BLE001 (any failing cell: report it, save what ran)
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip()  # no terminal colours
    error = f"{type(e).__name__}: {text.splitlines()[-1] if text else ''}"
  os.makedirs(out_dir, exist_ok=True)
  nbformat.write(nb, os.path.join(out_dir, f"{name}.ipynb"))
  return error


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter,
                              epilog="\n".join(__doc__.splitlines()[1:]))
  p.add_argument("--only", help=f"comma-separated studies (default: all of {', '.join(STUDIES)})")
  p.add_argument("--notebooks-only", action="store_true",
                 help="run no study: only the claims table and the notebooks")
  p.add_argument("--no-notebooks", action="store_true", help="run the studies only")
  p.add_argument("--results", default=None,
                 help="results folder (default: runs/results/studies, runs/smoke/studies with "
                      "--smoke; --notebooks-only reads results/studies and writes under "
                      "runs/results); the committed results and notebooks are replaced only "
                      "with --results results/studies")
  p.add_argument("--smoke", action="store_true",
                 help="tiny sizes (into runs/smoke/studies unless --results names another "
                      "folder outside results/studies)")
  p.add_argument("--collect", action="store_true",
                 help="train nothing: the studies whose script takes it and that have a "
                      "finished run under runs/studies/ write the runs finished so far "
                      "(partial results, said so in the claims); the others are left as they "
                      "are. Exit 1 when no study has a finished run")
  p.add_argument("--timeout", type=int, default=600, help="seconds per notebook cell")
  p.add_argument("--dry-run", action="store_true", help="print the study commands, run nothing")
  a = p.parse_args(argv)

  asked = a.results is not None
  if a.results is None:
    if a.smoke:
      a.results = os.path.join(REPO_ROOT, "runs", "smoke", "studies")
    elif a.notebooks_only:  # read the committed results, write under runs/results
      a.results = DEFAULT_RESULTS
    else:
      a.results = os.path.join(RUNS_RESULTS, "studies")
  results = os.path.abspath(a.results)
  committed = os.path.realpath(results) == os.path.realpath(DEFAULT_RESULTS)
  in_place = committed and asked
  if a.smoke and in_place:
    p.error("--smoke would overwrite the committed results: give --results DIR")
  studies = list(STUDIES) if not a.only else [s.strip() for s in a.only.split(",") if s.strip()]
  unknown = [s for s in studies if s not in STUDIES]
  if unknown:
    p.error(f"unknown studies {unknown}; known: {list(STUDIES)}")

  failed = []
  t0 = time.time()
  if a.collect:
    skipped = [s for s in studies if not collects(s)]
    studies = [s for s in studies if collects(s)]
    if skipped:
      print(f"--collect: leaving {', '.join(skipped)} as they are (no --collect in their "
            "script)")
    # A study with no finished run would replace its results with an empty table.
    empty = [s for s in studies if not finished_runs(study_runs(s, a.smoke))]
    studies = [s for s in studies if s not in empty]
    if empty and studies:
      print(f"--collect: leaving {', '.join(empty)} as they are (no finished run under "
            f"{', '.join(_rel(study_runs(s, a.smoke)) for s in empty)})")
    if not studies:
      if empty:
        print(f"error: --collect found no finished training run (looked in "
              f"{', '.join(_rel(study_runs(s, a.smoke)) for s in empty)}); nothing was "
              f"written. Train first: python experiments/studies/run_studies.py"
              f"{' --only ' + a.only if a.only else ''}{' --smoke' if a.smoke else ''} (a "
              "stopped run resumes; --collect then writes what finished).", file=sys.stderr)
      else:
        print(f"error: --collect: none of {', '.join(skipped)} takes --collect (those that "
              f"do: {', '.join(s for s in STUDIES if collects(s))}).", file=sys.stderr)
      return 1
  if not a.notebooks_only:
    for s in studies:
      rc, _ = run_study(s, results, a.smoke, a.dry_run, a.collect)
      if STOPPED:
        print(f"error: {STOPPED[0]} stopped study {s} (exit {rc}; its log's last line says "
              "which checkpoints were saved); no later study, claims or notebook ran. Rerun "
              "the same command to resume.", file=sys.stderr, flush=True)
        return 3
      if rc:
        failed.append(f"study {s}: exit {rc}")
  if a.dry_run:
    return 0

  sys.path.insert(0, REPO_ROOT)
  from experiments.studies import claims  # noqa: E402 (after the studies: they are the slow part)
  writes = results if in_place or not committed else os.path.join(RUNS_RESULTS, "studies")
  claims.main(["--results", results, "--out", os.path.join(writes, "claims.json")])

  if not a.no_notebooks:
    out_dir = NOTEBOOKS if in_place else os.path.join(writes, "notebooks")
    on_disk = {f[:-len(".ipynb")] for f in os.listdir(NOTEBOOKS) if f.endswith(".ipynb")}
    known = [n for n in NOTEBOOK_ORDER if n in on_disk and n != "index"]
    names = known + sorted(on_disk - set(NOTEBOOK_ORDER)) + ["index"] * ("index" in on_disk)
    for name in names:
      t = time.time()
      err = execute_notebook(name, None if committed else results, out_dir, a.timeout)
      print(f"[notebook {name}] {'ok' if err is None else err} ({time.time() - t:.0f}s) -> "
            f"{_rel(os.path.join(out_dir, name + '.ipynb'))}", flush=True)
      if err:
        failed.append(f"notebook {name}: {err}")
  print(f"done after {(time.time() - t0) / 60:.1f} min"
        + ("; failed:\n  " + "\n  ".join(failed) if failed else "; nothing failed"))
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
