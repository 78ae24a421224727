"""Benchmark of the ops: time, throughput and peak memory against sequence length.

Each (case, T) runs in its own subprocess, so its peak resident memory
(``ru_maxrss``) is its own. The float32 2048x2048 matmul rate is measured in the
same run, and every case reports its GFLOP/s and the ratio to that rate, since
shared machines drift; process CPU time is recorded beside wall time for the
same reason. Results go to ``<out>/bench_ops.json`` (``bench_ops_<group>.json``
for one group, ``bench_ops_custom.json`` with ``--cases``,
``bench_ops_<tag>.json`` with ``--tag``, ``*_smoke.json`` with ``--smoke``); a
table and a "targets" section (the figures the issues ask for, each met / not
met / not measured) are printed and stored.

    python experiments/bench_ops.py                       # every case, default lengths
    python experiments/bench_ops.py --group gated         # foundation|gated|ssm|sparse|all
    python experiments/bench_ops.py --cases chunk,naive_softmax --seqs 1024,4096
    python experiments/bench_ops.py --smoke --group all   # tiny, one subprocess, for CI
    python experiments/bench_ops.py --plan --group ssm    # XLA memory plans only, runs nothing
    python experiments/bench_ops.py --report results/bench_ops_gated.json results/bench_ops_ssm.json

Groups: ``foundation`` (issue 2: the diagonal-decay engine, ELU linear
attention, softmax baselines, step latency), ``gated`` (issue 3: GLA, RetNet,
HGRN2, RWKV-6, Mamba-2/SSD, DeltaNet, Gated DeltaNet in chunk, recurrent and
parallel forms), ``ssm`` (issue 4: the scan engine, Mamba's selective scan in
every form, RG-LRU, S4D), ``sparse`` (issue 5: sliding window, Longformer,
BigBird, Linformer, with naive softmax as the baseline).

Default lengths per case (``--seqs`` overrides them all): linear-time forms
1k..64k; recurrent forms of matrix-state variants and every parallel form 1k
and 4k (the delta rule's parallel form, cubic as written, 1k only); naive
softmax up to 16k; token-by-token scans of the elementwise
state-space ops 1k..16k (issue 4 compares them at 16k).

Skipping: a (case, T) whose estimated forward memory exceeds ``--mem-limit-gb``
is not started; fwd+bwd is not run when its estimate does, when XLA's compiled
memory plan (arguments + temporaries + outputs) does, or when the forward time
suggests it would overrun ``--budget``; a subprocess is killed after
``3 * budget`` seconds. Each skip is recorded with its reason.

Timing: functions are compiled ahead of time; below T=16k the best of 3
calls after a warm-up call, from 16k on one call. ``*_cpu_s`` is the process
CPU time (``time.process_time``, all threads) of the same calls: on a shared
machine wall time above CPU time / threads means the process waited.

FLOP counts (forward; fwd+bwd GFLOP/s use 3x the forward count) are derived
in the ``*_flops`` functions below. Matrix-state engines, softmax and S4D's
FFT form count the algorithm as written (masked-out work included); sparse
methods count the visible (query, key) pairs; elementwise scans count the
recurrence itself, the same for every form of one op, so their GFLOP/s
compare forms directly. ``--smoke`` runs every case at T=256 in one
subprocess compiled at XLA's lowest optimisation level (compilation is most
of its time); it exits non-zero if a case fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import resource
import subprocess
import sys
import time
from typing import Callable

B, H, D = 1, 4, 64  # attention cases: batch, heads, key = value dim (issues 2, 3, 5)
CH, N = 256, 16  # scan / Mamba / RG-LRU / S4D channels and Mamba state (issue 4)
S4D_N = 64  # S4D modes: 64, the S4D paper's default state size
CHUNK = 64
GB = 1 << 30

LINEAR = (1024, 4096, 16384, 65536)
SHORT = (1024, 4096)  # recurrent forms of matrix-state variants; parallel forms
QUAD = (1024, 4096, 16384)  # naive softmax
SCAN_RECURRENT = (1024, 4096, 16384)  # token-by-token forms of the elementwise ops
SMOKE_T = 256


@dataclasses.dataclass(frozen=True)
class Sizes:
  """Sizes of the sparse methods (issue 5), smaller under ``--smoke``."""
  window: int = 256
  globals: int = 16  # Longformer global tokens (the first ones, like [CLS] + a question)
  bb_block: int = 64
  bb_window: int = 3
  bb_random: int = 2
  bb_global: int = 2
  linformer_k: int = 256


SIZES = Sizes()
SMOKE_SIZES = Sizes(window=64, globals=4, bb_block=32, linformer_k=64)


def _normal(rng, n, shape):
  import jax
  return tuple(jax.random.normal(k, shape) for k in jax.random.split(rng, n))


# --------------------------------------------------------------------- builders


def _engine_case(form, decay):
  """The diagonal-decay engine (``decay``: none | scalar | vector) in one form."""

  def build(t, rng, sz):
    import jax
    from linear_attention import ops
    kq, kg = jax.random.split(rng)
    q, k, v = _normal(kq, 3, (B, t, H, D))
    shape = {"none": None, "scalar": (B, t, H), "vector": (B, t, H, D)}[decay]
    args = (q, k, v) if shape is None else (q, k, v, -jax.random.uniform(kg, shape))
    fn = lambda *a: ops.decay_linear_attention(*a, form=form, chunk_size=CHUNK)
    return fn, args

  return build


def _linear_case(form):
  def build(t, rng, sz):
    from linear_attention import ops
    q, k, v = _normal(rng, 3, (B, t, H, D))
    return (lambda q, k, v: ops.linear_attention(q, k, v, form=form, chunk_size=CHUNK)), (q, k, v)

  return build


def _softmax_case(algorithm):
  def build(t, rng, sz):
    from linear_attention import ops
    q, k, v = _normal(rng, 3, (B, t, H, D))
    fn = lambda q, k, v: ops.softmax_attention(q, k, v, causal=True, algorithm=algorithm)
    return fn, (q, k, v)

  return build


def _gated_case(variant, form):
  """Issue 3's variants with realistic gates: ``form`` is chunk | recurrent | parallel."""

  def build(t, rng, sz):
    import jax
    import jax.numpy as jnp
    from linear_attention import ops
    kx, kg, ku = jax.random.split(rng, 3)
    q, k, v = _normal(kx, 3, (B, t, H, D))
    kw = dict(form=form, chunk_size=CHUNK)
    noise = lambda shape: jax.random.normal(kg, shape)
    if variant == "gla":
      # GLA's gate: log_sigmoid of the gate logits over its normaliser 16.
      log_g = jax.nn.log_sigmoid(noise((B, t, H, D))) / 16
      return (lambda q, k, v, g: ops.gla(q, k, v, g, **kw)), (q, k, v, log_g)
    if variant == "retention":  # fixed multi-scale gammas, nothing data dependent
      return (lambda q, k, v: ops.retention(q, k, v, **kw)), (q, k, v)
    if variant == "hgrn2":
      log_f = jax.nn.log_sigmoid(noise((B, t, H, D)))
      return (lambda q, f, v: ops.hgrn2(q, f, v, **kw)), (q, log_f, v)
    if variant == "rwkv6":
      # RWKV-6's decay -exp(w), w spread over [-5, -1] as its init spreads it.
      log_w = -jnp.exp(-5 + 4 * jax.random.uniform(kg, (B, t, H, D)))
      u = 0.1 * jax.random.normal(ku, (H, D))
      return (lambda r, k, v, w, u: ops.rwkv6(r, k, v, w, u, **kw)), (q, k, v, log_w, u)
    if variant == "ssd":
      # Mamba-2 terms: x [B,T,H,P], dt log-uniform in [1e-3, 0.1] (its dt init),
      # A in -[1, 16] (its A init), one group of B, C with N = 64 = K.
      x = v
      dt = jnp.exp(jax.random.uniform(kg, (B, t, H), minval=math.log(1e-3),
                                      maxval=math.log(1e-1)))
      a = -jax.random.uniform(ku, (H,), minval=1.0, maxval=16.0)
      bm, cm = q[:, :, :1], k[:, :, :1]
      return (lambda x, dt, a, bm, cm: ops.ssd(x, dt, a, bm, cm, **kw)), (x, dt, a, bm, cm)
    # The delta rule: L2-normalised q and k, beta = sigmoid(noise) in (0, 1).
    q, k = (x / jnp.linalg.norm(x, axis=-1, keepdims=True) for x in (q, k))
    beta = jax.nn.sigmoid(noise((B, t, H)))
    if variant == "deltanet":
      return (lambda q, k, v, b: ops.deltanet(q, k, v, b, **kw)), (q, k, v, beta)
    log_a = jax.nn.log_sigmoid(jax.random.normal(ku, (B, t, H)))
    return (lambda q, k, v, b, a: ops.gated_deltanet(q, k, v, b, a, **kw)), (q, k, v, beta, log_a)

  return build


