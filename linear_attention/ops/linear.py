"""Kernelized linear attention (Katharopoulos et al. 2020; Performer, Choromanski et al. 2020;
Based, Arora et al. 2024; ReBased, Aksenov et al. 2024).

Causal, normalised::

    o_t = phi(q_t)^T S_t / (phi(q_t) . z_t),   S_t = sum_{j<=t} phi(k_j) v_j^T,
    z_t = sum_{j<=t} phi(k_j)

It runs on the diagonal-decay engine without decay: the normaliser ``z`` is
the engine's state for an extra value column of ones, so the state is
``[B, H, F, V + 1]`` (``F`` features; the last column is ``z``) and one
recurrence serves numerator and denominator. Non-causal attention uses one
global ``S`` and ``z`` (O(T)); with packed segments it adds a forward and a
reversed causal pass and subtracts the diagonal, still O(T).

Based is this op with ``feature_map="taylor"`` on small (e.g. 16-dim) q and k;
ReBased (:func:`rebased_attention`) normalises q and k with a learnable affine
LayerNorm and uses ``feature_map="squared"``.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
from jax import lax

from linear_attention import common
from linear_attention.ops import decay
from linear_attention.ops import feature_maps as fm
from linear_attention.engines import context as context_lib
from linear_attention.engines.context import SeqContext

Array = jax.Array

DEFAULT_EPS = 1e-6


def _features(q, k, feature_map, *, scale, key, num_features, projection, normalize,
              key_shift=None):
  """Returns ``(phi(q), phi(k), engine_scale, log_decay)`` in the accumulation dtype.

  ``key_shift``: None, or ``(causal, segment_ids)`` to stabilise the positive
  maps' key features (see :func:`_shift_keys`); ``log_decay`` is then the
  engine's decay that keeps the shift consistent, else None.
  """
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
  _check_overflow("q", q, phi_q, feature_map)
  if key_shift is None or feature_map == "performer_trig":
    phi_k = fm.apply_feature_map(feature_map, k * root, projection=projection)
    _check_overflow("k", k, phi_k, feature_map)
    return phi_q, phi_k, 1.0, None
  log_phi_k = fm.positive_log_features(k * root, projection)
  _check_overflow("k", k, log_phi_k, feature_map)
  phi_k, log_decay = _shift_keys(log_phi_k, *key_shift)
  return phi_q, phi_k, 1.0, log_decay


def _check_overflow(name: str, x: Array, features: Array, feature_map: str) -> None:
  """Refuses finite concrete inputs whose random features overflow (``|x|^2 / 2`` past the
  dtype's range): left alone they surface as NaN, or as an error about the internal
  ``log_decay`` of the key shift, an argument the caller never passed."""
  if isinstance(x, jax.core.Tracer) or isinstance(features, jax.core.Tracer):
    return
  if bool(jnp.all(jnp.isfinite(x))) and not bool(jnp.all(jnp.isfinite(features))):
    raise ValueError(
        f"{name} is too large for feature_map={feature_map!r}: its random features overflow "
        f"{features.dtype} (largest |{name}| entry {float(jnp.max(jnp.abs(x))):g}; the features "
        f"carry a factor exp(scale * |{name}|^2 / 2) or its inverse); scale {name} down, e.g. "
        "normalise it.")


def _segment_cummax(x: Array, segment_ids: Array | None) -> Array:
  """Running maximum of ``x [B, T, H]`` along ``T``, restarting at each segment."""
  if segment_ids is None:
    return lax.cummax(x, axis=1)
  seg = jnp.broadcast_to(common.segment_index(segment_ids)[..., None], x.shape)

  def combine(a, b):
    (sa, va), (sb, vb) = a, b
    return sb, jnp.where(sa == sb, jnp.maximum(va, vb), vb)

  return lax.associative_scan(combine, (seg, x), axis=1)[1]


def _shift_keys(log_phi_k: Array, causal: bool, segment_ids: Array | None):
  """Positive key features ``exp(log_phi_k - M)`` that cannot all underflow.

  ``M [B, T, H]`` is one shift per key shared by every query that sees it, so
  it cancels in normalised attention: causal, the running maximum ``M_j`` of
  the keys' largest exponents so far (within the segment), with the state
  decayed by ``exp(M_{j-1} - M_j) <= 1`` so that query ``t`` reads every key
  scaled by the same ``exp(-M_t)``; bidirectional, the row's maximum. The
  shift carries no gradient (the output does not depend on it).

  Returns ``(phi_k [B, T, H, m], log_decay [B, T, H] or None)``.
  """
  peak = lax.stop_gradient(jnp.max(log_phi_k, axis=-1))  # [B, T, H]
  if not causal:
    shift = jnp.max(peak, axis=1, keepdims=True)
    return jnp.exp(log_phi_k - shift[..., None]), None
  shift = _segment_cummax(peak, segment_ids)
  log_decay = jnp.concatenate([shift[:, :1], shift[:, :-1]], axis=1) - shift
  if segment_ids is not None:  # the state restarts there anyway
    log_decay = jnp.where(common.segment_starts(segment_ids)[..., None], 0.0, log_decay)
  return jnp.exp(log_phi_k - shift[..., None]), log_decay


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
    form: str = "auto",
    chunk_size: int | None = None,
    initial_state: Array | None = None,
    return_state: bool = False,
    segment_ids: Array | None = None,
    implementation: str | None = None,
    context: SeqContext | None = None,
):
  """Kernelized linear attention, causal or not, with an optional normaliser.

  Args:
    q, k: ``[B, T, H, D]``; v: ``[B, T, H, V]``.
    feature_map: one of ``elu`` (ELU+1), ``relu``, ``identity``, ``taylor``
      (Based's second-order Taylor map of ``exp(q.k / sqrt(D))``), ``squared``
      (``(q.k)^2 / D``, ReBased's kernel), ``performer_trig`` (random Fourier features), ``performer_positive``
      (positive random features, iid) or ``favor+`` (positive orthogonal
      random features with the query stabiliser). Normalised calls without
      ``initial_state``/``return_state`` also shift the positive key features
      by one shared factor, so inputs of large norm stay exact; with a state
      they can underflow to an all-zero output (an eager call then warns; see
      :mod:`~linear_attention.ops.feature_maps`).
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
    context: None, or a :class:`~linear_attention.ops.context.SeqContext`: the
      sequence split over a mesh axis. The feature maps (and the positive maps'
      running key shift, a prefix maximum) act on the global arrays; the
      recurrence over ``phi(k) [v, 1]`` runs sequence-parallel in the engine;
      bidirectional attention is global sums (and, with ``segment_ids``, one
      reversed engine pass), which XLA partitions over the axis.

  Returns:
    ``o`` ``[B, T, H, V]`` in the dtype of ``q``, or ``(o, state)``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 1, 8, 2, 4))
    >>> o = ops.linear_attention(q, k, v, feature_map="elu")  # causal, normalised
    >>> o.shape
    (1, 8, 2, 4)
    >>> bool(jnp.allclose(o, ops.linear_attention(q, k, v, form="parallel"), atol=1e-5))
    True
  """
  b, t, h, dk, dv = common.check_qkv(q, k, v)
  common.check_segment_ids(segment_ids, b, t)
  common.check_choice("implementation", implementation, (None, "xla", "pallas"))
  # Normalised and stateless, the positive key features may be shifted by a
  # factor that every query sees whole: it cancels exactly.
  stateless = normalize and initial_state is None and not return_state
  context_lib.check_context(context)
  if context is not None:
    context.check(b, t)
  if (context is not None and context.is_local
      and (not causal or (stateless and feature_map not in fm.DETERMINISTIC_MAPS))):
    # Prefix maxima and sums over T would see this device's slice only.
    raise ValueError(
        f"context: linear_attention with causal={causal} and feature_map={feature_map!r} "
        "mixes tokens outside the engine (global sums or a running key shift); call it on "
        f"the global arrays (outside jax.shard_map over {context.axis_name!r}).")
  phi_q, phi_k, engine_scale, log_decay = _features(
      q, k, feature_map, scale=scale, key=key, num_features=num_features,
      projection=projection, normalize=normalize,
      key_shift=(causal, segment_ids) if stateless else None)
  vv = v.astype(phi_q.dtype)
  vv = _with_ones(vv) if normalize else vv
  f = phi_q.shape[-1]
  common.check_state("initial_state", initial_state, (b, h, f, vv.shape[-1]))

  if causal:
    out, state = decay.decay_linear_attention(
        phi_q, phi_k, vv, log_decay, scale=engine_scale, form=form, chunk_size=chunk_size,
        initial_state=initial_state, return_state=True, segment_ids=segment_ids,
        implementation=implementation, context=context)
  elif segment_ids is None:
    state = jnp.einsum("bthf,bthv->bhfv", phi_k, vv)
    if initial_state is not None:
      state = state + initial_state.astype(state.dtype)
    out = engine_scale * jnp.einsum("bthf,bhfv->bthv", phi_q, state)
  else:
    # Segment-restricted global sums: forward prefix + backward suffix - self.
    run = lambda a, b_, c, seg, s0: decay.decay_linear_attention(
        a, b_, c, scale=engine_scale, form=form, chunk_size=chunk_size,
        initial_state=s0, return_state=True, segment_ids=seg, implementation=implementation,
        context=context)
    fwd, state = run(phi_q, phi_k, vv, segment_ids, initial_state)
    flip = lambda x: jnp.flip(x, axis=1)
    bwd, _ = run(flip(phi_q), flip(phi_k), flip(vv), flip(segment_ids), None)
    self_term = engine_scale * jnp.einsum("bthf,bthf->bth", phi_q, phi_k)[..., None] * vv
    out = fwd + flip(bwd) - self_term

  if normalize:
    _warn_if_underflowed(feature_map, out[..., -1], eps, stateless)
  o = _divide(out, eps) if normalize else out
  o = o.astype(q.dtype)
  return (o, state) if return_state else o


def _warn_if_underflowed(feature_map: str, den: Array, eps: float, stabilised: bool) -> None:
  """Warns when an eager call's normaliser fell below ``eps`` for some query.

  For the positive random maps that means the features of those queries and
  their keys underflowed or barely overlap in float32 (inputs of large norm):
  their outputs are 0. Under ``jit`` the values are not known and nothing is
  said (see :mod:`~linear_attention.ops.feature_maps` for the regime).
  """
  if feature_map not in ("performer_positive", "favor+") or isinstance(den, jax.core.Tracer):
    return
  small = int(jnp.sum(jnp.abs(den) < eps))
  if small:
    hint = "" if stabilised else (
        ", or call without initial_state and return_state (the key features are then "
        "stabilised)")
    warnings.warn(
        f"feature_map={feature_map!r}: the normaliser of {small} query position(s) fell "
        f"below eps={eps}: with q and k of large norm their random features underflow or "
        f"barely overlap in float32, and those outputs are 0. Scale q and k down{hint}.",
        RuntimeWarning, stacklevel=3)


def linear_attention_step(
    state: Array,
    q: Array,
    k: Array,
    v: Array,
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
    state: ``[B, H, F, V']`` as returned by ``linear_attention(...,
      return_state=True)`` (zeros for an empty context). The feature-map
      arguments must match those of the call that produced ``state`` (pass the
      same ``projection`` or ``key``).
    q, k: ``[B, H, D]``; v: ``[B, H, V]``.

  Returns:
    ``(o, new_state)`` with ``o`` ``[B, H, V]`` in the dtype of ``q``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 1, 8, 2, 4))
    >>> _, state = ops.linear_attention(q[:, :7], k[:, :7], v[:, :7], return_state=True)
    >>> o, state = ops.linear_attention_step(state, q[:, 7], k[:, 7], v[:, 7])
    >>> o.shape
    (1, 2, 4)
    >>> bool(jnp.allclose(o, ops.linear_attention(q, k, v)[:, 7], atol=1e-5))
    True
  """
  common.check_step_state_first(state, "[B, H, F, V + 1]", 4)
  b, h, _, dv = common.check_step_qkv(q, k, v)
  # F (the feature width) is checked by the engine's step once phi is known.
  common.check_step_state("state", state, (b, h, None, dv + 1 if normalize else dv),
                          "[B, H, F, V + 1] (V when not normalising)")
  phi_q, phi_k, engine_scale, _ = _features(
      q, k, feature_map, scale=scale, key=key, num_features=num_features,
      projection=projection, normalize=normalize)
  vv = v.astype(phi_q.dtype)  # the engine step computes in the state's dtype
  vv = _with_ones(vv) if normalize else vv
  out, state = decay.decay_linear_attention_step(state, phi_q, phi_k, vv, scale=engine_scale)
  o = _divide(out, eps) if normalize else out
  return o.astype(q.dtype), state


def _rebased_qk(q, k, gamma, beta, eps):
  """ReBased's normalised q and k (already checked), back in their dtype."""
  norm = lambda x: fm.affine_layer_norm(x, gamma, beta, eps).astype(x.dtype)
  return norm(q), norm(k)


def rebased_attention(
    q: Array,
    k: Array,
    v: Array,
    gamma: Array,
    beta: Array,
    *,
    causal: bool = True,
    norm_eps: float = 1e-5,
    eps: float = DEFAULT_EPS,
    form: str = "auto",
    chunk_size: int | None = None,
    initial_state: Array | None = None,
    return_state: bool = False,
    segment_ids: Array | None = None,
    implementation: str | None = None,
    context: SeqContext | None = None,
):
  """ReBased attention: ``phi(x) = (LN_{gamma,beta}(x) LN_{gamma,beta}(x)^T) / sqrt(D)``.

  q and k go through one LayerNorm with a learnable scale ``gamma`` and shift
  ``beta`` (shared by q and k, as in the paper), then the ``squared`` feature
  map, so the normalised attention weight of key ``j`` for query ``t`` is
  proportional to ``(q~_t . k~_j)^2``.

  Args:
    q, k: ``[B, T, H, D]`` (``D`` small, e.g. 16: the features are
      ``D (D + 1) / 2``); v: ``[B, T, H, V]``.
    gamma, beta: ``[D]`` or ``[H, D]``.
    causal, eps, form, chunk_size, initial_state, return_state, segment_ids,
      implementation, context: as in :func:`linear_attention` (the normaliser is
      always on; ``initial_state`` is ``[B, H, D (D + 1) / 2, V + 1]``).
    norm_eps: the LayerNorm's variance epsilon.

  Returns:
    ``o`` ``[B, T, H, V]`` in the dtype of ``q``, or ``(o, state)``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 1, 8, 2, 4))
    >>> gamma, beta = jnp.ones(4), jnp.zeros(4)  # the feature LayerNorm's parameters
    >>> o = ops.rebased_attention(q, k, v, gamma, beta)
    >>> o.shape
    (1, 8, 2, 4)
    >>> o_parallel = ops.rebased_attention(q, k, v, gamma, beta, form="parallel")
    >>> bool(jnp.allclose(o, o_parallel, atol=1e-5))
    True
  """
  common.check_qkv(q, k, v)
  qn, kn = _rebased_qk(q, k, gamma, beta, norm_eps)
  return linear_attention(
      qn, kn, v, feature_map="squared", causal=causal, eps=eps, form=form,
      chunk_size=chunk_size, initial_state=initial_state, return_state=return_state,
      segment_ids=segment_ids, implementation=implementation, context=context)


def rebased_attention_step(state: Array, q: Array, k: Array, v: Array, gamma: Array,
                           beta: Array, *, norm_eps: float = 1e-5, eps: float = DEFAULT_EPS):
  """One causal decoding step of :func:`rebased_attention`.

  Args:
    state: ``[B, H, D (D + 1) / 2, V + 1]`` (zeros for an empty context);
    q, k: ``[B, H, D]``; v: ``[B, H, V]``; gamma, beta: ``[D]`` or ``[H, D]``.

  Returns:
    ``(o, new_state)`` with ``o`` ``[B, H, V]`` in the dtype of ``q``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 1, 8, 2, 4))
    >>> gamma, beta = jnp.ones(4), jnp.zeros(4)
    >>> _, state = ops.rebased_attention(q[:, :7], k[:, :7], v[:, :7], gamma, beta,
    ...                                  return_state=True)
    >>> o, state = ops.rebased_attention_step(state, q[:, 7], k[:, 7], v[:, 7], gamma, beta)
    >>> o.shape, state.shape  # D (D + 1) / 2 features, V + 1 columns (the normaliser)
    ((1, 2, 4), (1, 2, 10, 5))
    >>> bool(jnp.allclose(o, ops.rebased_attention(q, k, v, gamma, beta)[:, 7], atol=1e-5))
    True
  """
  common.check_step_state_first(state, "[B, H, F, V + 1]", 4)
  common.check_step_qkv(q, k, v)
  qn, kn = _rebased_qk(q, k, gamma, beta, norm_eps)
  return linear_attention_step(state, qn, kn, v, feature_map="squared", eps=eps)
