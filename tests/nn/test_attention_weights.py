"""``SoftmaxAttention.attention_weights``: the weights the layer's attention uses."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from linear_attention import nn as lnn
from linear_attention.nn import attention, modules
from linear_attention.ops import softmax as softmax_ops
from tests import helpers

B, T, D = 2, 13, 32  # odd length
SEG = jnp.asarray([[0] * 5 + [1] * 8, [3] * 13])  # row 0 packs two sequences


def _layer(causal=True, num_kv_heads=2, dtype=None):
  # Grouped-query heads (4 query heads read 2 key/value heads) and RoPE.
  return attention.SoftmaxAttention(D, 4, num_kv_heads=num_kv_heads, causal=causal,
                                    rngs=nnx.Rngs(0), dtype=dtype)


def _reference(q, k, segment_ids, causal):
  """Plain numpy float32 softmax weights ``[B, H, T, T]``."""
  q, k = np.asarray(q, np.float32), np.asarray(k, np.float32)
  s = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(q.shape[-1])
  seg = np.zeros((B, T), int) if segment_ids is None else np.asarray(segment_ids)
  ok = seg[:, None, :, None] == seg[:, None, None, :]
  if causal:
    ok = ok & np.tril(np.ones((T, T), bool))
  s = np.where(ok, s, -np.inf)
  e = np.exp(s - s.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True), ok


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("segment_ids", [None, SEG], ids=["one", "packed"])
def test_weights_times_values_is_the_layers_attention(causal, segment_ids):
  layer = _layer(causal)
  x = helpers.rand(jax.random.PRNGKey(1), (B, T, D))
  w = layer.attention_weights(x, segment_ids)
  assert w.shape == (B, 4, T, T) and w.dtype == jnp.float32
  q, k, v = layer._qkv(x, modules.positions_of(B, T, segment_ids))
  k, v = modules.repeat_kv(k, layer.groups), modules.repeat_kv(v, layer.groups)
  ref, visible = _reference(q, k, segment_ids, causal)
  np.testing.assert_allclose(np.asarray(w), ref, atol=1e-6)
  assert np.all(np.asarray(w)[~np.broadcast_to(visible, w.shape)] == 0)  # no peeking
  # weights @ v is the op's output, and through o_proj the layer's.
  o = jnp.einsum("bhts,bshd->bthd", w, v)
  op = softmax_ops.softmax_attention(q, k, v, causal=causal, segment_ids=segment_ids)
  helpers.assert_close(o, op, atol=1e-5)
  helpers.assert_close(layer.o_proj(modules.merge_heads(o)), layer(x, segment_ids), atol=1e-5)


def test_bfloat16_layer_weights_within_bf16_tolerance():
  # bf16 activations: q and k are rounded to bf16 before the float32 logits, so the weights
  # differ from the float32 layer's by about bf16's resolution times the logit size (3.5e-3
  # at most here).
  x = helpers.rand(jax.random.PRNGKey(2), (B, T, D))
  w32 = _layer().attention_weights(x)
  w16 = _layer(dtype=jnp.bfloat16).attention_weights(x.astype(jnp.bfloat16))
  assert w16.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(w16).sum(-1), 1.0, atol=1e-5)
  helpers.assert_close(w16, w32, rtol=0, atol=1e-2)


def test_bad_input_and_other_attention_kinds_are_refused():
  layer = _layer()
  with pytest.raises(ValueError, match=r"x must have shape \[batch, seq, d_model\]"):
    layer.attention_weights(jnp.zeros((B, T, D + 1)))
  with pytest.raises(ValueError, match="segment_ids"):
    layer.attention_weights(jnp.zeros((B, T, D)), jnp.zeros((B, T + 1), jnp.int32))
  for name in ("local", "forgetting"):
    other = lnn.make_mixer(name, D, 2, rngs=nnx.Rngs(0), **lnn.spec(name).tiny)
    with pytest.raises(NotImplementedError, match="only plain softmax"):
      other.attention_weights(jnp.zeros((B, T, D)))