def _scan_case(form):
  """The scan engine on Mamba's problem size: ``a, b`` ``[B, T, CH, N]``, ``a`` in (0, 1)."""

  def build(t, rng, sz):
    import jax
    from linear_attention import ops
    ka, kb = jax.random.split(rng)
    a = jax.nn.sigmoid(3 + jax.random.normal(ka, (B, t, CH, N)))  # mostly close to 1
    b = jax.random.normal(kb, (B, t, CH, N))
    return (lambda a, b: ops.linear_scan(a, b, form=form, chunk_size=CHUNK)), (a, b)

  return build


def _mamba_case(form):
  """Mamba's selective scan with its own init: S4D-real A, dt log-uniform [1e-3, 0.1].

  ``form=None`` calls it without ``form``: whatever the op's default picks on
  this backend (its ``"auto"``), measured as such.
  """

  def build(t, rng, sz):
    import jax
    import jax.numpy as jnp
    from linear_attention import ops
    kx, kd, kz, kb, kt = jax.random.split(rng, 5)
    x, dt, z = (jax.random.normal(k, (B, t, CH)) for k in (kx, kd, kz))
    bm, cm = _normal(kb, 2, (B, t, N))
    a = -jnp.tile(jnp.arange(1, N + 1, dtype=jnp.float32), (CH, 1))
    dt_init = jnp.exp(jax.random.uniform(kt, (CH,), minval=math.log(1e-3), maxval=math.log(1e-1)))
    dt_bias = dt_init + jnp.log(-jnp.expm1(-dt_init))  # inverse softplus, as in Mamba
    skip = jnp.ones((CH,))
    kw = dict(chunk_size=CHUNK) if form is None else dict(form=form, chunk_size=CHUNK)
    fn = lambda x, dt, a, bm, cm, skip, z, bias: ops.selective_scan(
        x, dt, a, bm, cm, skip, z, dt_bias=bias, **kw)
    return fn, (x, 0.1 * dt, a, bm, cm, skip, z, dt_bias)

  return build


def _rglru_case(form):
  """RG-LRU with Griffin's init: ``sigmoid(Lambda)`` uniform in [0.9, 0.999]."""

  def build(t, rng, sz):
    import jax
    import jax.numpy as jnp
    from linear_attention import ops
    kx, kl = jax.random.split(rng)
    x, gr, gi = _normal(kx, 3, (B, t, CH))
    a = jax.random.uniform(kl, (CH,), minval=0.9, maxval=0.999)
    lam = jnp.log(a) - jnp.log1p(-a)
    fn = lambda x, gr, gi, lam: ops.rg_lru(x, gr, gi, lam, form=form, chunk_size=CHUNK)
    return fn, (x, gr, gi, lam)

  return build


def _s4d_case(form):
  """S4D-Lin with ``S4D_N`` modes per channel, B = 1, complex C, dt in [1e-3, 0.1]."""

  def build(t, rng, sz):
    import jax
    import jax.numpy as jnp
    from linear_attention import ops
    ku, kc, kd = jax.random.split(rng, 3)
    u = jax.random.normal(ku, (B, t, CH))
    a_re, a_im = ops.s4d_init("lin", S4D_N, CH)
    c_re, c_im = _normal(kc, 2, (CH, S4D_N))
    log_dt = ops.s4d_log_dt_init(kd, CH)
    bm, skip = jnp.ones((CH, S4D_N)), jnp.ones((CH,))

    # C complex from two real parameters, so every argument is differentiable.
    def fn(u, a_re, a_im, bm, c_re, c_im, log_dt, skip):
      c = (c_re + 1j * c_im) * (0.5 ** 0.5)
      return ops.s4d(u, a_re, a_im, bm, c, log_dt, skip, form=form, chunk_size=CHUNK)

    return fn, (u, a_re, a_im, bm, c_re, c_im, log_dt, skip)

  return build


