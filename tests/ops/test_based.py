"""Based (Taylor feature map) and ReBased (affine LayerNorm + squared kernel).

The causal forms, steps, packing, gradients and bad inputs run in
``test_conformance.py`` (specs ``based`` and ``rebased_attention``); here the
feature maps' kernels, the bidirectional paths and the layers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from linear_attention import nn as lnn
from linear_attention import ops
from linear_attention.ops import feature_maps as fm
from tests.helpers import assert_close, keys, rand

B, T, H, D, V = 2, 37, 2, 16, 5
SEG = jnp.array([[0] * 10 + [1] * 20 + [2] * 7, [4] * 37])


def inputs(t=T, seed=0, d=D, scale=1.0):
  kq, kk, kv = keys(seed, 3)
  return (rand(kq, (B, t, H, d), scale=scale), rand(kk, (B, t, H, d), scale=scale),
          rand(kv, (B, t, H, V)))


def kernel_attention(kernel, q, k, v, *, causal, seg=None):
  """Normalised attention with weights ``kernel(q_i . k_j)`` over a dense mask."""
  t = q.shape[1]
  w = kernel(jnp.einsum("bihd,bjhd->bhij", q, k, precision="highest"))
  mask = jnp.tril(jnp.ones((t, t), bool)) if causal else jnp.ones((t, t), bool)
  mask = mask[None, None]
  if seg is not None:
    mask = mask & (seg[:, None, :, None] == seg[:, None, None, :])
  w = jnp.where(mask, w, 0.0)
  o = jnp.einsum("bhij,bjhv->bihv", w, v, precision="highest")
  return o / jnp.swapaxes(w.sum(-1), 1, 2)[..., None]


def taylor_kernel(u, d=D):
  return 1.0 + u / np.sqrt(d) + u**2 / (2.0 * d)


@pytest.mark.parametrize("d", [1, 4, 16])
def test_taylor_features_give_the_second_order_expansion(d):
  x, y = rand(keys(0, 1)[0], (6, d)), rand(keys(1, 1)[0], (6, d))
  phi_x, phi_y = fm.taylor_features(x), fm.taylor_features(y)
  assert phi_x.shape == (6, 1 + d + d * (d + 1) // 2) == (6, fm.feature_width("taylor", d))
  u = jnp.sum(x * y, -1)
  assert_close(jnp.sum(phi_x * phi_y, -1), 1 + u / np.sqrt(d) + u**2 / (2 * d), 1e-5, 1e-5)
  # The kernel 1 + a + a^2/2 has its minimum 1/2 at a = -1: the normaliser stays positive.
  assert float(jnp.min(jnp.sum(fm.taylor_features(-x) * phi_x, -1))) >= 0.5 - 1e-5


def test_squared_features_give_the_squared_dot_product():
  x, y = rand(keys(2, 1)[0], (6, D)), rand(keys(3, 1)[0], (6, D))
  phi_x = fm.squared_features(x)
  assert phi_x.shape == (6, D * (D + 1) // 2) == (6, fm.feature_width("squared", D))
  assert_close(jnp.sum(phi_x * fm.squared_features(y), -1), jnp.sum(x * y, -1) ** 2 / D,
               1e-5, 1e-5)


@pytest.mark.parametrize("seg", [None, SEG], ids=["single", "packed"])
@pytest.mark.parametrize("causal", [True, False])
def test_based_matches_its_kernel_in_quadratic_form(causal, seg):
  q, k, v = inputs()
  o = ops.linear_attention(q, k, v, feature_map="taylor", causal=causal, segment_ids=seg,
                           chunk_size=16)
  assert_close(o, kernel_attention(taylor_kernel, q, k, v, causal=causal, seg=seg), 1e-4, 1e-5)


def test_based_approximates_softmax_for_small_logits():
  """The Taylor kernel is exp(u) up to O(u^3): close to softmax attention for |u| << 1."""
  q, k, v = inputs(scale=0.3)
  u_max = float(jnp.max(jnp.abs(jnp.einsum("bihd,bjhd->bhij", q, k)))) / np.sqrt(D)
  assert u_max < 0.6
  based = ops.linear_attention(q, k, v, feature_map="taylor")
  exact = ops.softmax_attention(q, k, v, causal=True)
  # Kernel error <= u^3/6 relative, so the outputs differ by well under that bound.
  assert float(jnp.max(jnp.abs(based - exact))) < u_max**3 / 6 * float(jnp.max(jnp.abs(v)))
  assert float(jnp.max(jnp.abs(based - exact))) > 0  # an approximation, not softmax itself


def test_based_large_inputs_stay_finite():
  q, k, v = inputs(scale=30.0)
  o, grads = jax.value_and_grad(
      lambda q, k: jnp.sum(ops.linear_attention(q, k, v, feature_map="taylor")), argnums=(0, 1))(
          q, k)
  assert bool(jnp.all(jnp.isfinite(o)))
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads)


def test_affine_layer_norm():
  x = rand(keys(4, 1)[0], (B, T, H, D), scale=3.0) + 5.0
  y = fm.affine_layer_norm(x, jnp.ones(D), jnp.zeros(D))
  assert_close(jnp.mean(y, -1), 0.0, 1e-5, 1e-5)
  assert_close(jnp.mean(y * y, -1), 1.0, 1e-3, 1e-3)
  gamma, beta = rand(keys(5, 1)[0], (H, D)), rand(keys(6, 1)[0], (H, D))
  assert_close(fm.affine_layer_norm(x, gamma, beta), y * gamma + beta, 1e-5, 1e-5)
  with pytest.raises(ValueError, match=r"gamma must have shape \[16\] or \[2, 16\].*\[3\]"):
    fm.affine_layer_norm(x, jnp.ones(3), jnp.zeros(D))
  with pytest.raises(ValueError, match=r"beta must be a floating-point array"):
    fm.affine_layer_norm(x, jnp.ones(D), jnp.zeros(D, jnp.int32))


@pytest.mark.parametrize("causal", [True, False])
def test_rebased_is_the_squared_kernel_of_normalised_q_and_k(causal):
  q, k, v = inputs()
  gamma = jax.random.uniform(keys(7, 1)[0], (H, D), minval=0.5, maxval=1.5)
  beta = 0.3 * rand(keys(8, 1)[0], (H, D))
  o = ops.rebased_attention(q, k, v, gamma, beta, causal=causal, segment_ids=SEG, chunk_size=16)
  qn, kn = fm.affine_layer_norm(q, gamma, beta), fm.affine_layer_norm(k, gamma, beta)
  want = kernel_attention(lambda u: u**2, qn, kn, v, causal=causal, seg=SEG)
  assert_close(o, want, 1e-3, 1e-4)


def test_rebased_step_continues_a_prefill():
  q, k, v = inputs(t=9)
  gamma, beta = jnp.full((D,), 0.8), jnp.full((D,), 0.5)
  o, state = ops.rebased_attention(q[:, :8], k[:, :8], v[:, :8], gamma, beta, return_state=True)
  assert state.shape == (B, H, D * (D + 1) // 2, V + 1) and state.dtype == jnp.float32
  o_t, _ = ops.rebased_attention_step(state, q[:, 8], k[:, 8], v[:, 8], gamma, beta)
  assert_close(o_t, ops.rebased_attention(q, k, v, gamma, beta)[:, 8], 1e-4, 1e-5)


@pytest.mark.parametrize("name,width", [("based", 1 + 4 + 10), ("rebased", 10)])
def test_layers_project_q_and_k_to_the_feature_dim(name, width):
  layer = lnn.make_mixer(name, 32, 2, rngs=nnx.Rngs(0), feature_dim=4)
  assert layer.q_proj.kernel[...].shape == (32, 2 * 4)
  assert layer.v_proj.kernel[...].shape == (32, 32)
  assert layer.num_features == width
  assert layer.init_cache(3, 100)["state"].shape == (3, 2, width, 16 + 1)
  with pytest.raises(ValueError, match="feature_dim must be an int >= 1, got 0"):
    lnn.make_mixer(name, 32, 2, rngs=nnx.Rngs(0), feature_dim=0)


def test_rebased_layer_learns_gamma_and_beta():
  layer = lnn.make_mixer("rebased", 32, 2, rngs=nnx.Rngs(0), feature_dim=4)
  assert np.all(np.asarray(layer.gamma[...]) == 1) and np.all(np.asarray(layer.beta[...]) == 0)
  x = rand(keys(9, 1)[0], (2, 11, 32))
  grads = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(layer)
  assert float(jnp.abs(grads.gamma[...]).sum()) > 0 and float(jnp.abs(grads.beta[...]).sum()) > 0
