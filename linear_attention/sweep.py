"""Sweeps: every point of a config's ``get_sweep()`` trained as its own process.

Locally, every point, ``--workers`` at a time::

  python -m linear_attention.sweep --config=configs/mqar.py:size=smoke --workdir=runs/mqar-sweep \
      --workers=2 [--config.train.steps=100 ...]

On a cluster, one point per job (a SLURM array task, say), then the summary::

  python -m linear_attention.sweep --config=... --workdir=... --list        # index, status, overrides
  python -m linear_attention.sweep --config=... --workdir=... --point=3     # point 3 only
  python -m linear_attention.sweep --config=... --workdir=...               # in an array task:
                                                       # the point $SLURM_ARRAY_TASK_ID
  python -m linear_attention.sweep --config=... --workdir=... --collect     # summary of what finished

``get_sweep(arg)`` (or ``get_sweep()``) in the config file returns a list of override dicts,
``{"model.mixer": "gla", "optim.lr": 1e-3}`` (keys are config paths; a leading ``config.`` is
allowed); :func:`product` and :func:`zip_` build such lists. Each point runs
``python -m linear_attention.main`` with the same ``--config`` and its overrides (after the
sweep's own ``--config.*`` flags and trainer flags such as ``--distributed``) in its directory,
with its output in that directory's ``log.txt``. A finished point leaves ``sweep_status.json``
with status ``done`` and is skipped when the sweep is rerun; a crashed one is recorded as
``failed`` with the end of its error output (and retried on the next rerun, resuming from its
checkpoints). A trainer that refuses a ``--config.*`` flag every point gets (a typo in the
sweep's command) ends the sweep after the points already started: exit 2, the others
``not run``. ``summary.csv`` and ``summary.json`` in the workdir list every point's status,
exit code (see ``linear_attention.main``), overrides and final metrics.

A point's directory is ``NNN-<overrides>`` (its index, then short ``key=value`` pairs). The
overrides, not the index, say which run is whose: when the point list changes (a mixer list
that grew shifts the indices), a directory of another index whose ``sweep_status.json``
records the same overrides is reused, a finished one first, so no finished point is trained
again and an unfinished one resumes from its checkpoints. A directory without a status file
(a run killed before it recorded one) is matched by its ``<overrides>`` name part instead.

One local sweep runs in a directory at a time: ``sweep.lock`` names it, and a second sweep
on the same ``--workdir`` refuses at once (exit 2, naming the first); a lock left by a killed
sweep is taken over. ``--point`` jobs take no sweep lock (an array's tasks share the
directory); a point whose trainer another process is running is reported ``running
elsewhere`` and a point another runner finished keeps its ``done`` record.

Stopping the sweep (SIGTERM or SIGINT, to the sweep alone or to its process group) stops
its trainers too: each gets SIGTERM, saves a checkpoint at the end of its running step and
exits 3, and the sweep waits for them. A second signal only says what is still saving; a
third, or ``--stop-grace`` seconds (default ``STOP_GRACE_S``) without an exit, kills the
trainers that remain (said per point: no checkpoint saved). The trainers run in sessions of
their own, so that a signal to the sweep's process group reaches them once, through the
sweep; a sweep killed outright (SIGKILL, a crash) stops them through their lifeline
(``train.lifeline``): each saves a checkpoint and exits 3, and no summary is written. Points
not started are left for the next rerun; the summary records the stopped ones as
``stopped`` with the checkpoint each saved, and the final ``error:`` line names them
(rerunning the same command resumes each from its checkpoint). Exit status: 0 every point
done, 1 some point failed, 2 bad sweep arguments, 3 stopped by a signal; with ``--point``,
the trainer's own exit status (0 also when the point had finished before).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import csv
import hashlib
import importlib.util
import inspect
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Iterable, Mapping, Sequence

from linear_attention.train import errors
from linear_attention.train import lifeline
from linear_attention.train import metrics as metrics_lib
from linear_attention.train import rundir

SWEEP_LOCK_FILE = "sweep.lock"  # held by the local sweep running in a directory

STATUS_FILE = "sweep_status.json"
# A stopped trainer's time to end its running dispatch and save before SIGKILL. Generous: a
# kill loses every step since the last checkpoint, and one dispatch of study_hybrid's 4-layer
# MQAR run is 5 fused steps of 3-5 s each on two shared cores, before its save; a hung
# trainer holds the sweep at most this long.
STOP_GRACE_S = 300.0
ARRAY_ENV = "SLURM_ARRAY_TASK_ID"  # the default source of --point in an array job
# Flags of ``linear_attention.main`` besides --config.*, passed on to every point's trainer.
TRAINER_FLAGS = ("--distributed", "--coordinator_address", "--num_processes", "--process_id")
# The trainer's exit codes (``train.errors.EXIT_CODES``), for the summary.
EXIT_MEANINGS = {0: "done", 1: "runtime failure", 2: "bad config or workdir", 3: "preempted",
                 4: "non-finite loss", 130: "interrupted", -9: "killed (SIGKILL)",
                 -15: "terminated (SIGTERM)"}


# ----------------------------------------------------------------------------- building points


def product(*axes: Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Any]], **kw) -> list[dict]:
  """The Cartesian product of override lists; the last axis varies fastest.

  ``product({"model.mixer": ["gla", "softmax"]}, {"optim.lr": [1e-3, 3e-3]})`` gives four
  points. Each positional axis is a list of override dicts or a one-key dict
  ``{key: [values]}``; keyword axes name the key with ``__`` for ``.``
  (``product(model__mixer=["gla", "softmax"])``).

  Returns:
    A list of merged override dicts.

  Raises:
    ValueError: a malformed axis, or one key set to two values in one point.
  """
  return [_merged(combo) for combo in itertools.product(*_axes(axes, kw))]


def zip_(*axes: Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Any]], **kw) -> list[dict]:
  """Element-wise merge of override lists of equal length (axes as in :func:`product`).

  ``zip_({"model.mixer": ["gla", "softmax"]}, {"optim.lr": [1e-3, 3e-4]})`` gives two points.

  Raises:
    ValueError: the lists differ in length, or a malformed axis.
  """
  lists = _axes(axes, kw)
  lengths = [len(x) for x in lists]
  if len(set(lengths)) > 1:
    raise ValueError(f"zip_ needs lists of equal length, got lengths {lengths}.")
  return [_merged(combo) for combo in zip(*lists)]


def _axes(axes, kw) -> list[list[dict]]:
  return ([_normalise(a) for a in axes]
          + [[{k.replace("__", "."): v} for v in vals] for k, vals in kw.items()])


def _normalise(axis) -> list[dict]:
  """A list of override dicts from a list of dicts or a one-key ``{key: [values]}``."""
  if isinstance(axis, Mapping):
    if len(axis) != 1:
      raise ValueError(f"a dict axis must have exactly one key mapping to a list of values, "
                       f"got keys {list(axis)}; use zip_ or a list of dicts for several keys.")
    (k, v), = axis.items()
    if isinstance(v, (str, bytes)) or not isinstance(v, Iterable):
      raise ValueError(f"the values of sweep key {k!r} must be a list, got {v!r}.")
    return [{k: x} for x in v]
  axis = list(axis)
  for d in axis:
    if not isinstance(d, Mapping):
      raise ValueError(f"a sweep axis must be a list of dicts, got an element {d!r}.")
  return [dict(d) for d in axis]


def _merged(dicts: Iterable[Mapping[str, Any]]) -> dict:
  out: dict = {}
  for d in dicts:
    for k, v in d.items():
      if k in out and out[k] != v:
        raise ValueError(f"sweep key {k!r} is set twice in one point ({out[k]!r} and {v!r}).")
      out[k] = v
  return out


# ----------------------------------------------------------------------------- running points


class SweepStoppedError(RuntimeError):
  """The sweep got SIGTERM/SIGINT; its trainers were stopped and the summary written."""


class _Children:
  """The running trainer processes, so that a stopped sweep can stop them (thread-safe).

  The lock is re-entrant: a signal handler runs in the main thread, which may hold it (a
  ``--point`` run starts its trainer from the main thread).
  """

  def __init__(self):
    self._lock = threading.RLock()
    self._procs: set[subprocess.Popen] = set()
    self.reset()

  def reset(self, grace_s: float = STOP_GRACE_S) -> None:
    """Ready for a new sweep: not stopped, ``grace_s`` for a stopped trainer to save."""
    self.stop_at: float | None = None  # set when the sweep was told to stop
    self.grace_s = float(grace_s)
    self.signals = 0
    self.killed: dict[int, str] = {}  # pid -> why this sweep killed it (it saved nothing)

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
        if self.stop_at is not None and time.monotonic() > self.stop_at + self.grace_s:
          self._kill(proc, f"killed after {self.grace_s:g} s (--stop-grace)")
      finally:
        if proc.returncode is not None:
          with self._lock:
            self._procs.discard(proc)

  def _kill(self, proc: subprocess.Popen, why: str) -> None:
    with self._lock:
      if proc.poll() is None:
        self.killed[proc.pid] = why
        proc.kill()

  def running(self) -> list[subprocess.Popen]:
    with self._lock:
      return [p for p in self._procs if p.poll() is None]

  def stop(self, kill: str = "") -> None:
    """Sends SIGTERM to every running trainer (SIGKILL when ``kill`` says why); starts no
    new one."""
    with self._lock:
      if self.stop_at is None:
        self.stop_at = time.monotonic()
      for proc in self.running():
        if kill:
          self._kill(proc, kill)
        else:
          proc.send_signal(signal.SIGTERM)

  def on_signal(self, name: str) -> None:
    """A stop signal to the sweep. The first stops the trainers (each saves and exits), the
    second says what is still saving, the third kills what remains. A scheduler or ``kill``
    may deliver one stop twice (to the process, then to its group), and a double Ctrl-C is
    common: killing at the second signal lost the trainers' checkpoints."""
    self.signals += 1
    n = len(self.running())
    if self.signals == 1:
      self.stop()
      left = self.grace_s
      line = (f"{name}: stopping the sweep; {n} running trainer(s) save a checkpoint and exit "
              f"(waiting up to {left:.0f} s; a third signal kills them without saving)")
    elif self.signals == 2:
      left = max(self.stop_at + self.grace_s - time.monotonic(), 0.0)
      line = (f"{name}: still waiting for {n} trainer(s) to save their checkpoints "
              f"({left:.0f} s left); one more signal kills them without saving")
    else:
      self.stop(kill=f"killed by a third {name}")
      line = f"{name}: killing {n} trainer(s); they save no checkpoint"
    # os.write: the main thread may be inside a print to stderr when the handler runs.
    os.write(2, (line + "\n").encode())


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
  """``"003-mixer=gla,lr=0.001"``: the index plus short key=value pairs, filesystem-safe.

  The pairs are cut at 80 characters, so two points may share the ``<overrides>`` part;
  :func:`point_dirs` tells them apart by the overrides their status files record.
  """
  parts = [f"{k.split('.')[-1]}={flag_value(v)}" for k, v in overrides.items()]
  name = re.sub(r"[^A-Za-z0-9_.,=+-]", "_", ",".join(parts))[:80]
  return f"{index:03d}-{name}" if name else f"{index:03d}"


