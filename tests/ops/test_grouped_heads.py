"""Grouped value heads (more value heads than query/key heads) in the delta and DPLR engines.

A grouped call (``q, k`` with ``Hk`` heads, ``v`` and the per-value-head arguments with
``Hv = G Hk``) must equal the call with ``q, k`` repeated per value head
(``jnp.repeat(x, G, axis=2)``, transformers' ``repeat_interleave``): values, the final state
and every gradient, the gradients of ``q, k`` summed over their group (what autodiff through
the repeat gives), for every form, the one-token steps and the wrong-head-count errors. The
kernels' cases are in ``tests/kernels/``, ``context=`` in ``tests/ops/test_context.py``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from linear_attention import ops
from tests.helpers import assert_tree_close, keys, rand, value_and_grads

B, T, HK, G, K, V = 2, 13, 2, 3, 4, 5  # odd T: a partial last chunk of 4
HV = HK * G
CHUNK = 4
FORMS = ("recurrent", "chunk", "parallel")
TOL = dict(rtol=2e-5, atol=2e-5)


def rep(x, axis=2):
  """``x`` with each query/key head repeated for the ``G`` value heads that read it."""
  return jnp.repeat(x, G, axis=axis)


def _unit(x):
  return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def delta_args(seed=0, gated=True):
  kq, kk, kv, kb, kg, ks = keys(seed, 6)
  q, k = rand(kq, (B, T, HK, K)), _unit(rand(kk, (B, T, HK, K)))
  v = rand(kv, (B, T, HV, V))
  beta = jax.random.uniform(kb, (B, T, HV), minval=0.1, maxval=1.9)
  g = -jax.random.uniform(kg, (B, T, HV)) if gated else None
  return q, k, v, beta, g, rand(ks, (B, HV, K, V))


def _compare(grouped, repeated, args):
  assert_tree_close(value_and_grads(grouped, args), value_and_grads(repeated, args), **TOL)


class TestDeltaGrouped:

  @pytest.mark.parametrize("form", FORMS)
  @pytest.mark.parametrize("gated", [False, True], ids=["deltanet", "gated"])
  def test_equals_repeated_qk(self, form, gated):
    q, k, v, beta, g, s0 = delta_args(gated=gated)
    call = lambda q, k, v, beta, s0, g=g: ops.delta_rule(
        q, k, v, beta, g, form=form, chunk_size=CHUNK, initial_state=s0, return_state=True)
    _compare(call, lambda q, k, *a: call(rep(q), rep(k), *a), (q, k, v, beta, s0))

  def test_gate_gradient_and_segments(self):
    q, k, v, beta, g, s0 = delta_args(1)
    seg = jnp.array([[0] * 6 + [1] * 7, [2] * 13])
    call = lambda q, k, v, beta, g, s0: ops.gated_deltanet(
        q, k, v, beta, g, form="chunk", chunk_size=CHUNK, initial_state=s0,
        return_state=True, segment_ids=seg)
    _compare(call, lambda q, k, *a: call(rep(q), rep(k), *a), (q, k, v, beta, g, s0))

  def test_value_head_h_reads_qk_head_h_over_g(self):
    """Value head ``h`` reads query/key head ``h // G``: swapping the two q/k heads
    swaps the two groups of value heads' outputs."""
    q, k, v, beta, g, _ = delta_args(2)
    o = ops.gated_deltanet(q, k, v, beta, g, form="chunk", chunk_size=CHUNK)
    swap = lambda x: x[:, :, ::-1]
    swap_v = lambda x: jnp.concatenate([x[:, :, G:], x[:, :, :G]], axis=2)
    o_swapped = ops.gated_deltanet(swap(q), swap(k), swap_v(v), swap_v(beta), swap_v(g),
                                   form="chunk", chunk_size=CHUNK)
    assert_tree_close(swap_v(o_swapped), o, **TOL)

  @pytest.mark.parametrize("gated", [False, True], ids=["deltanet", "gated"])
  def test_step(self, gated):
    q, k, v, beta, g, s0 = delta_args(3, gated)
    q, k, v, beta = q[:, 0], k[:, 0], v[:, 0], beta[:, 0]
    g = None if g is None else g[:, 0]
    call = lambda s0, q, k, v, beta: ops.delta_rule_step(s0, q, k, v, beta, g)
    _compare(call, lambda s0, q, k, *a: call(s0, rep(q, 1), rep(k, 1), *a),
             (s0, q, k, v, beta))

  def test_step_continues_the_sequence(self):
    """Prefill with the chunk form, then one grouped step: the same as one longer call."""
    q, k, v, beta, g, s0 = delta_args(4)
    o_all = ops.gated_deltanet(q, k, v, beta, g, form="chunk", chunk_size=CHUNK,
                               initial_state=s0)
    _, s = ops.gated_deltanet(q[:, :-1], k[:, :-1], v[:, :-1], beta[:, :-1], g[:, :-1],
                              form="chunk", chunk_size=CHUNK, initial_state=s0,
                              return_state=True)
    o_last, _ = ops.gated_deltanet_step(s, q[:, -1], k[:, -1], v[:, -1], beta[:, -1], g[:, -1])
    assert_tree_close(o_last, o_all[:, -1], **TOL)

  def test_errors_name_the_argument(self):
    q, k, v, beta, g, s0 = delta_args()
    with pytest.raises(ValueError, match=r"v must have a multiple of the 2 heads of q and k"):
      ops.delta_rule(q, k, v[:, :, :5], beta[:, :, :5])
    with pytest.raises(ValueError, match=r"v must have a multiple of the 2 heads of q and k"):
      ops.delta_rule(q, k, v[:, :, :1], beta[:, :, :1])
    with pytest.raises(ValueError, match=r"beta must have shape \[2, 13, 6\]"):
      ops.delta_rule(q, k, v, beta[:, :, :HK])
    with pytest.raises(ValueError, match=r"log_decay must have shape \[2, 13, 6\]"):
      ops.delta_rule(q, k, v, beta, g[:, :, :HK])
    with pytest.raises(ValueError, match=r"initial_state must have shape \[2, 6, 4, 5\]"):
      ops.delta_rule(q, k, v, beta, initial_state=s0[:, :HK])
    with pytest.raises(ValueError, match=r"k must have shape \[2, 13, 2, 4\]"):
      ops.delta_rule(q, rep(k), v, beta)
    with pytest.raises(ValueError, match=r"v must have a multiple of the 2 heads of q and k"):
      ops.delta_rule_step(s0[:, :5], q[:, 0], k[:, 0], v[:, 0, :5], beta[:, 0, :5])
    with pytest.raises(ValueError, match=r"state must have shape \[2, 6, 4, 5\]"):
      ops.delta_rule_step(s0[:, :HK], q[:, 0], k[:, 0], v[:, 0], beta[:, 0])


