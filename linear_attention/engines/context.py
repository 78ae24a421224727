"""Where an op runs: the ``context=`` argument of the engines and token mixers.

``context=None`` (the default) runs an op on whatever arrays it is given. A
:class:`SeqContext` runs it with the sequence split over one mesh axis: device
``i`` of ``axis_name`` holds tokens ``[i T / n, (i + 1) T / n)`` of every
``[B, T, ...]`` input (and, with ``batch_axis``, a slice of the rows), so a
sequence longer than one device's memory can be trained on. The result is the
one the op gives without a context, up to float rounding; ``jit`` and ``grad``
work through it::

    mesh = jax.make_mesh((4,), ("seq",))
    ctx = SeqContext(mesh)                          # the sequence over "seq"
    o = ops.gla(q, k, v, log_g, context=ctx)        # q: [B, T, H, K], T % 4 == 0

Called inside the caller's own ``jax.shard_map`` over ``axis_name`` (the arrays
are then already this device's slices), an op with the same context runs its
per-device part directly.

How each engine splits its recurrence across devices is written next to it
(``engines/decay/engine.py``, ``engines/scan/engine.py``, ``ops/loglinear.py``; the delta
rule and DPLR share :func:`affine_call`); this module holds the parts they share: the
context itself, the one sharded call (:func:`run_sharded`: placing inputs, running a
per-device body under ``shard_map``, jitted once), the segment bookkeeping across device
edges (:func:`device_segments`), the fold of per-device affine state maps
(:func:`fold_affine`) and the refusal of the Pallas kernels (:func:`refuse_pallas`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import AbstractMesh, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from linear_attention import common

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class SeqContext:
  """The sequence split over a mesh axis.

  Attributes:
    mesh: a ``jax.sharding.Mesh`` (``jax.make_mesh``), or inside a traced
      function the abstract mesh (``jax.sharding.get_abstract_mesh()``).
    axis_name: the mesh axis the sequence is split along; ``T`` must be
      divisible by its size.
    batch_axis: optional mesh axis name (or tuple of names) the batch is split
      over as well; ``B`` must be divisible by their total size.

  Frozen and hashable, so it can be a static argument of ``jit``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> mesh = jax.make_mesh((len(jax.devices()),), ("seq",))  # every device on one axis
    >>> ctx = ops.SeqContext(mesh, "seq")
    >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 1, 8, 2, 4))
    >>> log_g = jax.nn.log_sigmoid(jnp.full((1, 8, 2, 4), 2.0))
    >>> o = ops.gla(q, k, v, log_g, context=ctx)  # T split over the devices
    >>> bool(jnp.allclose(o, ops.gla(q, k, v, log_g), atol=1e-5))
    True
  """

  mesh: Mesh | AbstractMesh
  axis_name: str = "seq"
  batch_axis: str | tuple[str, ...] | None = None

  def __post_init__(self):
    if isinstance(self.batch_axis, list):  # a list is not hashable; a tuple means the same
      object.__setattr__(self, "batch_axis", tuple(self.batch_axis))
    if not isinstance(self.mesh, (Mesh, AbstractMesh)):
      raise ValueError(
          f"context.mesh must be a jax.sharding.Mesh (e.g. jax.make_mesh) or, inside a traced "
          f"function, jax.sharding.get_abstract_mesh(), got {type(self.mesh).__name__}.")
    names = tuple(self.mesh.axis_names)
    if not isinstance(self.axis_name, str) or self.axis_name not in names:
      raise ValueError(f"context.axis_name must be one of the mesh axes {list(names)}, got "
                       f"{self.axis_name!r}.")
    batch = self.batch_axes
    others = [x for x in names if x != self.axis_name]
    if not all(isinstance(a, str) and a in others for a in batch):
      raise ValueError(f"context.batch_axis must name mesh axes other than axis_name "
                       f"{self.axis_name!r}, one of {others}, got {self.batch_axis!r}.")

  @property
  def size(self) -> int:
    """Devices along ``axis_name``."""
    return self.mesh.shape[self.axis_name]

  @property
  def batch_axes(self) -> tuple[str, ...]:
    """``batch_axis`` as a tuple (empty when None)."""
    b = self.batch_axis
    return () if b is None else ((b,) if isinstance(b, str) else tuple(b))

  @property
  def batch_spec(self):
    """The ``PartitionSpec`` entry of the batch axis: None, a name or a tuple of names."""
    b = self.batch_axes
    return None if not b else (b[0] if len(b) == 1 else b)

  @property
  def seq_spec(self) -> P:
    """The spec of a ``[B, T, ...]`` array: rows over ``batch_axis``, tokens over ``axis_name``."""
    return P(self.batch_spec, self.axis_name)

  @property
  def row_spec(self) -> P:
    """The spec of a ``[B, ...]`` array (a state): rows split, replicated along ``axis_name``."""
    return P(self.batch_spec)

  @property
  def is_local(self) -> bool:
    """True inside a ``jax.shard_map`` that binds ``axis_name``: arrays are local slices."""
    return self.axis_name in jax.sharding.get_abstract_mesh().manual_axes

  def check(self, batch: int, seq: int) -> None:
    """Raises a ``ValueError`` naming ``context`` unless the global ``[batch, seq]`` splits
    evenly over the mesh (nothing to check when :attr:`is_local`)."""
    if self.is_local:
      return
    n = self.size
    if seq % n:
      raise ValueError(
          f"context: the sequence length T = {seq} must be divisible by the size of mesh axis "
          f"{self.axis_name!r} ({n}); pad the sequence to a multiple of {n}.")
    nb = 1
    for a in self.batch_axes:
      nb *= self.mesh.shape[a]
    if batch % nb:
      raise ValueError(f"context: the batch size B = {batch} must be divisible by the size of "
                       f"batch_axis {self.batch_axis!r} ({nb}).")

  def shard(self, body: Callable, named: dict, out_specs):
    """Runs ``body(**present)`` per device; ``named`` maps name -> (array or None, spec).

    Absent (None) inputs are not passed. Under :attr:`is_local` the body runs on the
    arrays as they are; otherwise they are placed on the mesh first (:meth:`_place`).
    """
    names = [n for n, (x, _) in named.items() if x is not None]
    args = [named[n][0] for n in names]
    fn = lambda *xs: body(**dict(zip(names, xs)))
    if self.is_local:
      return fn(*args)
    args = [self._place(x, named[n][1]) for n, x in zip(names, args)]
    return jax.shard_map(fn, mesh=self.mesh, in_specs=tuple(named[n][1] for n in names),
                         out_specs=out_specs)(*args)

  def _place(self, x, spec):
    """``x`` with the layout ``shard_map`` expects. Eager, on a concrete mesh: ``device_put``.
    Traced, on explicit axes: ``reshard``, whose transpose gives the cotangent back the
    input's own type (that of ``device_put`` would keep the sharded one). Auto axes:
    ``shard_map`` reshards by itself."""
    if not isinstance(x, jax.core.Tracer):
      if isinstance(self.mesh, Mesh):
        return jax.device_put(x, NamedSharding(self.mesh, spec))
      return x
    if any(t == jax.sharding.AxisType.Explicit for t in self.mesh.axis_types):
      # A concrete mesh names itself, so the call also works outside ``jax.set_mesh``.
      return jax.sharding.reshard(
          x, NamedSharding(self.mesh, spec) if isinstance(self.mesh, Mesh) else spec)
    return x


def run_sharded(local: Callable, context: SeqContext, named: dict, out_specs, **static):
  """Runs ``local`` per device with the sequence split over ``context``: the one sharded
  call every engine's ``context=`` path goes through.

  Args:
    local: the per-device body, a module-level function called as
      ``local(**present, axis_name=context.axis_name, **static)`` on this device's slices
      (absent, None, inputs are not passed).
    context: where to run; ``context.check`` already passed.
    named: ``{name: (array or None, PartitionSpec)}``, in ``local``'s argument order.
    out_specs: the ``PartitionSpec`` (or tuple of them) of ``local``'s result.
    **static: ``local``'s other keyword arguments; hashable (they key the compile cache).

  Inside the caller's ``jax.shard_map`` over ``context.axis_name`` (:attr:`SeqContext.is_local`)
  ``local`` runs directly; otherwise under one ``jax.jit``, so an eager call compiles once per
  shapes and static arguments.
  """
  names = tuple(named)
  arrays = tuple(x for x, _ in named.values())
  specs = tuple(spec for _, spec in named.values())
  run = _sharded if context.is_local else _sharded_jit
  return run(arrays, local=local, context=context, names=names, specs=specs,
             out_specs=out_specs, static=tuple(static.items()))


def _sharded(arrays, *, local, context, names, specs, out_specs, static):
  body = functools.partial(local, axis_name=context.axis_name, **dict(static))
  return context.shard(body, {n: (x, spec) for n, x, spec in zip(names, arrays, specs)},
                       out_specs)


_sharded_jit = jax.jit(_sharded, static_argnames=("local", "context", "names", "specs",
                                                  "out_specs", "static"))


def check_context(context) -> None:
  """Raises unless ``context`` is None or a :class:`SeqContext`."""
  if context is not None and not isinstance(context, SeqContext):
    raise ValueError(f"context must be None or a linear_attention.ops.context.SeqContext, got "
                     f"{type(context).__name__}.")


def refuse_pallas(implementation) -> None:
  """Every engine's one-line refusal of ``implementation="pallas"`` with a ``context``: the
  kernels run on one device's whole sequence (no state entering from another device)."""
  if implementation == "pallas":
    raise ValueError("implementation='pallas' does not run with context= (the Pallas kernels "
                     "take no sequence split over devices); use implementation=None or 'xla' "
                     "with a context, or context=None with the kernel.")


