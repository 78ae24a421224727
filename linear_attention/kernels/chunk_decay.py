"""Pallas kernel: chunked diagonal-decay linear attention (GPU and TPU).

The kernel twin of :func:`linear_attention.ops.decay.decay_linear_attention`
(``form="chunk"``)::

    S_t = exp(log_decay_t) * S_{t-1} + k_t v_t^T        o_t = scale * S_t^T q_t

with ``log_decay`` absent, ``[B, T, H]`` (scalar per head) or ``[B, T, H, K]``
(per key channel). One kernel program owns one ``(batch, head, value block)``
and walks the chunks in order, keeping the float32 state ``[K, block_v]`` on
chip: the per-chunk states never go to HBM in the forward pass.

Two thin entry points share the per-chunk block logic (``_fwd_block``,
``_state_block``, ``_bwd_block``):

* GPU (``pallas_call`` lowered through Triton): grid ``(B, H, V / block_v)``;
  each program sees whole sequences and loops over chunks with ``fori_loop``,
  the state in registers. Triton wants power-of-two blocks and dots of at
  least 16 rows, so ``K`` and ``V`` are zero-padded to powers of two >= 16.
* TPU (``pallas_call`` with Mosaic): grid ``(B, H, V / block_v, chunks)``, the
  chunk axis sequential ("arbitrary") and the state in a VMEM scratch that
  persists across it, so Pallas pipelines each chunk's HBM->VMEM copies.
  Blocks are ``(chunk, K)``/``(chunk, block_v)``: chunk a multiple of 8,
  ``block_v`` a multiple of 128 or all of ``V``, the (8, 128) tiling.

The backward pass (``jax.custom_vjp``) recomputes the state entering each chunk
with a forward sweep (a transient ``[chunks, K, V]`` buffer per head, freed
after the backward), then sweeps the chunks in reverse carrying ``dS``, the
gradient of the state, on chip. Gradients summed over ``V`` (``dq``, ``dk``,
the log decay's) come out per value block and are added up outside.

Numerics: ``log_decay`` is cumulated inside each chunk (outside the kernel);
every ``exp`` in the kernel is of a non-positive number. Scalar decays use the
exact pairwise differences of the ``C x C`` chunk. Per-channel decays cut the
chunk into sub-chunks: a query sub-chunk reaches earlier keys through the
cumulative decay just before it (both factors ``<= 1``), and pairs inside one
sub-chunk use exact pairwise differences. Log decays down to -20 per step (and
lower) underflow to exact zeros instead of overflowing.

Dot operands are in the input dtype (bfloat16 runs on the tensor cores) with
float32 accumulation; the state is float32 but is rounded to the input dtype
where it meets a query in a dot. Float32 inputs use full float32 dots.

``segment_ids`` are not supported by the kernel: the ops layer falls back to
XLA for them (or raises for ``implementation="pallas"``).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from linear_attention.ops import common

Array = jax.Array

IMPLEMENTATIONS = (None, "xla", "pallas")
PLATFORMS = ("gpu", "tpu")
# Backends on which implementation=None picks a Pallas kernel. A backend joins
# only after experiments/gpu_check.py (or a TPU twin) has compiled, checked and
# timed the kernels on real hardware there; none has yet, so None means XLA
# everywhere and "pallas" must be asked for.
PALLAS_DEFAULT_BACKENDS: tuple[str, ...] = ()
SUPPORTED_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)


def resolve_implementation(implementation: str | None, unsupported: dict[str, str]) -> bool:
  """Decides between the Pallas kernel (True) and XLA (False).

  Args:
    implementation: ``None`` (the kernel on GPU/TPU where it supports the
      arguments, XLA otherwise and always on CPU), ``"xla"`` or ``"pallas"``
      (the kernel everywhere; on CPU it runs in interpret mode, slowly but
      exactly, so tests and users can run it anywhere).
    unsupported: ``{argument name: why}`` for each argument the kernel cannot
      take in this call; empty when it supports them all.

  Raises:
    ValueError: an unknown ``implementation``, or ``"pallas"`` with an
      unsupported argument (the message names it).
  """
  common.check_choice("implementation", implementation, IMPLEMENTATIONS)
  if implementation == "xla":
    return False
  if implementation == "pallas":
    if unsupported:
      name, why = next(iter(unsupported.items()))
      raise ValueError(f"implementation='pallas' does not support {name}: {why}. "
                       "Use implementation='xla' (or None to choose automatically).")
    return True
  return not unsupported and jax.default_backend() in PALLAS_DEFAULT_BACKENDS


def default_platform() -> str:
  """``"tpu"`` on TPU, else ``"gpu"`` (the GPU kernel, interpreted on CPU)."""
  return "tpu" if jax.default_backend() == "tpu" else "gpu"


def default_interpret(platform: str):
  """Interpret mode unless the kernel's platform is the current backend."""
  if jax.default_backend() == platform:
    return False
  return pltpu.InterpretParams() if platform == "tpu" else True


