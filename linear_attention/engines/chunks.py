"""Chunk algebra every chunk form shares: block constants, per-chunk segment masks, the
unit-lower-triangular inverse (the UT transform) and the in-chunk scores of per-channel
decays (the ``intra_scores*`` family). Imports only ``common``; the engines' XLA forms and
their Pallas kernels both use it."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from linear_attention.common import check_choice, pad_segment_ids

Array = jax.Array


# Chunks per block of a chunk form's outer scan, per engine: each ``lax.scan`` step runs one
# block of ``block_chunks * chunk_size`` tokens with the state carried, so the per-block working
# set is the same at any length (the values per engine were the faster on CPU, in
# experiments/bench_engine.py runs). The delta engine runs all chunks at once (no blocks).
BLOCK_CHUNKS = {"decay": 16, "dplr": 64}


def block_chunks(engine: str) -> int:
  """Chunks per block of ``engine``'s chunk form (:data:`BLOCK_CHUNKS`)."""
  check_choice("engine", engine, tuple(BLOCK_CHUNKS))
  return BLOCK_CHUNKS[engine]


def chunk_segments(seg: Array, c: int, seg_prev: Array | None = None):
  """Per-chunk segment masks of packed sequences, shared by the chunk forms.

  Args: ``seg [B, T]`` from :func:`segment_index`, ``c`` the chunk length, ``seg_prev [B]`` the
  segment index of the token before the first (None: the rows start here).
  Returns bools ``(segp [B, 1, N, C], sees_state [B, 1, N, C, 1], to_end [B, 1, N, C, 1],
  carries [B, 1, N])``: the padded indices by chunk, whether a token is in the segment of the
  state entering its chunk, whether it is in its chunk's last segment, and whether a chunk's
  entering state reaches its end.
  """
  segp = pad_segment_ids(seg, c).reshape(seg.shape[0], 1, -1, c)
  first = segp[:, :, :1, 0] if seg_prev is None else seg_prev[:, None, None]
  prev_end = jnp.concatenate([first, segp[:, :, :-1, -1]], axis=2)  # [B, 1, N]
  return (segp, (segp == prev_end[..., None])[..., None], (segp == segp[..., -1:])[..., None],
          segp[..., -1] == prev_end)


def pair_masks(seg_q, seg_k, n: int):
  """Causal masks ``[..., n, n]``: ``j <= i`` and ``j < i``, within one segment."""
  incl = jnp.tril(jnp.ones((n, n), bool))
  if seg_q is not None:
    incl = incl & (seg_q[..., :, None] == seg_k[..., None, :])
  strict = incl & ~jnp.eye(n, dtype=bool)
  return incl, strict


def pair_decay(gc, incl):
  """``exp(G_i - G_j)`` for ``j <= i`` (masked before the ``exp``), else 0; or None."""
  if gc is None:
    return None
  diff = gc[..., :, None] - gc[..., None, :]
  return jnp.exp(jnp.where(incl, diff, -jnp.inf))


@jax.custom_vjp
def unit_lower_inverse(l):
  """``(I + l)^{-1}`` for strictly lower-triangular ``l [..., n, n]``, matmuls only.

  Recursive block inversion: starting from the ``1 x 1`` diagonal blocks, pairs
  of inverted blocks ``A^{-1}, D^{-1}`` with coupling ``C`` (the block of ``l``
  below ``A``) merge into ``[[A^{-1}, 0], [-D^{-1} C A^{-1}, D^{-1}]]``;
  ``log2(n)`` levels of batched matmuls. Used instead of a triangular solve,
  whose CPU custom call is slow and can deadlock XLA's thread pool when two
  run at once (as in the backward pass).
  """
  n = l.shape[-1]
  p = 1 << (n - 1).bit_length()
  if p != n:  # Pad to a power of two; the padding block stays the identity.
    l = jnp.pad(l, [(0, 0)] * (l.ndim - 2) + [(0, p - n), (0, p - n)])
  lead = l.shape[:-2]
  mm = functools.partial(jnp.matmul, precision=lax.Precision.HIGHEST)
  # ones_like of l, not jnp.ones: inside shard_map the inverse then varies as l does, also
  # at n = 1 where no level runs (the custom_vjp's cotangent must have l's type).
  inv = jnp.ones_like(l[..., :, :1]).reshape(lead + (p, 1, 1))  # [..., blocks, s, s]
  s = 1
  while s < p:
    nb = p // (2 * s)
    pairs = inv.reshape(lead + (nb, 2, s, s))
    a_inv, d_inv = pairs[..., 0, :, :], pairs[..., 1, :, :]
    # Lower-left s x s block of each 2s x 2s diagonal block of l.
    c = l.reshape(lead + (nb, 2, s, nb, 2, s))[..., :, 1, :, :, 0, :]
    c = jnp.moveaxis(jnp.diagonal(c, axis1=-4, axis2=-2), -1, -3)  # [..., nb, s, s]
    low = -mm(d_inv, mm(c, a_inv))
    top = jnp.concatenate([a_inv, jnp.zeros_like(a_inv)], axis=-1)
    inv = jnp.concatenate([top, jnp.concatenate([low, d_inv], axis=-1)], axis=-2)
    s *= 2
  return inv.reshape(lead + (p, p))[..., :n, :n]


