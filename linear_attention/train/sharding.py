"""Data parallelism, FSDP and context parallelism over a ``("data", "seq")`` mesh.

The batch rows are split over the ``"data"`` axis. Parameters (and the optimiser state,
which mirrors them) are replicated, or with FSDP sharded over the data axis along their
largest dimension divisible by its size (ZeRO-3 style: XLA gathers them for the matmuls).
With ``config.mesh.seq > 1`` the sequence dimension of every batch is split over
``"seq"`` too (context parallelism): the model's token-mixing ops then run their
sequence-parallel forms (:mod:`linear_attention.nn.context_parallel`), which they find
through :func:`mesh_context` around the jitted steps.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Mapping

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from linear_attention.models import stack
from linear_attention.nn import context_parallel

DATA = "data"
SEQ = context_parallel.SEQ  # the axis the model's layers look for


def make_mesh(cfg: Mapping[str, Any]) -> jax.sharding.Mesh:
  """A ``("data", "seq")`` mesh of ``cfg.data x cfg.seq`` devices.

  ``cfg.data = -1`` takes every device (of all processes) not used by ``seq``;
  ``cfg.seq`` (default 1 when absent) shards the sequence. Devices of one ``"seq"`` group
  are consecutive, so the halo and state exchanges stay between neighbours.

  Raises:
    ValueError: naming ``config.mesh.seq`` or ``config.mesh.data`` when the product does
      not fit the device count.
  """
  total = jax.device_count()
  s = cfg.get("seq", 1)
  if isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= total:
    raise ValueError(f"config.mesh.seq must be an int in [1, {total}] (the device count), "
                     f"got {s!r}.")
  n = int(cfg["data"])
  if n == -1:
    if total % s:
      raise ValueError(f"config.mesh.seq={s} must divide the device count {total} when "
                       "config.mesh.data=-1 (all devices).")
    n = total // s
  if not 1 <= n * s <= total or n < 1:
    raise ValueError(f"config.mesh.data * config.mesh.seq = {cfg['data']} * {s} must be in "
                     f"[1, {total}] (the device count); config.mesh.data is -1 (all devices "
                     "left by seq) or >= 1.")
  return jax.make_mesh((n, s), (DATA, SEQ), axis_types=(jax.sharding.AxisType.Auto,) * 2,
                       devices=jax.devices()[:n * s])


def seq_size(mesh: jax.sharding.Mesh) -> int:
  """Devices on the mesh's ``"seq"`` axis (1 for a mesh without one)."""
  return mesh.shape.get(SEQ, 1)


def mesh_context(mesh: jax.sharding.Mesh):
  """``jax.set_mesh(mesh)`` when the mesh has more than one device, else a no-op context.

  The model reads the mesh at trace time (the layers' ``context=`` when the sequence is
  sharded, the rows' sharding of the activations between blocks), so every jitted step must
  be traced (called) inside it; see :func:`under_mesh`.
  """
  return jax.set_mesh(mesh) if mesh.size > 1 else contextlib.nullcontext()


def under_mesh(fn, mesh: jax.sharding.Mesh):
  """``fn`` called inside :func:`mesh_context` (for the jitted train and eval steps)."""
  if mesh.size == 1:
    return fn

  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    with mesh_context(mesh):
      return fn(*args, **kwargs)

  return wrapped


def check_seq_len(seq_len: int, mesh: jax.sharding.Mesh) -> None:
  """Raises a ``ValueError`` naming ``config.mesh.seq`` unless it divides ``seq_len``."""
  s = seq_size(mesh)
  if seq_len % s:
    raise ValueError(f"config.mesh.seq={s} must divide the sequence length T={seq_len} "
                     "(each device holds T / seq consecutive tokens).")


def fsdp_spec(shape: tuple[int, ...], n: int, skip: int = 0) -> P:
  """The spec sharding the largest dimension of ``shape`` divisible by ``n`` (else
  replicated), among the dimensions after the first ``skip`` (a stacked parameter's layer
  axis, which the scan over layers slices every step, is never sharded)."""
  if n == 1 or not shape:
    return P()
  order = sorted(range(skip, len(shape)), key=lambda i: (-shape[i], i))
  for i in order:
    if shape[i] % n == 0:
      spec = [None] * len(shape)
      spec[i] = DATA
      return P(*spec)
  return P()


def state_shardings(state, mesh: jax.sharding.Mesh, fsdp: bool):
  """A ``NamedSharding`` per array leaf of ``state``: FSDP-sharded (never along a stacked
  parameter's layer axis) or replicated."""
  n = mesh.shape[DATA]

  def one(path, x):
    shape = tuple(getattr(x, "shape", ()))
    return NamedSharding(mesh, fsdp_spec(shape, n, stack.layer_axes(path)) if fsdp else P())

  return jax.tree_util.tree_map_with_path(one, state)


def batch_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
  """Leading (batch) axis split over ``"data"`` (the whole batch when ``seq`` is 1; with a
  sharded sequence use :func:`batch_shardings`)."""
  return NamedSharding(mesh, P(DATA))


def batch_spec(ndim: int, mesh: jax.sharding.Mesh) -> P:
  """Rows over ``"data"``; with ``seq > 1`` also axis 1 (the sequence) of arrays of rank >= 2."""
  if ndim >= 2 and seq_size(mesh) > 1:
    return P(DATA, SEQ, *([None] * (ndim - 2)))
  return P(DATA, *([None] * (ndim - 1)))


def batch_shardings(batch: Mapping[str, Any], mesh: jax.sharding.Mesh):
  """The sharding of every field of ``batch`` (a dict shaped like a dataset batch): rows
  over ``"data"``, the sequence over ``"seq"`` (see :func:`batch_spec`). Without a sharded
  sequence, the single :func:`batch_sharding` (a prefix of any batch)."""
  if seq_size(mesh) == 1:
    return batch_sharding(mesh)
  return {k: NamedSharding(mesh, batch_spec(np.ndim(v), mesh)) for k, v in batch.items()}


def put_batch(batch: Mapping[str, np.ndarray], mesh: jax.sharding.Mesh) -> dict:
  """Places a global host batch (the same on every process) on the mesh, split over rows
  (and, with ``seq > 1``, over the sequence: :func:`batch_spec`).

  Every process computes the whole batch deterministically, so each device just takes its
  slice; this works unchanged on one host and on many.
  """
  n, s = mesh.shape[DATA], seq_size(mesh)
  out = {}
  for k, v in batch.items():
    v = np.asarray(v)
    if v.shape[0] % n:
      raise ValueError(f"batch field {k!r} has {v.shape[0]} rows, not divisible by the "
                       f"{n} devices of the data axis; choose data.batch_size accordingly.")
    if v.ndim >= 2 and v.shape[1] % s:
      raise ValueError(f"batch field {k!r} has {v.shape[1]} positions, not divisible by "
                       f"config.mesh.seq={s}; choose data.seq_len accordingly.")
    sh = NamedSharding(mesh, batch_spec(v.ndim, mesh))
    out[k] = jax.make_array_from_callback(v.shape, sh, lambda idx, v=v: v[idx])
  return out
