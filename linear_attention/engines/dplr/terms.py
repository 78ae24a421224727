"""The DPLR engine's chunk algebra and array checks, shared by its XLA chunk form
(:mod:`.engine`) and its Pallas kernel (:mod:`.pallas`)."""

from __future__ import annotations

import jax.numpy as jnp

from linear_attention.common import (check_float, check_log_decay, check_rank, check_seq_len,
                                     check_shape, check_value_groups, pad_axis)
from linear_attention.engines import chunks


def dplr_chunk_terms(qh, kh, vh, ah, bh, g, seg, chunk_size: int, seg_prev=None):
  """The DPLR engine's state-independent chunk quantities, for all chunks at once.

  Inputs are flat sub-steps ``[B, H, T, *]`` (``qh`` already scaled; ``ah`` None
  means ``a = -k``, the delta-rule maps', whose scores are then computed once:
  ``A_qa = -A_qk``, ``L_ba = -L_bk``; ``g``
  ``[B, H, T, K]`` floored, see :func:`floor_log_decay`, or None), ``seg``
  from :func:`segment_index` or None, ``seg_prev [B]`` the segment index of the
  sub-step before the first (None: the rows start here). With the algebra of
  :mod:`linear_attention.ops.dplr` (``U = U_0 + W S_0`` per chunk), returns
  ``(qg, a_qa, a_qk, u0, w, a_end, k_end, chunk_decay)``: the decayed queries
  ``Q e^G`` ``[B, H, N, C, K]``, the in-chunk scores ``A_qa, A_qk`` ``[B, H,
  N, C, C]``, ``U_0`` ``[B, H, N, C, V]`` and ``W`` ``[B, H, N, C, K]``, the
  correction and write keys decayed to the chunk's end (``[B, H, N, C, K]``)
  and the chunk's decay ``[B, H, N, K]``, segment masks folded in. Per chunk::

      O = Qg S_0 + A_qa U + A_qk V      S_C = chunk_decay * S_0 + a_end^T U + k_end^T V

  Built for the Pallas kernel (``kernels.chunk_dplr``) in the shape the XLA
  chunk form of ``ops.dplr`` needs too.
  """
  c = chunk_size
  # Padding with zeros (no decay, no correction, no write) leaves the state as is.
  pad = lambda x: pad_axis(x, c, axis=2)
  n = pad(qh).shape[2] // c
  split = lambda x: pad(x).reshape(x.shape[:2] + (n, c) + x.shape[3:])
  neg_k = ah is None
  qc, kc, vc, bc = (split(x) for x in (qh, kh, vh, bh))  # [B, H, N, C, *]
  gc = jnp.cumsum(split(jnp.zeros_like(kh) if g is None else g), axis=3)  # inclusive
  ge = jnp.concatenate([jnp.zeros_like(gc[..., :1, :]), gc[..., :-1, :]], axis=3)  # exclusive
  last = gc[..., -1, :]  # [B, H, N, K]

  if seg is not None:
    segp, sees_state, to_end, carries = chunks.chunk_segments(seg, c, seg_prev)
    sees_state, to_end = sees_state.astype(qc.dtype), to_end.astype(qc.dtype)
    carries = carries[..., None].astype(qc.dtype)  # [B, 1, N, 1]
  else:
    segp, sees_state, to_end, carries = None, 1.0, 1.0, 1.0
  incl, strict = chunks.pair_masks(segp, segp, c)

  # In-chunk scores, all chunks at once. L_xy[i, j] = A-style score of (b_i, y_j)
  # with the rows' decay stopped one step earlier: b moved one row back, then down.
  # One call for the four (two when a = -k): they share the decay factors, the costly part
  # on a CPU.
  b_next = jnp.concatenate([bc[..., 1:, :], jnp.zeros_like(bc[..., :1, :])], axis=3)
  cols = [kc] if neg_k else [kc, split(ah)]
  scores = chunks.intra_scores_by_diagonals(jnp.stack([qc, b_next], axis=3), jnp.stack(cols, axis=3),
                                     gc)
  down = lambda m: jnp.concatenate([jnp.zeros_like(m[..., :1, :]), m[..., :-1, :]], axis=-2)
  a_qk = jnp.where(incl, scores[..., 0, 0, :, :], 0.0)
  l_bk = jnp.where(strict, down(scores[..., 1, 0, :, :]), 0.0)
  if neg_k:
    a_qa, l_ba = -a_qk, -l_bk
  else:
    a_qa = jnp.where(incl, scores[..., 0, 1, :, :], 0.0)
    l_ba = jnp.where(strict, down(scores[..., 1, 1, :, :]), 0.0)
  inv = chunks.unit_lower_inverse(-l_ba)  # the UT transform (I - L_ba)^{-1}
  w = inv @ (bc * jnp.exp(ge) * sees_state)
  u0 = inv @ (l_bk @ vc)
  decay_to_end = jnp.exp(last[..., None, :] - gc) * to_end
  k_end = kc * decay_to_end
  a_end = -k_end if neg_k else split(ah) * decay_to_end
  return (qc * jnp.exp(gc) * sees_state, a_qa, a_qk, u0, w, a_end, k_end,
          jnp.exp(last) * carries)


def check_dplr_inputs(q, k, v, a, b, log_decay):
  """The DPLR engine's array checks (``ops.dplr_attention``, ``kernels.chunk_dplr``):
  floats; ``q [B, T, Hk, K]``; ``k, a, b`` ``[B, T, H, K]`` or ``[B, T, H, R, K]``; ``v``
  with the same leading axes; ``log_decay`` None, ``[B, T, H]`` or ``[B, T, H, K]``; ``H``
  (the heads of ``v``) a multiple of ``Hk`` (grouped value heads, ``Hk = H`` without).
  Returns ``(B, T, H, K, V)``; raises a ValueError naming the first bad argument."""
  for name, x in (("q", q), ("k", k), ("v", v), ("a", a), ("b", b)):
    check_float(name, x)
  check_rank("q", q, 4)
  bsz, t, h, dk = q.shape
  check_seq_len(t, "axis 1 of q")
  if jnp.ndim(v) >= 3:  # a wrong rank of v is named below
    h *= check_value_groups("v", jnp.shape(v)[2], h, "q")
  if jnp.ndim(a) not in (4, 5):
    raise ValueError("a must have shape [B, T, H, K] (rank one) or [B, T, H, R, K] (R "
                     f"sub-steps per token), got {list(jnp.shape(a))}.")
  lead = (bsz, t, h) + ((a.shape[3],) if jnp.ndim(a) == 5 else ())
  letters = "[B, T, H, R, *]" if len(lead) == 4 else "[B, T, H, *]"
  for name, x in (("a", a), ("b", b), ("k", k)):
    check_shape(name, x, lead + (dk,), f"{letters} with B, T, K of q, H of v and R of a")
  check_shape("v", v, lead + (None,), f"{letters} with B, T of q and R of a")
  check_log_decay(log_decay, bsz, t, h, dk)
  return bsz, t, h, dk, v.shape[-1]
