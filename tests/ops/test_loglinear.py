"""Log-linear attention checks beyond the conformance suite (``tests/ops/conformance.py``
has the specs of ``loglinear_ssd`` and ``loglinear_gla``): reductions to the plain ops,
the Fenwick buckets, O(log T) decoding states, far positions and argument checks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from linear_attention import ops
from tests import helpers

FORMS = ("parallel", "chunk", "recurrent")
B, T, H, G, N, P = 2, 45, 2, 1, 8, 6


def _ssd_inputs(seed, t=T, levels=7):
  rng = np.random.default_rng(seed)
  n = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
  x, dt = n(B, t, H, P), jax.nn.softplus(n(B, t, H) - 1.0)
  A = -jnp.asarray(rng.uniform(0.5, 2.0, H), jnp.float32)
  lam = jax.nn.softplus(n(B, t, H, levels))
  return x, dt, A, n(B, t, G, N), n(B, t, G, N), lam, n(H)


@pytest.mark.parametrize("levels", [1, 3, 7])
@pytest.mark.parametrize("form", FORMS)
def test_unit_level_weights_give_mamba2(form, levels):
  """lambda = 1 on every level sums the buckets back into one state: plain SSD."""
  x, dt, A, Bm, C, lam, D = _ssd_inputs(0, levels=levels)
  ones = jnp.ones_like(lam)
  o, (s, pos) = ops.loglinear_ssd(x, dt, A, Bm, C, ones, D, form=form, chunk_size=8,
                                  return_state=True)
  want, want_s = ops.ssd(x, dt, A, Bm, C, D, return_state=True)
  helpers.assert_close(o, want, 1e-4, 1e-4)
  helpers.assert_close(s.sum(axis=2), want_s, 1e-4, 1e-4)
  np.testing.assert_array_equal(np.asarray(pos), T)


@pytest.mark.parametrize("form", FORMS)
def test_buckets_follow_the_fenwick_partition(form):
  """With one-hot weights on level l, no decay and q = k = v = 1, the output counts
  the keys in level l's bucket: 2^(l-1) where bit l-1 of t is set, else 0."""
  t, levels = 40, 7
  q = jnp.ones((1, t, 1, 1))
  v = jnp.ones((1, t, 1, 1))
  no_decay = jnp.zeros((1, t, 1))
  pos = np.arange(t)
  for lvl in range(levels):
    lam = jax.nn.one_hot(jnp.full((1, t, 1), lvl), levels)
    o = ops.loglinear_decay_attention(q, q, v, no_decay, lam, scale=1.0, form=form,
                                      chunk_size=8)
    want = np.ones(t) if lvl == 0 else ((pos >> (lvl - 1)) & 1) * 2 ** (lvl - 1)
    np.testing.assert_allclose(np.asarray(o)[0, :, 0, 0], want, err_msg=f"level {lvl}")


def test_decoding_keeps_log_t_states():
  """After t tokens, exactly popcount(t) levels are occupied (at most log2(t) + 1)."""
  levels = 8
  x, dt, A, Bm, C, lam, D = _ssd_inputs(1, t=100, levels=levels)
  state = ops.init_loglinear_state(B, H, levels, N, P)
  step = jax.jit(ops.loglinear_ssd_step)
  outs = []
  for t in range(100):
    y, state = step(state, x[:, t], dt[:, t], A, Bm[:, t], C[:, t], lam[:, t], D)
    outs.append(y)
    occupied = np.flatnonzero(np.abs(np.asarray(state[0][0, 0])).sum(axis=(1, 2)) > 0)
    want = [lvl for lvl in range(1, levels) if ((t + 1) >> (lvl - 1)) & 1]
    assert list(occupied) == want, (t + 1, occupied)
  helpers.assert_close(jnp.stack(outs, 1), ops.loglinear_ssd(x, dt, A, Bm, C, lam, D),
                       1e-4, 1e-4)


@pytest.mark.parametrize("levels", [3, 24])
def test_far_initial_position_forms_agree(levels):
  """An initial state just below 2^20: pairs inside the call reach levels ~21, so the
  chunk form's shared top level and the old buckets' moves are exercised."""
  x, dt, A, Bm, C, lam, D = _ssd_inputs(2, levels=levels)
  rng = np.random.default_rng(3)
  s0 = (jnp.asarray(rng.standard_normal((B, H, levels, N, P)), jnp.float32),
        jnp.asarray([2.0 ** 20 - 5, 2.0 ** 20 - 40]))
  results = [ops.loglinear_ssd(x, dt, A, Bm, C, lam, D, form=form, chunk_size=8,
                               initial_state=s0, return_state=True) for form in FORMS]
  for form, r in zip(FORMS[1:], results[1:]):
    helpers.assert_tree_close(r, results[0], 1e-4, 1e-4, form)


def test_strong_and_infinite_decays_stay_finite():
  rng = np.random.default_rng(4)
  n = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
  q, k, v = n(B, T, H, N), n(B, T, H, N), n(B, T, H, P)
  g = -20.0 * jnp.abs(n(B, T, H, N))
  g = g.at[:, 7].set(-jnp.inf)
  lam = jax.nn.softplus(n(B, T, H, 4))
  results = []
  for form in FORMS:
    fn = lambda q, g, lam, form=form: ops.loglinear_gla(q, k, v, g, lam, form=form, chunk_size=8)
    results.append(helpers.value_and_grads(fn, (q, g, lam)))
  for form, r in zip(FORMS, results):
    for leaf in jax.tree_util.tree_leaves(r):
      assert np.all(np.isfinite(np.asarray(leaf))), form
    helpers.assert_tree_close(r[0], results[0][0], 1e-4, 1e-4, form)


