"""Exact softmax attention: the quadratic baseline every other op is measured against.

Two XLA algorithms of one function, :func:`softmax_attention` (``algorithm=``):

* ``naive``: the ``T x T`` logits are materialised in float32, masked and
  normalised in one go. The readable reference.
* ``blockwise``: FlashAttention's online softmax in plain JAX. Queries are cut
  into blocks (an outer ``lax.map``); each query block loops over the key
  blocks it can see, keeping a running maximum ``m``, a running normaliser
  ``l`` and an unnormalised output. Causal attention stops at the diagonal
  block, so it costs about half. Memory is ``O(T)``: the backward pass (a
  ``jax.custom_vjp``) recomputes the probabilities block by block from the
  saved per-query log-sum-exp, as in FlashAttention-2 (``dq`` per query block
  looping over key blocks, ``dk, dv`` per key block looping over query blocks).
and, with ``implementation="pallas"``, the same algorithm as a Pallas kernel
for GPU (Triton) and TPU (``engines/softmax/pallas/``; interpret mode on
CPU). ``implementation`` is ``None | "xla" | "pallas"`` as for every op;
``algorithm=None`` picks naive or blockwise by length.

The block machinery is shared with ``ops/sparse.py``:

* :func:`flash_attention_stats`: blockwise attention where a static
  :class:`BlockMask` says which key blocks each query block visits (all, up to
  the diagonal, or a band around it) and which tokens inside a block pair are
  visible. Returns the output and the log-sum-exp, both differentiable.
* :func:`dense_attention_stats`: one masked softmax over a given key set (the
  naive path, and the gathered key sets of Longformer and BigBird).
* :func:`merge_attention`: combines two attentions over disjoint key sets into
  the attention over their union, from their outputs and log-sum-exps.

Masking uses a large finite negative logit (never ``-inf``) and zeroes masked
probabilities explicitly, so a row with no visible key (only padding can have
one) gives a zero output and no NaN anywhere. Softmax statistics and
accumulation are float32 (wider for float64 inputs); outputs come back in the
input dtype.

Forgetting Attention (FoX, Lin et al. 2025), :func:`forgetting_attention`,
is causal softmax attention whose logits get a data-dependent decay bias
``sum_{j < s <= i} log f_s = D_i - D_j`` with ``D`` the cumulative sum of the
per-head log forget gates. Both algorithms take it through one hook (a
per-position ``q_bias_i - k_bias_j`` added to the logits, with its gradient in
the blockwise backward), so it keeps their ``O(T)`` memory and packing;
:func:`forgetting_attention_step` decodes with a KV cache that also stores
each key's ``D``. The Pallas kernel does not take the bias yet.

Segments: ``segment_ids`` ``[B, T]`` packs sequences in a row. As in every op
of this package, a segment is a maximal run of equal ids (``common.segment_index``);
a query sees only keys of its own run.

Context parallelism (``context=``, the sequence split over a mesh axis) is
all-gather attention: each device keeps its ``T / n`` queries at their global
positions and gathers every key and value (and segment id, and FoX's ``D``)
of the axis, one ``all_gather`` each. Per device the logits are
``[T / n, T]`` (naive) or blocks of them (blockwise, which then visits every
key block: no causal skipping across devices), so memory is ``1 / n`` of the
one-device naive form's; a ring or blockwise pass over devices would make it
``O(T / n)`` at ``n - 1`` rounds of communication.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from linear_attention import common
from linear_attention.engines import dispatch
from linear_attention.engines.softmax.pallas import flash_attention, unsupported_arguments
from linear_attention.engines.context import SeqContext, axis_index, check_context, refuse_pallas

Array = jax.Array

IMPLEMENTATIONS = dispatch.IMPLEMENTATIONS
ALGORITHMS = (None, "naive", "blockwise")
# Longest sequence for which algorithm=None picks the naive path: naive was the faster up to
# 256 tokens on CPU, blockwise from 512 (results/softmax_baseline_cpu.json).
NAIVE_MAX_LEN = 256
# Logit given to masked pairs: finite, so max/exp never see inf - inf.
MASK_VALUE = -1e30
# Segment ids given to padding: padded keys match no query, padded queries no key.
PAD_KEY_SEG = -1
PAD_QUERY_SEG = -2


# ---------------------------------------------------------------------------
# Shared machinery.


@dataclasses.dataclass(frozen=True)
class BlockMask:
  """Static description of which (query, key) pairs are visible, by position.

  A pair with query position ``i`` and key position ``j`` (and equal segment
  ids) is visible when ``j <= i`` if ``causal``, and ``i - j < window`` (causal)
  or ``|i - j| < window`` (not causal) if ``window`` is set.

  ``aligned`` says that query block ``n`` and key block ``n`` cover the same
  positions (self-attention with ``block_q == block_k`` and positions equal to
  array indices); only then are whole key blocks skipped, which is what makes
  causal attention half price and windowed attention ``O(T * window)``. Without
  it every query block visits every key block and the mask does all the work.
  """

  block_q: int
  block_k: int
  causal: bool = False
  window: int | None = None
  aligned: bool = True

  def __post_init__(self):
    if self.aligned and self.block_q != self.block_k:
      raise ValueError(
          f"an aligned BlockMask needs block_q == block_k, got {self.block_q} and {self.block_k}."
      )

  def visible(self, q_pos: Array, k_pos: Array) -> Array:
    """``[B, bq]`` and ``[B, bk]`` positions -> ``[B, bq, bk]`` bool."""
    d = q_pos[:, :, None] - k_pos[:, None, :]
    ok = jnp.ones(d.shape, bool)
    if self.causal:
      ok &= d >= 0
    if self.window is not None:
      ok &= d < self.window
      if not self.causal:
        ok &= d > -self.window
    return ok

  def _reach(self) -> tuple[int | None, int | None]:
    """Key blocks visible to the left and right of the diagonal (None: unbounded)."""
    left = None if self.window is None else -(-(self.window - 1) // self.block_k)
    right = 0 if self.causal else left
    return left, right

  def key_blocks(self, i, num_k: int):
    """``[lo, hi)`` key blocks that query block ``i`` visits."""
    left, right = self._reach() if self.aligned else (None, None)
    lo = 0 if left is None else jnp.maximum(0, i - left)
    hi = num_k if right is None else jnp.minimum(num_k, i + right + 1)
    return lo, hi

  def query_blocks(self, j, num_q: int):
    """``[lo, hi)`` query blocks that visit key block ``j`` (the inverse of ``key_blocks``)."""
    left, right = self._reach() if self.aligned else (None, None)
    lo = 0 if right is None else jnp.maximum(0, j - right)
    hi = num_q if left is None else jnp.minimum(num_q, j + left + 1)
    return lo, hi


def _block_logits(mask: BlockMask, scale: float, qi, kj, qpi, kpj, qsi, ksj, bqi=None, bkj=None):
  """Masked float32 logits ``[B, bq, H, bk]`` and the mask ``[B, bq, 1, bk]``.

  ``bqi [B, bq, H]``, ``bkj [B, bk, H]`` (both or neither): the logit of a
  pair gets ``bqi - bkj`` added (the forgetting bias ``D_i - D_j``).
  """
  acc = common.acc_dtype(qi.dtype)
  s = jnp.einsum("bqhd,bkhd->bqhk", qi, kj, preferred_element_type=acc) * scale
  if bqi is not None:
    s = s + (bqi[:, :, :, None] - jnp.swapaxes(bkj, 1, 2)[:, None, :, :])
  ok = (qsi[:, :, None] == ksj[:, None, :]) & mask.visible(qpi, kpj)
  ok = ok[:, :, None, :]
  return jnp.where(ok, s, MASK_VALUE), ok


def _blocks(x: Array, size: int) -> Array:
  """``[B, n*size, ...]`` -> ``[n, B, size, ...]`` (block index first, for ``lax.map``)."""
  b, t = x.shape[:2]
  return jnp.moveaxis(x.reshape(b, t // size, size, *x.shape[2:]), 1, 0)


def _unblocks(x: Array) -> Array:
  """Inverse of :func:`_blocks`."""
  n, b, size = x.shape[:3]
  return jnp.moveaxis(x, 0, 1).reshape(b, n * size, *x.shape[3:])


def _take(x: Array | None, j, size: int) -> Array | None:
  return None if x is None else lax.dynamic_slice_in_dim(x, j * size, size, axis=1)


def _blocks_or_none(x: Array | None, size: int) -> Array | None:
  return None if x is None else _blocks(x, size)


def _zero(dtype, *xs) -> Array:
  """A ``[1, ...]`` zero that varies over the mesh axes of every ``x`` (inside ``shard_map``).

  Added to a loop's initial carry, it gives the carry the type of the values the loop
  computes from ``xs`` (a constant ``jnp.zeros`` carry is invariant and would change type).
  """
  return sum(jnp.zeros_like(x[(slice(0, 1),) * x.ndim], dtype) for x in xs)


def _flash_forward(mask, scale, q, k, v, q_pos, k_pos, q_seg, k_seg, q_bias, k_bias):
  b, tq, h, _ = q.shape
  dv = v.shape[-1]
  bq, bk = mask.block_q, mask.block_k
  nq, nk = tq // bq, k.shape[1] // bk
  acc = common.acc_dtype(q.dtype)

  def query_block(args):
    i, qi, qpi, qsi, bqi = args

    def body(j, carry):
      m, l, o = carry
      s, ok = _block_logits(mask, scale, qi, _take(k, j, bk), qpi, _take(k_pos, j, bk),
                            qsi, _take(k_seg, j, bk), bqi, _take(k_bias, j, bk))
      m_new = jnp.maximum(m, jnp.max(s, axis=-1))
      # Explicit zeros: a fully masked row has m_new == MASK_VALUE and exp(0) = 1.
      p = jnp.where(ok, jnp.exp(s - m_new[..., None]), 0.0)
      corr = jnp.exp(m - m_new)
      l = l * corr + jnp.sum(p, axis=-1)
      o = o * corr[..., None] + jnp.einsum("bqhk,bkhd->bqhd", p, _take(v, j, bk).astype(acc))
      return m_new, l, o

    z = _zero(acc, qi, k, v)
    init = (jnp.full((b, bq, h), MASK_VALUE, acc) + z[..., 0],
            jnp.zeros((b, bq, h), acc) + z[..., 0], jnp.zeros((b, bq, h, dv), acc) + z)
    lo, hi = mask.key_blocks(i, nk)
    m, l, o = lax.fori_loop(lo, hi, body, init)
    seen = l > 0
    l = jnp.where(seen, l, 1.0)
    return o / l[..., None], jnp.where(seen, m + jnp.log(l), MASK_VALUE)

  o, lse = lax.map(query_block, (jnp.arange(nq), _blocks(q, bq), _blocks(q_pos, bq),
                                 _blocks(q_seg, bq), _blocks_or_none(q_bias, bq)))
  return _unblocks(o), _unblocks(lse)


# q_bias/k_bias ([B, T, H] float32 or None) add q_bias_i - k_bias_j to the logits.
@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _flash(mask, scale, q, k, v, q_pos, k_pos, q_seg, k_seg, q_bias, k_bias):
  return _flash_forward(mask, scale, q, k, v, q_pos, k_pos, q_seg, k_seg, q_bias, k_bias)


def _flash_fwd(mask, scale, q, k, v, q_pos, k_pos, q_seg, k_seg, q_bias, k_bias):
  o, lse = _flash_forward(mask, scale, q, k, v, q_pos, k_pos, q_seg, k_seg, q_bias, k_bias)
  return (o, lse), (q, k, v, q_pos, k_pos, q_seg, k_seg, q_bias, k_bias, o, lse)


def _flash_bwd(mask, scale, res, cotangents):
  q, k, v, q_pos, k_pos, q_seg, k_seg, q_bias, k_bias, o, lse = res
  biased = q_bias is not None
  do, dlse = cotangents
  acc = o.dtype
  bq, bk = mask.block_q, mask.block_k
  nq, nk = q.shape[1] // bq, k.shape[1] // bk
  do = do.astype(acc)
  # d lse_i / d s_ij = p_ij, so a log-sum-exp cotangent just shifts the row term.
  delta = jnp.sum(do * o, axis=-1) - dlse.astype(acc)

  def probs(qi, kj, qpi, kpj, qsi, ksj, lse_i, bqi, bkj):
    s, ok = _block_logits(mask, scale, qi, kj, qpi, kpj, qsi, ksj, bqi, bkj)
    return jnp.where(ok, jnp.exp(s - lse_i[..., None]), 0.0)

  # d logit_ij / d q_bias_i = 1 and / d k_bias_j = -1 (unscaled): the bias
  # cotangents are the row and column sums of ds.
  def dq_block(args):
    i, qi, qpi, qsi, doi, lse_i, delta_i, bqi = args

    def body(j, carry):
      dq, dbq = carry
      kj, vj = _take(k, j, bk).astype(acc), _take(v, j, bk).astype(acc)
      p = probs(qi, kj, qpi, _take(k_pos, j, bk), qsi, _take(k_seg, j, bk), lse_i,
                bqi, _take(k_bias, j, bk))
      dp = jnp.einsum("bqhd,bkhd->bqhk", doi, vj)
      ds = p * (dp - delta_i[..., None])
      dbq = dbq + jnp.sum(ds, axis=-1) if biased else dbq
      return dq + jnp.einsum("bqhk,bkhd->bqhd", ds, kj), dbq

    lo, hi = mask.key_blocks(i, nk)
    z = _zero(acc, qi, doi, k, v)
    dq, dbq = lax.fori_loop(lo, hi, body, (jnp.zeros(qi.shape, acc) + z,
                                           jnp.zeros(lse_i.shape, acc) + z[..., 0]))
    return dq * scale, dbq

  def dkv_block(args):
    j, kj, vj, kpj, ksj, bkj = args
    kj, vj = kj.astype(acc), vj.astype(acc)

    def body(i, carry):
      dk, dv, dbk = carry
      qi, doi = _take(q, i, bq).astype(acc), _take(do, i, bq)
      p = probs(qi, kj, _take(q_pos, i, bq), kpj, _take(q_seg, i, bq), ksj, _take(lse, i, bq),
                _take(q_bias, i, bq), bkj)
      dv = dv + jnp.einsum("bqhk,bqhd->bkhd", p, doi)
      dp = jnp.einsum("bqhd,bkhd->bqhk", doi, vj)
      ds = p * (dp - _take(delta, i, bq)[..., None])
      dbk = dbk - jnp.swapaxes(jnp.sum(ds, axis=1), 1, 2) if biased else dbk
      return dk + jnp.einsum("bqhk,bqhd->bkhd", ds, qi), dv, dbk

    lo, hi = mask.query_blocks(j, nq)
    z = _zero(acc, kj, vj, q, do)
    zeros = (jnp.zeros(kj.shape, acc) + z, jnp.zeros(vj.shape, acc) + z,
             jnp.zeros(kj.shape[:3], acc) + z[..., 0])
    dk, dv, dbk = lax.fori_loop(lo, hi, body, zeros)
    return dk * scale, dv, dbk

  dq, dbq = lax.map(dq_block, (jnp.arange(nq), _blocks(q.astype(acc), bq), _blocks(q_pos, bq),
                               _blocks(q_seg, bq), _blocks(do, bq), _blocks(lse, bq),
                               _blocks(delta, bq), _blocks_or_none(q_bias, bq)))
  dk, dv, dbk = lax.map(dkv_block, (jnp.arange(nk), _blocks(k, bk), _blocks(v, bk),
                                    _blocks(k_pos, bk), _blocks(k_seg, bk),
                                    _blocks_or_none(k_bias, bk)))
  bias_grads = ((_unblocks(dbq).astype(q_bias.dtype), _unblocks(dbk).astype(k_bias.dtype))
                if biased else (None, None))
  return (_unblocks(dq).astype(q.dtype), _unblocks(dk).astype(k.dtype),
          _unblocks(dv).astype(v.dtype), None, None, None, None) + bias_grads


_flash.defvjp(_flash_fwd, _flash_bwd)
# Jitted so that eager calls (and eager grads) reuse compiled loops.
_flash_jit = jax.jit(_flash, static_argnums=(0, 1))


def flash_attention_stats(q: Array, k: Array, v: Array, q_pos: Array, k_pos: Array,
                          q_seg: Array, k_seg: Array, *, mask: BlockMask, scale: float,
                          q_bias: Array | None = None,
                          k_bias: Array | None = None) -> tuple[Array, Array]:
  """Blockwise (online-softmax) attention returning its output and log-sum-exp.

  Pads queries and keys to their block sizes (padding is invisible) and slices
  the padding off again. Differentiable in ``q, k, v`` and in both outputs
  through a FlashAttention-2 style ``custom_vjp``: nothing ``Tq x Tk`` is stored.

  Args:
    q: ``[B, Tq, H, K]``; k: ``[B, Tk, H, K]``; v: ``[B, Tk, H, V]``.
    q_pos, k_pos: ``[B, Tq]``, ``[B, Tk]`` int positions, used by ``mask``.
    q_seg, k_seg: ``[B, Tq]``, ``[B, Tk]`` int segment indices: a pair is
      visible only if they are equal. Use a negative ``k_seg`` (that no query
      has) to hide a key.
    mask: which blocks and pairs are visited (static).
    scale: logit scale.
    q_bias, k_bias: optional ``[B, Tq, H]`` and ``[B, Tk, H]`` (both or
      neither): the logit of pair ``(i, j)`` gets ``q_bias_i - k_bias_j`` added
      after scaling (Forgetting Attention's ``D_i - D_j``). Differentiable;
      they are computed in the accumulation dtype.

  Returns:
    ``(o, lse)``: ``o`` ``[B, Tq, H, V]`` and ``lse`` ``[B, Tq, H]``, both in the
    accumulation dtype (float32 for bfloat16 inputs). A query that sees no key
    gets ``o = 0`` and ``lse = MASK_VALUE``.
  """
  if (q_bias is None) != (k_bias is None):
    raise ValueError("q_bias and k_bias go together: pass both or neither, got "
                     f"q_bias={'None' if q_bias is None else 'an array'} and "
                     f"k_bias={'None' if k_bias is None else 'an array'}.")
  tq, tk = q.shape[1], k.shape[1]
  if q_bias is not None:
    acc = common.acc_dtype(q.dtype)
    common.check_shape("q_bias", q_bias, q.shape[:3], "[B, Tq, H]")
    common.check_shape("k_bias", k_bias, k.shape[:3], "[B, Tk, H]")
    q_bias = common.pad_axis(q_bias.astype(acc), mask.block_q)
    k_bias = common.pad_axis(k_bias.astype(acc), mask.block_k)
  q, q_pos = common.pad_axis(q, mask.block_q), common.pad_axis(q_pos, mask.block_q)
  q_seg = common.pad_axis(q_seg, mask.block_q, value=PAD_QUERY_SEG)
  k, v = common.pad_axis(k, mask.block_k), common.pad_axis(v, mask.block_k)
  k_pos = common.pad_axis(k_pos, mask.block_k)
  k_seg = common.pad_axis(k_seg, mask.block_k, value=PAD_KEY_SEG)
  o, lse = _flash_jit(mask, float(scale), q, k, v, q_pos.astype(jnp.int32),
                      k_pos.astype(jnp.int32), q_seg.astype(jnp.int32), k_seg.astype(jnp.int32),
                      q_bias, k_bias)
  return o[:, :tq], lse[:, :tq]


def dense_attention_stats(q: Array, k: Array, v: Array, visible: Array,
                          scale: float, bias: Array | None = None) -> tuple[Array, Array]:
  """One masked softmax over an explicit key set; differentiable by autodiff.

  Args:
    q: ``[..., Tq, H, K]``; k: ``[..., Tk, H, K]``; v: ``[..., Tk, H, V]``.
    visible: bool, broadcastable to ``[..., Tq, Tk]`` (shared by all heads).
    scale: logit scale.
    bias: optional logit bias broadcastable to ``[..., Tq, H, Tk]``, added after
      the scale (Forgetting Attention's ``D_i - D_j``).

  Returns:
    ``(o, lse)``: ``[..., Tq, H, V]`` and ``[..., Tq, H]`` in the accumulation
    dtype. A query that sees no key gets ``o = 0`` and ``lse = MASK_VALUE``.
  """
  acc = common.acc_dtype(q.dtype)
  # The scale goes on q, in float32, before the matmul: applied to the logits,
  # XLA may fold it into the max and the exp separately, and for logits near
  # 1e12 the two roundings differ by more than exp's range (inf or 0 = NaN).
  s = jnp.einsum("...qhd,...khd->...qhk", q.astype(acc) * scale, k, preferred_element_type=acc)
  if bias is not None:
    s = s + bias.astype(acc)
  ok = visible[..., :, None, :]
  s = jnp.where(ok, s, MASK_VALUE)
  # The max only stabilises exp; its gradient would cancel, so it is stopped.
  m = lax.stop_gradient(jnp.max(s, axis=-1))
  p = jnp.where(ok, jnp.exp(s - m[..., None]), 0.0)
  l = jnp.sum(p, axis=-1)
  seen = l > 0
  l = jnp.where(seen, l, 1.0)
  o = jnp.einsum("...qhk,...khd->...qhd", p / l[..., None], v.astype(acc))
  return o, jnp.where(seen, m + jnp.log(l), MASK_VALUE)


def merge_attention(o1: Array, lse1: Array, o2: Array, lse2: Array) -> tuple[Array, Array]:
  """Attention over the union of two disjoint key sets, from each set's result.

  Args:
    o1, o2: ``[..., H, V]`` outputs; lse1, lse2: ``[..., H]`` their log-sum-exps.

  Returns:
    ``(o, lse)`` of the same shapes.
  """
  lse = jnp.logaddexp(lse1, lse2)
  w1 = jnp.exp(lse1 - lse)[..., None]
  w2 = jnp.exp(lse2 - lse)[..., None]
  return w1 * o1 + w2 * o2, lse


def segment_or_zeros(segment_ids: Array | None, batch: int, seq: int) -> Array:
  """``[B, T]`` int32 monotone segment index (all zeros without ``segment_ids``)."""
  if segment_ids is None:
    return jnp.zeros((batch, seq), jnp.int32)
  return common.segment_index(segment_ids)


def positions(batch: int, seq: int) -> Array:
  """``[B, T]`` int32 positions ``0 .. T-1``."""
  return jnp.broadcast_to(jnp.arange(seq, dtype=jnp.int32), (batch, seq))


def self_attention_stats(q: Array, k: Array, v: Array, segment_ids: Array | None, *,
                         scale: float, block_size: int, causal: bool,
                         window: int | None = None,
                         log_forget: Array | None = None) -> tuple[Array, Array]:
  """:func:`flash_attention_stats` for self-attention (aligned blocks of ``block_size``).

  Shapes as in :func:`flash_attention_stats` with ``Tq = Tk = T``;
  ``block_size`` is capped at ``T``. ``log_forget`` ``[B, T, H]``: the
  cumulative log forget gates ``D`` (:func:`forget_cumsum`); pair ``(i, j)``
  gets ``D_i - D_j`` added to its logit.
  """
  b, t = q.shape[:2]
  pos = positions(b, t)
  seg = segment_or_zeros(segment_ids, b, t)
  bs = min(block_size, t)
  mask = BlockMask(bs, bs, causal=causal, window=window)
  return flash_attention_stats(q, k, v, pos, pos, seg, seg, mask=mask, scale=scale,
                               q_bias=log_forget, k_bias=log_forget)


# ---------------------------------------------------------------------------
# Public API.


@functools.partial(jax.jit, static_argnames=("scale", "causal"))
def _naive(q, k, v, segment_ids, scale, causal, log_forget=None):
  b, t = q.shape[:2]
  seg = segment_or_zeros(segment_ids, b, t)
  visible = seg[:, :, None] == seg[:, None, :]
  if causal:
    visible &= jnp.tril(jnp.ones((t, t), bool))
  # The forgetting bias D_i - D_j, laid out [B, Tq, H, Tk] like the logits.
  bias = None if log_forget is None else (
      log_forget[:, :, :, None] - jnp.swapaxes(log_forget, 1, 2)[:, None, :, :])
  o, _ = dense_attention_stats(q, k, v, visible, scale, bias)
  return o


def softmax_attention(
    q: Array,
    k: Array,
    v: Array,
    *,
    causal: bool = False,
    scale: float | None = None,
    segment_ids: Array | None = None,
    implementation: str | None = None,
    algorithm: str | None = None,
    block_size: int = 128,
    context: SeqContext | None = None,
) -> Array:
  """Exact softmax attention, ``o_i = sum_j softmax_j(scale * q_i . k_j) v_j``.

  Args:
    q: ``[B, T, H, K]`` queries.
    k: ``[B, T, H, K]`` keys.
    v: ``[B, T, H, V]`` values.
    causal: if True, query ``i`` sees keys ``j <= i`` only.
    scale: logit scale; ``None`` means ``K ** -0.5``.
    segment_ids: optional ``[B, T]`` ints packing several sequences per row; a
      query sees only keys of its own segment (a maximal run of equal ids).
    implementation: ``None | "xla" | "pallas"``. ``"pallas"`` is the
      FlashAttention-2 kernel (float32, bfloat16 or float16; interpret mode on
      CPU); ``None`` is XLA unless the kernel is verified on this backend
      (``engines.dispatch.PALLAS_DEFAULT_BACKENDS``, none yet). The former
      values ``"naive"``/``"blockwise"`` still work with a
      ``DeprecationWarning``: they mean ``algorithm=``.
    algorithm: the XLA path: ``"naive"`` (materialises ``[B, H, T, T]``
      float32 logits), ``"blockwise"`` (online softmax, ``O(T)`` memory,
      custom backward) or ``None``: naive for ``T <= NAIVE_MAX_LEN`` (256),
      blockwise above. Setting it implies XLA (with ``"pallas"`` it raises).
    block_size: query and key block length of the blockwise path (any ``T``
      works: padded inside; capped at ``T``). The Pallas kernel uses its own
      default block sizes.
    context: optional :class:`~linear_attention.ops.context.SeqContext`: the
      sequence split over its mesh axis, all-gather attention (module
      docstring); ``implementation`` must then be ``None`` or ``"xla"`` and
      ``algorithm=None`` picks by the full length ``T``.

  Returns:
    ``o`` of shape ``[B, T, H, V]`` in the dtype of ``q``. Softmax statistics
    and accumulation are float32 for bfloat16/float16/float32 inputs.

  Examples:
    >>> import jax
    >>> from linear_attention import ops
    >>> q, k, v = jax.random.normal(jax.random.PRNGKey(0), (3, 1, 10, 2, 4))
    >>> ops.softmax_attention(q, k, v, causal=True).shape
    (1, 10, 2, 4)
  """
  b, t, _, dk, _ = common.check_attention(q, k, v, segment_ids)
  implementation, algorithm = check_implementation(implementation, algorithm)
  common.check_positive_int("block_size", block_size)
  scale = common.resolve_scale(scale, dk)
  if context is not None:
    return _context_attention(q, k, v, segment_ids, None, context=context, causal=bool(causal),
                              scale=scale, implementation=implementation, algorithm=algorithm,
                              block_size=block_size)
  if algorithm is None and resolve_implementation(implementation, q, k, v) == "pallas":
    return pallas_attention(q, k, v, causal=bool(causal), scale=scale, segment_ids=segment_ids)
  if algorithm is None:
    algorithm = "naive" if t <= NAIVE_MAX_LEN else "blockwise"
  if algorithm == "naive":
    o = _naive(q, k, v, segment_ids, scale=float(scale), causal=bool(causal))
  else:
    o, _ = self_attention_stats(q, k, v, segment_ids, scale=scale, block_size=block_size,
                                causal=causal)
  return o.astype(q.dtype)


def _context_attention(q, k, v, segment_ids, log_fgate, *, context, causal, scale,
                       implementation, algorithm, block_size):
  """All-gather attention (module docstring); shapes as in :func:`softmax_attention`."""
  check_context(context)
  refuse_pallas(implementation)
  b, t = q.shape[:2]
  context.check(b, t)
  ax = context.axis_name

  def body(q, k, v, segment_ids=None, log_fgate=None):
    tl = q.shape[1]
    full = tl * context.size
    start = axis_index(ax) * tl
    gather = lambda x: lax.all_gather(x, ax, axis=1, tiled=True)
    k_all, v_all = gather(k), gather(v)
    k_pos = positions(q.shape[0], full)
    q_pos = start + positions(q.shape[0], tl)
    # Runs are counted on the whole row, so a reused id is still another segment.
    k_seg = segment_or_zeros(None if segment_ids is None else gather(segment_ids),
                             q.shape[0], full)
    q_seg = lax.dynamic_slice_in_dim(k_seg, start, tl, axis=1)
    d = d_all = None
    if log_fgate is not None:
      d = forget_cumsum(log_fgate)
      totals = lax.all_gather(d[:, -1], ax)  # [n, B, H]
      before = jnp.arange(context.size) < axis_index(ax)
      d = d + jnp.sum(jnp.where(before[:, None, None], totals, 0.0), axis=0)[:, None]
      d_all = gather(d)
    if (algorithm or ("naive" if full <= NAIVE_MAX_LEN else "blockwise")) == "naive":
      visible = q_seg[:, :, None] == k_seg[:, None, :]
      if causal:
        visible &= k_pos[:, None, :] <= q_pos[:, :, None]
      bias = None if d is None else d[:, :, :, None] - jnp.swapaxes(d_all, 1, 2)[:, None]
      o, _ = dense_attention_stats(q, k_all, v_all, visible, scale, bias)
    else:
      # Query and key blocks cover different positions: no whole block is skipped.
      mask = BlockMask(min(block_size, tl), min(block_size, full), causal=causal,
                       aligned=False)
      o, _ = flash_attention_stats(q, k_all, v_all, q_pos, k_pos, q_seg, k_seg, mask=mask,
                                   scale=scale, q_bias=d, k_bias=d_all)
    return o.astype(q.dtype)

  spec = context.seq_spec
  named = {"q": (q, spec), "k": (k, spec), "v": (v, spec), "segment_ids": (segment_ids, spec),
           "log_fgate": (log_fgate, spec)}
  return context.shard(body, named, spec)


def check_implementation(implementation: str | None,
                         algorithm: str | None = None) -> tuple[str | None, str | None]:
  """Checks ``implementation`` and ``algorithm``; returns them, the deprecated
  ``implementation="naive"|"blockwise"`` moved to ``algorithm``."""
  if implementation in ("naive", "blockwise"):
    warnings.warn(f"softmax_attention(implementation={implementation!r}) is deprecated: use "
                  f"algorithm={implementation!r} (implementation is None, 'xla' or 'pallas').",
                  DeprecationWarning, stacklevel=3)
    if algorithm not in (None, implementation):
      raise ValueError(f"algorithm must match implementation={implementation!r} (deprecated "
                       f"spelling of algorithm=), got {algorithm!r}.")
    implementation, algorithm = "xla", implementation
  common.check_choice("implementation", implementation, IMPLEMENTATIONS)
  common.check_choice("algorithm", algorithm, ALGORITHMS)
  if algorithm is not None and implementation == "pallas":
    raise ValueError(f"algorithm applies to the XLA paths only, got algorithm={algorithm!r} "
                     "with implementation='pallas'.")
  return implementation, algorithm


def resolve_implementation(implementation: str | None, q: Array, k: Array, v: Array) -> str:
  """``"pallas"`` or ``"xla"``: ``None`` is the kernel only where it supports the
  inputs on a backend where it has been verified (``PALLAS_DEFAULT_BACKENDS``)."""
  pallas = dispatch.resolve_implementation(
      implementation, {} if implementation == "pallas" else unsupported_arguments(q))
  return "pallas" if pallas else "xla"


def pallas_attention(q: Array, k: Array, v: Array, *, causal: bool, scale: float,
                     segment_ids: Array | None, window: int | None = None) -> Array:
  """The Pallas kernel behind ``implementation="pallas"``; shapes as in :func:`softmax_attention`.

  Native on GPU and TPU, interpret mode on CPU (exact, slow). Raises a
  ``ValueError`` naming the argument for an unsupported dtype.
  """
  unsupported = unsupported_arguments(q)
  if unsupported:
    name, why = next(iter(unsupported.items()))
    raise ValueError(f"implementation='pallas' does not support {name}: {why}.")
  return flash_attention(q, k, v, causal=causal, scale=scale, segment_ids=segment_ids,
                         window=window)


# ---------------------------------------------------------------------------
# Forgetting Attention (FoX).


def forget_cumsum(log_fgate: Array) -> Array:
  """``D [B, T, H]``: the cumulative sum over ``T`` of the log forget gates, float32.

  Gates below :func:`~linear_attention.common.log_zero` (``-inf``
  included, a hard reset) are floored there first: a difference ``D_i - D_j``
  across one is then at most ``-155``, whose ``exp`` is 0 in float32 next to
  any key within 50 logits of the row's largest, while ``-inf - -inf`` would
  be NaN. The floor's gradient below it is 0, as for an exact zero gate.

  Precision: ``D`` is one float32 running sum, so ``D_i - D_j`` carries an
  absolute error of about ``|D_i| * 6e-8`` (about ``1e-4`` in the logits at
  ``|D| = 2000``, e.g. 3000 tokens of gates near 1/2); far pairs, where ``|D|``
  is large, have weights near 0 anyway.
  """
  g = log_fgate.astype(common.acc_dtype(log_fgate.dtype))
  return jnp.cumsum(common.floor_log_decay(g), axis=1)
