"""The run directory: its files, its lock and the check of a rerun's config.

A workdir holds ``config.json`` (the config it was trained with), ``checkpoints/``,
``metrics.jsonl``, ``tensorboard/``, ``final_metrics.json``, ``run.lock`` (held by the
process training in it) and, after a failure, ``error.log`` (the tracebacks; moved into
``error.resolved.log`` when a later attempt finishes the run). Nothing here
imports JAX, so the command line and the sweep runner can use it before the heavy imports.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import socket
import sys
import traceback
from typing import Any, Mapping

import ml_collections

from linear_attention.train import errors
from linear_attention.train import metrics as metrics_lib

CONFIG_FILE = "config.json"
FINAL_METRICS_FILE = "final_metrics.json"
LOCK_FILE = "run.lock"
CHECKPOINT_DIR = "checkpoints"  # orbax's step folders, <workdir>/checkpoints/<step>
ERROR_LOG = "error.log"
RESOLVED_ERROR_LOG = "error.resolved.log"  # error.log of earlier attempts, once the run finished

# Config sections whose fields may change between runs of one workdir: they set how often
# the run logs, evaluates and saves, where it runs, and how long (``train.steps``).
# Everything else (``model.*``, ``data.*``, ``optim.*``, ``train.seed``) shapes the
# parameters, the optimiser state or the data stream the checkpoints were made with.
# model.remat changes what the backward pass keeps, not the parameters; model.scan_layers
# stores the repeated blocks' parameters stacked, so the checkpoints' layout follows it.
RESUMABLE_FIELDS = ("train.", "mesh.", "model.remat", "save_hf")
FROZEN_FIELDS = ("train.seed",)


def prepare_workdir(workdir: str) -> str:
  """Creates ``workdir`` (and parents) and checks it is writable; returns its absolute path.

  Raises:
    ConfigError: the path cannot be created or written (naming it and why).
  """
  if not workdir:
    raise errors.ConfigError("--workdir must be a non-empty path.")
  path = os.path.abspath(os.path.expanduser(workdir))
  if os.path.exists(path) and not os.path.isdir(path):
    raise errors.ConfigError(f"workdir {path!r} exists and is not a directory.")
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise errors.ConfigError(f"cannot create workdir {path!r}: {e.strerror or e}.") from None
  if not os.access(path, os.W_OK | os.X_OK):
    raise errors.ConfigError(f"workdir {path!r} is not writable.")
  return path


def newest_step_on_disk(workdir: str) -> int | None:
  """The newest finished checkpoint's step in ``workdir`` without opening a manager (which
  would create the directory); None when there is none."""
  try:
    names = os.listdir(os.path.join(workdir, CHECKPOINT_DIR))
  except OSError:
    return None
  return max((int(n) for n in names if n.isdigit()), default=None)


# ----------------------------------------------------------------------------- lock


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # alive, owned by someone else
    return True
  return True


class WorkdirLock:
  """An exclusive ``flock`` on ``workdir/run.lock`` for the life of one run.

  The kernel drops the lock when its process dies, however it dies, so a lock left by a
  killed run is free for the next one (and said to be taken over). The file names its
  holder (``pid``, host, start time, command) so that a refused run can name it. It is
  removed when the ``with`` block ends without an error (a finished run leaves no lock
  file) and emptied otherwise. Removal is safe against a process that opened the file just
  before: it is unlinked while still locked, and :meth:`acquire` retries when the file it
  locked is no longer the one at the path.

  Raises (on ``acquire`` / ``__enter__``):
    WorkdirLockedError: another process holds the lock (naming it).
  """

  def __init__(self, workdir: str, name: str = LOCK_FILE, what: str = "workdir",
               held_by: str = ""):
    self.path = os.path.join(workdir, name)
    self.what, self.held_by = what, held_by  # for the refusal: "sweep directory", "a sweep"
    self._fd: int | None = None
    self.took_over: dict | None = None  # the previous holder's record, when it died holding it

  def holder(self) -> dict | None:
    """The record in the lock file (``{"pid", "host", "started", "command"}``) or None."""
    try:
      with open(self.path) as f:
        text = f.read().strip()
      return json.loads(text) if text else None
    except (OSError, json.JSONDecodeError):
      return None

  def acquire(self) -> "WorkdirLock":
    while True:
      fd = self._lock_once()
      try:
        same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
      except FileNotFoundError:
        same = False
      if same:
        break
      os.close(fd)  # its holder removed the file after this process opened it: open anew
    return self._record(fd)

  def _lock_once(self) -> int:
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      os.close(fd)
      if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
        raise errors.ConfigError(f"cannot lock {self.path!r} ({e.strerror or e}); the workdir's "
                                 "filesystem must support file locks.") from None
      h = self.holder() or {}
      who = (f"process {h.get('pid')} on {h.get('host')} (started {h.get('started')})"
             if h.get("pid") else "another process")
      raise errors.WorkdirLockedError(
          f"{self.what} {os.path.dirname(self.path)!r} is in use by {who}"
          f"{self.held_by}; wait for it to finish or stop it, or use another --workdir."
      ) from None
    return fd

  def _record(self, fd: int) -> "WorkdirLock":
    prev = self.holder()
    if prev and prev.get("pid") and not (prev.get("host") == socket.gethostname()
                                         and prev.get("pid") == os.getpid()):
      self.took_over = prev
    record = {"pid": os.getpid(), "host": socket.gethostname(),
              "started": datetime.datetime.now().isoformat(timespec="seconds"),
              "command": " ".join(sys.argv)}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    os.fsync(fd)
    self._fd = fd
    return self

  def release(self, remove: bool = False) -> None:
    """Frees the lock; ``remove`` deletes the file (while still holding it)."""
    if self._fd is None:
      return
    try:
      os.ftruncate(self._fd, 0)  # an empty file: released cleanly, nothing to take over
      if remove:
        with contextlib.suppress(FileNotFoundError):
          os.remove(self.path)
    finally:
      fcntl.flock(self._fd, fcntl.LOCK_UN)
      os.close(self._fd)
      self._fd = None

  def __enter__(self) -> "WorkdirLock":
    return self.acquire()

  def __exit__(self, exc_type, *exc) -> None:
    self.release(remove=exc_type is None)


def describe_takeover(record: Mapping[str, Any]) -> str:
  """One line about a lock whose holder died without releasing it."""
  state = "no longer running" if not _pid_alive(int(record["pid"])) else "lock released"
  return (f"took over the lock of process {record['pid']} on {record.get('host')} "
          f"(started {record.get('started')}; {state}): that run was killed")


# ----------------------------------------------------------------------------- config


def config_dict(config: ml_collections.ConfigDict) -> dict:
  """``config`` as the plain JSON object that ``config.json`` stores."""
  return json.loads(config.to_json_best_effort())


def write_config(workdir: str, config: ml_collections.ConfigDict) -> None:
  """Writes ``workdir/config.json`` (atomically)."""
  metrics_lib.write_json(os.path.join(workdir, CONFIG_FILE), config_dict(config))


def _read_json(path: str) -> Any:
  with open(path) as f:
    return json.load(f)


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The config a run in ``workdir`` was trained with (its ``config.json``).

  Raises:
    ValueError: no ``config.json`` (not a run directory) or an unreadable one.
  """
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    raise ValueError(f"no {CONFIG_FILE} in {workdir!r}: not a training run directory.")
  try:
    return ml_collections.ConfigDict(_read_json(path))
  except (OSError, json.JSONDecodeError) as e:
    raise ValueError(f"{path!r} is not readable JSON ({e}).") from None