def _unit_lower_inverse_fwd(l):
  x = unit_lower_inverse(l)
  return x, x


def _unit_lower_inverse_bwd(x, dx):
  # X = (I + L)^{-1} gives dX = -X dL X, so dL = -X^T dX X^T, kept on the strictly lower
  # triangle (the only entries of l the inverse reads). Two matmuls, against the six levels
  # of reshapes, diagonals and concatenations that automatic differentiation replays.
  mm = functools.partial(jnp.matmul, precision=lax.Precision.HIGHEST)
  xt = jnp.swapaxes(x, -1, -2)
  n = x.shape[-1]
  return (jnp.where(np.tri(n, k=-1, dtype=bool), -mm(xt, mm(dx, xt)), 0.0),)


unit_lower_inverse.defvjp(_unit_lower_inverse_fwd, _unit_lower_inverse_bwd)


def unit_lower_inverse_rows(l):
  """``(I + l)^{-1}`` by forward substitution, one row at a time (reference path).

  Row ``i`` of the inverse is ``e_i - l_i X`` where only the already final rows
  ``< i`` of ``X`` meet the nonzeros of ``l_i``. ``O(n)`` sequential steps: for
  the parallel form's short inputs only.
  """
  n = l.shape[-1]
  eye = jnp.eye(n, dtype=l.dtype)

  def row(i, x):
    new = eye[i] - jnp.einsum("...j,...jk->...k", l[..., i, :], x,
                              precision=lax.Precision.HIGHEST)
    return x.at[..., i, :].set(new)

  return lax.fori_loop(0, n, row, jnp.zeros_like(l))


# Sub-chunk length of per-channel decays: the exact in-sub-chunk part costs one exp per
# (pair, channel), S per token; 8 was the faster of 8 and 16 for GLA on CPU.
_SUBCHUNK = 8


def _subchunk_size(c: int, most: int = _SUBCHUNK) -> int:
  """The largest divisor of the chunk length that is at most ``most``."""
  return max(d for d in range(1, min(c, most) + 1) if c % d == 0)


