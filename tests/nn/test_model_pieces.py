"""The model pieces shared by the real-checkpoint families, without torch: MoE against a
dense reference (forward and gradient), the norms and MLPs, the attention options, MLA's
latent decoding and grouped value heads in Gated DeltaNet."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.test_util import check_grads as jax_check_grads

from linear_attention.nn import attention, delta, mlp, moe, modules, norm
from tests.helpers import decode_all


def dense_moe(layer: moe.MoE, x):
  """Every expert on every token, weighted by the routing (zero for unchosen experts)."""
  x2 = x.reshape(-1, x.shape[-1])
  bias = None if layer.score_bias is None else layer.score_bias[...]
  w, idx = moe.route(layer.router_logits(x2), layer.top_k, score=layer.score, bias=bias,
                     renormalize=layer.renormalize, routed_scale=layer.routed_scale,
                     num_groups=layer.num_groups, topk_groups=layer.topk_groups)
  full = jnp.zeros((x2.shape[0], layer.num_experts)).at[jnp.arange(x2.shape[0])[:, None], idx].add(w)
  h = jnp.einsum("nd,edf->enf", x2, layer.gate_up[...])
  h = jax.nn.silu(h[..., :layer.hidden]) * h[..., layer.hidden:]
  y = jnp.einsum("enf,efd,ne->nd", h, layer.down[...], full)
  if layer.shared is not None:
    s = layer.shared(x2)
    if layer.shared_gate is not None:
      s = s * jax.nn.sigmoid(layer.shared_gate(x2))
    y = y + s
  return y.reshape(x.shape)


@pytest.mark.parametrize("kw", [
    dict(score="softmax", shared_hidden=8, shared_gate=True),
    dict(score="sigmoid", score_bias=True, routed_scale=2.0, num_groups=2, topk_groups=1),
    dict(score="softmax", renormalize=False),
])
def test_moe_equals_dense_reference_forward_and_gradient(kw):
  layer = moe.MoE(16, 6, 2, 12, rngs=nnx.Rngs(0), **kw)
  if layer.score_bias is not None:
    layer.score_bias.set_value(0.1 * jax.random.normal(jax.random.key(3), (6,)))
  x = jax.random.normal(jax.random.key(1), (2, 5, 16))
  np.testing.assert_allclose(layer(x), dense_moe(layer, x), rtol=1e-5, atol=1e-6)
  g1 = jax.grad(lambda x: jnp.sum(jnp.sin(layer(x))))(x)
  g2 = jax.grad(lambda x: jnp.sum(jnp.sin(dense_moe(layer, x))))(x)
  np.testing.assert_allclose(g1, g2, rtol=1e-4, atol=1e-6)
  grads = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(layer)
  assert float(jnp.sum(jnp.abs(grads["gate_up"][...]))) > 0


def test_route_group_limit_and_renormalization():
  logits = jnp.array([[4.0, 3.0, 0.0, 0.0, 2.0, 1.0]])
  w, idx = moe.route(logits, 2, score="sigmoid", num_groups=3, topk_groups=1)
  assert sorted(np.asarray(idx[0]).tolist()) == [0, 1]
  np.testing.assert_allclose(jnp.sum(w), 1.0, rtol=1e-6)
  w, idx = moe.route(logits, 2, score="sigmoid", num_groups=3, topk_groups=2)
  assert sorted(np.asarray(idx[0]).tolist()) == [0, 1]
  w, idx = moe.route(logits, 3, score="sigmoid", num_groups=3, topk_groups=2)
  assert sorted(np.asarray(idx[0]).tolist()) == [0, 1, 4]


@pytest.mark.parametrize("kw, match", [
    (dict(top_k=7), "top_k must be <= num_experts"),
    (dict(score="relu"), "score must be one of"),
    (dict(num_groups=4), "num_groups=4 must divide"),
    (dict(shared_gate=True), "shared_gate=True needs"),
    (dict(activation="tanh"), "activation must be one of"),
])
def test_moe_bad_options_raise(kw, match):
  args = dict(top_k=2) | kw
  with pytest.raises(ValueError, match=match):
    moe.MoE(8, 6, args.pop("top_k"), 4, rngs=nnx.Rngs(0), **args)


def test_rmsnorm_offset_and_mlp_variants():
  x = jax.random.normal(jax.random.key(0), (3, 8))
  ref = x / jnp.sqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6)
  np.testing.assert_allclose(norm.RMSNorm(8, offset=1)(x), ref, rtol=1e-5)
  np.testing.assert_allclose(norm.RMSNorm(8)(x), ref, rtol=1e-5)
  with pytest.raises(ValueError, match="offset must be 0 or 1"):
    norm.RMSNorm(8, offset=0.5)
  with pytest.raises(ValueError, match="x must have last axis 8"):
    norm.RMSNorm(8)(x[:, :4])
  m = mlp.MLP(8, 6, activation="relu2", gated=False, rngs=nnx.Rngs(0))
  want = (jax.nn.relu(x @ m.up.kernel[...]) ** 2) @ m.down.kernel[...]
  np.testing.assert_allclose(m(x), want, rtol=1e-5)
  g = mlp.MLP(8, 6, activation="gelu_tanh", rngs=nnx.Rngs(0))
  h = x @ g.up.kernel[...]
  np.testing.assert_allclose(g(x), (jax.nn.gelu(h[:, :6]) * h[:, 6:]) @ g.down.kernel[...],
                             rtol=1e-5)


def test_partial_rope_leaves_the_other_channels_alone():
  layer = attention.SoftmaxAttention(16, 2, head_dim=8, rotary_dim=4, rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(0), (1, 5, 2, 8))
  pos = jnp.arange(5)[None]
  out = layer._rotate(x, pos)
  np.testing.assert_array_equal(out[..., 4:], x[..., 4:])
  np.testing.assert_allclose(out[..., :4], modules.rope(x[..., :4], pos), rtol=1e-6)
  assert not np.allclose(out[:, 1:, :, :4], x[:, 1:, :, :4])


@pytest.mark.parametrize("kw", [
    dict(qk_norm="head", norm_offset=1, output_gate=True, rotary_dim=4, head_dim=8),
    dict(qk_norm="full", use_bias=True, scale=0.3),
])
def test_attention_options_decode_equals_forward(kw):
  layer = attention.SoftmaxAttention(16, 4, num_kv_heads=2, rngs=nnx.Rngs(0), **kw)
  x = jax.random.normal(jax.random.key(1), (2, 7, 16))
  np.testing.assert_allclose(decode_all(layer, x), layer(x), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("kw, match", [
    (dict(qk_norm="layer"), "qk_norm must be None"),
    (dict(rotary_dim=3), "rotary_dim must be None or an even int"),
    (dict(rotary_dim=6, head_dim=4), "even int in 2..head_dim=4, got 6"),
    (dict(head_dim=5), "head_dim must be even for RoPE"),
    (dict(scale=-1.0), "scale must be None or a number > 0"),
])
def test_attention_bad_options_raise(kw, match):
  with pytest.raises(ValueError, match=match):
    attention.SoftmaxAttention(16, 4, rngs=nnx.Rngs(0), **kw)


@pytest.mark.parametrize("q_lora_rank, use_rope", [(None, True), (6, False)])
def test_mla_latent_decode_equals_forward_and_packs(q_lora_rank, use_rope):
  layer = attention.MultiHeadLatentAttention(16, 2, kv_lora_rank=6, q_lora_rank=q_lora_rank,
                                             qk_nope_head_dim=4, qk_rope_head_dim=4,
                                             v_head_dim=6, use_rope=use_rope, rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(2), (2, 9, 16))
  y = layer(x)
  np.testing.assert_allclose(decode_all(layer, x), y, rtol=2e-5, atol=2e-6)
  # Two packed segments equal two separate calls.
  seg = jnp.array([[0] * 4 + [1] * 5] * 2)
  packed = layer(x, segment_ids=seg)
  np.testing.assert_allclose(packed[:, 4:], layer(x[:, 4:]), rtol=2e-5, atol=2e-6)
  cache = layer.init_cache(2, 9)
  assert set(cache) == {"latent", "k_rope", "pos", "limit", "overflow"}
  assert cache["latent"].shape == (2, 9, 6)


def test_gated_deltanet_grouped_value_heads():
  """Each q/k head serves consecutive value heads: the layer equals one with the q/k
  projections repeated per value head."""
  g = delta.GatedDeltaNet(16, 2, num_v_heads=4, head_k_dim=4, head_v_dim=6, rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(3), (2, 9, 16))
  y = g(x)
  assert y.shape == (2, 9, 16)
  np.testing.assert_allclose(decode_all(g, x), y, rtol=2e-5, atol=2e-6)
  full = delta.GatedDeltaNet(16, 4, head_k_dim=4, head_v_dim=6, use_short_conv=False,
                             rngs=nnx.Rngs(1))
  g2 = delta.GatedDeltaNet(16, 2, num_v_heads=4, head_k_dim=4, head_v_dim=6,
                           use_short_conv=False, rngs=nnx.Rngs(1))
  w = g2.qkv_proj.kernel[...]
  rep = lambda z: jnp.repeat(z.reshape(16, 2, 4), 2, axis=1).reshape(16, 16)
  full.qkv_proj.kernel.set_value(jnp.concatenate([rep(w[:, :8]), rep(w[:, 8:16]), w[:, 16:]], 1))
  for name in ("b_proj", "a_proj", "g_proj", "o_proj"):
    getattr(full, name).kernel.set_value(getattr(g2, name).kernel[...])
  for name in ("A_log", "dt_bias"):
    getattr(full, name).set_value(getattr(g2, name)[...])
  full.o_norm.scale.set_value(g2.o_norm.scale[...])
  np.testing.assert_allclose(full(x), g2(x), rtol=2e-5, atol=2e-6)
  with pytest.raises(ValueError, match="num_v_heads=3 must be divisible by num_heads=2"):
    delta.GatedDeltaNet(16, 2, num_v_heads=3, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="head_k_dim must be an int >= 1"):
    delta.GatedDeltaNet(16, 2, head_k_dim=0, rngs=nnx.Rngs(0))


def test_kda_head_dim_independent_of_d_model():
  layer = delta.KimiDeltaAttention(16, 2, head_dim=12, gate_low_rank=4, rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(4), (1, 6, 16))
  np.testing.assert_allclose(decode_all(layer, x), layer(x), rtol=2e-5, atol=2e-6)
  assert layer.init_cache(1, 6)["state"].shape == (1, 2, 12, 12)


def test_layer_specs_with_moe_post_norm_and_norm_offset_decode_as_they_run():
  from linear_attention.models.blocks import LayerSpec
  from linear_attention.models.lm import LanguageModel
  moe_kw = dict(num_experts=4, top_k=2, shared_hidden=8, shared_gate=True)
  layers = [LayerSpec("gated_deltanet", 2, mixer_kwargs=dict(num_v_heads=4, head_k_dim=4,
                                                              head_v_dim=4),
                      mlp="moe", mlp_hidden=8, mlp_kwargs=moe_kw, norm_offset=1),
            LayerSpec("softmax", 2, mixer_kwargs=dict(qk_norm="full"), mlp="swiglu",
                      mlp_hidden=16, post_norm=True),
            LayerSpec("mla", 2, mixer_kwargs=dict(kv_lora_rank=4), mlp="moe", mlp_hidden=8,
                      mlp_kwargs=dict(num_experts=4, top_k=1, score="sigmoid", score_bias=True))]
  model = LanguageModel(32, 16, layers=layers, norm_offset=1, tie_embeddings=False,
                        rngs=nnx.Rngs(0))
  tokens = jax.random.randint(jax.random.key(5), (2, 7), 0, 32)
  full = model(tokens)
  cache = model.init_cache(2, 7)
  steps = []
  for t in range(7):
    logits, cache = model.decode_step(tokens[:, t], cache)
    steps.append(logits)
  np.testing.assert_allclose(jnp.stack(steps, 1), full, rtol=1e-4, atol=1e-5)
  with pytest.raises(ValueError, match="norm_offset applies to models given by layers="):
    LanguageModel(32, 16, 1, mixer="softmax", norm_offset=1, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="post_norm=True has none"):
    from linear_attention.models.blocks import Block
    Block(16, "softmax", 2, post_norm=True, short_conv=4, rngs=nnx.Rngs(0))


def test_moe_bfloat16_runs_in_bfloat16_with_float32_accumulation():
  layer = moe.MoE(16, 4, 2, 8, shared_hidden=8, rngs=nnx.Rngs(0), dtype=jnp.bfloat16,
                  param_dtype=jnp.bfloat16)
  x = jax.random.normal(jax.random.key(0), (2, 3, 16))
  y = layer(x.astype(jnp.bfloat16))
  assert y.dtype == jnp.bfloat16
  f32 = moe.MoE(16, 4, 2, 8, shared_hidden=8, rngs=nnx.Rngs(0))
  nnx.update(f32, jax.tree.map(lambda a: a.astype(jnp.float32), nnx.state(layer)))
  np.testing.assert_allclose(y.astype(jnp.float32), f32(x.astype(jnp.bfloat16).astype(jnp.float32)),
                             rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("sizes,block", [((3, 0, 5, 1), None), ((0, 0, 9, 0), 4), ((1, 1, 0, 0), 8),
                                         ((7, 6, 0, 2), 2)])
def test_grouped_matmul_equals_ragged_dot_forward_and_gradient(sizes, block):
  """The blocked grouped matmul (CPU/GPU path) against XLA's ``ragged_dot``, empty groups,
  rows not a multiple of the block, forward and both gradients."""
  m = sum(sizes)
  x = jax.random.normal(jax.random.key(0), (m, 6))
  w = jax.random.normal(jax.random.key(1), (4, 6, 5))
  g = jnp.array(sizes, jnp.int32)
  ref = lambda x, w: jax.lax.ragged_dot(x, w, g, preferred_element_type=jnp.float32)
  ours = lambda x, w: moe.grouped_matmul(x, w, g, block=block)
  np.testing.assert_allclose(ours(x, w), ref(x, w), rtol=1e-5, atol=1e-5)
  loss = lambda f: jax.grad(lambda x, w: jnp.sum(jnp.sin(f(x, w))), argnums=(0, 1))(x, w)
  for a, b in zip(loss(ours), loss(ref)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  jax_check_grads(ours, (x, w), order=1, modes=("rev",), atol=1e-2, rtol=1e-2)


def test_grouped_matmul_bad_shapes_raise():
  with pytest.raises(ValueError, match="w must have shape"):
    moe.grouped_matmul(jnp.ones((3, 4)), jnp.ones((2, 5, 4)), jnp.array([1, 2]))
  with pytest.raises(ValueError, match="group_sizes must have shape"):
    moe.grouped_matmul(jnp.ones((3, 4)), jnp.ones((2, 4, 4)), jnp.array([3]))