def _sparse_case(method):
  """Issue 5's methods; sliding window causal, the others bidirectional (as published)."""

  def build(t, rng, sz):
    import jax
    import jax.numpy as jnp
    from linear_attention import ops
    kx, kp = jax.random.split(rng)
    q, k, v = _normal(kx, 3, (B, t, H, D))
    if method == "sliding_window":
      return (lambda q, k, v: ops.sliding_window_attention(q, k, v, window=sz.window,
                                                           causal=True)), (q, k, v)
    # The global mask and the BigBird key are inputs (not differentiated), not
    # constants: XLA would spend minutes folding the gathers they index.
    if method == "longformer":
      glob = jnp.zeros((B, t), bool).at[:, :sz.globals].set(True)
      fn = lambda q, k, v, glob: ops.longformer_attention(
          q, k, v, glob, window=sz.window, max_globals=sz.globals)
      return fn, (q, k, v), (glob,)
    if method == "bigbird":
      fn = lambda q, k, v, key: ops.bigbird_attention(
          q, k, v, block_size=sz.bb_block, key=key, num_window_blocks=sz.bb_window,
          num_random_blocks=sz.bb_random, num_global_blocks=sz.bb_global)
      return fn, (q, k, v), (kp,)
    # Linformer: E, F [k, T] ~ N(0, 1/k), as its projections are initialised.
    e, f = (x / math.sqrt(sz.linformer_k) for x in _normal(kp, 2, (sz.linformer_k, t)))
    return (lambda q, k, v, e, f: ops.linformer_attention(q, k, v, e, f)), (q, k, v, e, f)

  return build


# ------------------------------------------------------------------ FLOP counts


def _chunk_flops(t, sz=None):
  # Per head and token: QK^T and AV inside the chunk (2C(K+V)), the chunk's
  # state (2KV) and the read of the incoming state (2KV). Also used for the
  # per-channel (vector) decays (GLA, HGRN2, RWKV-6), whose extra elementwise
  # decay work is not counted, the same count as the scalar engine.
  return B * H * t * (2 * CHUNK * 2 * D + 4 * D * D)


def _recurrent_flops(t, sz=None):
  return B * H * t * 4 * D * D  # per token: the state update k v^T (2KV) and the read (2KV)


def _quadratic_flops(t, sz=None):
  return B * H * 2 * t * t * 2 * D  # QK^T and AV over the full T x T


def _delta_chunk_flops(t, sz=None):
  # The WY / UT-transform chunk form of ops/delta.py, per head and token:
  # KK^T, QK^T, W = inv @ (beta K) (2CK each), U = inv @ (beta V) and the
  # in-chunk scores times the pseudo-values (2CV each); W S_0, Q S_0 and the
  # state update K^T D (2KV each); the recursive block inverse of the C x C
  # unit-lower matrix, (2/3) C^3 per chunk.
  c = CHUNK
  return B * H * t * (2 * c * (3 * D + 2 * D) + 6 * D * D + 2 * c * c / 3)


def _delta_recurrent_flops(t, sz=None):
  return B * H * t * 6 * D * D  # per token: S^T k, the rank-1 update, the read (2KV each)


def _delta_parallel_flops(t, sz=None):
  # ops/delta.py's parallel form: QK^T and KK^T (2T^2 K each), the inverse by
  # row-wise forward substitution over the full T x T (2T^3), P = A inv (2T^3),
  # P V (2T^2 V).
  return B * H * (4 * t * t * D + 4 * t ** 3 + 2 * t * t * D)


def _scan_flops(t, sz=None):
  return B * t * CH * N * 2  # h = a * h + b: one multiply and one add per element and step


def _mamba_flops(t, sz=None):
  # The recurrence per channel, state element and step: dt * A (1), the input
  # dt x * B (1), a * h + b (2), the read C . h (2); exp not counted. The same
  # count for every form, the "decay" (matmul) form included.
  return B * t * CH * N * 6


def _rglru_flops(t, sz=None):
  # Per channel and step: the scan (2) and the gates r, i, a, sqrt(1 - a^2) and
  # the gated input, about 10 elementwise ops; transcendental functions count 1.
  return B * t * CH * 12


def _s4d_recurrent_flops(t, sz=None):
  # Per channel, mode and step: complex a * h + b (8), the real-times-complex
  # input Bbar u (2), the read 2 Re(C h) with its sum (4).
  return B * t * CH * S4D_N * 14


