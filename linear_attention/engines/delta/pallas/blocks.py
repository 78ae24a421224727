"""Chunk-delta kernel: tiling, static configuration and the per-chunk block logic.

Shared by the Triton (:mod:`.triton`) and Mosaic (:mod:`.mosaic_tpu`) entry
points: :func:`fwd_block` and :func:`bwd_block` compute one chunk from refs
addressed at a row offset, so the GPU kernels call them inside a ``fori_loop``
over whole-sequence refs and the TPU kernels once per grid step on one
chunk's blocks.

Per chunk ``n`` (rows ``[n C, (n + 1) C)``) the refs hold what XLA prepared
for all chunks at once (see the package docstring): ``qg [C, K]`` (queries
times their decay from the chunk start), ``w [C, K]``, ``u [C, bv]``, ``ke
[C, K]`` (keys times their decay to the chunk end), ``am [C, C]`` (the masked,
decayed in-chunk scores) and the chunk's total decay ``a [1, 1]``.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from linear_attention.engines import dispatch
from linear_attention import common

pad_dim, value_block = dispatch.pad_dim, dispatch.value_block


@dataclasses.dataclass(frozen=True)
class ChunkDeltaBlockSizes:
  """Tiling of the chunk-delta kernels (the chunk length is ``chunk_size``).

  Attributes:
    block_v: value columns per program (the state on chip is ``[K, block_v]``).
    num_warps, num_stages: GPU only, passed to the Triton compiler params
      (``None``: Triton's defaults).
  """
  block_v: int = 64
  num_warps: int | None = None
  num_stages: int | None = None

  def __post_init__(self):
    common.check_positive_int("block_sizes.block_v", self.block_v)
    for name in ("num_warps", "num_stages"):
      if getattr(self, name) is not None:
        common.check_positive_int(f"block_sizes.{name}", getattr(self, name))

  @classmethod
  def default(cls, platform: str, dtype=None) -> "ChunkDeltaBlockSizes":
    """The default tiling for ``platform`` and the inputs' ``dtype``.

    GPU: value blocks of 32 with 4 warps, from deviceless compiles for H200
    and A100 at K = V = 128, chunk 64 (``python -m tests.kernels.aot
    --cases chunk_delta/...``; numbers in the package docstring): 2 pipeline
    stages for 16-bit inputs (no register spills); 1 stage for float32, whose
    3-pass TF32 dots with 2 stages asked for 188416 B of shared memory in the
    forward (166912 available on A100).
    TPU: value blocks of 128 (one lane tile).
    """
    if platform == "gpu":
      f32 = dtype is not None and jnp.dtype(dtype) == jnp.float32
      return cls(block_v=32, num_warps=4, num_stages=1 if f32 else 2)
    return cls(block_v=128)

  def check(self, platform: str, interpret=False) -> None:
    """Nothing platform-specific to check (``block_v`` is clipped and rounded)."""
    del platform, interpret


def check_chunk(chunk: int, platform: str) -> None:
  """Raises unless ``chunk`` suits ``platform``: a power of two >= 16 on GPU
  (Triton dot tiles), a multiple of 16 on TPU (the packed 16-bit sublane tile)."""
  common.check_positive_int("chunk_size", chunk)
  if platform == "gpu" and (chunk < 16 or chunk & (chunk - 1)):
    raise ValueError(f"chunk_size must be a power of two >= 16 for the GPU kernel "
                     f"(Triton dot tiles), got {chunk}.")
  if platform == "tpu" and chunk % 16:
    raise ValueError(f"chunk_size must be a multiple of 16 for the TPU kernel, got {chunk}.")


def unsupported_chunk(chunk_size: int | None, platform: str | None) -> dict[str, str]:
  """``{"chunk_size": why}`` when :func:`check_chunk` refuses ``chunk_size`` for
  ``platform`` (``None``: the default platform), else empty (also for ``None``)."""
  if chunk_size is None:
    return {}
  try:
    check_chunk(chunk_size, platform or dispatch.default_platform())
  except ValueError as e:
    return {"chunk_size": str(e).rstrip(".")}  # the caller adds its own
  return {}


@dataclasses.dataclass(frozen=True)
class KernelConfig:
  """Static configuration of one kernel call (hashable: a jit/custom_vjp constant)."""
  chunk: int
  block_v: int
  platform: str
  interpret: object  # False | True | pltpu.InterpretParams
  exact_dots: bool   # float32 inputs: full-precision dots
  # The DPLR algebra (engines.dplr.pallas): pseudo-values U + W S and a
  # per-channel chunk decay [K, 1]; the delta rule's are U - W S and a scalar.
  dplr: bool = False
  num_warps: int | None = None
  num_stages: int | None = None
  # Value heads per query/key head: inputs of a "*_group" spec kind hold one head per
  # group and are read at head h // group (grouped value heads).
  group: int = 1


def _dot(a, b, dims, cfg: KernelConfig, dtype):
  """``a @ b`` (``"nn"``), ``a @ b.T`` (``"nt"``) or ``a.T @ b`` (``"tn"``), float32 out.

  Operands are rounded to ``dtype`` (the inputs' dtype: bf16 runs on the tensor
  cores). Float32 inputs (``cfg.exact_dots``): on a GPU, three TF32 tensor-core
  passes (``TF32_TF32_F32_X3``, float32 accuracy to a few ulps), since Triton's
  exact float32 dot is a register-resident FMA loop that spilled tens of KB
  at K = 128; full float32 elsewhere (TPU, interpret mode).
  """
  contract = {"nn": ((1,), (0,)), "nt": ((1,), (1,)), "tn": ((0,), (0,))}[dims]
  precision = None
  if cfg.exact_dots:
    native_gpu = cfg.platform == "gpu" and cfg.interpret is False
    precision = lax.DotAlgorithmPreset.TF32_TF32_F32_X3 if native_gpu else lax.Precision.HIGHEST
  return lax.dot_general(a.astype(dtype), b.astype(dtype), (contract, ((), ())),
                         precision=precision, preferred_element_type=jnp.float32)


def _rows(ref, start, size):
  """Rows ``[start, start + size)`` of a 2-D ref (in its own dtype)."""
  return ref[pl.ds(start, size), :]


def decay_rows(cfg: KernelConfig, kp: int) -> int:
  """Rows of the chunk-decay column per chunk: ``kp`` (per key channel, DPLR) or 1."""
  return kp if cfg.dplr else 1


def fwd_block(r, base, a, state, cfg: KernelConfig):
  """One chunk of the state pass; returns the state leaving the chunk.

  ``D = U - W S`` (the pseudo-values; ``U + W S`` when ``cfg.dplr``), then
  ``S' = a S + Ke^T D`` (plus ``Wk^T Wv``, the chunk's direct writes, when
  ``r`` has ``"wk"``). Stores ``o = Qg S + Am D`` when ``r`` has ``"o"``, and
  ``D`` when it has ``"d"``. ``state [K, bv]`` float32 is the state entering
  the chunk, ``a`` the chunk decay, ``[1, 1]`` or ``[K, 1]``.
  """
  c, dt = cfg.chunk, r["w"].dtype
  ws = _dot(_rows(r["w"], base, c), state, "nn", cfg, dt)
  u = _rows(r["u"], base, c).astype(jnp.float32)
  d = u + ws if cfg.dplr else u - ws
  if "o" in r:
    o = (_dot(_rows(r["qg"], base, c), state, "nn", cfg, dt)
         + _dot(_rows(r["am"], base, c), d, "nn", cfg, dt))
    r["o"][pl.ds(base, c), :] = o.astype(r["o"].dtype)
  if "d" in r:
    r["d"][pl.ds(base, c), :] = d.astype(r["d"].dtype)
  new = a * state + _dot(_rows(r["ke"], base, c), d, "tn", cfg, dt)
  if "wk" in r:
    new = new + _dot(_rows(r["wk"], base, c), _rows(r["wv"], base, c), "tn", cfg, dt)
  return new


def bwd_block(r, base, a, dstate, cfg: KernelConfig):
  """One chunk of the reverse pass; returns ``dS`` for the state entering the chunk.

  ``dstate [K, bv]``: the gradient of the state leaving the chunk. Stores the
  gradient of the pseudo-values ``dD = Am^T dO + Ke dS'`` (rows of ``"dd"``);
  the state entering is ``a dS' + Qg^T dO - W^T dD`` (``+ W^T dD`` when
  ``cfg.dplr``). The direct writes ``Wk^T Wv`` do not depend on the state.
  """
  c, dt = cfg.chunk, r["w"].dtype
  do = _rows(r["do"], base, c)
  dd = (_dot(_rows(r["am"], base, c), do, "tn", cfg, dt)
        + _dot(_rows(r["ke"], base, c), dstate, "nn", cfg, dt))
  r["dd"][pl.ds(base, c), :] = dd.astype(r["dd"].dtype)
  wdd = _dot(_rows(r["w"], base, c), dd, "tn", cfg, dt)
  ds = a * dstate + _dot(_rows(r["qg"], base, c), do, "tn", cfg, dt)
  return ds + wdd if cfg.dplr else ds - wdd
