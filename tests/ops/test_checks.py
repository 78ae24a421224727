"""The shared value checks (``common.check_range``) and the gate/decay checks on them.

Every gate or decay refuses NaN (a comparison such as ``max >= 0`` is False for NaN, which
once let ``A = NaN`` through as ``-inf``), and the message names the argument the caller
passed, not an internal one.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from linear_attention import ops
from linear_attention import common
from linear_attention.ops import ssm

NAN = float("nan")


def _ssd_inputs(b=1, t=8, h=2, p=4, n=3):
  ks = jax.random.split(jax.random.PRNGKey(0), 3)
  x = jax.random.normal(ks[0], (b, t, h, p))
  dt = jnp.full((b, t, h), 0.5)
  B = jax.random.normal(ks[1], (b, t, 1, n))
  C = jax.random.normal(ks[2], (b, t, 1, n))
  return x, dt, B, C


def test_check_range_refuses_nan_and_names_its_index():
  with pytest.raises(ValueError, match=r"g must be <= 0.*got NaN at index \(1, 0\) \(1 of 4"):
    common.check_range("g", np.array([[-1.0, -2.0], [NAN, -3.0]]), high=0.0)
  # The worst entry, not the maximum of the others, and where it is.
  with pytest.raises(ValueError, match=r"got a maximum of 2.0 at index \(1,\)"):
    common.check_range("g", np.array([-1.0, 2.0, 1.0]), high=0.0)
  with pytest.raises(ValueError, match=r"must be > 0 and < 1.*minimum of 0.0"):
    common.check_range("gamma", np.array([0.0, 0.5]), low=0.0, high=1.0, strict=True)
  common.check_range("g", np.array([-np.inf, 0.0]), high=0.0)  # -inf and 0 are legal
  common.check_range("g", np.zeros((0,)), high=0.0)  # empty
  jax.jit(lambda g: common.check_range("g", g, high=0.0) or g)(jnp.array([NAN]))  # traced: no check


@pytest.mark.parametrize("op", ["ssd", "ssd_step", "loglinear_ssd"])
def test_ssd_refuses_nan_in_A_and_dt_under_their_names(op):
  x, dt, B, C = _ssd_inputs()
  good_A = jnp.array([-1.0, -0.5])

  def call(dt, A):
    if op == "ssd":
      return ops.ssd(x, dt, A, B, C)
    if op == "ssd_step":
      state = jnp.zeros((1, 2, 3, 4))
      return ops.ssd_step(state, x[:, 0], dt[:, 0], A, B[:, 0], C[:, 0])
    levels = jnp.ones((1, 8, 2, 4))  # one weight per Fenwick level
    return ops.loglinear_ssd(x, dt, A, B, C, levels)

  call(dt, good_A)
  # Before: NaN in A gave a finite output equal to A = -inf.
  with pytest.raises(ValueError, match=r"^A must be < 0 .*got NaN at index \(0,\)"):
    call(dt, jnp.array([NAN, -1.0]))
  with pytest.raises(ValueError, match=r"^A must be < 0 .*maximum of 0.0"):
    call(dt, jnp.array([-1.0, 0.0]))
  # Before: a NaN in dt was reported as the internal log_decay with the others' maximum.
  with pytest.raises(ValueError, match=r"^dt must be >= 0 .*got NaN"):
    call(dt.at[0, 0, 1].set(NAN), good_A)


@pytest.mark.parametrize("name,call", [
    ("log_g", lambda q, g: ops.gla(q, q, q, g)),
    ("log_g", lambda q, g: ops.loglinear_gla(q, q, q, g, jnp.ones((1, 8, 2, 4)))),
    ("log_decay", lambda q, g: ops.decay_linear_attention(q, q, q, g)),
])
def test_decay_gates_refuse_nan_naming_the_argument(name, call):
  q = jax.random.normal(jax.random.PRNGKey(1), (1, 8, 2, 4))
  g = -jnp.ones((1, 8, 2, 4)).at[0, 3, 1, 2].set(NAN)
  # Before: "got a maximum of -1.0", the maximum of the entries that were fine.
  with pytest.raises(ValueError, match=rf"^{name} must be <= 0 .*got NaN at index \(0, 3, 1, 2\)"):
    call(q, g)


def test_retention_gamma_refuses_nan():
  q = jax.random.normal(jax.random.PRNGKey(1), (1, 8, 2, 4))
  with pytest.raises(ValueError, match=r"^gamma must lie in \(0, 1\), got values from nan"):
    ops.retention(q, q, q, gamma=jnp.array([0.9, NAN]))


def test_selective_scan_refuses_nan_in_A():
  ks = jax.random.split(jax.random.PRNGKey(2), 3)
  b, t, d, n = 1, 6, 3, 2
  x = jax.random.normal(ks[0], (b, t, d))
  dt = jnp.full((b, t, d), 0.1)
  A = -jnp.ones((d, n))
  B = jax.random.normal(ks[1], (b, t, n))
  C = jax.random.normal(ks[2], (b, t, n))
  ssm.selective_scan(x, dt, A, B, C)
  with pytest.raises(ValueError, match=r"^A must be <= 0 .*got NaN at index \(1, 0\)"):
    ssm.selective_scan(x, dt, A.at[1, 0].set(NAN), B, C)
  with pytest.raises(ValueError, match=r"^dt \(\+ dt_bias\) must be >= 0 .*got NaN"):
    ssm.selective_scan(x, dt.at[0, 2, 1].set(NAN), A, B, C, dt_softplus=False)


@pytest.mark.parametrize("feature_map", ["favor+", "performer_positive", "performer_trig"])
def test_random_features_on_huge_inputs_name_q_or_k(feature_map):
  # Before: favor+ raised "log_decay must be <= 0", an argument the caller never passed.
  small = jax.random.normal(jax.random.PRNGKey(3), (1, 8, 2, 4))
  key = jax.random.PRNGKey(4)
  cases = [("q", small * 1e20, small), ("k", small, small * 1e20)]
  if feature_map == "performer_trig":  # its normalised queries drop exp(|q|^2/2): no overflow
    cases = cases[1:]
  for name, q, k in cases:
    with pytest.raises(ValueError, match="^" + re.escape(
        f"{name} is too large for feature_map={feature_map!r}")):
      ops.linear_attention(q, k, small, feature_map=feature_map, key=key)
  out = ops.linear_attention(small, small, small, feature_map=feature_map, key=key)
  assert bool(jnp.all(jnp.isfinite(out)))


# ----------------------------------------------------------------------------- issue 41 item 8


def _parts_with_one_wrong(shapes):
  """Every multi-part state of ``shapes`` with exactly one part one rank short."""
  good = [jnp.zeros(s, jnp.float32) for s in shapes]
  for i, s in enumerate(shapes):
    parts = list(good)
    parts[i] = jnp.zeros(s[:-1] if len(s) > 1 else s + (1,), jnp.float32)
    yield i, tuple(parts)


@pytest.mark.parametrize("shapes", [
    [(1, 2, 3, 4), (1, 2, 3), (1, 2)],   # mlstm_step: (C, n, m)
    [(1, 2, 3, 3, 4), (1,)],             # loglinear_*_step: (S, position)
])
def test_check_step_state_first_refuses_one_wrongly_ranked_part(shapes):
  """Each part is checked (with ``any`` in place of ``all`` this passes a wrong part)."""
  ranks = [len(s) for s in shapes]
  common.check_step_state_first(tuple(jnp.zeros(s) for s in shapes), "S", *ranks)
  for i, state in _parts_with_one_wrong(shapes):
    with pytest.raises(ValueError, match=r"^state \(the first argument"):
      common.check_step_state_first(state, "S", *ranks)


def test_mlstm_step_names_a_state_with_one_wrongly_ranked_part():
  b, h, k, v = 1, 2, 3, 4
  q = jnp.ones((b, h, k))
  gates = jnp.zeros((b, h))
  for i, state in _parts_with_one_wrong([(b, h, k, v), (b, h, k), (b, h)]):
    with pytest.raises(ValueError, match=r"^state \(the first argument"):
      ops.mlstm_step(state, q, q, jnp.ones((b, h, v)), gates, gates)
