"""Shared test utilities: random inputs, closeness checks, gradient checks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# Tolerances for bfloat16 inputs with float32 state and accumulation: bfloat16
# keeps 8 mantissa bits (relative rounding 2**-8 ~ 0.4%) and every form rounds
# its inputs once, so outputs agree with the float32 reference to a few
# rounding steps of the output's own magnitude.
BF16_RTOL = 5e-2
BF16_ATOL = 5e-2


def rand(key, shape, dtype=jnp.float32, scale=1.0):
  """Standard normal array times ``scale``."""
  return (scale * jax.random.normal(key, shape, jnp.float32)).astype(dtype)


def keys(seed: int, n: int):
  """``n`` independent PRNG keys from one seed."""
  return list(jax.random.split(jax.random.PRNGKey(seed), n))


def assert_close(actual, expected, rtol=1e-4, atol=1e-4, err_msg=""):
  """``np.testing.assert_allclose`` on float32 copies; also checks finiteness."""
  a = np.asarray(jnp.asarray(actual, jnp.float32))
  e = np.asarray(jnp.asarray(expected, jnp.float32))
  assert np.all(np.isfinite(a)), f"non-finite values in result {err_msg}"
  np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, err_msg=err_msg)


def assert_tree_close(actual, expected, rtol=1e-4, atol=1e-4):
  """``assert_close`` leaf by leaf over two pytrees of the same structure."""
  la, ta = jax.tree_util.tree_flatten(actual)
  le, te = jax.tree_util.tree_flatten(expected)
  assert ta == te, f"tree structures differ: {ta} vs {te}"
  for i, (a, e) in enumerate(zip(la, le)):
    assert_close(a, e, rtol, atol, err_msg=f"leaf {i}")


def grads_of(fn, args, argnums, cotangent_key=0):
  """Gradients of ``sum(fn(*args) * w)`` for a fixed random ``w`` per output leaf.

  A random cotangent (rather than ``sum``) makes every output element matter.
  """

  def loss(*a):
    out = fn(*a)
    leaves = jax.tree_util.tree_leaves(out)
    ks = jax.random.split(jax.random.PRNGKey(cotangent_key), len(leaves))
    return sum(
        jnp.sum(l.astype(jnp.float32) * jax.random.normal(k, l.shape, jnp.float32))
        for l, k in zip(leaves, ks)
    )

  return jax.grad(loss, argnums=argnums)(*args)
