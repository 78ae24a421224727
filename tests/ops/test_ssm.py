"""S4D and Mamba's selective scan beyond the conformance suite: S4D without an
initial state, its kernel, bidirectional S4D, ungrouped B and C, the identities
between Mamba, the scan engine and S4D, float64 gradients, long sequences and
their own checks."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from linear_attention.ops import ssm
from linear_attention.ops.scan import linear_scan
from tests.helpers import assert_close, keys, rand

# ----------------------------------------------------------------------------- S4D


def loop_s4d(u, ar, ai, b, c, log_dt, d_skip=None, h0=None):
  """ZOH-discretised diagonal SSM as a loop, complex128."""
  u = np.asarray(u, np.float64)
  a = np.asarray(ar, np.float64) + 1j * np.asarray(ai, np.float64)
  dt = np.exp(np.asarray(log_dt, np.float64))[:, None]
  abar = np.exp(dt * a)
  bbar = (abar - 1) / a * np.asarray(b)
  h = np.zeros(u.shape[:1] + a.shape, complex) if h0 is None else np.asarray(h0, complex)
  y = np.zeros_like(u)
  for t in range(u.shape[1]):
    h = abar * h + bbar * u[:, t, :, None]
    y[:, t] = 2 * np.sum(np.asarray(c) * h, axis=-1).real
  if d_skip is not None:
    y = y + u * np.asarray(d_skip)
  return y, h


def s4d_inputs(seed, t, d=3, n=4, kind="lin", dtype=jnp.float32):
  k = keys(seed, 6)
  ar, ai = ssm.s4d_init(kind, n, d)
  ar = ar * jax.random.uniform(k[0], (d, n), jnp.float32, 0.5, 1.5)  # distinct per channel
  b = (rand(k[1], (d, n)) + 1j * rand(k[2], (d, n))).astype(jnp.complex64)
  c = (rand(k[3], (2, d, n)) + 1j * rand(k[4], (2, d, n))).astype(jnp.complex64)
  log_dt = jnp.log(jnp.linspace(0.01, 0.2, d))
  u = rand(k[5], (2, t, d), dtype)
  h0 = (rand(k[0], (2, d, n)) + 1j * rand(k[1], (2, d, n))).astype(jnp.complex64)
  return u, ar, ai, b, c, log_dt, rand(k[2], (d,)), h0


def test_s4d_init():
  ar, ai = ssm.s4d_init("lin", 4)
  assert_close(ar, -0.5 * np.ones(4)), assert_close(ai, math.pi * np.arange(4))
  ar, ai = ssm.s4d_init("inv", 4, channels=2)
  assert ar.shape == (2, 4)
  assert_close(ai[1], 4 / math.pi * (4 / (2 * np.arange(4) + 1) - 1))
  ar, ai = ssm.s4d_init("real", 3)
  assert_close(ar, [-1, -2, -3]), assert_close(ai, np.zeros(3))
  log_dt = ssm.s4d_log_dt_init(jax.random.PRNGKey(0), 100)
  assert float(jnp.min(log_dt)) >= math.log(1e-3) and float(jnp.max(log_dt)) <= math.log(0.1)


@pytest.mark.parametrize("form", ssm.S4D_FORMS)
@pytest.mark.parametrize("t, with_h0", [(37, False)])  # with h0: test_conformance.py
def test_s4d_forms_match_loop(form, t, with_h0):
  u, ar, ai, b, c, log_dt, d_skip, h0 = s4d_inputs(0, t)
  h0 = h0 if with_h0 else None
  y, state = ssm.s4d(u, ar, ai, b, c[0], log_dt, d_skip, form=form, chunk_size=16,
                     initial_state=h0, return_state=True)
  ref_y, ref_state = loop_s4d(u, ar, ai, b, c[0], log_dt, d_skip, h0)
  assert y.dtype == u.dtype and state.dtype == jnp.complex64
  assert_close(y, ref_y, 1e-4, 1e-4)
  np.testing.assert_allclose(np.asarray(state), ref_state, rtol=1e-4, atol=1e-4)


def test_s4d_kernel_is_the_impulse_response_of_the_recurrence():
  """The convolution identity: K = the recurrence's response to a unit impulse."""
  _, ar, ai, b, c, log_dt, _, _ = s4d_inputs(1, 1, kind="inv")
  t, d = 50, ar.shape[0]
  impulse = jnp.zeros((1, t, d)).at[:, 0].set(1.0)
  response = ssm.s4d(impulse, ar, ai, b, c[0], log_dt, form="recurrent")[0]  # [T, D]
  assert_close(ssm.s4d_kernel(ar, ai, b, c[0], log_dt, t).T, response, 1e-5, 1e-5)


