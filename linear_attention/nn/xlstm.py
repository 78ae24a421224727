"""The mLSTM block of xLSTM.

:class:`MLSTM` calls :func:`linear_attention.ops.xlstm.mlstm` (its step when decoding).

Shapes: ``x [B, T, D] -> [B, T, D]``; decoding caches are dicts of float32 arrays.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from linear_attention.nn import context_parallel as cp
from linear_attention.nn import mixer, modules
# ops/xlstm.py: a module named mlstm was shadowed by the function ops.mlstm.
from linear_attention.ops.xlstm import FORGET_GATES, init_mlstm_state, mlstm, mlstm_step

Array = jax.Array


class BlockDiagonal(nnx.Module):
  """A block-diagonal linear map ``[..., N * S] -> [..., N * S]`` with ``N`` blocks of
  ``S x S`` (xLSTM's "headwise" q/k/v projections): ``N S^2`` weights instead of ``(N S)^2``."""

  def __init__(self, features: int, block_size: int, *, rngs: nnx.Rngs, dtype=None,
               param_dtype=jnp.float32):
    mixer.check_divisible("features", features, "block_size", block_size)
    self.block_size, self.dtype = block_size, dtype
    shape = (features // block_size, block_size, block_size)
    self.kernel = nnx.Param(
        (block_size ** -0.5 * jax.random.normal(rngs.params(), shape)).astype(param_dtype))

  def __call__(self, x: Array) -> Array:
    """``x [..., F]`` -> ``[..., F]`` (in ``dtype`` when given, else that of ``x``)."""
    dtype = x.dtype if self.dtype is None else self.dtype
    xb = x.astype(dtype).reshape(x.shape[:-1] + (-1, self.block_size))
    y = jnp.einsum("...ni,nij->...nj", xb, self.kernel[...].astype(dtype))
    return y.reshape(x.shape)


class MLSTM(mixer.Mixer):
  """The mLSTM block of xLSTM (Beck et al. 2024), pre-up-projection form.

  ``x`` goes up to ``2 * d_inner`` (``d_inner = expand * D``): a branch ``u``
  and an output gate ``z``. ``q, k`` come from the short causal convolution of
  ``u``, ``v`` from ``u`` itself; the input and forget gate pre-activations
  (one per head) from ``[q, k, v]``. Then
  ``W_down((LayerNorm_heads(mlstm(q, k, v, i~, f~)) + skip * conv(u)) * swish(z))``.
  q, k, v are block-diagonal maps with blocks of ``qkv_block_size`` (the
  paper's headwise projections; 4 as in xLSTM's configs). Forget-gate
  biases start spread over ``[3, 6]`` (slow forgetting), gate weights at zero.
  Decoding cache: ``conv [B, W-1, d_inner]`` and the mLSTM state ``C, n, m``.
  """

  context_parallel = True

  def __init__(self, d_model: int, num_heads: int, *, expand: int = 2, conv_width: int = 4,
               qkv_block_size: int = 4, forget_gate: str = "sigmoid", chunk_size: int = 64, norm_eps: float = 1e-5,
               rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
    d_inner = expand * d_model
    mixer.check_divisible("d_inner (expand * d_model)", d_inner, "num_heads", num_heads)
    if forget_gate not in FORGET_GATES:
      raise ValueError(f"forget_gate must be one of {list(FORGET_GATES)}, "
                       f"got {forget_gate!r}.")
    self.num_heads, self.d_inner, self.head_dim = num_heads, d_inner, d_inner // num_heads
    self.forget_gate, self.chunk_size = forget_gate, chunk_size
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.up_proj = modules.dense(d_model, 2 * d_inner, **kw)
    self.conv = modules.ShortConv(d_inner, conv_width, rngs=rngs, param_dtype=param_dtype)
    self.q_proj = BlockDiagonal(d_inner, qkv_block_size, **kw)
    self.k_proj = BlockDiagonal(d_inner, qkv_block_size, **kw)
    self.v_proj = BlockDiagonal(d_inner, qkv_block_size, **kw)
    zeros = nnx.initializers.zeros_init()
    self.i_proj = modules.dense(3 * d_inner, num_heads, use_bias=True, kernel_init=zeros, **kw)
    self.f_proj = modules.dense(3 * d_inner, num_heads, use_bias=True, kernel_init=zeros, **kw)
    self.i_proj.bias.set_value(
        (0.1 * jax.random.normal(rngs.params(), (num_heads,))).astype(param_dtype))
    self.f_proj.bias.set_value(jnp.asarray(np.linspace(3.0, 6.0, num_heads), param_dtype))
    self.o_norm = modules.HeadNorm(self.head_dim, eps=norm_eps, center=True, rngs=rngs,
                                param_dtype=param_dtype)
    self.skip = modules.param(jnp.ones((d_inner,)), param_dtype)
    self.down_proj = modules.dense(d_inner, d_model, **kw)

  def _inputs(self, u, u_conv):
    h = self.num_heads
    q, k, v = self.q_proj(u_conv), self.k_proj(u_conv), self.v_proj(u)
    qkv = jnp.concatenate([q, k, v], axis=-1)
    gates = (self.i_proj(qkv).astype(jnp.float32), self.f_proj(qkv).astype(jnp.float32))
    return tuple(modules.split_heads(a, h) for a in (q, k, v)) + gates

  def _out(self, o, u_conv, z):
    o = modules.merge_heads(self.o_norm(o.astype(z.dtype)))
    o = (o + self.skip[...].astype(z.dtype) * u_conv) * jax.nn.silu(z)
    return self.down_proj(o)

  def __call__(self, x: Array, segment_ids: Array | None = None) -> Array:
    """``x [B, T, D]`` -> ``[B, T, D]``."""
    u, z = jnp.split(self.up_proj(x), 2, axis=-1)
    u_conv = self.conv(u, segment_ids)
    q, k, v, ig, fg = self._inputs(u, u_conv)
    o = mlstm(q, k, v, ig, fg, forget_gate=self.forget_gate, chunk_size=self.chunk_size,
              segment_ids=segment_ids, context=cp.context())
    return self._out(o, u_conv, z)

  def init_cache(self, batch: int, max_len: int, dtype=jnp.float32) -> dict:
    """``{"conv": [B, W-1, d_inner], "C": [B, H, Dh, Dh], "n": [B, H, Dh], "m": [B, H]}``,
    float32 (a fresh memory: ``m = -inf``, see :mod:`linear_attention.ops.xlstm`)."""
    c, n, m = init_mlstm_state(batch, self.num_heads, self.head_dim, self.head_dim)
    return {"conv": self.conv.init_state(batch), "C": c, "n": n, "m": m}

  def decode_step(self, x: Array, cache: dict) -> tuple[Array, dict]:
    """``x [B, D]`` -> ``(y [B, D], cache)``."""
    u, z = jnp.split(self.up_proj(x), 2, axis=-1)
    u_conv, conv = self.conv.step(u, cache["conv"])
    q, k, v, ig, fg = self._inputs(u, u_conv)
    o, (c, n, m) = mlstm_step((cache["C"], cache["n"], cache["m"]), q, k, v, ig, fg,
                              forget_gate=self.forget_gate)
    return self._out(o, u_conv, z), {"conv": conv, "C": c, "n": n, "m": m}
