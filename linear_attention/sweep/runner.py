"""Running a sweep's points (all locally, or one), their status records and the summary."""

from __future__ import annotations

import concurrent.futures
import csv
import os
import re
import subprocess
import sys
import time
from typing import Any, Mapping, Sequence

from linear_attention.train import errors
from linear_attention.train import lifeline
from linear_attention.train import metrics as metrics_lib
from linear_attention.train import rundir
from linear_attention.sweep.points import (
    STATUS_FILE, _read_json, flag_value, load_sweep, point_dirs)
from linear_attention.sweep.children import (
    EXIT_MEANINGS, STOP_GRACE_S, SweepStoppedError, _CHILDREN, _check_grace,
    _stop_children_on_signals, stop_message, stop_note)


SWEEP_LOCK_FILE = "sweep.lock"  # held by the local sweep running in a directory


# Flags of ``linear_attention.main`` besides --config.*, passed on to every point's trainer.
TRAINER_FLAGS = ("--distributed", "--coordinator_address", "--num_processes", "--process_id")


def point_command(config_arg: str, workdir: str, overrides: Mapping[str, Any],
                  extra_flags: Sequence[str] = ()) -> list[str]:
  """The ``python -m linear_attention.main`` command line of one point."""
  cmd = [sys.executable, "-m", "linear_attention.main", f"--config={config_arg}",
         f"--workdir={workdir}", "--quiet", *extra_flags]
  cmd += [f"--config.{k}={flag_value(v)}" for k, v in overrides.items()]
  return cmd


def run_point(config_arg: str, workdir: str, overrides: Mapping[str, Any],
              extra_flags: Sequence[str] = (), env: Mapping[str, str] | None = None,
              process_id: int = 0) -> dict:
  """Runs one point to completion (or skips it when already done); returns its status record.

  The record's ``returncode`` is the trainer's exit status and ``exit_meaning`` says it in
  words; ``status`` is ``done``, ``failed``, or ``stopped`` (the sweep was stopped).

  Args:
    config_arg: ``path[:arg]`` as given to ``--config``.
    workdir: the point's own directory.
    overrides: its ``--config.*`` overrides.
    extra_flags: flags before the overrides (the sweep's ``--config.*``, trainer flags).
    env: the trainer's environment (default: this process's).
    process_id: this host's process in a multi-host point: only process 0 writes
      ``sweep_status.json`` and ``log.txt``; process ``i`` logs to ``log.p<i>.txt``.
  """
  status_path = os.path.join(workdir, STATUS_FILE)
  prev = _read_json(status_path)
  if prev and prev.get("status") == "done":
    return {**prev, "skipped": True}
  cmd = point_command(config_arg, workdir, overrides, extra_flags)
  rec: dict[str, Any] = {"overrides": dict(overrides), "command": cmd}
  if _CHILDREN.stop_at is not None:  # stopped before this point began: nothing to record
    return {**rec, "status": "stopped", "returncode": None, "error": "not started",
            "skipped": False}
  os.makedirs(workdir, exist_ok=True)
  log_path = os.path.join(workdir, "log.txt" if process_id == 0 else f"log.p{process_id}.txt")
  ckpt_before = rundir.newest_step_on_disk(workdir)
  t0 = time.time()
  with open(log_path, "ab") as log:
    log.write(("$ " + " ".join(cmd) + "\n").encode())
    log.flush()
    # A session of its own: a Ctrl-C in the terminal reaches the sweep only, which stops
    # every trainer the same way (SIGTERM: save, then exit 3).
    # The lifeline stops the trainer should this process die without stopping it (SIGKILL).
    proc = _CHILDREN.start(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                           **lifeline.popen_kwargs(env))
    if proc is None:
      return {**rec, "status": "stopped", "returncode": None, "error": "not started",
              "skipped": False}
    returncode = _CHILDREN.wait(proc)
  killed = _CHILDREN.killed.get(proc.pid)
  rec.update(returncode=returncode, exit_meaning=EXIT_MEANINGS.get(returncode, "crashed"),
             seconds=time.time() - t0)
  metrics = _read_json(os.path.join(workdir, "final_metrics.json"))
  now = _read_json(status_path)
  if returncode != 0 and isinstance(now, dict) and now.get("status") == "done":
    # Another runner (a --point job) finished this point meanwhile: its record stands.
    return {**now, "skipped": True}
  if returncode == 0 and metrics is not None:
    rec.update(status="done", metrics=metrics)
  elif returncode == 2 and _held_by_another(workdir):
    # Refused because another process trains this point now: not a failure, nothing recorded.
    return {**rec, "returncode": returncode, "status": "running elsewhere",
            "error": "another process trains this point", "skipped": False}
  else:
    with open(log_path, "rb") as f:
      tail = f.read().decode(errors="replace").strip().splitlines()[-200:]
    # A Python error names itself last; a crash ("Fatal Python error: Segmentation fault")
    # comes before its stack dump.
    said = [ln for ln in tail if ln.startswith(("error:", "Fatal Python error")) or "Error" in ln]
    rec.update(status="failed", error=(said[-1] if said else "\n".join(tail[-5:])),
               log_tail="\n".join(tail[-15:]))
    if _CHILDREN.stop_at is not None or returncode == errors.EXIT_PREEMPTED:
      step = rundir.newest_step_on_disk(workdir)
      saved = returncode == errors.EXIT_PREEMPTED and step is not None and step != ckpt_before
      rec.update(status="stopped", checkpoint_step=step, saved_on_stop=saved,
                 error=stop_note(returncode, step, saved, killed))
  if process_id == 0:
    metrics_lib.write_json(status_path, rec)
  return {**rec, "skipped": False}


