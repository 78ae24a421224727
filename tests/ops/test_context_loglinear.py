"""``context=`` for log-linear attention: sharded against unsharded on fake CPU devices.

The output, the final state ``(S, position)`` and the gradients of every floating input
(``level_weights`` and the initial state's levels included), rtol 2e-4, on meshes
``(4,)`` and ``(2, 2)``: the aligned path (no segments or initial state, ``T / P`` a
power of two), packed segments crossing device edges with an initial state at an odd
position, a per-channel decay, a slice length that is not a power of two, and a shared
top level (``L`` smaller than ``log2(T) + 1``). One subprocess (:mod:`tests.ops.multidevice`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from linear_attention import ops
from linear_attention.engines.context import SeqContext
from tests.helpers import assert_tree_close, keys, rand, value_and_grads
from tests.ops import multidevice
from tests.ops.test_context import BOTH, TOL, _compare

B, T, H, K, V = 2, 32, 2, 4, 3
CHUNK = 4


def _inputs(seed, t=T, levels=6, vector=False):
  kq, kk, kv, kg, kl, ks = keys(seed, 6)
  g_shape = (B, t, H, K) if vector else (B, t, H)
  return (rand(kq, (B, t, H, K)), rand(kk, (B, t, H, K)), rand(kv, (B, t, H, V)),
          -jax.random.uniform(kg, g_shape), jax.nn.softplus(rand(kl, (B, t, H, levels))),
          rand(ks, (B, H, levels, K, V)))


def _op(**fixed):
  def op(q, k, v, g, lam, s0=None, **kw):
    init = None if s0 is None else (s0, jnp.array([3.0, 10.0]))
    o, (s, pos) = ops.loglinear_decay_attention(q, k, v, g, lam, chunk_size=CHUNK,
                                                initial_state=init, **fixed, **kw)
    return o, s, pos
  return op


def case_aligned():
  """No segments, no initial state, 8 tokens a device: the aligned Fenwick form per slice,
  with every level distinct (L = 6 = log2(32) + 1), and with a shared top level (L = 3)."""
  q, k, v, g, lam, _ = _inputs(0)
  _compare(_op(return_state=True), (q, k, v, g, lam), seg=False, state=False, meshes=BOTH)
  _compare(_op(return_state=True), (q, k, v, g, lam[..., :3]), seg=False, state=False)


def case_segments_and_initial_state():
  """Segments inside slices and on the edges 8 and 16, an initial state at positions 3 and
  10 (off the grid), a per-head and a per-channel decay; L = 4 shares the top level."""
  for vector, levels in ((False, 4), (True, 6)):
    q, k, v, g, lam, s0 = _inputs(1, levels=levels, vector=vector)
    _compare(_op(), (q, k, v, g, lam, s0), meshes=BOTH if vector else ("seq4",))


def case_unaligned_slices():
  """T = 24: 6 tokens a device (not a power of two), segments across the edges 6 and 12,
  no initial state, L = 3."""
  seg = np.array([[0] * 4 + [1] * 9 + [2] * 11, [0] * 12 + [1] * 12], np.int32)
  q, k, v, g, lam, _ = _inputs(2, t=24, levels=3)
  fn = _op(return_state=True)
  want = value_and_grads(lambda *a: fn(*a, segment_ids=seg), (q, k, v, g, lam))
  mesh = jax.make_mesh((4,), ("seq",))
  with jax.set_mesh(mesh):
    got = value_and_grads(lambda *a: fn(*a, segment_ids=seg, context=SeqContext(mesh)),
                          (q, k, v, g, lam))
  assert_tree_close(got, want, **TOL)


def case_variants():
  """loglinear_ssd and loglinear_gla pass the context through (no segments: aligned)."""
  kx, kdt, kb, kc, kl, kg = keys(3, 6)
  x, dt = rand(kx, (B, T, H, V)), jax.nn.softplus(rand(kdt, (B, T, H)))
  bb, cc = rand(kb, (B, T, 1, K)), rand(kc, (B, T, 1, K))
  lam = jax.nn.softplus(rand(kl, (B, T, H, 6)))
  a = -jnp.arange(1.0, H + 1)
  _compare(lambda x, dt, bb, cc, lam, **kw: ops.loglinear_ssd(
      x, dt, a, bb, cc, lam, chunk_size=CHUNK, **kw), (x, dt, bb, cc, lam), seg=False)
  q, k, v, g, lam, _ = _inputs(4, vector=True)
  _compare(lambda q, k, v, g, lam, **kw: ops.loglinear_gla(
      q, k, v, g, lam, chunk_size=CHUNK, **kw), (q, k, v, g, lam), seg=False,
      meshes=("seq4_auto",))


CASES = multidevice.cases(globals())


def _run_cases() -> None:
  multidevice.run_cases(CASES)


def test_four_devices():
  """Every case of ``CASES`` on 4 fake CPU devices, in one subprocess."""
  multidevice.check_in_subprocess("tests.ops.test_context_loglinear", CASES)
