"""Layer pieces of the optional hub families: lightning attention (MiniMax-01's linear layer)
against a float32 step-by-step reference, forward and gradient; the blocks' MiniMax residuals
(``norm_residual``, ``residual_alpha``, per-sublayer ``residual_scale``); Jamba's weighted
``dt``/``B``/``C`` norms in ``nn.Mamba``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from linear_attention.models.blocks import Block, LayerSpec
from linear_attention.nn import gated


def reference(layer: gated.LightningAttention, x):
  """The recurrence token by token: ``S = exp(-s) S + k v^T``, ``o = S^T q``."""
  h, d = layer.num_heads, layer.head_dim
  qkv = jax.nn.silu(x @ layer.qkv_proj.kernel[...]).reshape(x.shape[:2] + (h, 3 * d))
  q, k, v = qkv[..., :d], qkv[..., d:2 * d], qkv[..., 2 * d:]
  decay = jnp.exp(-jnp.asarray(gated.lightning_slopes(h, layer.slope_scale)))[:, None, None]

  def step(state, qkv_t):
    q_t, k_t, v_t = qkv_t
    state = decay * state + jnp.einsum("bhk,bhv->bhkv", k_t, v_t)
    return state, jnp.einsum("bhk,bhkv->bhv", q_t, state)
  move = lambda a: jnp.moveaxis(a, 1, 0)
  _, o = jax.lax.scan(step, jnp.zeros((x.shape[0], h, d, d)), (move(q), move(k), move(v)))
  o = jnp.moveaxis(o, 0, 1).reshape(x.shape[:2] + (h * d,))
  o = o * jax.lax.rsqrt(jnp.mean(o * o, -1, keepdims=True) + 1e-6) * layer.o_norm.scale[...]
  return (o * jax.nn.sigmoid(x @ layer.g_proj.kernel[...])) @ layer.o_proj.kernel[...]


def test_slopes_are_alibi_slopes_times_the_layer_factor():
  np.testing.assert_allclose(gated.lightning_slopes(4, 0.5), 0.5 * 2.0 ** (-2.0 * np.arange(1, 5)),
                             rtol=1e-7)


@pytest.mark.parametrize("slope_scale", [1.0, 1e-5])  # the last MiniMax layer: exp(-s) == 1 in f32
def test_forward_and_gradient_equal_the_reference(slope_scale):
  layer = gated.LightningAttention(12, 2, head_dim=5, slope_scale=slope_scale, chunk_size=4,
                                   rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.PRNGKey(1), (2, 11, 12))  # 11 tokens: not a chunk multiple
  np.testing.assert_allclose(layer(x), reference(layer, x), rtol=1e-5, atol=1e-5)
  g = jax.grad(lambda x: jnp.sum(jnp.sin(layer(x))))(x)
  g_ref = jax.grad(lambda x: jnp.sum(jnp.sin(reference(layer, x))))(x)
  np.testing.assert_allclose(g, g_ref, rtol=1e-4, atol=1e-5)


def test_decoding_equals_the_forward_pass():
  layer = gated.LightningAttention(8, 2, slope_scale=0.3, rngs=nnx.Rngs(2))
  x = jax.random.normal(jax.random.PRNGKey(3), (1, 7, 8))
  cache, steps = layer.init_cache(1, 7), []
  for t in range(7):
    y, cache = layer.decode_step(x[:, t], cache)
    steps.append(y)
  np.testing.assert_allclose(np.stack(steps, 1), layer(x), rtol=1e-5, atol=1e-6)


def test_bad_options_are_refused_by_name():
  with pytest.raises(ValueError, match="slope_scale"):
    gated.LightningAttention(8, 2, slope_scale=0.0, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="head_dim"):
    gated.LightningAttention(8, 2, head_dim=0, rngs=nnx.Rngs(0))


def test_minimax_residuals():
  spec = LayerSpec("lightning", 2, mlp="swiglu", mlp_hidden=6, norm_residual=True,
                   residual_alpha=(1.5, 1.2), residual_scale=(0.7, 0.8))
  block = Block.from_spec(8, spec, rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.PRNGKey(4), (2, 5, 8))
  h = block.mixer_norm(x)
  y = 1.5 * h + 0.7 * block.mixer(h)
  z = block.mlp_norm(y)
  np.testing.assert_allclose(block(x), 1.2 * z + 0.8 * block.mlp(z), rtol=1e-6, atol=1e-6)
  cache, steps = block.init_cache(2, 5), []
  for t in range(5):
    out, cache = block.decode_step(x[:, t], cache)
    steps.append(out)
  np.testing.assert_allclose(np.stack(steps, 1), block(x), rtol=1e-5, atol=1e-5)


def test_residual_options_are_checked():
  with pytest.raises(ValueError, match="residual_alpha"):
    Block(8, "lightning", 2, residual_alpha=(1.0, 2.0, 3.0), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="residual_scale"):
    Block(8, "lightning", 2, residual_scale="2", rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="norm_residual"):
    Block(8, "lightning", 2, norm_residual=True, post_norm=True, rngs=nnx.Rngs(0))


def test_mamba_bcdt_norm_weights():
  """Jamba's weighted dt/B/C norms: ones give Falcon-Mamba's weightless norms; other weights
  scale the normalised ``dt`` input, ``B`` and ``C`` (so the output moves), and decoding
  still equals the forward pass."""
  from linear_attention.nn import recurrent
  kw = dict(d_state=4, dt_rank=3, bcdt_norm_eps=1e-6, rngs=nnx.Rngs(0))
  plain = recurrent.Mamba(8, **kw)
  weighted = recurrent.Mamba(8, bcdt_norm_weights=True, **kw)
  nnx.update(weighted, nnx.state(plain))  # the shared parameters; norm weights start at ones
  x = jax.random.normal(jax.random.PRNGKey(5), (2, 9, 8))
  np.testing.assert_allclose(weighted(x), plain(x), rtol=1e-6, atol=1e-6)
  for w, n in ((weighted.dt_norm, 3), (weighted.b_norm, 4), (weighted.c_norm, 4)):
    w.set_value(1.0 + 0.5 * jnp.arange(n, dtype=jnp.float32))
  y = weighted(x)
  assert not np.allclose(y, plain(x), atol=1e-4)
  cache, steps = weighted.init_cache(2, 9), []
  for t in range(9):
    out, cache = weighted.decode_step(x[:, t], cache)
    steps.append(out)
  np.testing.assert_allclose(np.stack(steps, 1), y, rtol=1e-4, atol=1e-5)
  with pytest.raises(ValueError, match="bcdt_norm_weights=True needs"):
    recurrent.Mamba(8, d_state=4, bcdt_norm_weights=True, rngs=nnx.Rngs(0))
