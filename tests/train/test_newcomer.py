"""What a new user met in a finished run (issue 41 item 7): checkpoint folders at steps the
progress lines show, no ``run.lock`` left behind, no orbax notes on a read-only open."""

from __future__ import annotations

import importlib
import logging
import os

import pytest

from linear_attention import train
from linear_attention.train import checkpoint as ckpt_lib
from linear_attention.train import rundir
from tests.train.fake_data import FakeDataset, fake_config

CONFIGS = ("mqar", "listops", "text_lm", "selective_copying", "induction_heads")


@pytest.mark.parametrize("name", CONFIGS)
def test_every_size_checkpoints_at_a_logged_step(name):
  mod = importlib.import_module(f"configs.{name}")
  for size in mod.SIZES:
    t = mod.get_config(f"size={size}").train
    # Before: mqar smoke saved 37, 74, 111, 148 while its lines showed 25, 50, 75, ...
    assert t.checkpoint_every % t.log_every == 0, (size, t.checkpoint_every, t.log_every)
    assert t.steps % t.checkpoint_every == 0 or t.checkpoint_every <= t.steps // 2, size


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
  wd = tmp_path_factory.mktemp("newcomer") / "run"
  train.train_and_evaluate(fake_config(steps=2, checkpoint_every=2, eval_every=0), str(wd),
                           dataset=FakeDataset(), verbose=False)
  return wd


def test_a_finished_run_leaves_no_lock_file(finished):
  assert not (finished / rundir.LOCK_FILE).exists(), os.listdir(finished)


def test_a_removed_lock_file_is_locked_anew(tmp_path):
  first = rundir.WorkdirLock(str(tmp_path)).acquire()
  stale = os.open(tmp_path / rundir.LOCK_FILE, os.O_RDWR)  # opened before the removal
  first.release(remove=True)
  assert not (tmp_path / rundir.LOCK_FILE).exists()
  second = rundir.WorkdirLock(str(tmp_path)).acquire()
  assert os.fstat(stale).st_ino != os.stat(tmp_path / rundir.LOCK_FILE).st_ino
  os.close(stale)
  second.release()
  assert (tmp_path / rundir.LOCK_FILE).exists()  # a plain release (an error) keeps it


def test_reading_a_run_prints_no_read_only_notes(finished, caplog):
  caplog.set_level(logging.INFO)
  c = ckpt_lib.Checkpointer(str(finished), read_only=True)
  assert c.latest_step() == 2
  c.close()
  said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
  assert not [m for m in said if "read only" in m or "read_only" in m], said
