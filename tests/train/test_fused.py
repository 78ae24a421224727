"""Several training steps per dispatch (``train.steps_per_dispatch``) against one per call."""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

from linear_attention import train
from linear_attention.train import errors, trainer
from tests.helpers import run_on_fake_devices
from tests.train.fake_data import FakeDataset, fake_config


def _params(workdir):
  return [np.asarray(x) for x in jax.tree_util.tree_leaves(train.load_checkpoint(str(workdir)))]


def _assert_same_run(a, b, ra, rb):
  pa, pb = _params(a), _params(b)
  assert len(pa) == len(pb)
  for x, y in zip(pa, pb):  # float32 rounding only: XLA may fuse the scan body differently
    np.testing.assert_allclose(x, y, rtol=2e-5, atol=2e-6)
  for k in ("step", "validation_loss", "train_loss"):
    np.testing.assert_allclose(ra[k], rb[k], rtol=1e-5)


def test_dispatch_steps_divides_every_interval():
  t = dict(steps_per_dispatch=10, log_every=50, eval_every=100, checkpoint_every=1000)
  assert trainer.dispatch_steps(t) == 10
  assert trainer.dispatch_steps(dict(t, log_every=25)) == 5
  assert trainer.dispatch_steps(dict(t, eval_every=0, checkpoint_every=0)) == 10
  assert trainer.dispatch_steps(dict(t, log_every=1)) == 1
  assert trainer.dispatch_steps({k: v for k, v in t.items() if k != "steps_per_dispatch"}) == 1


@pytest.mark.parametrize("bad", [0, -2, 1.5, True])
def test_bad_steps_per_dispatch_is_refused_before_anything_is_written(tmp_path, bad):
  cfg = fake_config(steps=6, steps_per_dispatch=bad)
  with pytest.raises(ValueError, match="steps_per_dispatch must be an int >= 1, got"):
    train.train_and_evaluate(cfg, str(tmp_path / "run"), dataset=FakeDataset(), verbose=False)
  assert not (tmp_path / "run").exists()


def test_fused_loop_matches_one_step_loop(tmp_path):
  # 13 steps in chunks of 3: a final chunk of one step runs through the one-step function.
  kw = dict(steps=13, log_every=3, eval_every=6, checkpoint_every=6, keep_checkpoints=5)
  r1 = train.train_and_evaluate(fake_config(**kw, steps_per_dispatch=1), str(tmp_path / "one"),
                                dataset=FakeDataset(), verbose=False)
  r3 = train.train_and_evaluate(fake_config(**kw, steps_per_dispatch=3), str(tmp_path / "fused"),
                                dataset=FakeDataset(), verbose=False)
  _assert_same_run(tmp_path / "one", tmp_path / "fused", r1, r3)
  assert sorted(os.listdir(tmp_path / "fused" / "checkpoints")) == ["12", "13", "6"]
  logged = [r["step"] for r in train.metrics.read_metrics(str(tmp_path / "fused"), "train")]
  assert logged == [3, 6, 9, 12, 13]
  one = train.metrics.read_metrics(str(tmp_path / "one"), "train")
  fused = train.metrics.read_metrics(str(tmp_path / "fused"), "train")
  np.testing.assert_allclose([r["loss"] for r in one], [r["loss"] for r in fused], rtol=1e-5)


def test_fused_loop_matches_one_step_loop_on_the_mqar_smoke_config(tmp_path):
  from configs import mqar
  out = {}
  for k in (1, 5):
    cfg = mqar.get_config("mixer=gla,size=smoke")
    cfg.train.steps, cfg.train.log_every, cfg.train.eval_every = 20, 10, 10
    cfg.train.checkpoint_every, cfg.train.eval_batches = 20, 1
    cfg.model.short_conv, cfg.mesh.data = 3, 1
    cfg.train.steps_per_dispatch = k
    out[k] = train.train_and_evaluate(cfg, str(tmp_path / str(k)), verbose=False)
  _assert_same_run(tmp_path / "1", tmp_path / "5", out[1], out[5])


def test_resume_at_a_step_inside_a_chunk_matches_the_uninterrupted_run(tmp_path):
  kw = dict(steps=12, eval_every=0, keep_checkpoints=5)
  ref = train.train_and_evaluate(fake_config(**kw, log_every=4, checkpoint_every=4,
                                             steps_per_dispatch=1),
                                 str(tmp_path / "ref"), dataset=FakeDataset(), verbose=False)
  wd = str(tmp_path / "run")
  with pytest.raises(errors.DataError, match="step 6"):
    train.train_and_evaluate(fake_config(**kw, log_every=1, checkpoint_every=5,
                                         steps_per_dispatch=1),
                             wd, dataset=FakeDataset(bad_id_at=6), verbose=False)
  assert sorted(os.listdir(os.path.join(wd, "checkpoints"))) == ["5"]
  # Resumed at step 5 with chunks of 4: steps 5-7 one at a time, then 8-11 fused.
  res = train.train_and_evaluate(fake_config(**kw, log_every=4, checkpoint_every=4,
                                             steps_per_dispatch=4),
                                 wd, dataset=FakeDataset(), verbose=False)
  _assert_same_run(tmp_path / "ref", wd, ref, res)


def test_early_stop_at_an_evaluation_between_fused_chunks(tmp_path):
  cfg = fake_config(steps=12, log_every=3, eval_every=6, checkpoint_every=0,
                    steps_per_dispatch=3, early_stop_metric="loss", early_stop_value=1e9)
  stop = train.train_and_evaluate(cfg, str(tmp_path), dataset=FakeDataset(), verbose=False)
  assert stop["step"] == 6 and stop["stopped_early"]
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["6"]


def test_non_finite_step_inside_a_fused_chunk_is_named(tmp_path):
  cfg = fake_config(steps=8, checkpoint_every=2, log_every=4, eval_every=0, steps_per_dispatch=2)
  with pytest.raises(train.NonFiniteLossError, match="step 4"):
    train.train_and_evaluate(cfg, str(tmp_path), dataset=FakeDataset(nan_at=3), verbose=False)
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2"]
  assert not (tmp_path / "final_metrics.json").exists()


_MULTIDEVICE = """
import jax, numpy as np
assert jax.device_count() == 4, jax.devices()
from linear_attention import train
from tests.train.fake_data import FakeDataset, fake_config
out = {}
for name, data, fsdp, k in [("one", 1, False, 1), ("dp", 4, False, 3), ("fsdp", 4, True, 3)]:
  cfg = fake_config(steps=6, eval_every=0, log_every=3, checkpoint_every=0,
                    steps_per_dispatch=k)
  cfg.model.d_model = 32
  cfg.mesh.data, cfg.mesh.fsdp = data, fsdp
  wd = f"{WORKDIR}/{name}"
  res = train.train_and_evaluate(cfg, wd, dataset=FakeDataset(), verbose=False)
  out[name] = [np.asarray(x) for x in jax.tree_util.tree_leaves(train.load_checkpoint(wd))]
for name in ("dp", "fsdp"):
  for a, b in zip(out[name], out["one"]):
    np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6)
print("FUSED MULTIDEVICE OK")
"""


def test_fused_steps_on_four_devices_match_one_device(tmp_path):
  run_on_fake_devices(_MULTIDEVICE, "FUSED MULTIDEVICE OK", workdir=tmp_path)
