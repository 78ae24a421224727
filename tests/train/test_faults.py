"""Fault injection: damaged checkpoints, two runs on one workdir, a stopped sweep, a changed
config between runs, and the exit codes and one-line errors of each.

Every subprocess runs under a timeout (a hang is a failure) and is waited for by polling a
file with a deadline, never by sleeping a fixed time.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from linear_attention import train
from linear_attention.train import errors, rundir
from tests.helpers import wait_for
from tests.train.fake_data import FakeDataset, fake_config

# A damaged checkpoint leaves orbax coroutines that fail after the restore has moved on;
# they are reported (as unraisable) whenever they are collected, in whichever test.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT = 240  # seconds for any one subprocess


def _train(wd, cfg=None, ds=None, **kw):
  return train.train_and_evaluate(cfg or fake_config(steps=6), str(wd), dataset=ds or FakeDataset(),
                                  verbose=kw.pop("verbose", False), **kw)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
  """A finished 6-step run with checkpoints 2, 4 and 6, and its final metrics."""
  wd = tmp_path_factory.mktemp("base") / "run"
  cfg = fake_config(steps=6, keep_checkpoints=3, eval_every=0)
  final = _train(wd, cfg)
  assert sorted(os.listdir(wd / "checkpoints")) == ["2", "4", "6"]
  return wd, cfg, final


def _damage(step_dir, how):
  """Damages one checkpoint the three ways a disk or a kill does it."""
  d = os.path.join(step_dir, "default")
  if how == "metadata":
    os.remove(os.path.join(d, "_METADATA"))
  elif how == "truncate":  # every array file cut to 10 bytes (which file holds what varies)
    for name in glob.glob(os.path.join(d, "ocdbt.process_0", "d", "*")):
      with open(name, "r+b") as f:
        f.truncate(10)
  elif how == "manifest":
    for m in glob.glob(os.path.join(d, "**", "manifest.ocdbt"), recursive=True):
      with open(m, "wb") as f:
        f.write(b"not a manifest" * 10)
  else:
    raise ValueError(how)


# ----------------------------------------------------------------------------- checkpoints


def _abstract_state(cfg, ds):
  """The trainer's ``(model, optimiser)`` state for ``cfg``: the restore target."""
  from flax import nnx
  model = train.create_model(cfg.model, ds.vocab_size, ds.kind, ds.num_classes, 0)
  return nnx.state((model, train.make_optimizer(model, cfg.optim, cfg.train.steps)))


@pytest.mark.parametrize("how", ["metadata", "truncate", "manifest"])
def test_damaged_latest_checkpoint_is_skipped_in_one_line(finished_run, tmp_path, capfd, how):
  from linear_attention.train import checkpoint as ckpt_lib
  base, cfg, _ = finished_run
  wd = tmp_path / "run"
  shutil.copytree(base, wd)
  _damage(wd / "checkpoints" / "6", how)
  said = []
  ckpt = ckpt_lib.Checkpointer(str(wd), 2, 3, False)
  try:
    step, _ = ckpt.restore_latest(_abstract_state(cfg, FakeDataset()), say=said.append)
  finally:
    ckpt.close()
  err = capfd.readouterr().err
  assert step == 4
  assert len(said) == 1 and "checkpoint 6" in said[0] and "resuming from step 4" in said[0]
  assert "\n" not in said[0] and len(said[0]) < 400
  assert "Event loop is closed" not in err and "Traceback" not in err
  assert sorted(os.listdir(wd / "checkpoints")) == ["2", "4"]
  assert os.listdir(wd / "checkpoints_unreadable") == ["6"]
  assert "checkpoint 6" in (wd / "error.log").read_text()  # the noise went to the log


