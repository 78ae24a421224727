"""Stopping a sweep, a study or a trainer with SIGTERM/SIGINT: every running trainer saves a
checkpoint and exits, the parent waits for it (killing a hung one after ``--stop-grace``
and saying so), the message names the checkpoint each saved (or says none was), and the
rerun resumes there.

The fast tests run the sweep in this process with fake trainers (a few lines of Python that
save a "checkpoint" directory on SIGTERM, or hang); the signal goes to this process, as a
scheduler's ``kill`` does. The last tests run real trainers. Every wait has a deadline, so a
bug fails the test instead of hanging it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from linear_attention import sweep
from linear_attention.train import errors
from tests.helpers import wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEADLINE_S = 60  # for any one wait on a fake trainer
TIMEOUT = 300  # for any one real trainer or sweep

# A trainer stand-in: says "training" in its log (the sweep's log.txt), then on SIGTERM
# writes checkpoints/<step>/ and exits 3 as the trainer does; "hang" ignores SIGTERM.
FAKE_TRAINER = """
import os, signal, sys, time
workdir, mode, step = sys.argv[1], sys.argv[2], sys.argv[3]
if mode == "typo":  # as the trainer refuses a bad sweep-wide --config flag
  print("error: invalid config override in ['--config.train.stepz=3']: no such config field: "
        "stepz", flush=True)
  sys.exit(2)

def on_term(signum, frame):
  if mode == "hang":
    return
  time.sleep(1.0)  # the save takes a while: a second signal to the sweep arrives meanwhile
  os.makedirs(os.path.join(workdir, "checkpoints", step))
  print(f"error: SIGTERM at step {step}; checkpoint saved", flush=True)
  os._exit(3)

signal.signal(signal.SIGTERM, on_term)
with open(os.path.join(workdir, "pid"), "w") as f:
  f.write(str(os.getpid()))
print("training", flush=True)
deadline = time.monotonic() + 120  # never outlives a broken test by much
while time.monotonic() < deadline:
  time.sleep(0.02)