def load_final_metrics(workdir: str) -> dict | None:
  """``workdir/final_metrics.json`` or None when the run has not finished."""
  path = os.path.join(workdir, FINAL_METRICS_FILE)
  if not os.path.exists(path):
    return None
  try:
    return _read_json(path)
  except (OSError, json.JSONDecodeError):  # cut short: the run did not finish cleanly
    return None


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  out: dict[str, Any] = {}
  for k, v in d.items():
    if isinstance(v, Mapping):
      out.update(_flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def config_changes(stored: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, tuple]:
  """``{"field": (stored value, new value)}`` for every leaf that differs.

  A field missing from the stored config is not a change: configs gain fields with
  defaults that keep the old behaviour, and a config written before must stay resumable.
  """
  old, cur = _flatten(stored), _flatten(new)
  return {k: (old[k], v) for k, v in cur.items() if k in old and old[k] != v}


def used_mixers(mcfg: Mapping[str, Any]) -> set[str]:
  """The registry names of the mixers the model of ``config.model`` builds."""
  pattern = mcfg.get("pattern") or None
  if pattern is None:
    return {mcfg["mixer"]}
  from linear_attention import models  # the heavy imports only when a pattern is given
  layers = mcfg["num_layers"] if mcfg["num_layers"] > 0 else None
  return set(models.resolve_pattern(layers, None, pattern))


def _unused_mixer_prefixes(config: ml_collections.ConfigDict) -> tuple[str, ...]:
  """``model.mixer_kwargs.<name>.`` of every mixer the model does not build: options that
  change no parameter (a directory written before they were refused may hold any)."""
  model = config.get("model") or {}
  kwargs = model.get("mixer_kwargs") or {}
  if not kwargs or "mixer" not in model:
    return ()
  try:
    used = used_mixers(model)
  except ValueError:
    return ()
  return tuple(f"model.mixer_kwargs.{n}." for n in kwargs if n not in used)


def check_rerun_config(workdir: str, config: ml_collections.ConfigDict,
                       latest_step: int | None) -> str | None:
  """Compares ``config`` with the workdir's ``config.json`` before anything is written.

  Returns:
    None for a fresh workdir or an unchanged config; else one line saying what changed
    (e.g. ``train.steps`` extended).

  Raises:
    ConfigChangedError: a field that shapes the parameters, the optimiser state or the data
      changed (all such fields in one line), or ``train.steps`` went below the newest
      checkpoint.
  """
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    return None
  try:
    stored = _read_json(path)
  except (OSError, json.JSONDecodeError):
    if latest_step is None:  # nothing was trained from it: the new config replaces it
      return None
    raise errors.ConfigChangedError(
        f"{path!r} is unreadable but checkpoints exist; cannot tell whether they match this "
        "config. Use another --workdir, or restore config.json.") from None
  changes = config_changes(stored, config_dict(config))
  unused = _unused_mixer_prefixes(config)
  changes = {k: v for k, v in changes.items() if not k.startswith(unused)}
  if not changes:
    return None
  frozen = {k: v for k, v in changes.items()
            if not k.startswith(RESUMABLE_FIELDS) or k in FROZEN_FIELDS}
  if frozen and latest_step is None:  # nothing was trained with the stored config
    listed = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in sorted(changes.items()))
    return (f"{workdir} has no checkpoint: starting over with the new config ({listed}); "
            "config.json updated")
  if frozen:
    listed = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in sorted(frozen.items()))
    raise errors.ConfigChangedError(
        f"config differs from {path} in fields that shape the parameters, the optimiser or "
        f"the data: {listed}; rerun with the stored values, or use another --workdir.")
  steps = changes.get("train.steps")
  if steps and latest_step is not None and steps[1] < latest_step:
    raise errors.ConfigChangedError(
        f"train.steps {steps[0]} -> {steps[1]} is below the newest checkpoint (step "
        f"{latest_step}) in {workdir!r}; a run cannot be shortened after the fact.")
  parts = []
  if steps:
    verb = "extending" if steps[1] > steps[0] else "changing"
    parts.append(f"{verb} train.steps from {steps[0]} to {steps[1]} (the learning-rate "
                 "schedule follows the new length)")
  other = {k: v for k, v in changes.items() if k != "train.steps"}
  if other:
    parts.append("changed " + ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in sorted(other.items())))
  return "config.json updated: " + "; ".join(parts)


