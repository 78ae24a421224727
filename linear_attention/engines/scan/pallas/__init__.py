"""Pallas kernel: the elementwise linear scan ``h_t = a_t * h_{t-1} + b_t`` (GPU and TPU).

The kernel twin of :func:`linear_attention.ops.scan.linear_scan` (RG-LRU,
Mamba-1's selective scan). Inputs ``[B, T, ...]`` are flattened to
``[B, T, D]``; one program owns one ``(batch, channel block)`` and walks the
sequence in order with the float32 carry on chip. ``reverse=True`` walks from
the end (``h_t = a_t * h_{t+1} + b_t``).

Two thin entry points share the row loop (``_scan_rows``):

* GPU (Triton): grid ``(B, D / block_d)``; a ``fori_loop`` over all ``T``
  rows of the program's channel block.
* TPU (Mosaic): grid ``(B, D / block_d, chunks)``, the chunk axis sequential
  with the carry in a VMEM scratch; blocks ``(chunk, block_d)`` with ``chunk``
  a multiple of 8 and ``block_d`` a multiple of 128 (or all of ``D``).

The backward pass (``jax.custom_vjp``) is the same kernel run the other way
over the output gradient: ``g_t = dh_t + a_{t+1} g_{t+1}``, then
``db = g``, ``da_t = g_t h_{t-1}``, ``dh0 = a_0 g_0`` (mirrored for
``reverse``). The forward keeps ``h`` in float32 for ``da``.

Real float32/bfloat16/float16 only (complex ``a`` goes to XLA); the carry and
``h`` are float32; on TPU 16-bit inputs are read as float32 (see
``_linear_scan``). ``segment_ids`` are handled by the caller by zeroing ``a``
at segment starts (``ops.scan.linear_scan`` does), so the kernel needs nothing.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from linear_attention.engines import dispatch
from linear_attention import common

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class ScanBlockSizes:
  """Tiling of the scan kernel.

  Attributes:
    block_d: channels per program (a power of two on GPU; on TPU a multiple
      of 128 or all of ``D``).
    chunk: rows per TPU grid step (a multiple of 8); unused on GPU.
  """
  block_d: int = 128
  chunk: int = 256

  def __post_init__(self):
    for name in ("block_d", "chunk"):
      common.check_positive_int(f"block_sizes.{name}", getattr(self, name))

  @classmethod
  def default(cls, platform: str) -> "ScanBlockSizes":
    """The default tiling for ``platform``."""
    del platform
    return cls()

  def check(self, platform: str, interpret=False) -> None:
    """Raises unless the sizes suit ``platform``'s compiler (in any interpret mode too)."""
    del interpret
    if platform == "tpu" and self.chunk % 8:
      raise ValueError(f"block_sizes.chunk must be a multiple of 8 on TPU, got {self.chunk}.")


@dataclasses.dataclass(frozen=True)
class _Config:
  reverse: bool
  block_d: int
  chunk: int
  platform: str
  interpret: object


def _scan_rows(a_ref, b_ref, h_ref, start, count, h, reverse):
  """Scans rows ``[start, start + count)`` (backwards when ``reverse``); returns the carry."""

  def step(i, h):
    t = start + (count - 1 - i if reverse else i)
    h = a_ref[pl.ds(t, 1), :].astype(jnp.float32) * h + b_ref[pl.ds(t, 1), :].astype(jnp.float32)
    h_ref[pl.ds(t, 1), :] = h.astype(h_ref.dtype)
    return h

  return lax.fori_loop(0, count, step, h)


def _gpu_kernel(a_ref, b_ref, h0_ref, h_ref, hT_ref, *, cfg, t):
  hT_ref[...] = _scan_rows(a_ref, b_ref, h_ref, 0, t, h0_ref[...].astype(jnp.float32),
                           cfg.reverse)


def _tpu_kernel(a_ref, b_ref, h0_ref, h_ref, hT_ref, carry_ref, *, cfg, t):
  del t
  n = pl.program_id(2)

  @pl.when(n == 0)
  def _():
    carry_ref[...] = h0_ref[...].astype(jnp.float32)

  carry_ref[...] = _scan_rows(a_ref, b_ref, h_ref, 0, cfg.chunk, carry_ref[...], cfg.reverse)

  @pl.when(n == pl.num_programs(2) - 1)
  def _():
    hT_ref[...] = carry_ref[...]