sys.exit(1)
"""


@pytest.fixture
def fake_trainers(tmp_path, monkeypatch):
  """Points run the fake trainer: override ``mode`` ("save" or "hang") and ``step``."""
  script = tmp_path / "fake_trainer.py"
  script.write_text(FAKE_TRAINER)

  def command(config_arg, workdir, overrides, extra_flags=()):
    return [sys.executable, str(script), workdir, overrides["mode"], str(overrides["step"])]

  monkeypatch.setattr(sweep.runner, "point_command", command)
  return tmp_path / "sweep"


def _training(point_dir) -> bool:
  try:
    return "training" in (point_dir / "log.txt").read_text()
  except OSError:
    return False


def _signal_when_training(point_dirs, signums, gap_s=0.05):
  """A thread that, once every point in ``point_dirs`` says "training", sends ``signums`` to
  this process one after another; past the deadline it kills the fake trainers instead, so
  that a sweep which does not stop them ends (and the test fails on its assertions)."""
  def run():
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline and not all(_training(d) for d in point_dirs):
      time.sleep(0.02)
    for s in signums:
      os.kill(os.getpid(), s)
      time.sleep(gap_s)
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline and not done.is_set():
      time.sleep(0.05)
    for d in point_dirs:  # the sweep failed to end them
      try:
        os.kill(int((d / "pid").read_text()), signal.SIGKILL)
      except (OSError, ValueError):
        pass

  done = threading.Event()
  t = threading.Thread(target=run, daemon=True)
  t.start()
  return done


def _assert_dead(point_dir):
  pid = int((point_dir / "pid").read_text())
  deadline = time.monotonic() + 10
  while time.monotonic() < deadline:
    try:
      os.kill(pid, 0)
    except ProcessLookupError:
      return
    time.sleep(0.05)
  raise AssertionError(f"the fake trainer {pid} still runs")


def test_a_repeated_stop_signal_lets_every_trainer_save(fake_trainers, capfd):
  # SIGTERM then SIGINT (a `kill` and then a Ctrl-C, or one stop delivered to the process
  # and to its group). Before: the second signal SIGKILLed the trainers, no checkpoint was
  # written, and the message still said "their trainers saved checkpoints".
  wd = fake_trainers
  points = [{"mode": "save", "step": 7}, {"mode": "save", "step": 9},
            {"mode": "save", "step": 11}]
  names = sweep.point_dirs(str(wd), points)
  running = [wd / n for n in names[:2]]
  done = _signal_when_training(running, [signal.SIGTERM, signal.SIGINT])
  try:
    with pytest.raises(sweep.SweepStoppedError) as stop:
      sweep.run_sweep("unused.py", str(wd), workers=2, points=points, stop_grace_s=30)
  finally:
    done.set()
  msg = str(stop.value)
  assert "2 of 2 stopped trainer(s) saved a checkpoint" in msg, msg
  assert f"{names[0]}: saved a checkpoint at step 7" in msg, msg
  assert f"{names[1]}: saved a checkpoint at step 9" in msg, msg
  assert "1 point(s) not started" in msg, msg
  for d, step in zip(running, ("7", "9")):
    assert os.listdir(d / "checkpoints") == [step]
    _assert_dead(d)
  assert not (wd / names[2]).exists()
  rows = {r["point"]: r for r in json.loads((wd / "summary.json").read_text())}
  assert rows[names[0]]["returncode"] == errors.EXIT_PREEMPTED
  assert rows[names[0]]["checkpoint_step"] == 7 and rows[names[0]]["saved_on_stop"]
  assert rows[names[2]]["status"] == "stopped" and rows[names[2]]["returncode"] is None
  err = capfd.readouterr().err
  assert "SIGTERM: stopping the sweep; 2 running trainer(s) save a checkpoint" in err, err
  assert "SIGINT: still waiting for" in err, err


def test_a_hung_trainer_is_killed_after_the_grace_and_the_message_says_so(fake_trainers):
  wd = fake_trainers
  points = [{"mode": "hang", "step": 5}, {"mode": "save", "step": 3}]
  names = sweep.point_dirs(str(wd), points)
  running = [wd / n for n in names]
  done = _signal_when_training(running, [signal.SIGTERM])
  t0 = time.monotonic()
  try:
    with pytest.raises(sweep.SweepStoppedError) as stop:
      sweep.run_sweep("unused.py", str(wd), workers=2, points=points, stop_grace_s=1.5)
  finally:
    done.set()
  assert time.monotonic() - t0 < DEADLINE_S  # the sweep did not wait for the helper's kill
  msg = str(stop.value)
  assert "1 of 2 stopped trainer(s) saved a checkpoint" in msg, msg
  assert (f"{names[0]}: killed after 1.5 s (--stop-grace) without saving a checkpoint; a "
          "rerun starts at step 0") in msg, msg
  assert f"{names[1]}: saved a checkpoint at step 3" in msg, msg
  _assert_dead(running[0])
  assert not (running[0] / "checkpoints").exists()


def test_a_third_signal_kills_and_says_no_checkpoint_was_saved(fake_trainers):
  wd = fake_trainers
  points = [{"mode": "hang", "step": 5}]
  names = sweep.point_dirs(str(wd), points)
  (wd / names[0] / "checkpoints" / "2").mkdir(parents=True)  # from an earlier run
  done = _signal_when_training([wd / names[0]], [signal.SIGTERM] * 3, gap_s=0.2)
  try:
    with pytest.raises(sweep.SweepStoppedError) as stop:
      sweep.run_sweep("unused.py", str(wd), points=points, stop_grace_s=DEADLINE_S)
  finally:
    done.set()
  msg = str(stop.value)
  assert ("0 of 1 stopped trainer(s) saved a checkpoint (000-mode=hang,step=5: killed by a "
          "third SIGTERM without saving a checkpoint; a rerun resumes at step 2)") in msg, msg


def test_a_stopped_point_job_names_its_checkpoint(fake_trainers, tmp_path):
  wd = fake_trainers
  cfg = tmp_path / "cfgs" / "fake.py"
  cfg.parent.mkdir()
  cfg.write_text("def get_sweep():\n  return [{'mode': 'save', 'step': 4}]\n")
  name = sweep.point_dirs(str(wd), [{"mode": "save", "step": 4}])[0]
  done = _signal_when_training([wd / name], [signal.SIGTERM])
  try:
    with pytest.raises(sweep.SweepStoppedError,
                       match=r"point 0 \(000-mode=save,step=4\) was stopped: saved a "
                             r"checkpoint at step 4\. Rerun"):
      sweep.run_one(str(cfg), str(wd), 0, stop_grace_s=30)
  finally:
    done.set()


def test_stop_grace_must_be_positive(tmp_path):
  with pytest.raises(ValueError, match=r"--stop-grace\) must be > 0 seconds, got 0"):
    sweep.run_sweep("unused.py", str(tmp_path), points=[{"a": 1}], stop_grace_s=0)
  assert sweep.main(["--config=x.py", f"--workdir={tmp_path}", "--stop-grace=-1"]) == 2


def test_a_stopped_study_ends_in_one_error_line_and_exit_3(fake_trainers, capfd):
  # Before: the SweepStoppedError's traceback, exit 1.
  sys.path.insert(0, os.path.join(ROOT, "experiments", "studies"))
  try:
    import _study_utils as su
  finally:
    sys.path.pop(0)
  wd = fake_trainers
  points = [{"mode": "save", "step": 6}]
  name = sweep.point_dirs(str(wd), points)[0]
  done = _signal_when_training([wd / name], [signal.SIGTERM])
  try:
    with pytest.raises(SystemExit) as stop:
      su.train_grid("unused.py", points, str(wd))
  finally:
    done.set()
  assert stop.value.code == 3
  err = capfd.readouterr().err.strip().splitlines()
  assert err[-1].startswith("error: the sweep was stopped; 1 of 1 stopped trainer(s) saved a "
                            f"checkpoint ({name}: saved a checkpoint at step 6)"), err


def test_a_bad_sweep_wide_flag_stops_the_sweep_after_one_point(fake_trainers, capsys):
  # Before: every point's trainer started and was refused in turn (22 starts for the smoke
  # sweep), each recorded failed.
  wd = fake_trainers
  points = [{"mode": "typo", "step": i} for i in range(4)]
  with pytest.raises(ValueError, match=r"a flag given to every point is invalid, no further "
                     r"point was started \(1 ran\): invalid config override in "
                     r"\['--config.train.stepz=3'\]"):
    sweep.run_sweep("unused.py", str(wd), points=points, extra_flags=["--config.train.stepz=3"])
  assert len([n for n in os.listdir(wd) if n[:3].isdigit()]) == 1
  rows = json.loads((wd / "summary.json").read_text())
  assert [r["status"] for r in rows] == ["failed", "not run", "not run", "not run"]
  # The same refusal of a flag the sweep does not give every point: each point still runs.
  rows = sweep.run_sweep("unused.py", str(wd / "own"), points=points[:2])
  assert [r["status"] for r in rows] == ["failed", "failed"]


FAKE_STUDY = """
import os, signal, sys, time
marker = sys.argv[1]

