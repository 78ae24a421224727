"""Flash attention kernels: tiling, static configuration and the block logic
shared by the Triton (:mod:`.triton`) and Mosaic (:mod:`.mosaic_tpu`) entry
points (pure functions of values: visibility masks, the online-softmax step,
the recomputed probabilities of the backward pass and the block ranges)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax.numpy as jnp
from jax import lax

from linear_attention.engines import dispatch

# Same finite mask logit as engines/softmax/engine.py: max/exp never see inf - inf.
MASK_VALUE = -1e30
# Segment ids of padding: padded keys match no query, padded queries no key.
PAD_KEY_SEG = -1
PAD_QUERY_SEG = -2
LOG2E = math.log2(math.e)
LN2 = math.log(2.0)
# Smallest block per platform: Triton's dot needs 16; TPU tiles are (8, 128)
# (a key block is the lane dimension of the logits, so it needs 128 natively).
MIN_BLOCK = {"gpu": (16, 16), "tpu": (8, 128)}  # (query-side, key-side)
MIN_BLOCK_TPU_INTERPRET = (8, 8)


@dataclasses.dataclass(frozen=True)
class FlashBlockSizes:
  """Tile sizes of the three kernels (powers of two; capped at the padded ``T``).

  Attributes:
    block_q, block_k: query / key block of the forward kernel.
    block_q_dkv, block_k_dkv: of the ``dk, dv`` kernel (one program per key block).
    block_q_dq, block_k_dq: of the ``dq`` kernel (one program per query block).
    num_warps, num_stages: GPU only, passed to ``pallas.triton.CompilerParams``
      (``None``: Triton's defaults).
  """

  block_q: int = 128
  block_k: int = 64
  block_q_dkv: int = 64
  block_k_dkv: int = 64
  block_q_dq: int = 64
  block_k_dq: int = 64
  num_warps: int | None = None
  num_stages: int | None = None

  @classmethod
  def default(cls, platform: str, dtype=None, head_dim: int | None = None,
              value_dim: int | None = None) -> "FlashBlockSizes":
    """The default tiles for ``platform``, the inputs' ``dtype`` and the q/k and v head
    sizes (``None``: 128): ``engines.dispatch.flash_tiles``, whose table says why.

    On GPU the blocks shrink as the head grows so that Triton's shared memory fits an
    A100 and an H200, forward and backward (a head of 256 in bfloat16: query blocks of
    64, key blocks of 32); on TPU they are 128 for every head.

    Example::

        >>> FlashBlockSizes.default("gpu", jnp.bfloat16, 256).block_k
        32
    """
    return cls(**dispatch.flash_tiles(platform, dtype, head_dim, value_dim))

  def query_side(self) -> tuple[str, ...]:
    return ("block_q", "block_q_dkv", "block_q_dq")

  def key_side(self) -> tuple[str, ...]:
    return ("block_k", "block_k_dkv", "block_k_dq")

  def check(self, platform: str, interpret=False) -> None:
    """Raises unless every block is a power of two at least the platform's minimum
    (TPU interpret mode accepts blocks of 8)."""
    native = interpret is False
    mins = MIN_BLOCK_TPU_INTERPRET if platform == "tpu" and not native else MIN_BLOCK[platform]
    for names, least in ((self.query_side(), mins[0]), (self.key_side(), mins[1])):
      for name in names:
        size = getattr(self, name)
        if isinstance(size, bool) or not isinstance(size, int) or size < least or size & (size - 1):
          raise ValueError(
              f"block_sizes.{name} must be a power of two >= {least} on platform={platform!r}, "
              f"got {size!r}.")

  def capped(self, platform: str, interpret, t: int) -> "FlashBlockSizes":
    """Each block capped at ``T`` rounded up to a power of two (never below the minimum)."""
    native = interpret is False
    mins = MIN_BLOCK_TPU_INTERPRET if platform == "tpu" and not native else MIN_BLOCK[platform]
    n = 1 << max(0, (t - 1).bit_length())
    capped = {name: min(getattr(self, name), max(least, n))
              for names, least in ((self.query_side(), mins[0]), (self.key_side(), mins[1]))
              for name in names}
    return dataclasses.replace(self, **capped)


@dataclasses.dataclass(frozen=True)
class KernelConfig:
  """Everything static about one call (hashable: the custom_vjp's nondiff arg)."""

  platform: str
  causal: bool
  window: int | None
  scale: float
  seq_len: int  # true T
  padded_len: int  # T rounded up to every block size
  groups: int  # H // H_kv
  segments: bool
  blocks: FlashBlockSizes
  interpret: Any

  @property
  def padded(self) -> bool:
    return self.padded_len != self.seq_len


# ---------------------------------------------------------------------------
# Shared block logic (pure functions of values; used inside both kernels).


def div(a, b: int):
  """Integer division of a non-negative traced (or Python) int by a static int."""
  if isinstance(a, int):
    return a // b
  return lax.div(a, jnp.int32(b))


def clip(x, lo, hi):
  return jnp.minimum(jnp.maximum(x, lo), hi)


def key_blocks(cfg: KernelConfig, i, bq: int, bk: int, nk: int):
  """Key blocks of query block ``i``: ``(lo, full_lo, full_hi, hi)``.

  ``[lo, hi)`` holds every key block with a visible pair; inside it,
  ``[full_lo, full_hi)`` are blocks whose pairs are all visible (no mask
  needed). With segments every visited block is masked.
  """
  q0 = i * bq
  q1 = q0 + (bq - 1)
  w = cfg.window
  lo = 0 if w is None else div(jnp.maximum(q0 - w + 1, 0), bk)
  if cfg.causal:
    hi = jnp.minimum(div(q1, bk) + 1, nk)
  elif w is not None:
    hi = jnp.minimum(div(q1 + w - 1, bk) + 1, nk)
  else:
    hi = nk
  if cfg.segments:
    return lo, hi, hi, hi
  full_lo = lo if w is None else div(jnp.maximum(q1 - w + bk, 0), bk)
  if cfg.causal:
    full_hi = div(q0 + 1, bk)
  elif w is not None:
    full_hi = div(q0 + w, bk)
  else:
    full_hi = nk
  if cfg.padded and not cfg.causal:
    # The last key blocks hold padding (causal masks it: it lies after every real query).
    full_hi = jnp.minimum(full_hi, cfg.seq_len // bk)
  full_lo = clip(full_lo, lo, hi)
  full_hi = clip(full_hi, full_lo, hi)
  return lo, full_lo, full_hi, hi


def query_blocks(cfg: KernelConfig, j, bq: int, bk: int, nq: int):
  """Query blocks that see key block ``j``: ``(lo, full_lo, full_hi, hi)`` as in ``key_blocks``.

  Padding needs no mask here: a padded key's ``dk, dv`` rows are sliced off,
  and a padded query's ``ds`` row is zero (its ``do`` and ``delta`` are zero).
  """
  k0 = j * bk
  k1 = k0 + (bk - 1)
  w = cfg.window
  if cfg.causal:
    lo = div(k0, bq)
  elif w is not None:
    lo = div(jnp.maximum(k0 - w + 1, 0), bq)
  else:
    lo = 0
  hi = nq if w is None else jnp.minimum(div(k1 + w - 1, bq) + 1, nq)
  if cfg.segments:
    return lo, hi, hi, hi
  if cfg.causal:
    full_lo = div(k1 + bq - 1, bq)
  elif w is not None:
    full_lo = div(jnp.maximum(k1 - w + bq, 0), bq)
  else:
    full_lo = lo
  full_hi = nq if w is None else div(k0 + w, bq)
  full_lo = clip(full_lo, lo, hi)
  full_hi = clip(full_hi, full_lo, hi)
  return lo, full_lo, full_hi, hi


def visible(cfg: KernelConfig, q_pos, k_pos, q_seg, k_seg):
  """Bool mask broadcast from ``q_pos [bq, 1|bk]`` and ``k_pos [1|bq, bk]``."""
  ok = None

  def conj(a, b):
    return b if a is None else a & b

  d = q_pos - k_pos
  if cfg.causal:
    ok = conj(ok, d >= 0)
  if cfg.window is not None:
    ok = conj(ok, d < cfg.window)
    if not cfg.causal:
      ok = conj(ok, d > -cfg.window)
  if cfg.padded and not cfg.causal:
    ok = conj(ok, k_pos < cfg.seq_len)
  if q_seg is not None:
    ok = conj(ok, q_seg == k_seg)
  if ok is None:  # plain non-causal attention: masked blocks only hold padding
    ok = k_pos < cfg.seq_len
  return jnp.broadcast_to(ok, jnp.broadcast_shapes(q_pos.shape, k_pos.shape))


def dot_nt(a, b):
  """``a [m, d] @ b[n, d].T`` accumulated in float32."""
  return lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def dot_tn(a, b):
  """``a[m, n].T @ b[m, d]`` accumulated in float32."""
  return lax.dot(a.T, b, preferred_element_type=jnp.float32)


def dot(a, b):
  return lax.dot(a, b, preferred_element_type=jnp.float32)


def softmax_step(q, k, v, carry, ok, qk_scale: float):
  """One key block of the online softmax; ``carry = (m [bq,1], l [bq,1], acc [bq,V])``."""
  m, l, acc = carry
  s = dot_nt(q, k) * qk_scale  # base-2 logits
  if ok is not None:
    s = jnp.where(ok, s, MASK_VALUE)
  m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
  p = jnp.exp2(s - m_new)
  if ok is not None:
    # A row with nothing visible yet has m_new == MASK_VALUE, where exp2(0) = 1.
    p = jnp.where(ok, p, 0.0)
  corr = jnp.exp2(m - m_new)
  l = l * corr + jnp.sum(p, axis=1, keepdims=True)
  acc = acc * corr + dot(p.astype(v.dtype), v)
  return m_new, l, acc


def init_carry(bq: int, dv: int):
  return (jnp.full((bq, 1), MASK_VALUE, jnp.float32), jnp.zeros((bq, 1), jnp.float32),
          jnp.zeros((bq, dv), jnp.float32))


def finalize(m, l, acc):
  """``o [bq, V]`` float32 and the natural-log ``lse [bq, 1]`` (MASK_VALUE if nothing seen)."""
  seen = l > 0
  l_safe = jnp.where(seen, l, 1.0)
  o = acc * (1.0 / l_safe)
  lse = jnp.where(seen, (m + jnp.log2(l_safe)) * LN2, MASK_VALUE)
  return o, lse


def bwd_probs(q, k, lse2, ok, qk_scale: float):
  """Probabilities ``[bq, bk]`` recomputed from the base-2 log-sum-exp ``lse2 [bq, 1]``."""
  p = jnp.exp2(dot_nt(q, k) * qk_scale - lse2)
  return p if ok is None else jnp.where(ok, p, 0.0)


def bwd_dscores(p, do, v, delta):
  """Gradient of the (scaled) logits: ``p * (do . v - delta)``."""
  return p * (dot_nt(do, v) - delta)
