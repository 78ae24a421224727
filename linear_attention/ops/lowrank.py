"""Low-rank softmax attention: Linformer.

Linformer projects keys and values along the sequence axis with two
``[P, T]`` matrices ``E`` and ``F`` (``P << T``), then runs ordinary softmax
attention of the ``T`` queries over the ``P`` projected keys:

    k' = E k,   v' = F v,   o_i = sum_p softmax_p(scale * q_i . k'_p) v'_p

Cost ``O(T * P)`` time and memory. The projections are the caller's (they are
learned parameters of a layer); this op only applies them.

Not supported, by definition rather than by omission: ``causal=True`` (every
projected key mixes all positions, future ones included, so no row can be
restricted to its past) and ``segment_ids`` (likewise, a projected key mixes
every packed sequence of the row; pack nothing, or give each sequence its own
call).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from linear_attention import common
from linear_attention.ops import softmax as sm

Array = jax.Array


def linformer_attention(
    q: Array,
    k: Array,
    v: Array,
    E: Array,
    F: Array,
    *,
    causal: bool = False,
    scale: float | None = None,
    segment_ids: Array | None = None,
) -> Array:
  """Linformer attention with caller-given sequence projections.

  Args:
    q: ``[B, T, H, K]``; k: ``[B, T, H, K]``; v: ``[B, T, H, V]``.
    E: ``[P, T]`` key projection along the sequence.
    F: ``[P, T]`` value projection along the sequence.
    causal: must be False (see the module docstring).
    scale: logit scale; ``None`` means ``K ** -0.5``.
    segment_ids: must be None (see the module docstring).

  Returns:
    ``o`` ``[B, T, H, V]`` in the dtype of ``q``; projections and softmax are
    accumulated in float32.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 1, 8, 2, 4))
    >>> E, F = jax.random.normal(jax.random.key(1), (2, 3, 8)) / 8 ** 0.5  # [P, T]
    >>> o = ops.linformer_attention(q, k, v, E, F)  # bidirectional
    >>> o.shape
    (1, 8, 2, 4)
    >>> bool(jnp.isfinite(o).all())
    True
  """
  _, t, _, dk, _ = common.check_attention(q, k, v, None)
  if causal:
    raise ValueError(
        "linformer_attention does not support causal=True: E and F mix every position, "
        "future ones included, into each projected key and value, so a causal Linformer "
        "is not defined."
    )
  if segment_ids is not None:
    raise ValueError(
        "linformer_attention does not support segment_ids: each projected key mixes every "
        "packed sequence of the row. Call it once per sequence instead."
    )
  for name, x in (("E", E), ("F", F)):
    common.check_rank(name, x, 2)
    common.check_float(name, x)
  p = E.shape[0]
  common.check_shape("E", E, (p, t), "[k_proj, T] with T the sequence length of q")
  common.check_shape("F", F, (p, t), "[k_proj, T], the shape of E")
  scale = common.resolve_scale(scale, dk)
  acc = jnp.promote_types(q.dtype, jnp.float32)
  kp = jnp.einsum("pt,bthd->bphd", E, k, preferred_element_type=acc)
  vp = jnp.einsum("pt,bthd->bphd", F, v, preferred_element_type=acc)
  visible = jnp.ones((t, p), bool)
  o, _ = sm.dense_attention_stats(q.astype(acc), kp, vp, visible, scale)
  return o.astype(q.dtype)
