"""Grouped value heads through the chunk-delta and DPLR Pallas kernels, in interpret mode on CPU.

The kernel with ``q, k`` of ``Hk`` heads and ``v``, ``beta``, the gates and the state of
``Hv = 2 Hk`` heads equals the XLA chunk form with ``q, k`` repeated per value head:
values, final state and every gradient (``q, k``'s summed over their group), on both
kernel paths (Triton and Mosaic, interpreted), with a partial last chunk (T = 37).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from linear_attention import ops
from linear_attention.engines.delta import pallas as cdl
from linear_attention.engines.dplr import pallas as cdp
from tests.helpers import keys, rand
from tests.kernels.test_chunk_delta import PATHS, _assert_grads_close, _interpret, _vjps

B, T, HK, G, K, V = 1, 37, 1, 2, 16, 32
HV = HK * G
CHUNK = 16
NAMES = ("q", "k", "v", "beta", "gate", "initial_state")


@pytest.fixture(params=sorted(PATHS))
def path(request):
  p = dict(PATHS[request.param])
  return dict(p, interpret=_interpret(p["platform"]), chunk_size=CHUNK)


def _rep(x):
  return jnp.repeat(x, G, axis=2)


def _args(per_channel, seed=0):
  kq, kk, kv, kb, kg, ks = keys(seed, 6)
  k = rand(kk, (B, T, HK, K))
  gate_shape = (B, T, HV, K) if per_channel else (B, T, HV)
  return (rand(kq, (B, T, HK, K)), k / jnp.linalg.norm(k, axis=-1, keepdims=True),
          rand(kv, (B, T, HV, V)), jax.nn.sigmoid(rand(kb, (B, T, HV))),
          -jax.random.uniform(kg, gate_shape), rand(ks, (B, HV, K, V)))


def _check(kernel, xla, args):
  out, ref, grads, ref_grads = _vjps(kernel, lambda q, k, *a: xla(_rep(q), _rep(k), *a), args)
  _assert_grads_close(out, ref, 1e-4, 1e-4, ("o", "state"))
  _assert_grads_close(grads, ref_grads, 1e-4, 1e-4, NAMES)


@pytest.mark.parametrize("gated", [False, True], ids=["deltanet", "gated"])
def test_chunk_delta_grouped(path, gated):
  # Without a gate Qg, Am and Ke are shared by a group (read at head h // G in the kernels).
  seg = jnp.asarray([[0] * 10 + [1] * 27], jnp.int32)
  kernel = lambda q, k, v, beta, g, s0: cdl.chunk_delta_attention(
      q, k, v, beta, g if gated else None, initial_state=s0, return_state=True,
      segment_ids=seg, **path)
  xla = lambda q, k, v, beta, g, s0: ops.delta_rule(
      q, k, v, beta, g if gated else None, initial_state=s0, return_state=True, form="chunk",
      chunk_size=CHUNK, segment_ids=seg)
  _check(kernel, xla, _args(False))


def test_chunk_dplr_grouped_kda(path):
  """KDA's map (``a = -beta k``, ``b = alpha k``) with a per-channel decay per value head."""
  def kda_on(kernel):
    def run(q, k, v, beta, g, s0):
      kv = jnp.repeat(k, HV // k.shape[2], axis=2)
      wk, eb = beta[..., None] * kv, jnp.exp(g) * kv
      if kernel:
        return cdp.chunk_dplr_attention(q, wk, v, None, eb, g, initial_state=s0,
                                        return_state=True, **path)
      return ops.dplr_attention(q, wk, v, None, eb, g, initial_state=s0, return_state=True,
                                form="chunk", chunk_size=CHUNK)
    return run
  _check(kda_on(True), kda_on(False), _args(True, seed=1))