# ----------------------------------------------------------------------------- DPLR


def dplr_args(seed=0, r=None):
  """q, k with ``HK`` heads; v, beta, the per-channel decay and the state per value head.
  ``r``: that many sub-steps per token (Gated DeltaProduct's k, v, beta)."""
  kq, kk, kv, kb, kg, ks = keys(seed, 6)
  steps = () if r is None else (r,)
  q, k = rand(kq, (B, T, HK, K)), _unit(rand(kk, (B, T, HK) + steps + (K,)))
  v = rand(kv, (B, T, HV) + steps + (V,))
  beta = jax.random.uniform(kb, (B, T, HV) + steps, minval=0.1, maxval=1.9)
  g = -jax.random.uniform(kg, (B, T, HV, K))
  return q, k, v, beta, g, rand(ks, (B, HV, K, V))


class TestDplrGrouped:

  @pytest.mark.parametrize("form", FORMS)
  def test_kda_equals_repeated_qk(self, form):
    q, k, v, beta, g, s0 = dplr_args()
    call = lambda q, k, v, beta, g, s0: ops.kda(
        q, k, v, beta, g, form=form, chunk_size=CHUNK, initial_state=s0, return_state=True)
    _compare(call, lambda q, k, *a: call(rep(q), rep(k), *a), (q, k, v, beta, g, s0))

  @pytest.mark.parametrize("form", FORMS)
  def test_dplr_attention_grouped_query(self, form):
    """The engine itself: ``q`` with ``HK`` heads, ``k, a, b`` per value head."""
    q, k, v, beta, g, s0 = dplr_args(1)
    kv_ = rep(k)
    call = lambda q, kv_, v, beta, g, s0: ops.dplr_attention(
        q, kv_, v, -beta[..., None] * kv_, kv_, g, form=form, chunk_size=CHUNK,
        initial_state=s0, return_state=True)
    _compare(call, lambda q, *a: call(rep(q), *a), (q, kv_, v, beta, g, s0))

  def test_gated_deltaproduct_equals_repeated_qk(self):
    q, k, v, beta, g, s0 = dplr_args(2, r=2)
    gate = g[..., 0]
    call = lambda q, k, v, beta, gate, s0: ops.gated_deltaproduct(
        q, k, v, beta, gate, form="chunk", chunk_size=CHUNK, initial_state=s0,
        return_state=True)
    _compare(call, lambda q, k, *a: call(rep(q), rep(k), *a), (q, k, v, beta, gate, s0))

  def test_steps(self):
    q, k, v, beta, g, s0 = dplr_args(3)
    q, k, v, beta, g = q[:, 0], k[:, 0], v[:, 0], beta[:, 0], g[:, 0]
    call = lambda s0, q, k, v, beta, g: ops.kda_step(s0, q, k, v, beta, g)
    _compare(call, lambda s0, q, k, *a: call(s0, rep(q, 1), rep(k, 1), *a),
             (s0, q, k, v, beta, g))
    q2, k2, v2, beta2, _, _ = dplr_args(4, r=2)
    q2, k2, v2, beta2 = q2[:, 0], k2[:, 0], v2[:, 0], beta2[:, 0]
    call2 = lambda s0, q, k, v, beta: ops.gated_deltaproduct_step(s0, q, k, v, beta, g[..., 0])
    _compare(call2, lambda s0, q, k, *a: call2(s0, rep(q, 1), rep(k, 1), *a),
             (s0, q2, k2, v2, beta2))

  def test_errors_name_the_argument(self):
    q, k, v, beta, g, s0 = dplr_args()
    with pytest.raises(ValueError, match=r"v must have a multiple of the 2 heads of q and k"):
      ops.kda(q, k, v[:, :, :5], beta[:, :, :5], g[:, :, :5])
    with pytest.raises(ValueError, match=r"beta must have shape \[2, 13, 6\]"):
      ops.kda(q, k, v, beta[:, :, :HK], g)
    with pytest.raises(ValueError, match=r"log_alpha must have shape \[2, 13, 6, 4\]"):
      ops.kda(q, k, v, beta, g[:, :, :HK])
    with pytest.raises(ValueError, match=r"v must have a multiple of the 2 heads of q\b"):
      ops.dplr_attention(q, rep(k)[:, :, :5], v[:, :, :5], None, rep(k)[:, :, :5])
    with pytest.raises(ValueError, match=r"b must have shape \[2, 13, 6, 4\]"):
      ops.dplr_attention(q, rep(k), v, None, k)
    with pytest.raises(ValueError, match=r"initial_state must have shape \[2, 6, 4, 5\]"):
      ops.dplr_attention(q, rep(k), v, None, rep(k), initial_state=s0[:, :HK])
    with pytest.raises(ValueError, match=r"v must have a multiple of the 2 heads of q\b"):
      ops.dplr_attention_step(s0[:, :5], q[:, 0], rep(k, 1)[:, :5], v[:, 0, :5], None,
                              rep(k, 1)[:, :5])