def _intra_factors(gc):
  """The sub-chunk factors of ``exp(G_i - G_j)`` (``j <= i``) in a chunk, for :func:`intra_scores`.

  Args: ``gc [..., C, K]``, the in-chunk cumulative log decay. With sub-chunks of ``s`` steps
  (``n = C / s``), ``R_I`` the log decay just before sub-chunk ``I`` and ``E_J`` that at the
  end of ``J``, returns ``(row, col, pair)``: ``row [..., n, s, K] = exp(G_i - R_I)``;
  ``col [..., n, C, K] = exp(R_I - G_j)`` for ``j`` before sub-chunk ``I`` (else 0), built as
  ``exp(R_I - E_J) exp(E_J - G_j)`` so it costs ``n^2 + C`` exps per channel, not ``n C``;
  ``pair [..., n, K, s, s] = exp(G_i - G_j)`` for ``j <= i`` inside one sub-chunk (else 0;
  K ahead of the pair axes: with K the minor axis, XLA's CPU backend ran the in-sub-chunk
  contractions as strided matrix-vector products, 3x slower). Every exponent is ``<= 0``.
  """
  c, dk = gc.shape[-2:]
  s = _subchunk_size(c)
  n = c // s
  gs = gc.reshape(gc.shape[:-2] + (n, s, dk))
  ends = gs[..., -1, :]  # E_J, [..., n, K]
  ref = jnp.concatenate([jnp.zeros_like(ends[..., :1, :]), ends[..., :-1, :]], axis=-2)  # R_I
  row = jnp.exp(gs - ref[..., :, None, :])
  below = jnp.tril(jnp.ones((n, n), bool), -1)
  bridge = jnp.exp(jnp.where(below[:, :, None], ref[..., :, None, :] - ends[..., None, :, :],
                             -jnp.inf))  # [..., I, J, K]
  to_end = jnp.exp(ends[..., :, None, :] - gs)  # [..., J, j, K]
  col = (bridge[..., :, :, None, :] * to_end[..., None, :, :, :]).reshape(
      gc.shape[:-2] + (n, c, dk))
  gt = jnp.swapaxes(gs, -1, -2)  # [..., n, K, s]
  tri = jnp.tril(jnp.ones((s, s), bool))
  pair = jnp.exp(jnp.where(tri, gt[..., :, None] - gt[..., None, :], -jnp.inf))
  return row, col, pair


def _intra_parts(x, y, gc):
  """``x, y`` as sub-chunks with the factors applied; shared by the forward and backward."""
  row, col, pair = _intra_factors(gc)
  n, s = row.shape[-3:-1]
  lead = gc.shape[:-2]
  x4 = x.reshape(lead + (x.shape[-3], n, s, x.shape[-1]))  # [..., R, n, s, K]
  y4 = y.reshape(lead + (y.shape[-3], n, s, y.shape[-1]))
  xs = x4 * row[..., None, :, :, :]  # exp(G_i - R_I) x_i
  yt = y[..., :, None, :, :] * col[..., None, :, :, :]  # exp(R_I - G_j) y_j, [..., P, n, C, K]
  return x4, y4, row, xs, yt, col, pair


@jax.custom_vjp
def intra_scores(x, y, gc):
  """Causal in-chunk scores ``sum_k x_ik y_jk exp(G_ik - G_jk)`` (``j <= i``) of every pair of
  ``R`` row and ``P`` column inputs, sharing the decay factors.

  Args: ``x [..., R, C, K]``, ``y [..., P, C, K]``, ``gc [..., C, K]`` the in-chunk cumulative
  log decay. Returns ``[..., R, P, C, C]``, zero above the diagonal.

  Pairs in different sub-chunks ``J < I`` take the start of row sub-chunk ``I`` as the
  reference, ``exp(G_i - R_I) exp(R_I - G_j)`` (one matmul per row sub-chunk); pairs inside one
  sub-chunk take the exact pairwise difference (see :func:`_intra_factors`). The gradient is
  written out (:func:`_intra_bwd`): differentiated automatically, the ``[..., n, s, s, K]``
  products took 40x the forward on a CPU. GLA and log-linear use it; the DPLR engine uses
  :func:`intra_scores_by_diagonals` (why two, with the numbers: there).
  """
  x4, y4, _, xs, yt, _, pair = _intra_parts(x, y, gc)
  r, n, s = x4.shape[-4:-1]
  p, c = y.shape[-3:-1]
  off = jnp.einsum("...rIik,...pIjk->...rpIij", xs, yt)  # zero for j in or after sub-chunk I
  diag = jnp.einsum("...rIik,...Ikij,...pIjk->...rpIij", x4, pair, y4)
  eye = jnp.eye(n, dtype=diag.dtype)
  out = off.reshape(off.shape[:-1] + (n, s)) + diag[..., :, None, :] * eye[:, None, :, None]
  return out.reshape(out.shape[:-6] + (r, p, c, c))


def _intra_fwd(x, y, gc):
  return intra_scores(x, y, gc), (x, y, gc)


