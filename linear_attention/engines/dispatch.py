"""Dispatch policy shared by every kernel: which implementation runs, on which
platform, in interpret mode or not, with which compiler parameters.

Imports go one way: ``ops`` -> ``engines`` -> ``common``. The engines ask this
module whether to call a kernel (:func:`resolve_implementation`) and which chunk length
``chunk_size=None`` means (:func:`resolve_chunk_size`); each kernel entry point checks its
launch arguments here (:func:`resolve_launch`) and finds its lowering for a platform in
the one backend table (:data:`LOWERINGS`, :func:`lowering`). This module imports only
``common``.

Vocabulary, the same for every op and kernel:

* ``implementation``: ``None | "xla" | "pallas"`` (:data:`IMPLEMENTATIONS`).
  ``None`` picks a Pallas kernel only on a backend listed in
  :data:`PALLAS_DEFAULT_BACKENDS`, XLA elsewhere.
* ``platform``: ``"gpu"`` (Triton lowering) or ``"tpu"`` (Mosaic); ``None``:
  the platform of the device the call is compiled for (see
  :func:`current_platform`), GPU when that is a CPU (interpreted there).
* ``interpret``: ``None`` (native when compiling for ``platform``, interpret
  mode otherwise), ``False`` (always native: compile for ``platform`` even
  when this host has no such device, e.g. a deviceless AOT compile), ``True``
  (Pallas interpret mode) or a ``pltpu.InterpretParams`` (TPU interpret mode).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as pl_triton

from linear_attention import common

IMPLEMENTATIONS = (None, "xla", "pallas")
PLATFORMS = ("gpu", "tpu")
# Backends on which implementation=None picks a Pallas kernel. A backend joins
# only after experiments/gpu_check.py (or a TPU twin) has compiled, checked and
# timed the kernels on real hardware there; none has yet, so None means XLA
# everywhere and "pallas" must be asked for.
PALLAS_DEFAULT_BACKENDS: tuple[str, ...] = ()
SUPPORTED_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))

_GPU_NAMES = ("gpu", "cuda", "rocm")

# The one backend table: kernel platform -> the name of the module that lowers a kernel
# there (each kernel package has one module per entry). A new backend is one row here and
# one module per kernel.
LOWERINGS = {"gpu": "triton", "tpu": "mosaic_tpu"}

# ``chunk_size=None``: tokens per chunk of an engine's chunk form, by engine and backend
# (:data:`DEFAULT_CHUNK_SIZE` where not listed). What each kernel does with it: the delta
# kernel tiles its chunks by it and the DPLR kernel by ``chunk_size * R`` sub-steps (a power
# of two >= 16 on GPU, a multiple of 16 on TPU); the decay and scan kernels use their own
# block sizes and ignore it. The DPLR engine's 32 on CPU was measured faster than 64 there
# (per-channel in-chunk scores grow with the chunk; see results/bench_delta_forms_cpu.json).
DEFAULT_CHUNK_SIZE = 64
CHUNK_SIZES: dict[str, dict[str, int]] = {"dplr": {"cpu": 32}}
CHUNK_ENGINES = ("decay", "delta", "dplr", "scan")


def _platform_of(name: str | None) -> str | None:
  """``"gpu"``/``"tpu"`` for a JAX platform or backend name, else ``None``."""
  if name in _GPU_NAMES:
    return "gpu"
  return "tpu" if name == "tpu" else None


def current_platform() -> str | None:
  """The kernel platform of the device this call compiles for, or ``None`` (CPU).

  That is the device set by ``jax.default_device(...)`` when there is one (a
  compile-only device from ``jax.experimental.topologies`` included, so a
  deviceless AOT compile for a GPU or TPU target gets the native kernel), else
  JAX's default backend.
  """
  device = jax.config.jax_default_device
  if device is not None:
    name = device if isinstance(device, str) else getattr(device, "platform", None)
    return _platform_of(name)
  return _platform_of(jax.default_backend())


def default_platform() -> str:
  """``"tpu"`` when compiling for a TPU, else ``"gpu"`` (interpreted on CPU)."""
  return "tpu" if current_platform() == "tpu" else "gpu"


def default_interpret(platform: str):
  """Interpret mode unless the call compiles for ``platform``: ``False`` there,
  else ``True`` for the GPU kernels and ``pltpu.InterpretParams()`` for TPU."""
  if current_platform() == platform:
    return False
  return pltpu.InterpretParams() if platform == "tpu" else True


def lowering(platform: str, **modules):
  """The module of ``modules`` (keyword: a :data:`LOWERINGS` value) that lowers a kernel for
  ``platform``; a ``ValueError`` naming ``platform`` for a backend without a row."""
  common.check_choice("platform", platform, tuple(LOWERINGS))
  return modules[LOWERINGS[platform]]


def resolve_chunk_size(chunk_size: int | None, engine: str, backend: str | None = None) -> int:
  """``chunk_size``, or for None ``engine``'s default on ``backend`` (default: JAX's):
  :data:`CHUNK_SIZES`, else :data:`DEFAULT_CHUNK_SIZE`. A given value is checked (an int
  >= 1) and returned as is."""
  common.check_choice("engine", engine, CHUNK_ENGINES)
  if chunk_size is None:
    backend = jax.default_backend() if backend is None else backend
    return CHUNK_SIZES.get(engine, {}).get(backend, DEFAULT_CHUNK_SIZE)
  common.check_positive_int("chunk_size", chunk_size)
  return chunk_size


def next_pow2(n: int) -> int:
  """The smallest power of two ``>= n`` (1 for ``n <= 1``)."""
  return 1 << max(n - 1, 0).bit_length()


def round_up(n: int, m: int) -> int:
  """``n`` rounded up to a multiple of ``m``."""
  return -(-n // m) * m


def pad_dim(n: int, platform: str) -> int:
  """A feature width padded for the platform: a power of two >= 16 for Triton,
  a multiple of 8 on TPU (the sublane tile of state rows)."""
  return max(16, next_pow2(n)) if platform == "gpu" else round_up(n, 8)


def value_block(vp: int, block_v: int, platform: str) -> int:
  """The value block: ``block_v`` clipped to the padded ``V``; on TPU a multiple
  of 128 that divides ``V``, else all of ``V``."""
  if platform == "gpu":
    return min(next_pow2(block_v), vp)
  bv = (min(block_v, vp) // 128) * 128
  return bv if bv and vp % bv == 0 else vp


# Default tiles of the kernels whose tiling is a per-backend rule rather than a kernel's own
# dataclass default, keyed by lowering (a :data:`LOWERINGS` value): flash attention's by
# input width in bytes and padded head size, the linear scan's as a function of its
# channel count. A new backend adds its row to :data:`LOWERINGS` and to each table here.
#
# Flash attention (``FlashBlockSizes`` fields). Triton keeps a key block's k and v in shared
# memory per pipeline stage plus the program's held block, so the tiles shrink as the head
# grows. The rows come from deviceless compiles for H200 and A100 (166912 B of shared
# memory per block, the smaller): up to a head of 128, 8 warps (Triton's default 4 spilled
# in bf16) and, for float32, half the query blocks and 2 stages (the bf16 tiles asked for
# 279552 B); at 256, among the candidates tried (results/compile_flash_heads.json), tiles
# that compile on both with no bfloat16 spill (not yet timed on hardware). A head above
# the largest row halves the blocks per doubling (not compile-checked). Mosaic's 128
# blocks of a 256 head take well under the TPU's scoped VMEM, so TPU has one row.
ANY_HEAD = 1 << 30  # a row for every head size
FLASH_TILES: dict[str, dict[tuple[int, int], dict]] = {
    "triton": {
        (2, 128): dict(block_q=128, block_k=64, block_q_dkv=64, block_k_dkv=64, block_q_dq=64,
                       block_k_dq=64, num_warps=8),
        (2, 256): dict(block_q=64, block_k=32, block_q_dkv=32, block_k_dkv=32, block_q_dq=32,
                       block_k_dq=32, num_warps=8, num_stages=2),
        (4, 128): dict(block_q=64, block_k=64, block_q_dkv=64, block_k_dkv=64, block_q_dq=64,
                       block_k_dq=32, num_warps=8, num_stages=2),
        (4, 256): dict(block_q=32, block_k=32, block_q_dkv=16, block_k_dkv=16, block_q_dq=32,
                       block_k_dq=32, num_warps=8, num_stages=2),
    },
    "mosaic_tpu": {
        (4, ANY_HEAD): dict(block_q=128, block_k=128, block_q_dkv=128, block_k_dkv=128,
                           block_q_dq=128, block_k_dq=128),
    },
}
_FLASH_BLOCK_FIELDS = ("block_q", "block_k", "block_q_dkv", "block_k_dkv", "block_q_dq",
                       "block_k_dq")


def flash_head_dim(platform: str, d: int) -> int:
  """A flash-attention head size as the kernel sees it on ``platform``: Triton's blocks are
  powers of two >= 16 (zero padding changes no logit); Mosaic takes the head as it is."""
  return max(16, next_pow2(d)) if LOWERINGS[platform] == "triton" else d


def flash_tiles(platform: str, dtype=None, head_dim: int | None = None,
                value_dim: int | None = None) -> dict:
  """Flash attention's default tiles on ``platform`` for inputs of ``dtype`` and heads of
  ``head_dim`` (q, k) and ``value_dim`` (v): the :data:`FLASH_TILES` row of the smallest
  head at least the larger padded head (default 128) and width at least the dtype's
  (default 2 bytes), as ``FlashBlockSizes`` keyword arguments.

  Example::

      >>> flash_tiles("gpu", jnp.bfloat16, 192, 128)["block_q"]
      64
  """
  common.check_choice("platform", platform, tuple(LOWERINGS))
  rows = FLASH_TILES[LOWERINGS[platform]]
  width = 2 if dtype is None else jnp.dtype(dtype).itemsize
  heads = [d for d in (head_dim, value_dim) if d is not None] or [128]
  for name, d in (("head_dim", head_dim), ("value_dim", value_dim)):
    if d is not None:
      common.check_positive_int(name, d)
  head = max(flash_head_dim(platform, d) for d in heads)
  keys = sorted(k for k in rows if k[0] >= width) or sorted(rows)[-1:]
  tiles = next((rows[k] for k in keys if k[1] >= head), None)
  if tiles is not None:
    return dict(tiles)
  # Past the largest head of the row's width: the blocks halve per doubling (at least 16).
  largest = max(k for k in keys if k[0] == keys[0][0])
  halvings = (head - 1).bit_length() - (largest[1] - 1).bit_length()
  tiles = dict(rows[largest])
  for name in _FLASH_BLOCK_FIELDS:
    tiles[name] = max(16, tiles[name] >> halvings)
  return tiles


def _scan_tiling_triton(d: int, t: int, block_d: int, chunk: int) -> tuple[int, int, int]:
  del chunk  # one program walks all T rows
  bd = min(next_pow2(block_d), next_pow2(d))
  return bd, round_up(d, bd), t


def _scan_tiling_mosaic(d: int, t: int, block_d: int, chunk: int) -> tuple[int, int, int]:
  dp = d if d <= 128 else round_up(d, 128)
  bd = min(round_up(block_d, 128), dp) if dp % 128 == 0 else dp
  return bd, round_up(dp, bd), round_up(t, chunk)


# The linear scan's tiling: channel block, padded channels and padded T from its
# channels ``d``, length ``t`` and ``ScanBlockSizes`` (Triton blocks are powers of two; on
# TPU a channel block is a multiple of 128 or all channels, and T a multiple of the chunk).
SCAN_TILING = {"triton": _scan_tiling_triton, "mosaic_tpu": _scan_tiling_mosaic}


def scan_tiling(platform: str, d: int, t: int, block_d: int, chunk: int) -> tuple[int, int, int]:
  """``(block_d, padded channels, padded T)`` of the linear scan on ``platform``
  (:data:`SCAN_TILING`).

  Example::

      >>> scan_tiling("tpu", 200, 33, 128, 8)
      (128, 256, 40)
  """
  common.check_choice("platform", platform, tuple(LOWERINGS))
  return SCAN_TILING[LOWERINGS[platform]](d, t, block_d, chunk)


def unsupported_dtypes(**arrays) -> dict[str, str]:
  """``{name: why}`` for each given array (None skipped) whose dtype no kernel takes."""
  bad = {}
  for name, x in arrays.items():
    if x is not None and jnp.result_type(x) not in SUPPORTED_DTYPES:
      bad[name] = (f"dtype {jnp.result_type(x)} (the kernels take real float32, bfloat16 "
                   "or float16)")
  return bad


def resolve_implementation(implementation: str | None, unsupported: dict[str, str]) -> bool:
  """Decides between a Pallas kernel (True) and XLA (False).

  Args:
    implementation: ``None`` (the kernel on a backend listed in
      :data:`PALLAS_DEFAULT_BACKENDS` when it supports the arguments, XLA
      otherwise), ``"xla"`` or ``"pallas"`` (the kernel everywhere; on CPU it
      runs in interpret mode, slowly but exactly).
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
  return not unsupported and current_platform() in PALLAS_DEFAULT_BACKENDS


