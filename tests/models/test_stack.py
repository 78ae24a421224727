"""Activation checkpointing and the scan over layers change memory and compile time, never
the loss or the gradients (beyond float32 rounding)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from linear_attention import models
from linear_attention.models import stack


def _model(remat="none", scan=False, pattern="GA", num_layers=4):
  return models.LanguageModel(32, 16, num_layers, mixer=None, pattern=pattern, num_heads=2,
                              rngs=nnx.Rngs(0), remat=remat, scan_layers=scan,
                              pattern_letters={"G": "gated_deltanet", "A": "softmax"})


def _loss_and_grads(model, tokens):
  def loss(m):
    return jnp.mean(jnp.square(m(tokens).astype(jnp.float32)))
  value, grads = nnx.value_and_grad(loss)(model)
  return value, nnx.to_pure_dict(grads)


def _assert_grads_close(grads, ref):
  """Each leaf within float32 rounding of the reference, relative to the leaf's scale."""
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref)):
    a, b = np.asarray(a), np.asarray(b)
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * float(np.max(np.abs(b))))


TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 32, (2, 11)), jnp.int32)


@pytest.mark.parametrize("remat", ["block", "mixer_only", "dots_with_no_batch_dims_saveable"])
def test_remat_gives_the_same_loss_and_gradients(remat):
  ref_loss, ref_grads = jax.jit(_loss_and_grads)(_model(), TOKENS)
  loss, grads = jax.jit(_loss_and_grads)(_model(remat), TOKENS)
  # Equal to float32 rounding: XLA fuses the recomputed forward differently.
  np.testing.assert_allclose(np.asarray(loss), np.asarray(ref_loss), rtol=1e-6)
  _assert_grads_close(grads, ref_grads)


@pytest.mark.parametrize("remat", ["none", "block"])
def test_scan_over_layers_gives_the_same_loss_and_gradients(remat):
  ref_loss, ref_grads = jax.jit(_loss_and_grads)(_model(), TOKENS)
  loss, grads = jax.jit(_loss_and_grads)(_model(remat, scan=True), TOKENS)
  np.testing.assert_allclose(np.asarray(loss), np.asarray(ref_loss), rtol=1e-6)
  _assert_grads_close(grads, ref_grads)


def test_remat_keeps_less_for_the_backward_pass():
  """The compiled step's temporaries shrink with ``remat="block"`` over a scanned stack
  (XLA's memory plan)."""
  tokens = jnp.zeros((1, 256), jnp.int32)

  def temp(remat):
    model = models.LanguageModel(32, 32, 6, mixer="gla", num_heads=2,
                                 rngs=nnx.Rngs(0), remat=remat, scan_layers=True)
    graphdef, state = nnx.split(model)
    fn = jax.jit(lambda s, t: _loss_and_grads(nnx.merge(graphdef, s), t))
    return fn.lower(state, tokens).compile().memory_analysis().temp_size_in_bytes

  assert temp("block") < 0.5 * temp("none")


def test_scan_period_finds_the_repeating_unit():
  assert stack.scan_period(_model(pattern="GA", num_layers=6).blocks) == 2
  assert stack.scan_period(_model(pattern="GGGA", num_layers=8).blocks) == 4
  assert stack.scan_period(_model(pattern="GGGA", num_layers=6).blocks) is None
  assert stack.scan_period(_model(pattern="G", num_layers=3).blocks) == 1


def test_an_unknown_remat_is_refused_naming_the_choices():
  with pytest.raises(ValueError, match=r"remat must be one of .*'block'.*got 'blocks'"):
    _model("blocks")
