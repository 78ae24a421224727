"""Delta-rule layers: DeltaNet and Gated DeltaNet.

``x [B, T, D] -> [B, T, D]``. ``q, k, v`` go through short causal convolutions
(silu) and ``q, k`` are L2-normalised per head (the delta rule needs unit
keys); the write strength is ``beta = sigmoid(W_b x)`` (times 2 with
``allow_neg_eigval``: eigenvalues of ``I - beta k k^T`` in ``[-1, 1]``).
Decoding state: the conv window ``[B, W-1, 3D]`` and the delta state
``[B, H, Dh, Dh]``, both float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from linear_attention.nn import base
from linear_attention.ops import delta as delta_ops

Array = jax.Array


class DeltaNet(base.Mixer):
  """DeltaNet (Schlag et al. 2021; chunkwise training of Yang et al. 2024).

  ``o = W_o(RMSNorm(deltanet(q, k, v, beta)) * swish(W_g x))`` (the output gate
  with ``use_gate``, else just the norm).
  """

  def __init__(self, d_model: int, num_heads: int, *, conv_width: int = 4,
               use_short_conv: bool = True, use_gate: bool = True, allow_neg_eigval: bool = False,
               chunk_size: int = 64, norm_eps: float = 1e-5, rngs: nnx.Rngs, dtype=None,
               param_dtype=jnp.float32):
    base.check_divisible("d_model", d_model, "num_heads", num_heads)
    self.d_model, self.num_heads, self.head_dim = d_model, num_heads, d_model // num_heads
    self.allow_neg_eigval, self.chunk_size, self.use_gate = allow_neg_eigval, chunk_size, use_gate
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.qkv_proj = base.dense(d_model, 3 * d_model, **kw)
    self.conv = (base.ShortConv(3 * d_model, conv_width, use_bias=False, rngs=rngs,
                                param_dtype=param_dtype) if use_short_conv else None)
    self.b_proj = base.dense(d_model, num_heads, **kw)
    self.g_proj = base.dense(d_model, d_model, **kw) if use_gate else None
    self.o_norm = base.HeadNorm(self.head_dim, eps=norm_eps, rngs=rngs, param_dtype=param_dtype)
    self.o_proj = base.dense(d_model, d_model, **kw)

  def _heads(self, qkv, x):
    d, h = self.d_model, self.num_heads
    q, k, v = (base.split_heads(qkv[..., i * d:(i + 1) * d], h) for i in range(3))
    beta = jax.nn.sigmoid(self.b_proj(x).astype(jnp.float32))
    if self.allow_neg_eigval:
      beta = 2.0 * beta
    return q, k, v, beta.astype(x.dtype)

  def _qkv(self, x, segment_ids):
    qkv = self.qkv_proj(x)
    qkv = jax.nn.silu(qkv) if self.conv is None else self.conv(qkv, segment_ids)
    return self._heads(qkv, x)

  def _qkv_step(self, x, conv_state):
    qkv = self.qkv_proj(x)
    if self.conv is None:
      return self._heads(jax.nn.silu(qkv), x), conv_state
    qkv, conv_state = self.conv.step(qkv, conv_state)
    return self._heads(qkv, x), conv_state

  def _out(self, o, x):
    o = self.o_norm(o.astype(x.dtype))
    if self.g_proj is not None:
      o = o * jax.nn.silu(base.split_heads(self.g_proj(x), self.num_heads))
    return self.o_proj(base.merge_heads(o))

  def _log_decay(self, x):
    return None

  def __call__(self, x: Array, segment_ids: Array | None = None) -> Array:
    """``x [B, T, D]`` -> ``[B, T, D]``."""
    q, k, v, beta = self._qkv(x, segment_ids)
    g = self._log_decay(x)
    kw = dict(chunk_size=self.chunk_size, segment_ids=segment_ids, normalize_qk=True)
    if g is None:
      o = delta_ops.deltanet(q, k, v, beta, **kw)
    else:
      o = delta_ops.gated_deltanet(q, k, v, beta, g, **kw)
    return self._out(o, x)

  def init_cache(self, batch: int, max_len: int, dtype=jnp.float32) -> dict:
    """``{"conv": [B, W-1, 3D] (or None), "state": [B, H, Dh, Dh]}``, float32."""
    d = self.head_dim
    return {"conv": None if self.conv is None else self.conv.init_state(batch),
            "state": jnp.zeros((batch, self.num_heads, d, d), jnp.float32)}

  def decode_step(self, x: Array, cache: dict) -> tuple[Array, dict]:
    """``x [B, D]`` -> ``(y [B, D], cache)``."""
    (q, k, v, beta), conv_state = self._qkv_step(x, cache["conv"])
    g = self._log_decay(x)
    if g is None:
      o, state = delta_ops.deltanet_step(q, k, v, beta, cache["state"], normalize_qk=True)
    else:
      o, state = delta_ops.gated_deltanet_step(q, k, v, beta, g, cache["state"],
                                               normalize_qk=True)
    return self._out(o, x), {"conv": conv_state, "state": state}


class GatedDeltaNet(DeltaNet):
  """Gated DeltaNet (Yang, Kautz and Hatamizadeh 2024): DeltaNet with a Mamba-2 style decay.

  ``log_decay = -exp(A_log) * softplus(W_a x + dt_bias)`` per head and token,
  with ``exp(A_log)`` in ``[1, 16]`` and ``softplus(dt_bias)`` in
  ``[dt_min, dt_max]`` at init.
  """

  def __init__(self, d_model: int, num_heads: int, *, conv_width: int = 4,
               use_short_conv: bool = True, use_gate: bool = True, allow_neg_eigval: bool = False,
               dt_min: float = 1e-3, dt_max: float = 1e-1, chunk_size: int = 64,
               norm_eps: float = 1e-5, rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
    super().__init__(d_model, num_heads, conv_width=conv_width, use_short_conv=use_short_conv,
                     use_gate=use_gate, allow_neg_eigval=allow_neg_eigval,
                     chunk_size=chunk_size, norm_eps=norm_eps, rngs=rngs, dtype=dtype,
                     param_dtype=param_dtype)
    self.a_proj = base.dense(d_model, num_heads, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.A_log = base.param(jnp.log(jax.random.uniform(rngs.params(), (num_heads,),
                                                       minval=1.0, maxval=16.0)), param_dtype)
    dt = jnp.maximum(base.log_uniform(rngs.params(), (num_heads,), dt_min, dt_max), 1e-4)
    self.dt_bias = base.param(base.inverse_softplus(dt), param_dtype)

  def _log_decay(self, x):
    a = self.a_proj(x).astype(jnp.float32) + self.dt_bias[...].astype(jnp.float32)
    return -jnp.exp(self.A_log[...].astype(jnp.float32)) * jax.nn.softplus(a)