def axis_index(axis_name: str) -> Array:
  """This device's index along ``axis_name``; a ``ValueError`` outside a ``shard_map`` over it."""
  try:
    return lax.axis_index(axis_name)
  except NameError as e:
    raise ValueError(
        f"axis_name must name a mesh axis bound by an enclosing jax.shard_map, got "
        f"{axis_name!r} ({e})."
    ) from None


def device_segments(segment_ids: Array, axis_name: str, acc_dtype):
  """Where packed segments meet the device edges, from one small ``all_gather``.

  Args:
    segment_ids: ``[B, T]`` this device's slice of the ids.
    axis_name: the mesh axis the sequence is split along.
    acc_dtype: dtype of ``sees``.

  Returns:
    ``(cont, single, sees)``: ``cont [n, B]`` bool, whether device ``j`` continues the
    segment of the token before it (always True for ``j = 0``: the initial state feeds
    the first segment); ``single [n, B]`` bool, whether device ``j`` holds one segment
    only; ``sees [B, T]`` (``acc_dtype``), whether a local token is in the segment that
    entered this device.
  """
  first_run = common.segment_index(segment_ids) == 0
  ends = jnp.stack([segment_ids[:, 0], segment_ids[:, -1],
                    first_run[:, -1].astype(segment_ids.dtype)], axis=-1)
  ends = lax.all_gather(ends, axis_name)  # [n, B, 3]
  first, last, single = ends[..., 0], ends[..., 1], ends[..., 2] == 1
  cont = jnp.concatenate([jnp.ones_like(first[:1], bool), first[1:] == last[:-1]], axis=0)
  here = jnp.take(cont, axis_index(axis_name), axis=0)
  return cont, single, (first_run & here[:, None]).astype(acc_dtype)