@pytest.mark.parametrize("form", ["fft", "chunk", "recurrent"])
def test_s4d_bidirectional(form):
  u, ar, ai, b, c, log_dt, d_skip, _ = s4d_inputs(2, 37)
  y = ssm.s4d(u, ar, ai, b, c, log_dt, d_skip, form=form, bidirectional=True, chunk_size=16)
  # Backward part: the causal SSM (read by C[1]) on the reversed sequence, one token later.
  fwd = loop_s4d(u, ar, ai, b, c[0], log_dt, d_skip)[0]
  bwd = loop_s4d(np.asarray(u)[:, ::-1], ar, ai, b, c[1], log_dt)[0][:, ::-1]
  bwd = np.concatenate([bwd[:, 1:], np.zeros_like(bwd[:, :1])], axis=1)
  assert_close(y, fwd + bwd, 1e-4, 1e-4)


@pytest.mark.parametrize("form", ["fft", "recurrent"])
@pytest.mark.parametrize("bidirectional", [True])  # causal: test_conformance.py
def test_s4d_packed_segments_equal_separate_calls(form, bidirectional):
  lengths = [9, 1, 14]
  u, ar, ai, b, c, log_dt, d_skip, _ = s4d_inputs(3, sum(lengths))
  cc = c if bidirectional else c[0]
  seg = jnp.asarray(np.repeat(np.arange(len(lengths)), lengths)[None].repeat(2, 0))
  y = ssm.s4d(u, ar, ai, b, cc, log_dt, d_skip, form=form, segment_ids=seg,
              bidirectional=bidirectional)
  edges = np.cumsum([0] + lengths)
  for i, (s, e) in enumerate(zip(edges[:-1], edges[1:])):
    ys = ssm.s4d(u[:, s:e], ar, ai, b, cc, log_dt, d_skip, form=form,
                 bidirectional=bidirectional)
    assert_close(y[:, s:e], ys, 1e-5, 1e-5, err_msg=f"segment {i}")


@pytest.mark.parametrize("form", ["fft", "recurrent"])
def test_s4d_gradients_float64(form):
  with jax.enable_x64(True):
    u, ar, ai, b, c, log_dt, d_skip, _ = s4d_inputs(5, 6, d=2, n=2, dtype=jnp.float64)
    b, c = b.real.astype(jnp.float64), c[0].real.astype(jnp.float64)
    fn = lambda u, ar, ai, b, c, log_dt: ssm.s4d(u, ar, ai, b, c, log_dt, form=form)
    args = (u, ar.astype(jnp.float64), ai.astype(jnp.float64), b, c, log_dt.astype(jnp.float64))
    check_grads(fn, args, order=1, modes=("rev",), atol=1e-5, rtol=1e-5)


def test_s4d_bad_inputs():
  u, ar, ai, b, c, log_dt, d_skip, h0 = s4d_inputs(8, 5)
  with pytest.raises(ValueError, match="^A_real must be <= 0"):
    ssm.s4d(u, -ar, ai, b, c[0], log_dt)
  with pytest.raises(ValueError, match="^C must"):
    ssm.s4d(u, ar, ai, b, c[0], log_dt, bidirectional=True)
  with pytest.raises(ValueError, match="^log_dt"):
    ssm.s4d(u, ar, ai, b, c[0], log_dt[:1])
  with pytest.raises(ValueError, match="initial_state"):
    ssm.s4d(u, ar, ai, b, c, log_dt, initial_state=h0, bidirectional=True)
  # The complex state: the suite passes it as (real, imag), so its dtype is checked here.
  for bad in (h0.real.astype(jnp.float16), h0.real.astype(jnp.int32)):
    with pytest.raises(ValueError, match="^state must be complex64"):
      ssm.s4d_step(bad, u[:, 0], ar, ai, b, c[0], log_dt)
    with pytest.raises(ValueError, match="^initial_state must be complex64"):
      ssm.s4d(u, ar, ai, b, c[0], log_dt, initial_state=bad)


