"""S4D (Gu et al., 2022): a diagonal, time-invariant state-space model.

Per channel ``d`` a diagonal state of size ``N``::

    h_t = exp(dt * A) * h_{t-1} + Bbar * u_t        y_t = 2 Re <C, h_t> (+ D u_t)

``A`` is complex ``[D, N]`` (N modes standing for N conjugate pairs), ``log_dt [D]`` a
learnable step, ``Bbar = (exp(dt A) - 1) / A * B`` the zero-order hold. Being time
invariant, it is a convolution with the kernel ``K_l = 2 Re sum_n C_n Bbar_n exp(dt A_n l)``
(a Vandermonde product in closed form), applied with an FFT in ``O(T log T)``: form
``"fft"``. Its recurrence is the elementwise scan of :mod:`linear_attention.ops.scan` over a
complex ``[D, N]`` state (forms ``"chunk"``, ``"associative"``, ``"recurrent"``). Mamba's
selective scan (:mod:`linear_attention.ops.ssm`) with constant ``dt``, ``B``, ``C`` is an
S4D with real ``A``.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from linear_attention import common
from linear_attention.engines import context as context_lib
from linear_attention.ops import scan as scan_lib
from linear_attention.engines.context import SeqContext

Array = jax.Array

S4D_FORMS = ("fft",) + scan_lib.SCAN_FORMS
S4D_INITS = ("lin", "inv", "real")


def _concrete(x) -> bool:
  return x is not None and not isinstance(x, jax.core.Tracer)


def _check_nonpositive(name: str, x: Array, what: str) -> None:
  """Raises when a concrete ``x`` has a positive entry."""
  common.check_range(name, x, high=0.0, what=what)


def s4d_init(kind: str, state_size: int, channels: int | None = None,
             dtype=jnp.float32) -> tuple[Array, Array]:
  """The diagonal ``A`` of S4D, as ``(A_real, A_imag)``.

  Args:
    kind: ``"lin"`` (S4D-Lin, ``-1/2 + i pi n``), ``"inv"`` (S4D-Inv,
      ``-1/2 + i N/pi (N/(2n+1) - 1)``) or ``"real"`` (S4D-Real, ``-(n+1)``).
    state_size: ``N``, the number of modes (each a conjugate pair).
    channels: ``D``; when given the result is tiled to ``[D, N]``.
    dtype: float dtype of the result.

  Returns:
    ``(A_real, A_imag)``, each ``[N]`` or ``[D, N]``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> A_re, A_im = ops.s4d_init("lin", 4, channels=3)  # S4D-Lin: -1/2 + i pi n
    >>> A_re.shape, A_im.shape
    ((3, 4), (3, 4))
    >>> A_re[0].tolist(), A_im[0, :2].tolist()
    ([-0.5, -0.5, -0.5, -0.5], [0.0, 3.1415927410125732])
  """
  common.check_choice("kind", kind, S4D_INITS)
  common.check_positive_int("state_size", state_size)
  n = np.arange(state_size, dtype=np.float64)
  if kind == "lin":
    re, im = -0.5 * np.ones_like(n), math.pi * n
  elif kind == "inv":
    re = -0.5 * np.ones_like(n)
    im = state_size / math.pi * (state_size / (2 * n + 1) - 1)
  else:
    re, im = -(n + 1), np.zeros_like(n)
  if channels is not None:
    common.check_positive_int("channels", channels)
    re, im = np.tile(re, (channels, 1)), np.tile(im, (channels, 1))
  return jnp.asarray(re, dtype), jnp.asarray(im, dtype)


def s4d_log_dt_init(key: Array, channels: int, dt_min: float = 1e-3, dt_max: float = 1e-1,
                    dtype=jnp.float32) -> Array:
  """``[D]`` log steps drawn log-uniformly in ``[dt_min, dt_max]``, as in S4D.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> log_dt = ops.s4d_log_dt_init(jax.random.key(0), 3, dt_min=1e-3, dt_max=1e-1)
    >>> log_dt.shape
    (3,)
    >>> bool(((jnp.exp(log_dt) >= 1e-3) & (jnp.exp(log_dt) <= 1e-1)).all())
    True
  """
  u = jax.random.uniform(key, (channels,), jnp.float32)
  return (u * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)).astype(dtype)


def _complex_dtype(*dtypes):
  return jnp.promote_types(common.acc_dtype(*dtypes), jnp.complex64)


def _check_s4d_params(A_real, A_imag, B, C, log_dt, D, channels, bidirectional):
  for name, p in (("A_real", A_real), ("A_imag", A_imag), ("log_dt", log_dt)):
    common.check_float(name, p)
  common.check_rank("A_real", A_real, 2)
  d, n = A_real.shape
  if channels is not None and d != channels:
    raise ValueError(f"A_real must have shape [D, N] with D = {channels} (channels of u), "
                     f"got {list(A_real.shape)}.")
  common.check_shape("A_imag", A_imag, (d, n), "[D, N] as A_real")
  common.check_shape("B", B, (d, n), "[D, N] as A_real")
  c_shape = (2, d, n) if bidirectional else (d, n)
  common.check_shape("C", C, c_shape,
                     "[2, D, N], forward then backward" if bidirectional else "[D, N] as A_real")
  common.check_shape("log_dt", log_dt, (d,), "[D]")
  if D is not None:
    common.check_shape("D", D, (d,), "[D]")
  _check_nonpositive("A_real", A_real, "the real part of A; a positive one makes the SSM unstable")
  return d, n


def _check_complex_state(name: str, state: Array) -> None:
  """S4D's state is complex (float states are read as complex with zero imaginary part)."""
  dtype = jnp.result_type(state)
  if not jnp.issubdtype(dtype, jnp.inexact) or dtype in (jnp.float16, jnp.bfloat16):
    raise ValueError(f"{name} must be complex64 (or float32/64, complex128), got dtype {dtype}.")


