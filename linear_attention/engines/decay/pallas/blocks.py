"""Chunk-decay kernel: tiling, static configuration and the per-chunk block logic.

Shared by the Triton (:mod:`.triton`) and Mosaic (:mod:`.mosaic_tpu`) entry
points: :func:`fwd_block`, :func:`state_block`, :func:`dq_block` and
:func:`dkv_block` compute one chunk from refs addressed at a row offset, so
the GPU kernels call them inside a loop over whole-sequence refs and the TPU
kernels once per grid step on one chunk's blocks.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from linear_attention.engines import dispatch
from linear_attention import common


# The platform tiling rules, shared with the delta and DPLR kernels.
pad_dim, value_block = dispatch.pad_dim, dispatch.value_block


@dataclasses.dataclass(frozen=True)
class ChunkDecayBlockSizes:
  """Tiling of the chunk kernel (and, on GPU, its Triton launch parameters).

  Attributes:
    chunk: tokens per chunk of the sweeps that carry the state (or its
      gradient) on chip: the forward and the ``dk, dv`` kernel. A power of two
      >= 16 on GPU, a multiple of 8 on TPU.
    sub_chunk: per-channel decays only: the query/key sub-chunk inside which
      pairs are computed elementwise; divides ``chunk`` (>= 16 on GPU).
    block_v: value columns per program (state ``[K, block_v]``).
    state_chunk: tokens between the states the backward stores to HBM (its
      states and ``dq`` kernels; a transient float32 ``[T / state_chunk, K,
      V]`` per head), ``None``: ``chunk``. Same constraints as ``chunk``;
      ``min(sub_chunk, state_chunk)`` divides it.
    num_warps, num_stages: GPU only, passed to the Triton compiler params
      (``None``: Triton's defaults).
    split_dkv: the backward's reverse sweep as two kernels, one for ``dk``
      and one for ``dv`` (each carries ``dS`` itself), instead of one for both.
  """
  chunk: int = 64
  sub_chunk: int = 16
  block_v: int = 64
  num_warps: int | None = None
  num_stages: int | None = None
  state_chunk: int | None = None
  split_dkv: bool = False

  def __post_init__(self):
    for name in ("chunk", "sub_chunk", "block_v"):
      common.check_positive_int(f"block_sizes.{name}", getattr(self, name))
    for name in ("num_warps", "num_stages", "state_chunk"):
      if getattr(self, name) is not None:
        common.check_positive_int(f"block_sizes.{name}", getattr(self, name))
    if self.chunk % self.sub_chunk:
      raise ValueError(f"block_sizes.sub_chunk must divide block_sizes.chunk ({self.chunk}), "
                       f"got {self.sub_chunk}.")
    sc = self.state_chunk
    if sc is not None and sc % min(self.sub_chunk, sc):
      raise ValueError(f"block_sizes.sub_chunk must divide block_sizes.state_chunk ({sc}) "
                       f"or exceed it, got {self.sub_chunk}.")

  @classmethod
  def default(cls, platform: str, dtype=None) -> "ChunkDecayBlockSizes":
    """The default tiling for ``platform`` and the inputs' ``dtype``.

    GPU: sweeps in chunks of 16, states stored every 32 steps, ``dk`` and
    ``dv`` in two sweeps, value blocks of 32 (16 for float32), 8 warps, 2
    pipeline stages, chosen from deviceless compiles for H200 and A100 at
    K = V = 128 (``experiments/compile_report.py``,
    ``tests/kernels/test_compile_gpu.py``). Triton's defaults (chunk 64,
    block_v 64, 4 warps, 3 stages) asked for 295936 B of shared memory in the
    forward (232448 available on H100/H200, 166912 on A100). One sweep for
    ``dk`` and ``dv`` needed 255 registers a thread and spilled (chunk 32:
    596-1212 B on H200, bf16; chunk 16: 24 B on A100 with per-channel decays,
    6392 B on H200 in float32); split, neither spills in bf16, for about 13%
    more backward FLOPs (the second sweep's ``dS`` dot). Float32 tiles take
    twice the registers: block_v 32 spilled up to 1320 B in the forward and
    1036 B in the ``dv`` sweep on H200, 16 about none. ``dq`` does not spill
    at 32, and the states it reads cost half the HBM of 16. 4 warps spill
    more than 8; 1 or 3 stages more than 2.
    """
    if platform == "gpu":
      f32 = dtype is not None and jnp.dtype(dtype) == jnp.float32
      return cls(chunk=16, sub_chunk=16, block_v=16 if f32 else 32, num_warps=8, num_stages=2,
                 state_chunk=32, split_dkv=True)
    return cls()

  def check(self, platform: str, interpret=False) -> None:
    """Raises unless the sizes suit ``platform``'s compiler (in any interpret mode too)."""
    del interpret
    for name in ("chunk", "sub_chunk", "state_chunk"):
      x = getattr(self, name)
      if x is None:
        continue
      if platform == "gpu" and (x < 16 or x & (x - 1)):
        raise ValueError(f"block_sizes.{name} must be a power of two >= 16 on GPU "
                         f"(Triton dot tiles), got {x}.")
      if platform != "gpu" and x % 8:
        raise ValueError(f"block_sizes.{name} must be a multiple of 8 on TPU, got {x}.")


@dataclasses.dataclass(frozen=True)
class KernelConfig:
  """Static configuration of one kernel call (hashable: a jit/custom_vjp constant)."""
  mode: str          # "none" | "scalar" | "vector"
  chunk: int
  sub: int
  block_v: int
  scale: float
  platform: str
  interpret: object  # False | True | pltpu.InterpretParams
  exact_dots: bool   # float32 inputs: full-precision dots
  state_chunk: int = 0  # the backward's states and dq kernels: their chunk
  num_warps: int | None = None
  num_stages: int | None = None
  split_dkv: bool = False
  grads: str = "dkv"  # the reverse sweep's outputs: "dkv" (both), "dk" or "dv"


# ----------------------------------------------------------- shared block logic


def _dot(a, b, dims, cfg: KernelConfig, dtype):
  """``a @ b`` (``"nn"``), ``a @ b.T`` (``"nt"``) or ``a.T @ b`` (``"tn"``), float32 out."""
  contract = {"nn": ((1,), (0,)), "nt": ((1,), (1,)), "tn": ((0,), (0,))}[dims]
  precision = lax.Precision.HIGHEST if cfg.exact_dots else None
  return lax.dot_general(a.astype(dtype), b.astype(dtype), (contract, ((), ())),
                         precision=precision, preferred_element_type=jnp.float32)


def _rows(ref, start, size):
  """Rows ``[start, start + size)`` of a 2-D ref as float32."""
  return ref[pl.ds(start, size), :].astype(jnp.float32)


def _lower_tri(n: int, m: int | None = None, offset: int = 0):
  """``[n, m]`` bool, True where ``row + offset >= col``."""
  m = n if m is None else m
  r = lax.broadcasted_iota(jnp.int32, (n, m), 0)
  c = lax.broadcasted_iota(jnp.int32, (n, m), 1)
  return r + offset >= c


def _row(r, name, start, i, value, cfg: KernelConfig, scale: float = 1.0):
  """Row ``i`` (``[1, W]`` float32) of the sub-chunk ``value``, which is the rows
  of ``r[name]`` from ``start`` times ``scale``. Triton loads it from the ref;
  Mosaic takes it out of the value with a masked sum, since a one-row load of a
  packed (16-bit) ref at an unaligned row is not supported there."""
  if cfg.platform == "gpu":
    return _rows(r[name], start + i, 1) * scale
  rows = lax.broadcasted_iota(jnp.int32, (value.shape[0], 1), 0)
  return jnp.sum(jnp.where(rows == i, value, 0.0), axis=0, keepdims=True)


def _pair_loop(r, start, gi, cfg: KernelConfig, body, carry):
  """Runs ``carry = body(i, pair, carry)`` over the query rows ``i`` of one sub-chunk.

  ``pair [s, K]`` holds the exact per-channel pairs of row ``i``:
  ``pair[j] = exp(g_i - g_j)`` for keys ``j <= i`` (0 above: both in the
  sub-chunk). Row by row, the live pair tensor is ``[s, K]``, not the
  ``[s, s, K]`` of all pairs at once (which spilled registers on GPU and
  which Mosaic could not lay out). On GPU the rows are a ``fori_loop``: unrolled,
  Triton interleaved them and spilled; on TPU they are unrolled (:func:`_row`
  takes a row out of a value with a static mask there).
  """
  keys = lax.broadcasted_iota(jnp.int32, (gi.shape[0], 1), 0)

  def step(i, carry):
    g_i = _row(r, "g", start, i, gi, cfg)
    return body(i, jnp.exp(jnp.where(keys <= i, g_i - gi, -jnp.inf)), carry)

  if cfg.platform == "gpu":
    return lax.fori_loop(0, gi.shape[0], step, carry)
  for i in range(gi.shape[0]):
    carry = step(i, carry)
  return carry


def _scalar_masks(gcol, grow, glast, chunk, mode):
  """Decay factors of a chunk with a scalar (or no) decay.

  Returns ``(m, eq, ek, a)``: ``m [C, C]`` the causal pairwise decay,
  ``eq [C, 1]`` from the chunk start to each query, ``ek [C, 1]`` from each
  key to the chunk end, ``a [1, 1]`` across the whole chunk.
  """
  tri = _lower_tri(chunk)
  if mode == "none":
    return tri.astype(jnp.float32), 1.0, 1.0, 1.0
  m = jnp.exp(jnp.where(tri, gcol - grow, -jnp.inf))
  return m, jnp.exp(gcol), jnp.exp(glast - gcol), jnp.exp(glast)


def fwd_block(r, base, grow, glcol, state, cfg: KernelConfig):
  """One chunk of the forward pass; stores ``o`` rows and returns the next state.

  ``r``: refs ``q, k, v`` (``[*, K]``/``[*, bv]``), ``g`` (in-chunk cumulative
  log decay, ``[*, K]`` or ``[*, 1]``) and ``o``, addressed from row ``base``.
  ``grow [1, C]``: the scalar decay as a row; ``glcol [K, 1]``: the vector
  decay at the chunk end as a column; ``state [K, bv]`` float32.
  """
  c, dt = cfg.chunk, r["q"].dtype
  k, v = _rows(r["k"], base, c), _rows(r["v"], base, c)
  if cfg.mode != "vector":
    q = _rows(r["q"], base, c) * cfg.scale
    gcol = _rows(r["g"], base, c) if cfg.mode == "scalar" else None
    glast = _rows(r["g"], base + c - 1, 1) if cfg.mode == "scalar" else None
    m, eq, ek, a = _scalar_masks(gcol, grow, glast, c, cfg.mode)
    scores = _dot(q, k, "nt", cfg, dt) * m
    o = _dot(q * eq, state, "nn", cfg, dt) + _dot(scores, v, "nn", cfg, dt)
    r["o"][pl.ds(base, c), :] = o.astype(r["o"].dtype)
    return a * state + _dot(k * ek, v, "tn", cfg, dt)

  s = cfg.sub
  g = _rows(r["g"], base, c)
  glast = _rows(r["g"], base + c - 1, 1)
  earlier = lax.broadcasted_iota(jnp.int32, (s, c), 1)
  rows = lax.broadcasted_iota(jnp.int32, (s, 1), 0)
  for i in range(c // s):
    lo = i * s
    qi = _rows(r["q"], base + lo, s) * cfg.scale
    ki, vi, gi = (_rows(r[n], base + lo, s) for n in ("k", "v", "g"))
    o = _dot(qi * jnp.exp(gi), state, "nn", cfg, dt)
    if i:
      # Earlier sub-chunks through the decay just before this one: both
      # factors are exp(<= 0); later keys get a clamped (finite) factor and
      # are masked out.
      gn = _rows(r["g"], base + lo - 1, 1)
      scores = _dot(qi * jnp.exp(gi - gn), k * jnp.exp(jnp.minimum(gn - g, 0.0)), "nt", cfg, dt)
      o += _dot(jnp.where(earlier < lo, scores, 0.0), v, "nn", cfg, dt)
    # Pairs inside the sub-chunk, exact per channel: o_i += sum_j diag_ij v_j.
    def pair_step(row, pair, o, lo=lo, qi=qi, ki=ki, vi=vi):
      q_row = _row(r, "q", base + lo, row, qi, cfg, cfg.scale)
      diag = jnp.sum(q_row * ki * pair, axis=1, keepdims=True)  # [s, 1]: keys j of query row
      return o + jnp.where(rows == row, jnp.sum(diag * vi, axis=0, keepdims=True), 0.0)
    o = _pair_loop(r, base + lo, gi, cfg, pair_step, o)
    r["o"][pl.ds(base + lo, s), :] = o.astype(r["o"].dtype)
  return jnp.exp(glcol) * state + _dot(k * jnp.exp(glast - g), v, "tn", cfg, dt)


def state_block(r, base, glcol, state, cfg: KernelConfig):
  """The state after one chunk, from the state before it (no output)."""
  c, dt = cfg.chunk, r["k"].dtype
  k, v = _rows(r["k"], base, c), _rows(r["v"], base, c)
  if cfg.mode == "none":
    return state + _dot(k, v, "tn", cfg, dt)
  g = _rows(r["g"], base, c)
  glast = _rows(r["g"], base + c - 1, 1)
  decay = jnp.exp(glcol if cfg.mode == "vector" else glast)
  return decay * state + _dot(k * jnp.exp(glast - g), v, "tn", cfg, dt)


def dq_block(r, base, grow, state, cfg: KernelConfig):
  """One chunk of ``dq`` (w.r.t. the scaled query, partial over this value block).

  Needs no sweep: a query sees the state entering its chunk (``state``
  ``[K, bv]``, recomputed by the forward sweep) and the keys before it in the
  chunk. ``r``: refs ``k, v, do, g`` and the output ``dq``, from row ``base``.
  """
  c, dt = cfg.chunk, r["k"].dtype
  k, v = _rows(r["k"], base, c), _rows(r["v"], base, c)
  if cfg.mode != "vector":
    do = _rows(r["do"], base, c)
    gcol = _rows(r["g"], base, c) if cfg.mode == "scalar" else None
    m, eq, _, _ = _scalar_masks(gcol, grow, 0.0, c, cfg.mode)  # the chunk end is not needed
    dq = _dot(_dot(do, v, "nt", cfg, dt) * m, k, "nn", cfg, dt) + eq * _dot(do, state, "nt", cfg, dt)
    r["dq"][pl.ds(base, c), :] = dq.astype(r["dq"].dtype)
    return

  s = cfg.sub
  g = _rows(r["g"], base, c)
  rows = lax.broadcasted_iota(jnp.int32, (s, 1), 0)
  earlier = lax.broadcasted_iota(jnp.int32, (s, c), 1)
  for i in range(c // s):
    lo = i * s
    ki, vi, doi, gi = (_rows(r[n], base + lo, s) for n in ("k", "v", "do", "g"))
    dq = jnp.exp(gi) * _dot(doi, state, "nt", cfg, dt)
    if i:  # earlier sub-chunks through the decay just before this one (as in fwd_block)
      gn = _rows(r["g"], base + lo - 1, 1)
      dscores = jnp.where(earlier < lo, _dot(doi, v, "nt", cfg, dt), 0.0)
      dq += jnp.exp(gi - gn) * _dot(dscores, k * jnp.exp(jnp.minimum(gn - g, 0.0)), "nn", cfg, dt)
    # Pairs inside the sub-chunk, exact per channel: dq_i = sum_j (do_i . v_j) k_j pair_ij.
    def pair_step(row, pair, dq, lo=lo, doi=doi, ki=ki, vi=vi):
      do_row = _row(r, "do", base + lo, row, doi, cfg)
      ddiag = jnp.sum(do_row * vi, axis=1, keepdims=True)  # [s, 1] over keys j
      return dq + jnp.where(rows == row, jnp.sum(ddiag * ki * pair, axis=0, keepdims=True), 0.0)
    dq = _pair_loop(r, base + lo, gi, cfg, pair_step, dq)
    r["dq"][pl.ds(base + lo, s), :] = dq.astype(r["dq"].dtype)


def dkv_block(r, base, grow, glcol, dstate, cfg: KernelConfig):
  """One chunk of ``dk`` (partial over this value block) and ``dv`` (those
  of ``cfg.grads``); returns ``dS`` for the state entering the chunk.

  ``dstate [K, bv]``: the gradient of the state leaving the chunk. Needs no
  state: a key reaches later queries of its chunk and the leaving state.
  ``r``: refs ``q, do, g``, ``v`` for ``dk``, ``k`` for ``dv``, and the outputs,
  from row ``base``.
  """
  c, dt = cfg.chunk, r["q"].dtype
  want = ("dk", "dv") if cfg.grads == "dkv" else (cfg.grads,)
  q = _rows(r["q"], base, c) * cfg.scale
  do = _rows(r["do"], base, c)

  def store(name, start, x):
    r[name][pl.ds(start, x.shape[0]), :] = x.astype(r[name].dtype)

  if cfg.mode != "vector":
    gcol = _rows(r["g"], base, c) if cfg.mode == "scalar" else None
    glast = _rows(r["g"], base + c - 1, 1) if cfg.mode == "scalar" else None
    m, eq, ek, a = _scalar_masks(gcol, grow, glast, c, cfg.mode)

    def dk():
      v = _rows(r["v"], base, c)
      return _dot(_dot(do, v, "nt", cfg, dt) * m, q, "tn", cfg, dt) + ek * _dot(v, dstate, "nt", cfg, dt)

    def dv():
      k = _rows(r["k"], base, c)
      return _dot(_dot(q, k, "nt", cfg, dt) * m, do, "tn", cfg, dt) + _dot(k * ek, dstate, "nn", cfg, dt)

    # The order changes the registers ptxas needs: dv first spilled least in
    # bfloat16 (A100, scalar decay: 0 B, 248 B the other way), dk first in
    # float32 (H200: 380 B, 3672 B the other way).
    for name in ("dk", "dv") if cfg.exact_dots else ("dv", "dk"):
      if name in want:
        store(name, base, {"dk": dk, "dv": dv}[name]())
    return a * dstate + _dot(q * eq, do, "tn", cfg, dt)

  s, n = cfg.sub, cfg.chunk // cfg.sub
  g = _rows(r["g"], base, c)
  glast = _rows(r["g"], base + c - 1, 1)
  later = lax.broadcasted_iota(jnp.int32, (c, s), 0)
  entering = lambda: jnp.exp(glcol) * dstate + _dot(q * jnp.exp(g), do, "tn", cfg, dt)
  # bfloat16: dS entering the chunk first, so that the chunk's q and g die early
  # (A100 spilled 24 B instead of 256 B); float32: last (H200: 68 B instead of 740 B).
  dstate_in = None if cfg.exact_dots else entering()
  for i in range(n):
    lo = i * s
    qi = _rows(r["q"], base + lo, s) * cfg.scale
    doi, gi = _rows(r["do"], base + lo, s), _rows(r["g"], base + lo, s)
    ki = _rows(r["k"], base + lo, s) if "dv" in want else None
    vi = _rows(r["v"], base + lo, s) if "dk" in want else None
    # Through the leaving state.
    ek = jnp.exp(glast - gi)
    acc = {}
    if "dk" in want:
      acc["dk"] = ek * _dot(vi, dstate, "nt", cfg, dt)
    if "dv" in want:
      acc["dv"] = _dot(ki * ek, dstate, "nn", cfg, dt)
    if i < n - 1:  # this key sub-chunk against later queries (reference: its end)
      gm = _rows(r["g"], base + lo + s - 1, 1)
      q_ref = q * jnp.exp(jnp.minimum(g - gm, 0.0))
      if "dv" in want:
        scores = jnp.where(later >= lo + s, _dot(q_ref, ki * jnp.exp(gm - gi), "nt", cfg, dt), 0.0)
        acc["dv"] += _dot(scores, do, "tn", cfg, dt)
      if "dk" in want:
        dscores = jnp.where(later >= lo + s, _dot(do, vi, "nt", cfg, dt), 0.0)
        acc["dk"] += jnp.exp(gm - gi) * _dot(dscores, q_ref, "tn", cfg, dt)
    # Pairs inside the sub-chunk, exact per channel, one query row at a time.
    def pair_step(row, pair, acc, lo=lo, qi=qi, doi=doi, ki=ki, vi=vi):
      qp = _row(r, "q", base + lo, row, qi, cfg, cfg.scale) * pair
      do_row = _row(r, "do", base + lo, row, doi, cfg)
      acc = dict(acc)
      if "dk" in acc:
        acc["dk"] += jnp.sum(do_row * vi, axis=1, keepdims=True) * qp  # [s, 1] over keys j
      if "dv" in acc:
        acc["dv"] += jnp.sum(qp * ki, axis=1, keepdims=True) * do_row
      return acc
    acc = _pair_loop(r, base + lo, gi, cfg, pair_step, acc)
    for name, x in acc.items():
      store(name, base + lo, x)
  return entering() if dstate_in is None else dstate_in
