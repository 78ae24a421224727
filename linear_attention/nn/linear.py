"""Kernelized linear attention layers (Katharopoulos et al.; Performer; Based; ReBased).

``x [B, T, D] -> [B, T, D]`` through ``phi(q) phi(k)^T`` attention; the random
feature maps keep their projection in a non-trainable :class:`RandomFeatures`.
:class:`Based` and :class:`ReBased` project q and k to a small feature
dimension per head (16 in both papers) before their polynomial feature maps.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from linear_attention.nn import context_parallel as cp
from linear_attention.nn import mixer, modules
from linear_attention.ops import feature_maps as fm
from linear_attention.ops import linear as linear_ops

Array = jax.Array


class LinearAttention(mixer.Mixer):
  """Multi-head kernelized linear attention with a feature map.

  Deterministic maps (``elu``, ``relu``, ``identity``) have feature width
  ``Dh`` (``taylor`` and ``squared``, meant for the small q/k of :class:`Based`
  and :class:`ReBased`, ``1 + Dh + Dh (Dh + 1) / 2`` and ``Dh (Dh + 1) / 2``);
  random maps (``performer_trig``, ``performer_positive``, ``favor+``)
  hold a ``[num_features, Dh]`` projection, shared by the heads, that
  :meth:`redraw` replaces. The decoding state is ``[B, H, F, Dh + 1]`` float32
  (the last column is the normaliser) when ``normalize``.
  """

  context_parallel = True

  def __init__(self, d_model: int, num_heads: int, *, feature_map: str = "elu",
               num_features: int | None = None, normalize: bool = True, causal: bool = True,
               chunk_size: int = 64, rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
    self._build(d_model, num_heads, None, feature_map=feature_map, normalize=normalize,
                causal=causal, chunk_size=chunk_size, rngs=rngs, dtype=dtype,
                param_dtype=param_dtype)
    if feature_map in fm.RANDOM_MAPS:
      m = fm.default_num_features(self.head_dim) if num_features is None else num_features
      orthogonal = feature_map == "favor+"
      self.projection = modules.RandomFeatures(
          fm.random_projection(rngs.params(), m, self.head_dim, orthogonal=orthogonal),
          orthogonal=orthogonal)
    else:
      self.projection = None

  def _build(self, d_model: int, num_heads: int, key_dim: int | None, *, feature_map: str,
             normalize: bool, causal: bool, chunk_size: int, rngs: nnx.Rngs, dtype,
             param_dtype) -> None:
    """The projections and settings shared by the subclasses: q and k get ``key_dim``
    per head (``None``: the head dimension ``d_model / num_heads``), v the head dimension."""
    mixer.check_divisible("d_model", d_model, "num_heads", num_heads)
    if feature_map not in fm.FEATURE_MAPS:
      raise ValueError(f"feature_map must be one of {list(fm.FEATURE_MAPS)}, got {feature_map!r}.")
    self.num_heads, self.head_dim = num_heads, d_model // num_heads
    self.key_dim = self.head_dim if key_dim is None else key_dim
    self.feature_map, self.normalize, self.causal = feature_map, normalize, causal
    self.chunk_size = chunk_size
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.q_proj = modules.dense(d_model, num_heads * self.key_dim, **kw)
    self.k_proj = modules.dense(d_model, num_heads * self.key_dim, **kw)
    self.v_proj = modules.dense(d_model, d_model, **kw)
    self.o_proj = modules.dense(d_model, d_model, **kw)

  @property
  def num_features(self) -> int:
    """Feature width ``F`` of ``phi``."""
    m = None if self.projection is None else self.projection[...].shape[0]
    return fm.feature_width(self.feature_map, self.key_dim, m)

  def redraw(self, key: Array) -> None:
    """Draws a fresh random projection (no-op for deterministic feature maps)."""
    if self.projection is not None:
      self.projection.redraw(key)

  def _proj(self):
    return None if self.projection is None else self.projection[...]

  def _qkv(self, x):
    return tuple(modules.split_heads(p(x), self.num_heads)
                 for p in (self.q_proj, self.k_proj, self.v_proj))

  def _attend(self, q, k, v, segment_ids):
    return linear_ops.linear_attention(
        q, k, v, feature_map=self.feature_map, causal=self.causal, normalize=self.normalize,
        projection=self._proj(), chunk_size=self.chunk_size, segment_ids=segment_ids,
        context=cp.context())

  def _step(self, q, k, v, state):
    return linear_ops.linear_attention_step(
        state, q, k, v, feature_map=self.feature_map, normalize=self.normalize,
        projection=self._proj())

  def __call__(self, x: Array, segment_ids: Array | None = None) -> Array:
    """``x [B, T, D]`` -> ``[B, T, D]``."""
    q, k, v = self._qkv(x)
    return self.o_proj(modules.merge_heads(self._attend(q, k, v, segment_ids)))

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
    o, state = self._step(q, k, v, cache["state"])
    return self.o_proj(modules.merge_heads(o)), {"state": state}


class Based(LinearAttention):
  """Based's linear attention (Arora et al. 2024): the Taylor feature map on small q, k.

  q and k are projected to ``feature_dim`` per head (16 in the paper), v to
  the head dimension ``d_model / num_heads``; the map is
  ``phi(x) = [1, x / d^(1/4), (x x^T) / (sqrt(2) sqrt(d))]`` with ``d =
  feature_dim`` (``1 + d + d (d + 1) / 2`` features, the outer product stored
  as its upper triangle), normalised. The full Based architecture mixes these
  layers with short convolutions and sliding-window attention
  (``model.short_conv``, hybrid patterns); this is the linear-attention layer
  alone. Decoding state: ``[B, H, F, Dh + 1]`` float32.
  """

  context_parallel = True

  def __init__(self, d_model: int, num_heads: int, *, feature_dim: int = 16,
               causal: bool = True, chunk_size: int = 64, rngs: nnx.Rngs, dtype=None,
               param_dtype=jnp.float32):
    mixer.check_positive("feature_dim", feature_dim)
    self._build(d_model, num_heads, feature_dim, feature_map="taylor", normalize=True,
                causal=causal, chunk_size=chunk_size, rngs=rngs, dtype=dtype,
                param_dtype=param_dtype)
    self.projection = None


class ReBased(LinearAttention):
  """ReBased (Aksenov et al. 2024): learnable affine LayerNorm of q, k, then ``(q.k)^2``.

  q and k are projected to ``feature_dim`` per head (16 in the paper),
  normalised by one LayerNorm whose scale ``gamma`` (init 1) and shift
  ``beta`` (init 0), ``[feature_dim]``, are shared by q, k and the heads, and
  mapped by the ``squared`` feature map (``feature_dim (feature_dim + 1) / 2``
  features), normalised. Decoding state: ``[B, H, F, Dh + 1]`` float32.
  """

  context_parallel = True

  def __init__(self, d_model: int, num_heads: int, *, feature_dim: int = 16,
               causal: bool = True, chunk_size: int = 64, rngs: nnx.Rngs, dtype=None,
               param_dtype=jnp.float32):
    mixer.check_positive("feature_dim", feature_dim)
    self._build(d_model, num_heads, feature_dim, feature_map="squared", normalize=True,
                causal=causal, chunk_size=chunk_size, rngs=rngs, dtype=dtype,
                param_dtype=param_dtype)
    self.projection = None
    self.gamma = nnx.Param(jnp.ones((feature_dim,), param_dtype))
    self.beta = nnx.Param(jnp.zeros((feature_dim,), param_dtype))

  def _attend(self, q, k, v, segment_ids):
    return linear_ops.rebased_attention(
        q, k, v, self.gamma[...], self.beta[...], causal=self.causal,
        chunk_size=self.chunk_size, segment_ids=segment_ids, context=cp.context())

  def _step(self, q, k, v, state):
    return linear_ops.rebased_attention_step(state, q, k, v, self.gamma[...], self.beta[...])