def on_term(signum, frame):
  time.sleep(0.5)  # its trainers saving
  with open(marker, "w") as f:
    f.write("saved")
  print("error: the sweep was stopped", flush=True)
  os._exit(3)

signal.signal(signal.SIGTERM, on_term)
print("training", flush=True)
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
  time.sleep(0.02)
"""
RUN_STUDIES = """
import sys
sys.path.insert(0, "experiments/studies")
import run_studies
script, marker, logs = sys.argv[1:4]
run_studies.STUDIES = {"fake": (script, marker)}
run_studies.LOGS = logs
sys.exit(run_studies.main(["--only", "fake", "--results", logs, "--no-notebooks"]))
"""


def test_a_stopped_run_studies_stops_its_study_and_waits_for_it(tmp_path):
  # Before: `kill` of run_studies.py ended it at once (exit -15) and left the study training.
  (tmp_path / "study.py").write_text(FAKE_STUDY)
  marker, logs = tmp_path / "saved", tmp_path / "logs"
  proc = subprocess.Popen([sys.executable, "-c", RUN_STUDIES, str(tmp_path / "study.py"),
                           str(marker), str(logs)], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  try:
    log = logs / "fake.log"
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline and "training" not in (
        log.read_text() if log.exists() else ""):
      assert proc.poll() is None, proc.communicate()
      time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=DEADLINE_S)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  assert proc.returncode == 3, err
  assert marker.read_text() == "saved"  # the study got the stop and was waited for
  assert err.strip().splitlines()[-1].startswith("error: SIGTERM stopped study fake (exit 3"), err


# ----------------------------------------------------------------------------- real trainers


SWEEP_CONFIG = """
from configs.mqar import get_config  # noqa: F401


def get_sweep(arg=None):
  return [{"model.mixer": "gla"}]