def _intra_bwd(res, ds):
  """``dx_i = sum_j dS_ij y_j exp(G_i - G_j)``, ``dy_j = sum_i dS_ij x_i exp(G_i - G_j)``
  through the same factors, and ``dG = sum x dx - sum y dy``: the scores see ``G`` only
  through the differences ``G_i - G_j``."""
  x, y, gc = res
  x4, y4, row, xs, yt, col, pair = _intra_parts(x, y, gc)
  r, n, s = x4.shape[-4:-1]
  p, c = y.shape[-3:-1]
  lead = gc.shape[:-2]
  d5 = ds.reshape(lead + (r, p, n, s, c))
  dd = jnp.einsum("...rpIiJj,IJ->...rpIij", ds.reshape(lead + (r, p, n, s, n, s)),
                  jnp.eye(n, dtype=ds.dtype))  # the diagonal sub-chunk blocks
  dx = (jnp.einsum("...rpIij,...pIjk->...rIik", d5, yt) * row[..., None, :, :, :]
        + jnp.einsum("...rpIij,...Ikij,...pIjk->...rIik", dd, pair, y4))
  dyt = jnp.einsum("...rpIij,...rIik->...pIjk", d5, xs)
  dy = (jnp.sum(dyt * col[..., None, :, :, :], axis=-3)
        + jnp.einsum("...rpIij,...Ikij,...rIik->...pIjk", dd, pair, x4).reshape(y.shape))
  dx = dx.reshape(x.shape)
  return dx, dy, jnp.sum(x * dx, axis=-3) - jnp.sum(y * dy, axis=-3)


intra_scores.defvjp(_intra_fwd, _intra_bwd)


def _diagonal_subchunk(c: int) -> int:
  """Sub-chunk length of :func:`intra_scores_by_diagonals` for chunks of ``c`` steps: the
  largest divisor of ``c`` at most ``sqrt(c)`` (4 for 32, 8 for 64). Pairs in earlier
  sub-chunks cost ``c^2 / (2 s)`` exps per channel and pairs inside one ``c s / 2``, least
  near ``s = sqrt(c)`` (experiments/bench_scores.py compares the lengths)."""
  return _subchunk_size(c, math.isqrt(c))


