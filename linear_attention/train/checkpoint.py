"""Checkpoints with an orbax ``CheckpointManager``: interval, keep-N, async, preemption.

A checkpoint holds the model's variables, the optimiser state (with its step count) and,
as its orbax step, the number of completed training steps, which by the data contract is
also the data iterator's position. Orbax writes each checkpoint to a temporary directory
and renames it when complete, so a checkpoint cut short by a kill is never listed (and its
temporary directory is removed at the next start).

A checkpoint damaged after it was written (a truncated file, a lost ``_METADATA``, a
garbled manifest) is another matter: :meth:`Checkpointer.restore_latest` tries the newest
first and falls back to older ones, moving each unreadable one to ``checkpoints_unreadable/``
so that the resumed run can save that step again.
"""

from __future__ import annotations

import contextlib
import errno
import io
import logging
import os
import re
import shutil
import sys
import time
import traceback
from typing import Any, Callable

import jax
import numpy as np
import orbax.checkpoint as ocp

from linear_attention.train import errors
# Read without JAX by the sweep runner, so they live in rundir; here for the trainer's callers.
from linear_attention.train.rundir import CHECKPOINT_DIR, newest_step_on_disk  # noqa: F401

UNREADABLE_DIR = "checkpoints_unreadable"


def _first_line(error: BaseException) -> str:
  """A short reason: the first line of an orbax/TensorStore message (they run to pages)."""
  text = str(error).strip().splitlines()
  first = text[0].split(" See full TensorStore details")[0] if text else ""
  return f"{type(error).__name__}: {first[:160]}".rstrip(": ")


# The write errors a full disk (or a file size limit, or a quota) gives.
_NO_SPACE = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


def _write_errno(error: BaseException) -> int | None:
  """The OS error number behind a failed write: an ``OSError``'s, or the one TensorStore's
  message quotes (``[os_error_code='28']``)."""
  if isinstance(error, OSError) and error.errno:
    return error.errno
  found = re.search(r"os_error_code='(\d+)'", str(error))
  return int(found.group(1)) if found else None


