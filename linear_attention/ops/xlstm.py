"""mLSTM, the matrix-memory cell of xLSTM (Beck et al. 2024, arXiv:2405.04517).

Per batch row and head, with an exponential input gate ``i_t = exp(i~_t)`` and
a sigmoid (``f_t = sigmoid(f~_t)``) or exponential (``f_t = exp(f~_t)``)
forget gate::

    C_t = f_t C_{t-1} + i_t k_t v_t^T        n_t = f_t n_{t-1} + i_t k_t
    h_t = C_t^T q~_t / max(|n_t^T q~_t|, 1)  with q~_t = scale * q_t

(the paper scales the key by ``1/sqrt(K)``; scaling the query is the same).
Exponential gates overflow, so the state is kept divided by ``exp(m_t)``,
the max-stabiliser ``m_t = max(log f_t + m_{t-1}, i~_t)``. Stored states are
``C_t exp(-m_t)`` and ``n_t exp(-m_t)``, and the read becomes
``h_t = C_t^T q~_t / max(|n_t^T q~_t|, exp(-m_t))``: the same value for any
``m``, which only keeps every exponent bounded.

State layout: a tuple ``(C [B, H, K, V], n [B, H, K], m [B, H])``, float32,
holding the *stabilised* ``C`` and ``n``. A fresh state is ``(0, 0, -inf)``
(:func:`init_mlstm_state`), which is also what a segment start resets to: an
empty memory has no scale, and ``m = -inf`` keeps it out of the max. (The
xLSTM code starts from ``m = 0``: the same memory, but its stabiliser then
follows the empty state, which an exponential forget gate ``> 1`` grows until
every real term underflows.)

Two options reproduce other codes exactly (xLSTM-7B as transformers and the
``xlstm`` package run it uses both):

- ``eps``: added to the stabilised denominator, ``h_t = C_t^T q~_t /
  (max(|n_t^T q~_t|, exp(-m_t)) + eps)`` (``1e-6`` in xLSTM-7B, ``0`` by
  default). In unstabilised terms that is ``eps * exp(m_t)``, so with ``eps > 0``
  the output depends on ``m``.
- ``initial_m``: the stabiliser of a fresh state (``-inf`` here by default; ``0``
  in xLSTM-7B). The memory is the same and so is the read without ``eps``; with
  ``eps`` it changes every later ``m`` that the fresh value still bounds.

On the diagonal-decay engine: with ``m`` known, the stabilised recurrence is
the engine's with the per-head log decay ``log f_t + m_{t-1} - m_t <= 0``, the
key ``k_t exp(i~_t - m_t)`` (a factor ``<= 1``) and the value ``[v_t, 1]``
(its last column carries ``n``). ``m`` itself is a max-plus linear
recurrence, computed with ``lax.associative_scan``. The ``parallel`` and
``chunk`` forms call the engine's forms; ``recurrent`` scans
:func:`mlstm_step`'s update token by token.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from linear_attention import common
from linear_attention.engines import context as context_lib
from linear_attention.ops import decay
from linear_attention.engines.context import SeqContext

Array = jax.Array

FORGET_GATES = ("sigmoid", "exp")


# --------------------------------------------------------------------- checks


def _check_gates(i_gate, f_gate, lead, forget_gate):
  want = "[" + ", ".join("BTH" if len(lead) == 3 else "BH") + "]"
  for name, g in (("i_gate", i_gate), ("f_gate", f_gate)):
    common.check_float(name, g)
    common.check_shape(name, g, lead, f"{want}, one pre-activation per head")
  common.check_choice("forget_gate", forget_gate, FORGET_GATES)


def _check_state(name: str, state, b: int, h: int, dk: int, dv: int, step: bool) -> None:
  """``state`` must be ``(C [B,H,K,V], n [B,H,K], m [B,H])`` (float32/64 for a step)."""
  if not isinstance(state, (tuple, list)) or len(state) != 3:
    raise ValueError(f"{name} must be a tuple (C [B, H, K, V], n [B, H, K], m [B, H]), "
                     f"got {type(state).__name__}"
                     + (f" of length {len(state)}" if isinstance(state, (tuple, list)) else "")
                     + ".")
  common.check_state_parts(name, ((0, state[0], (b, h, dk, dv), "C, [B, H, K, V]"),
                                  (1, state[1], (b, h, dk), "n, [B, H, K]"),
                                  (2, state[2], (b, h), "m, [B, H]")), step=step)


# ------------------------------------------------------------------ numerics


def _log_gates(i_gate, f_gate, forget_gate, acc):
  """``(log i, log f)`` in ``acc``, floored at :func:`common.log_zero` (so ``-inf``,
  a gate of exactly zero, never meets ``-inf - (-inf)``)."""
  log_i = i_gate.astype(acc)
  f = f_gate.astype(acc)
  log_f = jax.nn.log_sigmoid(f) if forget_gate == "sigmoid" else f
  return common.floor_log_decay(log_i), common.floor_log_decay(log_f)


def check_mlstm_options(eps, initial_m) -> None:
  """``ValueError`` naming the argument unless ``eps`` is a finite number >= 0 and
  ``initial_m`` a real number or ``-inf`` (the options of :func:`mlstm`)."""
  if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 <= eps < np.inf:
    raise ValueError(f"eps must be a finite number >= 0, got {eps!r}.")
  if (isinstance(initial_m, bool) or not isinstance(initial_m, (int, float))
      or np.isnan(initial_m) or initial_m == np.inf):
    raise ValueError(f"initial_m must be a real number or -inf (a fresh state's stabiliser), "
                     f"got {initial_m!r}.")


def _read(num, den, m, eps=0.0):
  """``num / (max(|den|, exp(-m)) + eps)`` without overflow for any ``m``.

  For ``m < 0``, numerator and denominator are both multiplied by ``exp(m)``
  (``<= 1``), so neither ``exp(-m)`` nor its gradient can overflow.
  """
  s = jnp.exp(jnp.minimum(m, 0.0))[..., None]
  floor = jnp.exp(-jnp.maximum(m, 0.0))[..., None]
  denom = jnp.maximum(jnp.abs(den)[..., None] * s, floor)
  if eps:
    denom = denom + eps * s
  # exp(-m) underflows to 0 only for m > 103; keep 0 / 0 out even then.
  denom = jnp.maximum(denom, jnp.finfo(denom.dtype).tiny)
  return num * s / denom


def _update(q, k, v, log_i, log_f, state, eps=0.0):
  """One stabilised step on ``[B, H, *]`` arrays (``q`` scaled); returns ``(h, state)``."""
  c, n, m = state
  m_new = jnp.maximum(log_f + m, log_i)
  # Both exponents are <= 0 by the max; min() guards the last rounding bit.
  f_w = jnp.exp(jnp.minimum(log_f + m - m_new, 0.0))
  i_w = jnp.exp(jnp.minimum(log_i - m_new, 0.0))
  c = f_w[..., None, None] * c + (i_w[..., None] * k)[..., :, None] * v[..., None, :]
  n = f_w[..., None] * n + i_w[..., None] * k
  num = jnp.einsum("bhk,bhkv->bhv", q, c)
  den = jnp.einsum("bhk,bhk->bh", q, n)
  return _read(num, den, m_new, eps), (c, n, m_new)


def _stabiliser(log_i, log_f, m0, starts, initial_m=-np.inf):
  """``m_t = max(log f_t + m_{t-1}, log i_t)`` for ``[B, T, H]`` gates.

  ``m_{-1} = m0 [B, H]`` and ``m_{t-1} = initial_m`` (a fresh state) at a segment
  start. Each step is the max-plus affine map ``m -> max(a + m, b)``; maps
  compose associatively. Returns ``(m, m_prev)``, both ``[B, T, H]``.
  """
  start = starts[..., None]
  a = jnp.where(start, -jnp.inf, log_f)  # a start forgets m_{t-1}
  # ... and reads the fresh stabiliser instead (log_i alone for -inf).
  b = log_i if initial_m == -np.inf else jnp.where(
      start, jnp.maximum(log_i, log_f + initial_m), log_i)

  def compose(x, y):
    a1, b1 = x
    a2, b2 = y
    return a1 + a2, jnp.maximum(a2 + b1, b2)

  a_cum, b_cum = lax.associative_scan(compose, (a, b), axis=1)
  m = jnp.maximum(a_cum + m0[:, None], b_cum)
  m_prev = jnp.concatenate([m0[:, None], m[:, :-1]], axis=1)
  return m, jnp.where(start, jnp.asarray(initial_m, m.dtype), m_prev)


# -------------------------------------------------------------------- the op


def mlstm(q: Array, k: Array, v: Array, i_gate: Array, f_gate: Array, *,
          forget_gate: str = "sigmoid", scale: float | None = None, form: str = "chunk",
          chunk_size: int = 64, initial_state: tuple[Array, Array, Array] | None = None,
          return_state: bool = False, segment_ids: Array | None = None,
          implementation: str | None = None, context: SeqContext | None = None,
          eps: float = 0.0, initial_m: float = -np.inf):
  """The mLSTM cell of xLSTM, stabilised, over a sequence (see the module doc).

  Args:
    q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``.
    i_gate: ``[B, T, H]`` input-gate pre-activations ``i~`` (``i = exp(i~)``;
      any real value, ``-inf`` means the token is not written).
    f_gate: ``[B, T, H]`` forget-gate pre-activations ``f~`` (any real value;
      ``-inf`` is a hard reset of the memory).
    forget_gate: ``"sigmoid"`` (``f = sigmoid(f~)``, default) or ``"exp"``
      (``f = exp(f~)``).
    scale: query scale; ``None`` means ``K ** -0.5``.
    form: ``"chunk"`` (default), ``"parallel"`` (the engine's forms) or
      ``"recurrent"`` (token by token).
    chunk_size: chunk length of the chunk form.
    initial_state: optional ``(C [B, H, K, V], n [B, H, K], m [B, H])``;
      ``None`` is the fresh state of :func:`init_mlstm_state`.
    return_state: also return the final state.
    segment_ids: optional ``[B, T]`` ints; the state resets to a fresh one where
      the id changes (``initial_state`` reaches the first segment of each row).
    implementation: the engine's kernel choice for the chunk form (see
      :func:`~linear_attention.ops.decay.decay_linear_attention`).
    context: None, or a :class:`~linear_attention.ops.context.SeqContext`: the
      sequence split over a mesh axis. The stabiliser ``m`` (a max-plus scan over
      the ``[B, T, H]`` gates) runs on the global arrays, the matrix memory on the
      engine's context (every form, ``"recurrent"`` as the engine's). Global
      arrays only (not inside ``jax.shard_map``).
    eps: added to the read's stabilised denominator (xLSTM-7B: ``1e-6``).
    initial_m: the stabiliser of a fresh state, used when ``initial_state`` is None
      and at every segment start (``-inf``, default, or xLSTM-7B's ``0``).

  Returns:
    ``h`` ``[B, T, H, V]`` in the dtype of ``q``, or ``(h, (C, n, m))`` with
    the float32 state of the last segment.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 1, 8, 2, 4))
    >>> i_gate, f_gate = jax.random.normal(jax.random.key(1), (2, 1, 8, 2))  # [B, T, H]
    >>> h = ops.mlstm(q, k, v, i_gate, f_gate)
    >>> h.shape
    (1, 8, 2, 4)
    >>> bool(jnp.allclose(h, ops.mlstm(q, k, v, i_gate, f_gate, form="recurrent"), atol=1e-5))
    True
  """
  b, t, h, dk, dv = common.check_qkv(q, k, v)
  _check_gates(i_gate, f_gate, (b, t, h), forget_gate)
  check_mlstm_options(eps, initial_m)
  eps, initial_m = float(eps), float(initial_m)
  common.check_sequence_args(form, chunk_size, segment_ids, b, t)
  context_lib.check_context(context)
  if context is not None and context.is_local:
    raise ValueError("context: mlstm's stabiliser is a running maximum over the whole "
                     "sequence; call it on the global arrays (outside jax.shard_map over "
                     f"{context.axis_name!r}).")
  if initial_state is not None:
    _check_state("initial_state", initial_state, b, h, dk, dv, step=False)
  scale = common.resolve_scale(scale, dk)
  acc = common.acc_dtype(q.dtype)
  if initial_state is None:
    s0 = (jnp.zeros((b, h, dk, dv), acc), jnp.zeros((b, h, dk), acc),
          jnp.full((b, h), initial_m, acc))
  else:
    s0 = tuple(x.astype(acc) for x in initial_state)
  starts = (jnp.zeros((b, t), bool) if segment_ids is None
            else common.segment_starts(segment_ids))
  if form == "recurrent" and context is None:
    o, state = _recurrent(q, k, v, i_gate, f_gate, s0, starts, forget_gate=forget_gate,
                          scale=scale, eps=eps, initial_m=initial_m)
  else:
    o, state = _on_engine(q, k, v, i_gate, f_gate, s0, starts, segment_ids,
                          forget_gate=forget_gate, scale=scale, form=form,
                          chunk_size=chunk_size, implementation=implementation,
                          context=context, eps=eps, initial_m=initial_m)
  o = o.astype(q.dtype)
  return (o, state) if return_state else o


@functools.partial(jax.jit, static_argnames=("forget_gate", "scale", "form", "chunk_size",
                                             "implementation", "context", "eps", "initial_m"))
def _on_engine(q, k, v, i_gate, f_gate, s0, starts, segment_ids, *, forget_gate, scale, form,
               chunk_size, implementation, context, eps, initial_m):
  acc = s0[0].dtype
  log_i, log_f = _log_gates(i_gate, f_gate, forget_gate, acc)
  m, m_prev = _stabiliser(log_i, log_f, s0[2], starts, initial_m)
  log_decay = jnp.minimum(log_f + m_prev - m, 0.0)
  k_in = k.astype(acc) * jnp.exp(jnp.minimum(log_i - m, 0.0))[..., None]
  v_aug = jnp.concatenate([v.astype(acc), jnp.ones(v.shape[:-1] + (1,), acc)], axis=-1)
  init = jnp.concatenate([s0[0], s0[1][..., None]], axis=-1)
  o, state = decay.decay_linear_attention(
      q.astype(acc), k_in, v_aug, log_decay, scale=scale, form=form, chunk_size=chunk_size,
      initial_state=init, return_state=True, segment_ids=segment_ids,
      implementation=implementation, context=context)
  h = _read(o[..., :-1], o[..., -1], m, eps)
  return h, (state[..., :-1], state[..., -1], m[:, -1])


@functools.partial(jax.jit, static_argnames=("forget_gate", "scale", "eps", "initial_m"))
def _recurrent(q, k, v, i_gate, f_gate, s0, starts, *, forget_gate, scale, eps, initial_m):
  acc = s0[0].dtype
  log_i, log_f = _log_gates(i_gate, f_gate, forget_gate, acc)
  move = lambda x: jnp.moveaxis(x, 1, 0)
  real = jnp.ones(starts.shape[1:], bool)  # False on remat_scan's padding: a no-op step there
  xs = (move(q.astype(acc) * scale), move(k.astype(acc)), move(v.astype(acc)), move(log_i),
        move(log_f), starts.T, real)

  def body(state, x):
    q_t, k_t, v_t, li_t, lf_t, start, ok = x
    state = tuple(jnp.where(start.reshape((-1,) + (1,) * (s.ndim - 1)), fresh, s)
                  for s, fresh in zip(state, (0.0, 0.0, initial_m)))
    o_t, new = _update(q_t, k_t, v_t, li_t, lf_t, state, eps)
    new = tuple(jnp.where(ok, a, b) for a, b in zip(new, state))
    return new, o_t

  state, o = common.remat_scan(body, s0, xs)
  return jnp.moveaxis(o, 0, 1), state


def mlstm_step(state: tuple[Array, Array, Array], q: Array, k: Array, v: Array, i_gate: Array,
               f_gate: Array, *, forget_gate: str = "sigmoid", scale: float | None = None,
               eps: float = 0.0):
  """One decoding step of :func:`mlstm`.

  Args:
    state: ``(C [B, H, K, V], n [B, H, K], m [B, H])`` float32 (or float64);
    q, k: ``[B, H, K]``; v: ``[B, H, V]``; i_gate, f_gate: ``[B, H]``
      pre-activations; forget_gate, scale, eps: as in :func:`mlstm` (a fresh state
      with another ``initial_m`` comes from :func:`init_mlstm_state`).

  Returns:
    ``(h, new_state)``: ``h`` ``[B, H, V]`` in the dtype of ``q``, the state
    in its own dtype.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 1, 8, 2, 4))
    >>> i_gate, f_gate = jax.random.normal(jax.random.key(1), (2, 1, 8, 2))  # [B, T, H]
    >>> state = ops.init_mlstm_state(1, 2, 4, 4)
    >>> for t in range(8):
    ...   h, state = ops.mlstm_step(state, q[:, t], k[:, t], v[:, t], i_gate[:, t], f_gate[:, t])
    >>> h.shape
    (1, 2, 4)
    >>> bool(jnp.allclose(h, ops.mlstm(q, k, v, i_gate, f_gate)[:, 7], atol=1e-5))
    True
  """
  common.check_step_state_first(state, "(C [B, H, K, V], n [B, H, K], m [B, H])", 4, 3, 2)
  b, h, dk, dv = common.check_step_qkv(q, k, v)
  _check_gates(i_gate, f_gate, (b, h), forget_gate)
  _check_state("state", state, b, h, dk, dv, step=True)
  check_mlstm_options(eps, 0.0)
  acc = jnp.result_type(*state)
  state = tuple(x.astype(acc) for x in state)
  log_i, log_f = _log_gates(i_gate, f_gate, forget_gate, acc)
  scale = common.resolve_scale(scale, dk)
  o, new = _update(q.astype(acc) * scale, k.astype(acc), v.astype(acc), log_i, log_f, state,
                   float(eps))
  return o.astype(q.dtype), new


def init_mlstm_state(batch: int, heads: int, key_dim: int, value_dim: int,
                     initial_m: float = -np.inf):
  """A fresh mLSTM state: ``(C [B, H, K, V], n [B, H, K], m [B, H])`` float32, ``C`` and
  ``n`` zero and ``m = initial_m`` (``-inf`` by default; xLSTM-7B's is ``0``, see the
  module doc).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> C, n, m = ops.init_mlstm_state(1, 2, 4, 3)
    >>> C.shape, n.shape, m.shape
    ((1, 2, 4, 3), (1, 2, 4), (1, 2))
    >>> bool(jnp.isneginf(m).all())  # the stabiliser of an empty memory
    True
  """
  for name, x in (("batch", batch), ("heads", heads), ("key_dim", key_dim),
                  ("value_dim", value_dim)):
    common.check_positive_int(name, x)
  check_mlstm_options(0.0, initial_m)
  f32 = np.float32
  return (jnp.zeros((batch, heads, key_dim, value_dim), f32),
          jnp.zeros((batch, heads, key_dim), f32), jnp.full((batch, heads), initial_m, f32))
