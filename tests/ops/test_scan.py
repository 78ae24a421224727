"""The elementwise scan engine beyond the conformance suite: reverse scans,
complex and trailing shapes, float64 gradients, long sequences, its own checks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from linear_attention.ops.scan import SCAN_FORMS, linear_scan
from tests.helpers import assert_close, keys, rand


def loop_scan(a, b, h0=None, reverse=False, segment_ids=None):
  """The recurrence written as a Python loop over time (the reference)."""
  a, b = np.asarray(a), np.asarray(b)
  t = b.shape[1]
  h = np.zeros_like(b[:, 0]) if h0 is None else np.asarray(h0).astype(b.dtype)
  out = np.zeros_like(b)
  order = range(t - 1, -1, -1) if reverse else range(t)
  prev = None
  for i in order:
    a_i = a[:, i]
    if segment_ids is not None and prev is not None:
      new = np.asarray(segment_ids)[:, i] != np.asarray(segment_ids)[:, prev]
      a_i = np.where(new.reshape((-1,) + (1,) * (a_i.ndim - 1)), 0, a_i)
    h = a_i * h + b[:, i]
    out[:, i] = h
    prev = i
  return out, h


def inputs(seed, shape, dtype=jnp.float32):
  ka, kb, kh = keys(seed, 3)
  a = jax.random.uniform(ka, shape, jnp.float32, -1.0, 1.0).astype(dtype)  # both signs
  b = rand(kb, shape, dtype)
  h0 = rand(kh, shape[:1] + shape[2:], dtype)
  return a, b, h0


# Forward scans run in test_conformance.py; the reverse direction here.
@pytest.mark.parametrize("form", SCAN_FORMS)
@pytest.mark.parametrize("t, reverse, with_h0", [(1, True, True), (37, True, True)])
def test_reverse_forms_match_loop(form, t, reverse, with_h0):
  a, b, h0 = inputs(0, (2, t, 3, 2))
  h0 = h0 if with_h0 else None
  h, state = linear_scan(a, b, h0=h0, form=form, chunk_size=16, reverse=reverse,
                         return_state=True)
  ref_h, ref_state = loop_scan(a, b, h0, reverse)
  assert h.shape == b.shape and h.dtype == b.dtype and state.dtype == jnp.float32
  assert_close(h, ref_h, 1e-5, 1e-5)
  assert_close(state, ref_state, 1e-5, 1e-5)


@pytest.mark.parametrize("form", SCAN_FORMS)
def test_plain_trailing_shape_and_complex(form):
  a, b, _ = inputs(1, (2, 21))
  assert_close(linear_scan(a, b, form=form, chunk_size=8), loop_scan(a, b)[0], 1e-5, 1e-5)
  ka, kb = keys(2, 2)
  ac = (0.9 * jnp.exp(1j * rand(ka, (1, 21, 3)))).astype(jnp.complex64)
  bc = (rand(kb, (1, 21, 3)) + 1j * rand(ka, (1, 21, 3))).astype(jnp.complex64)
  h, state = linear_scan(ac, bc, form=form, chunk_size=8, return_state=True)
  ref = loop_scan(ac, bc)[0]
  assert h.dtype == jnp.complex64 and state.dtype == jnp.complex64
  np.testing.assert_allclose(np.asarray(h), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("form", SCAN_FORMS)
@pytest.mark.parametrize("reverse", [True])  # forward: test_conformance.py
def test_packed_segments_equal_separate_calls(form, reverse):
  lengths = [5, 17, 1, 14]
  t = sum(lengths)
  a, b, h0 = inputs(3, (1, t, 4))
  seg = jnp.asarray(np.repeat(np.arange(len(lengths)), lengths)[None])
  h, state = linear_scan(a, b, h0=h0, form=form, chunk_size=16, reverse=reverse,
                         segment_ids=seg, return_state=True)
  edges = np.cumsum([0] + lengths)
  # h0 belongs to the first segment in scan order: the last one when reversed.
  first = len(lengths) - 1 if reverse else 0
  for i, (s, e) in enumerate(zip(edges[:-1], edges[1:])):
    hs, st = linear_scan(a[:, s:e], b[:, s:e], h0=h0 if i == first else None, form=form,
                         chunk_size=16, reverse=reverse, return_state=True)
    assert_close(h[:, s:e], hs, 1e-5, 1e-5, err_msg=f"segment {i}")
    if i == (0 if reverse else len(lengths) - 1):
      assert_close(state, st, 1e-5, 1e-5)
  assert_close(h, loop_scan(a, b, h0, reverse, seg)[0], 1e-5, 1e-5)


@pytest.mark.parametrize("form", SCAN_FORMS)
def test_gradients_float64(form):
  with jax.enable_x64(True):
    a, b, h0 = inputs(4, (1, 9, 2), jnp.float64)
    seg = jnp.asarray([[0, 0, 0, 1, 1, 1, 1, 2, 2]])
    for reverse in (False, True):
      fn = lambda a, b, h0: linear_scan(a, b, h0=h0, form=form, chunk_size=4, reverse=reverse,
                                        segment_ids=seg, return_state=True)
      check_grads(fn, (a, b, h0), order=1, modes=("rev",), atol=1e-6, rtol=1e-6)


def test_long_sequence_near_one_is_finite():
  t = 65536
  ka, kb = keys(8, 2)
  a = 1.0 - 1e-4 * jax.random.uniform(ka, (1, t, 2))
  b = rand(kb, (1, t, 2))
  fn = jax.jit(jax.value_and_grad(lambda a, b: jnp.sum(linear_scan(a, b, chunk_size=256)[:, -1])))
  val, g = fn(a, b)
  assert np.isfinite(float(val)) and np.all(np.isfinite(np.asarray(g)))
  assert_close(linear_scan(a, b, chunk_size=256)[:, -1], loop_scan(a, b)[1], 1e-3, 1e-2)


def test_bad_inputs():
  a, b, h0 = inputs(9, (2, 8, 3))
  with pytest.raises(ValueError, match="^a must have shape"):
    linear_scan(a[..., :1], b)
  with pytest.raises(ValueError, match="^b must be"):
    linear_scan(a, jnp.ones((2, 8, 3), jnp.int32))