def _s4d_fft_flops(t, sz=None):
  # The closed-form kernel (a complex multiply-add per mode and lag: 8 N T per
  # channel), two real FFTs and one inverse of length L = 2T (2.5 L log2 L each)
  # and the spectral product (6 per frequency).
  L = 2 * t
  return B * CH * (8 * S4D_N * t + 3 * 2.5 * L * math.log2(L) + 6 * (L // 2 + 1))


def _window_flops(t, sz):
  # Visible pairs only: each query sees `window` keys (fewer at the start).
  w = min(sz.window, t)
  pairs = t * w - w * (w - 1) // 2
  return B * H * 2 * pairs * 2 * D


def _longformer_flops(t, sz):
  # Bidirectional window |i - j| < window (2w - 1 keys), plus every query to
  # the global keys and the global queries to every key.
  return B * H * 2 * 2 * D * (t * min(2 * sz.window - 1, t) + 2 * sz.globals * t)


def _bigbird_flops(t, sz):
  # Ordinary query blocks see (w + r + g) key blocks; the g global query
  # blocks see every key.
  b, g = sz.bb_block, sz.bb_global
  keys = (sz.bb_window + sz.bb_random + g) * b
  return B * H * 2 * 2 * D * ((t - g * b) * keys + g * b * t)


def _linformer_flops(t, sz):
  # E K and F V (2kT(K) and 2kT(V)), then T queries over k projected keys.
  return B * H * 2 * sz.linformer_k * t * 2 * D * 2


# -------------------------------------------------------------------- the cases


def _quad_mem(factor):
  return lambda t: factor * B * H * t * t * 4


_zero = lambda t: 0


@dataclasses.dataclass(frozen=True)
class Case:
  # (T, rng, Sizes) -> (fn, args) or (fn, args, extra): fn(*args, *extra);
  # args are differentiated, extra (masks, PRNG keys) are not.
  build: Callable
  flops: Callable | None  # (T, Sizes) -> forward FLOPs
  seqs: tuple[int, ...]  # default lengths
  group: str
  fwd_mem: Callable = _zero  # (T) -> estimated forward peak bytes (0: let XLA's plan decide)
  fwdbwd_mem: Callable = _zero  # (T) -> estimated fwd+bwd peak bytes


CASES: dict[str, Case] = {
    # Issue 2: the engine, ELU linear attention, exact softmax.
    "chunk": Case(_engine_case("chunk", "none"), _chunk_flops, LINEAR, "foundation"),
    "recurrent": Case(_engine_case("recurrent", "none"), _recurrent_flops, SHORT, "foundation",
                      fwdbwd_mem=lambda t: 3 * B * H * t * D * D * 4),
    "parallel": Case(_engine_case("parallel", "none"), _quadratic_flops, SHORT, "foundation",
                     _quad_mem(2), _quad_mem(4)),
    "linear_elu_chunk": Case(_linear_case("chunk"), _chunk_flops, LINEAR, "foundation"),
    "chunk_scalar_decay": Case(_engine_case("chunk", "scalar"), _chunk_flops, LINEAR,
                               "foundation"),
    "chunk_vector_decay": Case(_engine_case("chunk", "vector"), _chunk_flops, LINEAR,
                               "foundation"),
    "naive_softmax": Case(_softmax_case("naive"), _quadratic_flops, QUAD, "foundation",
                          _quad_mem(2), _quad_mem(4)),
    "blockwise_softmax": Case(_softmax_case("blockwise"), _quadratic_flops, LINEAR, "foundation"),
}

SELECTIVE = ("chunk", "associative", "recurrent", "decay")  # selective_scan's explicit forms
GATED_VARIANTS = ("gla", "retention", "hgrn2", "rwkv6", "ssd", "deltanet", "gated_deltanet")
_PER_CHANNEL = ("gla", "hgrn2", "rwkv6")  # parallel form builds a [T, T, K] decay
for _v in GATED_VARIANTS:
  _delta = _v in ("deltanet", "gated_deltanet")
  CASES[f"{_v}_chunk"] = Case(_gated_case(_v, "chunk"),
                              _delta_chunk_flops if _delta else _chunk_flops, LINEAR, "gated")
  CASES[f"{_v}_recurrent"] = Case(
      _gated_case(_v, "recurrent"), _delta_recurrent_flops if _delta else _recurrent_flops,
      SHORT, "gated", fwdbwd_mem=lambda t: 3 * B * H * t * D * D * 4)
  _ps = SHORT
  if _delta:  # the row-wise inverse saves a T x T carry per row for the backward pass
    _pm = (_quad_mem(3), lambda t: B * H * t ** 3 * 4)
    _ps = (1024,)  # cubic as written (T sequential T x T steps): over 3 minutes at 4k
  elif _v in _PER_CHANNEL:
    _pm = (lambda t: 2 * B * H * t * t * D * 4, lambda t: 4 * B * H * t * t * D * 4)
  else:
    _pm = (_quad_mem(2), _quad_mem(4))
  CASES[f"{_v}_parallel"] = Case(
      _gated_case(_v, "parallel"), _delta_parallel_flops if _delta else _quadratic_flops,
      _ps, "gated", *_pm)

for _f in ("chunk", "associative", "recurrent"):
  CASES[f"scan_{_f}"] = Case(_scan_case(_f), _scan_flops,
                             SCAN_RECURRENT if _f == "recurrent" else LINEAR, "ssm")
CASES["mamba_default"] = Case(_mamba_case(None), _mamba_flops, LINEAR, "ssm")
for _f in SELECTIVE:
  CASES[f"mamba_{_f}"] = Case(_mamba_case(_f), _mamba_flops,
                              SCAN_RECURRENT if _f == "recurrent" else LINEAR, "ssm")
CASES["rglru_chunk"] = Case(_rglru_case("chunk"), _rglru_flops, LINEAR, "ssm")
CASES["rglru_recurrent"] = Case(_rglru_case("recurrent"), _rglru_flops, SCAN_RECURRENT, "ssm")
CASES["s4d_fft"] = Case(_s4d_case("fft"), _s4d_fft_flops, LINEAR, "ssm")
CASES["s4d_recurrent"] = Case(_s4d_case("recurrent"), _s4d_recurrent_flops, SCAN_RECURRENT,
                              "ssm")

CASES["sliding_window"] = Case(_sparse_case("sliding_window"), _window_flops, LINEAR, "sparse")
CASES["longformer"] = Case(_sparse_case("longformer"), _longformer_flops, LINEAR, "sparse")
CASES["bigbird"] = Case(_sparse_case("bigbird"), _bigbird_flops, LINEAR, "sparse")
CASES["linformer"] = Case(_sparse_case("linformer"), _linformer_flops, LINEAR, "sparse")

GROUPS = {g: [c for c, case in CASES.items() if case.group == g]
          for g in ("foundation", "gated", "ssm", "sparse")}
GROUPS["sparse"].append("naive_softmax")  # the baseline of issue 5's speed-up
GROUPS["all"] = list(CASES)


# ---------------------------------------------------------------------- measure


def _time(fn, *args, repeats=3, warmup=True):
  """Best wall and best process-CPU seconds of ``repeats`` runs, after a warm-up run."""
  import jax
  if warmup:
    jax.block_until_ready(fn(*args))
  wall = cpu = float("inf")
  for _ in range(repeats):
    t0, c0 = time.perf_counter(), time.process_time()
    jax.block_until_ready(fn(*args))
    wall = min(wall, time.perf_counter() - t0)
    cpu = min(cpu, time.process_time() - c0)
  return wall, cpu


def matmul_gflops(n=2048):
  """The machine's own float32 matmul rate, GFLOP/s."""
  import jax
  import jax.numpy as jnp
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
  f = jax.jit(lambda a: a @ a)
  return 2 * n**3 / _time(f, a, repeats=5)[0] / 1e9


def _rss_gb():
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB


def _plan_gb(compiled):
  """XLA's memory plan of a compiled function (arguments + temporaries + outputs), GB."""
  try:
    m = compiled.memory_analysis()
    return (m.argument_size_in_bytes + m.temp_size_in_bytes + m.output_size_in_bytes
            - m.alias_size_in_bytes) / GB
  except Exception:  # not every backend/version reports it
    return None


def _device_peak_gb():
  import jax
  try:
    stats = jax.devices()[0].memory_stats() or {}
  except Exception:
    stats = {}
  peak = stats.get("peak_bytes_in_use")
  return None if peak is None else peak / GB


def _build(case, t, sz):
  """``(fn, inputs, argnums)``: ``fn(*inputs)``, differentiated in ``argnums``."""
  import jax
  fn, args, *extra = case.build(t, jax.random.PRNGKey(0), sz)
  extra = tuple(extra[0]) if extra else ()
  return fn, tuple(args) + extra, tuple(range(len(args)))


def _grad_fn(fn, argnums):
  import jax
  import jax.numpy as jnp
  return jax.grad(lambda *a: jnp.sum(fn(*a).astype(jnp.float32)), argnums=argnums)


def _measure(name, t, budget_s, mem_limit_gb, bwd_skip, smoke):
  import jax
  case = CASES[name]
  sz = SMOKE_SIZES if smoke else SIZES
  res = {"case": name, "T": t, "group": case.group, "backend": jax.default_backend()}
  fn, args, argnums = _build(case, t, sz)
  args = jax.block_until_ready(args)
  res["base_rss_gb"] = _rss_gb()  # inputs built, nothing compiled yet
  # Long runs: one timed call and no warm-up (compiled ahead of time, so the
  # first call compiles nothing); short ones: best of 3 after a warm-up.
  long_run = smoke or t >= 16384
  repeats, runs = (1, 1) if long_run else (3, 4)
  t0 = time.perf_counter()

  fwd = jax.jit(fn).lower(*args).compile()
  res["fwd_compile_s"] = time.perf_counter() - t0
  res["fwd_plan_gb"] = plan = _plan_gb(fwd)
  if plan is not None and plan > mem_limit_gb:
    res["skipped"] = f"forward: XLA plans {plan:.3g} GB > {mem_limit_gb:g} GB"
    return res
  res["fwd_s"], res["fwd_cpu_s"] = _time(fwd, *args, repeats=repeats, warmup=not long_run)

  # fwd+bwd: skipped if an estimate, XLA's plan or the forward time says so.
  if bwd_skip:
    res["fwdbwd_skipped"] = bwd_skip
  elif 3 * res["fwd_s"] * runs + (time.perf_counter() - t0) >= budget_s:
    res["fwdbwd_skipped"] = (f"forward {res['fwd_s']:.1f}s suggests fwd+bwd over the "
                             f"{budget_s:g}s budget")
  else:
    t1 = time.perf_counter()
    bwd = jax.jit(_grad_fn(fn, argnums)).lower(*args).compile()
    res["fwdbwd_compile_s"] = time.perf_counter() - t1
    res["fwdbwd_plan_gb"] = plan = _plan_gb(bwd)
    if plan is not None and plan > mem_limit_gb:
      res["fwdbwd_skipped"] = f"XLA plans {plan:.3g} GB > {mem_limit_gb:g} GB"
    else:
      res["fwdbwd_s"], res["fwdbwd_cpu_s"] = _time(bwd, *args, repeats=repeats,
                                                    warmup=not long_run)

  f = case.flops(t, sz) if case.flops else None
  for part in ("fwd", "fwdbwd"):
    if f"{part}_s" in res:
      res[f"{part}_us_per_token"] = 1e6 * res[f"{part}_s"] / t
      if f:
        res[f"{part}_gflops"] = (3 if part == "fwdbwd" else 1) * f / res[f"{part}_s"] / 1e9
  if f:
    res["fwd_flops"] = f
  res["peak_rss_gb"] = _rss_gb()
  res["op_rss_gb"] = res["peak_rss_gb"] - res["base_rss_gb"]
  dev = _device_peak_gb()
  if dev is not None:
    res["peak_device_gb"] = dev
  return res


def plan(cases, seqs, mem_limit_gb):
  """XLA's memory plans (GB) of fwd and fwd+bwd per (case, T), compiled only.

  Inputs are abstract (``jax.eval_shape``), so nothing of size T is allocated:
  a cheap way to see which lengths ``--mem-limit-gb`` will skip.
  """
  import jax
  print(f"{'case':24s} {'T':>6s} {'fwd GB':>8s} {'f+b GB':>8s}  "
        f"(XLA plans; limit {mem_limit_gb:g} GB)")
  for name in cases:
    case = CASES[name]
    for t in seqs or case.seqs:
      box = {}

      def inputs():
        box["fn"], args, box["argnums"] = _build(case, t, SIZES)
        return args

      try:
        args = jax.eval_shape(inputs)
        fn = box["fn"]
        f = _plan_gb(jax.jit(fn).lower(*args).compile())
        fb = _plan_gb(jax.jit(_grad_fn(fn, box["argnums"])).lower(*args).compile())
        over = [p for p, x in (("fwd", f), ("fwd+bwd", fb)) if x is not None and x > mem_limit_gb]
        print(f"{name:24s} {t:6d} {_fmt(f, width=8)} {_fmt(fb, width=8)}"
              + (f"  would skip {' and '.join(over)}" if over else ""), flush=True)
      except Exception as e:
        msg = (str(e).strip().splitlines() or [""])[-1][:150]
        print(f"{name:24s} {t:6d}  failed: {type(e).__name__}: {msg}", flush=True)


def worker(spec):
  """Measures the cases of ``spec`` (JSON) at one length; prints one JSON line each."""
  import linear_attention  # noqa: F401  first: its XLA flags need a backend not yet started
  spec = json.loads(spec)
  for name in spec["cases"]:
    try:
      res = _measure(name, spec["T"], spec["budget"], spec["mem_limit_gb"],
                     spec.get("bwd_skip"), spec.get("smoke", False))
    except Exception as e:  # one broken case must not hide the others
      msg = (str(e).strip().splitlines() or [""])[-1][:200]
      res = {"case": name, "T": spec["T"], "group": CASES[name].group,
             "skipped": f"failed: {type(e).__name__}: {msg}"}
    print("RESULT " + json.dumps(res), flush=True)


def step_latency(position):
  """Seconds per decoding step of ELU linear attention after ``position`` tokens."""
  import jax
  from linear_attention import ops
  q, k, v = _normal(jax.random.PRNGKey(0), 3, (B, position, H, D))
  _, state = jax.jit(lambda q, k, v: ops.linear_attention(q, k, v, return_state=True))(q, k, v)
  step = jax.jit(lambda q, k, v, s: ops.linear_attention_step(q, k, v, s))
  return _time(step, q[:, -1], k[:, -1], v[:, -1], state, repeats=50)[0]


def _run_worker(spec, timeout, env=None):
  cmd = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)]
  try:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
  except subprocess.TimeoutExpired as e:
    done = [json.loads(l[7:]) for l in (e.stdout or b"").decode(errors="replace").splitlines()
            if l.startswith("RESULT ")]
    got = {r["case"] for r in done}
    return done + [{"case": c, "T": spec["T"], "group": CASES[c].group,
                    "skipped": f"over {timeout:g}s (killed)"} for c in spec["cases"]
                   if c not in got]
  done = [json.loads(l[7:]) for l in out.stdout.splitlines() if l.startswith("RESULT ")]
  got = {r["case"] for r in done}
  err = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1][:200]
  return done + [{"case": c, "T": spec["T"], "group": CASES[c].group,
                  "skipped": f"failed (exit {out.returncode}): {err}"}
                 for c in spec["cases"] if c not in got]