def _held_by_another(point_dir: str) -> bool:
  """Whether another live process holds the point's ``run.lock``."""
  if not os.path.exists(os.path.join(point_dir, rundir.LOCK_FILE)):
    return False
  try:
    rundir.WorkdirLock(point_dir).acquire().release()
  except rundir.errors.WorkdirLockedError:
    return True
  except ValueError:
    return False
  return False


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


def _write_plan(config_arg: str, workdir: str, extra_flags: Sequence[str], points: list[dict],
                names: list[str]) -> None:
  metrics_lib.write_json(os.path.join(workdir, "sweep.json"),
                         {"config": config_arg, "extra_flags": list(extra_flags),
                          "points": [{"point": n, "overrides": p}
                                     for n, p in zip(names, points)]})


def run_sweep(config_arg: str, workdir: str, workers: int = 1,
              extra_flags: Sequence[str] = (), points: list[dict] | None = None,
              verbose: bool = True, stop_grace_s: float = STOP_GRACE_S) -> list[dict]:
  """Runs every point (``workers`` at a time) and writes the summary; returns its rows.

  Args:
    config_arg: ``path[:arg]`` as given to ``--config``.
    workdir: sweep directory; each point gets a sub-directory (see :func:`point_dirs`).
    workers: concurrent processes.
    extra_flags: flags passed to every point (e.g. ``--config.train.steps=100``).
    points: override dicts; default ``get_sweep()`` of the config file.
    stop_grace_s: after a stop signal, seconds a trainer has to save before it is killed.

  Returns:
    One row per point: ``point`` (its directory name), ``status``, ``overrides``,
    ``returncode``, ``metrics`` (``final_metrics.json``), ``error``, ``skipped``; a
    stopped point also ``checkpoint_step`` (its newest on disk, or None) and
    ``saved_on_stop``.

  Raises:
    ValueError: ``workers`` < 1, or no points.
    WorkdirLockedError (a ValueError): another live sweep runs in ``workdir`` (its
      ``sweep.lock``; a lock left by a killed sweep is taken over).
    SweepStoppedError: a signal stopped the sweep (the summary is written first).
  """
  if workers < 1:
    raise ValueError(f"workers must be >= 1, got {workers}.")
  _check_grace(stop_grace_s)
  points = load_sweep(config_arg) if points is None else points
  if not points:
    raise ValueError("the sweep has no points.")
  os.makedirs(workdir, exist_ok=True)
  # One local sweep per directory: a second one would start trainers on the same points,
  # be refused by their run locks and record finished points as failed.
  with rundir.WorkdirLock(workdir, SWEEP_LOCK_FILE, "sweep directory", " (another sweep)"):
    return _run_sweep(config_arg, workdir, workers, extra_flags, points, verbose, stop_grace_s)


