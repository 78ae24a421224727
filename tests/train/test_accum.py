"""``train.accum_steps``: k micro-batches in one step give the update of the whole batch."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from linear_attention import train
from linear_attention.train import optim, trainer
from tests.train.fake_data import FakeDataset, fake_config


def _state_and_batch():
  cfg = fake_config()
  model = trainer.create_model(cfg.model, 16, "lm", None, seed=0)
  opt = optim.make_optimizer(model, cfg.optim, 10)
  graphdef, state = nnx.split((model, opt))
  batch = FakeDataset().batch(0)
  # Rows count different numbers of positions: the micro-batches' means must not be averaged.
  batch["mask"][:, :4] = np.random.default_rng(1).integers(0, 2, (8, 4))
  return graphdef, state, {k: jnp.asarray(v) for k, v in batch.items()}


@pytest.mark.parametrize("accum", [2, 4])
def test_accumulated_step_equals_the_whole_batch_step(accum):
  graphdef, state, batch = _state_and_batch()
  one = jax.jit(trainer._train_step_fn(graphdef, "lm", None))
  many = jax.jit(trainer._train_step_fn(graphdef, "lm", None, accum))
  s1, m1 = one(state, batch)
  sk, mk = many(state, batch)
  for name in ("loss", "accuracy", "grad_norm"):
    np.testing.assert_allclose(float(mk[name]), float(m1[name]), rtol=1e-5, err_msg=name)
  for a, b in zip(jax.tree.leaves(sk), jax.tree.leaves(s1)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


def test_accum_steps_must_split_the_batch(tmp_path):
  cfg = fake_config(accum_steps=3)
  with pytest.raises(train.errors.ConfigError, match=r"accum_steps \(3\)"):
    train.train_and_evaluate(cfg, str(tmp_path / "run"), dataset=FakeDataset(), verbose=False)
  assert not (tmp_path / "run").exists()
  cfg = fake_config(accum_steps=0)
  with pytest.raises(train.errors.ConfigError, match="accum_steps must be an int >= 1, got 0"):
    train.train_and_evaluate(cfg, str(tmp_path / "run"), dataset=FakeDataset(), verbose=False)