# ----------------------------------------------------------------------------- errors


def log_exception(workdir: str, error: BaseException) -> str | None:
  """Appends ``error``'s traceback to ``workdir/error.log``; returns its path (None if the
  workdir does not exist or cannot be written)."""
  if not os.path.isdir(workdir):
    return None
  path = os.path.join(workdir, ERROR_LOG)
  try:
    with open(path, "a") as f:
      f.write(f"--- {datetime.datetime.now().isoformat(timespec='seconds')} pid {os.getpid()}: "
              f"{' '.join(sys.argv)}\n")
      f.write("".join(traceback.format_exception(type(error), error, error.__traceback__)))
  except OSError:
    return None
  return path


def resolve_error_log(workdir: str) -> str | None:
  """Moves ``error.log`` (from an interrupted or failed attempt) into ``error.resolved.log``
  once the run has finished, so that a finished directory does not look failed; returns the
  new path, or None when there was no log (best effort: an I/O error leaves it in place)."""
  src = os.path.join(workdir, ERROR_LOG)
  if not os.path.exists(src):
    return None
  dest = os.path.join(workdir, RESOLVED_ERROR_LOG)
  try:
    with open(src) as f:
      text = f.read()
    with open(dest, "a") as f:
      f.write(text)
    os.remove(src)
  except OSError:
    return None
  return dest