def _run_sweep(config_arg: str, workdir: str, workers: int, extra_flags: Sequence[str],
               points: list[dict], verbose: bool, stop_grace_s: float) -> list[dict]:
  """:func:`run_sweep` in a locked sweep directory."""
  _CHILDREN.reset(stop_grace_s)
  names = point_dirs(workdir, points)
  _write_plan(config_arg, workdir, extra_flags, points, names)
  rows: list[dict | None] = [None] * len(points)
  refused: list[str] = []  # the trainer's error about a flag every point gets

  def one(i):
    if refused:  # every later point would be refused the same way
      return i, {"overrides": dict(points[i]), "status": "not run", "returncode": None,
                 "error": "not started: a sweep-wide flag is invalid", "skipped": False}
    rec = run_point(config_arg, os.path.join(workdir, names[i]), points[i], extra_flags)
    if rec["status"] == "failed" and _refuses_sweep_flags(rec, extra_flags):
      refused.append(rec["error"])
    return i, rec

  with _stop_children_on_signals(), concurrent.futures.ThreadPoolExecutor(
      max_workers=workers) as ex:
    for i, rec in (f.result() for f in concurrent.futures.as_completed(
        [ex.submit(one, i) for i in range(len(points))])):
      rows[i] = {"point": names[i], **rec}
      if verbose:
        print(f"[{sum(r is not None for r in rows)}/{len(points)}] {_describe(names[i], rec)}",
              flush=True)
  write_summary(workdir, rows)  # type: ignore[arg-type]
  if any(r["status"] == "stopped" for r in rows):  # type: ignore[index]
    raise SweepStoppedError(stop_message(rows, workdir))  # type: ignore[arg-type]
  if refused:
    started = sum(r["returncode"] is not None for r in rows)  # type: ignore[index]
    raise ValueError(f"a flag given to every point is invalid, no further point was started "
                     f"({started} ran): {refused[0].removeprefix('error: ')}")
  return rows  # type: ignore[return-value]


def _refuses_sweep_flags(rec: Mapping[str, Any], extra_flags: Sequence[str]) -> bool:
  """Whether a point's trainer refused (exit 2) only flags that every point is given: a typo
  in ``--config.*`` of the sweep's command failed every point, one trainer start at a time."""
  if rec.get("returncode") != errors.EXIT_CONFIG:
    return False
  text = rec.get("error") or ""
  found = re.search(r"invalid config override in (\[.*?\]):", text)
  if found:
    named = re.findall(r"'([^']*)'", found.group(1))
  else:  # absl's own form: "flag --config.x=y: <why>"
    named = re.findall(r"flag (--config\.[^\s:]+)", text)
  return bool(named) and all(n in extra_flags for n in named)


def run_one(config_arg: str, workdir: str, index: int, extra_flags: Sequence[str] = (),
            points: list[dict] | None = None, process_id: int = 0,
            stop_grace_s: float = STOP_GRACE_S) -> dict:
  """Runs point ``index`` alone into its directory (an array task's share of a sweep).

  Writes no summary (other points may be running elsewhere; :func:`collect` writes it).

  Args:
    config_arg, workdir, extra_flags, points, stop_grace_s: as for :func:`run_sweep`.
    index: the point, 0-based in ``points`` (see ``--list``).
    process_id: this host's process in a multi-host point (see :func:`run_point`).

  Returns:
    The point's row, as in :func:`run_sweep`.

  Raises:
    ValueError: ``index`` out of range, or no points.
    SweepStoppedError: a signal stopped the point (the message names the checkpoint its
      trainer saved, or says that none was).
  """
  _check_grace(stop_grace_s)
  points = load_sweep(config_arg) if points is None else points
  if not 0 <= index < len(points):
    raise ValueError(f"--point must be in [0, {len(points)}) for the {len(points)} points of "
                     f"{config_arg!r}, got {index}.")
  os.makedirs(workdir, exist_ok=True)
  _CHILDREN.reset(stop_grace_s)
  names = point_dirs(workdir, points)
  if process_id == 0:
    _write_plan(config_arg, workdir, extra_flags, points, names)
  with _stop_children_on_signals():
    rec = run_point(config_arg, os.path.join(workdir, names[index]), points[index], extra_flags,
                    process_id=process_id)
  if rec["status"] == "stopped":
    note = rec.get("error") or "not started"
    raise SweepStoppedError(f"point {index} ({names[index]}) was stopped: {note}. Rerun the "
                            "same command to continue.")
  return {"point": names[index], **rec}


def collect(workdir: str, points: Sequence[Mapping[str, Any]]) -> list[dict]:
  """The summary rows of ``points`` as their directories stand, training nothing.

  Safe while points train elsewhere: it reads only status files. A point recorded ``done``
  or ``failed`` keeps its record; any other (never started, training, stopped) is
  ``not run``.

  Returns:
    One row per point, as in :func:`run_sweep`.
  """
  rows = []
  for name, p in zip(point_dirs(workdir, points), points):
    rec = _read_json(os.path.join(workdir, name, STATUS_FILE))
    if isinstance(rec, dict) and rec.get("status") in ("done", "failed"):
      rows.append({"point": name, **rec, "skipped": True})
    else:
      rows.append({"point": name, "status": "not run", "overrides": dict(p), "metrics": None})
  return rows


def _describe(name: str, rec: Mapping[str, Any]) -> str:
  what = "skipped (done before)" if rec.get("skipped") else rec["status"]
  detail = rec["status"] in ("failed", "stopped") and rec.get("error")
  return f"{name} {what}" + (f": {detail}" if detail else "")
