"""Sweeps: run every point of a config's ``get_sweep()`` as its own training process.

``python -m linear_attention.sweep --config=configs/mqar.py:size=smoke --workdir=runs/mqar-sweep
--workers=2 [--config.train.steps=100 ...]``

``get_sweep(arg)`` (or ``get_sweep()``) in the config file returns a list of override dicts,
``{"model.mixer": "gla", "optim.lr": 1e-3}`` (keys are config paths; a leading ``config.`` is
allowed). Each point runs ``python -m linear_attention.main`` with the same ``--config`` and
its overrides (after the sweep's own ``--config.*`` flags) in ``<workdir>/<index>-<name>``,
with its output in that directory's ``log.txt``. A finished point leaves ``sweep_status.json``
with status ``done`` and is skipped when the sweep is rerun; a crashed one is recorded as
``failed`` with the end of its error output (and retried on the next rerun, resuming from its
checkpoints). ``summary.csv`` and ``summary.json`` in the workdir list every point's status,
exit code (see ``linear_attention.main``), overrides and final metrics.

Stopping the sweep (SIGTERM or SIGINT) stops its trainers too: each gets SIGTERM, saves a
checkpoint and exits 3 (SIGKILL after ``STOP_GRACE_S``); points not started are left for the
next rerun, and the summary records them as ``stopped``. Exit status: 0 every point done,
1 some point failed, 2 bad sweep arguments, 3 stopped by a signal.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import csv
import importlib.util
import inspect
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Mapping, Sequence

from linear_attention.train import metrics as metrics_lib

STATUS_FILE = "sweep_status.json"
STOP_GRACE_S = 60.0  # a stopped trainer's time to save its checkpoint before SIGKILL
# The trainer's exit codes (``train.errors.EXIT_CODES``), for the summary.
EXIT_MEANINGS = {0: "done", 1: "runtime failure", 2: "bad config or workdir", 3: "preempted",
                 4: "non-finite loss", 130: "interrupted", -9: "killed (SIGKILL)",
                 -15: "terminated (SIGTERM)"}


class SweepStoppedError(RuntimeError):
  """The sweep got SIGTERM/SIGINT; its trainers were stopped and the summary written."""


class _Children:
  """The running trainer processes, so that a stopped sweep can stop them (thread-safe)."""

  def __init__(self):
    self._lock = threading.Lock()
    self._procs: set[subprocess.Popen] = set()
    self.stop_at: float | None = None  # set when the sweep was told to stop

  def start(self, cmd, **kw) -> subprocess.Popen | None:
    with self._lock:
      if self.stop_at is not None:
        return None
      proc = subprocess.Popen(cmd, **kw)
      self._procs.add(proc)
      return proc

  def wait(self, proc: subprocess.Popen) -> int:
    """Waits for ``proc``; past the grace period of a stop, kills it."""
    while True:
      try:
        return proc.wait(timeout=0.2)
      except subprocess.TimeoutExpired:
        if self.stop_at is not None and time.monotonic() > self.stop_at + STOP_GRACE_S:
          proc.kill()
      finally:
        if proc.returncode is not None:
          with self._lock:
            self._procs.discard(proc)

  def stop(self, kill: bool = False) -> None:
    """Sends SIGTERM (or SIGKILL) to every running trainer; starts no new one."""
    with self._lock:
      if self.stop_at is None:
        self.stop_at = time.monotonic()
      for proc in self._procs:
        if proc.poll() is None:
          proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)


_CHILDREN = _Children()


def load_sweep(config_arg: str) -> list[dict]:
  """The override dicts of ``get_sweep`` in the config file of ``config_arg`` (``path[:arg]``).

  Raises:
    ValueError: no such file, no ``get_sweep``, or a malformed result.
  """
  path, _, arg = config_arg.partition(":")
  if not os.path.isfile(path):
    raise ValueError(f"config file {path!r} not found.")
  root = os.path.dirname(os.path.dirname(os.path.abspath(path)))
  if root not in sys.path:
    sys.path.insert(0, root)
  spec = importlib.util.spec_from_file_location("_sweep_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  fn = getattr(module, "get_sweep", None)
  if fn is None:
    raise ValueError(f"config file {path!r} defines no get_sweep().")
  points = fn(arg or None) if inspect.signature(fn).parameters else fn()
  if not isinstance(points, Sequence) or not all(isinstance(p, Mapping) for p in points):
    raise ValueError(f"get_sweep() in {path!r} must return a list of dicts, got {points!r}.")
  out = []
  for p in points:
    out.append({(k[len("config."):] if k.startswith("config.") else k): v for k, v in p.items()})
  return out


def flag_value(v: Any) -> str:
  """A value as ``ml_collections.config_flags`` parses it back."""
  if isinstance(v, bool):
    return "True" if v else "False"
  if isinstance(v, float):
    return repr(v)
  if isinstance(v, (list, tuple)):
    return "(" + ",".join(flag_value(x) for x in v) + ("," if len(v) == 1 else "") + ")"
  return str(v)


def point_name(index: int, overrides: Mapping[str, Any]) -> str:
  """``"003-mixer=gla,lr=0.001"``: the index plus short key=value pairs, filesystem-safe."""
  parts = [f"{k.split('.')[-1]}={flag_value(v)}" for k, v in overrides.items()]
  name = re.sub(r"[^A-Za-z0-9_.,=+-]", "_", ",".join(parts))[:80]
  return f"{index:03d}-{name}" if name else f"{index:03d}"


def point_command(config_arg: str, workdir: str, overrides: Mapping[str, Any],
                  extra_flags: Sequence[str] = ()) -> list[str]:
  """The ``python -m linear_attention.main`` command line of one point."""
  cmd = [sys.executable, "-m", "linear_attention.main", f"--config={config_arg}",
         f"--workdir={workdir}", "--quiet", *extra_flags]
  cmd += [f"--config.{k}={flag_value(v)}" for k, v in overrides.items()]
  return cmd


def _read_json(path: str) -> dict | None:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, json.JSONDecodeError):
    return None


def run_point(config_arg: str, workdir: str, overrides: Mapping[str, Any],
              extra_flags: Sequence[str] = (), env: Mapping[str, str] | None = None) -> dict:
  """Runs one point to completion (or skips it when already done); returns its status record.

  The record's ``returncode`` is the trainer's exit status and ``exit_meaning`` says it in
  words; ``status`` is ``done``, ``failed``, or ``stopped`` (the sweep was stopped).
  """
  status_path = os.path.join(workdir, STATUS_FILE)
  prev = _read_json(status_path)
  if prev and prev.get("status") == "done":
    return {**prev, "skipped": True}
  cmd = point_command(config_arg, workdir, overrides, extra_flags)
  rec: dict[str, Any] = {"overrides": dict(overrides), "command": cmd}
  if _CHILDREN.stop_at is not None:  # stopped before this point began: nothing to record
    return {**rec, "status": "stopped", "returncode": None, "skipped": False}
  os.makedirs(workdir, exist_ok=True)
  t0 = time.time()
  with open(os.path.join(workdir, "log.txt"), "ab") as log:
    log.write(("$ " + " ".join(cmd) + "\n").encode())
    log.flush()
    # A session of its own: a Ctrl-C in the terminal reaches the sweep only, which stops
    # every trainer the same way (SIGTERM: save, then exit 3).
    proc = _CHILDREN.start(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                           start_new_session=True)
    if proc is None:
      return {**rec, "status": "stopped", "returncode": None, "skipped": False}
    returncode = _CHILDREN.wait(proc)
  rec.update(returncode=returncode, exit_meaning=EXIT_MEANINGS.get(returncode, "crashed"),
             seconds=time.time() - t0)
  metrics = _read_json(os.path.join(workdir, "final_metrics.json"))
  if returncode == 0 and metrics is not None:
    rec.update(status="done", metrics=metrics)
  else:
    with open(os.path.join(workdir, "log.txt"), "rb") as f:
      tail = f.read().decode(errors="replace").strip().splitlines()[-200:]
    # A Python error names itself last; a crash ("Fatal Python error: Segmentation fault")
    # comes before its stack dump.
    errors = [ln for ln in tail if ln.startswith(("error:", "Fatal Python error")) or "Error" in ln]
    rec.update(status="stopped" if _CHILDREN.stop_at is not None else "failed",
               error=(errors[-1] if errors else "\n".join(tail[-5:])),
               log_tail="\n".join(tail[-15:]))
  metrics_lib.write_json(status_path, rec)
  return {**rec, "skipped": False}


def write_summary(workdir: str, rows: list[dict]) -> None:
  """``summary.json`` (full records) and ``summary.csv`` (one row per point) in ``workdir``."""
  metrics_lib.write_json(os.path.join(workdir, "summary.json"), rows)
  okeys = sorted({k for r in rows for k in r["overrides"]})
  mkeys = sorted({k for r in rows for k in (r.get("metrics") or {})})
  with open(os.path.join(workdir, "summary.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["point", "status", "exit_code", *okeys, *mkeys, "error"])
    for r in rows:
      m = r.get("metrics") or {}
      code = r.get("returncode")
      w.writerow([r["point"], r["status"], "" if code is None else code,
                  *[r["overrides"].get(k, "") for k in okeys],
                  *[m.get(k, "") for k in mkeys], r.get("error", "")])


def run_sweep(config_arg: str, workdir: str, workers: int = 1,
              extra_flags: Sequence[str] = (), points: list[dict] | None = None,
              verbose: bool = True) -> list[dict]:
  """Runs every point (``workers`` at a time) and writes the summary; returns its rows.

  Args:
    config_arg: ``path[:arg]`` as given to ``--config``.
    workdir: sweep directory; each point gets a sub-directory.
    workers: concurrent processes.
    extra_flags: flags passed to every point (e.g. ``--config.train.steps=100``).
    points: override dicts; default ``get_sweep()`` of the config file.
  """
  if workers < 1:
    raise ValueError(f"workers must be >= 1, got {workers}.")
  points = load_sweep(config_arg) if points is None else points
  if not points:
    raise ValueError("the sweep has no points.")
  os.makedirs(workdir, exist_ok=True)
  _CHILDREN.stop_at = None
  names = [point_name(i, p) for i, p in enumerate(points)]
  metrics_lib.write_json(os.path.join(workdir, "sweep.json"),
              {"config": config_arg, "extra_flags": list(extra_flags),
               "points": [{"point": n, "overrides": p} for n, p in zip(names, points)]})
  rows: list[dict | None] = [None] * len(points)

  def one(i):
    return i, run_point(config_arg, os.path.join(workdir, names[i]), points[i], extra_flags)

  with _stop_children_on_signals(), concurrent.futures.ThreadPoolExecutor(
      max_workers=workers) as ex:
    for i, rec in (f.result() for f in concurrent.futures.as_completed(
        [ex.submit(one, i) for i in range(len(points))])):
      rows[i] = {"point": names[i], **rec}
      if verbose:
        what = "skipped (done before)" if rec.get("skipped") else rec["status"]
        extra = f": {rec.get('error')}" if rec["status"] == "failed" else ""
        print(f"[{sum(r is not None for r in rows)}/{len(points)}] {names[i]} {what}{extra}",
              flush=True)
  write_summary(workdir, rows)  # type: ignore[arg-type]
  stopped = [r["point"] for r in rows if r["status"] == "stopped"]  # type: ignore[index]
  if stopped:
    raise SweepStoppedError(
        f"the sweep was stopped; {len(stopped)} point(s) unfinished, their trainers saved "
        f"checkpoints (summary in {workdir}). Rerun the same command to continue.")
  return rows  # type: ignore[return-value]


@contextlib.contextmanager
def _stop_children_on_signals():
  """SIGTERM/SIGINT stop the running trainers (a second signal kills them) instead of
  leaving them orphaned; the sweep then finishes its summary."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return

  def handle(signum, frame):
    _CHILDREN.stop(kill=_CHILDREN.stop_at is not None)

  old = {s: signal.signal(s, handle) for s in (signal.SIGTERM, signal.SIGINT)}
  try:
    yield
  finally:
    for s, h in old.items():
      signal.signal(s, h)


