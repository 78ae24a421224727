"""GLA, RetNet, HGRN2, RWKV-6 and Mamba-2 (SSD) beyond the conformance suite.

Forms, steps, packing, bfloat16, transformations and generic bad inputs run
in ``test_conformance.py``. Here: strong decays (down to -20 per step),
continuation from a final state, float64 gradients, the identities between
variants and each variant's own argument checks. Each variant is described
once (inputs with a ``strong`` option, op, the suite's reference).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from linear_attention.ops import decay, gated
from tests import helpers
from tests.ops import conformance as cf

F32 = jnp.float32
FORMS = ("parallel", "chunk", "recurrent")


# -------------------------------------------------------------------- variants


# Inputs come from numpy: jax.random would compile a sampler per shape, seconds
# each on a busy CPU.


def _normal(rng, shape, dtype=F32):
  return jnp.asarray(rng.standard_normal(shape, np.float32)).astype(dtype)


def _uniform(rng, shape, lo, hi, dtype=F32):
  return jnp.asarray(rng.uniform(lo, hi, shape).astype(np.float32)).astype(dtype)


def _log_gate(rng, shape, strong, dtype):
  if strong:  # down to -20 per step
    return _uniform(rng, shape, -20.0, 0.0, dtype)
  return jax.nn.log_sigmoid(2.0 + _normal(rng, shape)).astype(dtype)


def make_qkvg(rng, b, t, h, dk, dv, dtype=F32, strong=False):
  return (_normal(rng, (b, t, h, dk), dtype), _normal(rng, (b, t, h, dk), dtype),
          _normal(rng, (b, t, h, dv), dtype), _log_gate(rng, (b, t, h, dk), strong, dtype))


def make_retention(rng, b, t, h, dk, dv, dtype=F32, strong=False):
  q, k, v, _ = make_qkvg(rng, b, t, h, dk, dv, dtype)
  lo, hi = (1e-6, 0.5) if strong else (0.6, 0.97)
  return q, k, v, _uniform(rng, (h,), lo, hi, dtype)


def make_hgrn2(rng, b, t, h, dk, dv, dtype=F32, strong=False):
  q, _, v, log_f = make_qkvg(rng, b, t, h, dk, dv, dtype, strong)
  return q, log_f, v


def make_rwkv6(rng, b, t, h, dk, dv, dtype=F32, strong=False):
  return make_qkvg(rng, b, t, h, dk, dv, dtype, strong) + (_normal(rng, (h, dk), dtype),)


SSD_HEADS_PER_GROUP = 2


def make_ssd(rng, b, t, h, dk, dv, dtype=F32, strong=False):
  """Mamba-2 inputs with ``2h`` heads in ``h`` groups, ``N = dk``, ``P = dv``."""
  hh = SSD_HEADS_PER_GROUP * h
  x = _normal(rng, (b, t, hh, dv), dtype)
  if strong:  # A * dt down to -20 per step
    dt = _uniform(rng, (b, t, hh), 0.0, 2.0)
    A = -_uniform(rng, (hh,), 1.0, 10.0)
  else:
    dt = jax.nn.softplus(_normal(rng, (b, t, hh)) - 1.0)
    A = -_uniform(rng, (hh,), 0.5, 2.0)
  B, C = _normal(rng, (b, t, h, dk), dtype), _normal(rng, (b, t, h, dk), dtype)
  return x, dt.astype(dtype), A.astype(dtype), B, C, _normal(rng, (hh,), dtype)


class Variant(NamedTuple):
  name: str
  make: Callable
  op: Callable  # (*arrays, **engine_kwargs)
  ref: Callable  # (arrays, s0, seg) -> (o, state): the conformance suite's reference
  timed: tuple  # which arrays have a sequence axis
  state_shape: Callable  # arrays -> [B, H, K, V]


def _qk_state(a):
  return (a[0].shape[0], a[0].shape[2], a[0].shape[3], a[2].shape[3])


VARIANTS = [
    Variant("gla", make_qkvg, gated.gla, cf.ref_gla, (1, 1, 1, 1), _qk_state),
    Variant("retention", make_retention,
            lambda q, k, v, gamma, **kw: gated.retention(q, k, v, gamma=gamma, **kw),
            cf.ref_retention, (1, 1, 1, 0), _qk_state),
    Variant("hgrn2", make_hgrn2, gated.hgrn2, cf.ref_hgrn2, (1, 1, 1), _qk_state),
    Variant("rwkv6", make_rwkv6, gated.rwkv6, cf.ref_rwkv6, (1, 1, 1, 1, 0), _qk_state),
    Variant("ssd", make_ssd, gated.ssd, cf.ref_ssd, (1, 1, 0, 1, 1, 0),
            lambda a: (a[0].shape[0], a[0].shape[2], a[3].shape[3], a[0].shape[3])),
]
IDS = [v.name for v in VARIANTS]
by_variant = pytest.mark.parametrize("var", VARIANTS, ids=IDS)

B_, H_, K_, V_ = 2, 2, 8, 6  # small default shapes (K != V catches transposes)


def _inputs(var, seed, t, b=B_, dtype=F32, strong=False, with_state=True):
  rng = np.random.default_rng(seed)
  arrays = var.make(rng, b, t, H_, K_, V_, dtype, strong)
  s0 = _normal(rng, var.state_shape(arrays)) if with_state else None
  return arrays, s0


# ----------------------------------------------------------------------- tests


@by_variant
def test_chunk_continues_from_final_state(var):
  arrays, s0 = _inputs(var, 4, t=26)

  @jax.jit
  def run(arrays, s0):
    whole = var.op(*arrays, chunk_size=8, initial_state=s0, return_state=True)
    halves = [[a[:, sl] if timed else a for a, timed in zip(arrays, var.timed)]
              for sl in (slice(0, 13), slice(13, 26))]
    o1, s1 = var.op(*halves[0], chunk_size=8, initial_state=s0, return_state=True)
    o2, s2 = var.op(*halves[1], chunk_size=8, initial_state=s1, return_state=True)
    return whole, jnp.concatenate([o1, o2], 1), s2

  (whole, s_whole), o, s2 = run(arrays, s0)
  helpers.assert_close(o, whole)
  helpers.assert_close(s2, s_whole)


@by_variant
def test_strong_decays(var):
  """Log decays down to -20 per step: finite, and equal to the reference for chunks 16/64/128."""
  arrays, s0 = _inputs(var, 5, t=130, b=1, strong=True)
  sizes = (16, 64, 128)
  ref, outs = jax.jit(lambda a: (var.ref(a, s0, None), [
      var.op(*a, chunk_size=cs, initial_state=s0, return_state=True) for cs in sizes]))(arrays)
  for cs, out in zip(sizes, outs):
    helpers.assert_tree_close(out, ref, 2e-4, 2e-4)
  fn = lambda *a: var.op(*a, chunk_size=16, initial_state=s0, return_state=True)
  _, grads = helpers.value_and_grads(fn, arrays)
  for g in grads:
    assert np.all(np.isfinite(np.asarray(g, np.float32)))


def test_check_grads_float64():
  """Numerical gradients of every variant at once (one compile), tiny shapes, chunk form."""
  with jax.enable_x64(True):
    rng = np.random.default_rng(8)
    args, sizes = [], []
    for var in VARIANTS:
      arrays = [a.astype(jnp.float64) for a in var.make(rng, 1, 5, 1, 3, 2)]
      args += arrays + [0.3 * jnp.ones(var.state_shape(arrays), jnp.float64)]
      sizes.append(len(arrays) + 1)

    @jax.jit
    def fn(*a):
      outs, i = [], 0
      for var, n in zip(VARIANTS, sizes):
        outs.append(var.op(*a[i:i + n - 1], chunk_size=2, initial_state=a[i + n - 1],
                           return_state=True))
        i += n
      return outs

    check_grads(fn, tuple(args), order=1, modes=("rev",), eps=1e-5)


# -------------------------------------------------------------- special cases


def test_gla_constant_gate_equals_scalar_engine():
  q, k, v, g = make_qkvg(np.random.default_rng(9), B_, 20, H_, K_, V_)
  scalar = g[..., 0]
  got, expect = jax.jit(lambda: (
      [gated.gla(q, k, v, jnp.broadcast_to(scalar[..., None], g.shape), form=f, chunk_size=8)
       for f in FORMS],
      [decay.decay_linear_attention(q, k, v, scalar, form=f, chunk_size=8) for f in FORMS]))()
  helpers.assert_tree_close(got, expect)


def test_retention_equals_engine_with_log_gamma():
  q, k, v, gamma = make_retention(np.random.default_rng(10), B_, 20, H_, K_, V_)
  np.testing.assert_allclose(gated.retnet_gammas(4),
                             [1 - 1 / 32, 1 - 1 / 64, 1 - 1 / 128, 1 - 1 / 256])

  @jax.jit
  def run():
    log_gamma = jnp.broadcast_to(jnp.log(gamma), (B_, 20, H_))
    step, _ = gated.retention_step(jnp.zeros((B_, H_, K_, V_)), q[:, 0], k[:, 0], v[:, 0])
    return ((gated.retention(q, k, v, gamma=gamma, chunk_size=8),
             decay.decay_linear_attention(q, k, v, log_gamma, chunk_size=8)),
            # The default is the multi-scale 1 - 2 ** (-5 - h).
            (gated.retention(q, k, v, chunk_size=8),
             gated.retention(q, k, v, gamma=gated.retnet_gammas(H_), chunk_size=8)),
            (step, gated.retention(q[:, :1], k[:, :1], v[:, :1])[:, 0]))

  for got, expect in run():
    helpers.assert_close(got, expect)


def test_ssd_equals_engine_with_documented_map():
  x, dt, A, B, C, D = make_ssd(np.random.default_rng(11), B_, 20, 1, K_, V_)  # one group
  bias = jnp.array([0.5, -1.0])

  @jax.jit
  def run():
    mapped = decay.decay_linear_attention(
        jnp.repeat(C, 2, 2), jnp.repeat(B, 2, 2), x * dt[..., None], A * dt, scale=1.0,
        chunk_size=8) + D[:, None] * x
    return ((gated.ssd(x, dt, A, B, C, D, chunk_size=8), mapped),
            # dt_bias and softplus are applied before the map, as in Mamba-2.
            (gated.ssd(x, dt, A, B, C, D, dt_bias=bias, dt_softplus=True, chunk_size=8),
             gated.ssd(x, jax.nn.softplus(dt + bias), A, B, C, D, chunk_size=8)))

  for got, expect in run():
    helpers.assert_close(got, expect)


def test_hgrn2_equals_gla_with_tied_key():
  q, _, v, log_f = make_qkvg(np.random.default_rng(12), B_, 20, H_, K_, V_)
  got, expect = jax.jit(lambda: (
      gated.hgrn2(q, log_f, v, chunk_size=8),
      gated.gla(q, 1.0 - jnp.exp(log_f), v, log_f, scale=1.0, chunk_size=8)))()
  helpers.assert_close(got, expect)


# ---------------------------------------------------------------- bad input


def _bad_cases():
  q, k, v, g = make_qkvg(np.random.default_rng(13), 1, 4, 2, 3, 2)
  u = jnp.zeros((2, 3))
  x, dt, A, B, C, D = make_ssd(np.random.default_rng(14), 1, 4, 2, 3, 2)  # H=4, G=2
  s = jnp.zeros((1, 2, 3, 2))
  return [
      (lambda: gated.gla(q, k, v, g[..., 0]),
       r"log_g must have shape \[1, 4, 2, 3\].*got \[1, 4, 2\]"),
      (lambda: gated.gla_step(s, q[:, 0], k[:, 0], v[:, 0], g[:, 0, :, :2]),
       r"log_g must have shape \[1, 2, 3\].*got \[1, 2, 2\]"),
      (lambda: gated.rwkv6(q, k, v, g[:, :3], u),
       r"log_w must have shape \[1, 4, 2, 3\].*got \[1, 3, 2, 3\]"),
      (lambda: gated.rwkv6(q, k, v, g, u[0]), r"u must have shape \[2, 3\].*got \[3\]"),
      (lambda: gated.rwkv6_step(s, q[:, 0], k[:, 0], v[:, 0], g[:, 0], u.T),
       r"u must have shape \[2, 3\].*got \[3, 2\]"),
      (lambda: gated.retention(q, k, v, gamma=jnp.array([0.9, 1.0])),
       r"gamma must lie in \(0, 1\).*to 1\.0"),
      (lambda: gated.retention(q, k, v, gamma=jnp.array([0.0, 0.5])),
       r"gamma must lie in \(0, 1\), got values from 0\.0"),
      (lambda: gated.retention(q, k, v, gamma=jnp.array([0.9])),
       r"gamma must have shape \[2\].*got \[1\]"),
      (lambda: gated.ssd(x, -dt, A, B, C, D), r"dt must be >= 0"),
      (lambda: gated.ssd(x, dt, A, B, C[:, :, :1], D),
       r"same number of groups, got 2 \(B\) and 1 \(C\)"),
      (lambda: gated.ssd(x, dt, A, jnp.concatenate([B] * 3, 2), jnp.concatenate([C] * 3, 2), D),
       r"must divide the heads of x \(4\), got 6"),
      (lambda: gated.ssd(x, dt, A[:2], B, C, D), r"A must have shape \[4\].*got \[2\]"),
      (lambda: gated.ssd(x, dt, A, B, C, D[:3]), r"D must have shape \[4\].*got \[3\]"),
  ]


@pytest.mark.parametrize("case", range(len(_bad_cases())))
def test_bad_input_raises(case):
  fn, match = _bad_cases()[case]
  with pytest.raises(ValueError, match=match):
    fn()
