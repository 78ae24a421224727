"""A checkpoint that cannot be written (a full disk, a file size limit): one clean line.

Before the fix a run whose checkpoint write failed printed 400-650 lines of orbax logs and
asyncio "Event loop is closed" tracebacks, with TensorStore's full message as the error.
The end-to-end case reproduces a full disk with a file size limit (``RLIMIT_FSIZE``: writes
past it fail with EFBIG), which needs no root and no special filesystem.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import resource
import subprocess
import sys
import types

import numpy as np
import pytest

from linear_attention.train import checkpoint as ckpt_lib
from linear_attention.train import errors

# A failed save leaves orbax coroutines that fail when they are collected, in whichever test.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT = 240

# Two layers: the checkpoint's metadata files (about 15 KB) exceed the limit below, while
# config.json (about 5 KB), the metrics and the TensorBoard events stay under it.
FLAGS = ["--config=configs/mqar.py:size=smoke", "--config.data.seq_len=16",
         "--config.data.num_kv_pairs=2", "--config.model.num_layers=2",
         "--config.model.d_model=16", "--config.train.eval_batches=1",
         "--config.train.eval_every=0", "--config.train.log_every=1", "--config.train.steps=4",
         "--config.train.checkpoint_every=2"]
FILE_LIMIT = 8 * 1024


def _run(workdir, limit=None):
  def set_limit():
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
  return subprocess.run([sys.executable, "-m", "linear_attention.main", f"--workdir={workdir}",
                         *FLAGS], cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT,
                        preexec_fn=set_limit if limit else None)


def test_a_full_disk_during_a_save_ends_in_one_line_and_a_rerun_finishes(tmp_path):
  wd = tmp_path / "run"
  p = _run(wd, FILE_LIMIT)
  out = (p.stdout + p.stderr).strip().splitlines()
  assert p.returncode == errors.EXIT_RUNTIME, p.stderr[-3000:]
  assert os.path.getsize(wd / "config.json") < FILE_LIMIT  # the limit hit the checkpoint only
  last = p.stderr.strip().splitlines()[-1]
  assert last.startswith("error: checkpoint 2 could not be written in "), last
  assert "File too large (EFBIG)" in last and "free some space" in last
  assert "resume from the start (no checkpoint was complete)" in last
  assert "Traceback" not in p.stderr and "Event loop is closed" not in p.stderr
  assert len(out) <= 12, out  # overrides, start, compiling, 4 steps, the error line
  assert not ckpt_lib.newest_step_on_disk(str(wd))  # the failed save left no complete step

  rerun = _run(wd)  # space again: the same command finishes
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert json.loads((wd / "final_metrics.json").read_text())["step"] == 4
  kept = os.listdir(wd / "checkpoints")
  assert "4" in kept and not [n for n in kept if "tmp" in n], kept  # the failed save's removed


def test_a_failed_save_names_its_step_the_reason_and_where_a_rerun_resumes(tmp_path,
                                                                         monkeypatch):
  ck = ckpt_lib.Checkpointer(str(tmp_path), every=2, keep=3, async_save=False)
  try:
    ck.save(2, {"w": np.ones(3, np.float32)})
    # TensorStore's message for an asynchronous save of step 4 that ran out of space.
    tensorstore = ValueError(
        'OUT_OF_RANGE: Error writing "w" in OCDBT database at local file '
        f'"{tmp_path}/checkpoints/4.orbax-checkpoint-tmp/default/": Failed to write 100 bytes '
        "to file 9: No space left on device [os_error_code='28']")

    def fail(*args, **kwargs):
      raise tensorstore

    monkeypatch.setattr(ck.manager, "save", fail)
    with pytest.raises(errors.CheckpointWriteError) as e:
      ck.save(6, {"w": np.ones(3, np.float32)})
    msg = str(e.value)
    assert msg.startswith(f"checkpoint 4 could not be written in {tmp_path}/checkpoints: "
                          "No space left on device (ENOSPC); free some space"), msg
    assert msg.endswith("resume from step 2.") and "\n" not in msg
    assert errors.exit_code(e.value) == errors.EXIT_RUNTIME

    def denied(*args, **kwargs):
      raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(ck.manager, "save", denied)
    with pytest.raises(errors.CheckpointWriteError, match=r"checkpoint 8 .*Permission denied "
                       r"\(EACCES\); rerun the same command to resume from step 2"):
      ck.save(8, {"w": np.ones(3, np.float32)})
  finally:
    monkeypatch.undo()
    ck.close()


def test_closed_loop_reports_are_dropped_and_other_unraisables_kept(monkeypatch):
  seen = []
  monkeypatch.setattr(sys, "unraisablehook", seen.append)
  ckpt_lib.quiet_closed_loop_reports()
  ckpt_lib.quiet_closed_loop_reports()  # installed once
  report = lambda exc: types.SimpleNamespace(exc_type=type(exc), exc_value=exc,  # noqa: E731
                                             exc_traceback=None, err_msg=None, object=None)
  sys.unraisablehook(report(RuntimeError("Event loop is closed")))
  assert seen == []
  other = report(RuntimeError("something else"))
  sys.unraisablehook(other)
  assert seen == [other]


def test_orbax_errors_go_to_the_log_file_not_the_terminal(tmp_path):
  log = tmp_path / "error.log"
  f = ckpt_lib._OrbaxErrorsToLog(str(log))

  def record(path, level):
    return logging.LogRecord("absl", level, path, 1, "write failed: %s", ("EFBIG",), None)

  orbax = os.path.join("site-packages", "orbax", "checkpoint", "future.py")
  assert not f.filter(record(orbax, logging.ERROR))
  assert "write failed: EFBIG" in log.read_text()
  assert f.filter(record(orbax, logging.WARNING))  # warnings still show
  assert f.filter(record(os.path.join("site-packages", "jax", "x.py"), logging.ERROR))