_DIR_NAME = re.compile(r"(\d{3,})(?:-(.*))?")  # NNN[-<overrides>]


def _same_overrides(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
  """Equal as the trainer sees them (a JSON round trip turns tuples into lists)."""
  return ({k: flag_value(v) for k, v in a.items()}
          == {k: flag_value(v) for k, v in b.items()})


def point_dirs(workdir: str, points: Sequence[Mapping[str, Any]]) -> list[str]:
  """The directory name (under ``workdir``) of each point, reusing runs by their overrides.

  For each point, in order of preference: a finished run of its overrides (its own
  :func:`point_name` first, then any index); its own name if that holds an unfinished run of
  it; another index's unfinished run of it (resumed there); its own name if free. A run is
  a point's when its ``sweep_status.json`` records the same overrides or, without a status
  file, when its ``<overrides>`` name part equals the point's and was not cut short. Two
  points never share a directory; should a point's own name hold another point's run, the
  point gets the name plus a digest of its overrides.

  Args:
    workdir: the sweep directory (need not exist).
    points: override dicts, in sweep order.

  Returns:
    One name per point (``"003-mixer=gla"``), relative to ``workdir``.
  """
  runs: dict[str, dict | None] = {}
  if os.path.isdir(workdir):
    for name in sorted(os.listdir(workdir)):
      if _DIR_NAME.fullmatch(name) and os.path.isdir(os.path.join(workdir, name)):
        runs[name] = _read_json(os.path.join(workdir, name, STATUS_FILE))
  taken: set[str] = set()
  out = []
  for i, p in enumerate(points):
    own = point_name(i, p)
    suffix = own.partition("-")[2]

    def is_mine(name, p=p, own=own, suffix=suffix):
      rec = runs[name]
      if isinstance(rec, dict) and isinstance(rec.get("overrides"), dict):
        return _same_overrides(rec["overrides"], p)
      if name == own:
        return True
      # No record: only an uncut <overrides> part identifies the run.
      part = _DIR_NAME.fullmatch(name).group(2) or ""
      return part == suffix and 0 < len(suffix) < 80

    mine = [n for n in runs if n not in taken and is_mine(n)]
    done = [n for n in mine if (runs[n] or {}).get("status") == "done"]
    if done:
      pick = own if own in done else done[0]
    elif mine:
      pick = own if own in mine else mine[0]
    elif own in runs or own in taken:  # another point's run under this point's name
      digest = hashlib.sha1(json.dumps(sorted((k, flag_value(v)) for k, v in p.items()))
                            .encode()).hexdigest()[:8]
      pick = f"{own}-{digest}"
    else:
      pick = own
    taken.add(pick)
    out.append(pick)
  return out


def point_command(config_arg: str, workdir: str, overrides: Mapping[str, Any],
                  extra_flags: Sequence[str] = ()) -> list[str]:
  """The ``python -m linear_attention.main`` command line of one point."""
  cmd = [sys.executable, "-m", "linear_attention.main", f"--config={config_arg}",
         f"--workdir={workdir}", "--quiet", *extra_flags]
  cmd += [f"--config.{k}={flag_value(v)}" for k, v in overrides.items()]
  return cmd


def _read_json(path: str) -> Any:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, json.JSONDecodeError):
    return None


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


