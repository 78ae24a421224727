"""Learning-rate schedules (cosine, linear, constant) and early stopping on a validation metric."""

from __future__ import annotations

import os

import numpy as np
import pytest

from linear_attention import train
from linear_attention.train import optim
from tests.train.fake_data import FakeDataset, fake_config

CFG = dict(lr=2.0, warmup_steps=10, final_lr_ratio=0.25)


@pytest.mark.parametrize("kind", optim.SCHEDULES)
def test_schedules_warm_up_then_follow_their_shape(kind):
  f = optim.lr_schedule(dict(CFG, schedule=kind), 110)
  lr = np.array([float(f(i)) for i in range(111)])
  np.testing.assert_allclose(lr[:11], np.linspace(0, 2.0, 11), atol=1e-6)
  end = {"constant": 2.0}.get(kind, 0.5)
  np.testing.assert_allclose(lr[110], end, atol=1e-6)
  assert np.all(np.diff(lr[10:]) <= 1e-7)  # never rises after the warmup
  mid = {"constant": 2.0, "linear": 1.25, "cosine": 1.25}[kind]  # halfway: the mean for both decays
  np.testing.assert_allclose(lr[60], mid, atol=1e-6)
  if kind == "linear":
    np.testing.assert_allclose(np.diff(lr[10:]), -1.5 / 100, atol=1e-6)


def test_unknown_schedule_is_refused_by_name():
  with pytest.raises(ValueError, match="schedule"):
    optim.lr_schedule(dict(CFG, schedule="step"), 10)
  cfg = fake_config()
  cfg.optim["schedule"] = "step"
  with pytest.raises(ValueError, match="config.optim.schedule"):
    train.train_and_evaluate(cfg, "/nonexistent/never-created", dataset=FakeDataset())


def test_early_stop_rules():
  assert train.trainer.early_stop_reached({"early_stop_metric": "accuracy",
                                           "early_stop_value": 0.9}, {"accuracy": 0.9})
  assert not train.trainer.early_stop_reached({"early_stop_metric": "accuracy",
                                               "early_stop_value": 0.9}, {"accuracy": 0.89})
  assert train.trainer.early_stop_reached({"early_stop_metric": "loss", "early_stop_value": 1.0},
                                          {"loss": 0.5})
  assert not train.trainer.early_stop_reached({}, {"accuracy": 1.0})
  for bad, match in ((dict(early_stop_metric="acc"), "early_stop_metric"),
                     (dict(early_stop_metric="loss", eval_every=0), "eval_every")):
    with pytest.raises(ValueError, match=match):
      train.train_and_evaluate(fake_config(**bad), "/nonexistent/never-created",
                               dataset=FakeDataset())


def test_early_stop_ends_the_run_at_the_evaluation_and_a_rerun_keeps_it(tmp_path):
  """A loss threshold every evaluation meets stops at the first evaluation (step 3 of 9)."""
  cfg = fake_config(steps=9, eval_every=3, early_stop_metric="loss", early_stop_value=1e9)
  wd = str(tmp_path / "run")
  res = train.train_and_evaluate(cfg, wd, dataset=FakeDataset(), verbose=False)
  assert res["step"] == 3 and res["stopped_early"]
  assert "validation_loss" in res
  assert sorted(os.listdir(os.path.join(wd, "checkpoints")))[-1] == "3"
  again = train.train_and_evaluate(cfg, wd, dataset=FakeDataset(), verbose=False)
  assert again == res
  full = train.train_and_evaluate(fake_config(steps=9, eval_every=3), str(tmp_path / "full"),
                                  dataset=FakeDataset(), verbose=False)
  assert full["step"] == 9 and not full["stopped_early"]
