"""The delta-rule engine (ops/delta.py) beyond the conformance suite: strong
decays, the gate at zero, continuation, normalize_qk, boundedness over 64k
tokens, the two triangular inverses, float64 gradients and its own checks."""

from __future__ import annotations

import functools

import jax
import jax.test_util
import jax.numpy as jnp
import numpy as np
import pytest

from linear_attention import common
from linear_attention.ops import delta
from linear_attention.engines import chunks
from tests.helpers import assert_close, assert_tree_close, grads_of, keys, rand
from tests.ops import conformance as cf


def unit(x):
  """L2-normalised over the last axis (what callers pass as keys)."""
  return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def make_inputs(seed, b=2, t=37, h=2, dk=8, dv=6, gated=True, min_log_decay=-1.0,
                dtype=jnp.float32):
  """q, k (unit), v, beta in (0, 2), log_decay in [min_log_decay, 0] (or None), s0."""
  ks = keys(seed, 6)
  q = rand(ks[0], (b, t, h, dk), dtype)
  k = unit(rand(ks[1], (b, t, h, dk))).astype(dtype)
  v = rand(ks[2], (b, t, h, dv), dtype)
  beta = jax.random.uniform(ks[3], (b, t, h), jnp.float32, 0.05, 1.95)
  g = (jax.random.uniform(ks[4], (b, t, h), jnp.float32, min_log_decay, 0.0)
       if gated else None)
  s0 = rand(ks[5], (b, h, dk, dv), scale=0.5)
  return q, k, v, beta, g, s0


@jax.jit
def reference(q, k, v, beta, g=None, s0=None, segment_ids=None):
  """The conformance suite's plain float32 recurrence, ``(o, final state)``."""
  arrays = (q, k, v, beta) + (() if g is None else (g,))
  return cf.ref_delta(arrays, s0, segment_ids)


def jit_grads(fn, args, argnums):
  """``grads_of`` compiled as one program (eager autodiff dispatches op by op)."""
  argnums = tuple(argnums)
  return jax.jit(lambda a: grads_of(fn, a, argnums))(tuple(args))


def run(form, q, k, v, beta, g, s0, chunk_size=16, **kw):
  return delta.delta_rule(q, k, v, beta, g, form=form, chunk_size=chunk_size,
                          initial_state=s0, return_state=True, **kw)


# --------------------------------------------------------------------- forward
# Most tests share the default shapes of make_inputs and chunk_size=16 so that
# the jit cache of the forms is reused across tests (compiles dominate time).


@pytest.mark.parametrize("chunk_size", [16, 64, 128])
def test_strong_decay_finite_and_matching(chunk_size):
  # Log decays down to -20 per step: the cumulative sum within a chunk reaches
  # thousands; no exp may see a large positive number.
  q, k, v, beta, g, s0 = make_inputs(3, b=1, t=150, min_log_decay=-20.0)
  g = g.at[:, 60:90].set(-20.0)
  want = reference(q, k, v, beta, g, s0)
  for form in ("chunk", "parallel"):
    got = run(form, q, k, v, beta, g, s0, chunk_size=chunk_size)
    assert_tree_close(got, want, rtol=1e-4, atol=1e-4)
  if chunk_size == 64:
    args = (q, k, v, beta, g, s0)
    got = jit_grads(lambda *a: run("chunk", *a, chunk_size=64), args, range(6))
    assert_tree_close(got, jit_grads(reference, args, range(6)), rtol=1e-3, atol=1e-4)


def test_gated_with_zero_decay_is_deltanet():
  q, k, v, beta, _, s0 = make_inputs(4, gated=False)
  zero = jnp.zeros(beta.shape)
  for form in ("chunk",):  # the forms agree: test_conformance.py
    a = delta.gated_deltanet(q, k, v, beta, zero, form=form, chunk_size=16, initial_state=s0,
                             return_state=True)
    b = delta.deltanet(q, k, v, beta, form=form, chunk_size=16, initial_state=s0,
                       return_state=True)
    assert_tree_close(a, b, rtol=1e-5, atol=1e-5)


def test_chunk_continues_from_its_final_state():
  q, k, v, beta, g, s0 = make_inputs(6)
  whole = run("chunk", q, k, v, beta, g, s0)
  first = run("chunk", *(x[:, :19] for x in (q, k, v, beta, g)), s0)
  second = run("chunk", *(x[:, 19:] for x in (q, k, v, beta, g)), first[1])
  assert_close(jnp.concatenate([first[0], second[0]], axis=1), whole[0])
  assert_close(second[1], whole[1])


def test_normalize_qk_flag():
  q, k, v, beta, g, s0 = make_inputs(8)
  k = 3.0 * k
  got = delta.gated_deltanet(q, k, v, beta, g, normalize_qk=True, chunk_size=16)
  assert_close(got, delta.gated_deltanet(unit(q), unit(k), v, beta, g, chunk_size=16),
               rtol=1e-5, atol=1e-5)
  o, _ = delta.deltanet_step(s0, q[:, 0], k[:, 0], v[:, 0], beta[:, 0], normalize_qk=True)
  seq = delta.deltanet(q, k, v, beta, normalize_qk=True, chunk_size=16, initial_state=s0)
  assert_close(o, seq[:, 0])


