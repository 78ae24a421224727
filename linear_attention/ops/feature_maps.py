"""Feature maps ``phi`` for kernelized linear attention.

``phi(q) . phi(k)`` replaces ``exp(q . k)`` (random features, Performer) or is
a positive similarity of its own (ELU+1, ReLU). Random features take a
projection ``W [m, d]``, drawn by :func:`random_projection` from a caller's
PRNG key, so that redrawing is the caller's decision.

Softmax-kernel estimators (``x`` already multiplied by ``scale ** 0.5``):

* trigonometric (Rahimi & Recht; Performer's ``sin/cos``):
  ``phi(x) = exp(|x|^2 / 2) / sqrt(m) [cos(W x), sin(W x)]``, ``2m`` features,
  unbiased but not positive, so normalised attention can divide by a number
  near zero.
* positive (Performer, FAVOR+): ``phi(x) = exp(W x - |x|^2 / 2) / sqrt(m)``.

Stabilisers (used only when the output is normalised, where per-query factors
cancel exactly): a query's features are shifted by their maximum (Performer's
stabiliser), and the trigonometric query factor ``exp(|x|^2/2)`` is dropped.
A factor per key would not cancel, but one shared by every key a query sees
does, and :func:`~linear_attention.ops.linear.linear_attention` uses that for
the positive maps in normalised calls without a state in or out: causal
attention shifts key ``j``'s exponents by the running maximum ``M_j`` over
the keys so far and decays the state by ``exp(M_{j-1} - M_j)`` (query ``t``
then reads every key scaled by the same ``exp(-M_t)``); bidirectional
attention shifts by the maximum over the row. Keys of large norm then no
longer underflow to all-zero features. With a state (``initial_state``,
``return_state``, decoding) the state must keep its exact scale, so there key
features underflow when ``|k|^2 * scale / 2`` exceeds about 100 (``|k|``
about 40 at ``d = 64``), and an eager call warns when its normaliser
underflowed. A positive key feature is at most ``exp(|w_r|^2 / 2)``, about
``exp(d/2)``, which fits float32 for head dimensions up to about 160.

Polynomial maps (deterministic, for a small ``d`` such as 16):

* ``taylor`` (Based, Arora et al. 2024): the second-order Taylor expansion of
  ``exp(q.k / sqrt(d))``, ``phi(q).phi(k) = 1 + q.k / sqrt(d) + (q.k)^2 / (2d)``,
  from ``phi(x) = [1, x / d^(1/4), (x x^T) / (sqrt(2) sqrt(d))]``. The kernel
  is at least ``1/2`` (``1 + u + u^2/2 > 0``), so the normaliser never nears 0.
* ``squared`` (ReBased's kernel, Aksenov et al. 2024):
  ``phi(q).phi(k) = (q.k)^2 / d`` from ``phi(x) = (x x^T) / sqrt(d)``. ReBased
  normalises ``q`` and ``k`` with a learnable affine LayerNorm first
  (:func:`affine_layer_norm`; ``ops.rebased_attention``).

Both store the symmetric ``x x^T`` as its upper triangle, off-diagonal entries
times ``sqrt(2)``: the same dot products with ``d (d + 1) / 2`` features
instead of ``d^2`` (``1 + d + d (d + 1) / 2 = 153`` for Taylor at ``d = 16``
instead of 273), which shrinks the state ``[B, H, F, V + 1]`` by ~44%.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from linear_attention import common

Array = jax.Array

DETERMINISTIC_MAPS = ("elu", "relu", "identity", "taylor", "squared")
RANDOM_MAPS = ("performer_trig", "performer_positive", "favor+")
FEATURE_MAPS = DETERMINISTIC_MAPS + RANDOM_MAPS


def default_num_features(dim: int) -> int:
  """Performer's default ``m = d log d`` (at least ``d``).

  Examples:
    >>> from linear_attention.ops import feature_maps as fm
    >>> fm.default_num_features(64)  # d log d random features
    266
  """
  return max(dim, int(dim * math.log(dim))) if dim > 1 else 1


def random_projection(key: Array, num_features: int, dim: int, *, orthogonal: bool) -> Array:
  """Draws a ``[num_features, dim]`` Gaussian projection.

  Args:
    key: PRNG key.
    num_features: ``m``, the number of random features.
    dim: ``d``, the input dimension.
    orthogonal: if True, rows come in blocks of ``d`` exactly orthogonal
      directions (QR of a Gaussian block), each rescaled to the norm of an
      independent Gaussian vector, so each row is still marginally
      ``N(0, I_d)`` (Performer's orthogonal random features).

  Returns:
    ``W`` of shape ``[num_features, dim]``, float32.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> w = ops.random_projection(jax.random.key(0), 8, 4, orthogonal=True)
    >>> w.shape  # [num_features, dim]
    (8, 4)
    >>> gram = w[:4] @ w[:4].T  # each block of dim rows is orthogonal
    >>> bool(jnp.allclose(gram, jnp.diag(jnp.diag(gram)), atol=1e-4))
    True
  """
  common.check_positive_int("num_features", num_features)
  common.check_positive_int("dim", dim)
  k_dir, k_norm = jax.random.split(key)
  if not orthogonal:
    return jax.random.normal(k_dir, (num_features, dim), jnp.float32)
  blocks = -(-num_features // dim)
  gauss = jax.random.normal(k_dir, (blocks, dim, dim), jnp.float32)
  qmat, r = jnp.linalg.qr(gauss)
  # QR's sign convention makes Q's directions non-uniform (Q[0, 0] < 0 always);
  # the signs of diag(R) undo it, giving Haar-distributed orthogonal blocks.
  qmat = qmat * jnp.sign(jnp.diagonal(r, axis1=-2, axis2=-1))[:, None, :]
  rows = jnp.swapaxes(qmat, 1, 2).reshape(blocks * dim, dim)[:num_features]
  norms = jnp.linalg.norm(jax.random.normal(k_norm, (num_features, dim), jnp.float32), axis=1)
  return rows * norms[:, None]


def elu_features(x: Array) -> Array:
  """ELU(x) + 1 (Katharopoulos et al. 2020): positive, same width as ``x``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention.ops import feature_maps as fm
    >>> fm.elu_features(jnp.array([-1.0, 0.0, 2.0])).tolist()  # positive
    [0.3678794503211975, 1.0, 3.0]
  """
  return jax.nn.elu(x) + 1.0


def relu_features(x: Array) -> Array:
  """ReLU(x): non-negative, same width as ``x``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention.ops import feature_maps as fm
    >>> fm.relu_features(jnp.array([-1.0, 0.0, 2.0])).tolist()
    [0.0, 0.0, 2.0]
  """
  return jax.nn.relu(x)


def outer_features(x: Array) -> Array:
  """The packed symmetric outer product: ``psi(x).psi(y) = (x.y)^2``.

  Args:
    x: ``[..., d]``.

  Returns:
    ``[..., d (d + 1) / 2]``: ``x_i x_j`` for ``i <= j``, off-diagonal entries
    times ``sqrt(2)`` (each stands for the pair ``(i, j), (j, i)``).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention.ops import feature_maps as fm
    >>> x, y = jax.random.normal(jax.random.key(0), (2, 4)) / 2
    >>> fm.outer_features(x).shape  # d (d + 1) / 2
    (10,)
    >>> bool(jnp.allclose(fm.outer_features(x) @ fm.outer_features(y), (x @ y) ** 2))
    True
  """
  d = x.shape[-1]
  rows, cols = np.triu_indices(d)
  weight = np.where(rows == cols, 1.0, math.sqrt(2.0)).astype(np.float32)
  return x[..., rows] * x[..., cols] * jnp.asarray(weight, x.dtype)


def taylor_features(x: Array) -> Array:
  """Based's second-order Taylor features of ``exp(x.y / sqrt(d))``.

  Args:
    x: ``[..., d]``.

  Returns:
    ``[..., 1 + d + d (d + 1) / 2]`` features with
    ``phi(x).phi(y) = 1 + x.y / sqrt(d) + (x.y)^2 / (2 d)``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention.ops import feature_maps as fm
    >>> x, y = jax.random.normal(jax.random.key(0), (2, 4)) / 2
    >>> fm.taylor_features(x).shape  # 1 + d + d (d + 1) / 2
    (15,)
    >>> u = x @ y / 2  # x.y / sqrt(d)
    >>> bool(jnp.allclose(fm.taylor_features(x) @ fm.taylor_features(y), 1 + u + u ** 2 / 2))
    True
  """
  d = x.shape[-1]
  ones = jnp.ones(x.shape[:-1] + (1,), x.dtype)
  return jnp.concatenate(
      [ones, x * d**-0.25, outer_features(x) * (2.0 * d) ** -0.5], axis=-1)


def squared_features(x: Array) -> Array:
  """ReBased's kernel features: ``phi(x).phi(y) = (x.y)^2 / d``.

  Args:
    x: ``[..., d]``.

  Returns:
    ``[..., d (d + 1) / 2]`` non-negative-kernel features (the ``1/d`` keeps
    the state's magnitude independent of ``d``; it cancels when normalised).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention.ops import feature_maps as fm
    >>> x, y = jax.random.normal(jax.random.key(0), (2, 4)) / 2
    >>> bool(jnp.allclose(fm.squared_features(x) @ fm.squared_features(y), (x @ y) ** 2 / 4))
    True
  """
  return outer_features(x) * x.shape[-1] ** -0.5


def feature_width(name: str, dim: int, num_features: int | None = None) -> int:
  """The width ``F`` of ``apply_feature_map(name, x [..., dim])``.

  ``num_features`` is ``m`` for the random maps (their projection's rows).

  Examples:
    >>> from linear_attention.ops import feature_maps as fm
    >>> fm.feature_width("taylor", 16), fm.feature_width("performer_trig", 16, num_features=32)
    (153, 64)
  """
  common.check_choice("feature_map", name, FEATURE_MAPS)
  if name == "taylor":
    return 1 + dim + dim * (dim + 1) // 2
  if name == "squared":
    return dim * (dim + 1) // 2
  if name in DETERMINISTIC_MAPS:
    return dim
  m = default_num_features(dim) if num_features is None else num_features
  return 2 * m if name == "performer_trig" else m


def affine_layer_norm(x: Array, gamma: Array, beta: Array, eps: float = 1e-5) -> Array:
  """LayerNorm over the last axis with a learnable scale and shift (ReBased's q/k norm).

  Args:
    x: ``[..., H, d]``.
    gamma, beta: ``[d]`` (shared by the heads) or ``[H, d]`` (per head).
    eps: added to the variance.

  Returns:
    ``gamma * (x - mean) / sqrt(var + eps) + beta`` in the accumulation dtype
    (float32 for half-precision ``x``).

  Raises:
    ValueError: ``gamma`` or ``beta`` not ``[d]`` or ``[H, d]``, or not floating.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention.ops import feature_maps as fm
    >>> x = jax.random.normal(jax.random.key(0), (5, 2, 4))  # [..., H, d]
    >>> out = fm.affine_layer_norm(x, jnp.ones(4), jnp.zeros(4))
    >>> bool(jnp.allclose(out.mean(-1), 0, atol=1e-6) and jnp.allclose(out.std(-1), 1, atol=1e-3))
    True
  """
  h, d = x.shape[-2:]
  for name, p in (("gamma", gamma), ("beta", beta)):
    common.check_float(name, p)
    if tuple(jnp.shape(p)) not in ((d,), (h, d)):
      raise ValueError(f"{name} must have shape [{d}] or [{h}, {d}] ([K] or [H, K]), got "
                       f"{list(jnp.shape(p))}.")
  acc = common.acc_dtype(x.dtype)
  xf = x.astype(acc)
  xf = xf - jnp.mean(xf, axis=-1, keepdims=True)
  xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
  return xf * gamma.astype(acc) + beta.astype(acc)


def trig_features(x: Array, projection: Array, *, is_query: bool = False,
                  stabilize: bool = False) -> Array:
  """Random Fourier features of the softmax kernel.

  Args:
    x: ``[..., d]`` inputs (already scaled by ``scale ** 0.5``).
    projection: ``[m, d]``.
    is_query, stabilize: with both set, the per-query factor ``exp(|x|^2/2)``
      is dropped (it cancels in normalised attention).

  Returns:
    ``[..., 2m]`` features.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention.ops import feature_maps as fm
    >>> x, y = jax.random.normal(jax.random.key(0), (2, 4)) / 2
    >>> w = fm.random_projection(jax.random.key(1), 4096, 4, orthogonal=True)
    >>> fm.trig_features(x, w).shape  # [cos, sin]: 2m
    (8192,)
    >>> estimate = fm.trig_features(x, w) @ fm.trig_features(y, w)  # unbiased for exp(x.y)
    >>> bool(jnp.abs(estimate - jnp.exp(x @ y)) < 0.1)
    True
  """
  m = projection.shape[0]
  u = jnp.einsum("...d,md->...m", x, projection.astype(x.dtype))
  feats = jnp.concatenate([jnp.cos(u), jnp.sin(u)], axis=-1) / math.sqrt(m)
  if is_query and stabilize:
    return feats
  return feats * jnp.exp(0.5 * jnp.sum(x * x, axis=-1, keepdims=True))


def positive_log_features(x: Array, projection: Array) -> Array:
  """The logs of the positive random features: ``W x - |x|^2 / 2 - log(m) / 2``.

  Args:
    x: ``[..., d]`` inputs (already scaled by ``scale ** 0.5``).
    projection: ``[m, d]``.

  Returns:
    ``[..., m]``; ``exp`` of it is :func:`positive_features` without stabiliser.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention.ops import feature_maps as fm
    >>> x, y = jax.random.normal(jax.random.key(0), (2, 4)) / 2
    >>> w = fm.random_projection(jax.random.key(1), 4096, 4, orthogonal=True)
    >>> bool(jnp.allclose(jnp.exp(fm.positive_log_features(x, w)), fm.positive_features(x, w)))
    True
  """
  m = projection.shape[0]
  u = jnp.einsum("...d,md->...m", x, projection.astype(x.dtype))
  return u - 0.5 * jnp.sum(x * x, axis=-1, keepdims=True) - 0.5 * math.log(m)


def positive_features(x: Array, projection: Array, *, is_query: bool = False,
                      stabilize: bool = False) -> Array:
  """Positive random features of the softmax kernel (FAVOR+).

  Args:
    x: ``[..., d]`` inputs (already scaled by ``scale ** 0.5``).
    projection: ``[m, d]``.
    is_query, stabilize: with both set, each query's exponents are shifted by
      their maximum (a per-query factor that cancels in normalised attention).

  Returns:
    ``[..., m]`` positive features.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention.ops import feature_maps as fm
    >>> x, y = jax.random.normal(jax.random.key(0), (2, 4)) / 2
    >>> w = fm.random_projection(jax.random.key(1), 4096, 4, orthogonal=True)
    >>> phi_x, phi_y = fm.positive_features(x, w), fm.positive_features(y, w)
    >>> bool((phi_x > 0).all())
    True
    >>> bool(jnp.abs(phi_x @ phi_y - jnp.exp(x @ y)) < 0.1)  # unbiased for exp(x.y)
    True
  """
  u = positive_log_features(x, projection)
  if is_query and stabilize:
    u = u - jax.lax.stop_gradient(jnp.max(u, axis=-1, keepdims=True))
  return jnp.exp(u)


def apply_feature_map(name: str, x: Array, *, projection: Array | None = None,
                      is_query: bool = False, stabilize: bool = False) -> Array:
  """Applies the named feature map to ``x [..., d]``.

  Random maps (``performer_trig``, ``performer_positive``, ``favor+``) need
  ``projection [m, d]``; the output width is ``d`` for ``elu``/``relu``/
  ``identity``, ``1 + d + d (d + 1) / 2`` for ``taylor``, ``d (d + 1) / 2``
  for ``squared``, ``2m`` for ``performer_trig`` and ``m`` for the positive
  maps (:func:`feature_width`).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention.ops import feature_maps as fm
    >>> x = jax.random.normal(jax.random.key(0), (1, 8, 2, 16))  # [B, T, H, d]
    >>> fm.apply_feature_map("taylor", x).shape
    (1, 8, 2, 153)
    >>> w = fm.random_projection(jax.random.key(1), 32, 16, orthogonal=True)
    >>> fm.apply_feature_map("favor+", x, projection=w).shape
    (1, 8, 2, 32)
  """
  common.check_choice("feature_map", name, FEATURE_MAPS)
  if name == "taylor":
    return taylor_features(x)
  if name == "squared":
    return squared_features(x)
  if name == "elu":
    return elu_features(x)
  if name == "relu":
    return relu_features(x)
  if name == "identity":
    return x
  if projection is None:
    raise ValueError(f"feature_map={name!r} needs a projection (or a key to draw one).")
  fn = trig_features if name == "performer_trig" else positive_features
  return fn(x, projection, is_query=is_query, stabilize=stabilize)
