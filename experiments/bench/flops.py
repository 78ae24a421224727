"""Forward FLOP counts and peak-memory estimates of the benchmark cases.

Every function takes the length ``t`` and the problem sizes ``d`` (:class:`.cases.Dims`:
``B, H, D, C, N, M, chunk`` and the sparse sizes) and returns a count (FLOPs) or bytes
(float32). fwd+bwd GFLOP/s use 3x the forward count.

Matrix-state engines, softmax and S4D's FFT form count the algorithm as written (masked-out
work included); sparse methods count the visible (query, key) pairs; elementwise scans count
the recurrence itself, the same for every form of one op, so their GFLOP/s compare forms
directly.
"""

from __future__ import annotations

import math

F32 = 4  # bytes


# ------------------------------------------------------------------ matrix-state engines


def chunk(t, d):
  # Per head and token: QK^T and AV inside the chunk (2C(K+V)), the chunk's state (2KV) and
  # the read of the incoming state (2KV). Also the count of the per-channel (vector) decays
  # (GLA, HGRN2, RWKV-6), whose extra elementwise decay work is not counted.
  return d.B * d.H * t * (2 * d.chunk * 2 * d.D + 4 * d.D * d.D)


def feature_chunk(features: int):
  """:func:`chunk` with ``features`` key features against values of width ``D`` (Based's
  Taylor map, ReBased's squares), the normaliser column left out."""
  def count(t, d):
    return d.B * d.H * t * (2 * d.chunk * (features + d.D) + 4 * features * d.D)
  return count


def feature_recurrent(features: int):
  """:func:`recurrent` with ``features`` key features against values of width ``D``."""
  def count(t, d):
    return d.B * d.H * t * 4 * features * d.D
  return count


def recurrent(t, d):
  return d.B * d.H * t * 4 * d.D * d.D  # per token: the update k v^T (2KV) and the read (2KV)


def quadratic(t, d):
  return d.B * d.H * 2 * t * t * 2 * d.D  # QK^T and AV over the full T x T


def delta_chunk(t, d):
  # The WY / UT-transform chunk form of ops/delta.py, per head and token: KK^T, QK^T,
  # W = inv @ (beta K) (2CK each), U = inv @ (beta V) and the in-chunk scores times the
  # pseudo-values (2CV each); W S_0, Q S_0 and the state update K^T D (2KV each); the
  # recursive block inverse of the C x C unit-lower matrix, (2/3) C^3 per chunk.
  c = d.chunk
  return d.B * d.H * t * (2 * c * (3 * d.D + 2 * d.D) + 6 * d.D * d.D + 2 * c * c / 3)


def delta_recurrent(t, d):
  return d.B * d.H * t * 6 * d.D * d.D  # per token: S^T k, the rank-1 update, the read


def delta_parallel(t, d):
  # ops/delta.py's parallel form: QK^T and KK^T (2T^2 K each), the inverse by row-wise
  # forward substitution over the full T x T (2T^3), P = A inv (2T^3), P V (2T^2 V).
  return d.B * d.H * (4 * t * t * d.D + 4 * t ** 3 + 2 * t * t * d.D)


# ------------------------------------------------------------------------ elementwise scans


def scan(t, d):
  return d.B * t * d.C * d.N * 2  # h = a * h + b: a multiply and an add per element and step


def mamba(t, d):
  # Per channel, state element and step: dt * A (1), the input dt x * B (1), a * h + b (2),
  # the read C . h (2); exp not counted. The same for every form, the matmul one included.
  return d.B * t * d.C * d.N * 6


def rglru(t, d):
  # Per channel and step: the scan (2) and the gates r, i, a, sqrt(1 - a^2) and the gated
  # input, about 10 elementwise ops; transcendental functions count 1.
  return d.B * t * d.C * 12


def s4d_recurrent(t, d):
  # Per channel, mode and step: complex a * h + b (8), the real-times-complex input
  # Bbar u (2), the read 2 Re(C h) with its sum (4).
  return d.B * t * d.C * d.M * 14


def s4d_fft(t, d):
  # The closed-form kernel (a complex multiply-add per mode and lag: 8 M T per channel), two
  # real FFTs and one inverse of length L = 2T (2.5 L log2 L each) and the spectral product
  # (6 per frequency).
  n = 2 * t
  return d.B * d.C * (8 * d.M * t + 3 * 2.5 * n * math.log2(n) + 6 * (n // 2 + 1))


# ------------------------------------------------------------------------- sparse / low-rank


def window(t, d):
  # Visible pairs only: each query sees `window` keys (fewer at the start).
  w = min(d.window, t)
  pairs = t * w - w * (w - 1) // 2
  return d.B * d.H * 2 * pairs * 2 * d.D


def longformer(t, d):
  # Bidirectional window |i - j| < window (2w - 1 keys), plus every query to the global
  # keys and the global queries to every key.
  return d.B * d.H * 2 * 2 * d.D * (t * min(2 * d.window - 1, t) + 2 * d.globals * t)


def bigbird(t, d):
  # Ordinary query blocks see (w + r + g) key blocks; the g global query blocks see every key.
  b, g = d.bb_block, d.bb_global
  keys = (d.bb_window + d.bb_random + g) * b
  return d.B * d.H * 2 * 2 * d.D * ((t - g * b) * keys + g * b * t)


def linformer(t, d):
  # E K and F V (2kT(K) and 2kT(V)), then T queries over k projected keys.
  return d.B * d.H * 2 * d.linformer_k * t * 2 * d.D * 2


# ------------------------------------------------------------------------ memory estimates
# Only where the working set can outgrow --mem-limit-gb before XLA's own plan is known.


def none(t, d):
  return 0  # nothing to estimate: XLA's compiled plan decides


def scores(factor):
  """``factor`` float32 ``[B, H, T, T]`` score matrices (softmax, parallel forms)."""
  return lambda t, d: factor * d.B * d.H * t * t * F32


def channel_scores(factor):
  """``factor`` ``[B, H, T, T, D]`` arrays: the per-channel decays of a parallel form."""
  return lambda t, d: factor * d.B * d.H * t * t * d.D * F32


def states(factor):
  """``factor`` float32 ``[B, H, T, D, D]``: a recurrent form's saved states for the backward."""
  return lambda t, d: factor * d.B * d.H * t * d.D * d.D * F32


def delta_parallel_bwd(t, d):
  return d.B * d.H * t ** 3 * F32  # the row-wise inverse saves a T x T carry per row
