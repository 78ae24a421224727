"""The delta rule's chunk algebra, shared by its XLA chunk form (:mod:`.engine`) and its
Pallas kernel (:mod:`.pallas`)."""

from __future__ import annotations

import jax.numpy as jnp

from linear_attention.common import pad_axis
from linear_attention.engines import chunks


def delta_chunk_terms(qh, kh, vh, bh, g, seg, chunk_size: int):
  """The delta rule's state-independent chunk quantities, for all chunks at once.

  Inputs ``[B, Hk, G, T, *]`` (grouped value heads, see
  :func:`~linear_attention.common.group_heads`: ``qh, kh`` with ``G = 1``, ``qh``
  already scaled), ``bh, g`` ``[B, Hk, G, T]`` (``g`` floored, see
  :func:`floor_log_decay`, or None), ``seg`` from :func:`segment_index` or None. With
  ``D = U - W S_0`` per chunk (the algebra of :mod:`linear_attention.engines.delta.engine`),
  returns ``(qg, a, u, w, k_end, chunk_decay)``: the decayed queries ``Q e^G`` and in-chunk
  scores ``A`` (``[B, Hk, G', N, C, K]``, ``[B, Hk, G, N, C, C]``), ``U`` and ``W`` (``[B,
  Hk, G, N, C, V]``, ``[B, Hk, G, N, C, K]``), the keys decayed to the chunk's end and the
  chunk's decay (``[B, Hk, G', N, C, K]``, ``[B, Hk, G', N]``), segment masks folded in;
  ``G'`` is 1 where nothing per value head (no gate) enters, else ``G``.
  Shared by the XLA chunk form and the Pallas kernel (``engines.delta.pallas``).
  """
  c = chunk_size
  # Padding with beta = 0 and k = 0 (and log_decay = 0) leaves the state as is.
  pad = lambda x: pad_axis(x, c, axis=3)
  qh, kh, vh, bh = pad(qh), pad(kh), pad(vh), pad(bh)
  n = qh.shape[3] // c
  split = lambda x: x.reshape(x.shape[:3] + (n, c) + x.shape[4:])
  qc, kc, vc, bc = split(qh), split(kh), split(vh), split(bh)  # [B, Hk, G, N, C, *]

  if seg is not None:
    # The masks' head axis [B, 1, ...] gains the group axis: [B, 1, 1, ...].
    segp, *masks = (m[:, None] for m in chunks.chunk_segments(seg, c))
    sees_state, to_end, carries = (m.astype(qh.dtype) for m in masks)
  else:
    segp, sees_state, to_end, carries = None, 1.0, 1.0, 1.0
  incl, strict = chunks.pair_masks(segp, segp, c)

  if g is None:
    gc = None
    gamma, gamma_to_end, chunk_decay = 1.0, 1.0, jnp.ones(kc.shape[:4], qh.dtype)
  else:
    gc = jnp.cumsum(split(pad(g)), axis=4)  # in-chunk cumulative, [B, Hk, G, N, C]
    gamma = jnp.exp(gc)[..., None]
    gamma_to_end = jnp.exp(gc[..., -1:] - gc)[..., None]
    chunk_decay = jnp.exp(gc[..., -1])
  decay = chunks.pair_decay(gc, incl)

  # Everything that does not depend on the entering state, for all chunks at once.
  # Once per query/key head; the per-value-head factors (decay, beta) broadcast over G.
  kk = jnp.einsum("...ik,...jk->...ij", kc, kc)
  qk = jnp.einsum("...ik,...jk->...ij", qc, kc)
  if decay is not None:
    kk, qk = kk * decay, qk * decay
  l = jnp.where(strict, bc[..., :, None] * kk, 0.0)
  a = jnp.where(incl, qk, 0.0)
  inv = chunks.unit_lower_inverse(l)  # the UT transform (I + L)^{-1}, [B, Hk, G, N, C, C]
  beta_col = bc[..., None]
  u = jnp.einsum("...ij,...jv->...iv", inv, beta_col * vc)
  w = jnp.einsum("...ij,...jk->...ik", inv, beta_col * gamma * sees_state * kc)
  k_end = kc * gamma_to_end * to_end
  chunk_decay = chunk_decay * carries
  return qc * gamma * sees_state, a, u, w, k_end, chunk_decay
