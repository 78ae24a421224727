"""Linformer beyond the conformance suite (which checks it against a float32
reference, forward and gradient, in bfloat16 and under jit/vmap): the identity
projection is softmax attention, and its own checks."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

from linear_attention.ops.lowrank import linformer_attention
from linear_attention.ops.softmax import softmax_attention
from tests.helpers import assert_close, keys, rand

B, T, H, D, DV, P = 2, 37, 2, 8, 6, 5


def inputs(seed, dtype=jnp.float32):
  kq, kk, kv, ke, kf = keys(seed, 5)
  return (rand(kq, (B, T, H, D), dtype), rand(kk, (B, T, H, D), dtype),
          rand(kv, (B, T, H, DV), dtype), rand(ke, (P, T), dtype, T**-0.5),
          rand(kf, (P, T), dtype, T**-0.5))


def test_identity_projection_is_softmax_attention():
  """With E = F = I (P = T) Linformer is exact non-causal softmax attention."""
  q, k, v, _, _ = inputs(1)
  eye = jnp.eye(T)
  assert_close(linformer_attention(q, k, v, eye, eye, scale=0.4),
               softmax_attention(q, k, v, scale=0.4), 1e-5, 1e-5)


def test_errors():
  q, k, v, E, F = inputs(3)
  with pytest.raises(ValueError, match="causal Linformer is not defined"):
    linformer_attention(q, k, v, E, F, causal=True)
  with pytest.raises(ValueError, match="does not support segment_ids"):
    linformer_attention(q, k, v, E, F, segment_ids=jnp.zeros((B, T), jnp.int32))
  with pytest.raises(ValueError, match=r"E must have shape \[5, 37\].*got \[5, 36\]"):
    linformer_attention(q, k, v, E[:, :-1], F)
  with pytest.raises(ValueError, match=r"F must have shape \[5, 37\].*got \[4, 37\]"):
    linformer_attention(q, k, v, E, F[:4])
  with pytest.raises(ValueError, match="E must have rank 2"):
    linformer_attention(q, k, v, E[None], F)
  with pytest.raises(ValueError, match="k must have shape"):
    linformer_attention(q, k[:, :3], v, E, F)
