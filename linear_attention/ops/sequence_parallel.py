"""Sequence parallelism for the diagonal-decay engine.

Each device along one mesh axis holds a contiguous slice of the sequence
(``[B, T, H, D]`` inputs sharded along ``T``), so a sequence longer than one
device's memory can be trained on. Per device:

1. run the chunk form of :func:`~linear_attention.ops.decay.decay_linear_attention`
   on its slice from a zero state, giving local outputs and the slice's final
   state ``S_j``, plus the slice's total log decay ``G_j`` (its sum over ``T``);
2. ``all_gather`` the ``(G_j, S_j)`` pairs along the axis (one collective) and
   fold them into the state entering this device,
   ``S_in_i = sum_{j<i} exp(sum_{j<m<i} G_m) S_j + exp(sum_{m<i} G_m) S_0``.
   The exponents are sums of non-positive numbers (no differences of large
   cumulative sums), so strong decays underflow to zero, never overflow;
3. correct the local outputs with one matmul,
   ``o_t += scale * (q_t * exp(G_{<=t})) S_in`` with ``G_{<=t}`` the
   cumulative log decay inside the slice. No second pass over the sequence.

The final state of the whole sequence (``return_state=True``) is the same
fold to the end of the last slice; each device adds its own term and one
``psum`` of a single state makes it identical (and typed invariant) on every
device.

Memory and communication: the gather moves ``P`` states ``[B, H, K, V]`` to
every device (``P`` the axis size). That is small next to the activations of a
long slice; for very large ``P`` a ``ppermute`` ring would trade that memory
for ``P - 1`` sequential rounds.

``segment_ids`` (packed sequences) are supported: a slice that starts a new
segment, or holds a boundary, stops the incoming state, exactly as in the
single-device engine.

Example (4 devices, here fake CPU ones via
``XLA_FLAGS=--xla_force_host_platform_device_count=4``)::

    mesh = jax.make_mesh((4,), ("seq",))
    q = k = v = jnp.ones((2, 1024, 4, 32))       # T = 1024: 256 tokens a device
    log_decay = -0.1 * jnp.ones((2, 1024, 4))    # one decay per head and step
    with jax.set_mesh(mesh):
      o, state = sequence_parallel_decay_attention(
          q, k, v, log_decay, mesh=mesh, axis_name="seq", return_state=True)
    # o: [2, 1024, 4, 32] sharded along T; state: [2, 4, 32, 32] replicated.

Inside your own ``jax.shard_map`` (inputs already the local slices), call
:func:`sequence_parallel_decay_attention_local` with the axis name instead.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import AbstractMesh, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from linear_attention import common
from linear_attention.ops import decay, gated
from linear_attention.ops import conv as conv_ops
from linear_attention.ops import linear as linear_ops
from linear_attention.ops import softmax as softmax_ops

Array = jax.Array


def _axis_index(axis_name: str) -> Array:
  try:
    return lax.axis_index(axis_name)
  except NameError as e:
    raise ValueError(
        f"axis_name must name a mesh axis bound by an enclosing jax.shard_map, got "
        f"{axis_name!r} ({e})."
    ) from None


def _varying_zeros(k, v, g, segment_ids, acc) -> Array:
  """A zero ``[B, H, K, V]`` state that varies over the same mesh axes as the inputs.

  The engine's own default zero state is a constant, invariant across the
  mesh, so its chunk scan's carry would change type under ``shard_map``'s
  ``check_vma``. ``zeros_like`` keeps its argument's varying axes, and the
  broadcast sum takes the union of those of every input the carry depends on.
  """
  z = (jnp.zeros_like(k[:, 0, :, :, None], acc) + jnp.zeros_like(v[:, 0, :, None, :], acc))
  if g is not None:
    z = z + jnp.zeros_like(decay._expand(g[:, 0], k[:, 0]), acc)[..., None]
  if segment_ids is not None:
    z = z + jnp.zeros_like(segment_ids[:, 0], acc)[:, None, None, None]
  return z


def _fold_weights(target, g_all, carry_all, n: int):
  """Weights of every source state into the boundary before slice ``target``.

  Sources: ``s = 0`` the initial state, ``s = j + 1`` the final state of slice
  ``j``. A source reaches the boundary through the slices ``s <= m < target``.

  Args:
    target: int (traced or not) in ``[0, n]``; ``n`` means the sequence end.
    g_all: ``[n, B, H, K|1]`` total log decay per slice, or None (no decay).
    carry_all: ``[n, B]`` bool, whether a slice passes its entering state on
      (False where it starts or contains a segment boundary), or None.

  Returns:
    ``[n + 1, B|1, H|1, K|1, 1]`` weights, broadcastable against the states.
  """
  s = jnp.arange(n + 1)[:, None]
  m = jnp.arange(n)[None, :]
  through = (s <= m) & (m < target)  # [n+1, n]
  w = (jnp.arange(n + 1) <= target).astype(jnp.float32)[:, None, None, None]
  if g_all is not None:
    # A masked sum, not a difference of prefix sums: exact and never positive.
    log_w = jnp.sum(jnp.where(through[:, :, None, None, None], g_all[None], 0.0), axis=1)
    w = w.astype(g_all.dtype) * jnp.exp(log_w)
  if carry_all is not None:
    blocked = jnp.any(through[:, :, None] & ~carry_all[None], axis=1)  # [n+1, B]
    w = w * (~blocked).astype(w.dtype)[:, :, None, None]
  return w[..., None]


def sequence_parallel_decay_attention_local(
    q: Array,
    k: Array,
    v: Array,
    log_decay: Array | None = None,
    *,
    axis_name: str = "seq",
    scale: float | None = None,
    chunk_size: int = 64,
    initial_state: Array | None = None,
    return_state: bool = False,
    segment_ids: Array | None = None,
):
  """The per-device body of sequence-parallel decay attention; call it inside ``jax.shard_map``.

  The arrays are this device's slice of a sequence split contiguously, in
  order, along the mesh axis ``axis_name`` (device ``i`` of the axis holds
  tokens ``[i * T, (i + 1) * T)``). Other mesh axes (e.g. the batch sharded
  over a data axis) are independent and need no care here.

  Args:
    q, k: ``[B, T, H, K]`` local slices; v: ``[B, T, H, V]``.
    log_decay: None, ``[B, T, H]`` or ``[B, T, H, K]`` local slice, ``<= 0`` (``-inf``
      allowed; the sign is checked only for concrete values, not under ``jit``).
    axis_name: the mesh axis the sequence is split along.
    scale: output scale; ``None`` means ``K ** -0.5``.
    chunk_size: chunk length of the local chunk form.
    initial_state: optional ``[B, H, K, V]`` state before the first token of
      the whole sequence, the same on every device of the axis.
    return_state: also return the final state of the whole sequence.
    segment_ids: optional ``[B, T]`` local slice of the packed-sequence ids.

  Returns:
    ``o`` ``[B, T, H, V]`` (local slice) in the dtype of ``q``, or
    ``(o, state)`` with the float32 ``[B, H, K, V]`` final state of the whole
    sequence, identical on every device of the axis.
  """
  b, t, h, dk, dv = decay._check_inputs(q, k, v, log_decay, "chunk", chunk_size, initial_state,
                                        segment_ids)
  idx = _axis_index(axis_name)
  scale = common.resolve_scale(scale, dk)
  acc = common.acc_dtype(q.dtype)
  # -inf (a hard reset) floored as in the engine: its sums must not meet inf - inf.
  g = None if log_decay is None else common.floor_log_decay(log_decay.astype(acc))
  s0 = None if initial_state is None else initial_state.astype(acc)

  # 1. The slice on its own, from a zero state (outputs kept in acc precision).
  o, local = decay.decay_linear_attention(
      q.astype(acc), k.astype(acc), v.astype(acc), g, scale=scale, chunk_size=chunk_size,
      initial_state=_varying_zeros(k, v, g, segment_ids, acc), return_state=True,
      segment_ids=segment_ids)

  # 2. Gather every slice's (total decay, final state) and fold up to this slice.
  g_tot = None
  if g is not None:
    g_tot = jnp.sum(g, axis=1)
    g_tot = g_tot[..., None] if g.ndim == 3 else g_tot  # [B, H, K|1]
  states = lax.all_gather(local, axis_name)  # [n, B, H, K, V]
  n = states.shape[0]
  g_all = None if g_tot is None else lax.all_gather(g_tot, axis_name)

  carry_all = sees = None
  if segment_ids is not None:
    seg_local = common.segment_index(segment_ids)
    ends = jnp.stack([segment_ids[:, 0], segment_ids[:, -1],
                      (seg_local[:, -1] == 0).astype(segment_ids.dtype)], axis=-1)
    ends = lax.all_gather(ends, axis_name)  # [n, B, 3]: first id, last id, one segment
    first, last, single = ends[..., 0], ends[..., 1], ends[..., 2] == 1
    # A slice continues its predecessor when its first id equals the last id
    # before it; the first slice continues the initial state.
    cont = jnp.concatenate([jnp.ones_like(first[:1], bool), first[1:] == last[:-1]], axis=0)
    carry_all = cont & single
    cont_here = jnp.take(cont, idx, axis=0)  # [B]
    sees = ((seg_local == 0) & cont_here[:, None]).astype(acc)[:, :, None, None]

  w = _fold_weights(idx, g_all, carry_all, n)
  s_in = jnp.sum(w[1:] * states, axis=0)
  if s0 is not None:
    s_in = s_in + w[0] * s0

  # 3. The entering state's contribution: one [T, K] x [K, V] matmul per head.
  q_dec = q.astype(acc) * scale
  if g is not None:
    q_dec = q_dec * jnp.exp(decay._expand(jnp.cumsum(g, axis=1), q_dec))
  if sees is not None:
    q_dec = q_dec * sees
  o = (o + jnp.einsum("bthk,bhkv->bthv", q_dec, s_in)).astype(q.dtype)
  if not return_state:
    return o

  # The final state: this slice's term (plus the initial state's, once), summed.
  w_end = _fold_weights(n, g_all, carry_all, n)
  own = jnp.take(w_end, idx + 1, axis=0) * local
  if s0 is not None:
    own = own + jnp.where(idx == 0, w_end[0] * s0, 0.0)
  return o, lax.psum(own, axis_name)


def _axis_names(name, what: str) -> tuple[str, ...]:
  if name is None:
    return ()
  names = (name,) if isinstance(name, str) else tuple(name)
  if not all(isinstance(x, str) for x in names):
    raise ValueError(f"{what} must be a mesh axis name or a tuple of names, got {name!r}.")
  return names


def _check_mesh(mesh, axis_name, batch_axis, batch: int, seq: int) -> tuple:
  """Validates the mesh and axes; returns the batch axes as a tuple."""
  if not isinstance(mesh, (Mesh, AbstractMesh)):
    raise ValueError(f"mesh must be a jax.sharding.Mesh (e.g. jax.make_mesh) or, inside a "
                     f"traced function, jax.sharding.get_abstract_mesh(), got {type(mesh)}.")
  names = tuple(mesh.axis_names)
  if not isinstance(axis_name, str) or axis_name not in names:
    raise ValueError(f"axis_name must be one of the mesh axes {list(names)}, got {axis_name!r}.")
  n = mesh.shape[axis_name]
  if seq % n:
    raise ValueError(
        f"the sequence length T = {seq} must be divisible by the size of mesh axis "
        f"{axis_name!r} ({n}); pad the sequence to a multiple of {n}.")
  batch_axes = _axis_names(batch_axis, "batch_axis")
  for a in batch_axes:
    if a not in names or a == axis_name:
      raise ValueError(
          f"batch_axis must name mesh axes other than axis_name {axis_name!r}, one of "
          f"{[x for x in names if x != axis_name]}, got {batch_axis!r}.")
  nb = 1
  for a in batch_axes:
    nb *= mesh.shape[a]
  if batch % nb:
    raise ValueError(
        f"the batch size B = {batch} must be divisible by the size of batch_axis "
        f"{batch_axis!r} ({nb}).")
  return batch_axes


def sequence_parallel_decay_attention(
    q: Array,
    k: Array,
    v: Array,
    log_decay: Array | None = None,
    *,
    mesh: Mesh | AbstractMesh,
    axis_name: str = "seq",
    batch_axis: str | Sequence[str] | None = None,
    scale: float | None = None,
    chunk_size: int = 64,
    initial_state: Array | None = None,
    return_state: bool = False,
    segment_ids: Array | None = None,
):
  """Diagonal-decay linear attention with the sequence split over a mesh axis.

  The same result as ``decay_linear_attention(..., form="chunk")`` (up to
  float rounding), computed with each device of ``axis_name`` holding ``T / n``
  consecutive tokens; see the module docstring for the algorithm. The inputs
  are placed on the mesh (``device_put``) if they are not already; ``jit`` and
  ``grad`` work through it.

  Args:
    q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]`` (global arrays).
    log_decay: None, ``[B, T, H]`` or ``[B, T, H, K]``, values ``<= 0`` (``-inf``
      allowed; the sign is checked only for concrete values, not under ``jit``).
    mesh: the device mesh; inside ``jit`` under ``jax.set_mesh`` also the abstract
      mesh (``jax.sharding.get_abstract_mesh()``), which is what the model layers
      pass (:mod:`linear_attention.nn.context_parallel`).
    axis_name: mesh axis to split the sequence over; ``T`` must be divisible
      by its size.
    batch_axis: optional mesh axis (or axes) to split the batch over as well.
    scale: output scale; ``None`` means ``K ** -0.5``.
    chunk_size: chunk length of each device's chunk form.
    initial_state: optional ``[B, H, K, V]`` state before the first token.
    return_state: also return the final state.
    segment_ids: optional ``[B, T]`` ints packing several sequences per row.

  Returns:
    ``o`` ``[B, T, H, V]`` in the dtype of ``q`` (sharded along ``T``), or
    ``(o, state)`` with the float32 ``[B, H, K, V]`` final state.
  """
  b, t, h, dk, _ = decay._check_inputs(q, k, v, log_decay, "chunk", chunk_size, initial_state,
                                       segment_ids)
  batch_axes = _check_mesh(mesh, axis_name, batch_axis, b, t)
  bspec = None if not batch_axes else (batch_axes[0] if len(batch_axes) == 1 else batch_axes)
  return _sharded(q, k, v, log_decay, initial_state, segment_ids, mesh=mesh,
                  axis_name=axis_name, bspec=bspec, scale=common.resolve_scale(scale, dk),
                  chunk_size=chunk_size, return_state=return_state)


@functools.partial(jax.jit, static_argnames=("mesh", "axis_name", "bspec", "scale", "chunk_size",
                                             "return_state"))
def _sharded(q, k, v, log_decay, initial_state, segment_ids, *, mesh, axis_name, bspec, scale,
             chunk_size, return_state):
  """Places the present inputs on the mesh and runs the local body under ``shard_map``."""
  seq_spec = P(bspec, axis_name)
  named = {"q": (q, seq_spec), "k": (k, seq_spec), "v": (v, seq_spec),
           "log_decay": (log_decay, seq_spec), "initial_state": (initial_state, P(bspec)),
           "segment_ids": (segment_ids, seq_spec)}

  def body(q, k, v, log_decay=None, **kw):
    return sequence_parallel_decay_attention_local(
        q, k, v, log_decay, axis_name=axis_name, scale=scale, chunk_size=chunk_size,
        return_state=return_state, **kw)

  return _shard(body, mesh, named, (seq_spec, P(bspec)) if return_state else seq_spec)


def sequence_parallel_gla(q: Array, k: Array, v: Array, log_g: Array, *, mesh: Mesh | AbstractMesh,
                          axis_name: str = "seq", batch_axis: str | Sequence[str] | None = None,
                          scale: float | None = None, chunk_size: int = 64,
                          initial_state: Array | None = None, return_state: bool = False,
                          segment_ids: Array | None = None):
  """:func:`~linear_attention.ops.gated.gla` with the sequence split over ``axis_name``.

  Args:
    q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; log_g: ``[B, T, H, K]`` (``<= 0``,
      checked only when concrete).
    mesh, axis_name, batch_axis, scale, chunk_size, initial_state, return_state,
      segment_ids: as in :func:`sequence_parallel_decay_attention`.

  Returns:
    ``o`` ``[B, T, H, V]``, or ``(o, state)`` with the ``[B, H, K, V]`` state.
  """
  b, t, h, dk, _ = common.check_qkv(q, k, v)
  common.check_log_decay(log_g, b, t, h, dk, name="log_g", per_head=False)
  return sequence_parallel_decay_attention(
      q, k, v, log_g, mesh=mesh, axis_name=axis_name, batch_axis=batch_axis, scale=scale,
      chunk_size=chunk_size, initial_state=initial_state, return_state=return_state,
      segment_ids=segment_ids)


def sequence_parallel_ssd(x: Array, dt: Array, A: Array, B: Array, C: Array,
                          D: Array | None = None, *, mesh: Mesh | AbstractMesh, axis_name: str = "seq",
                          batch_axis: str | Sequence[str] | None = None,
                          dt_bias: Array | None = None, dt_softplus: bool = False,
                          scale: float | None = 1.0, chunk_size: int = 64,
                          initial_state: Array | None = None, return_state: bool = False,
                          segment_ids: Array | None = None):
  """:func:`~linear_attention.ops.gated.ssd` (Mamba-2) with the sequence split over ``axis_name``.

  Args:
    x: ``[batch, T, H, P]``; dt: ``[batch, T, H]``; A: ``[H]``; B, C:
      ``[batch, T, G, N]``; D, dt_bias: optional ``[H]``; dt_softplus, scale:
      as in :func:`~linear_attention.ops.gated.ssd`.
    mesh, axis_name, batch_axis, chunk_size, return_state, segment_ids: as in
      :func:`sequence_parallel_decay_attention`.
    initial_state: optional ``[batch, H, N, P]`` float32.

  Returns:
    ``y`` ``[batch, T, H, P]`` in the dtype of ``x``, or ``(y, state)`` with
    the ``[batch, H, N, P]`` state.
  """
  common.check_rank("x", x, 4)
  # The input maps are per token, so they run on the global (sharded) arrays.
  q, k, v, log_decay, skip = gated._ssd_inputs(x, dt, A, B, C, D, dt_bias, dt_softplus)
  y, state = sequence_parallel_decay_attention(
      q, k, v, log_decay, mesh=mesh, axis_name=axis_name, batch_axis=batch_axis, scale=scale,
      chunk_size=chunk_size, initial_state=initial_state, return_state=True,
      segment_ids=segment_ids)
  y = (y + skip).astype(x.dtype)
  return (y, state) if return_state else y


def sequence_parallel_retention(q: Array, k: Array, v: Array, *, mesh: Mesh | AbstractMesh,
                                axis_name: str = "seq",
                                batch_axis: str | Sequence[str] | None = None,
                                gamma: Array | None = None, scale: float | None = None,
                                chunk_size: int = 64, initial_state: Array | None = None,
                                return_state: bool = False, segment_ids: Array | None = None):
  """:func:`~linear_attention.ops.gated.retention` (RetNet) with the sequence split over ``axis_name``.

  Args:
    q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; gamma: ``[H]`` in ``(0, 1)`` or
      None (the RetNet defaults).
    mesh, axis_name, batch_axis, scale, chunk_size, initial_state, return_state,
      segment_ids: as in :func:`sequence_parallel_decay_attention`.

  Returns:
    ``o`` ``[B, T, H, V]``, or ``(o, state)`` with the ``[B, H, K, V]`` state.
  """
  b, t, h, _, _ = common.check_qkv(q, k, v)
  log_decay = jnp.broadcast_to(gated._retention_log_gamma(gamma, h), (b, t, h))
  return sequence_parallel_decay_attention(
      q, k, v, log_decay, mesh=mesh, axis_name=axis_name, batch_axis=batch_axis, scale=scale,
      chunk_size=chunk_size, initial_state=initial_state, return_state=return_state,
      segment_ids=segment_ids)


def sequence_parallel_hgrn2(q: Array, log_f: Array, v: Array, *, mesh: Mesh | AbstractMesh,
                            axis_name: str = "seq",
                            batch_axis: str | Sequence[str] | None = None,
                            scale: float | None = 1.0, chunk_size: int = 64,
                            initial_state: Array | None = None, return_state: bool = False,
                            segment_ids: Array | None = None):
  """:func:`~linear_attention.ops.gated.hgrn2` with the sequence split over ``axis_name``.

  Args:
    q: ``[B, T, H, K]``; log_f: ``[B, T, H, K]`` (``<= 0``); v: ``[B, T, H, V]``.
    mesh, axis_name, batch_axis, scale, chunk_size, initial_state, return_state,
      segment_ids: as in :func:`sequence_parallel_decay_attention`.

  Returns:
    ``o`` ``[B, T, H, V]``, or ``(o, state)`` with the ``[B, H, K, V]`` state.
  """
  b, t, h, dk, _ = common.check_qkv(q, q, v)
  common.check_log_decay(log_f, b, t, h, dk, name="log_f", per_head=False)
  return sequence_parallel_decay_attention(
      q, gated._hgrn2_key(log_f, q.dtype), v, log_f, mesh=mesh, axis_name=axis_name,
      batch_axis=batch_axis, scale=scale, chunk_size=chunk_size, initial_state=initial_state,
      return_state=return_state, segment_ids=segment_ids)


def sequence_parallel_linear_attention(
    q: Array, k: Array, v: Array, *, mesh: Mesh | AbstractMesh, axis_name: str = "seq",
    batch_axis: str | Sequence[str] | None = None, feature_map: str = "elu",
    causal: bool = True, normalize: bool = True, key: Array | None = None,
    num_features: int | None = None, projection: Array | None = None,
    scale: float | None = None, eps: float = linear_ops.DEFAULT_EPS, chunk_size: int = 64,
    initial_state: Array | None = None, return_state: bool = False,
    segment_ids: Array | None = None):
  """:func:`~linear_attention.ops.linear.linear_attention` with the sequence split over ``axis_name``.

  The feature maps (and the positive maps' running key shift) are per token or
  prefix maxima and run on the global, sharded arrays; the recurrence over
  ``phi(k) [v, 1]`` runs sequence-parallel; the normaliser divides per token.
  Bidirectional attention without ``segment_ids`` needs only global sums over
  ``T``, which XLA reduces across the axis itself, so it is
  :func:`~linear_attention.ops.linear.linear_attention` unchanged.

  Args:
    q, k: ``[B, T, H, D]``; v: ``[B, T, H, V]``.
    feature_map, causal, normalize, key, num_features, projection, scale, eps:
      as in :func:`~linear_attention.ops.linear.linear_attention`.
    mesh, axis_name, batch_axis, chunk_size, initial_state, return_state,
      segment_ids: as in :func:`sequence_parallel_decay_attention`
      (``initial_state`` ``[B, H, F, V + 1]`` when normalising).

  Returns:
    ``o`` ``[B, T, H, V]`` in the dtype of ``q``, or ``(o, state)``.

  Raises:
    ValueError: bidirectional with ``segment_ids`` (its reversed pass is not
      sequence-parallel here).
  """
  b, t, h, dk, dv = common.check_qkv(q, k, v)
  if not causal:
    if segment_ids is not None:
      raise ValueError("sequence_parallel_linear_attention: causal=False with segment_ids is "
                       "not supported (it needs a reversed pass); use causal=True or no "
                       "segment_ids.")
    return linear_ops.linear_attention(
        q, k, v, feature_map=feature_map, causal=False, normalize=normalize, key=key,
        num_features=num_features, projection=projection, scale=scale, eps=eps,
        initial_state=initial_state, return_state=return_state)
  common.check_segment_ids(segment_ids, b, t)
  stateless = normalize and initial_state is None and not return_state
  phi_q, phi_k, engine_scale, log_decay = linear_ops._features(
      q, k, feature_map, scale=scale, key=key, num_features=num_features,
      projection=projection, normalize=normalize,
      key_shift=(True, segment_ids) if stateless else None)
  vv = v.astype(phi_q.dtype)
  vv = linear_ops._with_ones(vv) if normalize else vv
  common.check_state("initial_state", initial_state, (b, h, phi_q.shape[-1], vv.shape[-1]))
  out, state = sequence_parallel_decay_attention(
      phi_q, phi_k, vv, log_decay, mesh=mesh, axis_name=axis_name, batch_axis=batch_axis,
      scale=engine_scale, chunk_size=chunk_size, initial_state=initial_state,
      return_state=True, segment_ids=segment_ids)
  o = (linear_ops._divide(out, eps) if normalize else out).astype(q.dtype)
  return (o, state) if return_state else o


def sequence_parallel_rebased_attention(
    q: Array, k: Array, v: Array, gamma: Array, beta: Array, *, mesh: Mesh | AbstractMesh,
    axis_name: str = "seq", batch_axis: str | Sequence[str] | None = None,
    causal: bool = True, norm_eps: float = 1e-5, eps: float = linear_ops.DEFAULT_EPS,
    chunk_size: int = 64, initial_state: Array | None = None, return_state: bool = False,
    segment_ids: Array | None = None):
  """:func:`~linear_attention.ops.linear.rebased_attention` with the sequence split over ``axis_name``.

  Args:
    q, k: ``[B, T, H, D]``; v: ``[B, T, H, V]``; gamma, beta: ``[D]`` or ``[H, D]``.
    causal, norm_eps, eps: as in :func:`~linear_attention.ops.linear.rebased_attention`.
    mesh, axis_name, batch_axis, chunk_size, initial_state, return_state,
      segment_ids: as in :func:`sequence_parallel_linear_attention`.

  Returns:
    ``o`` ``[B, T, H, V]`` in the dtype of ``q``, or ``(o, state)``.
  """
  common.check_qkv(q, k, v)
  qn, kn = linear_ops._rebased_qk(q, k, gamma, beta, norm_eps)
  return sequence_parallel_linear_attention(
      qn, kn, v, mesh=mesh, axis_name=axis_name, batch_axis=batch_axis, feature_map="squared",
      causal=causal, eps=eps, chunk_size=chunk_size, initial_state=initial_state,
      return_state=return_state, segment_ids=segment_ids)


# ------------------------------------------------- token mixing beyond the engine


def _shard(body, mesh, named: dict, out_spec):
  """Runs ``body(**present)`` under ``shard_map``; ``named`` maps name -> (array or None, spec).

  A concrete mesh gets its inputs placed first (eager calls); under ``jit`` with an
  abstract mesh, ``shard_map`` reshards them itself.
  """
  names = [n for n, (x, _) in named.items() if x is not None]
  args = [named[n][0] for n in names]
  if isinstance(mesh, Mesh):
    args = [jax.device_put(x, NamedSharding(mesh, named[n][1])) for n, x in zip(names, args)]
  fn = lambda *xs: body(**dict(zip(names, xs)))
  return jax.shard_map(fn, mesh=mesh, in_specs=tuple(named[n][1] for n in names),
                       out_specs=out_spec)(*args)


def _batch_spec(batch_axes: tuple):
  return None if not batch_axes else (batch_axes[0] if len(batch_axes) == 1 else batch_axes)


def sequence_parallel_causal_conv1d(x: Array, weight: Array, bias: Array | None = None, *,
                                    mesh: Mesh | AbstractMesh, axis_name: str = "seq",
                                    batch_axis: str | Sequence[str] | None = None,
                                    segment_ids: Array | None = None,
                                    activation: str | None = None) -> Array:
  """:func:`~linear_attention.ops.conv.causal_conv1d` with the sequence split over ``axis_name``.

  Each device receives the last ``W - 1`` inputs of the previous device (one
  ``ppermute``: the halo; the first device gets zeros, the causal padding) and
  convolves its slice with the halo in front, so the sequence is never gathered.
  With ``segment_ids`` the halo's ids travel along and the op's own segment
  masking decides which halo taps a token may read.

  Args:
    x: ``[B, T, D]``; weight: ``[W, D]``; bias: optional ``[D]``.
    mesh, axis_name, batch_axis, segment_ids: as in
      :func:`sequence_parallel_decay_attention`; each device's slice must hold at
      least ``W - 1`` tokens.
    activation: ``None`` or ``"silu"``.

  Returns:
    ``y`` ``[B, T, D]`` in the dtype of ``x``, sharded along ``T``.
  """
  common.check_rank("x", x, 3)
  b, t, _ = x.shape
  batch_axes = _check_mesh(mesh, axis_name, batch_axis, b, t)
  common.check_segment_ids(segment_ids, b, t)
  halo = weight.shape[0] - 1
  n = mesh.shape[axis_name]
  if halo > t // n:
    raise ValueError(
        f"the short convolution of width {halo + 1} needs at least {halo} tokens per device "
        f"of mesh axis {axis_name!r}, got T / {n} = {t // n}; use a longer sequence or fewer "
        "devices on that axis.")
  if halo == 0:
    return conv_ops.causal_conv1d(x, weight, bias, segment_ids=segment_ids,
                                  activation=activation)
  spec = P(_batch_spec(batch_axes), axis_name)
  # Device i sends its tail to device i + 1; nobody sends to device 0 (it receives zeros).
  perm = [(i, i + 1) for i in range(n - 1)]

  def body(x, weight, bias=None, segment_ids=None):
    xs = jnp.concatenate([lax.ppermute(x[:, -halo:], axis_name, perm), x], axis=1)
    seg = None
    if segment_ids is not None:
      seg = jnp.concatenate([lax.ppermute(segment_ids[:, -halo:], axis_name, perm),
                             segment_ids], axis=1)
    y = conv_ops.causal_conv1d(xs, weight, bias, segment_ids=seg, activation=activation)
    return y[:, halo:]

  return _shard(body, mesh, {"x": (x, spec), "weight": (weight, P()), "bias": (bias, P()),
                             "segment_ids": (segment_ids, spec)}, spec)


def sequence_parallel_softmax_attention(q: Array, k: Array, v: Array, *,
                                        mesh: Mesh | AbstractMesh, axis_name: str = "seq",
                                        batch_axis: str | Sequence[str] | None = None,
                                        causal: bool = False, scale: float | None = None,
                                        segment_ids: Array | None = None,
                                        implementation: str | None = None) -> Array:
  """Exact softmax attention with the sequence split over ``axis_name``: all-gather attention.

  Each device keeps its queries and gathers every key and value of the axis
  (one ``all_gather`` each); its queries sit at global positions
  ``[i * T / n, (i + 1) * T / n)``, which sets the causal mask. The logits are
  ``[B, H, T / n, T]`` per device, so memory is ``1 / n`` of the one-device
  naive form's (not the ``O(T)`` of a ring or blockwise pass).

  Args:
    q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``.
    mesh, axis_name, batch_axis, segment_ids: as in
      :func:`sequence_parallel_decay_attention`.
    causal, scale: as in :func:`~linear_attention.ops.softmax.softmax_attention`.
    implementation: ``None`` or ``"xla"`` (the per-device attention is XLA's).

  Returns:
    ``o`` ``[B, T, H, V]`` in the dtype of ``q``, sharded along ``T``.
  """
  b, t, _, dk, _ = common.check_attention(q, k, v, segment_ids)
  if implementation not in (None, "xla"):
    raise ValueError(f"implementation must be None or 'xla' for all-gather attention (no "
                     f"Pallas kernel takes a query offset), got {implementation!r}.")
  batch_axes = _check_mesh(mesh, axis_name, batch_axis, b, t)
  scale = common.resolve_scale(scale, dk)
  spec = P(_batch_spec(batch_axes), axis_name)

  def body(q, k, v, segment_ids=None):
    tl = q.shape[1]
    start = lax.axis_index(axis_name) * tl
    k_all = lax.all_gather(k, axis_name, axis=1, tiled=True)
    v_all = lax.all_gather(v, axis_name, axis=1, tiled=True)
    visible = jnp.ones((1, tl, t), bool)
    if causal:
      visible = (jnp.arange(t)[None, :] <= start + jnp.arange(tl)[:, None])[None]
    if segment_ids is not None:
      # Runs are counted on the whole row, so a reused id is still another segment.
      run = common.segment_index(lax.all_gather(segment_ids, axis_name, axis=1, tiled=True))
      run_q = lax.dynamic_slice_in_dim(run, start, tl, axis=1)
      visible = visible & (run_q[:, :, None] == run[:, None, :])
    o, _ = softmax_ops.dense_attention_stats(q, k_all, v_all, visible, scale)
    return o.astype(q.dtype)

  return _shard(body, mesh, {"q": (q, spec), "k": (k, spec), "v": (v, spec),
                             "segment_ids": (segment_ids, spec)}, spec)