def _diagonal_factors(gc, s: int):
  """The decay factors of :func:`intra_scores_by_diagonals`, from ``gc [..., C, K]`` (the in-chunk
  cumulative log decay) and the sub-chunk length ``s``; every exponent is ``<= 0``.

  Returns ``(rows, cols, bands)``. For each row sub-chunk ``I >= 1`` with reference ``R_I``
  (the log decay just before it): ``rows[I - 1] = exp(G_i - R_I)`` for its ``s`` rows and
  ``cols[I - 1] = exp(R_I - G_j)`` for the ``I s`` columns before it. For each offset
  ``1 <= d < s``: ``bands[d - 1] [..., C, K] = exp(G_i - G_{i-d})`` where ``i - d`` is in the
  sub-chunk of ``i``, else 0 (offset 0 is 1). Only the factors a pair needs are formed: no
  ``[..., C, C, K]`` tensor and no copy of ``y`` per row sub-chunk.
  """
  c = gc.shape[-2]
  rows, cols = [], []
  for i in range(1, c // s):
    ref = gc[..., i * s - 1:i * s, :]
    rows.append(jnp.exp(gc[..., i * s:(i + 1) * s, :] - ref))
    cols.append(jnp.exp(ref - gc[..., :i * s, :]))
  inside = np.arange(c) % s
  bands = [jnp.exp(jnp.where((inside >= d)[:, None], gc - _later(gc, d), -jnp.inf))
           for d in range(1, s)]
  return rows, cols, bands


def _later(z, d: int):
  """``z [..., C, K]`` moved ``d`` steps later along ``C``: ``z_{i-d}``, zeros first."""
  return jnp.pad(z, [(0, 0)] * (z.ndim - 2) + [(d, 0), (0, 0)])[..., :z.shape[-2], :]


def _skew(band):
  """``band [..., s, C]`` (offset ``d``, row ``i``) -> ``[..., C, C]`` with ``band[d, i]`` at
  ``(i, i - d)``: rows padded and re-cut one longer, so row ``i`` moves ``i`` places right."""
  s, c = band.shape[-2:]
  lead = band.shape[:-2]
  w = c + s - 1
  rev = jnp.swapaxes(band[..., ::-1, :], -1, -2)  # [..., C, s], offset s - 1 - e
  flat = jnp.pad(rev, [(0, 0)] * len(lead) + [(0, 0), (0, w + 1 - s)]).reshape(lead + (-1,))
  return flat[..., :c * w].reshape(lead + (c, w))[..., s - 1:]


def _diagonal_apply(x, y, rows, cols, bands):
  """The scores for given factors (:func:`_diagonal_factors`), bilinear in ``x, y``: per row
  sub-chunk one matmul against the columns before it; inside a sub-chunk one diagonal
  ``i - j = d`` at a time, elementwise with ``K`` reduced, placed by :func:`_skew`."""
  c = x.shape[-2]
  s = len(bands) + 1
  lead = x.shape[:-3] + (x.shape[-3], y.shape[-3])
  blocks = [jnp.zeros(lead + (s, c), x.dtype)]
  for i, (row, col) in enumerate(zip(rows, cols), start=1):
    xs = x[..., i * s:(i + 1) * s, :] * row[..., None, :, :]
    yt = y[..., :i * s, :] * col[..., None, :, :]
    blocks.append(jnp.pad(jnp.einsum("...rik,...pjk->...rpij", xs, yt),
                          [(0, 0)] * len(lead) + [(0, 0), (0, c - i * s)]))
  pair = lambda yd: jnp.sum(x[..., :, None, :, :] * yd[..., None, :, :, :], axis=-1)
  near = [pair(y)] + [pair(band[..., None, :, :] * _later(y, d))
                      for d, band in enumerate(bands, start=1)]
  return jnp.concatenate(blocks, axis=-2) + _skew(jnp.stack(near, axis=-2))


@jax.custom_vjp
def intra_scores_by_diagonals(x, y, gc):
  """:func:`intra_scores` computed another way, the DPLR engine's.

  Args and result as :func:`intra_scores`: ``x [..., R, C, K]``, ``y [..., P, C, K]``, ``gc
  [..., C, K]`` -> ``[..., R, P, C, C]``. Sub-chunks of :func:`_diagonal_subchunk` steps
  (about ``sqrt(C)``); pairs in earlier sub-chunks: one matmul per row sub-chunk against only
  the columns before it; pairs inside one sub-chunk: one diagonal ``i - j = d`` at a time,
  elementwise with ``K`` reduced (:func:`_diagonal_factors`). The scores are bilinear in
  ``x, y`` for fixed factors, so the gradient (:func:`_diagonals_bwd`) is that bilinear map's
  plus ``dG = sum x dx - sum y dy`` (``G`` enters only as ``G_i - G_j``): no derivative
  through an ``exp``.

  Why two implementations: neither is faster for every op on CPU, so GLA and log-linear keep
  :func:`intra_scores` and the DPLR engine uses this one (whole-op timings of both:
  ``experiments/bench/bench_scores.py``, ``results/bench_scores_cpu*.json``).
  """
  s = _diagonal_subchunk(gc.shape[-2])
  return _diagonal_apply(x, y, *_diagonal_factors(gc, s))


def _diagonals_fwd(x, y, gc):
  return intra_scores_by_diagonals(x, y, gc), (x, y, gc)


def _diagonals_bwd(res, ds):
  x, y, gc = res
  factors = _diagonal_factors(gc, _diagonal_subchunk(gc.shape[-2]))
  dx, dy = jax.vjp(lambda x, y: _diagonal_apply(x, y, *factors), x, y)[1](ds)
  return dx, dy, jnp.sum(x * dx, axis=-3) - jnp.sum(y * dy, axis=-3)


intra_scores_by_diagonals.defvjp(_diagonals_fwd, _diagonals_bwd)


def intra_scores_vector(q, k, gc):
  """:func:`intra_scores` of one row and one column input: ``q, k, gc [..., C, K]`` ->
  ``[..., C, C]``."""
  return intra_scores(q[..., None, :, :], k[..., None, :, :], gc)[..., 0, 0, :, :]
