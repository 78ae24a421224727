"""mLSTM checks beyond the conformance suite (``tests/ops/conformance.py`` has its spec):
the unstabilised formula in float64, large gate pre-activations, the stabiliser's
invariance, hard resets and the op's own argument checks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from linear_attention import ops
from tests import helpers

FORMS = ("parallel", "chunk", "recurrent")
B, T, H, K, V = 2, 21, 2, 8, 6


def _inputs(seed, t=T):
  """Input gates exp(N(-1, 1.5^2)): see conformance._make_mlstm on the conditioning."""
  rng = np.random.default_rng(seed)
  n = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
  return n(B, t, H, K), n(B, t, H, K), n(B, t, H, V), 1.5 * n(B, t, H) - 1.0, 2.0 + n(B, t, H)


def _unstabilised(q, k, v, ig, fg):
  """The paper's h = C q / max(|n q|, 1) with raw exponential gates, in float64."""
  q, k, v, ig, fg = (np.asarray(x, np.float64) for x in (q, k, v, ig, fg))
  c, n = np.zeros((B, H, K, V)), np.zeros((B, H, K))
  out = np.zeros(v.shape)
  i, f = np.exp(ig), 1.0 / (1.0 + np.exp(-fg))
  for t in range(q.shape[1]):
    c = f[:, t, :, None, None] * c + i[:, t, :, None, None] * k[:, t, :, :, None] * v[:, t, :, None]
    n = f[:, t, :, None] * n + i[:, t, :, None] * k[:, t]
    qt = q[:, t] * K ** -0.5
    den = np.maximum(np.abs(np.einsum("bhk,bhk->bh", qt, n)), 1.0)
    out[:, t] = np.einsum("bhk,bhkv->bhv", qt, c) / den[..., None]
  return out


@pytest.mark.parametrize("form", FORMS)
def test_matches_the_unstabilised_formula(form):
  q, k, v, ig, fg = _inputs(0)
  o = ops.mlstm(q, k, v, ig, fg, form=form, chunk_size=8)
  helpers.assert_close(o, _unstabilised(q, k, v, ig, fg), 2e-4, 2e-4)


@pytest.mark.parametrize("forget_gate", ["sigmoid", "exp"])
def test_large_gate_preactivations_are_finite(forget_gate):
  """Pre-activations of +-80 (exp(80) ~ 5e34): outputs, states and gradients stay finite
  in every form and the step, and the forms agree."""
  q, k, v, _, _ = _inputs(1)
  rng = np.random.default_rng(2)
  ig = jnp.asarray(rng.choice([-80.0, 80.0], (B, T, H)), jnp.float32)
  fg = jnp.asarray(rng.choice([-80.0, 80.0], (B, T, H)), jnp.float32)
  outs = {}
  for form in FORMS:
    fn = lambda q, ig, fg, form=form: ops.mlstm(q, k, v, ig, fg, forget_gate=forget_gate,
                                                form=form, chunk_size=8, return_state=True)
    outs[form] = helpers.value_and_grads(fn, (q, ig, fg))
    for leaf in jax.tree_util.tree_leaves(outs[form]):
      assert np.all(np.isfinite(np.asarray(leaf))), form
  for form in FORMS[1:]:
    helpers.assert_tree_close(outs[form][0], outs["parallel"][0], 1e-4, 1e-4, form)
  state = ops.init_mlstm_state(B, H, K, V)
  for t in range(T):
    o, state = ops.mlstm_step(state, q[:, t], k[:, t], v[:, t], ig[:, t], fg[:, t],
                              forget_gate=forget_gate)
    helpers.assert_close(o, outs["recurrent"][0][0][:, t], 1e-4, 1e-4)
  assert all(np.all(np.isfinite(np.asarray(s))) for s in state)


