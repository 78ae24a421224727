"""Two sweeps in one directory (issue 29, bug 8): the second refuses at once, a lock left by
a killed sweep is taken over, and a point finished (or being trained) by another runner is
never recorded as failed. No training: the trainers are stand-in commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from linear_attention import sweep
from linear_attention.train import rundir

POINTS = [{"model.mixer": "gla"}, {"model.mixer": "softmax"}]


def _fake_runs(monkeypatch):
  ran = []

  def run_point(config_arg, workdir, overrides, extra_flags=(), env=None, process_id=0):
    ran.append(os.path.basename(workdir))
    return {"overrides": dict(overrides), "status": "done", "returncode": 0, "metrics": {},
            "skipped": False}

  monkeypatch.setattr(sweep.runner, "run_point", run_point)
  monkeypatch.setattr(sweep.runner, "load_sweep", lambda config_arg: POINTS)
  return ran


def test_second_sweep_in_one_directory_refuses_at_once(tmp_path, monkeypatch, capsys):
  ran = _fake_runs(monkeypatch)
  wd = str(tmp_path / "sweep")
  os.makedirs(wd)
  # Before: both sweeps ran, each exited 1, and summary.csv marked finished points failed.
  with rundir.WorkdirLock(wd, sweep.SWEEP_LOCK_FILE):  # the first sweep, still running
    assert sweep.main(["--config=c.py", f"--workdir={wd}"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: sweep directory") and "another sweep" in err[0]
  assert f"process {os.getpid()}" in err[0]
  assert ran == [] and not os.path.exists(os.path.join(wd, "summary.csv"))
  # Released (or its holder died: the kernel drops a dead process's flock): it runs.
  assert sweep.main(["--config=c.py", f"--workdir={wd}"]) == 0
  assert len(ran) == 2


def test_lock_of_a_killed_sweep_is_taken_over(tmp_path, monkeypatch):
  ran = _fake_runs(monkeypatch)
  wd = tmp_path / "sweep"
  wd.mkdir()
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True).stdout.strip()
  (wd / sweep.SWEEP_LOCK_FILE).write_text(json.dumps({"pid": int(dead), "host": "h"}) + "\n")
  assert sweep.main(["--config=c.py", f"--workdir={wd}"]) == 0 and len(ran) == 2


def _point_with(monkeypatch, tmp_path, code: str):
  """A point whose "trainer" runs ``code`` (with the point's directory as argv[1])."""
  monkeypatch.setattr(sweep.runner, "point_command", lambda config_arg, workdir, overrides, extra=(): [
      sys.executable, "-c", code, workdir])
  return str(tmp_path / "000-mixer=gla")


def test_point_finished_by_another_runner_reads_done(tmp_path, monkeypatch):
  # The other runner records done while this one's trainer is refused (exit 2).
  wd = _point_with(monkeypatch, tmp_path, (
      "import json, os, sys; json.dump({'status': 'done', 'returncode': 0, 'overrides': {}}, "
      "open(os.path.join(sys.argv[1], 'sweep_status.json'), 'w')); sys.exit(2)"))
  rec = sweep.run_point("c.py", wd, POINTS[0])
  assert rec["status"] == "done"
  with open(os.path.join(wd, sweep.STATUS_FILE)) as f:
    assert json.load(f)["status"] == "done"  # not overwritten with failed


def test_point_trained_elsewhere_is_not_recorded_failed(tmp_path, monkeypatch):
  wd = _point_with(monkeypatch, tmp_path, "import sys; sys.exit(2)")
  os.makedirs(wd)
  with rundir.WorkdirLock(wd):  # another process's trainer holds the point
    rec = sweep.run_point("c.py", wd, POINTS[0])
  assert rec["status"] == "running elsewhere"
  assert not os.path.exists(os.path.join(wd, sweep.STATUS_FILE))