def _phi(z):
  """``expm1(z) / z`` with its limit 1 at ``z = 0`` (no division by zero)."""
  small = jnp.abs(z) < 1e-4
  safe = jnp.where(small, jnp.ones_like(z), z)
  return jnp.where(small, 1 + z / 2, jnp.expm1(safe) / safe)


def s4d_discretize(A_real: Array, A_imag: Array, B: Array, log_dt: Array):
  """Zero-order hold: ``(dt A, Bbar)`` with ``Abar = exp(dt A)``.

  Args:
    A_real, A_imag, B: ``[D, N]`` (``B`` real or complex); log_dt: ``[D]``.

  Returns:
    ``(dtA, Bbar)``, complex ``[D, N]``: ``Bbar = (exp(dt A) - 1) / A * B``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> A_re, A_im = ops.s4d_init("lin", 4, channels=3)  # [D, N]
    >>> B = jnp.ones((3, 4))
    >>> C = jax.random.normal(jax.random.key(1), (3, 4))
    >>> log_dt = ops.s4d_log_dt_init(jax.random.key(2), 3)
    >>> dtA, Bbar = ops.s4d_discretize(A_re, A_im, B, log_dt)
    >>> dtA.shape, Bbar.shape  # complex [D, N]; Abar = exp(dtA)
    ((3, 4), (3, 4))
    >>> bool((jnp.abs(jnp.exp(dtA)) < 1).all())  # a stable recurrence
    True
  """
  cdt = _complex_dtype(A_real.dtype, log_dt.dtype)
  dt = jnp.exp(log_dt.astype(jnp.finfo(cdt).dtype))[:, None]
  dtA = lax.complex(A_real.astype(dt.dtype), A_imag.astype(dt.dtype)) * dt
  return dtA, B.astype(cdt) * dt * _phi(dtA)


