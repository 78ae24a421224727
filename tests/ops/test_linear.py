"""Kernelized linear attention: forms, feature maps, normaliser, random features."""

from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from linear_attention import ops
from tests.helpers import assert_close, assert_tree_close, grads_of, keys, rand

B, T, H, D, V = 2, 37, 3, 8, 5
SEG = jnp.array([[0] * 10 + [1] * 20 + [2] * 7, [4] * 37])
FORMS = ("parallel", "chunk", "recurrent")


def quadratic(phi_q, phi_k, v, *, causal, seg=None, normalize=True, scale=1.0):
  """Linear attention in its quadratic form: weights phi(q_i).phi(k_j) over the mask."""
  t = phi_q.shape[1]
  w = jnp.einsum("bihf,bjhf->bhij", phi_q, phi_k) * scale
  mask = jnp.tril(jnp.ones((t, t), bool)) if causal else jnp.ones((t, t), bool)
  mask = mask[None, None]
  if seg is not None:
    mask = mask & (seg[:, None, :, None] == seg[:, None, None, :])
  w = jnp.where(mask, w, 0.0)
  o = jnp.einsum("bhij,bjhv->bihv", w, v.astype(jnp.float32))
  return o / jnp.swapaxes(w.sum(-1), 1, 2)[..., None] if normalize else o


def elu1(x):
  return jnp.where(x > 0, x + 1.0, jnp.exp(x))


def inputs(t=T, seed=0, dtype=jnp.float32):
  kq, kk, kv = keys(seed, 3)
  return (rand(kq, (B, t, H, D), dtype, 0.5), rand(kk, (B, t, H, D), dtype, 0.5),
          rand(kv, (B, t, H, V), dtype))


# The causal form runs in test_conformance.py; bidirectional attention here.
@pytest.mark.parametrize("seg", [None, SEG], ids=["single", "packed"])
@pytest.mark.parametrize("form", FORMS)
def test_bidirectional_elu_matches_quadratic_form(seg, form):
  causal = False
  q, k, v = inputs()
  o = ops.linear_attention(q, k, v, causal=causal, segment_ids=seg, form=form, chunk_size=16)
  assert_close(o, quadratic(elu1(q), elu1(k), v, causal=causal, seg=seg), 1e-4, 1e-5)


def test_relu_unnormalized_scale():
  q, k, v = inputs()
  o = ops.linear_attention(q, k, v, feature_map="relu", normalize=False, scale=0.3)
  want = quadratic(jnp.maximum(q, 0), jnp.maximum(k, 0), v, causal=True, normalize=False, scale=0.3)
  assert_close(o, want, 1e-4, 1e-5)


def test_random_features_match_their_definition():
  """Without normalisation (no stabiliser) the features are exactly the paper's."""
  q, k, v = inputs()
  key = jax.random.PRNGKey(7)
  m, scale = 32, D**-0.5
  for name, orth in (("performer_positive", False), ("favor+", True), ("performer_trig", False)):
    w = ops.random_projection(key, m, D, orthogonal=orth)
    xq, xk = q * scale**0.5, k * scale**0.5
    if name == "performer_trig":
      phi = lambda x: jnp.exp(0.5 * jnp.sum(x * x, -1, keepdims=True)) * jnp.concatenate(
          [jnp.cos(x @ w.T), jnp.sin(x @ w.T)], -1) / math.sqrt(m)
    else:
      phi = lambda x: jnp.exp(x @ w.T - 0.5 * jnp.sum(x * x, -1, keepdims=True)) / math.sqrt(m)
    o = ops.linear_attention(q, k, v, feature_map=name, key=key, num_features=m, normalize=False)
    assert_close(o, quadratic(phi(xq), phi(xk), v, causal=True, normalize=False), 1e-4, 1e-4)
    # Normalised, the query stabiliser cancels: same as the quadratic form.
    o = ops.linear_attention(q, k, v, feature_map=name, projection=w)
    assert_close(o, quadratic(phi(xq), phi(xk), v, causal=True), 1e-3, 1e-4)


def test_orthogonal_projection():
  w = ops.random_projection(jax.random.PRNGKey(0), 20, 8, orthogonal=True)
  assert w.shape == (20, 8)
  block = w[:8] / jnp.linalg.norm(w[:8], axis=1, keepdims=True)
  assert_close(block @ block.T, jnp.eye(8), 1e-5, 1e-5)


def test_same_key_same_features_other_key_other_features():
  q, k, v = inputs()
  f = lambda key: ops.linear_attention(q, k, v, feature_map="favor+", key=key, num_features=16)
  a, b = f(jax.random.PRNGKey(1)), f(jax.random.PRNGKey(1))
  c = f(jax.random.PRNGKey(2))
  assert_close(a, b, 0, 0)
  assert float(jnp.max(jnp.abs(a - c))) > 1e-3