def _format_table(rows: list[dict]) -> str:
  keys = ["validation_loss", "validation_accuracy"]
  lines = [f"{'point':<40} {'status':<7} " + " ".join(f"{k:>20}" for k in keys)]
  for r in rows:
    m = r.get("metrics") or {}
    vals = " ".join(f"{m[k]:>20.4f}" if isinstance(m.get(k), (int, float)) else f"{'-':>20}"
                    for k in keys)
    lines.append(f"{r['point'][:40]:<40} {r['status']:<7} {vals}")
  return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
  """``--config=PATH[:ARG] --workdir=DIR [--workers=N] [--config.key=value ...]``."""
  import argparse
  parser = argparse.ArgumentParser(prog="python -m linear_attention.sweep", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", required=True, help="config file with get_sweep(), [:arg]")
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--workers", type=int, default=1)
  args, rest = parser.parse_known_args(argv)
  bad = [a for a in rest if not a.startswith("--config.")]
  if bad:
    parser.error(f"unknown arguments {bad}; only --config.<field>=value flags are passed on.")
  try:
    rows = run_sweep(args.config, args.workdir, args.workers, extra_flags=rest)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  except SweepStoppedError as e:
    print(f"error: {e}", file=sys.stderr)
    return 3
  print(_format_table(rows))
  print(f"summary: {os.path.join(args.workdir, 'summary.csv')}")
  return 0 if all(r["status"] == "done" for r in rows) else 1


if __name__ == "__main__":
  sys.exit(main())
