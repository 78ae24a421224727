"""Argument checks shared by every op: each raises a ``ValueError`` that names the
argument, what was expected and what was received."""

from __future__ import annotations

from typing import Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

# The forms every engine offers (``"auto"`` is resolved by :mod:`.forms`).
FORMS = ("parallel", "chunk", "recurrent")


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
              names: Sequence[str] = ("q", "k", "v"), *,
              grouped: bool = False) -> tuple[int, int, int, int, int]:
  """Checks ``q, k: [B,T,H,K]`` and ``v: [B,T,H,V]``; returns ``(B, T, H, K, V)``.

  ``names`` renames the arguments in messages (e.g. RWKV's ``r`` for ``q``).
  ``grouped``: ``v`` may have any multiple ``Hv`` of the ``H`` heads of ``q, k``
  (grouped value heads, :func:`check_value_groups`); ``H`` is still that of ``q``.
  """
  nq, nk, nv = names
  for name, x in ((nq, q), (nk, k), (nv, v)):
    check_rank(name, x, 4)
    check_float(name, x)
  b, t, h, dk = q.shape
  check_seq_len(t, f"axis 1 of {nq}")
  check_shape(nk, k, (b, t, h, dk), f"the shape of {nq}")
  check_shape(nv, v, (b, t, None if grouped else h, None),
              f"batch, seq{'' if grouped else ' and heads'} of {nq}")
  if grouped:
    check_value_groups(nv, v.shape[2], h, f"{nq} and {nk}")
  check_same_dtype(**{nq: q, nk: k, nv: v})
  return b, t, h, dk, v.shape[-1]


def check_value_groups(name: str, hv: int, hk: int, of: str = "q and k") -> int:
  """Grouped value heads: raises unless ``hv`` (the heads of ``name``) is a multiple of
  the ``hk`` heads of ``of``; returns the group size ``hv // hk``. Value head ``h``
  reads query/key head ``h // (hv // hk)`` (transformers' ``repeat_interleave``)."""
  if hv < hk or hv % hk:
    raise ValueError(f"{name} must have a multiple of the {hk} heads of {of} (grouped value "
                     f"heads), got {hv} heads.")
  return hv // hk


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
                   names: Sequence[str] = ("q", "k", "v"), *,
                   grouped: bool = False) -> tuple[int, int, int, int]:
  """The one-token twin of :func:`check_qkv`: ``q, k: [B, H, K]``, ``v: [B, H, V]``.

  Returns ``(B, H, K, V)``. ``names`` renames the arguments in messages (e.g.
  RWKV's ``r`` for ``q``); ``grouped`` as in :func:`check_qkv`.
  """
  nq, nk, nv = names
  for name, x in ((nq, q), (nk, k), (nv, v)):
    check_rank(name, x, 3)
    check_float(name, x)
  b, h, dk = q.shape
  check_shape(nk, k, (b, h, dk), f"the shape of {nq}")
  check_shape(nv, v, (b, None if grouped else h, None),
              f"batch{'' if grouped else ' and heads'} of {nq}")
  if grouped:
    check_value_groups(nv, v.shape[1], h, f"{nq} and {nk}")
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
  """``scale=None`` means ``key_dim ** -0.5``; a given scale must be finite and positive
  (checked when concrete: a NaN or infinite scale would only show as NaN outputs)."""
  if scale is None:
    return key_dim**-0.5
  value = concrete(scale)
  if value is not None and (value.size != 1 or not np.isfinite(value).all() or value <= 0):
    raise ValueError(f"scale must be a finite number > 0 (or None for K ** -0.5 = "
                     f"{key_dim**-0.5:g}), got {scale!r}.")
  return scale


def check_beta(beta: Array, expected, what: str) -> None:
  """Shape, dtype and, when concrete, the range ``0 <= beta <= 2`` (NaN refused)."""
  check_float("beta", beta)
  check_shape("beta", beta, expected, what)
  # I - beta k k^T is non-expansive for unit keys exactly when beta is in [0, 2].
  check_range("beta", beta, low=0.0, high=2.0, what="a write strength")