def s4d_kernel(A_real: Array, A_imag: Array, B: Array, C: Array, log_dt: Array,
               length: int) -> Array:
  """The S4D convolution kernel ``K_l = 2 Re sum_n C_n Bbar_n exp(dt A_n l)``.

  Args:
    A_real, A_imag, B, C: ``[D, N]`` (``B``, ``C`` real or complex); log_dt: ``[D]``.
    length: ``L``.

  Returns:
    ``[D, L]`` real kernel (float32, or float64 for float64 parameters).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> A_re, A_im = ops.s4d_init("lin", 4, channels=3)  # [D, N]
    >>> B = jnp.ones((3, 4))
    >>> C = jax.random.normal(jax.random.key(1), (3, 4))
    >>> log_dt = ops.s4d_log_dt_init(jax.random.key(2), 3)
    >>> K = ops.s4d_kernel(A_re, A_im, B, C, log_dt, 8)
    >>> K.shape  # [D, L]
    (3, 8)
    >>> impulse = jnp.zeros((1, 8, 3)).at[:, 0].set(1.0)
    >>> bool(jnp.allclose(ops.s4d(impulse, A_re, A_im, B, C, log_dt)[0].T, K, atol=1e-5))
    True
  """
  dtA, bbar = s4d_discretize(A_real, A_imag, B, log_dt)
  return _kernel(dtA, bbar * C.astype(bbar.dtype), length)


def _vandermonde(dtA, length, offset=0):
  """``exp(dt A * (l + offset))``, ``[D, N, L]``."""
  pos = jnp.arange(length, dtype=dtA.real.dtype) + offset
  return jnp.exp(dtA[..., None] * pos)


def _kernel(dtA, cb, length):
  # A sum rather than an einsum, so XLA can fuse the exp into the reduction
  # instead of materialising the [D, N, L] Vandermonde matrix.
  return 2 * jnp.sum(cb[..., None] * _vandermonde(dtA, length), axis=-2).real


def _fft_conv(u, k):
  """Causal convolution along the last axis: ``u [..., D, T]``, ``k [D, T]``."""
  t = u.shape[-1]
  n = 1 << (2 * t - 1).bit_length()  # no wrap-around, and a fast FFT size
  y = jnp.fft.irfft(jnp.fft.rfft(u, n) * jnp.fft.rfft(k, n), n)
  return y[..., :t]


def s4d(
    u: Array,
    A_real: Array,
    A_imag: Array,
    B: Array,
    C: Array,
    log_dt: Array,
    D: Array | None = None,
    *,
    form: str = "fft",
    bidirectional: bool = False,
    chunk_size: int = 64,
    initial_state: Array | None = None,
    return_state: bool = False,
    segment_ids: Array | None = None,
    context: SeqContext | None = None,
):
  """S4D: a diagonal complex SSM per channel, ZOH-discretised.

  ``h_t = exp(dt A) h_{t-1} + Bbar u_t``, ``y_t = 2 Re <C, h_t> + D u_t``.

  Args:
    u: ``[B, T, D]`` inputs.
    A_real: ``[D, N]``, ``<= 0`` (see :func:`s4d_init`); A_imag: ``[D, N]``.
    B: ``[D, N]`` real or complex.
    C: ``[D, N]`` real or complex; ``[2, D, N]`` (forward, backward) when
      ``bidirectional``.
    log_dt: ``[D]`` log step sizes (learnable).
    D: optional ``[D]`` skip connection.
    form: ``"fft"`` (default: closed-form kernel, FFT convolution,
      ``O(T log T)``), or a scan form ``"chunk"``, ``"associative"``,
      ``"recurrent"``. With ``segment_ids`` the fft form runs the chunk scan.
    bidirectional: add a backward SSM that sees only later tokens
      (``y_t += sum_{s > t} K^b_{s - t - 1} u_s``), sharing ``A``, ``B`` and
      ``dt`` and reading with ``C[1]``, so each token counts once.
    chunk_size: chunk length of the chunk form.
    initial_state: optional ``[B, D, N]`` complex state (causal only).
    return_state: also return the final state (causal only).
    segment_ids: optional ``[B, T]`` ints; no state crosses a segment boundary.
    context: None, or a :class:`~linear_attention.ops.context.SeqContext`: the
      sequence split over a mesh axis, through the scan engine's context (the
      fft form then runs the chunk scan, as with ``segment_ids``).

  Returns:
    ``y`` ``[B, T, D]`` in the dtype of ``u``, or ``(y, state)`` with ``state``
    ``[B, D, N]`` complex64 (complex128 for float64 inputs).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> A_re, A_im = ops.s4d_init("lin", 4, channels=3)  # [D, N]
    >>> B = jnp.ones((3, 4))
    >>> C = jax.random.normal(jax.random.key(1), (3, 4))
    >>> log_dt = ops.s4d_log_dt_init(jax.random.key(2), 3)
    >>> u = jax.random.normal(jax.random.key(0), (1, 8, 3))  # [B, T, D]
    >>> y = ops.s4d(u, A_re, A_im, B, C, log_dt)  # FFT convolution
    >>> y.shape
    (1, 8, 3)
    >>> bool(jnp.allclose(y, ops.s4d(u, A_re, A_im, B, C, log_dt, form="recurrent"), atol=1e-5))
    True
  """
  common.check_rank("u", u, 3)
  common.check_float("u", u)
  bsz, t, d = u.shape
  common.check_seq_len(t, "axis 1 of u")
  _, n = _check_s4d_params(A_real, A_imag, B, C, log_dt, D, d, bidirectional)
  common.check_choice("form", form, S4D_FORMS)
  common.check_positive_int("chunk_size", chunk_size)
  common.check_segment_ids(segment_ids, bsz, t)
  context_lib.check_context(context)
  if context is not None and context.is_local and bidirectional:
    raise ValueError("context: a bidirectional S4D reads the next token's backward state "
                     "across device edges; call it on the global arrays (outside "
                     "jax.shard_map).")
  if bidirectional and (initial_state is not None or return_state):
    raise ValueError("initial_state and return_state need a causal S4D (bidirectional=False).")
  if initial_state is not None:
    common.check_shape("initial_state", initial_state, (bsz, d, n), "[B, D, N]")
    _check_complex_state("initial_state", initial_state)

  y, state = _s4d_impl(u, A_real, A_imag, B, C, log_dt, D, initial_state, segment_ids,
                       form=form, bidirectional=bidirectional, chunk_size=chunk_size,
                       return_state=return_state, context=context)
  return (y, state) if return_state else y