def _check_grace(stop_grace_s: float) -> None:
  if not stop_grace_s > 0:
    raise ValueError(f"stop_grace_s (--stop-grace) must be > 0 seconds, got {stop_grace_s}.")


def stop_note(returncode: int | None, step: int | None, saved: bool,
              killed: str | None = None) -> str:
  """What stopping a point's trainer left: the checkpoint it saved, or why there is none and
  where a rerun resumes."""
  resume = f"a rerun resumes at step {step}" if step is not None else "a rerun starts at step 0"
  if saved:
    return f"saved a checkpoint at step {step}"
  if killed:
    return f"{killed} without saving a checkpoint; {resume}"
  if returncode == errors.EXIT_PREEMPTED:  # it said it saved; the disk disagrees
    return f"exited 3 but no new checkpoint is on disk; {resume}"
  why = EXIT_MEANINGS.get(returncode, "crashed") if returncode is not None else "not started"
  return f"stopped outside training (exit {returncode}: {why}), no checkpoint saved; {resume}"


def stop_message(rows: Sequence[Mapping[str, Any]], where: str) -> str:
  """The one-line account of a stopped sweep: each stopped point's checkpoint (or why it has
  none), and the points never started."""
  ran = [r for r in rows if r.get("status") == "stopped" and r.get("returncode") is not None]
  not_started = sum(r.get("status") == "stopped" and r.get("returncode") is None for r in rows)
  saved = [r for r in ran if r.get("saved_on_stop")]
  parts = [f"{r['point']}: {r.get('error')}" for r in ran]
  if len(parts) > 8:  # the summary lists every point
    parts = parts[:8] + [f"{len(parts) - 8} more"]
  head = (f"the sweep was stopped; {len(saved)} of {len(ran)} stopped trainer(s) saved a "
          "checkpoint")
  return (head + (" (" + "; ".join(parts) + ")" if parts else "")
          + (f"; {not_started} point(s) not started" if not_started else "")
          + f". Summary in {where}. Rerun the same command to continue.")


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