def _next_pow2(n: int) -> int:
  return 1 << max(n - 1, 0).bit_length()


def _round_up(n: int, m: int) -> int:
  return -(-n // m) * m


def pad_dim(n: int, platform: str) -> int:
  """A feature width padded for the platform: a power of two >= 16 for Triton,
  a multiple of 8 on TPU (the sublane tile of state rows)."""
  return max(16, _next_pow2(n)) if platform == "gpu" else _round_up(n, 8)


def value_block(vp: int, block_v: int, platform: str) -> int:
  """The value block: ``block_v`` clipped to the padded ``V``; on TPU a multiple
  of 128 that divides ``V``, else all of ``V``."""
  if platform == "gpu":
    return min(_next_pow2(block_v), vp)
  bv = (min(block_v, vp) // 128) * 128
  return bv if bv and vp % bv == 0 else vp


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Tiling of the chunk kernel.

  Attributes:
    chunk: tokens per chunk (the state is carried across chunks). A power of
      two >= 16 on GPU, a multiple of 8 on TPU.
    sub_chunk: per-channel decays only: the query/key sub-chunk inside which
      pairs are computed elementwise; divides ``chunk`` (>= 16 on GPU).
    block_v: value columns per program (state ``[K, block_v]``).
  """
  chunk: int = 64
  sub_chunk: int = 16
  block_v: int = 64

  def __post_init__(self):
    for name in ("chunk", "sub_chunk", "block_v"):
      common.check_positive_int(f"block_sizes.{name}", getattr(self, name))
    if self.chunk % self.sub_chunk:
      raise ValueError(f"block_sizes.sub_chunk must divide block_sizes.chunk ({self.chunk}), "
                       f"got {self.sub_chunk}.")

  def check(self, platform: str) -> None:
    """Raises unless the sizes suit ``platform``'s compiler."""
    if platform == "gpu":
      for name in ("chunk", "sub_chunk"):
        x = getattr(self, name)
        if x < 16 or x & (x - 1):
          raise ValueError(f"block_sizes.{name} must be a power of two >= 16 on GPU "
                           f"(Triton dot tiles), got {x}.")
    elif self.chunk % 8 or self.sub_chunk % 8:
      raise ValueError(f"block_sizes.chunk and sub_chunk must be multiples of 8 on TPU, got "
                       f"{self.chunk} and {self.sub_chunk}.")


@dataclasses.dataclass(frozen=True)
class _Config:
  """Static configuration of one kernel call (hashable: a jit/custom_vjp constant)."""
  mode: str          # "none" | "scalar" | "vector"
  chunk: int
  sub: int
  block_v: int
  scale: float
  platform: str
  interpret: object  # False | True | pltpu.InterpretParams
  exact_dots: bool   # float32 inputs: full-precision dots


# ----------------------------------------------------------- shared block logic


def _dot(a, b, dims, cfg: _Config, dtype):
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


def _pair_decay(g, tri):
  """``exp(g_i - g_j)`` per channel for ``j <= i`` (0 above): ``[s, s, K]``."""
  diff = g[:, None, :] - g[None, :, :]
  return jnp.exp(jnp.where(tri[:, :, None], diff, -jnp.inf))


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


def _fwd_block(r, base, grow, glcol, state, cfg: _Config):
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
  tri = _lower_tri(s)
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
    diag = jnp.sum(qi[:, None, :] * ki[None, :, :] * _pair_decay(gi, tri), axis=-1)
    o += _dot(diag, vi, "nn", cfg, dt)
    r["o"][pl.ds(base + lo, s), :] = o.astype(r["o"].dtype)
  return jnp.exp(glcol) * state + _dot(k * jnp.exp(glast - g), v, "tn", cfg, dt)


def _state_block(r, base, glcol, state, cfg: _Config):
  """The state after one chunk, from the state before it (no output)."""
  c, dt = cfg.chunk, r["k"].dtype
  k, v = _rows(r["k"], base, c), _rows(r["v"], base, c)
  if cfg.mode == "none":
    return state + _dot(k, v, "tn", cfg, dt)
  g = _rows(r["g"], base, c)
  glast = _rows(r["g"], base + c - 1, 1)
  decay = jnp.exp(glcol if cfg.mode == "vector" else glast)
  return decay * state + _dot(k * jnp.exp(glast - g), v, "tn", cfg, dt)


def _bwd_block(r, base, grow, glcol, state, dstate, cfg: _Config):
  """One chunk of the backward pass; stores its gradients and returns ``dS``
  for the state entering the chunk.

  ``state``: the state entering the chunk; ``dstate``: the gradient of the
  state leaving it. Stores rows of ``dq``, ``dk`` (w.r.t. the scaled query and
  the key, partial over this value block), ``dv`` and ``dg`` (w.r.t. the
  in-chunk cumulative log decay, partial), and for vector decays ``dgl``
  (``[K, 1]``: the chunk-end decay's share through the state).
  """
  c, dt = cfg.chunk, r["q"].dtype
  q = _rows(r["q"], base, c) * cfg.scale
  k, v, do = (_rows(r[n], base, c) for n in ("k", "v", "do"))

  def store(name, start, x):
    r[name][pl.ds(start, x.shape[0]), :] = x.astype(r[name].dtype)

  if cfg.mode != "vector":
    gcol = _rows(r["g"], base, c) if cfg.mode == "scalar" else None
    glast = _rows(r["g"], base + c - 1, 1) if cfg.mode == "scalar" else None
    m, eq, ek, a = _scalar_masks(gcol, grow, glast, c, cfg.mode)
    scores = _dot(q, k, "nt", cfg, dt) * m
    dscores = _dot(do, v, "nt", cfg, dt) * m
    dk_state = _dot(v, dstate, "nt", cfg, dt)
    dq = _dot(dscores, k, "nn", cfg, dt) + eq * _dot(do, state, "nt", cfg, dt)
    dk = _dot(dscores, q, "tn", cfg, dt) + ek * dk_state
    dv = _dot(scores, do, "tn", cfg, dt) + _dot(k * ek, dstate, "nn", cfg, dt)
    store("dq", base, dq)
    store("dk", base, dk)
    store("dv", base, dv)
    if cfg.mode == "scalar":
      total = lambda x: jnp.sum(jnp.sum(x, axis=1, keepdims=True), axis=0, keepdims=True)
      # The chunk-end decay reaches the keys' way to the end and the old state.
      dlast = total(k * ek * dk_state) + a * total(dstate * state)
      dg = jnp.sum(q * dq - k * dk, axis=1, keepdims=True)
      last_row = lax.broadcasted_iota(jnp.int32, (c, 1), 0) == c - 1
      store("dg", base, dg + jnp.where(last_row, dlast, 0.0))
    return a * dstate + _dot(q * eq, do, "tn", cfg, dt)

  s, n = cfg.sub, cfg.chunk // cfg.sub
  g = _rows(r["g"], base, c)
  glast = _rows(r["g"], base + c - 1, 1)
  tri = _lower_tri(s)
  earlier = lax.broadcasted_iota(jnp.int32, (s, c), 1)
  later = lax.broadcasted_iota(jnp.int32, (c, s), 0)
  dlast = jnp.zeros((1, g.shape[1]), jnp.float32)
  for i in range(n):
    lo = i * s
    qi = _rows(r["q"], base + lo, s) * cfg.scale
    ki, vi, doi, gi = (_rows(r[nm], base + lo, s) for nm in ("k", "v", "do", "g"))
    # Through the states: query reads the entering one, key feeds the leaving one.
    ek = jnp.exp(glast - gi)
    dk_state = _dot(vi, dstate, "nt", cfg, dt)
    dq = jnp.exp(gi) * _dot(doi, state, "nt", cfg, dt)
    dk = ek * dk_state
    dv = _dot(ki * ek, dstate, "nn", cfg, dt)
    dlast += jnp.sum(ki * dk, axis=0, keepdims=True)
    if i:  # this query sub-chunk against earlier keys (reference: just before it)
      gn = _rows(r["g"], base + lo - 1, 1)
      dscores = jnp.where(earlier < lo, _dot(doi, v, "nt", cfg, dt), 0.0)
      dq += jnp.exp(gi - gn) * _dot(dscores, k * jnp.exp(jnp.minimum(gn - g, 0.0)), "nn", cfg, dt)
    if i < n - 1:  # this key sub-chunk against later queries (reference: its end)
      gm = _rows(r["g"], base + lo + s - 1, 1)
      q_ref = q * jnp.exp(jnp.minimum(g - gm, 0.0))
      ki_ref = ki * jnp.exp(gm - gi)
      scores = jnp.where(later >= lo + s, _dot(q_ref, ki_ref, "nt", cfg, dt), 0.0)
      dscores = jnp.where(later >= lo + s, _dot(do, vi, "nt", cfg, dt), 0.0)
      dv += _dot(scores, do, "tn", cfg, dt)
      dk += jnp.exp(gm - gi) * _dot(dscores, q_ref, "tn", cfg, dt)
    # Pairs inside the sub-chunk, exact per channel.
    pair = _pair_decay(gi, tri)
    diag = jnp.sum(qi[:, None, :] * ki[None, :, :] * pair, axis=-1)
    ddiag = jnp.where(tri, _dot(doi, vi, "nt", cfg, dt), 0.0)
    dv += _dot(diag, doi, "tn", cfg, dt)
    dq += jnp.sum(ddiag[:, :, None] * ki[None, :, :] * pair, axis=1)
    dk += jnp.sum(ddiag[:, :, None] * qi[:, None, :] * pair, axis=0)
    dg = qi * dq - ki * dk
    if i == n - 1:
      last_row = lax.broadcasted_iota(jnp.int32, (s, 1), 0) == s - 1
      dg += jnp.where(last_row, dlast, 0.0)
    store("dq", base + lo, dq)
    store("dk", base + lo, dk)
    store("dv", base + lo, dv)
    store("dg", base + lo, dg)
  decay = jnp.exp(glcol)
  r["dgl"][...] = (jnp.sum(dstate * state, axis=1, keepdims=True) * decay).astype(r["dgl"].dtype)
  return decay * dstate + _dot(q * jnp.exp(g), do, "tn", cfg, dt)


# ------------------------------------------------------------------ entry points
#
# Kernel arguments arrive positionally; ``names`` maps them to the dict the
# block logic reads. Per-chunk small inputs: ``grow`` (scalar decay as a row,
# [N, C] on GPU, [N, 1, C] on TPU) and ``glc`` (vector decay at each chunk end
# as a column, [N * K, 1]).


def _gpu_fwd_kernel(*refs, names, cfg, n_chunks, kp):
  r = dict(zip(names, refs))

  def body(j, state):
    base = pl.multiple_of(j * cfg.chunk, cfg.chunk)
    grow = r["grow"][pl.ds(j, 1), :] if cfg.mode == "scalar" else None
    glc = r["glc"][pl.ds(j * kp, kp), :] if cfg.mode == "vector" else None
    return _fwd_block(r, base, grow, glc, state, cfg)

  r["st"][...] = lax.fori_loop(0, n_chunks, body, r["s0"][...].astype(jnp.float32))


def _gpu_states_kernel(*refs, names, cfg, n_chunks, kp):
  r = dict(zip(names, refs))

  def body(j, state):
    r["states"][pl.ds(j * kp, kp), :] = state
    glc = r["glc"][pl.ds(j * kp, kp), :] if cfg.mode == "vector" else None
    return _state_block(r, pl.multiple_of(j * cfg.chunk, cfg.chunk), glc, state, cfg)

  lax.fori_loop(0, n_chunks, body, r["s0"][...].astype(jnp.float32))


def _gpu_bwd_kernel(*refs, names, cfg, n_chunks, kp):
  r = dict(zip(names, refs))

  def body(i, dstate):
    j = n_chunks - 1 - i
    base = pl.multiple_of(j * cfg.chunk, cfg.chunk)
    grow = r["grow"][pl.ds(j, 1), :] if cfg.mode == "scalar" else None
    glc = None
    view = r
    if cfg.mode == "vector":
      glc = r["glc"][pl.ds(j * kp, kp), :]
      view = dict(r, dgl=_RowView(r["dgl_all"], j * kp, kp))
    state = r["states"][pl.ds(j * kp, kp), :]
    return _bwd_block(view, base, grow, glc, state, dstate, cfg)

  r["ds0"][...] = lax.fori_loop(0, n_chunks, body, r["dst"][...].astype(jnp.float32))


class _RowView:
  """Rows ``[start, start + size)`` of a 2-D ref, written with ``view[...] = x``."""

  def __init__(self, ref, start, size):
    self.ref, self.start, self.size, self.dtype = ref, start, size, ref.dtype

  def __setitem__(self, idx, x):
    self.ref[pl.ds(self.start, self.size), :] = x


def _tpu_fwd_kernel(*refs, names, cfg, n_chunks, kp):
  del kp
  r = dict(zip(names, refs))
  j = pl.program_id(3)

  @pl.when(j == 0)
  def _():
    r["acc"][...] = r["s0"][...].astype(jnp.float32)

  grow = r["grow"][...] if cfg.mode == "scalar" else None
  glc = r["glc"][...] if cfg.mode == "vector" else None
  state = _fwd_block(r, 0, grow, glc, r["acc"][...], cfg)
  r["acc"][...] = state

  @pl.when(j == n_chunks - 1)
  def _():
    r["st"][...] = state


def _tpu_states_kernel(*refs, names, cfg, n_chunks, kp):
  del n_chunks, kp
  r = dict(zip(names, refs))

  @pl.when(pl.program_id(3) == 0)
  def _():
    r["acc"][...] = r["s0"][...].astype(jnp.float32)

  state = r["acc"][...]
  r["states"][...] = state
  glc = r["glc"][...] if cfg.mode == "vector" else None
  r["acc"][...] = _state_block(r, 0, glc, state, cfg)


def _tpu_bwd_kernel(*refs, names, cfg, n_chunks, kp):
  del kp
  r = dict(zip(names, refs))
  i = pl.program_id(3)  # chunks are visited last to first

  @pl.when(i == 0)
  def _():
    r["acc"][...] = r["dst"][...].astype(jnp.float32)

  grow = r["grow"][...] if cfg.mode == "scalar" else None
  glc = r["glc"][...] if cfg.mode == "vector" else None
  view = dict(r, dgl=r["dgl_all"]) if cfg.mode == "vector" else r
  dstate = _bwd_block(view, 0, grow, glc, r["states"][...], r["acc"][...], cfg)
  r["acc"][...] = dstate

  @pl.when(i == n_chunks - 1)
  def _():
    r["ds0"][...] = dstate


# ------------------------------------------------------------------ pallas_call


def _specs(cfg: _Config, n_chunks: int, tp: int, kp: int, vp: int, reverse: bool = False):
  """BlockSpec factories per array kind, for the platform's grid.

  GPU grid ``(b, h, jv)``: row arrays are whole sequences. TPU grid
  ``(b, h, jv, n)``: one chunk (``n`` counted from the end when ``reverse``).
  """
  c, bv = cfg.chunk, cfg.block_v
  if cfg.platform == "gpu":
    return {
        "rows_k": pl.BlockSpec((None, None, tp, kp), lambda b, h, jv: (b, h, 0, 0)),
        "rows_1": pl.BlockSpec((None, None, tp, 1), lambda b, h, jv: (b, h, 0, 0)),
        "rows_v": pl.BlockSpec((None, None, tp, bv), lambda b, h, jv: (b, h, 0, jv)),
        "part_k": pl.BlockSpec((None, None, None, tp, kp), lambda b, h, jv: (jv, b, h, 0, 0)),
        "part_1": pl.BlockSpec((None, None, None, tp, 1), lambda b, h, jv: (jv, b, h, 0, 0)),
        "grow": pl.BlockSpec((None, None, n_chunks, c), lambda b, h, jv: (b, h, 0, 0)),
        "glc": pl.BlockSpec((None, None, n_chunks * kp, 1), lambda b, h, jv: (b, h, 0, 0)),
        "dgl": pl.BlockSpec((None, None, None, n_chunks * kp, 1),
                            lambda b, h, jv: (jv, b, h, 0, 0)),
        "state": pl.BlockSpec((None, None, kp, bv), lambda b, h, jv: (b, h, 0, jv)),
        "states": pl.BlockSpec((None, None, n_chunks * kp, bv), lambda b, h, jv: (b, h, 0, jv)),
    }
  ch = (lambda n: n_chunks - 1 - n) if reverse else (lambda n: n)
  return {
      "rows_k": pl.BlockSpec((None, None, c, kp), lambda b, h, jv, n: (b, h, ch(n), 0)),
      "rows_1": pl.BlockSpec((None, None, c, 1), lambda b, h, jv, n: (b, h, ch(n), 0)),
      "rows_v": pl.BlockSpec((None, None, c, bv), lambda b, h, jv, n: (b, h, ch(n), jv)),
      "part_k": pl.BlockSpec((None, None, None, c, kp), lambda b, h, jv, n: (jv, b, h, ch(n), 0)),
      "part_1": pl.BlockSpec((None, None, None, c, 1), lambda b, h, jv, n: (jv, b, h, ch(n), 0)),
      "grow": pl.BlockSpec((None, None, None, 1, c), lambda b, h, jv, n: (b, h, ch(n), 0, 0)),
      "glc": pl.BlockSpec((None, None, kp, 1), lambda b, h, jv, n: (b, h, ch(n), 0)),
      "dgl": pl.BlockSpec((None, None, None, kp, 1), lambda b, h, jv, n: (jv, b, h, ch(n), 0)),
      "state": pl.BlockSpec((None, None, kp, bv), lambda b, h, jv, n: (b, h, 0, jv)),
      "states": pl.BlockSpec((None, None, kp, bv), lambda b, h, jv, n: (b, h, ch(n), jv)),
  }


def triton_compiler_params():
  """Compiler params that select the Triton lowering of a GPU ``pallas_call``.

  Without them jax 0.10.2 lowers GPU kernels through Mosaic GPU
  (``jax_pallas_use_mosaic_gpu`` defaults to True), which these kernels are
  not written for.
  """
  from jax.experimental.pallas import triton as pl_triton  # GPU-only module, imported lazily
  return pl_triton.CompilerParams()


def _call(kind, cfg: _Config, inputs, outputs, *, n_chunks, kp, vp, reverse=False):
  """Runs one kernel. ``inputs``: ``[(name, array, spec kind)]`` (array None: skipped);
  ``outputs``: ``[(name, ShapeDtypeStruct, spec kind)]``."""
  inputs = [x for x in inputs if x[1] is not None]
  b, h, tp = inputs[0][1].shape[:3]
  specs = _specs(cfg, n_chunks, tp, kp, vp, reverse)
  names = tuple(n for n, _, _ in inputs) + tuple(n for n, _, _ in outputs)
  grid = (b, h, vp // cfg.block_v)
  gpu = cfg.platform == "gpu"
  kernels = {"fwd": (_gpu_fwd_kernel, _tpu_fwd_kernel),
             "states": (_gpu_states_kernel, _tpu_states_kernel),
             "bwd": (_gpu_bwd_kernel, _tpu_bwd_kernel)}[kind]
  kernel = functools.partial(kernels[0] if gpu else kernels[1], cfg=cfg, n_chunks=n_chunks, kp=kp)
  extra = {"compiler_params": triton_compiler_params()} if gpu else {}
  if not gpu:
    grid = grid + (n_chunks,)
    names = names + ("acc",)
    extra = dict(
        scratch_shapes=[pltpu.VMEM((kp, cfg.block_v), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")))
  out = pl.pallas_call(
      functools.partial(kernel, names=names),
      grid=grid,
      in_specs=[specs[s] for _, _, s in inputs],
      out_specs=[specs[s] for _, _, s in outputs],
      out_shape=[o for _, o, _ in outputs],
      interpret=cfg.interpret,
      name=f"chunk_decay_{kind}_{cfg.mode}",
      **extra,
  )(*(x for _, x, _ in inputs))
  return dict(zip((n for n, _, _ in outputs), out))


def _side_inputs(gc, cfg: _Config, n_chunks: int):
  """``(grow, glc)``: the scalar decay as rows and the vector decay's chunk ends as columns."""
  b, h, tp = gc.shape[:3] if gc is not None else (0, 0, 0)
  grow = glc = None
  if cfg.mode == "scalar":
    grow = gc.reshape(b, h, n_chunks, cfg.chunk)
    if cfg.platform == "tpu":
      grow = grow[:, :, :, None, :]
  elif cfg.mode == "vector":
    kp = gc.shape[-1]
    glc = gc.reshape(b, h, n_chunks, cfg.chunk, kp)[:, :, :, -1, :].reshape(b, h, n_chunks * kp, 1)
  return grow, glc


def _forward_call(cfg, q, k, v, gc, s0):
  b, h, tp, kp = q.shape
  vp = v.shape[-1]
  n_chunks = tp // cfg.chunk
  grow, glc = _side_inputs(gc, cfg, n_chunks)
  g_kind = "rows_k" if cfg.mode == "vector" else "rows_1"
  out = _call("fwd", cfg, [
      ("q", q, "rows_k"), ("k", k, "rows_k"), ("v", v, "rows_v"), ("g", gc, g_kind),
      ("grow", grow, "grow"), ("glc", glc, "glc"), ("s0", s0, "state")], [
      ("o", jax.ShapeDtypeStruct((b, h, tp, vp), q.dtype), "rows_v"),
      ("st", jax.ShapeDtypeStruct((b, h, kp, vp), jnp.float32), "state")],
      n_chunks=n_chunks, kp=kp, vp=vp)
  return out["o"], out["st"]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _core(cfg, q, k, v, gc, s0):
  """``(o, final_state)`` on padded ``[B, H, Tp, *]`` inputs; ``gc`` the in-chunk
  cumulative log decay (float32) or None."""
  return _forward_call(cfg, q, k, v, gc, s0)


def _core_fwd(cfg, q, k, v, gc, s0):
  return _forward_call(cfg, q, k, v, gc, s0), (q, k, v, gc, s0)


def _core_bwd(cfg, res, cts):
  q, k, v, gc, s0 = res
  do, dst = cts
  b, h, tp, kp = q.shape
  vp = v.shape[-1]
  n_chunks = tp // cfg.chunk
  nv = vp // cfg.block_v
  grow, glc = _side_inputs(gc, cfg, n_chunks)
  g_kind = "rows_k" if cfg.mode == "vector" else "rows_1"
  common_inputs = [("q", q, "rows_k"), ("k", k, "rows_k"), ("v", v, "rows_v"),
                   ("g", gc, g_kind), ("grow", grow, "grow"), ("glc", glc, "glc")]
  states = _call("states", cfg, [("k", k, "rows_k"), ("v", v, "rows_v"), ("g", gc, g_kind),
                                 ("glc", glc, "glc"), ("s0", s0, "state")],
                 [("states", jax.ShapeDtypeStruct((b, h, n_chunks * kp, vp), jnp.float32),
                   "states")], n_chunks=n_chunks, kp=kp, vp=vp)["states"]
  part = lambda width: jax.ShapeDtypeStruct((nv, b, h, tp, width), jnp.float32)
  outputs = [("dq", part(kp), "part_k"), ("dk", part(kp), "part_k"),
             ("dv", jax.ShapeDtypeStruct((b, h, tp, vp), jnp.float32), "rows_v"),
             ("ds0", jax.ShapeDtypeStruct((b, h, kp, vp), jnp.float32), "state")]
  if cfg.mode != "none":
    outputs.append(("dg", part(kp if cfg.mode == "vector" else 1),
                    "part_k" if cfg.mode == "vector" else "part_1"))
  if cfg.mode == "vector":
    outputs.append(("dgl_all", jax.ShapeDtypeStruct((nv, b, h, n_chunks * kp, 1), jnp.float32),
                    "dgl"))
  out = _call("bwd", cfg, common_inputs + [
      ("do", do, "rows_v"), ("states", states, "states"), ("dst", dst, "state")], outputs,
      n_chunks=n_chunks, kp=kp, vp=vp, reverse=True)
  dq = (jnp.sum(out["dq"], 0) * cfg.scale).astype(q.dtype)
  dk = jnp.sum(out["dk"], 0).astype(k.dtype)
  dv = out["dv"].astype(v.dtype)
  dgc = None
  if cfg.mode != "none":
    dgc = jnp.sum(out["dg"], 0)
    if cfg.mode == "vector":
      dgl = jnp.sum(out["dgl_all"], 0).reshape(b, h, n_chunks, kp)
      dgc = dgc.reshape(b, h, n_chunks, cfg.chunk, kp).at[:, :, :, -1, :].add(dgl)
      dgc = dgc.reshape(b, h, tp, kp)
    dgc = dgc.astype(gc.dtype)
  return dq, dk, dv, dgc, out["ds0"].astype(s0.dtype)


_core.defvjp(_core_fwd, _core_bwd)


# ------------------------------------------------------------------- public API


def unsupported_arguments(q, log_decay=None, segment_ids=None) -> dict[str, str]:
  """``{argument: why}`` for the arguments this kernel cannot take (empty: all fine)."""
  bad = {}
  if segment_ids is not None:
    bad["segment_ids"] = "packed sequences are not implemented in the kernel"
  dtypes = [jnp.result_type(q)] + ([] if log_decay is None else [jnp.result_type(log_decay)])
  for name, dt in zip(("q", "log_decay"), dtypes):
    if dt not in [jnp.dtype(d) for d in SUPPORTED_DTYPES]:
      bad[name] = f"dtype {dt} (the kernel takes float32, bfloat16 or float16)"
  return bad


def resolve_launch(what: str, unsupported: dict[str, str], platform, block_sizes, sizes_cls,
                   interpret):
  """Checks a kernel entry point's launch arguments; returns ``(platform, block_sizes, interpret)``.

  Raises a ``ValueError`` naming the first unsupported argument, an unknown
  platform or block sizes of the wrong class; ``None`` means the default of each.
  """
  if unsupported:
    name, why = next(iter(unsupported.items()))
    raise ValueError(f"{what} does not support {name}: {why}.")
  platform = default_platform() if platform is None else platform
  common.check_choice("platform", platform, PLATFORMS)
  block_sizes = sizes_cls() if block_sizes is None else block_sizes
  if not isinstance(block_sizes, sizes_cls):
    raise ValueError(f"block_sizes must be a {sizes_cls.__name__}, "
                     f"got {type(block_sizes).__name__}.")
  block_sizes.check(platform)
  return platform, block_sizes, default_interpret(platform) if interpret is None else interpret


def chunk_decay_attention(
    q: Array,
    k: Array,
    v: Array,
    log_decay: Array | None = None,
    *,
    scale: float | None = None,
    initial_state: Array | None = None,
    return_state: bool = False,
    block_sizes: BlockSizes | None = None,
    platform: str | None = None,
    interpret=None,
):
  """Diagonal-decay linear attention through the Pallas chunk kernel.

  ``S_t = exp(log_decay_t) * S_{t-1} + k_t v_t^T``, ``o_t = scale * S_t^T q_t``.
  Differentiable in ``q, k, v, log_decay, initial_state`` (a ``custom_vjp``).

  Args:
    q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]`` (float32, bfloat16 or float16,
      one dtype).
    log_decay: None, ``[B, T, H]`` or ``[B, T, H, K]``, values ``<= 0``.
    scale: output scale; ``None`` means ``K ** -0.5``.
    initial_state: optional ``[B, H, K, V]`` (float32 inside).
    return_state: also return the final float32 state ``[B, H, K, V]``.
    block_sizes: the tiling (:class:`BlockSizes`); any ``T``, ``K``, ``V`` work
      (padded inside).
    platform: ``"gpu"`` (Triton) or ``"tpu"`` (Mosaic) kernel; ``None``: TPU on
      TPU, else GPU.
    interpret: ``None``: interpret mode unless running on ``platform``
      (``True`` for the GPU kernel, ``pltpu.InterpretParams()`` for TPU);
      or pass either explicitly.

  Returns:
    ``o`` ``[B, T, H, V]`` in the dtype of ``q``, or ``(o, state)``.
  """
  from linear_attention.ops import decay as decay_ops  # ops imports kernels lazily too

  b, t, h, dk, dv = common.check_qkv(q, k, v)
  decay_ops.check_log_decay(log_decay, b, t, h, dk)
  common.check_state("initial_state", initial_state, (b, h, dk, dv))
  platform, block_sizes, interpret = resolve_launch(
      "chunk_decay_attention", unsupported_arguments(q, log_decay), platform, block_sizes,
      BlockSizes, interpret)
  o, state = _chunk_decay(q, k, v, log_decay, initial_state,
                          scale=common.resolve_scale(scale, dk), block_sizes=block_sizes,
                          platform=platform, interpret=interpret)
  return (o, state) if return_state else o


@functools.partial(jax.jit, static_argnames=("scale", "block_sizes", "platform", "interpret"))
def _chunk_decay(q, k, v, log_decay, initial_state, *, scale, block_sizes, platform, interpret):
  """Layout, padding and the in-chunk cumulative decay around :func:`_core`."""
  b, t, h, dk = q.shape
  dv = v.shape[-1]
  kp, vp = pad_dim(dk, platform), pad_dim(dv, platform)
  bv = value_block(vp, block_sizes.block_v, platform)
  vp = _round_up(vp, bv)
  c = block_sizes.chunk
  tp = _round_up(t, c)
  mode = "none" if log_decay is None else ("scalar" if log_decay.ndim == 3 else "vector")
  cfg = _Config(mode=mode, chunk=c, sub=block_sizes.sub_chunk, block_v=bv, scale=float(scale),
                platform=platform, interpret=interpret,
                exact_dots=jnp.dtype(q.dtype) == jnp.float32)

  def layout(x, width):  # [B, T, H, D] -> [B, H, Tp, width], zero padded
    x = jnp.swapaxes(x, 1, 2)
    return jnp.pad(x, ((0, 0), (0, 0), (0, tp - t), (0, width - x.shape[-1])))

  qh, kh, vh = layout(q, kp), layout(k, kp), layout(v, vp)
  gc = None
  if mode != "none":
    g = log_decay.astype(jnp.float32)
    g = layout(g if mode == "vector" else g[..., None], kp if mode == "vector" else 1)
    # Padding has log decay 0: the state passes through padded steps unchanged.
    gc = jnp.cumsum(g.reshape(b, h, tp // c, c, -1), axis=3).reshape(g.shape)
  s0 = jnp.zeros((b, h, kp, vp), jnp.float32)
  if initial_state is not None:
    s0 = s0.at[:, :, :dk, :dv].set(initial_state.astype(jnp.float32))
  o, state = _core(cfg, qh, kh, vh, gc, s0)
  o = jnp.swapaxes(o[:, :, :t, :dv], 1, 2)
  return o, state[:, :, :dk, :dv]