def run_one(case, t, budget_s, mem_limit_gb):
  """Runs one (case, T) in a subprocess; returns its result or why it was skipped."""
  c = CASES[case]
  est = c.fwd_mem(t) / GB
  if est > mem_limit_gb:
    return {"case": case, "T": t, "group": c.group,
            "skipped": f"forward needs ~{est:.3g} GB > {mem_limit_gb:g} GB (estimate)"}
  est = c.fwdbwd_mem(t) / GB
  bwd_skip = f"needs ~{est:.3g} GB > {mem_limit_gb:g} GB (estimate)" if est > mem_limit_gb else None
  spec = {"cases": [case], "T": t, "budget": budget_s, "mem_limit_gb": mem_limit_gb,
          "bwd_skip": bwd_skip}
  return _run_worker(spec, budget_s * 3)[0]


# ----------------------------------------------------------------------- report


def _fmt(x, scale=1.0, width=9, prec=2):
  return f"{'-' if x is None else format(scale * x, f'.{prec}f'):>{width}s}"


def table(results):
  rows = [f"{'case':24s} {'T':>6s} {'fwd ms':>9s} {'cpu ms':>9s} {'f+b ms':>9s} {'cpu ms':>9s} "
          f"{'us/tok f':>8s} {'us/tok fb':>9s} {'fwd GF/s':>8s} {'%mm':>4s} {'fb GF/s':>7s} "
          f"{'peak GB':>7s} {'op GB':>6s} {'plan GB':>7s}"]
  for r in results:
    if "skipped" in r:
      rows.append(f"{r['case']:24s} {r['T']:6d}  skipped: {r['skipped']}")
      continue
    g = r.get
    plan = g("fwdbwd_plan_gb", g("fwd_plan_gb"))
    rows.append(
        f"{r['case']:24s} {r['T']:6d} {_fmt(g('fwd_s'), 1e3)} {_fmt(g('fwd_cpu_s'), 1e3)} "
        f"{_fmt(g('fwdbwd_s'), 1e3)} {_fmt(g('fwdbwd_cpu_s'), 1e3)} "
        f"{_fmt(g('fwd_us_per_token'), width=8)} {_fmt(g('fwdbwd_us_per_token'))} "
        f"{_fmt(g('fwd_gflops'), width=8, prec=1)} {_fmt(g('pct_matmul'), width=4, prec=0)} "
        f"{_fmt(g('fwdbwd_gflops'), width=7, prec=1)} "
        f"{_fmt(g('peak_device_gb', g('peak_rss_gb')), width=7)} "
        f"{_fmt(g('op_rss_gb'), width=6)} {_fmt(plan, width=7)}")
    if "fwdbwd_skipped" in r:
      rows[-1] += f"  (fwd+bwd skipped: {r['fwdbwd_skipped']})"
  return "\n".join(rows)