def fold_affine(apply: Callable, maps: Array, ends: Array, s0: Array | None,
                cont: Array | None, axis_name: str):
  """The state entering this device and the final state, from every device's affine map.

  Device ``j`` maps the state entering it to ``apply(maps[j], s) + ends[j]``;
  ``cont[j]`` False cuts the chain (a segment starts on the edge). A short loop
  over the ``n`` devices, each step one ``apply``.

  Args:
    apply: ``(map, state) -> state``, e.g. a matmul or an elementwise product.
    maps, ends: ``[n, ...]`` gathered per-device maps and zero-state final states;
      ``maps`` may be a pytree of ``[n, ...]`` arrays (``apply`` gets device ``j``'s leaves).
    s0: the state before the first token, or None (zero).
    cont: ``[n, B]`` bool from :func:`device_segments`, or None.
    axis_name: the mesh axis.

  Returns:
    ``(s_in, s_end)``: the state entering this device and that after the last device.
  """
  n = ends.shape[0]
  s = jnp.zeros_like(ends[0]) if s0 is None else s0.astype(ends.dtype) + jnp.zeros_like(ends[0])
  entering = []
  for j in range(n):
    if cont is not None:
      s = jnp.where(cont[j].reshape((-1,) + (1,) * (s.ndim - 1)), s, 0.0)
    entering.append(s)
    s = apply(jax.tree.map(lambda m: m[j], maps), s) + ends[j]
  s_in = jnp.take(jnp.stack(entering), axis_index(axis_name), axis=0)
  return s_in, s


def replicate(x: Array, axis_name: str) -> Array:
  """A value every device of ``axis_name`` computed alike, typed invariant along the axis
  (one ``psum`` of device 0's copy), as a replicated ``out_specs`` requires."""
  return lax.psum(jnp.where(axis_index(axis_name) == 0, x, jnp.zeros_like(x)), axis_name)


# ------------------------------------------------- engines whose transition is a matrix