def test_many_random_features_approach_softmax():
  """MSE to exact softmax attention falls with m and beats ELU+1 (fixed key: deterministic)."""
  kq, kk, kv = keys(11, 3)
  t, d = 128, 16
  q, k = rand(kq, (1, t, 1, d), scale=0.5), rand(kk, (1, t, 1, d), scale=0.5)
  v = rand(kv, (1, t, 1, 4))
  logits = jnp.einsum("bihd,bjhd->bhij", q, k) * d**-0.5
  logits = jnp.where(jnp.tril(jnp.ones((t, t), bool)), logits, -jnp.inf)
  exact = jnp.einsum("bhij,bjhv->bihv", jax.nn.softmax(logits, -1), v)
  mse = lambda o: float(jnp.mean((o - exact) ** 2))
  elu_err = mse(ops.linear_attention(q, k, v))
  for name in ("favor+", "performer_trig"):
    errs = [mse(ops.linear_attention(q, k, v, feature_map=name, key=jax.random.PRNGKey(0),
                                     num_features=m)) for m in (8, 4096)]
    assert errs[1] < errs[0] / 20, (name, errs)
    assert errs[1] < elu_err / 5, (name, errs, elu_err)
    assert errs[1] < 2e-4, (name, errs)


@pytest.mark.parametrize("name", ["relu", "favor+"])
def test_underflowing_denominator_stays_finite(name):
  """All-zero features (ReLU of negative inputs; FAVOR+ keys far from every
  projection direction, with a state so that keys are not stabilised) make
  the denominator 0: the eps floor keeps the output and its gradient finite,
  and an eager FAVOR+ call says so."""
  q, k, v = inputs()
  if name == "relu":
    q, k = -jnp.abs(q) - 1.0, -jnp.abs(k) - 1.0
  else:
    k = k + 60.0  # exp(w.k - |k|^2/2) underflows to exactly 0.0 in float32
  f = lambda q: ops.linear_attention(q, k, v, feature_map=name, key=jax.random.PRNGKey(0),
                                     num_features=16, return_state=True)[0]
  if name == "favor+":
    with pytest.warns(RuntimeWarning, match=r"normaliser of \d+ query position"):
      o = f(q)
  else:
    o = f(q)
  assert_close(o, jnp.zeros_like(o), 0, 1e-6)
  g = jax.jit(jax.grad(lambda q: jnp.sum(f(q))))(q)
  assert np.all(np.isfinite(np.asarray(g)))


@pytest.mark.parametrize("name", ["performer_positive", "favor+"])
def test_large_norms_are_stabilised(name):
  """q and k ten times larger: every key feature underflowed before (all-zero
  outputs). Now query t reads every key shifted by the same running maximum
  M_t, which cancels: wherever the float64 normaliser of those shifted
  features is representable (above eps with margin), the output equals the
  exact normalised attention of these features."""
  q, k, v = inputs()
  q, k = 10.0 * q, 10.0 * k
  m = 16
  w = ops.random_projection(jax.random.PRNGKey(4), m, D, orthogonal=name == "favor+")
  with warnings.catch_warnings():  # a few queries barely overlap any key: warned
    warnings.simplefilter("ignore", RuntimeWarning)
    o = np.asarray(ops.linear_attention(q, k, v, feature_map=name, projection=w))
  x64 = lambda x: np.asarray(x, np.float64) * D**-0.25  # sqrt of the softmax scale
  w64 = np.asarray(w, np.float64)
  log_phi = lambda x: x @ w64.T - 0.5 * np.sum(x * x, -1, keepdims=True) - 0.5 * np.log(m)
  uq, uk = log_phi(x64(q)), log_phi(x64(k))  # [B, T, H, m]
  uq = uq - uq.max(-1, keepdims=True)
  shift = np.maximum.accumulate(uk.max(-1), axis=1)  # [B, T, H]
  # weight[b, h, i, j] = sum_r exp(uq_i - M_i + uk_j) for j <= i
  wts = np.einsum("bihr,bjhr->bhij", np.exp(uq), np.exp(uk - shift.max(1, keepdims=True)[..., None]))
  wts = wts * np.exp(shift.max(1, keepdims=True) - shift).transpose(0, 2, 1)[..., None]
  wts = np.where(np.tril(np.ones((T, T), bool)), wts, 0.0)
  den = wts.sum(-1)  # [B, H, T]
  want = np.einsum("bhij,bjhv->bihv", wts / den[..., None], np.asarray(v, np.float64))
  ok = np.swapaxes(den, 1, 2) > 1e-4  # [B, T, H]
  assert ok.mean() > 0.8, ok.mean()
  assert_close(o[ok], want[ok], 1e-3, 1e-4)