# ------------------------------------------------------------------ selective scan


def loop_selective(x, dt, a, b, c, d_skip=None, z=None, dt_bias=None, softplus=True, h0=None,
                   segment_ids=None):
  """Mamba-1 as a float64 loop; ``b, c`` ``[B, T, N]`` or ``[B, T, G, N]``."""
  x, dt, a, b, c = (np.asarray(v, np.float64) for v in (x, dt, a, b, c))
  bsz, t, d = x.shape
  if b.ndim == 4:
    rep = d // b.shape[2]
    b, c = np.repeat(b, rep, axis=2), np.repeat(c, rep, axis=2)
  else:
    b, c = b[:, :, None], c[:, :, None]
  delta = dt + (0 if dt_bias is None else np.asarray(dt_bias))
  delta = np.log1p(np.exp(delta)) if softplus else delta
  h = np.zeros((bsz, d, a.shape[1])) if h0 is None else np.asarray(h0, np.float64)
  y = np.zeros_like(x)
  for i in range(t):
    if segment_ids is not None and i > 0:
      new = np.asarray(segment_ids)[:, i] != np.asarray(segment_ids)[:, i - 1]
      h = np.where(new[:, None, None], 0, h)
    h = np.exp(delta[:, i, :, None] * a) * h + (delta[:, i] * x[:, i])[..., None] * b[:, i]
    y[:, i] = np.sum(h * c[:, i], axis=-1)
  if d_skip is not None:
    y = y + x * np.asarray(d_skip)
  if z is not None:
    z = np.asarray(z, np.float64)
    y = y * z / (1 + np.exp(-z))
  return y, h


def mamba_inputs(seed, t, d=4, n=3, groups=None, dtype=jnp.float32):
  k = keys(seed, 9)
  bc_shape = (2, t, n) if groups is None else (2, t, groups, n)
  return dict(
      x=rand(k[0], (2, t, d), dtype), dt=rand(k[1], (2, t, d), dtype),
      A=-jnp.exp(rand(k[2], (d, n), scale=0.5)), B=rand(k[3], bc_shape, dtype),
      C=rand(k[4], bc_shape, dtype), D=rand(k[5], (d,)), z=rand(k[6], (2, t, d), dtype),
      dt_bias=rand(k[7], (d,), scale=0.5), h0=rand(k[8], (2, d, n)))


@pytest.mark.parametrize("form", ssm.SELECTIVE_FORMS)
@pytest.mark.parametrize("t, groups", [(37, None)])  # grouped B, C: test_conformance.py
def test_selective_forms_match_loop(form, t, groups):
  p = mamba_inputs(0, t, groups=groups)
  y, state = ssm.selective_scan(p["x"], p["dt"], p["A"], p["B"], p["C"], p["D"], p["z"],
                                dt_bias=p["dt_bias"], form=form, chunk_size=16,
                                initial_state=p["h0"], return_state=True)
  ref_y, ref_state = loop_selective(p["x"], p["dt"], p["A"], p["B"], p["C"], p["D"], p["z"],
                                    p["dt_bias"], h0=p["h0"])
  assert y.dtype == p["x"].dtype and state.dtype == jnp.float32 and state.shape == (2, 4, 3)
  assert_close(y, ref_y, 1e-4, 1e-4)
  assert_close(state, ref_state, 1e-4, 1e-4)


def test_mamba_is_the_scan_engine_over_a_dn_state():
  """Mamba-1 == linear_scan with a = exp(dt A), b = dt x B, read by C."""
  p = mamba_inputs(1, 21)
  delta = jax.nn.softplus(p["dt"])
  a = jnp.exp(delta[..., None] * p["A"])  # [B, T, D, N]
  b = (delta * p["x"])[..., None] * p["B"][:, :, None]
  h = linear_scan(a, b, form="recurrent")
  expected = jnp.einsum("btdn,btn->btd", h, p["C"])
  assert_close(ssm.selective_scan(p["x"], p["dt"], p["A"], p["B"], p["C"]), expected, 1e-5, 1e-5)