def affine_call(fn: Callable, context: SeqContext, arrays: dict, *, initial_state, segment_ids,
                return_state: bool, static: tuple):
  """Runs ``fn`` with the sequence split over ``context``, for a recurrence affine in its
  state, ``S_t = A_t S_{t-1} + k_t v_t^T`` with any ``[K, K]`` transition ``A_t`` (the
  delta rule, DPLR).

  The algorithm (one pass per device, then one small fold):

  1. each device runs ``fn`` on its slice once, from the initial state ``[I | 0]``
     (``K x (K + V)``) with the values ``[0 | v]``: the state columns then carry the
     slice's transition ``M_t = A_t ... A_1`` next to its zero-state state ``R_t``, and
     the output columns carry ``scale M_t^T q_t`` next to the zero-state output;
  2. ``all_gather`` of every device's final ``[M | R]`` (``P`` states of
     ``K x (K + V)``) and a loop over the ``P`` devices folds them into the state
     entering this device, ``S_in <- M_j S_in + R_j`` (a segment starting on an edge
     stops it; segments inside a slice zero ``M`` by themselves);
  3. ``o_t = o_zero_t + (scale M_t^T q_t)^T S_in``: one ``[T, K] x [K, V]`` matmul.

  The cost is one pass with ``K + V`` value columns instead of ``V`` (the state-free
  parts of a chunk form, such as the delta rule's UT transform, do not grow) plus the
  fold; autodiff gives the gradients, the initial state's included.

  Args:
    fn: the engine, ``fn(**arrays, initial_state=, segment_ids=, return_state=True,
      **dict(static)) -> (o, state)``; a module-level function (it is a ``jit`` static).
    context: where to run; ``context.check`` already passed.
    arrays: name -> ``[B, T, ...]`` floating array or None; ``q`` ``[B, T, H, K]`` and
      ``v`` ``[..., V]`` (values on the last axis) among them.
    initial_state: ``[B, H, K, V]`` or None; segment_ids: ``[B, T]`` or None.
    return_state: also return the final state.
    static: ``fn``'s other keyword arguments as a tuple of ``(name, value)`` pairs.

  Returns:
    ``o`` ``[B, T, H, V]`` in the accumulation dtype, or ``(o, state)``.
  """
  named = {n: (x, context.seq_spec) for n, x in arrays.items()}
  named["initial_state"] = (initial_state, context.row_spec)
  named["segment_ids"] = (segment_ids, context.seq_spec)
  out = (context.seq_spec, context.row_spec) if return_state else context.seq_spec
  return run_sharded(_affine_local, context, named, out, fn=fn, names=tuple(arrays),
                     return_state=return_state, static=static)


def varying_zero(*arrays, dtype) -> Array:
  """A scalar zero that varies over the mesh axes of every given array (None skipped).

  Added to a constant (an initial state), it gives the constant the type a scan carry
  built from those arrays has under ``shard_map``'s ``check_vma``.
  """
  return sum((jnp.zeros_like(x.reshape(-1)[0], dtype) for x in arrays if x is not None),
             jnp.zeros((), dtype))


def _affine_local(initial_state=None, segment_ids=None, *, axis_name, fn, names, return_state,
                  static, **present):
  """:func:`affine_call`'s per-device body on this device's slices."""
  arrays = {n: present.get(n) for n in names}
  s0, static = initial_state, dict(static)
  q, v = arrays["q"], arrays["v"]
  acc = common.acc_dtype(q.dtype)
  arrays = {n: None if x is None else x.astype(acc) for n, x in arrays.items()}
  b, _, _, dk = q.shape
  h, dv = v.shape[2], v.shape[-1]  # the value heads (q, k may have fewer: grouped)
  zero = varying_zero(*arrays.values(), segment_ids, dtype=acc)
  arrays["v"] = jnp.concatenate([jnp.zeros(v.shape[:-1] + (dk,), acc), arrays["v"]], axis=-1)
  eye = jnp.broadcast_to(jnp.eye(dk, dtype=acc), (b, h, dk, dk))
  init = jnp.concatenate([eye, jnp.zeros((b, h, dk, dv), acc)], axis=-1) + zero
  o, state = fn(**arrays, initial_state=init, segment_ids=segment_ids, return_state=True,
                **static)
  o, state = o.astype(acc), state.astype(acc)

  cont = None
  if segment_ids is not None:
    cont, _, _ = device_segments(segment_ids, axis_name, acc)
  ends = lax.all_gather(state, axis_name)  # [n, B, H, K, K + V]
  s_in, s_end = fold_affine(lambda m, s: jnp.einsum("bhkj,bhjv->bhkv", m, s),
                            ends[..., :dk], ends[..., dk:], s0, cont, axis_name)
  o = o[..., dk:] + jnp.einsum("bthk,bhkv->bthv", o[..., :dk], s_in)
  return (o, replicate(s_end, axis_name)) if return_state else o
