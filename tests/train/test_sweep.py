"""Sweeps on a cluster: ``--list``, ``--point``, the array-task variable, ``--collect``, and
finished runs reused by their overrides when the indices shift."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from linear_attention import sweep

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A few seconds of training per point on the MQAR smoke config.
TINY = ["--config.train.steps=4", "--config.train.eval_every=0",
        "--config.train.checkpoint_every=0", "--config.data.seq_len=16",
        "--config.data.num_kv_pairs=2", "--config.model.num_layers=1"]
SWEEP_CONFIG = """
from configs.mqar import get_config  # noqa: F401


def get_sweep(arg=None):
  return [{{"model.mixer": m}} for m in {mixers!r}]
"""
MIXERS = ["linear", "softmax", "gla"]
GROWN = ["retnet", "linear", "softmax", "gla"]  # one mixer more, in front: every index shifts


def _config(folder, mixers) -> str:
  os.makedirs(folder, exist_ok=True)
  path = os.path.join(folder, f"sweep_{len(mixers)}.py")
  with open(path, "w") as f:
    f.write(SWEEP_CONFIG.format(mixers=mixers))
  return f"{path}:size=smoke"


def _cli(config, workdir, *args, env=None):
  cmd = [sys.executable, "-m", "linear_attention.sweep", f"--config={config}",
         f"--workdir={workdir}", *args]
  return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                        env=None if env is None else {**os.environ, **env})


def _main(config, workdir, *args):
  return sweep.main([f"--config={config}", f"--workdir={workdir}", *args])


def _points(workdir) -> list[str]:
  return sorted(n for n in os.listdir(workdir) if n[:3].isdigit())


@pytest.fixture(scope="module")
def one_point(tmp_path_factory):
  """A sweep of three points where ``--point=1`` (softmax) alone has run."""
  base = tmp_path_factory.mktemp("sweep")
  config, wd = _config(str(base / "cfgs"), MIXERS), str(base / "wd")
  p = _cli(config, wd, "--point=1", *TINY)
  assert p.returncode == 0, p.stderr[-3000:]
  return config, wd, p


def test_product_and_zip_build_points():
  p = sweep.product({"model.mixer": ["gla", "softmax"]}, {"optim.lr": [1e-3, 3e-3]})
  assert [tuple(x.values()) for x in p] == [("gla", 1e-3), ("gla", 3e-3), ("softmax", 1e-3),
                                            ("softmax", 3e-3)]
  assert sweep.product(model__mixer=["gla"]) == [{"model.mixer": "gla"}]
  with pytest.raises(ValueError, match="the values of sweep key 'a' must be a list, got 'xy'"):
    sweep.product({"a": "xy"})


def test_list_prints_index_status_directory_and_overrides(tmp_path, capsys, monkeypatch):
  monkeypatch.setenv(sweep.ARRAY_ENV, "1")  # --list runs nothing, even in an array task
  config = _config(str(tmp_path / "cfgs"), MIXERS)
  assert _main(config, str(tmp_path / "wd"), "--list") == 0
  out, err = capsys.readouterr()
  lines = out.strip().splitlines()
  assert [ln.split() for ln in lines] == [
      ["0", "not", "run", "000-mixer=linear", "model.mixer=linear"],
      ["1", "not", "run", "001-mixer=softmax", "model.mixer=softmax"],
      ["2", "not", "run", "002-mixer=gla", "model.mixer=gla"]]
  assert "3 points; --point takes 0..2" in err
  assert not (tmp_path / "wd").exists()


def test_point_runs_exactly_one_point(one_point, capsys, monkeypatch):
  config, wd, p = one_point
  assert _points(wd) == ["001-mixer=softmax"]
  rec = json.loads(open(os.path.join(wd, "001-mixer=softmax", sweep.STATUS_FILE)).read())
  assert rec["status"] == "done" and rec["overrides"] == {"model.mixer": "softmax"}
  assert np.isfinite(rec["metrics"]["validation_loss"])
  assert "001-mixer=softmax done" in p.stdout
  assert not os.path.exists(os.path.join(wd, "summary.json"))  # --collect writes it
  # Rerun: the point is done, nothing trains.
  monkeypatch.chdir(ROOT)
  assert _main(config, wd, "--point=1", *TINY) == 0
  assert "001-mixer=softmax skipped (done before)" in capsys.readouterr().out
  assert _main(config, wd, "--point=3") == 2
  assert "--point must be in [0, 3)" in capsys.readouterr().err


def test_collect_writes_finished_and_missing_points(one_point, tmp_path, capsys):
  config, wd, _ = one_point
  wd = shutil.copytree(wd, tmp_path / "wd")
  assert _main(config, str(wd), "--collect") == 1  # not every point is done
  assert "1 of 3 points done" in capsys.readouterr().out
  rows = json.loads((wd / "summary.json").read_text())
  assert [(r["point"], r["status"]) for r in rows] == [
      ("000-mixer=linear", "not run"), ("001-mixer=softmax", "done"), ("002-mixer=gla", "not run")]
  assert rows[0]["metrics"] is None and np.isfinite(rows[1]["metrics"]["validation_loss"])
  csv = (wd / "summary.csv").read_text().splitlines()
  assert csv[0].startswith("point,status,exit_code,model.mixer") and len(csv) == 4
  assert csv[2].startswith("001-mixer=softmax,done,0,softmax,")
  assert _points(wd) == ["001-mixer=softmax"]  # collecting trains nothing
  assert _main(config, str(tmp_path / "typo"), "--collect") == 2  # creates nothing
  assert "sweep directory" in capsys.readouterr().err and not (tmp_path / "typo").exists()


def test_finished_run_reused_by_its_overrides_when_the_index_shifts(one_point, tmp_path, capsys):
  _, wd, _ = one_point
  wd = shutil.copytree(wd, tmp_path / "wd")
  grown = _config(str(tmp_path / "cfgs"), GROWN)  # softmax is now point 2
  assert _main(grown, str(wd), "--list") == 0
  listed = [ln.split() for ln in capsys.readouterr().out.strip().splitlines()]
  assert listed[2] == ["2", "done", "001-mixer=softmax", "model.mixer=softmax"]
  assert listed[1][:4] == ["1", "not", "run", "001-mixer=linear"]
  assert _main(grown, str(wd), "--point=2", *TINY) == 0
  assert "001-mixer=softmax skipped (done before)" in capsys.readouterr().out
  assert _points(wd) == ["001-mixer=softmax"]  # no 002-mixer=softmax: nothing retrained


def test_point_dirs_match_recorded_overrides_not_cut_names(tmp_path):
  """Names are cut at 80 characters: two points may share one; the records tell them apart."""
  long = {f"model.option_{i}": "x" * 8 for i in range(8)}
  a, b = {**long, "optim.lr": 0.001}, {**long, "optim.lr": 0.003}
  assert sweep.point_name(0, a) == sweep.point_name(0, b)
  old = tmp_path / sweep.point_name(0, a)  # a's finished run, at index 0 of an older list
  old.mkdir()
  (old / sweep.STATUS_FILE).write_text(json.dumps({"status": "done", "overrides": a}))
  names = sweep.point_dirs(str(tmp_path), [b, a])
  assert names[1] == old.name  # a: its finished run, under the other index
  assert names[0] != old.name and names[0].startswith(old.name + "-")  # b: a name of its own
  assert sweep.point_dirs(str(tmp_path), [b]) == [names[0]]


def test_array_task_variable_picks_the_point(tmp_path):
  config, wd = _config(str(tmp_path / "cfgs"), MIXERS), tmp_path / "wd"
  p = _cli(config, wd, *TINY, env={sweep.ARRAY_ENV: "2"})
  assert p.returncode == 0, p.stderr[-3000:]
  assert "point 2 (from SLURM_ARRAY_TASK_ID)" in p.stdout
  assert _points(wd) == ["002-mixer=gla"]
  assert json.loads((wd / "002-mixer=gla" / sweep.STATUS_FILE).read_text())["status"] == "done"
  # Another variable, named by --array-env; a value that is no index is refused.
  p = _cli(config, wd, "--array-env=MY_TASK", env={"MY_TASK": "two"})
  assert p.returncode == 2 and "error: MY_TASK must be a point index, got 'two'" in p.stderr


def test_multi_host_flags_are_passed_on_and_name_the_writing_process(tmp_path, monkeypatch,
                                                                     capsys):
  for var in ("JAX_PROCESS_ID", "SLURM_PROCID"):
    monkeypatch.delenv(var, raising=False)
  assert sweep._process_id(["--coordinator_address=h:1", "--process_id=2"]) == 2
  assert sweep._process_id(["--distributed"]) == 0
  monkeypatch.setenv("SLURM_PROCID", "3")
  assert sweep._process_id(["--distributed"]) == 3  # what jax.distributed detects under SLURM
  assert sweep._process_id([]) == 0  # not a multi-host point: SLURM's rank says nothing
  config = _config(str(tmp_path / "cfgs"), MIXERS)
  assert _main(config, str(tmp_path / "wd"), "--workers=2", "--distributed") == 2
  assert "--workers must be 1 with the multi-host flags" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    _main(config, str(tmp_path / "wd"), "--verbose")
  assert "unknown arguments ['--verbose']" in capsys.readouterr().err