def test_bidirectional_gradients_match_quadratic_form():
  causal = False
  q, k, v = inputs()
  s0 = jnp.abs(rand(jax.random.PRNGKey(5), (B, H, D, V + 1)))
  want = grads_of(lambda q, k, v: quadratic(elu1(q), elu1(k), v, causal=causal, seg=SEG),
                  (q, k, v), (0, 1, 2))
  for form in FORMS:
    got = grads_of(lambda q, k, v: ops.linear_attention(
        q, k, v, causal=causal, form=form, chunk_size=16, segment_ids=SEG), (q, k, v), (0, 1, 2))
    assert_tree_close(got, want, 1e-3, 1e-4)
  # The initial state's gradient agrees across forms.
  gs = [jax.grad(lambda s: jnp.sum(jnp.sin(ops.linear_attention(
      q, k, v, causal=causal, form=form, chunk_size=16, initial_state=s))))(s0) for form in FORMS]
  assert_tree_close(gs[1:], [gs[0]] * 2, 1e-4, 1e-5)
  assert float(jnp.max(jnp.abs(gs[0]))) > 0


@pytest.mark.parametrize("name", ["favor+", "performer_trig"])  # elu: test_conformance.py
def test_step_decoding_matches_full(name):
  q, k, v = inputs(t=9)
  w = ops.random_projection(jax.random.PRNGKey(3), 16, D, orthogonal=True)
  kw = dict(feature_map=name, projection=None if name == "elu" else w)
  o, state = ops.linear_attention(q[:, :4], k[:, :4], v[:, :4], return_state=True, **kw)
  outs = [o]
  step = jax.jit(lambda s, q, k, v: ops.linear_attention_step(s, q, k, v, **kw))
  for t in range(4, 9):
    o_t, state = step(state, q[:, t], k[:, t], v[:, t])
    outs.append(o_t[:, None])
  full, final = ops.linear_attention(q, k, v, return_state=True, **kw)
  assert_close(jnp.concatenate(outs, 1), full, 1e-4, 1e-5)
  assert_close(state, final, 1e-4, 1e-5)


def test_jit_vmap_grad():
  q, k, v = inputs()
  key = jax.random.PRNGKey(0)
  f = lambda q, k, v: ops.linear_attention(q, k, v, feature_map="favor+", key=key,
                                           num_features=16, causal=False)
  assert_close(jax.jit(f)(q, k, v), f(q, k, v), 1e-5, 1e-6)
  vm = jax.vmap(f)(q[None], k[None], v[None])
  assert_close(vm[0], f(q, k, v), 1e-5, 1e-6)
  g = jax.jit(jax.grad(lambda q: jnp.sum(f(q, k, v))))(q)
  assert np.all(np.isfinite(np.asarray(g))) and float(jnp.max(jnp.abs(g))) > 0


def test_bad_inputs():
  q, k, v = inputs()
  f = ops.linear_attention
  with pytest.raises(ValueError, match=r"feature_map must be one of \['elu', 'relu'"):
    f(q, k, v, feature_map="cosine")
  with pytest.raises(ValueError, match="pass key="):
    f(q, k, v, feature_map="favor+")
  with pytest.raises(ValueError, match="projection must have shape"):
    f(q, k, v, feature_map="favor+", projection=jnp.ones((4, D + 1)))
  with pytest.raises(ValueError, match="initial_state must have shape"):
    f(q, k, v, initial_state=jnp.zeros((B, H, D, V)))  # V + 1 columns when normalised
  with pytest.raises(ValueError, match="v must have shape"):
    f(q, k, v[:, :3])
  with pytest.raises(ValueError, match="num_features must be an integer >= 1"):
    f(q, k, v, feature_map="favor+", key=jax.random.PRNGKey(0), num_features=0)


def test_orthogonal_projection_is_unbiased_and_orthogonal():
  """Rows within a block are orthogonal; directions have no preferred sign."""
  from linear_attention.ops.feature_maps import random_projection
  w = random_projection(jax.random.PRNGKey(0), 64 * 200, 64, orthogonal=True)
  block = w[:64] / jnp.linalg.norm(w[:64], axis=1, keepdims=True)
  assert_close(block @ block.T, jnp.eye(64), atol=1e-4, rtol=0)
  # Without the sign correction of QR every block's first row has w[0] < 0.
  first = np.asarray(w[::64, 0])
  assert 0.3 < np.mean(first > 0) < 0.7, np.mean(first > 0)
  assert abs(float(jnp.mean(w))) < 0.02
