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


def _unstacked(tree):
  """A scanned model's pure-dict state (or gradient) in the unscanned model's layout."""
  tree = dict(tree)
  backbone = dict(tree["backbone"])
  units = backbone["blocks"]["stacked_layers"]
  backbone["blocks"] = dict(enumerate(stack.unstack_states([units[j] for j in sorted(units)])))
  tree["backbone"] = backbone
  return tree


@pytest.mark.parametrize("remat", ["none", "block"])
@pytest.mark.parametrize("pattern,num_layers", [("GA", 4), ("G", 3)])
def test_scan_over_layers_gives_the_same_loss_and_gradients(remat, pattern, num_layers):
  ref_model = _model(pattern=pattern, num_layers=num_layers)
  model = _model(remat, scan=True, pattern=pattern, num_layers=num_layers)
  assert isinstance(model.blocks, stack.StackedBlocks)
  # The same initial parameters, stacked over the layers.
  for a, b in zip(jax.tree.leaves(_unstacked(nnx.to_pure_dict(nnx.state(model)))),
                  jax.tree.leaves(nnx.to_pure_dict(nnx.state(ref_model)))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  ref_loss, ref_grads = jax.jit(_loss_and_grads)(ref_model, TOKENS)
  loss, grads = jax.jit(_loss_and_grads)(model, TOKENS)
  np.testing.assert_allclose(np.asarray(loss), np.asarray(ref_loss), rtol=1e-6)
  grads = _unstacked(grads)
  assert jax.tree.structure(grads) == jax.tree.structure(ref_grads)
  _assert_grads_close(grads, ref_grads)


def test_stacked_parameters_are_stored_once_with_a_layer_axis():
  model = _model(scan=True, pattern="GA", num_layers=6)
  ref = _model(pattern="GA", num_layers=6)
  state = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  # One leaf per parameter of the unit, [repeats, ...]: no per-layer copy is kept.
  ref_blocks = nnx.to_pure_dict(nnx.state(ref, nnx.Param))["backbone"]["blocks"]
  assert len(jax.tree.leaves(state["backbone"]["blocks"])) == len(jax.tree.leaves(ref_blocks)) // 3
  assert models.count_params(model) == models.count_params(ref)
  scale = state["backbone"]["blocks"]["stacked_layers"][0]["mlp_norm"]["scale"]
  assert scale.shape == (3, 16)


def test_a_scanned_model_decodes_as_the_unscanned_one():
  ref, model = _model(pattern="GA", num_layers=4), _model(scan=True, pattern="GA", num_layers=4)
  c_ref, c = ref.init_cache(2, 8), model.init_cache(2, 8)
  for t in range(3):
    out_ref, c_ref = ref.decode_step(TOKENS[:, t], c_ref)
    out, c = model.decode_step(TOKENS[:, t], c)
    np.testing.assert_allclose(np.asarray(out), np.asarray(out_ref), rtol=1e-5, atol=1e-6)


def test_stack_and_unstack_states_are_inverse():
  layer_states = [{"w": jnp.full((2,), float(i))} for i in range(6)]
  units = stack.stack_states(layer_states, period=2)
  np.testing.assert_array_equal(units[1]["w"][:, 0], [1.0, 3.0, 5.0])
  back = stack.unstack_states(units)
  for a, b in zip(back, layer_states):
    np.testing.assert_array_equal(a["w"], b["w"])


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