def resolve_launch(what: str, unsupported: dict[str, str], platform, block_sizes, sizes_cls,
                   interpret):
  """Checks a kernel entry point's launch arguments.

  Args:
    what: the entry point's name, for messages.
    unsupported: ``{argument: why}`` the kernel cannot take (raises on the first).
    platform: ``"gpu"``, ``"tpu"`` or ``None`` (:func:`default_platform`).
    block_sizes: an instance of ``sizes_cls`` or ``None``; ``None`` asks
      ``sizes_cls.default(platform)``. Checked with
      ``block_sizes.check(platform, interpret)``.
    sizes_cls: the kernel's block-size dataclass.
    interpret: ``None`` (:func:`default_interpret`), ``False``, ``True`` or a
      ``pltpu.InterpretParams``.

  Returns:
    ``(platform, block_sizes, interpret)``.

  Raises:
    ValueError: naming the first unsupported argument, an unknown platform or
      block sizes of the wrong class or values.
  """
  if unsupported:
    name, why = next(iter(unsupported.items()))
    raise ValueError(f"{what} does not support {name}: {why}.")
  platform = default_platform() if platform is None else platform
  common.check_choice("platform", platform, PLATFORMS)
  block_sizes = sizes_cls.default(platform) if block_sizes is None else block_sizes
  if not isinstance(block_sizes, sizes_cls):
    raise ValueError(f"block_sizes must be a {sizes_cls.__name__} or None, "
                     f"got {type(block_sizes).__name__}.")
  if interpret is None:
    interpret = default_interpret(platform)
  elif not isinstance(interpret, (bool, pltpu.InterpretParams)):
    raise ValueError(f"interpret must be None, a bool or a pltpu.InterpretParams, "
                     f"got {interpret!r}.")
  block_sizes.check(platform, interpret)
  return platform, block_sizes, interpret