def test_very_negative_stabiliser_is_finite():
  """Strong forgetting and tiny input gates drive m below -88, where exp(-m)
  overflows float32: the read stays finite (and ~0), gradients too."""
  q, k, v, _, _ = _inputs(3)
  ig = jnp.full((B, T, H), -150.0)
  fg = jnp.full((B, T, H), -60.0)
  for form in FORMS:
    fn = lambda q, ig: ops.mlstm(q, k, v, ig, fg, form=form, chunk_size=8)
    o, grads = helpers.value_and_grads(fn, (q, ig))
    assert np.all(np.isfinite(np.asarray(o))) and np.max(np.abs(np.asarray(o))) < 1e-20
    assert all(np.all(np.isfinite(np.asarray(g))) for g in grads)


def test_the_stabiliser_does_not_change_the_output():
  """(C, n, m) and (C e^-d, n e^-d, m + d) are one memory: same outputs."""
  q, k, v, ig, fg = _inputs(4)
  rng = np.random.default_rng(5)
  c = jnp.asarray(rng.standard_normal((B, H, K, V)), jnp.float32)
  n = jnp.asarray(rng.standard_normal((B, H, K)), jnp.float32)
  m = jnp.asarray(rng.standard_normal((B, H)), jnp.float32)
  d = 3.0
  for form in FORMS:
    a = ops.mlstm(q, k, v, ig, fg, form=form, chunk_size=8, initial_state=(c, n, m))
    b = ops.mlstm(q, k, v, ig, fg, form=form, chunk_size=8,
                  initial_state=(c * np.exp(-d), n * np.exp(-d), m + d))
    helpers.assert_close(a, b, 1e-4, 1e-4, form)


@pytest.mark.parametrize("form", FORMS)
def test_neg_inf_forget_gate_is_a_hard_reset(form):
  """f~ = -inf forgets everything: the rest equals a fresh start there."""
  q, k, v, ig, fg = _inputs(6)
  fg = fg.at[:, 9].set(-jnp.inf)
  o, grads = helpers.value_and_grads(
      lambda q, fg: ops.mlstm(q, k, v, ig, fg, form=form, chunk_size=8), (q, fg))
  fresh = ops.mlstm(q[:, 9:], k[:, 9:], v[:, 9:], ig[:, 9:], fg[:, 9:], form=form, chunk_size=8)
  helpers.assert_close(o[:, 9:], fresh, 1e-4, 1e-4)
  assert all(np.all(np.isfinite(np.asarray(g))) for g in grads)


def test_neg_inf_input_gate_skips_the_token():
  q, k, v, ig, fg = _inputs(7)
  skipped = ops.mlstm(q, k, v, ig.at[:, 4].set(-jnp.inf), fg)
  zero_key = ops.mlstm(q, k.at[:, 4].set(0.0), v, ig, fg)
  helpers.assert_close(skipped, zero_key, 1e-5, 1e-5)


def test_bad_arguments_name_themselves():
  q, k, v, ig, fg = _inputs(8, t=4)
  with pytest.raises(ValueError, match=r"\bforget_gate must be one of"):
    ops.mlstm(q, k, v, ig, fg, forget_gate="tanh")
  with pytest.raises(ValueError, match=r"\bi_gate must have shape"):
    ops.mlstm(q, k, v, ig[..., None], fg)
  with pytest.raises(ValueError, match=r"\bf_gate must be a floating"):
    ops.mlstm(q, k, v, ig, fg.astype(jnp.int32))
  with pytest.raises(ValueError, match=r"\binitial_state must be a tuple"):
    ops.mlstm(q, k, v, ig, fg, initial_state=jnp.zeros((B, H, K, V)))
  state = ops.init_mlstm_state(B, H, K, V)
  with pytest.raises(ValueError, match=r"\bstate\[2\] must have shape"):
    ops.mlstm_step(state[:2] + (state[2][:1],), q[:, 0], k[:, 0], v[:, 0], ig[:, 0], fg[:, 0])
