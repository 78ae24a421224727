"""The delta rule's chunk algebra, shared by its XLA chunk form (:mod:`.engine`) and its
Pallas kernel (:mod:`.pallas`)."""

from __future__ import annotations

import jax.numpy as jnp

from linear_attention.common import pad_axis
from linear_attention.engines import chunks


def delta_chunk_terms(qh, kh, vh, bh, g, seg, chunk_size: int):
  """The delta rule's state-independent chunk quantities, for all chunks at once.

  Inputs ``[B, H, T, *]`` (``qh`` already scaled), ``bh, g`` ``[B, H, T]``
  (``g`` floored, see :func:`floor_log_decay`, or None), ``seg`` from
  :func:`segment_index` or None. With ``D = U - W S_0`` per chunk (the algebra
  of :mod:`linear_attention.engines.delta.engine`), returns ``(qg, a, u, w, k_end,
  chunk_decay)``: the decayed queries ``Q e^G`` and in-chunk scores ``A``
  (``[B, H, N, C, K]``, ``[B, H, N, C, C]``), ``U`` and ``W`` (``[B, H, N, C,
  V]``, ``[B, H, N, C, K]``), the keys decayed to the chunk's end and the
  chunk's decay (``[B, H, N, C, K]``, ``[B, H, N]``), segment masks folded in.
  Shared by the XLA chunk form and the Pallas kernel (``engines.delta.pallas``).
  """
  b, h = qh.shape[:2]
  c = chunk_size
  # Padding with beta = 0 and k = 0 (and log_decay = 0) leaves the state as is.
  pad = lambda x: pad_axis(x, c, axis=2)
  qh, kh, vh, bh = pad(qh), pad(kh), pad(vh), pad(bh)
  n = qh.shape[2] // c
  split = lambda x: x.reshape(x.shape[:2] + (n, c) + x.shape[3:])
  qc, kc, vc, bc = split(qh), split(kh), split(vh), split(bh)  # [B, H, N, C, *]

  if seg is not None:
    segp, *masks = chunks.chunk_segments(seg, c)
    sees_state, to_end, carries = (m.astype(qh.dtype) for m in masks)
  else:
    segp, sees_state, to_end, carries = None, 1.0, 1.0, 1.0
  incl, strict = chunks.pair_masks(segp, segp, c)

  if g is None:
    gc = None
    gamma, gamma_to_end, chunk_decay = 1.0, 1.0, jnp.ones((b, h, n), qh.dtype)
  else:
    gc = jnp.cumsum(split(pad(g)), axis=3)  # in-chunk cumulative, [B, H, N, C]
    gamma = jnp.exp(gc)[..., None]
    gamma_to_end = jnp.exp(gc[..., -1:] - gc)[..., None]
    chunk_decay = jnp.exp(gc[..., -1])
  decay = chunks.pair_decay(gc, incl)

  # Everything that does not depend on the entering state, for all chunks at once.
  kk = jnp.einsum("bhnik,bhnjk->bhnij", kc, kc)
  qk = jnp.einsum("bhnik,bhnjk->bhnij", qc, kc)
  if decay is not None:
    kk, qk = kk * decay, qk * decay
  l = jnp.where(strict, bc[..., :, None] * kk, 0.0)
  a = jnp.where(incl, qk, 0.0)
  inv = chunks.unit_lower_inverse(l)  # the UT transform (I + L)^{-1}, [B, H, N, C, C]
  beta_col = bc[..., None]
  u = jnp.einsum("bhnij,bhnjv->bhniv", inv, beta_col * vc)
  w = jnp.einsum("bhnij,bhnjk->bhnik", inv, beta_col * gamma * sees_state * kc)
  k_end = kc * gamma_to_end * to_end
  chunk_decay = chunk_decay * carries
  return qc * gamma * sees_state, a, u, w, k_end, chunk_decay