def test_bounded_over_64k_tokens():
  # L2-normalised keys and beta in (0, 2): every transition is non-expansive,
  # so the state stays bounded however long the sequence.
  t = 65536
  ks = keys(11, 4)
  q, k = rand(ks[0], (1, t, 1, 8)), rand(ks[1], (1, t, 1, 8))
  v = jnp.clip(rand(ks[2], (1, t, 1, 8)), -3.0, 3.0)
  beta = jax.random.uniform(ks[3], (1, t, 1), jnp.float32, 0.0, 1.99)
  o, state = jax.jit(functools.partial(delta.deltanet, normalize_qk=True, return_state=True))(
      q, k, v, beta)
  o = np.asarray(o)
  assert np.all(np.isfinite(o)) and np.all(np.isfinite(np.asarray(state)))
  # Along any unit key the content is at most beta |v| / (1 - |1 - beta|),
  # ~ 600 here in the worst case; in practice it stays of the order of |v|.
  assert float(jnp.max(jnp.abs(state))) < 100.0
  late, early = np.abs(o[:, -4096:]).max(), np.abs(o[:, :4096]).max()
  assert late < 4 * early + 1.0


@pytest.mark.parametrize("n", [1, 5, 24])
def test_unit_lower_inverses(n):
  # Both inverses of I + L (block doubling for the chunk form, forward
  # substitution for the parallel form), sizes that are not powers of two.
  l = jnp.tril(rand(keys(16, 1)[0], (3, n, n), scale=0.5), -1)
  want = np.linalg.inv(np.eye(n) + np.asarray(l, np.float64))
  assert_close(jax.jit(chunks.unit_lower_inverse)(l), want, rtol=1e-4, atol=1e-4)
  assert_close(jax.jit(chunks.unit_lower_inverse_rows)(l), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n", [5, 16])
def test_unit_lower_inverse_gradient(n):
  # The written-out VJP (dL = -X^T dX X^T on the strict lower triangle) against automatic
  # differentiation of a dense inverse, in float64. Entries on and above the diagonal are not
  # read by the inverse, so their gradient is zero.
  with jax.enable_x64(True):
    l = jnp.tril(rand(keys(17, 1)[0], (2, n, n), scale=0.4).astype(jnp.float64), -1)
    l = l + 3.0 * jnp.triu(jnp.ones((n, n), jnp.float64))
    ct = rand(keys(18, 1)[0], (2, n, n)).astype(jnp.float64)
    ours = jax.grad(lambda l: jnp.sum(chunks.unit_lower_inverse(l) * ct))(l)
    dense = jax.grad(lambda l: jnp.sum(jnp.linalg.inv(jnp.eye(n) + jnp.tril(l, -1)) * ct))(l)
    assert_close(ours, dense, rtol=1e-10, atol=1e-10)
    assert not np.any(np.triu(np.asarray(ours)))
    jax.test_util.check_grads(chunks.unit_lower_inverse, (jnp.tril(l, -1),), order=1,
                              modes=("rev",), atol=1e-6, rtol=1e-6)


# -------------------------------------------------------------------- backward


# Gradient compiles are the slowest part of this file: every form with the
# gate (which exercises every code path), the ungated chunk form once.


def test_check_grads_float64():
  with jax.enable_x64(True):
    q, k, v, beta, g, s0 = (None if x is None else x.astype(jnp.float64)
                            for x in make_inputs(13, b=1, t=5, h=1, dk=3, dv=2))
    # Three chunks of two with a segment boundary inside the second one.
    seg = jnp.array([[0, 0, 0, 1, 1]])
    fn = lambda q, k, v, beta, g, s0: run("chunk", q, k, v, beta, g, s0, chunk_size=2,
                                          segment_ids=seg)
    o, state = fn(q, k, v, beta, g, s0)
    assert o.dtype == jnp.float64 and state.dtype == jnp.float64
    jax.test_util.check_grads(fn, (q, k, v, beta, g, s0), order=1, modes=("rev",),
                              atol=1e-6, rtol=1e-6)


# ---------------------------------------------------------------------- errors


def _bad_calls():
  q, k, v, beta, g, s0 = make_inputs(14, b=1, t=4, h=2, dk=4, dv=3)
  dr = delta.delta_rule
  z = jnp.zeros((1, 2, 4, 3))
  return [
      (lambda: dr(q, k, v, beta[..., :1]), r"beta must have shape \[1, 4, 2\]"),
      (lambda: dr(q, k, v, beta.at[0, 0, 0].set(2.5)), r"beta must be >= 0 and <= 2"),
      (lambda: dr(q, k, v, beta.at[0, 0, 0].set(-0.1)), r"beta must be >= 0 and <= 2"),
      (lambda: dr(q, k, v, beta, g[..., None]), r"log_decay must have shape \[1, 4, 2\]"),
      (lambda: dr(q, k[:, :3], v, beta), r"k must have shape"),
      (lambda: dr(q, k, v[:, :, :1], beta), r"v must have a multiple of the 2 heads of q and k"),
      (lambda: dr(q, k.astype(jnp.bfloat16), v, beta), r"must share one dtype"),
      (lambda: dr(q, k, v, beta, chunk_size=0), r"chunk_size must be an integer >= 1"),
      (lambda: delta.delta_rule_step(z, q[:, 0], k[:, 0], v[:, 0], beta[:, 0, :1]),
       r"beta must have shape \[1, 2\]"),
      (lambda: delta.gated_deltanet(q, k, v, beta, None), r"log_decay must be a \[B, T, H\]"),
  ]


@pytest.mark.parametrize("case", range(len(_bad_calls())))
def test_bad_input_raises(case):
  fn, match = _bad_calls()[case]
  with pytest.raises(ValueError, match=match):
    fn()


def test_range_checks_skipped_under_jit():
  # Traced values cannot be read: the documented behaviour is no check.
  q, k, v, beta, g, _ = make_inputs(15, b=1, t=4)
  out = jax.jit(delta.delta_rule)(q, k, v, beta.at[0, 0, 0].set(2.5), g)
  assert out.shape == v.shape
