"""The model options real checkpoints need (RecurrentGemma, xLSTM-7B): logit soft-cap,
embedding scale, zero-centred norms, the GeGLU-with-biases MLP kind and attention's
output-only bias; each against its formula, in the forward and in decoding."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from linear_attention.models.blocks import Block, LayerSpec
from linear_attention.models.lm import LanguageModel
from linear_attention.nn import attention, modules
from linear_attention.nn import mlp as nn_mlp
from tests import helpers

V, D = 32, 16
TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, V, (2, 7)), jnp.int32)


def _model(**kw):
  layers = [LayerSpec("hawk", 2, mlp="geglu_bias", mlp_hidden=24, norm_offset=kw.pop("blk", 0.0)),
            LayerSpec("local", 2, mixer_kwargs=dict(window=3, num_kv_heads=1, rotary_dim=4,
                                                    out_bias=True), mlp="swiglu", mlp_hidden=24)]
  return LanguageModel(V, D, layers=layers, rngs=nnx.Rngs(0), **kw)


def _copy_params(src, dst):
  nnx.update(dst, nnx.state(src, nnx.Param))


def test_logit_soft_cap_caps_the_logits_forward_and_decoding():
  plain = _model()
  capped = _model(logit_soft_cap=0.5)
  _copy_params(plain, capped)
  want = 0.5 * np.tanh(np.asarray(plain(TOKENS)) / 0.5)
  helpers.assert_close(capped(TOKENS), want, 1e-5, 1e-6)
  helpers.assert_close(helpers.decode_all(capped, TOKENS), want, 1e-4, 1e-5)
  assert np.max(np.abs(want)) < 0.5


def test_embed_scale_multiplies_the_embeddings():
  plain = _model()
  scaled = _model(embed_scale=3.0)
  _copy_params(plain, scaled)
  scaled.backbone.embed.embedding.set_value(plain.backbone.embed.embedding[...])
  # Scaling the table instead of the lookup gives the same hidden states (not the same
  # logits: the tied head reads the table).
  manual = _model()
  _copy_params(plain, manual)
  manual.backbone.embed.embedding.set_value(3.0 * plain.backbone.embed.embedding[...])
  helpers.assert_close(scaled.backbone(TOKENS), manual.backbone(TOKENS), 1e-5, 1e-5)
  h, _ = scaled.backbone.decode_step(TOKENS[:, 0], scaled.init_cache(2, 7))
  helpers.assert_close(h, manual.backbone(TOKENS)[:, 0], 1e-5, 1e-5)


def test_norm_offset_is_one_plus_a_zero_centred_scale():
  ref = _model()
  centred = _model(norm_offset=1.0, blk=1.0)
  _copy_params(ref, centred)
  for a, b in ((ref.backbone.final_norm, centred.backbone.final_norm),
               (ref.blocks[0].mixer_norm, centred.blocks[0].mixer_norm),
               (ref.blocks[0].mlp_norm, centred.blocks[0].mlp_norm)):
    w = np.random.default_rng(1).normal(size=D).astype(np.float32)
    a.scale.set_value(jnp.asarray(1.0 + w))
    b.scale.set_value(jnp.asarray(w))
  helpers.assert_close(centred(TOKENS), ref(TOKENS), 1e-5, 1e-5)
  # The second block keeps the usual scale (its LayerSpec has no offset).
  np.testing.assert_array_equal(np.asarray(centred.blocks[1].mixer_norm.scale[...]), 1.0)


def test_geglu_bias_mlp_is_its_formula():
  blk = Block(D, None, 1, mlp="geglu_bias", hidden=8, rngs=nnx.Rngs(0))
  mlp = blk.mlp
  rng = np.random.default_rng(2)
  for lin in (mlp.up, mlp.down):
    lin.bias.set_value(jnp.asarray(rng.normal(size=lin.bias.shape), jnp.float32))
  x = jnp.asarray(rng.normal(size=(3, D)), jnp.float32)
  gu = x @ mlp.up.kernel[...] + mlp.up.bias[...]
  want = (jax.nn.gelu(gu[:, :8], approximate=True) * gu[:, 8:]) @ mlp.down.kernel[...] \
      + mlp.down.bias[...]
  helpers.assert_close(mlp(x), want, 1e-5, 1e-5)


@pytest.mark.parametrize("kind, act, gated", [
    ("swiglu", jax.nn.silu, True), ("relu2", lambda h: jnp.square(jax.nn.relu(h)), False)])
def test_block_mlp_kinds_are_nn_mlp_with_the_checkpoint_layout(kind, act, gated):
  # The hub's weight maps write "up" (gate columns first) and "down" without biases.
  mlp = Block(D, None, 1, mlp=kind, hidden=8, rngs=nnx.Rngs(0)).mlp
  assert isinstance(mlp, nn_mlp.MLP)
  params = nnx.to_flat_state(nnx.state(mlp, nnx.Param))
  assert {"/".join(map(str, p)): v.shape for p, v in params} == {
      "up/kernel": (D, 16 if gated else 8), "down/kernel": (8, D)}
  x = jnp.asarray(np.random.default_rng(3).normal(size=(3, D)), jnp.float32)
  h = x @ mlp.up.kernel[...]
  want = (act(h[:, :8]) * h[:, 8:] if gated else act(h)) @ mlp.down.kernel[...]
  helpers.assert_close(mlp(x), want, 1e-5, 1e-5)


def test_out_bias_puts_a_bias_on_the_output_projection_only():
  layer = attention.LocalAttention(D, 2, window=3, out_bias=True, rngs=nnx.Rngs(0))
  assert layer.o_proj.bias is not None
  assert all(p.bias is None for p in (layer.q_proj, layer.k_proj, layer.v_proj))
  both = attention.SoftmaxAttention(D, 2, use_bias=True, out_bias=False, rngs=nnx.Rngs(0))
  assert both.q_proj.bias is not None and both.o_proj.bias is None


@pytest.mark.parametrize("kw, match", [
    (dict(logit_soft_cap=0.0), r"logit_soft_cap must be None .* > 0"),
    (dict(logit_soft_cap=float("inf")), r"logit_soft_cap must be None"),
    (dict(embed_scale=-1.0), r"embed_scale must be a number > 0"),
])
def test_bad_options_name_themselves(kw, match):
  with pytest.raises(ValueError, match=match):
    _model(**kw)


def test_soft_cap_none_is_identity():
  x = jnp.asarray([-100.0, 0.5, 100.0])
  np.testing.assert_array_equal(np.asarray(modules.soft_cap(x, None)), np.asarray(x))
  helpers.assert_close(modules.soft_cap(x, 30.0), 30.0 * np.tanh(np.asarray(x) / 30.0), 1e-6)
