"""Kernelized linear attention layer (Katharopoulos et al.; Performer).

``x [B, T, D] -> [B, T, D]`` through ``phi(q) phi(k)^T`` attention; the random
feature maps keep their projection in a non-trainable :class:`RandomFeatures`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from linear_attention.nn import base
from linear_attention.ops import feature_maps as fm
from linear_attention.ops import linear as linear_ops

Array = jax.Array


class LinearAttention(base.Mixer):
  """Multi-head kernelized linear attention with a feature map.

  Deterministic maps (``elu``, ``relu``, ``identity``) have feature width
  ``Dh``; random maps (``performer_trig``, ``performer_positive``, ``favor+``)
  hold a ``[num_features, Dh]`` projection, shared by the heads, that
  :meth:`redraw` replaces. The decoding state is ``[B, H, F, Dh + 1]`` float32
  (the last column is the normaliser) when ``normalize``.
  """

  def __init__(self, d_model: int, num_heads: int, *, feature_map: str = "elu",
               num_features: int | None = None, normalize: bool = True, causal: bool = True,
               chunk_size: int = 64, rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
    base.check_divisible("d_model", d_model, "num_heads", num_heads)
    if feature_map not in fm.FEATURE_MAPS:
      raise ValueError(f"feature_map must be one of {list(fm.FEATURE_MAPS)}, got {feature_map!r}.")
    self.num_heads, self.head_dim = num_heads, d_model // num_heads
    self.feature_map, self.normalize, self.causal = feature_map, normalize, causal
    self.chunk_size = chunk_size
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.q_proj = base.dense(d_model, d_model, **kw)
    self.k_proj = base.dense(d_model, d_model, **kw)
    self.v_proj = base.dense(d_model, d_model, **kw)
    self.o_proj = base.dense(d_model, d_model, **kw)
    if feature_map in fm.RANDOM_MAPS:
      m = fm.default_num_features(self.head_dim) if num_features is None else num_features
      orthogonal = feature_map == "favor+"
      self.projection = base.RandomFeatures(
          fm.random_projection(rngs.params(), m, self.head_dim, orthogonal=orthogonal),
          orthogonal=orthogonal)
    else:
      self.projection = None

  @property
  def num_features(self) -> int:
    """Feature width ``F`` of ``phi``."""
    if self.projection is None:
      return self.head_dim
    m = self.projection[...].shape[0]
    return 2 * m if self.feature_map == "performer_trig" else m

  def redraw(self, key: Array) -> None:
    """Draws a fresh random projection (no-op for deterministic feature maps)."""
    if self.projection is not None:
      self.projection.redraw(key)

  def _proj(self):
    return None if self.projection is None else self.projection[...]

  def _qkv(self, x):
    return tuple(base.split_heads(p(x), self.num_heads)
                 for p in (self.q_proj, self.k_proj, self.v_proj))

  def __call__(self, x: Array, segment_ids: Array | None = None) -> Array:
    """``x [B, T, D]`` -> ``[B, T, D]``."""
    q, k, v = self._qkv(x)
    o = linear_ops.linear_attention(
        q, k, v, feature_map=self.feature_map, causal=self.causal, normalize=self.normalize,
        projection=self._proj(), chunk_size=self.chunk_size, segment_ids=segment_ids)
    return self.o_proj(base.merge_heads(o))

  def init_cache(self, batch: int, max_len: int, dtype=jnp.float32) -> dict:
    """``{"state": [B, H, F, Dh (+1)] float32}``; O(1) in ``max_len``."""
    if not self.causal:
      return super().init_cache(batch, max_len, dtype)
    dv = self.head_dim + (1 if self.normalize else 0)
    return {"state": jnp.zeros((batch, self.num_heads, self.num_features, dv), jnp.float32)}

  def decode_step(self, x: Array, cache: dict) -> tuple[Array, dict]:
    """``x [B, D]`` -> ``(y [B, D], cache)``."""
    if not self.causal:
      return super().decode_step(x, cache)
    q, k, v = self._qkv(x)
    o, state = linear_ops.linear_attention_step(
        q, k, v, cache["state"], feature_map=self.feature_map, normalize=self.normalize,
        projection=self._proj())
    return self.o_proj(base.merge_heads(o)), {"state": state}
