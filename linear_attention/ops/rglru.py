"""The Real-Gated Linear Recurrent Unit of Hawk and Griffin (De et al., 2024).

Per channel, with ``r_t = sigmoid(gate_r)`` and ``i_t = sigmoid(gate_i)``::

    a_t = sigmoid(Lambda) ** (c * r_t)
    h_t = a_t * h_{t-1} + sqrt(1 - a_t**2) * (i_t * x_t)

It is the elementwise scan of :mod:`linear_attention.ops.scan` with those
``a`` and ``b``. ``a`` is formed in log space,
``log a_t = -c * r_t * softplus(-Lambda)``, and ``1 - a_t**2`` as
``-expm1(2 log a_t)``, which keeps full precision when ``a_t`` is close to 1.
The square root's derivative is bounded (it is infinite at 0, reached when
``a_t`` rounds to 1), so gradients stay finite.

Document starts follow recurrentgemma: at the first token of a document the
state is reset and the normaliser ``sqrt(1 - a**2)`` is replaced by 1, so the
first output is ``i_t * x_t``. A document starts where ``segment_ids`` change,
and at ``t = 0`` when no ``h0`` is given (a given ``h0`` means the call
continues a document). recurrentgemma's ``a_param`` is ``-Lambda`` here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from linear_attention import common
from linear_attention.engines import context as context_lib
from linear_attention.engines.context import SeqContext
from linear_attention.ops import scan as scan_lib

Array = jax.Array

# Largest derivative allowed for sqrt(1 - a^2), as in recurrentgemma.
_MAX_SQRT_GRADIENT = 1000.0


@jax.custom_jvp
def _sqrt_bounded(x):
  return jnp.sqrt(x)


@_sqrt_bounded.defjvp
def _sqrt_bounded_jvp(primals, tangents):
  (x,), (dx,) = primals, tangents
  floor = 1.0 / (4.0 * _MAX_SQRT_GRADIENT**2)
  return jnp.sqrt(x), dx * 0.5 / jnp.sqrt(jnp.maximum(x, floor))


def _gates(x, gate_r, gate_i, log_lambda_param, c, acc):
  """``(log a, normalised input)`` in ``acc``; the normaliser not yet reset."""
  r = jax.nn.sigmoid(gate_r.astype(acc))
  i = jax.nn.sigmoid(gate_i.astype(acc))
  log_a = -c * r * jax.nn.softplus(-log_lambda_param.astype(acc))
  mult = _sqrt_bounded(-jnp.expm1(2.0 * log_a))
  return log_a, mult, i * x.astype(acc)


def _check(x, gate_r, gate_i, log_lambda_param, c):
  common.check_float("x", x)
  for name, g in (("gate_r", gate_r), ("gate_i", gate_i)):
    common.check_float(name, g)
    common.check_shape(name, g, x.shape, "the shape of x")
  common.check_float("log_lambda_param", log_lambda_param)
  common.check_shape("log_lambda_param", log_lambda_param, (x.shape[-1],), "[D]")
  if not isinstance(c, jax.core.Tracer) and not float(c) > 0:
    raise ValueError(f"c must be > 0, got {c!r}.")


def rg_lru(
    x: Array,
    gate_r: Array,
    gate_i: Array,
    log_lambda_param: Array,
    *,
    c: float = 8.0,
    h0: Array | None = None,
    form: str = "chunk",
    chunk_size: int = 64,
    segment_ids: Array | None = None,
    return_state: bool = False,
    context: SeqContext | None = None,
):
  """The RG-LRU over a sequence.

  Args:
    x: ``[B, T, D]`` inputs.
    gate_r: ``[B, T, D]`` recurrence-gate logits (``r = sigmoid(gate_r)``).
    gate_i: ``[B, T, D]`` input-gate logits (``i = sigmoid(gate_i)``).
    log_lambda_param: ``[D]`` the parameter ``Lambda``; ``a = sigmoid(Lambda) ** (c r)``.
    c: the fixed temperature (8 in the paper).
    h0: optional ``[B, D]`` state; given, the call continues a document (the
      first token is normalised); None, ``t = 0`` starts a document.
    form: a form of :func:`linear_attention.ops.scan.linear_scan`.
    chunk_size: chunk length of the chunk form.
    segment_ids: optional ``[B, T]`` ints; each new segment starts a document.
    return_state: also return the final state.
    context: None, or a :class:`~linear_attention.ops.context.SeqContext`: the
      sequence split over a mesh axis (the scan engine's context). Global arrays
      only: the first token of each document is normalised, which a device's
      slice cannot tell on its own.

  Returns:
    ``h`` ``[B, T, D]`` in the dtype of ``x``, or ``(h, state)`` with ``state``
    ``[B, D]`` float32.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> x, gate_r, gate_i = jax.random.normal(jax.random.key(0), (3, 1, 8, 3))  # [B, T, D]
    >>> lam = jnp.full((3,), 2.0)  # a = sigmoid(lam) ** (c r)
    >>> h = ops.rg_lru(x, gate_r, gate_i, lam)
    >>> h.shape
    (1, 8, 3)
    >>> bool(jnp.allclose(h, ops.rg_lru(x, gate_r, gate_i, lam, form="recurrent"), atol=1e-5))
    True
  """
  common.check_rank("x", x, 3)
  _check(x, gate_r, gate_i, log_lambda_param, c)
  bsz, t, d = x.shape
  common.check_seq_len(t, "axis 1 of x")
  if h0 is not None:
    common.check_shape("h0", h0, (bsz, d), "[B, D]")
    common.check_float("h0", h0)
  common.check_segment_ids(segment_ids, bsz, t)
  context_lib.check_context(context)
  if context is not None and context.is_local:
    raise ValueError("context: rg_lru needs the global arrays (where documents start); call "
                     f"it outside jax.shard_map over {context.axis_name!r}.")
  acc = jnp.promote_types(x.dtype, jnp.float32)
  log_a, mult, gated = _gates(x, gate_r, gate_i, log_lambda_param, c, acc)

  starts = (jnp.zeros((bsz, t), bool) if segment_ids is None
            else common.segment_starts(segment_ids))
  if h0 is None:
    starts = starts.at[:, 0].set(True)
  mult = jnp.where(starts[..., None], 1.0, mult)
  # The scan resets the state where segment ids change; a = 0 at t = 0 only
  # matters with h0, which then continues a document, so starts need no a = 0.
  h = scan_lib.linear_scan(
      jnp.exp(log_a), (mult * gated).astype(acc), h0=h0, form=form, chunk_size=chunk_size,
      segment_ids=segment_ids, return_state=return_state, context=context)
  if return_state:
    h, state = h
    return h.astype(x.dtype), state
  return h.astype(x.dtype)


def rg_lru_step(
    state: Array | None,
    x: Array,
    gate_r: Array,
    gate_i: Array,
    log_lambda_param: Array,
    *,
    c: float = 8.0,
):
  """One token of :func:`rg_lru`.

  Args:
    state: ``[B, D]`` float32, or None for the first token of a document
      (state zero, normaliser 1).
    x, gate_r, gate_i: ``[B, D]``.
    log_lambda_param: ``[D]``.
    c: the temperature.

  Returns:
    ``(h, new_state)``: ``h`` ``[B, D]`` in the dtype of ``x``, ``new_state``
    ``[B, D]`` float32.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> x, gate_r, gate_i = jax.random.normal(jax.random.key(0), (3, 1, 8, 3))
    >>> lam = jnp.full((3,), 2.0)
    >>> _, state = ops.rg_lru(x[:, :7], gate_r[:, :7], gate_i[:, :7], lam, return_state=True)
    >>> h, state = ops.rg_lru_step(state, x[:, 7], gate_r[:, 7], gate_i[:, 7], lam)
    >>> h.shape, state.shape
    ((1, 3), (1, 3))
    >>> bool(jnp.allclose(h, ops.rg_lru(x, gate_r, gate_i, lam)[:, 7], atol=1e-5))
    True
  """
  common.check_rank("x", x, 2)
  _check(x, gate_r, gate_i, log_lambda_param, c)
  acc = jnp.promote_types(x.dtype, jnp.float32)
  log_a, mult, gated = _gates(x, gate_r, gate_i, log_lambda_param, c, acc)
  if state is None:
    h = gated
  else:
    common.check_step_state("state", state, x.shape, "[B, D]")
    h = jnp.exp(log_a) * state.astype(acc) + mult * gated
  return h.astype(x.dtype), h