def _get(results, case, t):
  for r in results:
    if r["case"] == case and r["T"] == t and "skipped" not in r:
      return r
  return None


def _target(issue, name, value, op, bound, missing=None, detail=""):
  """One target: ``value op bound`` (op '>=' or '<='), or not measured with why."""
  if value is None:
    status = "not measured"
    detail = "; ".join(x for x in (missing, detail) if x)
  else:
    status = "met" if (value >= bound if op == ">=" else value <= bound) else "not met"
  return {"issue": issue, "target": name, "value": value, "op": op, "bound": bound,
          "status": status, "detail": detail}


def _ratio(results, num, den, key, what):
  """``num[key] / den[key]`` for two (case, T) pairs; (value, why it is missing)."""
  a, b = _get(results, *num), _get(results, *den)
  miss = [f"{c}@{t} {what}" for (c, t), r in ((num, a), (den, b)) if r is None or key(r) is None]
  if miss:
    return None, "missing " + ", ".join(miss)
  return key(a) / key(b), None


def _k(field):
  return lambda r: r.get(field)


def _per_token_mem(r, plan=False):
  """Peak memory per token, GB: measured (device peak on GPU/TPU, else the
  process's peak RSS, runtime included) or, with ``plan``, XLA's fwd+bwd plan
  (the working set alone; the RSS increase over the inputs is too noisy at
  small T, where compilation sets the high-water mark)."""
  m = r.get("fwdbwd_plan_gb") if plan else r.get("peak_device_gb", r.get("peak_rss_gb"))
  return None if not m else m / r["T"]