def triton_compiler_params(num_warps: int | None = None, num_stages: int | None = None):
  """Compiler params that select the Triton lowering of a GPU ``pallas_call``.

  Without compiler params jax 0.10.2 lowers GPU kernels through Mosaic GPU
  (``jax_pallas_use_mosaic_gpu`` defaults to True), which these kernels are
  not written for. ``None`` leaves Triton's default (4 warps, 3 stages).
  """
  kw = {k: v for k, v in (("num_warps", num_warps), ("num_stages", num_stages)) if v is not None}
  return pl_triton.CompilerParams(**kw)


def named_pallas_call(kernel, inputs, outputs, specs, *, grid, name, interpret, compiler_params,
                      scratch=(), **kernel_kw) -> dict:
  """A ``pallas_call`` whose kernel sees its refs by name.

  Args:
    kernel: ``kernel(*refs, names=..., **kernel_kw)``; ``names`` lists the refs
      in order: the inputs', the outputs', then the scratch buffers'.
    inputs: ``[(name, array, spec kind)]``; outputs: ``[(name, ShapeDtypeStruct,
      spec kind)]``; specs: ``{spec kind: BlockSpec}``.
    grid, name, interpret, compiler_params: as in ``pl.pallas_call``.
    scratch: ``[(name, scratch shape)]`` (TPU VMEM buffers).

  Returns:
    ``{output name: array}``.
  """
  names = tuple(n for n, _, _ in inputs) + tuple(n for n, _, _ in outputs) + tuple(
      n for n, _ in scratch)
  out = pl.pallas_call(
      functools.partial(kernel, names=names, **kernel_kw),
      grid=grid,
      in_specs=[specs[s] for _, _, s in inputs],
      out_specs=[specs[s] for _, _, s in outputs],
      out_shape=[o for _, o, _ in outputs],
      scratch_shapes=[shape for _, shape in scratch],
      compiler_params=compiler_params,
      interpret=interpret,
      name=name,
  )(*(x for _, x, _ in inputs))
  return dict(zip((n for n, _, _ in outputs), out))