def test_damaged_latest_checkpoint_falls_back_and_finishes_identically(finished_run, tmp_path,
                                                                       capfd):
  base, cfg, final = finished_run
  wd = tmp_path / "run"
  shutil.copytree(base, wd)
  os.remove(wd / "final_metrics.json")  # as if killed after the last save
  _damage(wd / "checkpoints" / "6", "manifest")
  res = _train(wd, cfg, verbose=True)
  err = capfd.readouterr().err
  said = [ln for ln in err.splitlines() if "unreadable" in ln]
  assert len(said) == 1 and "checkpoint 6" in said[0] and "resuming from step 4" in said[0], err
  assert "Event loop is closed" not in err and "Traceback" not in err
  # The data and the optimiser state come back too: the rerun is the uninterrupted run.
  for k in ("train_loss", "validation_loss", "validation_accuracy"):
    assert res[k] == final[k], k
  assert sorted(os.listdir(wd / "checkpoints")) == ["2", "4", "6"]
  assert os.listdir(wd / "checkpoints_unreadable") == ["6"]
  # The noise went to the log, which the finished run then marked resolved.
  assert "checkpoint 6" in (wd / "error.resolved.log").read_text()
  assert not (wd / "error.log").exists()


def test_no_checkpoint_restores_one_line_naming_the_directory(finished_run, tmp_path):
  base, cfg, _ = finished_run
  wd = tmp_path / "run"
  shutil.copytree(base, wd)
  os.remove(wd / "final_metrics.json")
  for i, step in enumerate(("2", "4", "6")):
    _damage(wd / "checkpoints" / step, ["truncate", "manifest", "truncate"][i])
  with pytest.raises(errors.CheckpointError) as e:
    _train(wd, cfg)
  msg = str(e.value)
  assert "\n" not in msg and str(wd / "checkpoints") in msg and "steps 6, 4, 2" in msg
  assert "move that directory away" in msg
  assert errors.exit_code(e.value) == errors.EXIT_RUNTIME
  assert sorted(os.listdir(wd / "checkpoints")) == ["2", "4", "6"]  # nothing moved or lost


# ----------------------------------------------------------------------------- config


def test_config_change_is_refused_before_anything_is_written(finished_run, tmp_path):
  base, cfg, _ = finished_run
  wd = tmp_path / "run"
  shutil.copytree(base, wd)
  before = {p: (wd / p).read_bytes() for p in ("config.json", "metrics.jsonl")}
  changed = fake_config(steps=6, keep_checkpoints=3, eval_every=0)
  changed.model.d_model, changed.optim.lr, changed.train.seed = 32, 1e-2, 1
  with pytest.raises(errors.ConfigChangedError) as e:
    _train(wd, changed)
  msg = str(e.value)
  assert "\n" not in msg
  for field in ("model.d_model 16 -> 32", "optim.lr", "train.seed 0 -> 1"):
    assert field in msg, msg
  assert errors.exit_code(e.value) == errors.EXIT_CONFIG
  assert {p: (wd / p).read_bytes() for p in before} == before
  assert not (wd / "error.log").exists()


def test_extending_train_steps_is_allowed_and_said(finished_run, tmp_path, capfd):
  base, cfg, _ = finished_run
  wd = tmp_path / "run"
  shutil.copytree(base, wd)
  longer = fake_config(steps=8, keep_checkpoints=3, eval_every=0, log_every=4)
  res = _train(wd, longer, verbose=True)
  assert res["step"] == 8 and "extending train.steps from 6 to 8" in capfd.readouterr().err
  assert json.loads((wd / "config.json").read_text())["train"]["steps"] == 8
  shorter = fake_config(steps=4, keep_checkpoints=3, eval_every=0)
  with pytest.raises(errors.ConfigChangedError, match="below the newest checkpoint \\(step 8\\)"):
    _train(wd, shorter)


def test_a_config_json_written_before_new_fields_existed_still_resumes(finished_run, tmp_path):
  base, cfg, final = finished_run
  wd = tmp_path / "run"
  shutil.copytree(base, wd)
  stored = json.loads((wd / "config.json").read_text())
  del stored["train"]["keep_checkpoints"], stored["model"]["pooling"]  # an older format
  (wd / "config.json").write_text(json.dumps(stored))
  assert _train(wd, cfg) == final  # unchanged: already finished, nothing refused


