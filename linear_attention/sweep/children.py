"""The trainers a sweep runs as child processes, and stopping them (signals, grace, kill)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from typing import Any, Mapping, Sequence

from linear_attention.train import errors


# A stopped trainer's time to end its running dispatch and save before SIGKILL. Generous: a
# kill loses every step since the last checkpoint, and one dispatch of study_hybrid's 4-layer
# MQAR run is 5 fused steps of 3-5 s each on two shared cores, before its save; a hung
# trainer holds the sweep at most this long.
STOP_GRACE_S = 300.0


# The trainer's exit codes (``train.errors.EXIT_CODES``), for the summary.
EXIT_MEANINGS = {0: "done", 1: "runtime failure", 2: "bad config or workdir", 3: "preempted",
                 4: "non-finite loss", 130: "interrupted", -9: "killed (SIGKILL)",
                 -15: "terminated (SIGTERM)"}


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