@contextlib.contextmanager
def _stop_children_on_signals():
  """SIGTERM/SIGINT stop the running trainers (see :meth:`_Children.on_signal`) instead of
  leaving them orphaned; the sweep waits for them, then finishes its summary."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return

  def handle(signum, frame):
    del frame
    _CHILDREN.on_signal(signal.Signals(signum).name)

  old = {s: signal.signal(s, handle) for s in (signal.SIGTERM, signal.SIGINT)}
  try:
    yield
  finally:
    for s, h in old.items():
      signal.signal(s, h)


def _describe(name: str, rec: Mapping[str, Any]) -> str:
  what = "skipped (done before)" if rec.get("skipped") else rec["status"]
  detail = rec["status"] in ("failed", "stopped") and rec.get("error")
  return f"{name} {what}" + (f": {detail}" if detail else "")


def _format_table(rows: list[dict]) -> str:
  keys = ["validation_loss", "validation_accuracy"]
  lines = [f"{'point':<40} {'status':<7} " + " ".join(f"{k:>20}" for k in keys)]
  for r in rows:
    m = r.get("metrics") or {}
    vals = " ".join(f"{m[k]:>20.4f}" if isinstance(m.get(k), (int, float)) else f"{'-':>20}"
                    for k in keys)
    lines.append(f"{r['point'][:40]:<40} {r['status']:<7} {vals}")
  return "\n".join(lines)


def _process_id(flags: Sequence[str]) -> int:
  """This host's process in a multi-host point: ``--process_id``, ``JAX_PROCESS_ID``, or with
  ``--distributed`` SLURM's task rank (what ``jax.distributed`` detects there); else 0."""
  for f in flags:
    if f.startswith("--process_id="):
      return int(f.partition("=")[2])
  if os.environ.get("JAX_PROCESS_ID"):
    return int(os.environ["JAX_PROCESS_ID"])
  if "--distributed" in flags and os.environ.get("SLURM_PROCID"):
    return int(os.environ["SLURM_PROCID"])
  return 0


