"""Bad layer options are refused before the run directory is written, and a directory with no
checkpoint never blocks a rerun with changed options (issue 41, items 1 and 6).

The command lines are real subprocesses (one line, exit 2, no workdir); the rest runs in
process on the fake dataset.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from linear_attention import train
from linear_attention.train import errors, trainer
from tests.train.fake_data import FakeDataset, fake_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cli(workdir, config, *flags, devices=1):
  env = dict(os.environ)
  if devices > 1:
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
  cmd = [sys.executable, "-m", "linear_attention.main", f"--config={config}",
         f"--workdir={workdir}", "--config.train.steps=0", *flags]
  return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.parametrize("config,flags,devices,match", [
    # Before: config.json, checkpoints/, metrics.jsonl written, then a traceback (exit 1).
    ("mixer=gla", ["--config.model.mixer_kwargs.gla.chunk_size=0"], 1,
     "chunk_size must be an int"),
    ("mixer=s4d", ["--config.model.mixer_kwargs.s4d.form=fast"], 1, "form must be one of"),
    # Before: NaN at step 1 (exit 4).
    ("mixer=gla", ["--config.model.mixer_kwargs.gla.norm_eps=-1.0"], 1, "norm_eps must be"),
    ("mixer=linear", ["--config.model.mixer_kwargs.linear.normalize=maybe"], 1, "normalize"),
    ("mixer=local", ["--config.mesh.seq=2"], 2, "sliding window of 64 needs"),
    ("mixer=gla", ["--config.mesh.seq=2", "--config.model.short_conv=40"], 2,
     "short convolution of width 40 needs"),
    # Before: stored in config.json, later refused as a model change on resume.
    ("mixer=gla", ["--config.model.mixer_kwargs.mamba.d_state=8"], 1,
     "mixer_kwargs.mamba.d_state=8 set"),
])
def test_bad_layer_options_exit_2_before_writing(tmp_path, config, flags, devices, match):
  wd = tmp_path / "run"
  p = _cli(wd, f"configs/mqar.py:{config},size=smoke", *flags, devices=devices)
  assert p.returncode == 2, p.stderr[-3000:]
  errs = [ln for ln in p.stderr.splitlines() if ln.startswith("error: ")]
  assert len(errs) == 1 and match in errs[0], p.stderr[-3000:]
  assert "Traceback" not in p.stderr
  assert not wd.exists()


def test_the_refusals_in_process():
  for kwargs in ({"chunk_size": 0}, {"norm_eps": -1.0}, {"norm_eps": float("nan")}):
    cfg = fake_config()
    cfg.model.mixer_kwargs = {"gla": kwargs}
    with pytest.raises(errors.ConfigError, match=list(kwargs)[0]):
      trainer.check_run(cfg, FakeDataset())
  cfg = fake_config()
  cfg.model.mixer_kwargs = {"gla": {"chunk_size": 8}, "mamba": {"d_state": 8}}
  with pytest.raises(errors.ConfigError, match=r"mixer_kwargs\.mamba\.d_state=8.*\['gla'\]"):
    trainer.check_run(cfg, FakeDataset())
  cfg.model.mixer_kwargs = {"gla": {"chunk_size": 8}, "mamba": {"d_state": 16}}  # its default
  trainer.check_run(cfg, FakeDataset(), abstract=True)


def test_a_directory_without_a_checkpoint_never_blocks_a_changed_rerun(tmp_path, capfd):
  wd = tmp_path / "run"
  cfg = fake_config(steps=4, checkpoint_every=4, log_every=1, steps_per_dispatch=1)
  with pytest.raises(errors.NonFiniteLossError):
    train.train_and_evaluate(cfg, str(wd), dataset=FakeDataset(nan_at=1), verbose=False)
  assert (wd / "config.json").exists() and not os.listdir(wd / "checkpoints")
  cfg.optim.lr = 1e-3
  cfg.model.mixer_kwargs = {"gla": {"chunk_size": 8}}
  capfd.readouterr()
  # Before: ConfigChangedError "config differs from .../config.json ... optim.lr".
  final = train.train_and_evaluate(cfg, str(wd), dataset=FakeDataset(), verbose=True)
  assert final["step"] == 4
  err = capfd.readouterr().err
  assert "has no checkpoint: starting over" in err and "optim.lr" in err, err
  assert json.load(open(wd / "config.json"))["optim"]["lr"] == 1e-3
  cfg.optim.lr = 3e-3  # now a checkpoint exists: the change is refused
  with pytest.raises(errors.ConfigChangedError, match="optim.lr"):
    train.train_and_evaluate(cfg, str(wd), dataset=FakeDataset(), verbose=False)


def test_another_mixers_stored_options_never_block_a_resume(tmp_path):
  wd = tmp_path / "run"
  cfg = fake_config(steps=2, checkpoint_every=2, eval_every=0)
  train.train_and_evaluate(cfg, str(wd), dataset=FakeDataset(), verbose=False)
  stored = json.load(open(wd / "config.json"))
  stored["model"]["mixer_kwargs"] = {"mamba": {"d_state": 4}}  # as an older version kept it
  (wd / "config.json").write_text(json.dumps(stored))
  cfg.model.mixer_kwargs = {"mamba": {"d_state": 16}}
  cfg.train.steps = 4
  assert train.train_and_evaluate(cfg, str(wd), dataset=FakeDataset(), verbose=False)["step"] == 4