# ----------------------------------------------------------------------------- lock


def test_lock_names_a_live_holder_and_takes_over_a_dead_one(tmp_path):
  holder = subprocess.Popen(
      [sys.executable, "-c", "import sys, time\nfrom linear_attention.train import rundir\n"
       "rundir.WorkdirLock(sys.argv[1]).acquire()\nprint('locked', flush=True)\ntime.sleep(120)",
       str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(errors.WorkdirLockedError, match=f"in use by process {holder.pid} on"):
      rundir.WorkdirLock(str(tmp_path)).acquire()
    holder.kill()
    holder.wait(timeout=30)
    lock = rundir.WorkdirLock(str(tmp_path)).acquire()
    assert lock.took_over["pid"] == holder.pid
    assert "no longer running" in rundir.describe_takeover(lock.took_over)
    lock.release()
    again = rundir.WorkdirLock(str(tmp_path)).acquire()  # released cleanly: nothing taken over
    assert again.took_over is None
    again.release()
  finally:
    holder.kill()
    holder.wait(timeout=30)


# ----------------------------------------------------------------------------- command line

SMOKE = ["--config.data.seq_len=16", "--config.data.num_kv_pairs=2",
         "--config.model.num_layers=1", "--config.model.d_model=16",
         "--config.train.eval_batches=1", "--config.train.eval_every=0",
         "--config.train.log_every=1"]


def _main(workdir, *flags):
  return [sys.executable, "-m", "linear_attention.main", "--config=configs/mqar.py:size=smoke",
          f"--workdir={workdir}", *SMOKE, *flags]


def _lock_holder(wd):
  try:
    return json.loads((wd / "run.lock").read_text())["pid"]
  except (OSError, ValueError, KeyError):
    return None


def test_second_trainer_on_a_workdir_refuses_at_once_naming_the_first(tmp_path):
  wd = tmp_path / "run"
  flags = ("--config.train.steps=100000", "--config.train.checkpoint_every=0")
  first = subprocess.Popen(_main(wd, *flags), cwd=ROOT, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
  try:
    wait_for(lambda: _lock_holder(wd) == first.pid, first, "the first run took the lock",
             TIMEOUT)
    config_before = (wd / "config.json").read_bytes() if (wd / "config.json").exists() else None
    second = subprocess.run(_main(wd, *flags), cwd=ROOT, capture_output=True, text=True,
                            timeout=TIMEOUT)
    lines = second.stderr.strip().splitlines()
    assert second.returncode == errors.EXIT_CONFIG, second.stderr[-2000:]
    assert lines[-1].startswith("error: ") and f"in use by process {first.pid}" in lines[-1]
    assert "Traceback" not in second.stderr and not (wd / "error.log").exists()
    assert first.poll() is None  # the first run goes on, untouched
    if config_before is not None:
      assert (wd / "config.json").read_bytes() == config_before
  finally:
    first.kill()
    first.wait(timeout=TIMEOUT)


def test_cli_exit_codes_and_one_error_line(tmp_path):
  # 2: a changed config, refused before anything is written.
  wd = tmp_path / "run"
  wd.mkdir()
  stored = {"model": {"d_model": 64}, "data": {"task": "mqar"}}
  (wd / "config.json").write_text(json.dumps(stored))
  # A checkpoint exists (without one, the changed run would start over).
  (wd / "checkpoints" / "7" / "default").mkdir(parents=True)
  p = subprocess.run(_main(wd, "--config.train.steps=2"), cwd=ROOT, capture_output=True,
                     text=True, timeout=TIMEOUT)
  assert p.returncode == errors.EXIT_CONFIG, p.stderr[-2000:]
  last = p.stderr.strip().splitlines()[-1]
  assert last.startswith("error: config differs") and "model.d_model 64 -> 16" in last
  assert json.loads((wd / "config.json").read_text()) == stored
  assert sorted(os.listdir(wd)) == ["checkpoints", "config.json", "run.lock"]
  # 1: no checkpoint restores; the traceback goes to error.log, one line to the terminal.
  (wd / "config.json").unlink()
  (wd / "checkpoints" / "7" / "default" / "_METADATA").write_text("garbage")
  bad = subprocess.run(_main(wd, "--config.train.steps=2"), cwd=ROOT, capture_output=True,
                       text=True, timeout=TIMEOUT)
  lines = bad.stderr.strip().splitlines()
  assert bad.returncode == errors.EXIT_RUNTIME, bad.stderr[-2000:]
  assert lines[-1].startswith("error: no checkpoint in ") and len(lines) <= 4, lines
  assert "Traceback" not in bad.stderr
  assert "Traceback" in (wd / "error.log").read_text()


SWEEP_CONFIG = """
from configs.mqar import get_config  # noqa: F401


def get_sweep(arg=None):
  return [{"model.mixer": "gla"}, {"model.mixer": "hawk"}]
"""


def test_stopping_a_sweep_stops_its_trainer(tmp_path):
  cfg = tmp_path / "cfgs" / "stop_sweep.py"
  cfg.parent.mkdir()
  cfg.write_text(SWEEP_CONFIG)
  wd = tmp_path / "sweep"
  sweep = subprocess.Popen(
      [sys.executable, "-m", "linear_attention.sweep", f"--config={cfg}:size=smoke",
       f"--workdir={wd}", "--workers=1", *SMOKE, "--config.train.steps=100000",
       "--config.train.checkpoint_every=0"],
      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  point = wd / "000-mixer=gla"
  child = None
  try:
    wait_for(lambda: _lock_holder(point) is not None, sweep, "the trainer started", TIMEOUT)
    child = _lock_holder(point)
    # Stopped once it trains (a SIGTERM during compilation ends it without a checkpoint).
    metrics = point / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and metrics.stat().st_size > 0, sweep, "the first step",
             TIMEOUT)
    sweep.send_signal(signal.SIGTERM)
    out, err = sweep.communicate(timeout=TIMEOUT)
    assert sweep.returncode == 3, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("error: the sweep was stopped")
    with pytest.raises(ProcessLookupError):
      os.kill(child, 0)
    rows = {r["point"]: r for r in json.loads((wd / "summary.json").read_text())}
    assert rows["000-mixer=gla"]["status"] == "stopped"
    assert rows["000-mixer=gla"]["returncode"] == errors.EXIT_PREEMPTED
    assert rows["001-mixer=hawk"]["status"] == "stopped"  # never started
    assert not (wd / "001-mixer=hawk").exists()
    assert "SIGTERM at step" in (point / "log.txt").read_text()
  finally:
    sweep.kill()
    sweep.wait(timeout=TIMEOUT)
    if child is not None:
      try:
        os.kill(child, signal.SIGKILL)
      except ProcessLookupError:
        pass


def test_non_finite_message_names_what_was_not_finite():
  from linear_attention.train import trainer
  assert trainer.non_finite_message(3, 1.5, float("nan"), "/x").startswith(
      "non-finite gradient norm at step 3")
  assert trainer.non_finite_message(3, float("inf"), float("nan"), "/x").startswith(
      "non-finite loss and gradient norm at step 3")


def test_out_of_vocabulary_ids_are_refused(tmp_path):
  with pytest.raises(errors.ConfigError, match="inputs id 20, outside the vocabulary of size 16"):
    _train(tmp_path / "a", ds=FakeDataset(bad_id_at=0, bad_id=20))
  assert not (tmp_path / "a").exists()  # the first batch is checked before anything is written
  with pytest.raises(errors.DataError, match="step 3 holds inputs id 20.*size 16"):
    _train(tmp_path / "b", ds=FakeDataset(bad_id_at=3, bad_id=20))
  neg = FakeDataset()
  b = neg.batch(0)
  b["targets"][1, -1] = -1
  with pytest.raises(errors.DataError, match="targets id -1"):
    train.trainer.check_batch(b, neg, 0, "train")
  b["mask"][1, -1] = 0.0  # not counted: its target is not read
  train.trainer.check_batch(b, neg, 0, "train")