def main(argv: Sequence[str] | None = None) -> int:
  """The command line; see the module docstring."""
  import argparse
  parser = argparse.ArgumentParser(prog="python -m linear_attention.sweep", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", required=True, help="config file with get_sweep(), [:arg]")
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--workers", type=int, default=1, help="concurrent points (local runner)")
  mode = parser.add_mutually_exclusive_group()
  mode.add_argument("--list", action="store_true",
                    help="print each point's index, status, directory and overrides; run nothing")
  mode.add_argument("--point", type=int, default=None,
                    help="run only this point (0-based, as --list numbers them)")
  mode.add_argument("--collect", action="store_true",
                    help="write summary.csv/json from the points finished so far; run nothing")
  parser.add_argument("--stop-grace", type=float, default=STOP_GRACE_S, metavar="SECONDS",
                      help="after SIGTERM/SIGINT, seconds each running trainer has to save its "
                           f"checkpoint before it is killed (default {STOP_GRACE_S:g})")
  parser.add_argument("--array-env", default=ARRAY_ENV, metavar="VAR",
                      help="without --point, --list or --collect: when this environment variable "
                           f"is set, run the point it names (default {ARRAY_ENV})")
  args, rest = parser.parse_known_args(argv)
  bad = [a for a in rest
         if not a.startswith("--config.") and a.partition("=")[0] not in TRAINER_FLAGS]
  if bad:
    parser.error(f"unknown arguments {bad}; only --config.<field>=value flags and the trainer's "
                 f"{', '.join(TRAINER_FLAGS)} are passed on.")
  array_value = os.environ.get(args.array_env) if args.array_env else None
  point = args.point
  try:
    if point is None and not (args.list or args.collect) and array_value not in (None, ""):
      try:
        point = int(array_value)
      except ValueError:
        raise ValueError(f"{args.array_env} must be a point index, got {array_value!r}.") from None
      print(f"point {point} (from {args.array_env})", flush=True)
    distributed = any(a.partition("=")[0] in TRAINER_FLAGS for a in rest)
    if distributed and args.workers > 1 and point is None and not (args.list or args.collect):
      raise ValueError(f"--workers must be 1 with the multi-host flags {TRAINER_FLAGS}, got "
                       f"{args.workers}: every point's trainer would claim the same processes.")
    if args.list or args.collect:
      points = load_sweep(args.config)
      if args.list:
        for i, (name, row) in enumerate(zip(point_dirs(args.workdir, points),
                                            collect(args.workdir, points))):
          flags = " ".join(f"{k}={flag_value(v)}" for k, v in points[i].items())
          print(f"{i:4d}  {row['status']:<8} {name}  {flags}")
        print(f"{len(points)} points; --point takes 0..{len(points) - 1}", file=sys.stderr)
        return 0
      if not points:
        raise ValueError("the sweep has no points.")
      if not os.path.isdir(args.workdir):  # a typo, or nothing ran yet: say so, create nothing
        raise ValueError(f"--collect: the sweep directory {args.workdir!r} does not exist: no "
                         "point has run there (the same command without --collect runs them).")
      rows = collect(args.workdir, points)
      write_summary(args.workdir, rows)
      print(_format_table(rows))
      done = sum(r["status"] == "done" for r in rows)
      print(f"{done} of {len(rows)} points done; summary: "
            f"{os.path.join(args.workdir, 'summary.csv')}")
      return 0 if done == len(rows) else 1
    if point is not None:
      row = run_one(args.config, args.workdir, point, extra_flags=rest,
                    process_id=_process_id(rest), stop_grace_s=args.stop_grace)
      print(_describe(row["point"], row), flush=True)
      code = row.get("returncode")
      if row["status"] == "done":
        return 0
      return code if isinstance(code, int) and code > 0 else 1
    rows = run_sweep(args.config, args.workdir, args.workers, extra_flags=rest,
                     stop_grace_s=args.stop_grace)
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