"""
# Fast steps, one checkpoint only at the end of 100000 steps: the stop's save is the only one.
TINY = ["--config.train.steps=100000", "--config.train.checkpoint_every=100000",
        "--config.train.eval_every=0", "--config.train.log_every=1",
        "--config.data.seq_len=16", "--config.data.num_kv_pairs=2",
        "--config.model.num_layers=1"]


def _lines(path) -> list[str]:
  try:
    return path.read_text().splitlines()
  except OSError:
    return []


def test_sigterm_to_a_sweep_saves_the_trainer_and_the_rerun_resumes_there(tmp_path):
  cfg = tmp_path / "cfgs" / "stop_sweep.py"
  cfg.parent.mkdir()
  cfg.write_text(SWEEP_CONFIG)
  wd = tmp_path / "sweep"
  cmd = [sys.executable, "-m", "linear_attention.sweep", f"--config={cfg}:size=smoke",
         f"--workdir={wd}", *TINY]
  point = wd / "000-mixer=gla"
  metrics = point / "metrics.jsonl"

  def run_and_stop(marker):
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
      wait_for(marker, proc, "the trainer trained", TIMEOUT)
      proc.send_signal(signal.SIGTERM)
      time.sleep(0.1)
      proc.send_signal(signal.SIGTERM)  # delivered twice (process, then its group)
      out, err = proc.communicate(timeout=TIMEOUT)
    finally:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
    return proc.returncode, err.strip().splitlines()

  code, err = run_and_stop(lambda: len(_lines(metrics)) >= 1)
  assert code == 3, err[-20:]
  saved = int(os.listdir(point / "checkpoints")[0])
  assert err[-1].startswith("error: the sweep was stopped; 1 of 1 stopped trainer(s) saved a "
                            f"checkpoint (000-mixer=gla: saved a checkpoint at step {saved})"), err
  assert f"SIGTERM at step {saved}; checkpoint saved" in (point / "log.txt").read_text()
  # The same command again resumes there (and is stopped again once it says so).
  resumed = f"resuming at step {saved} of 100000"
  code, err = run_and_stop(lambda: any(resumed in ln for ln in _lines(point / "log.txt")))
  assert code == 3, err[-20:]


def test_sigterm_while_a_trainer_starts_exits_130_in_one_line(tmp_path):
  # Before: SIGTERM's default, a silent exit -15 (a sweep could not tell it from a kill).
  proc = subprocess.Popen(
      [sys.executable, "-m", "linear_attention.main",
       "--config=configs/mqar.py:mixer=gla,size=smoke", f"--workdir={tmp_path / 'run'}",
       *TINY], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  killer = threading.Timer(TIMEOUT, proc.kill)  # a silent trainer cannot block readline
  killer.start()
  try:
    first = proc.stderr.readline()  # "overrides: ...", printed during start-up
    assert first.startswith("overrides:"), first
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=TIMEOUT)
  finally:
    killer.cancel()
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  lines = err.strip().splitlines()
  assert proc.returncode == errors.EXIT_INTERRUPTED, err[-2000:]
  assert lines[-1].startswith("error: interrupted; rerun the same command"), lines
  assert "Traceback" not in err


# ----------------------------------------------------------------------------- a killed parent


LIFELINE_CHILD = """
import os, signal, sys, time
from linear_attention.train import lifeline
tmp = sys.argv[1]

def on_term(signum, frame):  # the trainer's stop: save, exit 3
  with open(os.path.join(tmp, "stopped"), "w") as f:
    f.write("saved")
  os._exit(3)

signal.signal(signal.SIGTERM, on_term)
watching = lifeline.watch("the test's parent")
with open(os.path.join(tmp, "ready"), "w") as f:
  f.write(f"{watching} {os.environ.get(lifeline.ENV)}")
deadline = time.monotonic() + 120  # never outlives a broken test by much
while time.monotonic() < deadline:
  time.sleep(0.02)
"""
LIFELINE_PARENT = """
import os, subprocess, sys, time
from linear_attention.train import lifeline
tmp, child_code = sys.argv[1:3]
with open(os.path.join(tmp, "child.err"), "w") as err:
  child = subprocess.Popen([sys.executable, "-c", child_code, tmp], stderr=err,
                           start_new_session=True, **lifeline.popen_kwargs())