def targets(results, steps):
  """The figures the issues ask for, from this run's (or merged) results."""
  out = []
  fb = _k("fwdbwd_s")
  upt = _k("fwdbwd_us_per_token")
  K = 1024
  # Issue 2.
  v, m = _ratio(results, ("chunk", 64 * K), ("chunk", K), upt, "fwd+bwd")
  out.append(_target(2, "chunk fwd+bwd us/token 64k / 1k", v, "<=", 1.2, m))
  r = _get(results, "chunk", 4 * K)
  out.append(_target(2, "chunk fwd % of matmul at 4k", r and r.get("pct_matmul"), ">=", 50,
                     None if r else "missing chunk@4096"))
  v, m = _ratio(results, ("naive_softmax", 16 * K), ("chunk", 16 * K), fb, "fwd+bwd")
  extra = ""
  if v is None:
    n4, c16 = _get(results, "naive_softmax", 4 * K), _get(results, "chunk", 16 * K)
    if n4 and c16 and n4.get("fwdbwd_s") and c16.get("fwdbwd_s"):
      extra = (f"extrapolated from naive@4k x16 (quadratic): "
               f"~{16 * n4['fwdbwd_s'] / c16['fwdbwd_s']:.0f}x")
  out.append(_target(2, "chunk vs naive softmax fwd+bwd speed-up at 16k", v, ">=", 50, m, extra))
  r = _get(results, "blockwise_softmax", 64 * K)
  ran = None if r is None else float(r.get("fwdbwd_s") is not None)
  detail = ""
  if r is not None:
    r4 = _get(results, "blockwise_softmax", 4 * K)
    for plan in (False, True):
      if r4 and _per_token_mem(r4, plan) and _per_token_mem(r, plan):
        detail += (f"{', ' if detail else ''}memory per token 64k/4k "
                   f"({'XLA plan' if plan else 'measured peak'}) "
                   f"{_per_token_mem(r, plan) / _per_token_mem(r4, plan):.2f}")
  out.append(_target(2, "blockwise softmax fwd+bwd ran at 64k (1 = yes)", ran, ">=", 1,
                     "missing blockwise_softmax@65536", detail))
  s1, s64 = steps.get("1024", steps.get(1024)), steps.get("65536", steps.get(65536))
  out.append(_target(2, "step latency position 64k / 1k", s64 / s1 if s1 and s64 else None,
                     "<=", 1.2, "step latency not measured"))
  # Issue 3.
  for var in GATED_VARIANTS:
    v, m = _ratio(results, (f"{var}_recurrent", 4 * K), (f"{var}_chunk", 4 * K), fb, "fwd+bwd")
    out.append(_target(3, f"{var}: chunk vs recurrent fwd+bwd speed-up at 4k", v, ">=", 10, m))
    v, m = _ratio(results, (f"{var}_chunk", 64 * K), (f"{var}_chunk", K), upt, "fwd+bwd")
    out.append(_target(3, f"{var}: chunk fwd+bwd us/token 64k / 1k", v, "<=", 1.3, m))
  r = _get(results, "gla_chunk", 4 * K)
  out.append(_target(3, "gla chunk fwd % of matmul at 4k", r and r.get("pct_matmul"), ">=", 40,
                     None if r else "missing gla_chunk@4096"))
  # Issue 4: "the default Mamba form" is measured as such (mamba_default calls
  # selective_scan without form=), whatever the default resolves to here.
  try:
    import inspect
    from linear_attention import ops
    default = inspect.signature(ops.selective_scan).parameters["form"].default
  except Exception:
    default = "?"
  note = f"default form={default!r}"
  v, m = _ratio(results, ("mamba_recurrent", 16 * K), ("mamba_default", 16 * K), fb, "fwd+bwd")
  out.append(_target(4, "mamba default form vs recurrent fwd+bwd speed-up at 16k", v, ">=", 5,
                     m, note))
  # The issue asks to keep the fastest form as the default: the best of the
  # explicit forms over the default, >= 0.9 (timing noise).
  best = [(r["fwdbwd_s"], r["case"]) for f in SELECTIVE
          if (r := _get(results, f"mamba_{f}", 16 * K)) and r.get("fwdbwd_s")]
  d16 = _get(results, "mamba_default", 16 * K)
  v = min(best)[0] / d16["fwdbwd_s"] if best and d16 and d16.get("fwdbwd_s") else None
  out.append(_target(4, "fastest explicit mamba form / default form, fwd+bwd time at 16k", v,
                     ">=", 0.9, "missing mamba_default@16384 or the explicit forms",
                     f"{note}; fastest explicit: {min(best)[1]}" if best else note))
  for c in ("mamba_default", "mamba_chunk", "mamba_associative", "mamba_decay", "scan_chunk",
            "scan_associative", "rglru_chunk", "s4d_fft"):
    v, m = _ratio(results, (c, 64 * K), (c, K), upt, "fwd+bwd")
    out.append(_target(4, f"{c}: fwd+bwd us/token 64k / 1k", v, "<=", 1.3, m,
                       "O(T log T) by design" if c == "s4d_fft" else ""))
  v, m = _ratio(results, ("s4d_recurrent", 16 * K), ("s4d_fft", 16 * K), fb, "fwd+bwd")
  out.append(_target(4, "s4d fft vs recurrent fwd+bwd at 16k", v, ">=", 10, m))
  # Issue 5.
  for c in ("sliding_window", "longformer", "bigbird", "linformer"):
    v, m = _ratio(results, (c, 64 * K), (c, 4 * K), upt, "fwd+bwd")
    out.append(_target(5, f"{c}: fwd+bwd us/token 64k / 4k", v, "<=", 1.3, m))
    a, b = _get(results, c, 64 * K), _get(results, c, 4 * K)
    ratios = {}
    for plan in (False, True):
      if a and b and _per_token_mem(a, plan) and _per_token_mem(b, plan):
        ratios["XLA plan" if plan else "measured peak"] = (
            _per_token_mem(a, plan) / _per_token_mem(b, plan))
    val = max(ratios.values()) if ratios else None
    detail = ", ".join(f"{k} {x:.2f}" for k, x in ratios.items())
    out.append(_target(5, f"{c}: peak memory per token 64k / 4k (worse of measured, XLA plan)",
                       val, "<=", 1.5, f"missing {c}@65536 or @4096 memory", detail))
  v, m = _ratio(results, ("naive_softmax", 16 * K), ("sliding_window", 16 * K), fb, "fwd+bwd")
  extra = ""
  if v is None:
    n4, s16 = _get(results, "naive_softmax", 4 * K), _get(results, "sliding_window", 16 * K)
    if n4 and s16 and n4.get("fwdbwd_s") and s16.get("fwdbwd_s"):
      extra = (f"extrapolated from naive@4k x16 (quadratic): "
               f"~{16 * n4['fwdbwd_s'] / s16['fwdbwd_s']:.0f}x")
  out.append(_target(5, "sliding window vs naive softmax fwd+bwd at 16k", v, ">=", 20, m, extra))
  return out


