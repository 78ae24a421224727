"""Data parallelism and FSDP over a one-axis ``jax.make_mesh`` mesh.

The batch is split over the ``"data"`` axis. Parameters (and the optimiser state, which
mirrors them) are replicated, or with FSDP sharded over the same axis along their largest
dimension divisible by its size (ZeRO-3 style: XLA gathers them for the matmuls).
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

DATA = "data"


def make_mesh(cfg: Mapping[str, Any]) -> jax.sharding.Mesh:
  """A ``("data",)`` mesh over ``cfg.data`` devices (``-1``: all devices of all processes)."""
  n = int(cfg["data"])
  total = jax.device_count()
  if n == -1:
    n = total
  if not 1 <= n <= total:
    raise ValueError(f"config.mesh.data must be -1 or in [1, {total}] (the device count), "
                     f"got {cfg['data']}.")
  return jax.make_mesh((n,), (DATA,), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.devices()[:n])


def fsdp_spec(shape: tuple[int, ...], n: int) -> P:
  """The spec sharding the largest dimension of ``shape`` divisible by ``n`` (else replicated)."""
  if n == 1 or not shape:
    return P()
  order = sorted(range(len(shape)), key=lambda i: (-shape[i], i))
  for i in order:
    if shape[i] % n == 0:
      spec = [None] * len(shape)
      spec[i] = DATA
      return P(*spec)
  return P()


def state_shardings(state, mesh: jax.sharding.Mesh, fsdp: bool):
  """A ``NamedSharding`` per array leaf of ``state``: FSDP-sharded or replicated."""
  n = mesh.shape[DATA]

  def one(x):
    shape = tuple(getattr(x, "shape", ()))
    return NamedSharding(mesh, fsdp_spec(shape, n) if fsdp else P())

  return jax.tree.map(one, state)


def batch_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
  """Leading (batch) axis split over ``"data"``."""
  return NamedSharding(mesh, P(DATA))


def put_batch(batch: Mapping[str, np.ndarray], mesh: jax.sharding.Mesh) -> dict:
  """Places a global host batch (the same on every process) on the mesh, split over rows.

  Every process computes the whole batch deterministically, so each device just takes its
  rows; this works unchanged on one host and on many.
  """
  n = mesh.shape[DATA]
  out = {}
  for k, v in batch.items():
    v = np.asarray(v)
    if v.shape[0] % n:
      raise ValueError(f"batch field {k!r} has {v.shape[0]} rows, not divisible by the "
                       f"{n} devices of the data axis; choose data.batch_size accordingly.")
    sh = NamedSharding(mesh, P(DATA, *([None] * (v.ndim - 1))))
    out[k] = jax.make_array_from_callback(v.shape, sh, lambda idx, v=v: v[idx])
  return out
