"""Diagonal state-space models: Mamba-1's selective scan (Gu & Dao, 2023); S4D (Gu et
al., 2022) is in :mod:`linear_attention.ops.s4d`, its names re-exported here.

Both run, per channel ``d``, a diagonal state of size ``N``::

    h_t = exp(dt * A) * h_{t-1} + Bbar * u_t        y_t = <C, h_t> (+ D u_t)

* S4D is time invariant: ``A`` complex ``[D, N]`` (N modes standing for N
  conjugate pairs, so ``y = 2 Re <C, h>``), a learnable step ``log_dt [D]`` and
  zero-order-hold discretisation ``Bbar = (exp(dt A) - 1) / A * B``. Being
  time invariant, it is a convolution with the kernel
  ``K_l = 2 Re sum_n C_n Bbar_n exp(dt A_n l)`` (a Vandermonde product in closed
  form), applied with an FFT in ``O(T log T)``: form ``"fft"``. Its recurrence
  is the elementwise scan of :mod:`linear_attention.ops.scan` over a complex
  ``[D, N]`` state (forms ``"chunk"``, ``"associative"``, ``"recurrent"``).
* Mamba's ``dt``, ``B`` and ``C`` depend on the token: ``A`` real ``[D, N]``,
  ``dt_t = softplus(dt + dt_bias)`` per channel, ``Bbar = dt_t B_t`` (Mamba's
  simplified hold), ``y_t = <C_t, h_t> + D x_t``, gated by ``silu(z)``. It is
  the same elementwise scan over a real ``[D, N]`` state, and also the
  diagonal-decay engine with one head per channel (``q = C``, ``k = B``,
  ``v = dt x``, key dimension ``N``, value dimension 1).

With constant ``dt``, ``B`` and ``C``, Mamba is an S4D with real ``A``:
``A_imag = 0``, ``C_s4d = C / 2`` and ``B_s4d = B * dt A / expm1(dt A)`` (the
last undoes the zero-order hold). The tests check this through the public
functions.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from linear_attention import common
from linear_attention.ops import decay as decay_lib
from linear_attention.engines import context as context_lib
from linear_attention.ops import scan as scan_lib
from linear_attention.engines.context import SeqContext
from linear_attention.ops.s4d import (  # noqa: F401  S4D's names, where they were before
    S4D_FORMS, S4D_INITS, _check_nonpositive, _concrete, s4d, s4d_discretize, s4d_init,
    s4d_kernel, s4d_log_dt_init, s4d_step)

Array = jax.Array

SELECTIVE_FORMS = ("chunk", "associative", "recurrent", "decay")


# ------------------------------------------------------------------ selective scan


def _check_selective(x, dt, A, B, C, D, z, dt_bias, dt_softplus):
  lead = x.shape[:-1]
  for name, p in (("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C)):
    common.check_float(name, p)
  common.check_shape("dt", dt, x.shape, "the shape of x")
  d = x.shape[-1]
  common.check_rank("A", A, 2)
  common.check_shape("A", A, (d, None), "[D, N] with D the channels of x")
  n = A.shape[1]
  rank = len(lead) + 1
  if jnp.ndim(B) == rank:
    common.check_shape("B", B, lead + (n,), "[..., N] with N from A")
    groups = 1
  else:
    common.check_shape("B", B, lead + (None, n), "[..., G, N] (grouped) with N from A")
    groups = B.shape[-2]
  if jnp.shape(C) != jnp.shape(B):
    raise ValueError(
        f"C must have the shape of B {list(B.shape)} (same number of groups), got "
        f"{list(jnp.shape(C))}.")
  if d % groups:
    raise ValueError(f"B and C have {groups} groups, which must divide the {d} channels of x.")
  if D is not None:
    common.check_shape("D", D, (d,), "[D]")
  if z is not None:
    common.check_shape("z", z, x.shape, "the shape of x")
  if dt_bias is not None:
    common.check_shape("dt_bias", dt_bias, (d,), "[D]")
  _check_nonpositive("A", A, "Mamba's A is negative real")
  if not dt_softplus and _concrete(dt) and (dt_bias is None or _concrete(dt_bias)):
    delta = np.asarray(dt, np.float64) + (0 if dt_bias is None else np.asarray(dt_bias, np.float64))
    common.check_range("dt (+ dt_bias)", delta, low=0.0, what="with dt_softplus=False")
  elif dt_softplus:  # softplus(NaN) is NaN: it would spread through the whole scan
    common.check_range("dt", dt, what="a step size before softplus")
  return d, n, groups


def _bc(p, d, rank):
  """B or C as ``[..., D, N]``-broadcastable: shared ``[..., 1, N]`` or per group expanded."""
  if p.ndim == rank:  # not grouped: one vector shared by every channel
    return p[..., None, :]
  return jnp.repeat(p, d // p.shape[-2], axis=-2)


def _delta(dt, dt_bias, dt_softplus, acc):
  delta = dt.astype(acc)
  if dt_bias is not None:
    delta = delta + dt_bias.astype(acc)
  return jax.nn.softplus(delta) if dt_softplus else delta


def _log_a(delta, A):
  """``delta [..., D] * A [D, N]`` -> ``[..., D, N]``, the log transition.

  ``A = -inf`` is a decay of exactly 0 for any step ``delta > 0`` and no
  decay for ``delta = 0`` (no step; also what the padding of the scans relies
  on), never ``0 * inf = NaN``; the infinite entries take the other branch of
  a double ``where``, so no gradient meets ``0 * inf`` either.
  """
  finite = jnp.isfinite(A)
  delta = delta[..., None]
  hard = jnp.where(delta > 0, -jnp.inf, 0.0)
  return jnp.where(finite, delta * jnp.where(finite, A, 0.0), hard)


def _finish(y, x, D, z, acc):
  if D is not None:
    y = y + x.astype(acc) * D.astype(acc)
  if z is not None:
    y = y * jax.nn.silu(z.astype(acc))
  return y.astype(x.dtype)


def selective_scan(
    x: Array,
    dt: Array,
    A: Array,
    B: Array,
    C: Array,
    D: Array | None = None,
    z: Array | None = None,
    *,
    dt_bias: Array | None = None,
    dt_softplus: bool = True,
    form: str = "auto",
    chunk_size: int = 64,
    initial_state: Array | None = None,
    return_state: bool = False,
    segment_ids: Array | None = None,
    context: SeqContext | None = None,
):
  """Mamba-1's selective scan.

  ``h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t`` per channel (state ``[D, N]``),
  ``y_t = <C_t, h_t> + D x_t``, then ``y_t * silu(z_t)``.

  Args:
    x: ``[B, T, D]`` inputs.
    dt: ``[B, T, D]`` steps (before ``dt_bias`` and softplus).
    A: ``[D, N]`` real, ``<= 0`` (``-inf``: a decay of exactly 0 for every
      step with ``dt > 0``, none for ``dt = 0``). A log gate
      in all but name: its sign (and that of ``dt`` without softplus) is
      checked only for concrete values, not under ``jit``/``grad``/``vmap``.
    B, C: ``[B, T, N]`` (shared by all channels) or ``[B, T, G, N]`` with ``G``
      dividing ``D`` (channel ``d`` reads group ``d // (D / G)``).
    D: optional ``[D]`` skip; z: optional ``[B, T, D]`` gate.
    dt_bias: optional ``[D]`` added to ``dt``.
    dt_softplus: apply softplus to ``dt + dt_bias``; without it they must be ``>= 0``.
    form: ``"chunk"`` (the elementwise scan engine, chunked),
      ``"associative"``, ``"recurrent"`` (``lax.scan``, state only, in
      rematerialised chunks) or ``"decay"`` (the diagonal-decay engine, one
      head per channel). ``"auto"`` (default) is ``"recurrent"`` on CPU and
      ``"chunk"`` on GPU and TPU: on CPU the parallel forms move a
      ``[B, T, D, N]`` tensor through memory several times while the scan
      keeps ``[B, D, N]`` (measured at T=4096, D=256, N=16: recurrent
      fwd+bwd 6x faster than chunk, 36x faster than decay).
    chunk_size: chunk length of the chunk and decay forms.
    initial_state: optional ``[B, D, N]``.
    return_state: also return the final state.
    segment_ids: optional ``[B, T]`` ints; the state is reset at each new segment.
    context: None, or a :class:`~linear_attention.ops.context.SeqContext`: the
      sequence split over a mesh axis, through the context of the engine the form
      runs on (the scan engine, or the decay engine for ``"decay"``). The
      ``"recurrent"`` form keeps only ``[B, D, N]`` states there too: each device
      scans its slice, the slices' (transition, final state) pairs are folded, and
      each device adds the entering state's part (:func:`_selective_local`).

  Returns:
    ``y`` ``[B, T, D]`` in the dtype of ``x``, or ``(y, state)`` with ``state``
    ``[B, D, N]`` float32.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> x, dt = jax.random.normal(jax.random.key(0), (2, 1, 8, 3))  # [B, T, D]
    >>> A = -jnp.ones((3, 4))  # [D, N]
    >>> B, C = jax.random.normal(jax.random.key(1), (2, 1, 8, 4))  # [B, T, N]
    >>> y = ops.selective_scan(x, dt, A, B, C)
    >>> y.shape
    (1, 8, 3)
    >>> bool(jnp.allclose(y, ops.selective_scan(x, dt, A, B, C, form="chunk"), atol=1e-5))
    True
  """
  common.check_rank("x", x, 3)
  d, n, _ = _check_selective(x, dt, A, B, C, D, z, dt_bias, dt_softplus)
  bsz, t, _ = x.shape
  common.check_seq_len(t, "axis 1 of x")
  common.check_choice("form", form, SELECTIVE_FORMS + ("auto",))
  if form == "auto":
    form = "recurrent" if jax.default_backend() == "cpu" else "chunk"
  common.check_positive_int("chunk_size", chunk_size)
  common.check_segment_ids(segment_ids, bsz, t)
  if initial_state is not None:
    common.check_shape("initial_state", initial_state, (bsz, d, n), "[B, D, N]")
    common.check_float("initial_state", initial_state)

  context_lib.check_context(context)
  y, state = _selective_impl(x, dt, A, B, C, D, z, dt_bias, initial_state, segment_ids,
                             dt_softplus=dt_softplus, form=form, chunk_size=chunk_size,
                             context=context)
  return (y, state) if return_state else y


# Jitted so that eager calls compile once per configuration.
@functools.partial(jax.jit, static_argnames=("dt_softplus", "form", "chunk_size", "context"))
def _selective_impl(x, dt, A, B, C, D, z, dt_bias, initial_state, segment_ids, *,
                    dt_softplus, form, chunk_size, context):
  bsz, t, d = x.shape
  n = A.shape[1]
  acc = common.acc_dtype(x.dtype, A.dtype)
  delta = _delta(dt, dt_bias, dt_softplus, acc)
  A = A.astype(acc)
  dx = delta * x.astype(acc)  # [B, T, D]
  h0 = None if initial_state is None else initial_state.astype(acc)

  if form == "recurrent" and context is None:
    y, state = _selective_recurrent(delta, dx, A, B.astype(acc), C.astype(acc), h0, segment_ids,
                                    chunk_size)
  elif form == "recurrent":
    named = {"delta": (delta, context.seq_spec), "dx": (dx, context.seq_spec),
             "A": (A, P()), "B": (B.astype(acc), context.seq_spec),
             "C": (C.astype(acc), context.seq_spec), "h0": (h0, context.row_spec),
             "segment_ids": (segment_ids, context.seq_spec)}
    body = functools.partial(_selective_local, axis_name=context.axis_name,
                             chunk_size=chunk_size)
    y, state = context.shard(body, named, (context.seq_spec, context.row_spec))
  elif form == "decay":
    bx = jnp.broadcast_to(_bc(B.astype(acc), d, 3), (bsz, t, d, n))
    cx = jnp.broadcast_to(_bc(C.astype(acc), d, 3), (bsz, t, d, n))
    y, state = decay_lib.decay_linear_attention(
        cx, bx, dx[..., None], _log_a(delta, A), scale=1.0, form="chunk",
        chunk_size=chunk_size, initial_state=None if h0 is None else h0[..., None],
        return_state=True, segment_ids=segment_ids, context=context)
    y, state = y[..., 0], state[..., 0]
  else:
    a = jnp.exp(_log_a(delta, A))
    b = dx[..., None] * _bc(B.astype(acc), d, 3)
    h, state = scan_lib.linear_scan(a, b, h0=h0, form=form, chunk_size=chunk_size,
                                    segment_ids=segment_ids, return_state=True,
                                    context=context)
    y = jnp.sum(h * _bc(C.astype(acc), d, 3), axis=-1)
  return _finish(y, x, D, z, acc), state


def _selective_recurrent(delta, dx, A, B, C, h0, segment_ids, chunk_size):
  """``lax.scan`` that keeps only the ``[B, D, N]`` state (no ``[B, T, D, N]`` tensor).

  The tokens go through in rematerialised chunks of ``chunk_size``
  (:func:`linear_attention.common.remat_scan`).
  """
  bsz, t, d = dx.shape
  state = jnp.zeros((bsz, d, A.shape[1]), dx.dtype) if h0 is None else h0
  starts = (jnp.zeros((bsz, t), bool) if segment_ids is None
            else common.segment_starts(segment_ids))

  def body(h, xs):
    delta_t, dx_t, b_t, c_t, start = xs
    h = jnp.where(start[:, None, None], 0, h)
    h = jnp.exp(_log_a(delta_t, A)) * h + dx_t[..., None] * _bc(b_t, d, 2)
    return h, jnp.sum(h * _bc(c_t, d, 2), axis=-1)

  move = lambda v: jnp.moveaxis(v, 1, 0)
  state, y = common.remat_scan(body, state, tuple(move(v) for v in (delta, dx, B, C, starts)),
                               chunk_size)
  return move(y), state


def _selective_local(delta, dx, A, B, C, h0=None, segment_ids=None, *, axis_name, chunk_size):
  """The recurrent form on this device's slice, with the sequence split over ``axis_name``.

  As the unsharded form, it holds ``[B, D, N]`` states, never a ``[B, T, D, N]`` tensor:

  1. the rematerialised ``lax.scan`` of :func:`_selective_recurrent` over the slice from a
     zero state gives the zero-state outputs and the slice's final state;
  2. the slice's transition is ``exp(A * sum_t delta_t)`` (``[B, D, N]``; zero when a
     segment starts inside the slice), and :func:`~linear_attention.engines.context.fold_affine`
     folds the gathered (transition, final state) pairs into the state entering this slice;
  3. each token adds ``<C_t, exp(A * delta_{<=t}) s_in>`` while it is in the segment that
     entered the slice: a parallel product, in chunks of ``chunk_size`` tokens under
     ``jax.checkpoint`` so that only ``[B, chunk, D, N]`` is live at a time.
  """
  bsz, t, d = dx.shape
  acc = dx.dtype
  zero = (jnp.zeros((bsz, d, A.shape[1]), acc)
          + context_lib.varying_zero(delta, segment_ids, dtype=acc))
  y, end = _selective_recurrent(delta, dx, A, B, C, zero, segment_ids, chunk_size)

  maps = lax.all_gather(jnp.exp(_log_a(jnp.sum(delta, axis=1), A)), axis_name)  # [n, B, D, N]
  cont, sees = None, jnp.ones((bsz, t), acc)
  if segment_ids is not None:
    cont, single, sees = context_lib.device_segments(segment_ids, axis_name, acc)
    maps = maps * single[..., None, None].astype(acc)
  s_in, s_end = context_lib.fold_affine(jnp.multiply, maps, lax.all_gather(end, axis_name), h0,
                                        cont, axis_name)

  def correction(_, xs):  # one chunk of tokens: cum [B, c, D], c_t [B, c, (G,) N]
    cum, c_t = xs
    h = jnp.exp(_log_a(cum, A)) * s_in[:, None]
    return (), jnp.sum(h * _bc(c_t, d, 3), axis=-1)

  # Time-major chunks [n, B, c, ...]; padded tokens have C = 0 and add nothing.
  c = max(1, min(chunk_size, t))
  chunks = lambda v: jnp.moveaxis(
      common.pad_axis(v, c, axis=1).reshape((bsz, -1, c) + v.shape[2:]), 1, 0)
  cum = jnp.cumsum(delta, axis=1) * sees[..., None]
  c_seen = C * sees.reshape(sees.shape + (1,) * (C.ndim - 2))
  _, corr = common.remat_scan(correction, (), (chunks(cum), chunks(c_seen)), chunk=1)
  corr = jnp.moveaxis(corr, 0, 1).reshape((bsz, -1, d))[:, :t]
  return y + corr, context_lib.replicate(s_end, axis_name)


def selective_scan_step(
    state: Array | None,
    x: Array,
    dt: Array,
    A: Array,
    B: Array,
    C: Array,
    D: Array | None = None,
    z: Array | None = None,
    *,
    dt_bias: Array | None = None,
    dt_softplus: bool = True,
):
  """One token of :func:`selective_scan`.

  Args:
    state: ``[B, D, N]`` float32, or None (zeros).
    x, dt: ``[B, D]``; A: ``[D, N]``; B, C: ``[B, N]`` or ``[B, G, N]``;
    D: optional ``[D]``; z: optional ``[B, D]``.
    dt_bias, dt_softplus: as in :func:`selective_scan`.

  Returns:
    ``(y, new_state)``: ``y`` ``[B, D]`` in the dtype of ``x``, ``new_state``
    ``[B, D, N]`` float32.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> x, dt = jax.random.normal(jax.random.key(0), (2, 1, 8, 3))  # [B, T, D]
    >>> A = -jnp.ones((3, 4))  # [D, N]
    >>> B, C = jax.random.normal(jax.random.key(1), (2, 1, 8, 4))  # [B, T, N]
    >>> _, state = ops.selective_scan(x[:, :7], dt[:, :7], A, B[:, :7], C[:, :7], return_state=True)
    >>> y, state = ops.selective_scan_step(state, x[:, 7], dt[:, 7], A, B[:, 7], C[:, 7])
    >>> y.shape, state.shape  # state [B, D, N]
    ((1, 3), (1, 3, 4))
    >>> bool(jnp.allclose(y, ops.selective_scan(x, dt, A, B, C)[:, 7], atol=1e-5))
    True
  """
  common.check_rank("x", x, 2)
  d, n, _ = _check_selective(x, dt, A, B, C, D, z, dt_bias, dt_softplus)
  acc = common.acc_dtype(x.dtype, A.dtype)
  delta = _delta(dt, dt_bias, dt_softplus, acc)
  h = (delta * x.astype(acc))[..., None] * _bc(B.astype(acc), d, 2)
  if state is not None:
    common.check_step_state("state", state, (x.shape[0], d, n), "[B, D, N]")
    h = h + jnp.exp(_log_a(delta, A.astype(acc))) * state.astype(acc)
  y = jnp.sum(h * _bc(C.astype(acc), d, 2), axis=-1)
  return _finish(y, x, D, z, acc), h