def _drop_closed_loop_reports(previous):
  def hook(unraisable):
    exc = unraisable.exc_value
    if not (isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"):
      previous(unraisable)
  hook.drops_closed_loop_reports = True
  return hook


def quiet_closed_loop_reports() -> None:
  """Drops the "Event loop is closed" reports of a failed checkpoint write (idempotent).

  After a write fails, orbax closes its event loops while TensorStore's I/O threads still
  answer them; each late answer was printed as a 5-line unraisable traceback (about 50 for
  one full disk). They repeat the failure that the run reports in one line.
  """
  if not getattr(sys.unraisablehook, "drops_closed_loop_reports", False):
    sys.unraisablehook = _drop_closed_loop_reports(sys.unraisablehook)


class _OrbaxErrorsToLog(logging.Filter):
  """Sends orbax's ERROR records (each failed write of a save, with its traceback: hundreds
  of lines for one full disk) to ``path`` instead of the terminal; the failure itself reaches
  the trainer as one :class:`errors.CheckpointWriteError`."""

  def __init__(self, path: str | None):
    super().__init__()
    self.path = path

  def filter(self, record: logging.LogRecord) -> bool:
    if record.levelno < logging.ERROR or f"{os.sep}orbax{os.sep}" not in record.pathname:
      return True
    if self.path is not None:
      with contextlib.suppress(OSError):  # the disk may be the thing that is full
        with open(self.path, "a") as f:
          f.write(logging.Formatter("%(asctime)s %(name)s: %(message)s").format(record) + "\n")
    return False


def _wait_until_quiet(stream: io.StringIO, quiet_s: float = 0.2, limit_s: float = 3.0) -> None:
  """Waits until nothing was written to ``stream`` for ``quiet_s`` (at most ``limit_s``)."""
  deadline = time.monotonic() + limit_s
  size = -1
  while time.monotonic() < deadline and stream.tell() != size:
    size = stream.tell()
    time.sleep(quiet_s)


_READ_ONLY_NOTES = ("read_only=True, setting", "Given directory is read only")


class _DropMessages(logging.Filter):
  def __init__(self, fragments):
    super().__init__()
    self.fragments = fragments

  def filter(self, record):
    text = record.getMessage()
    return not any(f in text for f in self.fragments)


@contextlib.contextmanager
def _absl_filtered(fragments):
  """Drops absl log records containing any of ``fragments`` while the block runs."""
  f = _DropMessages(fragments)
  log = logging.getLogger("absl")
  log.addFilter(f)
  try:
    yield
  finally:
    log.removeFilter(f)


class Checkpointer:
  """Thin wrapper over ``ocp.CheckpointManager`` for one pytree of arrays.

  Args:
    workdir: run directory; checkpoints go to ``workdir/checkpoints/<step>``.
    every: save interval in steps (``<= 0``: only forced saves, e.g. at the end).
    keep: number of checkpoints kept (``<= 0``: all).
    async_save: write in a background thread while training continues.
    read_only: open for reading only (creates, cleans and moves nothing).
  """

  def __init__(self, workdir: str, every: int = 0, keep: int = 1, async_save: bool = True,
               read_only: bool = False):
    self.workdir = os.path.abspath(workdir)
    self.directory = os.path.join(self.workdir, CHECKPOINT_DIR)
    self.read_only = read_only
    self._last_save: int | None = None  # the step an asynchronous failure most likely hit
    if read_only:
      # Orbax warns three times that a read-only manager creates and saves nothing, which
      # is what was asked (every sample_text and load_checkpoint printed them).
      with _absl_filtered(_READ_ONLY_NOTES):
        self._options = ocp.CheckpointManagerOptions(read_only=True)
        self.manager = ocp.CheckpointManager(self.directory, options=self._options)
      return
    policies = [ocp.checkpoint_managers.PreemptionCheckpointingPolicy()]
    if every > 0:  # no save at the first step (orbax's default adds one)
      policies.append(ocp.checkpoint_managers.FixedIntervalPolicy(every))
    options = ocp.CheckpointManagerOptions(
        save_decision_policy=ocp.checkpoint_managers.AnySavePolicy(policies),
        max_to_keep=keep if keep > 0 else None,
        enable_async_checkpointing=async_save,
        create=True,
        cleanup_tmp_directories=True,
    )
    self._options = options
    self.manager = ocp.CheckpointManager(self.directory, options=options)
    quiet_closed_loop_reports()
    self._log_filter = _OrbaxErrorsToLog(
        os.path.join(self.workdir, "error.log") if jax.process_index() == 0 else None)
    logging.getLogger("absl").addFilter(self._log_filter)

  def _reopen(self) -> None:
    """A fresh manager: after a failed restore orbax's keeps what it guessed from the damaged
    step (a step without ``default/`` made it expect several items, and every older, intact
    step was then refused too)."""
    with contextlib.suppress(Exception):
      self.manager.close()
    self.manager = ocp.CheckpointManager(self.directory, options=self._options)

  def _missing_data(self, step: int) -> str | None:
    """Why ``step`` cannot hold a checkpoint without asking orbax (its ``default/`` item
    folder lost or empty), or None."""
    item = os.path.join(self.directory, str(step), "default")
    if not os.path.isdir(item):
      return f"its data folder {os.path.join(str(step), 'default')}/ is missing"
    if not os.listdir(item):
      return f"its data folder {os.path.join(str(step), 'default')}/ is empty"
    return None

  def latest_step(self) -> int | None:
    """The step of the newest complete checkpoint, or None."""
    return self.manager.latest_step()

  def should_save(self, step: int) -> bool:
    """True at the save interval and when a preemption sync point was reached (multi-host)."""
    return self.manager.should_save(step)

  def save(self, step: int, state: Any, force: bool = False) -> bool:
    """Saves ``state`` (a pytree of arrays) as ``step``; async unless configured otherwise.

    Raises:
      CheckpointWriteError: this save, or the previous asynchronous one, failed.
    """
    try:
      saved = self.manager.save(step, args=ocp.args.StandardSave(state), force=force)
    except Exception as e:  # noqa: BLE001 -- orbax raises bare ValueError for I/O errors
      raise self._write_failed(e, step) from e
    if saved:
      self._last_save = step
    return saved

  def _write_failed(self, error: BaseException, step: int | None
                    ) -> errors.CheckpointWriteError:
    """One line for a failed save: which step, why, and where a rerun resumes."""
    # An asynchronous save fails later, at the next save or wait: its path names its step.
    found = re.search(rf"{re.escape(CHECKPOINT_DIR)}/(\d+)\.orbax-checkpoint-tmp", str(error))
    step = int(found.group(1)) if found else step
    code = _write_errno(error)
    reason = (f"{os.strerror(code)} ({errno.errorcode.get(code, code)})" if code
              else _first_line(error))
    try:
      latest = self.manager.latest_step()
    except Exception:  # noqa: BLE001 -- the message must not fail too
      latest = None
    resume = f"from step {latest}" if latest else "from the start (no checkpoint was complete)"
    advice = "free some space (or raise the file size limit), then " if code in _NO_SPACE else ""
    what = "a checkpoint" if step is None else f"checkpoint {step}"
    return errors.CheckpointWriteError(
        f"{what} could not be written in {self.directory}: {reason}; {advice}rerun "
        f"the same command to resume {resume}.")

  def restore(self, step: int, target: Any) -> Any:
    """Restores ``step`` into the structure, dtypes and shardings of ``target``.

    ``target`` may hold arrays or ``jax.ShapeDtypeStruct`` with shardings.
    """
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
    return self.manager.restore(step, args=ocp.args.StandardRestore(abstract))

  def restore_raw(self, step: int | None = None) -> Any:
    """The arrays of ``step`` (default: the newest) as saved, as nested dicts.

    Raises:
      ValueError: no complete checkpoint (naming the directory).
    """
    step = self.latest_step() if step is None else step
    if step is None:
      raise ValueError(f"no complete checkpoint in {self.workdir!r}.")
    # NumPy targets built from the saved metadata: a checkpoint written by several devices
    # or processes then reads on any one host (without them orbax refuses the topology).
    meta = ocp.StandardCheckpointer().metadata(
        os.path.join(str(self.directory), str(step), "default"))
    tree = getattr(getattr(meta, "item_metadata", meta), "tree", meta)
    target = jax.tree.map(lambda m: np.zeros(m.shape, m.dtype), tree)
    return self.manager.restore(step, args=ocp.args.StandardRestore(target))

  def restore_latest(self, target: Any, say: Callable[[str], None] | None = None
                     ) -> tuple[int, Any]:
    """Restores the newest checkpoint that can be read into ``target``.

    Each unreadable one (newer than the one restored: damaged files, or a step folder whose
    ``default/`` data was lost or emptied) is moved to ``checkpoints_unreadable/``; one line
    through ``say`` names the skipped steps, why, and the step resumed from.

    Returns:
      ``(step, state)``; ``(0, target)`` when there is no checkpoint.

    Raises:
      CheckpointError: there are checkpoints and none restores (one line naming the
        directory and what to do).
    """
    failed: list[tuple[int, str]] = []
    noise = io.StringIO()
    for step in sorted(self.manager.all_steps(), reverse=True):
      missing = self._missing_data(step)
      if missing:
        failed.append((step, missing))
        continue
      if failed:
        self._reopen()
      try:
        # A damaged checkpoint makes TensorStore's reader threads print pages of "Event loop
        # is closed" tracebacks; they go to the error log, not the terminal.
        with contextlib.redirect_stderr(noise):
          try:
            state = self.restore(step, target)
          except Exception:
            _wait_until_quiet(noise)  # reads still in flight report after the raise
            raise
      except Exception as e:  # orbax and TensorStore raise bare Exception for damaged files
        failed.append((step, _first_line(e)))
        noise.write(f"checkpoint {step}:\n" + "".join(traceback.format_exception(e)))
        continue
      if not failed:
        sys.stderr.write(noise.getvalue())  # nothing went wrong: whatever was said, say it
      else:
        self._log(noise.getvalue())
        self._set_aside([s for s, _ in failed])
        if say is not None:  # one line for all the skipped steps
          if len(failed) == 1:
            what = f"checkpoint {failed[0][0]} in {self.directory} is unreadable ({failed[0][1]})"
          else:
            what = (f"checkpoints {', '.join(str(s) for s, _ in failed)} in {self.directory} "
                    f"are unreadable ({'; '.join(f'{s}: {why}' for s, why in failed)})")
          say(f"{what}; moved to {UNREADABLE_DIR}/, resuming from step {step}")
      return step, state
    if failed:
      self._log(noise.getvalue())
      steps = ", ".join(str(s) for s, _ in failed)
      raise errors.CheckpointError(
          f"no checkpoint in {self.directory} can be restored (steps {steps}; newest: "
          f"{failed[0][1]}); move that directory away to start the run over, or use another "
          "--workdir.")
    return 0, target

  def _log(self, text: str) -> None:
    """Appends the failed restores' tracebacks to ``workdir/error.log`` (best effort)."""
    if self.read_only or not text or jax.process_index() != 0:
      return
    try:
      with open(os.path.join(self.workdir, "error.log"), "a") as f:
        f.write(f"--- restoring from {self.directory}\n{text}")
    except OSError:
      pass

  def _set_aside(self, steps: list[int]) -> None:
    """Moves the damaged ``steps`` out of orbax's view (kept for inspection, not deleted)."""
    if self.read_only or jax.process_index() != 0:
      return
    dest = os.path.join(self.workdir, UNREADABLE_DIR)
    os.makedirs(dest, exist_ok=True)
    for s in steps:
      src = os.path.join(self.directory, str(s))
      target = os.path.join(dest, str(s))
      n = 1
      while os.path.exists(target):  # damaged twice at the same step
        target = os.path.join(dest, f"{s}.{n}")
        n += 1
      shutil.move(src, target)
    self.manager.reload()

  def wait_until_finished(self) -> None:
    """Waits for an asynchronous save.

    Raises:
      CheckpointWriteError: it failed.
    """
    try:
      self.manager.wait_until_finished()
    except Exception as e:  # noqa: BLE001 -- as in save()
      raise self._write_failed(e, self._last_save) from e

  def close(self) -> None:
    """Waits for a pending save and closes the manager.

    Raises:
      CheckpointWriteError: the pending save failed (the manager is closed all the same).
    """
    failed = None
    try:
      if not self.read_only:
        self.wait_until_finished()
    except errors.CheckpointWriteError as e:
      failed = e
    try:
      self.manager.close()
    except Exception:  # noqa: BLE001 -- after a failed save, that failure is the one to report
      if failed is None:
        raise
    finally:
      if not self.read_only:
        logging.getLogger("absl").removeFilter(self._log_filter)
    if failed is not None:
      raise failed
