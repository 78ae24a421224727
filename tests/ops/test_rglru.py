"""RG-LRU beyond the conformance suite: document starts without h0 (first token,
packing, steps from None), float64 gradients, stability near a = 1, its checks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from linear_attention.ops.rglru import rg_lru, rg_lru_step
from linear_attention.ops.scan import SCAN_FORMS
from tests.helpers import assert_close, keys, rand


def sigmoid(v):
  return 1 / (1 + np.exp(-v))


def loop_rglru(x, gate_r, gate_i, lam, c=8.0, h0=None, segment_ids=None):
  """The paper's formulas, directly (no log space), in float64."""
  x, gr, gi, lam = (np.asarray(v, np.float64) for v in (x, gate_r, gate_i, lam))
  t = x.shape[1]
  h = np.zeros_like(x[:, 0]) if h0 is None else np.asarray(h0, np.float64)
  out = np.zeros_like(x)
  for i in range(t):
    a = sigmoid(lam) ** (c * sigmoid(gr[:, i]))
    start = np.full(x.shape[0], i == 0 and h0 is None)
    if segment_ids is not None and i > 0:
      start = start | (np.asarray(segment_ids)[:, i] != np.asarray(segment_ids)[:, i - 1])
    mult = np.where(start[:, None], 1.0, np.sqrt(1 - a**2))
    h = np.where(start[:, None], 0.0, a * h) + mult * sigmoid(gi[:, i]) * x[:, i]
    out[:, i] = h
  return out, h


def inputs(seed, t, d=4, dtype=jnp.float32):
  kx, kr, ki, kl, kh = keys(seed, 5)
  lam = jax.random.uniform(kl, (d,), jnp.float32, 0.0, 6.0)
  return (rand(kx, (2, t, d), dtype), rand(kr, (2, t, d), dtype), rand(ki, (2, t, d), dtype),
          lam.astype(dtype), rand(kh, (2, d), dtype))


def test_first_token_skips_normalisation():
  x, gr, gi, lam, _ = inputs(1, 3)
  h = rg_lru(x, gr, gi, lam)
  assert_close(h[:, 0], jax.nn.sigmoid(gi[:, 0]) * x[:, 0], 1e-6, 1e-6)


@pytest.mark.parametrize("form", ["chunk"])
def test_packed_segments_equal_separate_calls(form):
  """With and without h0: each segment starts a document (the suite passes h0)."""
  lengths = [6, 1, 20, 10]
  x, gr, gi, lam, h0 = inputs(2, sum(lengths))
  seg = jnp.asarray(np.repeat(np.arange(len(lengths)), lengths)[None].repeat(2, 0))
  for first_h0 in (None, h0):
    h, state = rg_lru(x, gr, gi, lam, h0=first_h0, form=form, chunk_size=16,
                      segment_ids=seg, return_state=True)
    edges = np.cumsum([0] + lengths)
    for i, (s, e) in enumerate(zip(edges[:-1], edges[1:])):
      hs, st = rg_lru(x[:, s:e], gr[:, s:e], gi[:, s:e], lam, form=form, chunk_size=16,
                      h0=first_h0 if i == 0 else None, return_state=True)
      assert_close(h[:, s:e], hs, 1e-5, 1e-5, err_msg=f"segment {i}")
    assert_close(state, st, 1e-5, 1e-5)
    assert_close(h, loop_rglru(x, gr, gi, lam, h0=first_h0, segment_ids=seg)[0], 1e-5, 1e-5)


def test_steps_equal_sequence():
  x, gr, gi, lam, _ = inputs(3, 7)
  h, state = rg_lru(x, gr, gi, lam, return_state=True)
  s = None
  for i in range(x.shape[1]):
    h_i, s = rg_lru_step(s, x[:, i], gr[:, i], gi[:, i], lam)
    assert_close(h_i, h[:, i], 1e-5, 1e-5, err_msg=f"step {i}")
  assert_close(s, state, 1e-5, 1e-5)


@pytest.mark.parametrize("form", SCAN_FORMS)
def test_gradients_float64(form):
  with jax.enable_x64(True):
    x, gr, gi, lam, h0 = inputs(4, 7, d=2, dtype=jnp.float64)
    seg = jnp.asarray([[0, 0, 0, 1, 1, 1, 1]] * 2)
    fn = lambda *args: rg_lru(*args[:4], h0=args[4], form=form, chunk_size=4,
                              segment_ids=seg, return_state=True)
    check_grads(fn, (x, gr, gi, lam, h0), order=1, modes=("rev",), atol=1e-6, rtol=1e-6)


def test_long_sequence_a_near_one_stays_finite():
  t, d = 65536, 2
  kx, kr = keys(7, 2)
  x, gr = rand(kx, (1, t, d)), rand(kr, (1, t, d))
  gi = jnp.zeros((1, t, d))
  # a ~ 1 - 1e-4, and a == 1 exactly in float32 (sqrt(1 - a^2) = 0, infinite slope).
  lam = jnp.asarray([10.0, 200.0])
  fn = jax.jit(jax.value_and_grad(
      lambda x, lam: jnp.sum(rg_lru(x, gr, gi, lam, chunk_size=256) ** 2), argnums=(0, 1)))
  val, (gx, glam) = fn(x, lam)
  assert np.isfinite(float(val))
  assert np.all(np.isfinite(np.asarray(gx))) and np.all(np.isfinite(np.asarray(glam)))
  h = rg_lru(x, gr, gi, lam, chunk_size=256)
  # The normalisation keeps the state at the scale of the inputs.
  assert float(jnp.max(jnp.abs(h))) < 10.0


def test_bad_inputs():
  x, gr, gi, lam, h0 = inputs(8, 5)
  with pytest.raises(ValueError, match="^gate_r"):
    rg_lru(x, gr[:, :4], gi, lam)
  with pytest.raises(ValueError, match="^log_lambda_param"):
    rg_lru(x, gr, gi, lam[:2])
  with pytest.raises(ValueError, match="^c must"):
    rg_lru(x, gr, gi, lam, c=0.0)