def test_time_invariant_mamba_is_a_real_s4d():
  """Constant dt, B, C: Mamba == S4D with A_imag = 0, C/2 and B undoing the hold."""
  t, d, n = 30, 3, 4
  k = keys(2, 4)
  x = rand(k[0], (2, t, d))
  a = -jnp.exp(rand(k[1], (d, n), scale=0.5))
  b_vec, c_vec = rand(k[2], (n,)), rand(k[3], (n,))
  log_dt = jnp.log(jnp.asarray([0.05, 0.1, 0.3]))
  dt = jnp.exp(log_dt)
  y_mamba = ssm.selective_scan(
      x, jnp.broadcast_to(dt, (2, t, d)), a, jnp.broadcast_to(b_vec, (2, t, n)),
      jnp.broadcast_to(c_vec, (2, t, n)), dt_softplus=False)
  dta = dt[:, None] * a
  b_s4d = b_vec * dta / jnp.expm1(dta)  # ZOH's (e^{dtA} - 1) / A B  ->  dt B
  c_s4d = jnp.broadcast_to(c_vec / 2, (d, n))  # S4D reads 2 Re <C, h>
  for form in ("fft", "recurrent"):
    y_s4d = ssm.s4d(x, a, jnp.zeros_like(a), b_s4d, c_s4d, log_dt, form=form)
    assert_close(y_s4d, y_mamba, 1e-4, 1e-4, err_msg=form)


@pytest.mark.parametrize("form", ["chunk", "recurrent"])
def test_selective_gradients_float64(form):
  with jax.enable_x64(True):
    p = mamba_inputs(5, 5, d=2, n=2, dtype=jnp.float64)
    p = {k: v.astype(jnp.float64) for k, v in p.items()}
    fn = lambda x, dt, a, b, c, d, z, h0: ssm.selective_scan(
        x, dt, a, b, c, d, z, form=form, chunk_size=2, initial_state=h0, return_state=True)
    args = tuple(p[k] for k in ("x", "dt", "A", "B", "C", "D", "z", "h0"))
    check_grads(fn, args, order=1, modes=("rev",), atol=1e-5, rtol=1e-5)


def test_selective_long_sequence_a_near_one_stays_finite():
  t, d, n = 65536, 2, 2
  k = keys(8, 4)
  x, b, c = rand(k[0], (1, t, d)), rand(k[1], (1, t, n)), rand(k[2], (1, t, n))
  dt = jnp.full((1, t, d), -8.0)  # softplus(-8) ~ 3e-4: exp(dt A) ~ 1 - 3e-8
  a = -jnp.full((d, n), 1e-4)
  fn = jax.jit(jax.value_and_grad(
      lambda x, a: jnp.mean(ssm.selective_scan(x, dt, a, b, c, chunk_size=256) ** 2),
      argnums=(0, 1)))
  val, (gx, ga) = fn(x, a)
  assert np.isfinite(float(val))
  assert np.all(np.isfinite(np.asarray(gx))) and np.all(np.isfinite(np.asarray(ga)))


def test_selective_bad_inputs():
  p = mamba_inputs(9, 5, groups=2)
  base = [p["x"], p["dt"], p["A"], p["B"], p["C"]]
  with pytest.raises(ValueError, match="^A must be <= 0"):
    ssm.selective_scan(p["x"], p["dt"], -p["A"], p["B"], p["C"])
  with pytest.raises(ValueError, match="^C must have the shape of B"):
    ssm.selective_scan(*base[:4], jnp.concatenate([p["C"], p["C"]], axis=2))
  with pytest.raises(ValueError, match="^C must have the shape of B"):
    ssm.selective_scan(*base[:4], p["C"][:, :, 0])
  with pytest.raises(ValueError, match="^dt"):
    ssm.selective_scan(p["x"], -jnp.abs(p["dt"]), *base[2:], dt_softplus=False)
  three = jnp.concatenate([p["B"], p["B"][:, :, :1]], axis=2)
  with pytest.raises(ValueError, match="groups"):
    ssm.selective_scan(*base[:3], three, three)