def test_bad_arguments_name_themselves():
  x, dt, A, Bm, C, lam, D = _ssd_inputs(5, t=4, levels=3)
  with pytest.raises(ValueError, match=r"\blevel_weights must have shape"):
    ops.loglinear_ssd(x, dt, A, Bm, C, lam[:, :3], D)
  with pytest.raises(ValueError, match=r"\blevel_weights must have L >= 1"):
    ops.loglinear_ssd(x, dt, A, Bm, C, lam[..., :0], D)
  with pytest.raises(ValueError, match=r"\binitial_state\[0\] must have shape"):
    ops.loglinear_ssd(x, dt, A, Bm, C, lam, D,
                      initial_state=ops.init_loglinear_state(B, H, 4, N, P))
  with pytest.raises(ValueError, match=r"\binitial_state\[1\] \(position\) must hold"):
    s, _ = ops.init_loglinear_state(B, H, 3, N, P)
    ops.loglinear_ssd(x, dt, A, Bm, C, lam, D, initial_state=(s, jnp.asarray([1.5, 0.0])))
  with pytest.raises(ValueError, match=r"\binitial_state must be a tuple"):
    ops.loglinear_ssd(x, dt, A, Bm, C, lam, D, initial_state=jnp.zeros((B, H, 3, N, P)))


def test_no_decay_and_the_kernel_choice():
  """``log_decay=None`` is no decay (zeros); the Pallas kernel is refused by name."""
  rng = np.random.default_rng(6)
  n = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
  q, k, v, lam = n(B, 9, H, N), n(B, 9, H, N), n(B, 9, H, P), n(B, 9, H, 3)
  helpers.assert_close(ops.loglinear_decay_attention(q, k, v, None, lam),
                       ops.loglinear_decay_attention(q, k, v, jnp.zeros((B, 9, H)), lam),
                       1e-6, 1e-6)
  with pytest.raises(ValueError, match=r"implementation='pallas' is not available"):
    ops.loglinear_decay_attention(q, k, v, None, lam, implementation="pallas")


# The Fenwick chunk form (no segments, no initial state): a dense in-chunk part plus one
# matmul per chunk level. Lengths off the chunk grid and off powers of two, chunk sizes that
# are not powers of two (rounded down inside) or longer than T, L below what T needs.
FENWICK_CASES = [  # (T, L, chunk_size)
    (45, 7, 8),  # 6 chunks: levels 1-3 of chunks, a partial last chunk
    (64, 8, 8),  # N = 8 exactly: the final state's top bucket is every chunk
    (100, 5, 10),  # chunk 10 -> 8; L = 5 < 8 levels needed: shared top over chunk levels
    (37, 3, 16),  # L = 3 < c + 1: the shared top reaches inside the chunk
    (37, 1, 16),  # one level: plain decayed linear attention weighted by lambda
    (1, 4, 16),  # one token
    (20, 9, 64),  # chunk longer than T
]


def _gla_inputs(seed, t, levels, vector):
  rng = np.random.default_rng(seed)
  n = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
  g = -jax.nn.softplus(n(B, t, H, N) if vector else n(B, t, H))
  return n(B, t, H, N), n(B, t, H, N), n(B, t, H, P), g, jax.nn.softplus(n(B, t, H, levels))


@pytest.mark.parametrize("vector", [False, True], ids=["scalar", "vector"])
@pytest.mark.parametrize("t,levels,chunk_size", FENWICK_CASES)
def test_fenwick_chunk_form_matches_parallel(t, levels, chunk_size, vector):
  """Output, final state and every gradient (of both) against the parallel form."""
  args = _gla_inputs(7, t, levels, vector)

  def run(form):
    return lambda q, k, v, g, lam: ops.loglinear_decay_attention(
        q, k, v, g, lam, form=form, chunk_size=chunk_size, return_state=True)

  want = helpers.value_and_grads(run("parallel"), args)
  got = helpers.value_and_grads(run("chunk"), args)
  helpers.assert_tree_close(got, want, 1e-4, 1e-4)


@pytest.mark.parametrize("vector", [False, True], ids=["scalar", "vector"])
def test_fenwick_state_continues_the_sequence(vector):
  """The Fenwick chunk form's final state, fed back as an initial state (the per-level
  path), continues exactly as one call over both parts, and its gradient flows back."""
  t1, levels = 29, 7
  q, k, v, g, lam = _gla_inputs(8, 2 * t1, levels, vector)
  first = lambda x: x[:, :t1]
  second = lambda x: x[:, t1:]

  def split(q, k, v, g, lam):
    o1, s = ops.loglinear_decay_attention(*map(first, (q, k, v, g, lam)), form="chunk",
                                          chunk_size=8, return_state=True)
    o2 = ops.loglinear_decay_attention(*map(second, (q, k, v, g, lam)), form="chunk",
                                       chunk_size=8, initial_state=s)
    return jnp.concatenate([o1, o2], axis=1)

  whole = lambda *a: ops.loglinear_decay_attention(*a, form="chunk", chunk_size=8)
  helpers.assert_tree_close(helpers.value_and_grads(split, (q, k, v, g, lam)),
                            helpers.value_and_grads(whole, (q, k, v, g, lam)), 1e-4, 1e-4)


def test_fenwick_chunk_form_long_strong_decay():
  """Strong decays over 16 chunks stay finite and match the parallel form (the block
  decays are sums of chunk decays, never differences of long cumulative sums)."""
  q, k, v, g, lam = _gla_inputs(9, 256, 10, True)
  g = 10.0 * g
  g = g.at[:, 100].set(-jnp.inf)
  run = lambda form: ops.loglinear_gla(q, k, v, g, lam, form=form, chunk_size=16,
                                       return_state=True)
  helpers.assert_tree_close(run("chunk"), run("parallel"), 1e-4, 1e-4)
