"""Kernelized linear attention (Katharopoulos et al. 2020; Performer, Choromanski et al. 2020).

Causal, normalised::

    o_t = phi(q_t)^T S_t / (phi(q_t) . z_t),   S_t = sum_{j<=t} phi(k_j) v_j^T,
    z_t = sum_{j<=t} phi(k_j)

It runs on the diagonal-decay engine without decay: the normaliser ``z`` is
the engine's state for an extra value column of ones, so the state is
``[B, H, F, V + 1]`` (``F`` features; the last column is ``z``) and one
recurrence serves numerator and denominator. Non-causal attention uses one
global ``S`` and ``z`` (O(T)); with packed segments it adds a forward and a
reversed causal pass and subtracts the diagonal, still O(T).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from linear_attention.ops import common, decay
from linear_attention.ops import feature_maps as fm

Array = jax.Array

DEFAULT_EPS = 1e-6


def _features(q, k, feature_map, *, scale, key, num_features, projection, normalize):
  """Returns ``(phi(q), phi(k), engine_scale, projection)`` in the accumulation dtype."""
  common.check_choice("feature_map", feature_map, fm.FEATURE_MAPS)
  dk = q.shape[-1]
  acc = common.acc_dtype(q.dtype)
  q, k = q.astype(acc), k.astype(acc)
  if feature_map in fm.DETERMINISTIC_MAPS:
    return (fm.apply_feature_map(feature_map, q), fm.apply_feature_map(feature_map, k),
            common.resolve_scale(scale, dk), None)
  if projection is None:
    if key is None:
      raise ValueError(
          f"feature_map={feature_map!r} draws random features: pass key= (a PRNG key) "
          "or projection= (an [m, d] matrix).")
    m = fm.default_num_features(dk) if num_features is None else num_features
    projection = fm.random_projection(key, m, dk, orthogonal=(feature_map == "favor+"))
  common.check_shape("projection", projection, (None, dk), "[num_features, key_dim]")
  # The softmax temperature: exp(scale q.k) = exp((sqrt(scale) q).(sqrt(scale) k)).
  root = common.resolve_scale(scale, dk) ** 0.5
  phi_q = fm.apply_feature_map(feature_map, q * root, projection=projection,
                               is_query=True, stabilize=normalize)
  phi_k = fm.apply_feature_map(feature_map, k * root, projection=projection)
  return phi_q, phi_k, 1.0, projection


def _with_ones(v):
  """Appends a column of ones to ``v [..., V]``: its state column is ``z``."""
  return jnp.concatenate([v, jnp.ones(v.shape[:-1] + (1,), v.dtype)], axis=-1)


def _divide(num_den: Array, eps: float) -> Array:
  """``num / den`` from ``[..., V + 1]``; ``|den|`` is floored at ``eps`` keeping its sign."""
  num, den = num_den[..., :-1], num_den[..., -1:]
  safe = jnp.where(jnp.abs(den) < eps, jnp.where(den < 0, -eps, eps), den)
  return num / safe


def linear_attention(
    q: Array,
    k: Array,
    v: Array,
    *,
    feature_map: str = "elu",
    causal: bool = True,
    normalize: bool = True,
    key: Array | None = None,
    num_features: int | None = None,
    projection: Array | None = None,
    scale: float | None = None,
    eps: float = DEFAULT_EPS,
    form: str = "chunk",
    chunk_size: int = 64,
    initial_state: Array | None = None,
    return_state: bool = False,
    segment_ids: Array | None = None,
    implementation: str | None = None,
):
  """Kernelized linear attention, causal or not, with an optional normaliser.

  Args:
    q, k: ``[B, T, H, D]``; v: ``[B, T, H, V]``.
    feature_map: one of ``elu`` (ELU+1), ``relu``, ``identity``,
      ``performer_trig`` (random Fourier features), ``performer_positive``
      (positive random features, iid) or ``favor+`` (positive orthogonal
      random features with the query stabiliser).
    causal: causal (the recurrence) or bidirectional (one global state).
    normalize: divide by ``phi(q_t) . z_t``; its ``|den|`` is floored at
      ``eps`` (sign kept), so an underflowed denominator gives a finite output.
    key: PRNG key for the random maps (the same key gives the same features).
    num_features: ``m`` for the random maps; default ``d log d``.
    projection: an explicit ``[m, D]`` projection instead of ``key``.
    scale: for deterministic maps, the output scale (``None``: ``D ** -0.5``;
      it cancels when normalising); for random maps, the softmax temperature
      being approximated, ``exp(scale q.k)`` (``None``: ``D ** -0.5``).
    eps: the denominator floor (default ``1e-6``).
    form, chunk_size: the engine form for causal attention (see
      :func:`linear_attention.ops.decay.decay_linear_attention`).
    initial_state: ``[B, H, F, V']`` with ``V' = V + 1`` when normalising
      (last column: ``z``), else ``V``. ``F`` is the feature width. In
      bidirectional attention it acts as an extra memory every query of the
      first segment reads.
    return_state: also return the state after the last token.
    segment_ids: ``[B, T]`` ints; packed sequences never see each other.
    implementation: ``None``, ``"xla"`` or ``"pallas"``: the engine's kernel
      choice for the recurrent paths (see
      :func:`~linear_attention.ops.decay.decay_linear_attention`).

  Returns:
    ``o`` ``[B, T, H, V]`` in the dtype of ``q``, or ``(o, state)``.
  """
  b, t, h, dk, dv = common.check_qkv(q, k, v)
  common.check_segment_ids(segment_ids, b, t)
  common.check_choice("implementation", implementation, (None, "xla", "pallas"))
  phi_q, phi_k, engine_scale, _ = _features(
      q, k, feature_map, scale=scale, key=key, num_features=num_features,
      projection=projection, normalize=normalize)
  vv = v.astype(phi_q.dtype)
  vv = _with_ones(vv) if normalize else vv
  f = phi_q.shape[-1]
  common.check_state("initial_state", initial_state, (b, h, f, vv.shape[-1]))

  if causal:
    out, state = decay.decay_linear_attention(
        phi_q, phi_k, vv, scale=engine_scale, form=form, chunk_size=chunk_size,
        initial_state=initial_state, return_state=True, segment_ids=segment_ids,
        implementation=implementation)
  elif segment_ids is None:
    state = jnp.einsum("bthf,bthv->bhfv", phi_k, vv)
    if initial_state is not None:
      state = state + initial_state.astype(state.dtype)
    out = engine_scale * jnp.einsum("bthf,bhfv->bthv", phi_q, state)
  else:
    # Segment-restricted global sums: forward prefix + backward suffix - self.
    run = lambda a, b_, c, seg, s0: decay.decay_linear_attention(
        a, b_, c, scale=engine_scale, form=form, chunk_size=chunk_size,
        initial_state=s0, return_state=True, segment_ids=seg, implementation=implementation)
    fwd, state = run(phi_q, phi_k, vv, segment_ids, initial_state)
    flip = lambda x: jnp.flip(x, axis=1)
    bwd, _ = run(flip(phi_q), flip(phi_k), flip(vv), flip(segment_ids), None)
    self_term = engine_scale * jnp.einsum("bthf,bthf->bth", phi_q, phi_k)[..., None] * vv
    out = fwd + flip(bwd) - self_term

  o = _divide(out, eps) if normalize else out
  o = o.astype(q.dtype)
  return (o, state) if return_state else o


def linear_attention_step(
    q: Array,
    k: Array,
    v: Array,
    state: Array,
    *,
    feature_map: str = "elu",
    normalize: bool = True,
    key: Array | None = None,
    num_features: int | None = None,
    projection: Array | None = None,
    scale: float | None = None,
    eps: float = DEFAULT_EPS,
):
  """One causal decoding step of :func:`linear_attention`, O(1) in the position.

  Args:
    q, k: ``[B, H, D]``; v: ``[B, H, V]``; state: ``[B, H, F, V']`` as
      returned by ``linear_attention(..., return_state=True)`` (zeros for an
      empty context). The feature-map arguments must match those of the call
      that produced ``state`` (pass the same ``projection`` or ``key``).

  Returns:
    ``(o, new_state)`` with ``o`` ``[B, H, V]`` in the dtype of ``q``.
  """
  for name, x in (("q", q), ("k", k), ("v", v)):
    common.check_rank(name, x, 3)
  phi_q, phi_k, engine_scale, _ = _features(
      q, k, feature_map, scale=scale, key=key, num_features=num_features,
      projection=projection, normalize=normalize)
  vv = v.astype(state.dtype)
  vv = _with_ones(vv) if normalize else vv
  out, state = decay.decay_linear_attention_step(phi_q, phi_k, vv, state, scale=engine_scale)
  o = _divide(out, eps) if normalize else out
  return o.astype(q.dtype), state