# Jitted so that eager calls compile once per configuration.
@functools.partial(jax.jit, static_argnames=("form", "bidirectional", "chunk_size",
                                             "return_state", "context"))
def _s4d_impl(u, A_real, A_imag, B, C, log_dt, D, initial_state, segment_ids, *, form,
              bidirectional, chunk_size, return_state, context):
  bsz, t, d = u.shape
  n = A_real.shape[1]
  acc = common.acc_dtype(u.dtype, A_real.dtype)
  dtA, bbar = s4d_discretize(A_real, A_imag, B, log_dt)
  uf = u.astype(acc)
  c_fwd = (C[0] if bidirectional else C).astype(bbar.dtype)
  if form == "fft" and segment_ids is None and context is None:
    y = _fft_conv(jnp.swapaxes(uf, 1, 2), _kernel(dtA, c_fwd * bbar, t))  # [B, D, T]
    state = None
    if initial_state is not None or return_state:
      vand = _vandermonde(dtA, t)  # [D, N, T]: exp(dt A l)
    if initial_state is not None:
      h0 = initial_state.astype(bbar.dtype)
      # The initial state, decayed t + 1 times, read by C.
      y = y + 2 * jnp.einsum("dn,bdn,dnt->bdt", c_fwd, h0, vand * jnp.exp(dtA)[..., None]).real
    if return_state:
      # h_{T-1} = sum_s exp(dt A (T - 1 - s)) Bbar u_s (+ the decayed h0).
      state = jnp.einsum("dns,bsd->bdn", jnp.flip(vand, -1), uf.astype(bbar.dtype)) * bbar
      if initial_state is not None:
        state = state + jnp.exp(dtA * t) * h0
    y = jnp.swapaxes(y, 1, 2)
    if bidirectional:
      k_bwd = _kernel(dtA, C[1].astype(bbar.dtype) * bbar, t)
      yb = _fft_conv(jnp.flip(jnp.swapaxes(uf, 1, 2), -1), k_bwd)
      yb = jnp.pad(yb, ((0, 0), (0, 0), (1, 0)))[..., :t]  # only strictly later tokens
      y = y + jnp.swapaxes(jnp.flip(yb, -1), 1, 2)
  else:
    scan_form = "chunk" if form == "fft" else form
    a = jnp.broadcast_to(jnp.exp(dtA), (bsz, t, d, n))
    b = uf[..., None] * bbar
    kw = dict(form=scan_form, chunk_size=chunk_size, segment_ids=segment_ids, context=context)
    h, state = scan_lib.linear_scan(a, b, h0=initial_state, return_state=True, **kw)
    y = 2 * jnp.einsum("btdn,dn->btd", h, c_fwd).real
    if bidirectional:
      # The backward state of the next token, h_{t+1}, within the same segment: a reverse
      # scan over the inputs shifted one step earlier (a is the same at every step). The
      # inputs, not the scan's output, are shifted: they are the caller's arrays, while a
      # sequence-parallel scan's output is split along T, where a one-step slice is not.
      early = lambda x, fill: jnp.concatenate([x[:, 1:], fill(x[:, -1:])], axis=1)
      kw_b = dict(kw, segment_ids=None if segment_ids is None else early(segment_ids,
                                                                          lambda x: x))
      hb = scan_lib.linear_scan(a, early(b, jnp.zeros_like), reverse=True, **kw_b)
      yb = 2 * jnp.einsum("btdn,dn->btd", hb, C[1].astype(hb.dtype)).real
      if segment_ids is not None:
        next_starts = jnp.pad(common.segment_starts(segment_ids)[:, 1:], ((0, 0), (0, 1)))
        yb = jnp.where(next_starts[..., None], 0, yb)
      y = y + yb
  if D is not None:
    y = y + uf * D.astype(acc)
  return y.astype(u.dtype), state