def targets_text(tgts):
  rows = ["targets (met / not met / not measured):"]
  for x in tgts:
    val = "" if x["value"] is None else f"{x['value']:.3g} "
    rows.append(f"  issue {x['issue']}: {x['target']}: {val}(target {x['op']} {x['bound']:g}) "
                f"{x['status']}" + (f"  [{x['detail']}]" if x["detail"] else ""))
  return "\n".join(rows)


def _report(paths):
  """Merges result files (later ones win per (case, T)); prints the table and targets."""
  merged, steps, mm = {}, {}, []
  for p in paths:
    with open(p) as f:
      d = json.load(f)
    mm.append(d.get("matmul_gflops"))
    steps.update(d.get("step_s") or {})
    for r in d["results"]:
      r.setdefault("matmul_gflops", d.get("matmul_gflops"))
      merged[(r["case"], r["T"])] = r
  results = list(merged.values())
  print("matmul GFLOP/s of the files: " + ", ".join(f"{m:.1f}" for m in mm if m))
  print(table(results) + "\n")
  tg = targets(results, steps)
  print(targets_text(tg))
  return results, steps, tg


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--group", default="all", choices=list(GROUPS))
  p.add_argument("--cases", default=None, help="comma-separated case names (overrides --group)")
  p.add_argument("--seqs", default=None, help="comma-separated lengths for every case "
                 "(default: each case's own list)")
  p.add_argument("--budget", type=float, default=60.0, help="seconds per case and length")
  p.add_argument("--mem-limit-gb", type=float, default=16.0)
  p.add_argument("--out", default="results")
  p.add_argument("--tag", default=None,
                 help="write <out>/bench_ops_<tag>.json instead of the default name")
  p.add_argument("--smoke", action="store_true",
                 help=f"T={SMOKE_T}, small sparse sizes, all cases in one subprocess, for CI")
  p.add_argument("--list", action="store_true", help="print the cases and their lengths")
  p.add_argument("--plan", action="store_true",
                 help="print XLA's memory plan per case and length (compile only), run nothing")
  p.add_argument("--report", nargs="+", metavar="JSON",
                 help="print table and targets of result files (merged), run nothing")
  p.add_argument("--worker", help=argparse.SUPPRESS)
  a = p.parse_args(argv)
  if a.worker:
    return worker(a.worker)
  if a.report:
    _report(a.report)
    return 0
  cases = a.cases.split(",") if a.cases else GROUPS[a.group]
  unknown = [c for c in cases if c not in CASES]
  if unknown:
    raise SystemExit(f"unknown --cases {unknown}; valid: {list(CASES)}")
  seqs = None if a.seqs is None else [int(s) for s in a.seqs.split(",")]
  if a.list:
    for c in cases:
      print(f"{c:24s} {CASES[c].group:10s} {seqs or list(CASES[c].seqs)}")
    return 0

  import linear_attention  # noqa: F401  (its XLA flags, before the backend starts)
  import jax
  if a.plan:
    plan(cases, seqs, a.mem_limit_gb)
    return 0
  t_start = time.perf_counter()
  mm = matmul_gflops(512 if a.smoke else 2048)
  print(f"float32 matmul: {mm:.1f} GFLOP/s", flush=True)

  def finish(r):
    r["matmul_gflops"] = mm
    if r.get("fwd_gflops"):
      r["pct_matmul"] = 100 * r["fwd_gflops"] / mm
    return r

  results, worker_flags = [], os.environ.get("XLA_FLAGS", "")
  if a.smoke:
    # One subprocess for every case, compiled at XLA's lowest optimisation
    # level: compilation is most of the time at this size (about half of it
    # goes), and smoke timings mean nothing anyway.
    if "xla_backend_optimization_level" not in worker_flags:
      worker_flags = (worker_flags + " --xla_backend_optimization_level=0").strip()
    spec = {"cases": cases, "T": SMOKE_T, "budget": a.budget, "mem_limit_gb": a.mem_limit_gb,
            "smoke": True}
    env = dict(os.environ, XLA_FLAGS=worker_flags)
    results = [finish(r) for r in _run_worker(spec, max(600.0, a.budget * 3), env)]
    print(table(results), flush=True)
  else:
    for c in cases:
      for t in seqs or CASES[c].seqs:
        results.append(finish(run_one(c, t, a.budget, a.mem_limit_gb)))
        print(table(results[-1:]).splitlines()[-1], flush=True)
    print("\n" + table(results))

  steps = {}
  if a.group in ("foundation", "all") and not a.cases:
    steps = {str(pos): step_latency(pos) for pos in ([128] if a.smoke else [1024, 65536])}
    for pos, secs in steps.items():
      print(f"linear attention step at position {pos}: {1e6 * secs:.1f} us")
  tg = targets(results, steps)
  print("\n" + targets_text(tg))

  os.makedirs(a.out, exist_ok=True)
  # A partial run never overwrites the full run's bench_ops.json.
  name = ("bench_ops_custom.json" if a.cases else
          "bench_ops.json" if a.group == "all" else f"bench_ops_{a.group}.json")
  if a.tag:
    name = f"bench_ops_{a.tag}.json"
  if a.smoke:
    name = name.replace(".json", "_smoke.json")
  path = os.path.join(a.out, name)
  with open(path, "w") as f:
    json.dump({"backend": jax.default_backend(), "device": str(jax.devices()[0]),
               "jax": jax.__version__, "matmul_gflops": mm, "step_s": steps,
               "B": B, "H": H, "D": D, "CH": CH, "N": N,
               "S4D_N": S4D_N, "chunk": CHUNK,
               "sizes": dataclasses.asdict(SMOKE_SIZES if a.smoke else SIZES),
               "group": a.group, "smoke": a.smoke, "worker_xla_flags": worker_flags,
               "budget_s": a.budget, "mem_limit_gb": a.mem_limit_gb,
               "elapsed_s": time.perf_counter() - t_start,
               "results": results, "targets": tg}, f, indent=1)
  print(f"wrote {path} after {time.perf_counter() - t_start:.0f}s")
  failed = [r for r in results if str(r.get("skipped", "")).startswith("failed")]
  if a.smoke and failed:
    print(f"smoke: {len(failed)} case(s) failed: {[r['case'] for r in failed]}")
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
