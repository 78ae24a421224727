"""Short causal depthwise convolution beyond the conformance suite: widths 1 and
4 with and without activation, a last segment shorter than the window, float64
gradients, its own checks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from linear_attention.ops.conv import causal_conv1d
from tests.helpers import assert_close, keys, rand


def loop_conv(x, weight, bias=None, past=None, activation=None):
  """``y_t = sum_w weight[w] * x_{t - W + 1 + w}`` with ``past`` before ``x``."""
  x, weight = np.asarray(x, np.float64), np.asarray(weight, np.float64)
  w = weight.shape[0]
  bsz, t, d = x.shape
  past = np.zeros((bsz, w - 1, d)) if past is None else np.asarray(past, np.float64)
  xp = np.concatenate([past, x], axis=1)
  y = np.zeros((bsz, t, d))
  for i in range(t):
    y[:, i] = np.sum(xp[:, i:i + w] * weight[None], axis=1)
  if bias is not None:
    y = y + np.asarray(bias)
  if activation == "silu":
    y = y / (1 + np.exp(-y))
  return y, xp[:, xp.shape[1] - (w - 1):]


def inputs(seed, t, d=3, w=4, dtype=jnp.float32):
  kx, kw, kb, ks = keys(seed, 4)
  return (rand(kx, (2, t, d), dtype), rand(kw, (w, d)), rand(kb, (d,)),
          rand(ks, (2, w - 1, d)))


@pytest.mark.parametrize("t", [1, 2, 37])
@pytest.mark.parametrize("w", [1, 4])
@pytest.mark.parametrize("activation", [None, "silu"])
def test_matches_loop(t, w, activation):
  x, weight, bias, past = inputs(0, t, w=w)
  y, state = causal_conv1d(x, weight, bias, initial_state=past, return_state=True,
                           activation=activation)
  ref_y, ref_state = loop_conv(x, weight, bias, past, activation)
  assert y.dtype == x.dtype and state.shape == (2, w - 1, 3)
  assert_close(y, ref_y, 1e-5, 1e-5)
  assert_close(state, ref_state, 1e-6, 1e-6)


def test_packed_segments_equal_separate_calls():
  lengths = [2, 7, 1, 6]
  x, weight, bias, past = inputs(2, sum(lengths))
  seg = jnp.asarray(np.repeat(np.arange(len(lengths)), lengths)[None].repeat(2, 0))
  y, state = causal_conv1d(x, weight, bias, initial_state=past, return_state=True,
                           segment_ids=seg)
  edges = np.cumsum([0] + lengths)
  for i, (s, e) in enumerate(zip(edges[:-1], edges[1:])):
    ys, st = causal_conv1d(x[:, s:e], weight, bias, initial_state=past if i == 0 else None,
                           return_state=True)
    assert_close(y[:, s:e], ys, 1e-5, 1e-5, err_msg=f"segment {i}")
  assert_close(state, st, 1e-6, 1e-6)


def test_gradients_float64():
  with jax.enable_x64(True):
    x, weight, bias, past = inputs(3, 6, dtype=jnp.float64)
    weight, bias, past = (v.astype(jnp.float64) for v in (weight, bias, past))
    seg = jnp.asarray([[0, 0, 1, 1, 1, 1]] * 2)
    fn = lambda x, w, b, p: causal_conv1d(x, w, b, initial_state=p, return_state=True,
                                          segment_ids=seg, activation="silu")
    check_grads(fn, (x, weight, bias, past), order=1, modes=("rev",), atol=1e-6, rtol=1e-6)


def test_bad_inputs():
  x, weight, bias, past = inputs(5, 8)
  with pytest.raises(ValueError, match="^weight"):
    causal_conv1d(x, weight[:, :2])
  with pytest.raises(ValueError, match="^bias"):
    causal_conv1d(x, weight, bias[:2])
  with pytest.raises(ValueError, match="^activation"):
    causal_conv1d(x, weight, activation="relu")


@pytest.mark.parametrize("last", [1, 2])
def test_state_of_a_last_segment_shorter_than_the_window_reads_zeros_before_it(last):
  # Window 4 keeps 3 inputs: a last segment of 1 or 2 tokens must not hand the previous
  # segment's inputs to the decoder (the state is the separate call's, zeros in front).
  lengths = [5, last]
  x, weight, bias, past = inputs(6, sum(lengths))
  seg = jnp.asarray(np.repeat(np.arange(len(lengths)), lengths)[None].repeat(2, 0))
  _, state = causal_conv1d(x, weight, bias, initial_state=past, return_state=True,
                           segment_ids=seg)
  _, alone = causal_conv1d(x[:, -last:], weight, bias, return_state=True)
  assert_close(state, alone, 1e-6, 1e-6)
  np.testing.assert_array_equal(np.asarray(state[:, :3 - last]), 0.0)
