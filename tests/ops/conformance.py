"""One spec per op, for the conformance suite in ``test_conformance.py``.

An :class:`OpSpec` says how to call an op in one uniform way and what to
compare it with:

* ``make(rng, t, dtype)``: random inputs with sequence length ``t``, a tuple
  of arrays (``names`` names them as the op does, for error messages);
  ``timed`` marks those with a sequence axis (axis 1);
* ``run(arrays, form, s0, seg)``: the op, returning ``(out, state)``
  (``state`` is ``None`` for ops without one);
* ``reference(arrays, s0, seg)``: the same computation written plainly here,
  in float32, token by token (a ``lax.scan`` over ``t``) for recurrences and
  with a dense ``T x T`` mask for attention;
* ``step(state, arrays_t)``: the ``*_step`` function on one token, if any;
* capabilities: the forms, whether the op takes an initial state and packed
  segments, which array is a log gate, the lengths it accepts, and the forms
  that take ``context=`` (the sequence split over devices) with the meshes
  they are checked on.

The checks themselves live in ``test_conformance.py`` and run on every spec;
checks that only make sense for one op stay in that op's test file.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from linear_attention import ops

F32 = jnp.float32
B, H, K, V = 2, 2, 8, 6  # K != V catches transposes
CHUNK = 16


# --------------------------------------------------------------------- inputs


def normal(rng, shape, dtype=F32, scale=1.0):
  return jnp.asarray(scale * rng.standard_normal(shape).astype(np.float32)).astype(dtype)


def uniform(rng, shape, lo, hi, dtype=F32):
  return jnp.asarray(rng.uniform(lo, hi, shape).astype(np.float32)).astype(dtype)


def log_gate(rng, shape, dtype=F32):
  """Log-space gates around ``log(sigmoid(2 + N(0, 1)))``: mostly mild, some strong."""
  return jax.nn.log_sigmoid(2.0 + normal(rng, shape)).astype(dtype)


def unit(x):
  """L2-normalised over the last axis (the delta rule's keys)."""
  xf = x.astype(F32)
  return (xf / jnp.linalg.norm(xf, axis=-1, keepdims=True)).astype(x.dtype)


def segment_starts(seg, b, t):
  """``[B, T]`` bool, True where a new segment begins (never at 0)."""
  if seg is None:
    return jnp.zeros((b, t), bool)
  return jnp.concatenate([jnp.zeros((b, 1), bool), seg[:, 1:] != seg[:, :-1]], axis=1)


def scan_reference(step, s0, timed, seg):
  """Runs ``step(s, start_t, *x_t) -> (s, o_t)`` over axis 1 of ``timed``.

  The state is zeroed at every segment start before the step (so ``s0``
  reaches the first segment only). Returns ``(o [B, T, ...], final state)``.
  """
  b, t = timed[0].shape[:2]
  starts = segment_starts(seg, b, t)

  def body(s, xs):
    start, *x = xs
    s = jnp.where(start.reshape((-1,) + (1,) * (s.ndim - 1)), jnp.zeros_like(s), s)
    return step(s, start, *x)

  xs = [starts.T] + [jnp.moveaxis(a.astype(F32) if jnp.issubdtype(a.dtype, jnp.floating)
                                  else a, 1, 0) for a in timed]
  s, o = lax.scan(body, s0, xs)
  return jnp.moveaxis(o, 0, 1), s


def outer(k, v):
  return k[..., :, None] * v[..., None, :]


def read(q, s):
  return jnp.einsum("bhk,bhkv->bhv", q, s, precision="highest")


def zeros_or(s0, shape):
  return jnp.zeros(shape, F32) if s0 is None else s0.astype(F32)


# --------------------------------------------------------------------- the spec


@dataclasses.dataclass(frozen=True)
class OpSpec:
  """How to call one op uniformly, and what to compare it with (see the module doc)."""

  name: str
  names: tuple[str, ...]
  make: Callable[..., tuple]
  timed: tuple[bool, ...]
  run: Callable[..., tuple]
  reference: Callable[..., tuple]
  forms: tuple[str, ...] = ("default",)
  make_state: Callable[..., Any] | None = None  # (rng, arrays) -> initial state
  state_name: str = "initial_state"
  step: Callable[..., tuple] | None = None
  step_state: Callable[..., Any] | None = None  # arrays -> state for the first step
  step_state_checked: bool = True  # the step refuses integer and half-precision states
  segments: bool = True  # takes segment_ids
  packs: bool = True  # a packed row equals its segments called one by one
  log_gate: int | None = None
  lengths: tuple[int, ...] = (1,)  # odd lengths beyond the T = 37 of the other checks
  grad_args: tuple[int, ...] | None = None  # differentiable arrays (default: float ones)
  bf16_args: tuple[int, ...] | None = None  # arrays given in bfloat16 (default: timed floats)
  rtol: float = 2e-4
  atol: float = 2e-4
  grad_tol: float = 1e-3
  bad: Callable[[], list] | None = None  # op-specific (call, message regex) pairs
  # The forms checked with ``context=`` against the unsharded op (empty: the op takes no
  # context): each on the first mesh of ``context_meshes`` (keys of
  # ``test_conformance.CONTEXT_MESHES``), the first form on every one of them.
  context: tuple[str, ...] = ()
  context_meshes: tuple[str, ...] = ("seq4",)

  def float_args(self, arrays):
    return tuple(i for i, a in enumerate(arrays)
                 if jnp.issubdtype(a.dtype, jnp.floating))

  def differentiable(self, arrays):
    return self.float_args(arrays) if self.grad_args is None else self.grad_args

  def low_precision(self, arrays):
    if self.bf16_args is not None:
      return self.bf16_args
    return tuple(i for i in self.float_args(arrays) if self.timed[i])

  def at(self, arrays, t):
    """The inputs of token ``t``: timed arrays indexed, the others as they are."""
    return tuple(a[:, t] if timed else a for a, timed in zip(arrays, self.timed))

  def slice(self, arrays, lo, hi):
    return tuple(a[:, lo:hi] if timed else a for a, timed in zip(arrays, self.timed))

  def __repr__(self):
    return self.name


# A kernel case's pseudo-form: the op's chunk form through its Pallas kernel
# (``implementation="pallas"``; see ``KERNEL_CASES``).
PALLAS = "pallas"


@dataclasses.dataclass(frozen=True)
class Sharded:
  """A pseudo-form: ``form`` called with ``context=context`` (a ``SeqContext``)."""

  form: str
  context: Any


def _unshard(form):
  """``(form, {"context": ...} or {})`` of a form that may be :class:`Sharded`."""
  if isinstance(form, Sharded):
    return form.form, {"context": form.context}
  return form, {}


def _kw(form, s0, seg, state=True):
  form, kw = _unshard(form)
  if form == PALLAS:
    kw.update(form="chunk", implementation="pallas")
  elif form != "default":
    kw["form"] = form
  if state:
    kw.update(initial_state=s0, return_state=True)
  if seg is not None:
    kw["segment_ids"] = seg
  return kw


# ------------------------------------------------------------ decay engine


def _make_qkv(rng, t, dtype, dk=K, dv=V):
  return normal(rng, (B, t, H, dk), dtype), normal(rng, (B, t, H, dk), dtype), normal(
      rng, (B, t, H, dv), dtype)


def _qk_state(rng, arrays):
  q, v = arrays[0], arrays[2]
  return normal(rng, (q.shape[0], q.shape[2], q.shape[3], v.shape[3]))


def ref_decay(arrays, s0, seg, *, scale=None):
  q, k, v, g = arrays
  scale = q.shape[-1] ** -0.5 if scale is None else scale
  g = jnp.zeros(q.shape[:3]) if g is None else g  # no decay

  def step(s, start, q_t, k_t, v_t, g_t):
    a = jnp.exp(g_t)
    s = (a[..., None, None] if a.ndim == 2 else a[..., None]) * s + outer(k_t, v_t)
    return s, scale * read(q_t, s)

  b, _, h, dk = q.shape
  return scan_reference(step, zeros_or(s0, (b, h, dk, v.shape[-1])), (q, k, v, g), seg)


DECAY = OpSpec(
    name="decay_linear_attention", context=("chunk",), context_meshes=("seq4", "data2_seq2"),
    names=("q", "k", "v", "log_decay"),
    make=lambda rng, t, dtype: _make_qkv(rng, t, dtype) + (log_gate(rng, (B, t, H, K), dtype),),
    timed=(True, True, True, True),
    run=lambda a, form, s0, seg: ops.decay_linear_attention(
        *a, chunk_size=CHUNK, **_kw(form, s0, seg)),
    reference=ref_decay, forms=("parallel", "chunk", "recurrent"), make_state=_qk_state,
    step=lambda s, a: ops.decay_linear_attention_step(s, *a),
    log_gate=3)

# The engine's per-head decay runs through retention and ssd below.


# ------------------------------------------------- kernelized linear attention


def _elu1(x):
  return jnp.where(x > 0, x + 1.0, jnp.exp(jnp.minimum(x, 0.0)))


def ref_linear(arrays, s0, seg):
  """Causal normalised ELU+1 attention; the state's last column is the normaliser."""
  q, k, v = arrays
  scale = q.shape[-1] ** -0.5
  ones = jnp.ones(v.shape[:-1] + (1,), F32)

  def step(s, start, q_t, k_t, v_t, one):
    s = s + outer(_elu1(k_t), jnp.concatenate([v_t, one], -1))
    return s, scale * read(_elu1(q_t), s)

  b, _, h, dk = q.shape
  out, s = scan_reference(step, zeros_or(s0, (b, h, dk, v.shape[-1] + 1)), (q, k, v, ones), seg)
  return out[..., :-1] / out[..., -1:], s


LINEAR = OpSpec(
    name="linear_attention", context=("chunk",),
    names=("q", "k", "v"),
    make=lambda rng, t, dtype: tuple(0.5 * x for x in _make_qkv(rng, t, dtype)),
    timed=(True, True, True),
    run=lambda a, form, s0, seg: ops.linear_attention(*a, chunk_size=CHUNK, **_kw(form, s0, seg)),
    reference=ref_linear, forms=("parallel", "chunk", "recurrent"),
    # A positive state keeps the normaliser away from zero.
    make_state=lambda rng, a: jnp.abs(normal(rng, (B, H, K, V + 1))),
    step=lambda s, a: ops.linear_attention_step(s, *a))


# ------------------------------------- polynomial kernels: Based and ReBased


def _packed_square(x):
  """The columns ``x_i x_j`` (``i <= j``) of ``x [..., d]``, off-diagonal ones times
  sqrt(2), in row-major order of the upper triangle: their dot product is ``(x.y)^2``."""
  d = x.shape[-1]
  cols = [x[..., i] * x[..., j] * (1.0 if i == j else np.sqrt(2.0))
          for i in range(d) for j in range(i, d)]
  return jnp.stack(cols, axis=-1)


def _taylor(x):
  d = x.shape[-1]
  return jnp.concatenate([jnp.ones(x.shape[:-1] + (1,)), x / d**0.25,
                          _packed_square(x) / np.sqrt(2.0 * d)], axis=-1)


def ref_normalised_kernel(phi, q, k, v, s0, seg, eps=1e-6):
  """Causal normalised attention with features ``phi``; the state's last column is ``z``."""
  ones = jnp.ones(v.shape[:-1] + (1,), F32)

  def step(s, start, q_t, k_t, v_t, one):
    s = s + outer(phi(k_t), jnp.concatenate([v_t, one], -1))
    return s, read(phi(q_t), s)

  b, _, h, dk = q.shape
  f = phi(jnp.zeros((dk,))).shape[-1]
  out, s = scan_reference(step, zeros_or(s0, (b, h, f, v.shape[-1] + 1)), (q, k, v, ones), seg)
  return out[..., :-1] / jnp.maximum(out[..., -1:], eps), s


def ref_based(arrays, s0, seg):
  return ref_normalised_kernel(_taylor, *arrays, s0, seg)


def _kernel_state(phi, rng, n=3):
  """A state ``[B, H, F, V + 1]`` that ``n`` earlier tokens could have left: polynomial
  features are not positive, so an arbitrary positive state could make a normaliser 0."""
  k, v = normal(rng, (B, n, H, K)), normal(rng, (B, n, H, V))
  return jnp.einsum("bnhf,bnhv->bhfv", phi(k), jnp.concatenate([v, jnp.ones((B, n, H, 1))], -1))


BASED = OpSpec(
    name="based", context=("chunk",), names=("q", "k", "v"),
    make=lambda rng, t, dtype: _make_qkv(rng, t, dtype),
    timed=(True, True, True),
    run=lambda a, form, s0, seg: ops.linear_attention(*a, feature_map="taylor", chunk_size=CHUNK,
                                                      **_kw(form, s0, seg)),
    reference=ref_based, forms=("parallel", "chunk", "recurrent"),
    make_state=lambda rng, a: _kernel_state(_taylor, rng),
    step=lambda s, a: ops.linear_attention_step(s, *a, feature_map="taylor"))


def _layer_norm(x, gamma, beta, eps=1e-5):
  x = x.astype(F32)
  mu = jnp.mean(x, -1, keepdims=True)
  var = jnp.mean((x - mu) ** 2, -1, keepdims=True)
  return (x - mu) / jnp.sqrt(var + eps) * gamma.astype(F32) + beta.astype(F32)


def ref_rebased(arrays, s0, seg):
  q, k, v, gamma, beta = arrays
  phi = lambda x: _packed_square(x) / np.sqrt(x.shape[-1])
  return ref_normalised_kernel(phi, _layer_norm(q, gamma, beta), _layer_norm(k, gamma, beta),
                               v, s0, seg)


def _rebased_bad():
  q, k, v = _make_qkv(np.random.default_rng(0), 4, F32)
  return [(lambda: ops.rebased_attention(q, k, v, jnp.ones((K + 1,)), jnp.zeros((K,))),
           r"\bgamma\b"),
          (lambda: ops.rebased_attention(q, k, v, jnp.ones((K,)), jnp.zeros((H + 1, K))),
           r"\bbeta\b")]


# (q.k)^2 / sum_j (q.k_j)^2 is ill-conditioned where a query's kernel values are all near 0
# (a lone key at a segment start, q~ orthogonal to k~): float32 rounding of the forms then
# differs by 1e-3 in the gradient. A shift beta near 1 keeps q~ . k~ ~ |beta|^2 = 8 +- 2.
REBASED = OpSpec(
    name="rebased_attention", context=("chunk",),
    names=("q", "k", "v", "gamma", "beta"),
    make=lambda rng, t, dtype: _make_qkv(rng, t, dtype) + (
        uniform(rng, (K,), 0.3, 0.7), 1.0 + normal(rng, (K,), scale=0.2)),
    timed=(True, True, True, False, False),
    run=lambda a, form, s0, seg: ops.rebased_attention(*a, chunk_size=CHUNK,
                                                       **_kw(form, s0, seg)),
    reference=ref_rebased, forms=("parallel", "chunk", "recurrent"),
    make_state=lambda rng, a: _kernel_state(
        lambda x: _packed_square(_layer_norm(x, a[3], a[4])) / np.sqrt(K), rng),
    step=lambda s, a: ops.rebased_attention_step(s, *a),
    bad=_rebased_bad)


# -------------------------------------------------- gated / decayed variants


def ref_gla(arrays, s0, seg):
  return ref_decay(arrays, s0, seg)


GLA = dataclasses.replace(
    DECAY, name="gla", context_meshes=("seq4",), names=("q", "k", "v", "log_g"), reference=ref_gla,
    run=lambda a, form, s0, seg: ops.gla(*a, chunk_size=CHUNK, **_kw(form, s0, seg)),
    step=lambda s, a: ops.gla_step(s, *a))


def ref_retention(arrays, s0, seg):
  q, k, v, gamma = arrays
  log_gamma = jnp.broadcast_to(jnp.log(gamma.astype(F32)), q.shape[:3])
  return ref_decay((q, k, v, log_gamma), s0, seg)


RETENTION = OpSpec(
    name="retention", context=("chunk",),
    names=("q", "k", "v", "gamma"),
    make=lambda rng, t, dtype: _make_qkv(rng, t, dtype) + (uniform(rng, (H,), 0.6, 0.97, dtype),),
    timed=(True, True, True, False),
    run=lambda a, form, s0, seg: ops.retention(*a[:3], gamma=a[3], chunk_size=CHUNK,
                                               **_kw(form, s0, seg)),
    reference=ref_retention, forms=("parallel", "chunk", "recurrent"), make_state=_qk_state,
    step=lambda s, a: ops.retention_step(s, *a[:3], gamma=a[3]))


def ref_hgrn2(arrays, s0, seg):
  q, log_f, v = arrays

  def step(s, start, q_t, lf_t, v_t):
    f = jnp.exp(lf_t)
    s = f[..., None] * s + outer(1.0 - f, v_t)
    return s, read(q_t, s)

  b, _, h, dk = q.shape
  return scan_reference(step, zeros_or(s0, (b, h, dk, v.shape[-1])), (q, log_f, v), seg)


HGRN2 = OpSpec(
    name="hgrn2", context=("chunk",),
    names=("q", "log_f", "v"),
    make=lambda rng, t, dtype: (normal(rng, (B, t, H, K), dtype),
                                log_gate(rng, (B, t, H, K), dtype), normal(rng, (B, t, H, V), dtype)),
    timed=(True, True, True),
    run=lambda a, form, s0, seg: ops.hgrn2(*a, chunk_size=CHUNK, **_kw(form, s0, seg)),
    reference=ref_hgrn2, forms=("parallel", "chunk", "recurrent"), make_state=_qk_state,
    step=lambda s, a: ops.hgrn2_step(s, *a), log_gate=1)


def ref_rwkv6(arrays, s0, seg):
  r, k, v, log_w, u = arrays
  u = u.astype(F32)

  def step(s, start, r_t, k_t, v_t, w_t):
    kv = outer(k_t, v_t)
    o_t = read(r_t, s + u[None, :, :, None] * kv)
    return jnp.exp(w_t)[..., None] * s + kv, o_t

  b, _, h, dk = r.shape
  return scan_reference(step, zeros_or(s0, (b, h, dk, v.shape[-1])), (r, k, v, log_w), seg)


RWKV6 = OpSpec(
    name="rwkv6", context=("chunk",),
    names=("r", "k", "v", "log_w", "u"),
    make=lambda rng, t, dtype: _make_qkv(rng, t, dtype) + (
        log_gate(rng, (B, t, H, K), dtype), normal(rng, (H, K), dtype)),
    timed=(True, True, True, True, False),
    run=lambda a, form, s0, seg: ops.rwkv6(*a, chunk_size=CHUNK, **_kw(form, s0, seg)),
    reference=ref_rwkv6, forms=("parallel", "chunk", "recurrent"), make_state=_qk_state,
    step=lambda s, a: ops.rwkv6_step(s, *a), log_gate=3)


SSD_GROUPS = 1  # heads 2 share one group of B and C


def ref_ssd(arrays, s0, seg):
  x, dt, A, Bm, C, D = arrays
  b, _, h, p = x.shape
  g, n = Bm.shape[-2:]
  group = np.arange(h) // (h // g)  # head -> group, Mamba-2's order
  A, D = A.astype(F32), D.astype(F32)

  def step(s, start, x_t, dt_t, b_t, c_t):
    s = jnp.exp(A * dt_t)[..., None, None] * s + outer(b_t[:, group], dt_t[..., None] * x_t)
    return s, read(c_t[:, group], s) + D[:, None] * x_t

  return scan_reference(step, zeros_or(s0, (b, h, n, p)), (x, dt, Bm, C), seg)


SSD = OpSpec(
    name="ssd", context=("chunk",),
    names=("x", "dt", "A", "B", "C", "D"),
    make=lambda rng, t, dtype: (
        normal(rng, (B, t, H, V), dtype), jax.nn.softplus(normal(rng, (B, t, H)) - 1.0).astype(dtype),
        -uniform(rng, (H,), 0.5, 2.0, dtype), normal(rng, (B, t, SSD_GROUPS, K), dtype),
        normal(rng, (B, t, SSD_GROUPS, K), dtype), normal(rng, (H,), dtype)),
    timed=(True, True, False, True, True, False),
    run=lambda a, form, s0, seg: ops.ssd(*a, chunk_size=CHUNK, **_kw(form, s0, seg)),
    reference=ref_ssd, forms=("parallel", "chunk", "recurrent"),
    make_state=lambda rng, a: normal(rng, (B, H, K, V)),
    step=lambda s, a: ops.ssd_step(s, *a), log_gate=2)


# ---------------------------------------------------------------- delta rule


def ref_delta(arrays, s0, seg):
  q, k, v, beta = arrays[:4]
  g = arrays[4] if len(arrays) > 4 else None
  b, t, h, dk = q.shape
  scale = dk**-0.5
  a = jnp.ones((b, t, h)) if g is None else jnp.exp(g.astype(F32))
  eye = jnp.eye(dk)

  def step(s, start, q_t, k_t, v_t, b_t, a_t):
    transition = a_t[..., None, None] * (eye - b_t[..., None, None] * outer(k_t, k_t))
    s = jnp.matmul(transition, s, precision="highest") + b_t[..., None, None] * outer(k_t, v_t)
    return s, scale * read(q_t, s)

  return scan_reference(step, zeros_or(s0, (b, h, dk, v.shape[-1])), (q, k, v, beta, a), seg)


def _make_delta(rng, t, dtype, gated=True):
  q, k, v = _make_qkv(rng, t, dtype)
  beta = uniform(rng, (B, t, H), 0.05, 1.95, dtype)
  gate = (log_gate(rng, (B, t, H), dtype),) if gated else ()
  return (q, unit(k), v, beta) + gate


GATED_DELTANET = OpSpec(
    name="gated_deltanet", context=("chunk",), context_meshes=("seq4", "data2_seq2"),
    names=("q", "k", "v", "beta", "log_decay"),
    make=_make_delta, timed=(True,) * 5,
    run=lambda a, form, s0, seg: ops.gated_deltanet(*a, chunk_size=CHUNK, **_kw(form, s0, seg)),
    reference=ref_delta, forms=("parallel", "chunk", "recurrent"),
    make_state=lambda rng, a: normal(rng, (B, H, K, V), scale=0.5),
    step=lambda s, a: ops.gated_deltanet_step(s, *a), log_gate=4,
    rtol=1e-4, atol=1e-4)

DELTANET = dataclasses.replace(
    GATED_DELTANET, name="deltanet", context=("recurrent",), context_meshes=("seq4",),
    names=("q", "k", "v", "beta"),
    make=lambda rng, t, dtype: _make_delta(rng, t, dtype, gated=False), timed=(True,) * 4,
    run=lambda a, form, s0, seg: ops.deltanet(*a, chunk_size=CHUNK, **_kw(form, s0, seg)),
    step=lambda s, a: ops.deltanet_step(s, *a), log_gate=None)


def _make_grouped_delta(rng, t, dtype):
  """Gated DeltaNet's arrays with one q/k head read by both value heads (grouped)."""
  q, k, v, beta, g = _make_delta(rng, t, dtype)
  return (q[:, :, :1], k[:, :, :1], v, beta, g)


def _repeat_qk(arrays):
  """The grouped arrays with q, k repeated per value head (what the grouped op equals)."""
  return tuple(jnp.repeat(x, H, axis=2) for x in arrays[:2]) + tuple(arrays[2:])


GROUPED_GATED_DELTANET = dataclasses.replace(
    GATED_DELTANET, name="gated_deltanet_grouped", context=(), make=_make_grouped_delta,
    reference=lambda a, s0, seg: ref_delta(_repeat_qk(a), s0, seg))


# ------------------------------------------- diagonal plus low rank (ops/dplr.py)


def ref_rwkv7(arrays, s0, seg):
  """RWKV-7 with the state ``S = wkv^T [K, V]``: ``S = (diag(w) - (a kappa) kappa^T) S + k v^T``,
  then the read plus the bonus ``(r . (rho k)) v``; scale 1."""
  r, k, v, log_w, kappa, a, rho = arrays
  b, _, h, dk = r.shape
  rho = rho.astype(F32)

  def step(s, start, r_t, k_t, v_t, w_t, kap_t, a_t):
    transition = jnp.exp(w_t)[..., :, None] * jnp.eye(dk) - outer(a_t * kap_t, kap_t)
    s = jnp.matmul(transition, s, precision="highest") + outer(k_t, v_t)
    bonus = jnp.sum(r_t * rho * k_t, axis=-1, keepdims=True) * v_t
    return s, read(r_t, s) + bonus

  return scan_reference(step, zeros_or(s0, (b, h, dk, v.shape[-1])),
                        (r, k, v, log_w, kappa, a), seg)


RWKV7 = OpSpec(
    name="rwkv7", context=("recurrent",),
    names=("r", "k", "v", "log_w", "kappa", "a", "bonus"),
    make=lambda rng, t, dtype: _make_qkv(rng, t, dtype) + (
        log_gate(rng, (B, t, H, K), dtype), unit(normal(rng, (B, t, H, K), dtype)),
        uniform(rng, (B, t, H, K), 0.05, 0.95, dtype), normal(rng, (H, K), dtype, scale=0.5)),
    timed=(True,) * 6 + (False,),
    run=lambda a, form, s0, seg: ops.rwkv7(*a, chunk_size=CHUNK, **_kw(form, s0, seg)),
    reference=ref_rwkv7, forms=("parallel", "chunk", "recurrent"),
    make_state=lambda rng, a: normal(rng, (B, H, K, V), scale=0.5),
    step=lambda s, a: ops.rwkv7_step(s, *a), log_gate=3,
    rtol=1e-4, atol=1e-4)


def ref_kda(arrays, s0, seg):
  """``S = (I - beta k k^T) diag(alpha) S + beta k v^T``, ``o = S^T q / sqrt(K)``."""
  q, k, v, beta, log_alpha = arrays
  b, _, h, dk = q.shape
  eye = jnp.eye(dk)

  def step(s, start, q_t, k_t, v_t, b_t, g_t):
    householder = eye - b_t[..., None, None] * outer(k_t, k_t)
    transition = jnp.matmul(householder, jnp.exp(g_t)[..., None, :] * eye, precision="highest")
    s = jnp.matmul(transition, s, precision="highest") + b_t[..., None, None] * outer(k_t, v_t)
    return s, dk**-0.5 * read(q_t, s)

  return scan_reference(step, zeros_or(s0, (b, h, dk, v.shape[-1])),
                        (q, k, v, beta, log_alpha), seg)


KDA = OpSpec(
    name="kda", context=("chunk",), context_meshes=("seq4", "data2_seq2"),
    names=("q", "k", "v", "beta", "log_alpha"),
    make=lambda rng, t, dtype: _make_delta(rng, t, dtype, gated=False) + (
        log_gate(rng, (B, t, H, K), dtype),),
    timed=(True,) * 5,
    run=lambda a, form, s0, seg: ops.kda(*a, chunk_size=CHUNK, **_kw(form, s0, seg)),
    reference=ref_kda, forms=("parallel", "chunk", "recurrent"),
    make_state=lambda rng, a: normal(rng, (B, H, K, V), scale=0.5),
    step=lambda s, a: ops.kda_step(s, *a), log_gate=4, rtol=1e-4, atol=1e-4)

HOUSEHOLDER = 2  # Gated DeltaProduct's steps per token


def ref_gated_deltaproduct(arrays, s0, seg):
  """``S = exp(g) S``, then per step ``S = (I - beta k k^T) S + beta k v^T``; ``o = S^T q / sqrt(K)``."""
  q, k, v, beta, g = arrays
  b, _, h, dk = q.shape
  eye = jnp.eye(dk)

  def step(s, start, q_t, k_t, v_t, b_t, g_t):
    s = jnp.exp(g_t)[..., None, None] * s
    for j in range(k_t.shape[2]):
      kj, bj = k_t[:, :, j], b_t[:, :, j, None, None]
      s = (jnp.matmul(eye - bj * outer(kj, kj), s, precision="highest")
           + bj * outer(kj, v_t[:, :, j]))
    return s, dk**-0.5 * read(q_t, s)

  return scan_reference(step, zeros_or(s0, (b, h, dk, v.shape[-1])), (q, k, v, beta, g), seg)


GATED_DELTAPRODUCT = OpSpec(
    name="gated_deltaproduct", context=("recurrent",),
    names=("q", "k", "v", "beta", "log_decay"),
    make=lambda rng, t, dtype: (
        normal(rng, (B, t, H, K), dtype), unit(normal(rng, (B, t, H, HOUSEHOLDER, K), dtype)),
        normal(rng, (B, t, H, HOUSEHOLDER, V), dtype),
        uniform(rng, (B, t, H, HOUSEHOLDER), 0.05, 1.95, dtype), log_gate(rng, (B, t, H), dtype)),
    timed=(True,) * 5,
    run=lambda a, form, s0, seg: ops.gated_deltaproduct(*a, chunk_size=CHUNK,
                                                        **_kw(form, s0, seg)),
    reference=ref_gated_deltaproduct, forms=("parallel", "chunk", "recurrent"),
    make_state=lambda rng, a: normal(rng, (B, H, K, V), scale=0.5),
    step=lambda s, a: ops.gated_deltaproduct_step(s, *a), log_gate=4, rtol=1e-4, atol=1e-4)

def ref_dplr(arrays, s0, seg):
  """Per token: ``S = (diag(exp(g)) + a_0 b_0^T) S + k_0 v_0^T``, then the other sub-steps
  without the decay; ``o = S^T q / sqrt(K)``."""
  q, k, v, a, b, g = arrays
  bsz, _, h, dk = q.shape
  eye = jnp.eye(dk)

  def step(s, start, q_t, k_t, v_t, a_t, b_t, g_t):
    for j in range(k_t.shape[2]):
      diag = jnp.exp(g_t)[..., :, None] * eye if j == 0 else eye
      s = (jnp.matmul(diag + outer(a_t[:, :, j], b_t[:, :, j]), s, precision="highest")
           + outer(k_t[:, :, j], v_t[:, :, j]))
    return s, dk**-0.5 * read(q_t, s)

  return scan_reference(step, zeros_or(s0, (bsz, h, dk, v.shape[-1])), (q, k, v, a, b, g), seg)


DPLR = OpSpec(
    name="dplr_attention", context=("recurrent",),
    names=("q", "k", "v", "a", "b", "log_decay"),
    make=lambda rng, t, dtype: (
        normal(rng, (B, t, H, K), dtype), normal(rng, (B, t, H, 2, K), dtype, scale=0.5),
        normal(rng, (B, t, H, 2, V), dtype), normal(rng, (B, t, H, 2, K), dtype, scale=0.3),
        normal(rng, (B, t, H, 2, K), dtype, scale=0.3), log_gate(rng, (B, t, H, K), dtype)),
    timed=(True,) * 6,
    run=lambda a, form, s0, seg: ops.dplr_attention(*a, chunk_size=CHUNK, **_kw(form, s0, seg)),
    reference=ref_dplr, forms=("parallel", "chunk", "recurrent"),
    make_state=lambda rng, a: normal(rng, (B, H, K, V), scale=0.5),
    step=lambda s, a: ops.dplr_attention_step(s, *a), log_gate=5,
    rtol=1e-4, atol=1e-4)


# -------------------------------------------------------- linear RNNs / SSMs


def ref_linear_scan(arrays, s0, seg):
  a, b = arrays

  def step(h, start, a_t, b_t):
    h = a_t * h + b_t
    return h, h

  return scan_reference(step, zeros_or(s0, b.shape[:1] + b.shape[2:]), (a, b), seg)


LINEAR_SCAN = OpSpec(
    name="linear_scan", context=("chunk", "recurrent"),
    names=("a", "b"),
    make=lambda rng, t, dtype: (uniform(rng, (B, t, H, 3), -1.0, 1.0, dtype),
                                normal(rng, (B, t, H, 3), dtype)),
    timed=(True, True),
    run=lambda a, form, s0, seg: ops.linear_scan(
        *a, chunk_size=CHUNK, **{k.replace("initial_state", "h0"): w
                                 for k, w in _kw(form, s0, seg).items()}),
    reference=ref_linear_scan, forms=("chunk", "associative", "recurrent"),
    make_state=lambda rng, a: normal(rng, (B, H, 3)), state_name="h0")


def ref_rg_lru(arrays, s0, seg, c=8.0):
  x, gr, gi, lam = arrays
  bsz, t, d = x.shape
  lam = lam.astype(F32)
  first = jnp.zeros((bsz, t), bool).at[:, 0].set(s0 is None)

  def step(h, start, x_t, r_t, i_t, first_t):
    a = jax.nn.sigmoid(lam) ** (c * jax.nn.sigmoid(r_t))
    new_doc = (start | first_t)[:, None]
    mult = jnp.where(new_doc, 1.0, jnp.sqrt(1.0 - a**2))
    h = a * h + mult * jax.nn.sigmoid(i_t) * x_t
    return h, h

  return scan_reference(step, zeros_or(s0, (bsz, d)), (x, gr, gi, first), seg)


RG_LRU = OpSpec(
    name="rg_lru", context=("chunk",), context_meshes=("seq4", "seq4_auto"),
    names=("x", "gate_r", "gate_i", "log_lambda_param"),
    make=lambda rng, t, dtype: (normal(rng, (B, t, 4), dtype), normal(rng, (B, t, 4), dtype),
                                normal(rng, (B, t, 4), dtype), uniform(rng, (4,), 0.0, 6.0, dtype)),
    timed=(True, True, True, False),
    run=lambda a, form, s0, seg: ops.rg_lru(
        *a, chunk_size=CHUNK, **{k.replace("initial_state", "h0"): w
                                 for k, w in _kw(form, s0, seg).items()}),
    reference=ref_rg_lru, forms=("chunk", "associative", "recurrent"),
    make_state=lambda rng, a: normal(rng, (B, 4)), state_name="h0",
    step=lambda s, a: ops.rg_lru_step(s, *a))


def _selective_bc(p, d):
  """``[B, (T,) G, N]`` -> ``[B, (T,) D, N]``: channel ``d`` reads group ``d // (D / G)``."""
  return jnp.repeat(p.astype(F32), d // p.shape[-2], axis=-2)


def ref_selective(arrays, s0, seg):
  x, dt, A, Bm, C, D, z, dt_bias = arrays
  bsz, t, d = x.shape
  delta = jax.nn.softplus(dt.astype(F32) + dt_bias.astype(F32))
  A = A.astype(F32)

  def step(h, start, x_t, delta_t, b_t, c_t):
    h = jnp.exp(delta_t[..., None] * A) * h + (delta_t * x_t)[..., None] * _selective_bc(b_t, d)
    return h, jnp.sum(h * _selective_bc(c_t, d), axis=-1)

  y, h = scan_reference(step, zeros_or(s0, (bsz, d, A.shape[1])), (x, delta, Bm, C), seg)
  y = (y + x.astype(F32) * D.astype(F32)) * jax.nn.silu(z.astype(F32))
  return y, h


SELECTIVE_SCAN = OpSpec(
    name="selective_scan", context=("recurrent", "chunk", "decay"),
    context_meshes=("seq4", "data2_seq2"),
    names=("x", "dt", "A", "B", "C", "D", "z", "dt_bias"),
    make=lambda rng, t, dtype: (
        normal(rng, (B, t, 4), dtype), normal(rng, (B, t, 4), dtype),
        -jnp.exp(normal(rng, (4, 3), scale=0.5)).astype(dtype), normal(rng, (B, t, 2, 3), dtype),
        normal(rng, (B, t, 2, 3), dtype), normal(rng, (4,), dtype), normal(rng, (B, t, 4), dtype),
        normal(rng, (4,), dtype, scale=0.5)),
    timed=(True, True, False, True, True, False, True, False),
    run=lambda a, form, s0, seg: ops.selective_scan(*a[:7], dt_bias=a[7], chunk_size=CHUNK,
                                                    **_kw(form, s0, seg)),
    reference=ref_selective, forms=("chunk", "associative", "recurrent", "decay"),
    make_state=lambda rng, a: normal(rng, (B, 4, 3)),
    step=lambda s, a: ops.selective_scan_step(s, *a[:7], dt_bias=a[7]),
    log_gate=2, rtol=1e-4, atol=1e-4)


def ref_s4d(arrays, s0, seg):
  u, ar, ai, b, c, log_dt, d = arrays
  dt = jnp.exp(log_dt.astype(F32))[:, None]
  a = lax.complex(ar.astype(F32), ai.astype(F32))
  abar = jnp.exp(dt * a)
  bbar = (abar - 1) / a * b

  def step(h, start, u_t):
    h = abar * h + bbar * u_t[..., None]
    return h, 2 * jnp.sum(c * h, axis=-1).real

  h0 = jnp.zeros(u.shape[:1] + ar.shape, jnp.complex64) if s0 is None else s0
  y, h = scan_reference(step, h0, (u,), seg)
  return y + u.astype(F32) * d.astype(F32), h


def _make_s4d(rng, t, dtype):
  ar, ai = ops.s4d_init("lin", 4, 3)
  ar = ar * uniform(rng, (3, 4), 0.5, 1.5)  # distinct per channel
  cplx = lambda shape: lax.complex(normal(rng, shape), normal(rng, shape))
  return (normal(rng, (B, t, 3), dtype), ar, ai, cplx((3, 4)), cplx((3, 4)),
          jnp.log(jnp.linspace(0.01, 0.2, 3)), normal(rng, (3,)))


def _complex(s0):
  """S4D's state travels through the suite as ``(real, imag)``: gradients and
  comparisons stay real."""
  return None if s0 is None else lax.complex(*s0)


def _split(out):
  y, h = out
  return y, (h.real, h.imag)


S4D = OpSpec(
    name="s4d", context=("chunk",),
    names=("u", "A_real", "A_imag", "B", "C", "log_dt", "D"),
    make=_make_s4d, timed=(True,) + (False,) * 6,
    run=lambda a, form, s0, seg: _split(ops.s4d(*a, chunk_size=CHUNK,
                                                 **_kw(form, _complex(s0), seg))),
    reference=lambda a, s0, seg: _split(ref_s4d(a, _complex(s0), seg)),
    forms=("fft", "chunk", "associative", "recurrent"),
    make_state=lambda rng, a: (normal(rng, (B, 3, 4)), normal(rng, (B, 3, 4))),
    step=lambda s, a: _split(ops.s4d_step(_complex(s), *a)),
    # A complex state cannot be made int32 or float16 through (real, imag):
    # test_ssm checks the dtype of S4D's state.
    step_state_checked=False,
    grad_args=(0, 1, 2, 5, 6), rtol=1e-4, atol=1e-4, grad_tol=2e-3)


CONV_WIDTH = 4


def ref_conv(arrays, s0, seg):
  x, weight, bias = arrays
  bsz, t, d = x.shape
  w = weight.shape[0]

  def step(window, start, x_t):
    window = jnp.concatenate([window[:, 1:], x_t[:, None]], axis=1)
    y = jnp.einsum("bwd,wd->bd", window, weight.astype(F32), precision="highest") + bias
    return window, jax.nn.silu(y)

  # The window carries the last W inputs; the state is its last W - 1.
  win0 = jnp.concatenate([jnp.zeros((bsz, 1, d)), zeros_or(s0, (bsz, w - 1, d))], axis=1)
  y, window = scan_reference(step, win0, (x,), seg)
  return y, window[:, 1:]


CONV = OpSpec(
    name="causal_conv1d", context=("default",), context_meshes=("seq4", "data2_seq2_auto"),
    names=("x", "weight", "bias"),
    make=lambda rng, t, dtype: (normal(rng, (B, t, 3), dtype), normal(rng, (CONV_WIDTH, 3)),
                                normal(rng, (3,))),
    timed=(True, False, False),
    run=lambda a, form, s0, seg: ops.causal_conv1d(*a, activation="silu", **_kw(form, s0, seg)),
    reference=ref_conv, make_state=lambda rng, a: normal(rng, (B, CONV_WIDTH - 1, 3)),
    step=lambda s, a: ops.causal_conv1d_step(s, *a, activation="silu"),
    rtol=1e-5, atol=1e-5)


# --------------------------------------------------- softmax and its relatives


def masked_softmax(q, k, v, allowed, scale=None):
  """Dense float32 softmax attention; ``allowed`` ``[B, Tq, Tk]``."""
  scale = q.shape[-1] ** -0.5 if scale is None else scale
  s = jnp.einsum("bqhd,bkhd->bhqk", q.astype(F32), k.astype(F32), precision="highest") * scale
  p = jax.nn.softmax(jnp.where(allowed[:, None], s, -jnp.inf), axis=-1)
  return jnp.einsum("bhqk,bkhd->bqhd", p, v.astype(F32), precision="highest")


def same_segment(seg, b, t):
  if seg is None:
    return jnp.ones((b, t, t), bool)
  run = jnp.cumsum(segment_starts(seg, b, t), axis=1)
  return run[:, :, None] == run[:, None, :]


def causal_mask(t):
  return jnp.tril(jnp.ones((t, t), bool))[None]


def _attention_kw(form):
  """The keywords of an attention op for a (possibly :class:`Sharded`) form."""
  form, kw = _unshard(form)
  if form == PALLAS:
    kw["implementation"] = "pallas"
  elif form != "default":
    kw["algorithm"] = form
  return kw


def ref_softmax(arrays, s0, seg):
  q = arrays[0]
  b, t = q.shape[:2]
  return masked_softmax(*arrays, causal_mask(t) & same_segment(seg, b, t)), None


SOFTMAX = OpSpec(
    name="softmax_attention", names=("q", "k", "v"),
    make=_make_qkv, timed=(True, True, True),
    run=lambda a, form, s0, seg: (ops.softmax_attention(
        *a, causal=True, block_size=CHUNK, segment_ids=seg, **_attention_kw(form)), None),
    reference=ref_softmax, forms=("naive", "blockwise"), rtol=1e-4, atol=1e-5,
    context=("naive", "blockwise"), context_meshes=("data2_seq2_auto",))

def ref_forgetting(arrays, s0, seg):
  """Causal softmax with the bias ``sum_{j < s <= i} log f_s``, summed per pair (no cumsum)."""
  q, k, v, g = arrays
  b, t, h, dk = q.shape
  i, j, s = (np.arange(t).reshape(shape) for shape in ((t, 1, 1), (1, t, 1), (1, 1, t)))
  between = jnp.asarray((j < s) & (s <= i))  # [Tq, Tk, Ts]
  # where, not a product: a -inf gate must give -inf, not NaN (0 * -inf).
  gates = jnp.swapaxes(g.astype(F32), 1, 2)[:, :, None, None, :]  # [B, H, 1, 1, Ts]
  bias = jnp.sum(jnp.where(between, gates, 0.0), axis=-1)  # [B, H, Tq, Tk]
  logits = jnp.einsum("bqhd,bkhd->bhqk", q.astype(F32), k.astype(F32),
                      precision="highest") * dk**-0.5 + bias
  allowed = (causal_mask(t) & same_segment(seg, b, t))[:, None]
  p = jax.nn.softmax(jnp.where(allowed, logits, -jnp.inf), axis=-1)
  return jnp.einsum("bhqk,bkhd->bqhd", p, v.astype(F32), precision="highest"), None


FORGETTING = OpSpec(
    name="forgetting_attention", names=("q", "k", "v", "log_fgate"),
    make=lambda rng, t, dtype: _make_qkv(rng, t, dtype) + (log_gate(rng, (B, t, H), dtype),),
    timed=(True, True, True, True),
    run=lambda a, form, s0, seg: (ops.forgetting_attention(
        *a, block_size=CHUNK, segment_ids=seg, **_attention_kw(form)), None),
    reference=ref_forgetting, forms=("naive", "blockwise"), log_gate=3,
    step=lambda cache, a: ops.forgetting_attention_step(cache, *a), step_state_checked=False,
    step_state=lambda a: ops.init_forgetting_cache(a[0].shape[0], H, a[0].shape[1], K, V),
    rtol=1e-4, atol=1e-5, context=("naive", "blockwise"))


WINDOW = 5


def window_mask(t, window=WINDOW):
  i, j = np.arange(t)[:, None], np.arange(t)[None, :]
  return jnp.asarray((j <= i) & (i - j < window))[None]


def ref_sliding_window(arrays, s0, seg):
  q = arrays[0]
  b, t = q.shape[:2]
  return masked_softmax(*arrays, window_mask(t) & same_segment(seg, b, t)), None


def _sliding_step(cache, a):
  return ops.sliding_window_step(cache, *a, window=WINDOW)


SLIDING_WINDOW = OpSpec(
    name="sliding_window_attention", names=("q", "k", "v"),
    make=_make_qkv, timed=(True, True, True),
    run=lambda a, form, s0, seg: (ops.sliding_window_attention(
        *a, window=WINDOW, block_size=8, segment_ids=seg, **_attention_kw(form)), None),
    reference=ref_sliding_window, rtol=1e-4, atol=1e-5, context=("default",),
    step=_sliding_step, step_state_checked=False,
    step_state=lambda a: ops.init_sliding_window_cache(a[0].shape[0], H, WINDOW, K, V))


def ref_longformer(arrays, s0, seg):
  q, k, v, glob = arrays
  b, t = q.shape[:2]
  allowed = window_mask(t)[0] | (window_mask(t)[0].T)
  allowed = allowed[None] | glob[:, :, None] | glob[:, None, :]
  return masked_softmax(q, k, v, allowed & same_segment(seg, b, t)), None


def _globals(rng, t):
  g = np.zeros((B, t), bool)
  g[0, rng.choice(t, size=min(2, t), replace=False)] = True
  g[1, 0] = True
  return jnp.asarray(g)


LONGFORMER = OpSpec(
    name="longformer_attention", names=("q", "k", "v", "global_mask"),
    make=lambda rng, t, dtype: _make_qkv(rng, t, dtype) + (_globals(rng, t),),
    timed=(True, True, True, True),
    run=lambda a, form, s0, seg: (ops.longformer_attention(
        *a, window=WINDOW, max_globals=4, block_size=8, segment_ids=seg), None),
    reference=ref_longformer, rtol=1e-4, atol=1e-5)

BIGBIRD_BLOCK = 4
BIGBIRD_KEY = jax.random.PRNGKey(3)


def ref_bigbird(arrays, s0, seg):
  q = arrays[0]
  b, t = q.shape[:2]
  pattern = ops.bigbird_pattern(-(-t // BIGBIRD_BLOCK), key=BIGBIRD_KEY, causal=True)
  blk = jnp.arange(t) // BIGBIRD_BLOCK
  allowed = pattern.matrix[blk[:, None], blk[None, :]][None] & causal_mask(t)
  return masked_softmax(*arrays, allowed & same_segment(seg, b, t)), None


BIGBIRD = OpSpec(
    name="bigbird_attention", names=("q", "k", "v"),
    make=_make_qkv, timed=(True, True, True),
    run=lambda a, form, s0, seg: (ops.bigbird_attention(
        *a, block_size=BIGBIRD_BLOCK, key=BIGBIRD_KEY, causal=True, segment_ids=seg), None),
    reference=ref_bigbird, rtol=1e-4, atol=1e-5,
    # The random blocks are drawn per length, so a packed row and its segments
    # called alone see different patterns: packing is checked against the
    # reference (with segments) only. At least g + w + r = 7 blocks of 4.
    packs=False, lengths=(29,))

LINFORMER_P = 5


def ref_linformer(arrays, s0, seg):
  q, k, v, E, F = arrays
  kp = jnp.einsum("pt,bthd->bphd", E.astype(F32), k.astype(F32), precision="highest")
  vp = jnp.einsum("pt,bthd->bphd", F.astype(F32), v.astype(F32), precision="highest")
  allowed = jnp.ones((q.shape[0], q.shape[1], LINFORMER_P), bool)
  return masked_softmax(q, kp, vp, allowed), None


LINFORMER = OpSpec(
    name="linformer_attention", names=("q", "k", "v", "E", "F"),
    make=lambda rng, t, dtype: _make_qkv(rng, t, dtype) + tuple(
        normal(rng, (LINFORMER_P, t), dtype, scale=t**-0.5) for _ in range(2)),
    # E and F are [P, T]: axis 1 is the sequence.
    timed=(True,) * 5,
    run=lambda a, form, s0, seg: (ops.linformer_attention(*a), None),
    reference=ref_linformer, segments=False, packs=False, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------- mLSTM (xLSTM)


def ref_mlstm(arrays, s0, seg, *, forget_gate="sigmoid"):
  """The stabilised mLSTM of Beck et al. (2024), token by token: C, n and the max state m."""
  q, k, v, ig, fg = (a.astype(F32) for a in arrays)
  b, t, h, dk = q.shape
  dv = v.shape[-1]
  scale = dk ** -0.5
  log_f = jax.nn.log_sigmoid(fg) if forget_gate == "sigmoid" else fg
  if s0 is None:
    s0 = (jnp.zeros((b, h, dk, dv)), jnp.zeros((b, h, dk)), jnp.full((b, h), -jnp.inf))
  starts = segment_starts(seg, b, t)

  def body(s, x):
    start, q_t, k_t, v_t, i_t, f_t = x
    # A fresh memory (and a segment start) is C = 0, n = 0, m = -inf.
    c, n, m = (jnp.where(start.reshape((-1,) + (1,) * (y.ndim - 1)), fresh, y)
               for y, fresh in zip(s, (0.0, 0.0, -jnp.inf)))
    m_new = jnp.maximum(f_t + m, i_t)
    fw, iw = jnp.exp(f_t + m - m_new), jnp.exp(i_t - m_new)
    c = fw[..., None, None] * c + iw[..., None, None] * outer(k_t, v_t)
    n = fw[..., None] * n + iw[..., None] * k_t
    num = read(scale * q_t, c)
    den = jnp.einsum("bhk,bhk->bh", scale * q_t, n, precision="highest")
    return (c, n, m_new), num / jnp.maximum(jnp.abs(den), jnp.exp(-m_new))[..., None]

  xs = [starts.T] + [jnp.moveaxis(a, 1, 0) for a in (q, k, v, ig, log_f)]
  s, o = lax.scan(body, tuple(x.astype(F32) for x in s0), xs)
  return jnp.moveaxis(o, 0, 1), s


def _make_mlstm(rng, t, dtype, forget_gate="sigmoid"):
  # Input gates exp(N(-1, 1.5^2)) move the stabiliser but keep |n^T q| from cancelling
  # far above the normaliser's floor of 1 (where h = C q / n q is ill-conditioned and
  # a different summation order alone changes it; test_mlstm covers gates of +-80).
  f_gate = (normal(rng, (B, t, H), scale=0.5) + (2.0 if forget_gate == "sigmoid" else -0.1))
  i_gate = normal(rng, (B, t, H), scale=1.5) - 1.0
  return _make_qkv(rng, t, dtype) + (i_gate.astype(dtype), f_gate.astype(dtype))


MLSTM = OpSpec(
    name="mlstm", context=("chunk",),
    names=("q", "k", "v", "i_gate", "f_gate"),
    make=_make_mlstm, timed=(True,) * 5,
    run=lambda a, form, s0, seg: ops.mlstm(*a, chunk_size=CHUNK, **_kw(form, s0, seg)),
    reference=ref_mlstm, forms=("parallel", "chunk", "recurrent"),
    make_state=lambda rng, a: (normal(rng, (B, H, K, V)), normal(rng, (B, H, K)),
                               normal(rng, (B, H))),
    step=lambda s, a: ops.mlstm_step(s, *a))

MLSTM_EXP = dataclasses.replace(
    MLSTM, name="mlstm_exp",
    make=lambda rng, t, dtype: _make_mlstm(rng, t, dtype, forget_gate="exp"),
    run=lambda a, form, s0, seg: ops.mlstm(*a, forget_gate="exp", chunk_size=CHUNK,
                                           **_kw(form, s0, seg)),
    reference=lambda a, s0, seg: ref_mlstm(a, s0, seg, forget_gate="exp"),
    step=lambda s, a: ops.mlstm_step(s, *a, forget_gate="exp"))


# ------------------------------------------------------------ log-linear attention

LEVELS = 4  # T = 37 needs 7: the top level is shared, as with any L too small


def ref_loglinear(arrays, s0, seg, *, scale=None):
  """Fenwick-tree states token by token (Guo et al. 2025): ``q, k, v, log_decay,
  level_weights``; the state is ``(S [B, H, L, K, V], position [B])``.

  A token lands at level 0; then, as in a binary counter, the bucket carries
  up through every occupied level (bit ``l - 1`` of the position) into the
  first free one; the top level ``L - 1`` absorbs whatever reaches it.
  """
  q, k, v, g, lam = (a.astype(F32) for a in arrays)
  b, t, h, dk = q.shape
  levels = lam.shape[-1]
  scale = dk ** -0.5 if scale is None else scale
  if s0 is None:
    s0 = (jnp.zeros((b, h, levels, dk, v.shape[-1])), jnp.zeros((b,)))
  starts = segment_starts(seg, b, t)

  def body(carry, x):
    s, pos = carry
    start, q_t, k_t, v_t, g_t, l_t = x
    s = jnp.where(start[:, None, None, None, None], 0.0, s)
    pos = jnp.where(start, 0.0, pos).astype(jnp.int32)
    a = jnp.exp(g_t)
    s = s * (a[:, :, None, None, None] if a.ndim == 2 else a[:, :, None, :, None])
    s = s.at[:, :, 0].add(outer(k_t, v_t))
    o = jnp.einsum("bhk,bhlkv,bhl->bhv", scale * q_t, s, l_t, precision="highest")
    if levels > 1:
      bucket, moving = s[:, :, 0], jnp.ones((b,), bool)
      s = s.at[:, :, 0].set(0.0)
      for lvl in range(1, levels):
        m = moving[:, None, None, None]
        if lvl == levels - 1:
          s = s.at[:, :, lvl].add(jnp.where(m, bucket, 0.0))
          break
        occupied = ((pos >> (lvl - 1)) & 1).astype(bool)
        take = (moving & occupied)[:, None, None, None]
        new = jnp.where(take, 0.0, s[:, :, lvl] + jnp.where(m, bucket, 0.0))
        bucket = jnp.where(take, bucket + s[:, :, lvl], bucket)
        s = s.at[:, :, lvl].set(new)
        moving = moving & occupied
    return (s, (pos + 1).astype(F32)), o

  xs = [starts.T] + [jnp.moveaxis(a, 1, 0) for a in (q, k, v, g, lam)]
  (s, pos), o = lax.scan(body, (s0[0].astype(F32), s0[1].astype(F32)), xs)
  return jnp.moveaxis(o, 0, 1), (s, pos)


def ref_loglinear_ssd(arrays, s0, seg):
  x, dt, A, Bm, C, lam, D = (a.astype(F32) for a in arrays)
  h = x.shape[2]
  group = np.arange(h) // (h // Bm.shape[-2])
  o, s = ref_loglinear((C[:, :, group], Bm[:, :, group], dt[..., None] * x, A * dt, lam), s0, seg,
                       scale=1.0)
  return o + D[:, None] * x, s


def _loglinear_state(rng, a, dk=K, dv=V):
  pos = rng.integers(0, 40, size=(B,)).astype(np.float32)
  return (normal(rng, (B, H, LEVELS, dk, dv)), jnp.asarray(pos))


def _levels(rng, t, dtype):
  return jax.nn.softplus(normal(rng, (B, t, H, LEVELS))).astype(dtype)


LOGLINEAR_SSD = OpSpec(
    name="loglinear_ssd", context=("chunk",),
    names=("x", "dt", "A", "B", "C", "level_weights", "D"),
    make=lambda rng, t, dtype: SSD.make(rng, t, dtype)[:5] + (
        _levels(rng, t, dtype), normal(rng, (H,), dtype)),
    timed=(True, True, False, True, True, True, False),
    run=lambda a, form, s0, seg: ops.loglinear_ssd(*a[:6], a[6], chunk_size=CHUNK,
                                                   **_kw(form, s0, seg)),
    reference=ref_loglinear_ssd, forms=("parallel", "chunk", "recurrent"),
    make_state=lambda rng, a: _loglinear_state(rng, a, K, V),
    step=lambda s, a: ops.loglinear_ssd_step(s, *a), log_gate=2)

LOGLINEAR_GLA = OpSpec(
    name="loglinear_gla", context=("chunk",), context_meshes=("seq4_auto",),
    names=("q", "k", "v", "log_g", "level_weights"),
    make=lambda rng, t, dtype: _make_qkv(rng, t, dtype) + (
        log_gate(rng, (B, t, H, K), dtype), _levels(rng, t, dtype)),
    timed=(True,) * 5,
    run=lambda a, form, s0, seg: ops.loglinear_gla(*a, chunk_size=CHUNK, **_kw(form, s0, seg)),
    reference=lambda a, s0, seg: ref_loglinear(a, s0, seg), forms=("parallel", "chunk", "recurrent"),
    make_state=_loglinear_state,
    step=lambda s, a: ops.loglinear_gla_step(s, *a), log_gate=3)


SPECS = (DECAY, LINEAR, GLA, RETENTION, HGRN2, RWKV6, SSD, GATED_DELTANET,
         GROUPED_GATED_DELTANET, DELTANET, LINEAR_SCAN, RG_LRU, SELECTIVE_SCAN, S4D, CONV, SOFTMAX, SLIDING_WINDOW,
         LONGFORMER, BIGBIRD, LINFORMER, RWKV7, KDA, GATED_DELTAPRODUCT, DPLR,
         MLSTM, MLSTM_EXP,
         LOGLINEAR_SSD, LOGLINEAR_GLA,
         BASED, REBASED, FORGETTING)
STATEFUL = tuple(s for s in SPECS if s.make_state is not None)
WITH_STEP = tuple(s for s in SPECS if s.step is not None)
WITH_LOG_GATE = tuple(s for s in SPECS if s.log_gate is not None)
assert all(len(s.names) == len(s.timed) for s in SPECS)


# ------------------------------------------------------------------ Pallas kernels


@dataclasses.dataclass(frozen=True)
class Kernel:
  """A Pallas kernel that ops reach with ``implementation="pallas"``.

  ``entry``: the name its entry point gives ``engines.dispatch.resolve_launch``
  (the suite checks that the op launched it); ``segments``: whether it takes
  packed ``segment_ids`` (where not, the op must refuse them under ``"pallas"``,
  naming ``segment_ids``).
  """

  entry: str
  segments: bool = True


CHUNK_DECAY = Kernel("chunk_decay_attention", segments=False)
CHUNK_DELTA = Kernel("chunk_delta_attention")
CHUNK_DPLR = Kernel("chunk_dplr_attention")
FLASH_ATTENTION = Kernel("flash_attention")
LINEAR_SCAN_KERNEL = Kernel("the Pallas linear_scan")

GPU = ("gpu",)
GPU_TPU = ("gpu", "tpu")


@dataclasses.dataclass(frozen=True)
class KernelCase:
  """An op run through its kernel (the pseudo-form :data:`PALLAS`), in the interpret
  mode of each of ``platforms`` (natively on a host that is one)."""

  spec: OpSpec
  kernel: Kernel
  platforms: tuple[str, ...] = GPU

  @property
  def name(self):
    return self.spec.name


# Every op that reaches a kernel, one line each. The GPU interpret path for
# every op; the TPU one too for one op per kernel and mode that the op layer
# reaches differently (the others test the op's mapping onto the kernel, the
# same on both platforms, and tests/kernels runs every mode on both): the TPU
# interpreter takes 4-13 CPU s a case here, the GPU one 1-3 s.
KERNEL_CASES = (
    KernelCase(DECAY, CHUNK_DECAY, GPU_TPU),  # per-channel decay
    KernelCase(RETENTION, CHUNK_DECAY, GPU_TPU),  # scalar decay
    KernelCase(LINEAR, CHUNK_DECAY, GPU_TPU),  # no decay; the normaliser as a value column
    KernelCase(GLA, CHUNK_DECAY),
    KernelCase(HGRN2, CHUNK_DECAY),
    KernelCase(RWKV6, CHUNK_DECAY),
    KernelCase(SSD, CHUNK_DECAY),
    KernelCase(MLSTM, CHUNK_DECAY),
    KernelCase(BASED, CHUNK_DECAY),
    KernelCase(REBASED, CHUNK_DECAY),
    KernelCase(DELTANET, CHUNK_DELTA),
    KernelCase(GATED_DELTANET, CHUNK_DELTA, GPU_TPU),
    KernelCase(KDA, CHUNK_DPLR, GPU_TPU),  # per-channel decay, rank one
    KernelCase(RWKV7, CHUNK_DPLR),
    KernelCase(GATED_DELTAPRODUCT, CHUNK_DPLR),  # rank R: R sub-steps a token
    KernelCase(DPLR, CHUNK_DPLR),
    KernelCase(SOFTMAX, FLASH_ATTENTION),
    KernelCase(SLIDING_WINDOW, FLASH_ATTENTION, GPU_TPU),  # a band, causal, segments
    KernelCase(LINEAR_SCAN, LINEAR_SCAN_KERNEL, GPU_TPU),
)
# (case, platform) pairs, the parameters of the kernel checks.
KERNEL_RUNS = tuple((c, p) for c in KERNEL_CASES for p in c.platforms)
assert all(c.spec in SPECS for c in KERNEL_CASES)