def _out_shape(b):
  bsz, tp, dp = b.shape
  return [jax.ShapeDtypeStruct((bsz, tp, dp), jnp.float32),
          jax.ShapeDtypeStruct((bsz, 1, dp), jnp.float32)]


def _triton_call(cfg: _Config, a, b, h0):
  bsz, tp, dp = b.shape
  bd = cfg.block_d
  rows = pl.BlockSpec((None, tp, bd), lambda i, j: (i, 0, j))
  one = pl.BlockSpec((None, 1, bd), lambda i, j: (i, 0, j))
  return pl.pallas_call(
      functools.partial(_gpu_kernel, cfg=cfg, t=tp), grid=(bsz, dp // bd),
      in_specs=[rows, rows, one], out_specs=[rows, one], out_shape=_out_shape(b),
      compiler_params=dispatch.triton_compiler_params(), interpret=cfg.interpret,
      name="linear_scan")(a, b, h0)


def _mosaic_call(cfg: _Config, a, b, h0):
  bsz, tp, dp = b.shape
  bd = cfg.block_d
  n = tp // cfg.chunk
  ch = (lambda k: n - 1 - k) if cfg.reverse else (lambda k: k)
  rows = pl.BlockSpec((None, cfg.chunk, bd), lambda i, j, k: (i, ch(k), j))
  one = pl.BlockSpec((None, 1, bd), lambda i, j, k: (i, 0, j))
  return pl.pallas_call(
      functools.partial(_tpu_kernel, cfg=cfg, t=tp), grid=(bsz, dp // bd, n),
      in_specs=[rows, rows, one], out_specs=[rows, one], out_shape=_out_shape(b),
      scratch_shapes=[pltpu.VMEM((1, bd), jnp.float32)],
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel", "arbitrary")),
      interpret=cfg.interpret, name="linear_scan")(a, b, h0)


def _scan_call(cfg: _Config, a, b, h0):
  """``(h, h_final)`` float32 for padded ``a, b [B, Tp, Dp]``, ``h0 [B, 1, Dp]``."""
  call = dispatch.lowering(cfg.platform, triton=_triton_call, mosaic_tpu=_mosaic_call)
  return call(cfg, a, b, h0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _core(cfg, a, b, h0):
  return _scan_call(cfg, a, b, h0)


def _core_fwd(cfg, a, b, h0):
  h, h_last = _scan_call(cfg, a, b, h0)
  return (h, h_last), (a, h, h0)


def _core_bwd(cfg, res, cts):
  a, h, h0 = res
  dh, dh_last = cts
  # The adjoint runs the other way: g_t = dh_t + a_next_t g_{t -+ 1}, where
  # a_next is a shifted one step toward the adjoint's start (zero past it).
  zero = jnp.zeros_like(a[:, :1])
  if cfg.reverse:
    a_next = jnp.concatenate([zero, a[:, :-1]], axis=1)
    h_prev = jnp.concatenate([h[:, 1:], h0.astype(h.dtype)], axis=1)
    dh = dh.at[:, :1].add(dh_last)
  else:
    a_next = jnp.concatenate([a[:, 1:], zero], axis=1)
    h_prev = jnp.concatenate([h0.astype(h.dtype), h[:, :-1]], axis=1)
    dh = dh.at[:, -1:].add(dh_last)
  adj = dataclasses.replace(cfg, reverse=not cfg.reverse)
  g, _ = _scan_call(adj, a_next, dh, jnp.zeros_like(h0, jnp.float32))
  first = slice(-1, None) if cfg.reverse else slice(0, 1)
  dh0 = (a[:, first].astype(jnp.float32) * g[:, first]).astype(h0.dtype)
  return (g * h_prev).astype(a.dtype), g.astype(a.dtype), dh0


_core.defvjp(_core_fwd, _core_bwd)


def unsupported_arguments(a, b, h0=None) -> dict[str, str]:
  """``{argument: why}`` for the arguments this kernel cannot take (empty: all fine)."""
  return dispatch.unsupported_dtypes(a=a, b=b, h0=h0)


def linear_scan(
    a: Array,
    b: Array,
    *,
    h0: Array | None = None,
    reverse: bool = False,
    return_state: bool = False,
    block_sizes: ScanBlockSizes | None = None,
    platform: str | None = None,
    interpret=None,
):
  """``h_t = a_t * h_{t-1} + b_t`` along axis 1 through the Pallas scan kernel.

  Differentiable in ``a``, ``b`` and ``h0`` (a ``custom_vjp``).

  Args:
    a: ``[B, T, ...]`` real transition, the shape of ``b`` (never broadcast).
    b: ``[B, T, ...]`` input.
    h0: optional ``[B, ...]`` state before the first step (after the last when
      ``reverse``).
    reverse: run from the end: ``h_t = a_t * h_{t+1} + b_t``.
    return_state: also return the final state (float32 ``[B, ...]``).
    block_sizes: the tiling (:class:`ScanBlockSizes`).
    platform: ``"gpu"`` (Triton) or ``"tpu"`` (Mosaic); ``None``: the platform
      of the device the call compiles for, GPU on CPU.
    interpret: ``None``: native when compiling for ``platform``, else interpret
      mode; ``False`` always compiles for ``platform`` (also for a compile-only
      device); or ``True`` / ``pltpu.InterpretParams()`` explicitly.

  Returns:
    ``h`` ``[B, T, ...]`` in the dtype of ``b``, or ``(h, state)``.
  """
  a, b = jnp.asarray(a), jnp.asarray(b)
  if jnp.ndim(b) < 2:
    raise ValueError(f"b must have shape [B, T, ...], got {list(jnp.shape(b))}.")
  common.check_shape("a", a, b.shape, "the shape of b; a is never broadcast")
  if h0 is not None:
    common.check_shape("h0", h0, (b.shape[0],) + b.shape[2:], "[B, ...] as b without T")
  platform, block_sizes, interpret = dispatch.resolve_launch(
      "the Pallas linear_scan", unsupported_arguments(a, b, h0), platform, block_sizes,
      ScanBlockSizes, interpret)
  h, state = _linear_scan(a, b, h0, reverse=bool(reverse), block_sizes=block_sizes,
                          platform=platform, interpret=interpret)
  return (h, state) if return_state else h


@functools.partial(jax.jit, static_argnames=("reverse", "block_sizes", "platform", "interpret"))
def _linear_scan(a, b, h0, *, reverse, block_sizes, platform, interpret):
  bsz, t = b.shape[:2]
  out_dtype = b.dtype
  rest = b.shape[2:]
  d = max(1, int(jnp.size(b) // max(bsz * t, 1)))
  bd, dp, tp = dispatch.scan_tiling(platform, d, t, block_sizes.block_d, block_sizes.chunk)
  cfg = _Config(reverse=reverse, block_d=bd, chunk=block_sizes.chunk, platform=platform,
                interpret=interpret)
  if platform == "tpu":
    # The TPU kernel reads one row per step at a dynamic offset, which Mosaic
    # supports for 32-bit rows only (16-bit rows pack two to a sublane and a
    # dynamic row index must then be a multiple of 8). The carry is float32
    # anyway; the input is read as float32 (its gradient comes back cast).
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
  # Padding with a = 1, b = 0 carries the state through padded steps unchanged;
  # padded rows sit at the end, which a reverse scan visits first (from h0).
  pad = lambda x, value: jnp.pad(x.reshape(bsz, t, d), ((0, 0), (0, tp - t), (0, dp - d)),
                                 constant_values=value)
  h0p = jnp.zeros((bsz, 1, dp), jnp.float32)
  if h0 is not None:
    h0p = h0p.at[:, 0, :d].set(h0.reshape(bsz, d).astype(jnp.float32))
  h, state = _core(cfg, pad(a, 1), pad(b, 0), h0p)
  h = h[:, :t, :d].reshape(b.shape).astype(out_dtype)
  return h, state[:, 0, :d].reshape((bsz,) + rest)