# Started after the pipe exists, without it: must not hold its write end open.
plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(child.pid, plain.pid, flush=True)
time.sleep(120)
"""


def _kill_quietly(*pids):
  for pid in pids:
    try:
      os.kill(pid, signal.SIGKILL)
    except OSError:
      pass


def test_a_child_stops_through_its_lifeline_when_its_parent_is_sigkilled(tmp_path):
  parent = subprocess.Popen([sys.executable, "-c", LIFELINE_PARENT, str(tmp_path),
                             LIFELINE_CHILD], cwd=ROOT, stdout=subprocess.PIPE, text=True)
  killer = threading.Timer(DEADLINE_S, parent.kill)  # a silent parent cannot block readline
  killer.start()
  pids = []
  try:
    pids = [int(p) for p in parent.stdout.readline().split()]
    wait_for((tmp_path / "ready").exists, parent, "the child watched", DEADLINE_S)
    assert (tmp_path / "ready").read_text() == "True None"  # the variable is not passed on
    assert not (tmp_path / "stopped").exists()
    parent.kill()  # SIGKILL: the parent stops nothing itself
    parent.wait()
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline and not (tmp_path / "stopped").exists():
      time.sleep(0.05)
  finally:
    killer.cancel()
    parent.kill()
    parent.wait()
    _kill_quietly(*pids)
  assert (tmp_path / "stopped").read_text() == "saved"
  assert "the test's parent has exited: stopping" in (tmp_path / "child.err").read_text()


def test_watch_without_a_lifeline_does_nothing(tmp_path, monkeypatch):
  from linear_attention.train import lifeline
  monkeypatch.delenv(lifeline.ENV, raising=False)
  assert not lifeline.watch()
  with open(tmp_path / "f", "w") as f:
    closed = os.dup(f.fileno())
    os.close(closed)
    for value in ("x", str(f.fileno()), str(closed)):  # not a number, not a pipe, not open
      monkeypatch.setenv(lifeline.ENV, value)
      assert not lifeline.watch()
      assert lifeline.ENV not in os.environ  # read once, never passed on


def test_sigkill_of_a_sweep_stops_its_trainer_which_saves_a_checkpoint(tmp_path):
  # Before: the trainer (a session of its own) trained on, orphaned, until its last step.
  cfg = tmp_path / "cfgs" / "stop_sweep.py"
  cfg.parent.mkdir()
  cfg.write_text(SWEEP_CONFIG)
  wd = tmp_path / "sweep"
  point = wd / "000-mixer=gla"
  proc = subprocess.Popen([sys.executable, "-m", "linear_attention.sweep",
                           f"--config={cfg}:size=smoke", f"--workdir={wd}", *TINY], cwd=ROOT,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  trainer = None
  try:
    wait_for(lambda: len(_lines(point / "metrics.jsonl")) >= 1, proc, "the trainer trained",
             TIMEOUT)
    trainer = json.loads((point / "run.lock").read_text())["pid"]
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline and sweep._held_by_another(str(point)):
      time.sleep(0.1)
  finally:
    proc.kill()
    proc.wait()
    if trainer is not None and sweep._held_by_another(str(point)):
      _kill_quietly(trainer)
      raise AssertionError("the trainer still ran after the sweep was killed")
  log = (point / "log.txt").read_text()
  assert "the sweep that started this trainer has exited: stopping" in log
  saved = int(os.listdir(point / "checkpoints")[0])
  assert f"SIGTERM at step {saved}; checkpoint saved" in log


def test_sigkill_of_run_studies_stops_its_study(tmp_path):
  # The study's own stop (train_grid's sweep: its trainers save) then runs as after a kill.
  (tmp_path / "study.py").write_text(
      "from linear_attention.train import lifeline\nlifeline.watch('run_studies.py')\n"
      + FAKE_STUDY)
  marker, logs = tmp_path / "saved", tmp_path / "logs"
  proc = subprocess.Popen([sys.executable, "-c", RUN_STUDIES, str(tmp_path / "study.py"),
                           str(marker), str(logs)], cwd=ROOT, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  try:
    wait_for(lambda: "training" in "".join(_lines(logs / "fake.log")), proc,
             "the study started", DEADLINE_S)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline and not marker.exists():
      time.sleep(0.05)
  finally:
    proc.kill()
    proc.wait()
  assert marker.read_text() == "saved"
  assert "run_studies.py has exited: stopping" in (logs / "fake.log").read_text()