def s4d_step(
    state: Array | None,
    u: Array,
    A_real: Array,
    A_imag: Array,
    B: Array,
    C: Array,
    log_dt: Array,
    D: Array | None = None,
):
  """One token of a causal :func:`s4d`.

  Args:
    state: ``[B, D, N]`` complex, or None (zeros).
    u: ``[B, D]``; A_real, A_imag, B, C: ``[D, N]``; log_dt: ``[D]``; D: optional ``[D]``.

  Returns:
    ``(y, new_state)``: ``y`` ``[B, D]`` in the dtype of ``u``, ``new_state``
    ``[B, D, N]`` complex.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> A_re, A_im = ops.s4d_init("lin", 4, channels=3)  # [D, N]
    >>> B = jnp.ones((3, 4))
    >>> C = jax.random.normal(jax.random.key(1), (3, 4))
    >>> log_dt = ops.s4d_log_dt_init(jax.random.key(2), 3)
    >>> u = jax.random.normal(jax.random.key(0), (1, 8, 3))
    >>> _, state = ops.s4d(u[:, :7], A_re, A_im, B, C, log_dt, return_state=True)
    >>> y, state = ops.s4d_step(state, u[:, 7], A_re, A_im, B, C, log_dt)
    >>> y.shape, state.dtype
    ((1, 3), dtype('complex64'))
    >>> bool(jnp.allclose(y, ops.s4d(u, A_re, A_im, B, C, log_dt)[:, 7], atol=1e-5))
    True
  """
  common.check_rank("u", u, 2)
  common.check_float("u", u)
  d, n = _check_s4d_params(A_real, A_imag, B, C, log_dt, D, u.shape[1], False)
  dtA, bbar = s4d_discretize(A_real, A_imag, B, log_dt)
  acc = common.acc_dtype(u.dtype, A_real.dtype)
  uf = u.astype(acc)
  h = uf[..., None] * bbar
  if state is not None:
    common.check_shape("state", state, (u.shape[0], d, n), "[B, D, N]")
    _check_complex_state("state", state)
    h = h + jnp.exp(dtA) * state.astype(bbar.dtype)
  y = 2 * jnp.einsum("bdn,dn->bd", h, C.astype(h.dtype)).real
  if D is not None:
    y = y + uf * D.astype(acc)
  return y.astype(u.dtype), h
