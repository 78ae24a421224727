"""Argument checks and sequence helpers shared by every op.

Shape notation used in docstrings across ``ops/``:
B batch, T sequence length, H heads, K key (feature) dimension, V value
dimension, C chunk size. Every check raises a ``ValueError`` that names the
argument, what was expected and what was received.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

Array = jax.Array

FORMS = ("parallel", "chunk", "recurrent")


def resolve_auto_form(form: str, defaults: dict[str, tuple[str, str]]) -> tuple[str, str]:
  """``(values form, gradient form)`` for ``form``: a named form is both; ``"auto"`` is
  ``defaults[jax.default_backend()]``, else ``("chunk", "chunk")``.

  The two differ where one form computes the values faster and the other differentiates
  faster (on CPU the token scan against the chunk form, for the delta-rule engines);
  :func:`with_gradient_of` runs such a pair.

  Raises:
    ValueError: ``form`` is not one of :data:`FORMS` nor ``"auto"``.
  """
  check_choice("form", form, FORMS + ("auto",))
  if form != "auto":
    return form, form
  return defaults.get(jax.default_backend(), ("chunk", "chunk"))


def with_gradient_of(values_fn, gradient_fn):
  """``values_fn``, with the reverse-mode derivative of ``gradient_fn`` (the same function
  computed another way, e.g. a token scan and the chunk form of one recurrence).

  A plain call (or ``jax.vmap``) runs ``values_fn``; ``jax.grad``/``jax.vjp`` run
  ``gradient_fn`` forward and backward, so the values and the gradient each take the faster
  path. It is a ``jax.custom_vjp``: forward-mode (``jax.jvp``, ``jax.jacfwd``) is not
  defined through it -- name a form to get it. Integer arguments get ``float0``
  cotangents, as ``jax.vjp`` gives them.
  """
  @jax.custom_vjp
  def run(*args):
    return values_fn(*args)

  def forward(*args):
    return jax.vjp(gradient_fn, *args)  # (values, the pullback as the residual)

  def backward(pullback, cotangent):
    return pullback(cotangent)

  run.defvjp(forward, backward)
  return run


def in_forms(forms_fn, form: str, gradient_form: str, **static):
  """``forms_fn(*args, form=form, **static)``, differentiated through ``gradient_form``
  (:func:`with_gradient_of`) when the two forms differ; the pair comes from
  :func:`resolve_auto_form`."""
  values = functools.partial(forms_fn, form=form, **static)
  if gradient_form == form:
    return values
  return with_gradient_of(values, functools.partial(forms_fn, form=gradient_form, **static))


def check_rank(name: str, x: Array, rank: int) -> None:
  """Raises unless ``x`` has exactly ``rank`` dimensions."""
  if jnp.ndim(x) != rank:
    raise ValueError(
        f"{name} must have rank {rank}, got shape {tuple(jnp.shape(x))} "
        f"(rank {jnp.ndim(x)})."
    )


def check_shape(name: str, x: Array, expected: Sequence[int | None], what: str = "") -> None:
  """Raises unless ``x.shape`` matches ``expected`` (``None`` matches any size)."""
  shape = tuple(jnp.shape(x))
  ok = len(shape) == len(expected) and all(
      e is None or e == s for e, s in zip(expected, shape)
  )
  if not ok:
    want = "[" + ", ".join("*" if e is None else str(e) for e in expected) + "]"
    extra = f" ({what})" if what else ""
    raise ValueError(f"{name} must have shape {want}{extra}, got {list(shape)}.")


def check_float(name: str, x: Array) -> None:
  """Raises unless ``x`` has a floating dtype."""
  if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
    raise ValueError(f"{name} must be a floating-point array, got dtype {jnp.result_type(x)}.")


def check_same_dtype(**arrays: Array) -> None:
  """Raises unless every given array has the same dtype."""
  dtypes = {n: jnp.result_type(a) for n, a in arrays.items() if a is not None}
  if len(set(dtypes.values())) > 1:
    desc = ", ".join(f"{n}={d}" for n, d in dtypes.items())
    raise ValueError(f"{', '.join(dtypes)} must share one dtype, got {desc}.")


def check_choice(name: str, value, choices: Iterable) -> None:
  """Raises unless ``value`` is one of ``choices``, listing the valid ones."""
  choices = tuple(choices)
  if value not in choices:
    raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}.")


def check_positive_int(name: str, value) -> None:
  """Raises unless ``value`` is an int >= 1."""
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")


def check_qkv(q: Array, k: Array, v: Array,
              names: Sequence[str] = ("q", "k", "v")) -> tuple[int, int, int, int, int]:
  """Checks ``q, k: [B,T,H,K]`` and ``v: [B,T,H,V]``; returns ``(B, T, H, K, V)``.

  ``names`` renames the arguments in messages (e.g. RWKV's ``r`` for ``q``).
  """
  nq, nk, nv = names
  for name, x in ((nq, q), (nk, k), (nv, v)):
    check_rank(name, x, 4)
    check_float(name, x)
  b, t, h, dk = q.shape
  check_seq_len(t, f"axis 1 of {nq}")
  check_shape(nk, k, (b, t, h, dk), f"the shape of {nq}")
  check_shape(nv, v, (b, t, h, None), f"batch, seq and heads of {nq}")
  check_same_dtype(**{nq: q, nk: k, nv: v})
  return b, t, h, dk, v.shape[-1]


def check_seq_len(t: int, where: str) -> None:
  """Raises for an empty sequence: every op refuses ``T = 0`` the same way.

  An empty call is almost always a slicing bug upstream, and an empty output
  with the initial state handed back would hide it; so no op accepts one.
  """
  if t < 1:
    raise ValueError(f"the sequence length ({where}) must be >= 1, got {t}.")


def check_attention(q: Array, k: Array, v: Array,
                    segment_ids: Array | None) -> tuple[int, int, int, int, int]:
  """The prologue of the softmax-family ops (softmax, sparse, low-rank).

  Checks ``q, k: [B, T, H, K]``, ``v: [B, T, H, V]`` and ``segment_ids`` and
  returns ``(B, T, H, K, V)``.
  """
  b, t, h, dk, dv = check_qkv(q, k, v)
  check_segment_ids(segment_ids, b, t)
  return b, t, h, dk, dv


def check_step_qkv(q: Array, k: Array, v: Array,
                   names: Sequence[str] = ("q", "k", "v")) -> tuple[int, int, int, int]:
  """The one-token twin of :func:`check_qkv`: ``q, k: [B, H, K]``, ``v: [B, H, V]``.

  Returns ``(B, H, K, V)``. ``names`` renames the arguments in messages (e.g.
  RWKV's ``r`` for ``q``).
  """
  nq, nk, nv = names
  for name, x in ((nq, q), (nk, k), (nv, v)):
    check_rank(name, x, 3)
    check_float(name, x)
  b, h, dk = q.shape
  check_shape(nk, k, (b, h, dk), f"the shape of {nq}")
  check_shape(nv, v, (b, h, None), f"batch and heads of {nq}")
  check_same_dtype(**{nq: q, nk: k, nv: v})
  return b, h, dk, v.shape[-1]


# The dtypes a recurrent state may have: the documented float32, or float64
# (gradient checks). A half-precision state would make a step accumulate in
# half precision; an integer one would silently truncate.
STATE_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.float64))


def check_step_state(name: str, state: Array, expected: Sequence[int | None],
                     what: str = "[batch, heads, key_dim, value_dim]") -> None:
  """Raises unless the state of a ``*_step`` call has shape ``expected`` and a
  dtype of :data:`STATE_DTYPES` (the step accumulates in the state's dtype)."""
  if state is None:
    raise ValueError(f"{name} must be an array of shape {list(expected)}, got None.")
  check_shape(name, state, expected, what)
  dtype = jnp.result_type(state)
  if dtype not in STATE_DTYPES:
    raise ValueError(f"{name} must be float32 (or float64), got dtype {dtype}.")


def check_step_state_first(state, what: str, *ranks: int) -> None:
  """Refuses a ``*_step`` state of the wrong rank before the token's inputs are checked.

  The state is every step function's first argument; a call in another order
  puts a token's input there, and this names ``state`` rather than the input
  that shifted into the next slot. ``ranks``: one per array of the state (a
  tuple state has several). ``None`` passes (the step decides)."""
  if state is None:
    return
  parts = state if len(ranks) > 1 else (state,)
  if (isinstance(parts, (tuple, list)) and len(parts) == len(ranks)
      and all(getattr(x, "ndim", None) == r for x, r in zip(parts, ranks))):
    return
  got = (f"shape {list(state.shape)}" if hasattr(state, "shape") else
         f"a {type(state).__name__} of shapes {[list(getattr(x, 'shape', ())) for x in state]}"
         if isinstance(state, (tuple, list)) else type(state).__name__)
  raise ValueError(f"state (the first argument of every *_step function) must be {what}, "
                   f"got {got}.")


def concrete(x) -> np.ndarray | None:
  """``x`` as float64 numpy, or None while it is traced (under jit, grad or vmap)."""
  if x is None or isinstance(x, jax.core.Tracer):
    return None
  return np.asarray(x, np.float64)


def check_range(name: str, x: Array | None, *, low: float | None = None,
                high: float | None = None, strict: bool = False, what: str = "") -> None:
  """Refuses a concrete ``x`` with a NaN or an entry outside ``[low, high]``.

  ``strict`` makes the bounds open (``A < 0`` rather than ``<= 0``). NaN is
  always refused: a comparison such as ``max >= 0`` is False for NaN, so a
  gate check written that way lets it through and ``exp(NaN * ...)`` spreads.
  The message names ``name`` (the argument the caller passed), the rule, and
  either the first NaN's index or the worst entry. Traced values (under
  ``jit``, ``grad``, ``vmap``) are not checked.
  """
  values = concrete(x)
  if values is None or not values.size:
    return
  rule = " and ".join(
      f"{op}{'' if strict else '='} {bound:g}"
      for op, bound in ((">", low), ("<", high)) if bound is not None) or "free of NaN"
  rule += f" ({what})" if what else ""
  nan = np.isnan(values)
  if nan.any():
    where = tuple(int(i) for i in np.argwhere(nan)[0])
    raise ValueError(f"{name} must be {rule}, got NaN at index {where} ({int(nan.sum())} of "
                     f"{values.size} entries).")
  for bound, side, worst in ((low, "minimum", values.min()), (high, "maximum", values.max())):
    if bound is None:
      continue
    bad = (worst <= bound if side == "minimum" else worst >= bound) if strict else (
        worst < bound if side == "minimum" else worst > bound)
    if bad:
      where = tuple(int(i) for i in np.unravel_index(
          np.argmin(values) if side == "minimum" else np.argmax(values), values.shape))
      raise ValueError(f"{name} must be {rule}, got a {side} of {worst} at index {where}.")


def check_log_decay(log_decay: Array | None, *dims: int, name: str = "log_decay",
                    per_head: bool = True, per_channel: bool = True) -> None:
  """Checks a log-space decay (gate) for the sequence ops and their steps.

  ``dims`` are the leading sizes and the key dimension: ``(B, T, H, K)`` for a
  sequence, ``(B, H, K)`` for one step. Accepted shapes are ``dims[:-1]`` (one
  scalar per head, when ``per_head``) and ``dims`` (one per key channel, when
  ``per_channel``). The dtype must be floating and, when the value is
  concrete, every entry ``<= 0`` (``-inf``, a decay of exactly zero, is
  legal). Under ``jit``, ``grad`` or ``vmap`` the value is traced and its
  sign cannot be checked: a positive log decay then grows the state by
  ``exp(log_decay)`` per step; wrap the call in ``jax.experimental.checkify``
  with :func:`log_decay_checks` to check traced values.
  """
  if log_decay is None:
    return
  check_float(name, log_decay)
  shapes = ([tuple(dims[:-1])] if per_head else []) + ([tuple(dims)] if per_channel else [])
  if tuple(jnp.shape(log_decay)) not in shapes:
    letters = "BTH" if len(dims) == 4 else "BH"
    want = " or ".join(
        f"{list(s)} ([{', '.join(letters + ('K' if len(s) == len(dims) else ''))}])"
        for s in shapes)
    raise ValueError(f"{name} must have shape {want}, got {list(jnp.shape(log_decay))}.")
  check_range(name, log_decay, high=0.0, what="a decay in log space")


def log_decay_checks(log_decay: Array, name: str = "log_decay") -> None:
  """The sign check of :func:`check_log_decay` for traced values, as a ``checkify`` check.

  Call it inside a function transformed by ``jax.experimental.checkify.checkify``
  (e.g. ``checkify.checkify(lambda g: (log_decay_checks(g), op(q, k, v, g))[1])``);
  the returned error raises with ``err.throw()``.
  """
  from jax.experimental import checkify  # only needed by callers who check traced values
  # ``<= 0`` is False for NaN: a NaN gate fails the check too.
  checkify.check(jnp.all(log_decay <= 0),
                 f"{name} must be <= 0 (a decay in log space) and not NaN.")


def log_zero(dtype) -> float:
  """A finite log decay whose ``exp`` is exactly 0 in ``dtype``: 1.5 times the log of
  the smallest subnormal (-155 in float32, -1117 in float64)."""
  return 1.5 * float(np.log(jnp.finfo(dtype).smallest_subnormal))


def floor_log_decay(g: Array | None) -> Array | None:
  """Replaces ``-inf`` (and anything below :func:`log_zero`) by ``log_zero``.

  A log decay of ``-inf`` (a hard reset, and what ``log(sigmoid(x))``
  underflows to) is exact in a step, ``exp(-inf) = 0``, but cumulative sums
  and their differences turn it into ``-inf - (-inf) = NaN``. Every single
  step below ``log_zero`` already decays by exactly 0 in that dtype, and so
  does every sum containing one, so the floor changes no value; its
  gradient below the floor is 0, as is the recurrence's (``exp(-inf) = 0``).
  """
  if g is None:
    return None
  return jnp.maximum(g, log_zero(g.dtype))


def check_segment_ids(segment_ids: Array | None, batch: int, seq: int) -> None:
  """Raises unless ``segment_ids`` is ``None`` or an integer ``[B, T]`` array."""
  if segment_ids is None:
    return
  check_shape("segment_ids", segment_ids, (batch, seq), "[batch, seq]")
  if not jnp.issubdtype(jnp.result_type(segment_ids), jnp.integer):
    raise ValueError(
        f"segment_ids must be integers, got dtype {jnp.result_type(segment_ids)}."
    )


def check_sequence_args(form: str, chunk_size: int, segment_ids: Array | None, batch: int,
                        seq: int, initial_state: Array | None = None,
                        state_shape: Sequence[int] | None = None, *,
                        auto: bool = False) -> None:
  """The arguments every sequence op shares: ``form`` one of :data:`FORMS` (or ``"auto"``
  where the op resolves it: ``auto=True``, see :func:`resolve_auto_form`), a positive
  ``chunk_size``, ``segment_ids [batch, seq]`` ints and, when ``state_shape`` is given, an
  ``initial_state`` of that shape (ops with a structured state check theirs themselves).

  Raises:
    ValueError: naming the first bad argument, what was expected and what was received.
  """
  check_choice("form", form, FORMS + (("auto",) if auto else ()))
  check_positive_int("chunk_size", chunk_size)
  if state_shape is not None:
    check_state("initial_state", initial_state, state_shape)
  check_segment_ids(segment_ids, batch, seq)


def check_state_parts(name: str, parts, *, step: bool) -> None:
  """Checks the arrays of a tuple state: ``parts`` are ``(index, array, shape, what)``, each
  named ``name[index]`` in errors; ``step`` applies the step functions' stricter dtype check
  (:func:`check_step_state`), otherwise a float array of ``shape``."""
  for part, x, shape, what in parts:
    label = f"{name}[{part}]"
    if step:
      check_step_state(label, x, shape, what)
    else:
      check_shape(label, x, shape, what)
      check_float(label, x)


def check_state(name: str, state: Array | None, expected: Sequence[int]) -> None:
  """Raises unless ``state`` is ``None`` or a floating array of shape ``expected``."""
  if state is None:
    return
  check_shape(name, state, expected, "[batch, heads, key_dim, value_dim]")
  check_float(name, state)


def resolve_scale(scale: float | None, key_dim: int) -> float:
  """``scale=None`` means ``key_dim ** -0.5``."""
  return key_dim**-0.5 if scale is None else scale


def pad_axis(x: Array, multiple: int, axis: int = 1, value=0) -> Array:
  """Pads ``axis`` of ``x`` at the end up to a multiple of ``multiple``."""
  n = x.shape[axis]
  extra = -n % multiple
  if extra == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, extra)
  return jnp.pad(x, widths, constant_values=value)


def pad_segment_ids(segment_ids: Array, multiple: int) -> Array:
  """Pads ``[B, T]`` ids by repeating the last id, so padding continues the last segment."""
  extra = -segment_ids.shape[1] % multiple
  if extra == 0:
    return segment_ids
  return jnp.concatenate(
      [segment_ids, jnp.repeat(segment_ids[:, -1:], extra, axis=1)], axis=1
  )


def segment_starts(segment_ids: Array) -> Array:
  """``[B, T]`` bool: True where a new segment begins (never at ``t = 0``)."""
  # Compare neighbours, then pad: the equivalent ``ids != concat([ids[:, :1], ids[:, :-1]])``
  # lost the start on a device edge when XLA's partitioner sharded it along T (jax 0.10.2,
  # RG-LRU under a SeqContext; tests/ops/test_context.py).
  return jnp.pad(segment_ids[:, 1:] != segment_ids[:, :-1], ((0, 0), (1, 0)))


def segment_index(segment_ids: Array) -> Array:
  """``[B, T]`` int32 running count of segment starts: equal values share a segment.

  Unlike the raw ids, this is monotone, so ``a == b`` for positions ``i <= j``
  means no boundary lies between them even if an id is reused later.
  """
  return jnp.cumsum(segment_starts(segment_ids).astype(jnp.int32), axis=1)


def zero_state(qh: Array, vh: Array) -> Array:
  """A zero ``[B, H, K, V]`` state for ``qh [B, H, T, K]`` and ``vh [B, H, T, V]``.

  Built with ``zeros_like`` of an expression of the inputs rather than
  ``jnp.zeros``, so that inside ``jax.shard_map`` it varies over the same
  mesh axes as the inputs and a ``lax.scan`` carrying it keeps one type.
  """
  return jnp.zeros_like(qh[:, :, 0, :, None] * vh[:, :, 0, None, :])


# Steps per rematerialised chunk of the recurrent forms (see remat_scan).
REMAT_CHUNK = 64


def remat_scan(body, init, xs, chunk: int = REMAT_CHUNK):
  """``lax.scan(body, init, xs)`` over a leading time axis, in rematerialised chunks.

  Each run of ``chunk`` steps is one ``jax.checkpoint``-ed inner scan, so the
  backward pass stores one carry per chunk instead of one per step and
  recomputes the rest: on CPU this is both less memory and faster than
  storing every state. ``xs`` is a pytree of ``[T, ...]`` arrays (``None``
  leaves allowed); the time axis is zero-padded to a multiple of ``chunk``, so
  a zero input must leave the carry unchanged (true of every recurrence
  here: zero keys, values, steps and log decays). Returns ``(carry, ys)``
  with ``ys`` cut back to ``T`` steps.
  """
  t = jax.tree_util.tree_leaves(xs)[0].shape[0]
  c = max(1, min(chunk, t))
  n = -(-t // c)
  split = lambda x: pad_axis(x, c, axis=0).reshape((n, c) + x.shape[1:])
  inner = jax.checkpoint(lambda carry, x: jax.lax.scan(body, carry, x))
  carry, ys = jax.lax.scan(inner, init, jax.tree_util.tree_map(split, xs))
  return carry, jax.tree_util.tree_map(lambda y: y.reshape((n * c,) + y.shape[2:])[:t], ys)


def acc_dtype(*dtypes) -> jnp.dtype:
  """The accumulation dtype: float32 (complex64 for complex inputs), or wider when the inputs are
  (float64 keeps gradient checks precise)."""
  return jnp.promote_types(jnp.result_type(*dtypes), jnp.float32)


# ---------------------------------------------- the delta-rule family's chunk algebra
# Shared by ops.delta, ops.dplr and the Pallas delta kernel (kernels import only this module).


def check_beta(beta: Array, expected, what: str) -> None:
  """Shape, dtype and, when concrete, the range ``0 <= beta <= 2`` (NaN refused)."""
  check_float("beta", beta)
  check_shape("beta", beta, expected, what)
  # I - beta k k^T is non-expansive for unit keys exactly when beta is in [0, 2].
  check_range("beta", beta, low=0.0, high=2.0, what="a write strength")


# Chunks per block of a chunk form's outer scan, per engine: each ``lax.scan`` step runs one
# block of ``block_chunks * chunk_size`` tokens with the state carried, so the per-block working
# set is the same at any length. Measured on a CPU (B=1, H=4, K=V=64, chunk 64, T=4096): the
# DPLR engine's backward through the outer scan took about 0.25 s of CPU time more with 16 than
# with one block of 64; the diagonal-decay engine slices its blocks in place, where 16 kept a
# block in cache. The delta engine runs all chunks at once (no blocks).
BLOCK_CHUNKS = {"decay": 16, "dplr": 64}


def block_chunks(engine: str) -> int:
  """Chunks per block of ``engine``'s chunk form (:data:`BLOCK_CHUNKS`)."""
  check_choice("engine", engine, tuple(BLOCK_CHUNKS))
  return BLOCK_CHUNKS[engine]


def chunk_segments(seg: Array, c: int, seg_prev: Array | None = None):
  """Per-chunk segment masks of packed sequences, shared by the chunk forms.

  Args: ``seg [B, T]`` from :func:`segment_index`, ``c`` the chunk length, ``seg_prev [B]`` the
  segment index of the token before the first (None: the rows start here).
  Returns bools ``(segp [B, 1, N, C], sees_state [B, 1, N, C, 1], to_end [B, 1, N, C, 1],
  carries [B, 1, N])``: the padded indices by chunk, whether a token is in the segment of the
  state entering its chunk, whether it is in its chunk's last segment, and whether a chunk's
  entering state reaches its end.
  """
  segp = pad_segment_ids(seg, c).reshape(seg.shape[0], 1, -1, c)
  first = segp[:, :, :1, 0] if seg_prev is None else seg_prev[:, None, None]
  prev_end = jnp.concatenate([first, segp[:, :, :-1, -1]], axis=2)  # [B, 1, N]
  return (segp, (segp == prev_end[..., None])[..., None], (segp == segp[..., -1:])[..., None],
          segp[..., -1] == prev_end)


def pair_masks(seg_q, seg_k, n: int):
  """Causal masks ``[..., n, n]``: ``j <= i`` and ``j < i``, within one segment."""
  incl = jnp.tril(jnp.ones((n, n), bool))
  if seg_q is not None:
    incl = incl & (seg_q[..., :, None] == seg_k[..., None, :])
  strict = incl & ~jnp.eye(n, dtype=bool)
  return incl, strict


def pair_decay(gc, incl):
  """``exp(G_i - G_j)`` for ``j <= i`` (masked before the ``exp``), else 0; or None."""
  if gc is None:
    return None
  diff = gc[..., :, None] - gc[..., None, :]
  return jnp.exp(jnp.where(incl, diff, -jnp.inf))


@jax.custom_vjp
def unit_lower_inverse(l):
  """``(I + l)^{-1}`` for strictly lower-triangular ``l [..., n, n]``, matmuls only.

  Recursive block inversion: starting from the ``1 x 1`` diagonal blocks, pairs
  of inverted blocks ``A^{-1}, D^{-1}`` with coupling ``C`` (the block of ``l``
  below ``A``) merge into ``[[A^{-1}, 0], [-D^{-1} C A^{-1}, D^{-1}]]``;
  ``log2(n)`` levels of batched matmuls. Used instead of a triangular solve,
  whose CPU custom call is slow and can deadlock XLA's thread pool when two
  run at once (as in the backward pass).
  """
  n = l.shape[-1]
  p = 1 << (n - 1).bit_length()
  if p != n:  # Pad to a power of two; the padding block stays the identity.
    l = jnp.pad(l, [(0, 0)] * (l.ndim - 2) + [(0, p - n), (0, p - n)])
  lead = l.shape[:-2]
  mm = functools.partial(jnp.matmul, precision=lax.Precision.HIGHEST)
  inv = jnp.ones(lead + (p, 1, 1), l.dtype)  # [..., blocks, s, s]
  s = 1
  while s < p:
    nb = p // (2 * s)
    pairs = inv.reshape(lead + (nb, 2, s, s))
    a_inv, d_inv = pairs[..., 0, :, :], pairs[..., 1, :, :]
    # Lower-left s x s block of each 2s x 2s diagonal block of l.
    c = l.reshape(lead + (nb, 2, s, nb, 2, s))[..., :, 1, :, :, 0, :]
    c = jnp.moveaxis(jnp.diagonal(c, axis1=-4, axis2=-2), -1, -3)  # [..., nb, s, s]
    low = -mm(d_inv, mm(c, a_inv))
    top = jnp.concatenate([a_inv, jnp.zeros_like(a_inv)], axis=-1)
    inv = jnp.concatenate([top, jnp.concatenate([low, d_inv], axis=-1)], axis=-2)
    s *= 2
  return inv.reshape(lead + (p, p))[..., :n, :n]


def _unit_lower_inverse_fwd(l):
  x = unit_lower_inverse(l)
  return x, x


def _unit_lower_inverse_bwd(x, dx):
  # X = (I + L)^{-1} gives dX = -X dL X, so dL = -X^T dX X^T, kept on the strictly lower
  # triangle (the only entries of l the inverse reads). Two matmuls, against the six levels
  # of reshapes, diagonals and concatenations that automatic differentiation replays.
  mm = functools.partial(jnp.matmul, precision=lax.Precision.HIGHEST)
  xt = jnp.swapaxes(x, -1, -2)
  n = x.shape[-1]
  return (jnp.where(np.tri(n, k=-1, dtype=bool), -mm(xt, mm(dx, xt)), 0.0),)


unit_lower_inverse.defvjp(_unit_lower_inverse_fwd, _unit_lower_inverse_bwd)


def unit_lower_inverse_rows(l):
  """``(I + l)^{-1}`` by forward substitution, one row at a time (reference path).

  Row ``i`` of the inverse is ``e_i - l_i X`` where only the already final rows
  ``< i`` of ``X`` meet the nonzeros of ``l_i``. ``O(n)`` sequential steps: for
  the parallel form's short inputs only.
  """
  n = l.shape[-1]
  eye = jnp.eye(n, dtype=l.dtype)

  def row(i, x):
    new = eye[i] - jnp.einsum("...j,...jk->...k", l[..., i, :], x,
                              precision=lax.Precision.HIGHEST)
    return x.at[..., i, :].set(new)

  return lax.fori_loop(0, n, row, jnp.zeros_like(l))


def delta_chunk_terms(qh, kh, vh, bh, g, seg, chunk_size: int):
  """The delta rule's state-independent chunk quantities, for all chunks at once.

  Inputs ``[B, H, T, *]`` (``qh`` already scaled), ``bh, g`` ``[B, H, T]``
  (``g`` floored, see :func:`floor_log_decay`, or None), ``seg`` from
  :func:`segment_index` or None. With ``D = U - W S_0`` per chunk (the algebra
  of :mod:`linear_attention.ops.delta`), returns ``(qg, a, u, w, k_end,
  chunk_decay)``: the decayed queries ``Q e^G`` and in-chunk scores ``A``
  (``[B, H, N, C, K]``, ``[B, H, N, C, C]``), ``U`` and ``W`` (``[B, H, N, C,
  V]``, ``[B, H, N, C, K]``), the keys decayed to the chunk's end and the
  chunk's decay (``[B, H, N, C, K]``, ``[B, H, N]``), segment masks folded in.
  Shared by the XLA chunk form and the Pallas kernel (``kernels.chunk_delta``).
  """
  b, h = qh.shape[:2]
  c = chunk_size
  # Padding with beta = 0 and k = 0 (and log_decay = 0) leaves the state as is.
  pad = lambda x: pad_axis(x, c, axis=2)
  qh, kh, vh, bh = pad(qh), pad(kh), pad(vh), pad(bh)
  n = qh.shape[2] // c
  split = lambda x: x.reshape(x.shape[:2] + (n, c) + x.shape[3:])
  qc, kc, vc, bc = split(qh), split(kh), split(vh), split(bh)  # [B, H, N, C, *]

  if seg is not None:
    segp, *masks = chunk_segments(seg, c)
    sees_state, to_end, carries = (m.astype(qh.dtype) for m in masks)
  else:
    segp, sees_state, to_end, carries = None, 1.0, 1.0, 1.0
  incl, strict = pair_masks(segp, segp, c)

  if g is None:
    gc = None
    gamma, gamma_to_end, chunk_decay = 1.0, 1.0, jnp.ones((b, h, n), qh.dtype)
  else:
    gc = jnp.cumsum(split(pad(g)), axis=3)  # in-chunk cumulative, [B, H, N, C]
    gamma = jnp.exp(gc)[..., None]
    gamma_to_end = jnp.exp(gc[..., -1:] - gc)[..., None]
    chunk_decay = jnp.exp(gc[..., -1])
  decay = pair_decay(gc, incl)

  # Everything that does not depend on the entering state, for all chunks at once.
  kk = jnp.einsum("bhnik,bhnjk->bhnij", kc, kc)
  qk = jnp.einsum("bhnik,bhnjk->bhnij", qc, kc)
  if decay is not None:
    kk, qk = kk * decay, qk * decay
  l = jnp.where(strict, bc[..., :, None] * kk, 0.0)
  a = jnp.where(incl, qk, 0.0)
  inv = unit_lower_inverse(l)  # the UT transform (I + L)^{-1}, [B, H, N, C, C]
  beta_col = bc[..., None]
  u = jnp.einsum("bhnij,bhnjv->bhniv", inv, beta_col * vc)
  w = jnp.einsum("bhnij,bhnjk->bhnik", inv, beta_col * gamma * sees_state * kc)
  k_end = kc * gamma_to_end * to_end
  chunk_decay = chunk_decay * carries
  return qc * gamma * sees_state, a, u, w, k_end, chunk_decay


# Sub-chunk length of per-channel decays: the exact in-sub-chunk part costs one exp per
# (pair, channel), S per token; 8 measured 10-15% faster than 16 for GLA at 4k on one core.
_SUBCHUNK = 8


def _subchunk_size(c: int, most: int = _SUBCHUNK) -> int:
  """The largest divisor of the chunk length that is at most ``most``."""
  return max(d for d in range(1, min(c, most) + 1) if c % d == 0)


def _intra_factors(gc):
  """The sub-chunk factors of ``exp(G_i - G_j)`` (``j <= i``) in a chunk, for :func:`intra_scores`.

  Args: ``gc [..., C, K]``, the in-chunk cumulative log decay. With sub-chunks of ``s`` steps
  (``n = C / s``), ``R_I`` the log decay just before sub-chunk ``I`` and ``E_J`` that at the
  end of ``J``, returns ``(row, col, pair)``: ``row [..., n, s, K] = exp(G_i - R_I)``;
  ``col [..., n, C, K] = exp(R_I - G_j)`` for ``j`` before sub-chunk ``I`` (else 0), built as
  ``exp(R_I - E_J) exp(E_J - G_j)`` so it costs ``n^2 + C`` exps per channel, not ``n C``;
  ``pair [..., n, K, s, s] = exp(G_i - G_j)`` for ``j <= i`` inside one sub-chunk (else 0;
  K ahead of the pair axes: with K the minor axis, XLA's CPU backend ran the in-sub-chunk
  contractions as strided matrix-vector products, 3x slower). Every exponent is ``<= 0``.
  """
  c, dk = gc.shape[-2:]
  s = _subchunk_size(c)
  n = c // s
  gs = gc.reshape(gc.shape[:-2] + (n, s, dk))
  ends = gs[..., -1, :]  # E_J, [..., n, K]
  ref = jnp.concatenate([jnp.zeros_like(ends[..., :1, :]), ends[..., :-1, :]], axis=-2)  # R_I
  row = jnp.exp(gs - ref[..., :, None, :])
  below = jnp.tril(jnp.ones((n, n), bool), -1)
  bridge = jnp.exp(jnp.where(below[:, :, None], ref[..., :, None, :] - ends[..., None, :, :],
                             -jnp.inf))  # [..., I, J, K]
  to_end = jnp.exp(ends[..., :, None, :] - gs)  # [..., J, j, K]
  col = (bridge[..., :, :, None, :] * to_end[..., None, :, :, :]).reshape(
      gc.shape[:-2] + (n, c, dk))
  gt = jnp.swapaxes(gs, -1, -2)  # [..., n, K, s]
  tri = jnp.tril(jnp.ones((s, s), bool))
  pair = jnp.exp(jnp.where(tri, gt[..., :, None] - gt[..., None, :], -jnp.inf))
  return row, col, pair


def _intra_parts(x, y, gc):
  """``x, y`` as sub-chunks with the factors applied; shared by the forward and backward."""
  row, col, pair = _intra_factors(gc)
  n, s = row.shape[-3:-1]
  lead = gc.shape[:-2]
  x4 = x.reshape(lead + (x.shape[-3], n, s, x.shape[-1]))  # [..., R, n, s, K]
  y4 = y.reshape(lead + (y.shape[-3], n, s, y.shape[-1]))
  xs = x4 * row[..., None, :, :, :]  # exp(G_i - R_I) x_i
  yt = y[..., :, None, :, :] * col[..., None, :, :, :]  # exp(R_I - G_j) y_j, [..., P, n, C, K]
  return x4, y4, row, xs, yt, col, pair


@jax.custom_vjp
def intra_scores(x, y, gc):
  """Causal in-chunk scores ``sum_k x_ik y_jk exp(G_ik - G_jk)`` (``j <= i``) of every pair of
  ``R`` row and ``P`` column inputs, sharing the decay factors.

  Args: ``x [..., R, C, K]``, ``y [..., P, C, K]``, ``gc [..., C, K]`` the in-chunk cumulative
  log decay. Returns ``[..., R, P, C, C]``, zero above the diagonal.

  Pairs in different sub-chunks ``J < I`` take the start of row sub-chunk ``I`` as the
  reference, ``exp(G_i - R_I) exp(R_I - G_j)`` (one matmul per row sub-chunk); pairs inside one
  sub-chunk take the exact pairwise difference (see :func:`_intra_factors`). The gradient is
  written out (:func:`_intra_bwd`): differentiated automatically, the ``[..., n, s, s, K]``
  products took 40x the forward on a CPU. GLA and log-linear use it; the DPLR engine uses
  :func:`intra_scores_by_diagonals` (why two, with the numbers: there).
  """
  x4, y4, _, xs, yt, _, pair = _intra_parts(x, y, gc)
  r, n, s = x4.shape[-4:-1]
  p, c = y.shape[-3:-1]
  off = jnp.einsum("...rIik,...pIjk->...rpIij", xs, yt)  # zero for j in or after sub-chunk I
  diag = jnp.einsum("...rIik,...Ikij,...pIjk->...rpIij", x4, pair, y4)
  eye = jnp.eye(n, dtype=diag.dtype)
  out = off.reshape(off.shape[:-1] + (n, s)) + diag[..., :, None, :] * eye[:, None, :, None]
  return out.reshape(out.shape[:-6] + (r, p, c, c))


def _intra_fwd(x, y, gc):
  return intra_scores(x, y, gc), (x, y, gc)


def _intra_bwd(res, ds):
  """``dx_i = sum_j dS_ij y_j exp(G_i - G_j)``, ``dy_j = sum_i dS_ij x_i exp(G_i - G_j)``
  through the same factors, and ``dG = sum x dx - sum y dy``: the scores see ``G`` only
  through the differences ``G_i - G_j``."""
  x, y, gc = res
  x4, y4, row, xs, yt, col, pair = _intra_parts(x, y, gc)
  r, n, s = x4.shape[-4:-1]
  p, c = y.shape[-3:-1]
  lead = gc.shape[:-2]
  d5 = ds.reshape(lead + (r, p, n, s, c))
  dd = jnp.einsum("...rpIiJj,IJ->...rpIij", ds.reshape(lead + (r, p, n, s, n, s)),
                  jnp.eye(n, dtype=ds.dtype))  # the diagonal sub-chunk blocks
  dx = (jnp.einsum("...rpIij,...pIjk->...rIik", d5, yt) * row[..., None, :, :, :]
        + jnp.einsum("...rpIij,...Ikij,...pIjk->...rIik", dd, pair, y4))
  dyt = jnp.einsum("...rpIij,...rIik->...pIjk", d5, xs)
  dy = (jnp.sum(dyt * col[..., None, :, :, :], axis=-3)
        + jnp.einsum("...rpIij,...Ikij,...rIik->...pIjk", dd, pair, x4).reshape(y.shape))
  dx = dx.reshape(x.shape)
  return dx, dy, jnp.sum(x * dx, axis=-3) - jnp.sum(y * dy, axis=-3)


intra_scores.defvjp(_intra_fwd, _intra_bwd)


def _diagonal_subchunk(c: int) -> int:
  """Sub-chunk length of :func:`intra_scores_by_diagonals` for chunks of ``c`` steps: the
  largest divisor of ``c`` at most ``sqrt(c)`` (4 for 32, 8 for 64). Pairs in earlier
  sub-chunks cost ``c^2 / (2 s)`` exps per channel and pairs inside one ``c s / 2``, least
  near ``s = sqrt(c)``. Measured (B=1, H=4, K=64, T=4096, one thread, CPU time;
  experiments/bench_scores.py): KDA at 32-step chunks, 4 against 8: 125 against 170 ms
  forward, 427 against 444 ms forward+backward; GLA at 64-step chunks, 8 against 4: 60
  against 55 ms forward, 209 against 263 ms forward+backward."""
  return _subchunk_size(c, math.isqrt(c))


def _diagonal_factors(gc, s: int):
  """The decay factors of :func:`intra_scores_by_diagonals`, from ``gc [..., C, K]`` (the in-chunk
  cumulative log decay) and the sub-chunk length ``s``; every exponent is ``<= 0``.

  Returns ``(rows, cols, bands)``. For each row sub-chunk ``I >= 1`` with reference ``R_I``
  (the log decay just before it): ``rows[I - 1] = exp(G_i - R_I)`` for its ``s`` rows and
  ``cols[I - 1] = exp(R_I - G_j)`` for the ``I s`` columns before it. For each offset
  ``1 <= d < s``: ``bands[d - 1] [..., C, K] = exp(G_i - G_{i-d})`` where ``i - d`` is in the
  sub-chunk of ``i``, else 0 (offset 0 is 1). Only the factors a pair needs are formed: no
  ``[..., C, C, K]`` tensor and no copy of ``y`` per row sub-chunk.
  """
  c = gc.shape[-2]
  rows, cols = [], []
  for i in range(1, c // s):
    ref = gc[..., i * s - 1:i * s, :]
    rows.append(jnp.exp(gc[..., i * s:(i + 1) * s, :] - ref))
    cols.append(jnp.exp(ref - gc[..., :i * s, :]))
  inside = np.arange(c) % s
  bands = [jnp.exp(jnp.where((inside >= d)[:, None], gc - _later(gc, d), -jnp.inf))
           for d in range(1, s)]
  return rows, cols, bands


def _later(z, d: int):
  """``z [..., C, K]`` moved ``d`` steps later along ``C``: ``z_{i-d}``, zeros first."""
  return jnp.pad(z, [(0, 0)] * (z.ndim - 2) + [(d, 0), (0, 0)])[..., :z.shape[-2], :]


def _skew(band):
  """``band [..., s, C]`` (offset ``d``, row ``i``) -> ``[..., C, C]`` with ``band[d, i]`` at
  ``(i, i - d)``: rows padded and re-cut one longer, so row ``i`` moves ``i`` places right."""
  s, c = band.shape[-2:]
  lead = band.shape[:-2]
  w = c + s - 1
  rev = jnp.swapaxes(band[..., ::-1, :], -1, -2)  # [..., C, s], offset s - 1 - e
  flat = jnp.pad(rev, [(0, 0)] * len(lead) + [(0, 0), (0, w + 1 - s)]).reshape(lead + (-1,))
  return flat[..., :c * w].reshape(lead + (c, w))[..., s - 1:]


def _diagonal_apply(x, y, rows, cols, bands):
  """The scores for given factors (:func:`_diagonal_factors`), bilinear in ``x, y``: per row
  sub-chunk one matmul against the columns before it; inside a sub-chunk one diagonal
  ``i - j = d`` at a time, elementwise with ``K`` reduced, placed by :func:`_skew`."""
  c = x.shape[-2]
  s = len(bands) + 1
  lead = x.shape[:-3] + (x.shape[-3], y.shape[-3])
  blocks = [jnp.zeros(lead + (s, c), x.dtype)]
  for i, (row, col) in enumerate(zip(rows, cols), start=1):
    xs = x[..., i * s:(i + 1) * s, :] * row[..., None, :, :]
    yt = y[..., :i * s, :] * col[..., None, :, :]
    blocks.append(jnp.pad(jnp.einsum("...rik,...pjk->...rpij", xs, yt),
                          [(0, 0)] * len(lead) + [(0, 0), (0, c - i * s)]))
  pair = lambda yd: jnp.sum(x[..., :, None, :, :] * yd[..., None, :, :, :], axis=-1)
  near = [pair(y)] + [pair(band[..., None, :, :] * _later(y, d))
                      for d, band in enumerate(bands, start=1)]
  return jnp.concatenate(blocks, axis=-2) + _skew(jnp.stack(near, axis=-2))


@jax.custom_vjp
def intra_scores_by_diagonals(x, y, gc):
  """:func:`intra_scores` computed another way, the DPLR engine's.

  Args and result as :func:`intra_scores`: ``x [..., R, C, K]``, ``y [..., P, C, K]``, ``gc
  [..., C, K]`` -> ``[..., R, P, C, C]``. Sub-chunks of :func:`_diagonal_subchunk` steps
  (about ``sqrt(C)``); pairs in earlier sub-chunks: one matmul per row sub-chunk against only
  the columns before it; pairs inside one sub-chunk: one diagonal ``i - j = d`` at a time,
  elementwise with ``K`` reduced (:func:`_diagonal_factors`). The scores are bilinear in
  ``x, y`` for fixed factors, so the gradient (:func:`_diagonals_bwd`) is that bilinear map's
  plus ``dG = sum x dx - sum y dy`` (``G`` enters only as ``G_i - G_j``): no derivative
  through an ``exp``.

  Why two implementations: neither is faster in every op. Whole-op CPU ms, forward /
  forward+backward, B=1, H=4, K=V=64, T=4096, one thread, each op's default chunk, two runs
  on a loaded 2-core machine (experiments/bench_scores.py; results/bench_scores_cpu*.json):

  ================================  =====  =====================  =====================
  op (row x column inputs)          chunk  intra_scores           by diagonals
  ================================  =====  =====================  =====================
  GLA (1 x 1)                       64     68 / 211, 79 / 227     60 / 209, 69 / 244
  KDA (2 x 1, ``a = -k``)           32     113 / 384, 129 / 410   125 / 427, 126 / 470
  Gated DeltaProduct (2 x 1, R=2)   64     292 / 999              318 / 973
  RWKV-7 (2 x 2)                    32     202 / 584              169 / 579
  ================================  =====  =====================  =====================

  With 4-step sub-chunks at GLA's 64-step chunks (the length before
  :func:`_diagonal_subchunk`), GLA's forward+backward was 263 ms against 209 with 8: that was
  why GLA got slower with this function. Now the two agree within the machine's noise except
  KDA's forward+backward (intra_scores 10-13% faster in both runs, but not DeltaProduct's);
  GLA and log-linear keep :func:`intra_scores`, the DPLR engine this one.
  """
  s = _diagonal_subchunk(gc.shape[-2])
  return _diagonal_apply(x, y, *_diagonal_factors(gc, s))


def _diagonals_fwd(x, y, gc):
  return intra_scores_by_diagonals(x, y, gc), (x, y, gc)


def _diagonals_bwd(res, ds):
  x, y, gc = res
  factors = _diagonal_factors(gc, _diagonal_subchunk(gc.shape[-2]))
  dx, dy = jax.vjp(lambda x, y: _diagonal_apply(x, y, *factors), x, y)[1](ds)
  return dx, dy, jnp.sum(x * dx, axis=-3) - jnp.sum(y * dy, axis=-3)


intra_scores_by_diagonals.defvjp(_diagonals_fwd, _diagonals_bwd)


def intra_scores_vector(q, k, gc):
  """:func:`intra_scores` of one row and one column input: ``q, k, gc [..., C, K]`` ->
  ``[..., C, C]``."""
  return intra_scores(q[..., None, :, :], k[..., None, :, :], gc)[..., 0, 0, :, :]


def dplr_chunk_terms(qh, kh, vh, ah, bh, g, seg, chunk_size: int, seg_prev=None):
  """The DPLR engine's state-independent chunk quantities, for all chunks at once.

  Inputs are flat sub-steps ``[B, H, T, *]`` (``qh`` already scaled; ``ah`` None
  means ``a = -k``, the delta-rule maps', whose scores are then computed once:
  ``A_qa = -A_qk``, ``L_ba = -L_bk``; ``g``
  ``[B, H, T, K]`` floored, see :func:`floor_log_decay`, or None), ``seg``
  from :func:`segment_index` or None, ``seg_prev [B]`` the segment index of the
  sub-step before the first (None: the rows start here). With the algebra of
  :mod:`linear_attention.ops.dplr` (``U = U_0 + W S_0`` per chunk), returns
  ``(qg, a_qa, a_qk, u0, w, a_end, k_end, chunk_decay)``: the decayed queries
  ``Q e^G`` ``[B, H, N, C, K]``, the in-chunk scores ``A_qa, A_qk`` ``[B, H,
  N, C, C]``, ``U_0`` ``[B, H, N, C, V]`` and ``W`` ``[B, H, N, C, K]``, the
  correction and write keys decayed to the chunk's end (``[B, H, N, C, K]``)
  and the chunk's decay ``[B, H, N, K]``, segment masks folded in. Per chunk::

      O = Qg S_0 + A_qa U + A_qk V      S_C = chunk_decay * S_0 + a_end^T U + k_end^T V

  Built for the Pallas kernel (``kernels.chunk_dplr``) in the shape the XLA
  chunk form of ``ops.dplr`` needs too.
  """
  c = chunk_size
  # Padding with zeros (no decay, no correction, no write) leaves the state as is.
  pad = lambda x: pad_axis(x, c, axis=2)
  n = pad(qh).shape[2] // c
  split = lambda x: pad(x).reshape(x.shape[:2] + (n, c) + x.shape[3:])
  neg_k = ah is None
  qc, kc, vc, bc = (split(x) for x in (qh, kh, vh, bh))  # [B, H, N, C, *]
  gc = jnp.cumsum(split(jnp.zeros_like(kh) if g is None else g), axis=3)  # inclusive
  ge = jnp.concatenate([jnp.zeros_like(gc[..., :1, :]), gc[..., :-1, :]], axis=3)  # exclusive
  last = gc[..., -1, :]  # [B, H, N, K]

  if seg is not None:
    segp, sees_state, to_end, carries = chunk_segments(seg, c, seg_prev)
    sees_state, to_end = sees_state.astype(qc.dtype), to_end.astype(qc.dtype)
    carries = carries[..., None].astype(qc.dtype)  # [B, 1, N, 1]
  else:
    segp, sees_state, to_end, carries = None, 1.0, 1.0, 1.0
  incl, strict = pair_masks(segp, segp, c)

  # In-chunk scores, all chunks at once. L_xy[i, j] = A-style score of (b_i, y_j)
  # with the rows' decay stopped one step earlier: b moved one row back, then down.
  # One call for the four (two when a = -k): they share the decay factors, the costly part
  # on a CPU.
  b_next = jnp.concatenate([bc[..., 1:, :], jnp.zeros_like(bc[..., :1, :])], axis=3)
  cols = [kc] if neg_k else [kc, split(ah)]
  scores = intra_scores_by_diagonals(jnp.stack([qc, b_next], axis=3), jnp.stack(cols, axis=3),
                                     gc)
  down = lambda m: jnp.concatenate([jnp.zeros_like(m[..., :1, :]), m[..., :-1, :]], axis=-2)
  a_qk = jnp.where(incl, scores[..., 0, 0, :, :], 0.0)
  l_bk = jnp.where(strict, down(scores[..., 1, 0, :, :]), 0.0)
  if neg_k:
    a_qa, l_ba = -a_qk, -l_bk
  else:
    a_qa = jnp.where(incl, scores[..., 0, 1, :, :], 0.0)
    l_ba = jnp.where(strict, down(scores[..., 1, 1, :, :]), 0.0)
  inv = unit_lower_inverse(-l_ba)  # the UT transform (I - L_ba)^{-1}
  w = inv @ (bc * jnp.exp(ge) * sees_state)
  u0 = inv @ (l_bk @ vc)
  decay_to_end = jnp.exp(last[..., None, :] - gc) * to_end
  k_end = kc * decay_to_end
  a_end = -k_end if neg_k else split(ah) * decay_to_end
  return (qc * jnp.exp(gc) * sees_state, a_qa, a_qk, u0, w, a_end, k_end,
          jnp.exp(last) * carries)


def check_dplr_inputs(q, k, v, a, b, log_decay):
  """The DPLR engine's array checks (``ops.dplr_attention``, ``kernels.chunk_dplr``):
  floats; ``q [B, T, H, K]``; ``k, a, b`` ``[B, T, H, K]`` or ``[B, T, H, R, K]``; ``v``
  with the same leading axes; ``log_decay`` None, ``[B, T, H]`` or ``[B, T, H, K]``.
  Returns ``(B, T, H, K, V)``; raises a ValueError naming the first bad argument."""
  for name, x in (("q", q), ("k", k), ("v", v), ("a", a), ("b", b)):
    check_float(name, x)
  check_rank("q", q, 4)
  bsz, t, h, dk = q.shape
  check_seq_len(t, "axis 1 of q")
  if jnp.ndim(a) not in (4, 5):
    raise ValueError("a must have shape [B, T, H, K] (rank one) or [B, T, H, R, K] (R "
                     f"sub-steps per token), got {list(jnp.shape(a))}.")
  lead = (bsz, t, h) + ((a.shape[3],) if jnp.ndim(a) == 5 else ())
  letters = "[B, T, H, R, *]" if len(lead) == 4 else "[B, T, H, *]"
  for name, x in (("a", a), ("b", b), ("k", k)):
    check_shape(name, x, lead + (dk,), f"{letters} with B, T, H, K of q and R of a")
  check_shape("v", v, lead + (None,), f"{letters} with B, T, H of q and R of a")
  check_log_decay(log_decay, bsz, t, h, dk)
  return bsz, t, h, dk, v.shape[-1]
