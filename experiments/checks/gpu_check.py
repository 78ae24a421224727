"""GPU check of the Pallas kernels: correctness against the XLA twins, then timings.

Run on a GPU machine (one H200 budgeted at under 5 minutes in total)::

    python experiments/checks/gpu_check.py --out results/gpu_check.json

and on any machine, in interpret mode with tiny shapes (a sanity run of the
whole script, no meaningful timings)::

    python experiments/checks/gpu_check.py --smoke

Sections (each writes its own entry in the JSON; one failing section is
recorded and the others still run):

1. ``chunk_decay``: the chunk kernel vs ``ops.decay_linear_attention`` (XLA
   chunk form) for no / scalar / per-channel decay, forward and gradients;
   then bfloat16 timings (B=4, T=8192, H=16, K=V=128, causal, GLA-style
   per-channel decay) of forward and forward+backward for the Pallas kernel,
   the XLA chunk form and, when ``fla`` (wheel ``fla-core``) imports,
   flash-linear-attention's ``chunk_gla`` through torch.
2. ``chunk_delta``: the delta-rule chunk kernels vs ``ops.delta_rule``
   (XLA chunk form) for DeltaNet and Gated DeltaNet, forward and gradients
   (beta, gate and initial state included); then bfloat16 timings (B=4,
   T=8192, H=16, K=V=128, Gated DeltaNet) of forward and forward+backward,
   Pallas against the XLA chunk form.
3. ``chunk_dplr``: the DPLR kernels (chunk_delta's, DPLR algebra) vs the
   XLA chunk form for KDA (per-channel decay), RWKV-7 and Gated DeltaProduct
   (R = 2), forward and gradients (initial state included); then bfloat16
   timings (B=4, T=8192, H=16, K=V=128, KDA) of forward and forward+backward,
   Pallas against the XLA chunk form.
4. ``scan``: the linear-scan kernel vs ``ops.linear_scan`` and timings.
5. ``flash``: flash attention (``experiments/checks/gpu_check_flash.py``) vs cuDNN
   and XLA, with float32 checks against the naive softmax.

At the end it says which ``implementation=None`` default the run has verified
on this device: when every section's checks pass on a GPU, the line to put in
``linear_attention/engines/dispatch.py`` (``PALLAS_DEFAULT_BACKENDS``); until
someone does, ``None`` stays XLA.

Achieved TFLOP/s count the chunk algorithm's matmul FLOPs (see
:func:`chunk_flops`), the same count for every implementation, so the TFLOP/s
ratio equals the speed ratio. Only ``linear_attention.ops`` and
``linear_attention.engines`` are imported (no ml-collections, no flax).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.dirname(os.path.abspath(__file__))]  # the package, gpu_check_flash

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from linear_attention import ops  # noqa: E402
from experiments import outputs  # noqa: E402
from linear_attention.io import write_json  # noqa: E402
from linear_attention.engines.decay import pallas as cd  # noqa: E402
from linear_attention.engines.delta import pallas as cdl  # noqa: E402
from linear_attention.engines import dispatch  # noqa: E402
from linear_attention.engines.scan import pallas as scan_kernel  # noqa: E402

import gpu_check_flash  # noqa: E402  (beside this file)


def timeit(fn, *args, reps: int = 10) -> float:
  """Median wall time in ms of ``fn(*args)`` (compiled and warmed up first)."""
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return 1e3 * float(np.median(times))


def max_rel_err(a, b) -> float:
  a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
  return float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-6))


def chunk_flops(b, t, h, dk, dv, chunk=64) -> float:
  """Forward matmul FLOPs of the chunk algorithm: in-chunk scores and their
  product with ``v`` (``2 T C (K + V)``), the state read and the state update
  (``2 * 2 T K V``), per batch row and head. Forward+backward counts 3x."""
  return 2.0 * b * h * t * (chunk * (dk + dv) + 2 * dk * dv)


def _inputs(b, t, h, dk, dv, decay, dtype, seed=0):
  ks = jax.random.split(jax.random.PRNGKey(seed), 5)
  q = jax.random.normal(ks[0], (b, t, h, dk), jnp.float32).astype(dtype)
  k = (jax.random.normal(ks[1], (b, t, h, dk), jnp.float32) * dk ** -0.5).astype(dtype)
  v = jax.random.normal(ks[2], (b, t, h, dv), jnp.float32).astype(dtype)
  shape = {"none": None, "scalar": (b, t, h), "vector": (b, t, h, dk)}[decay]
  # GLA's gate: logsigmoid(x) / 16.
  g = None if shape is None else jax.nn.log_sigmoid(jax.random.normal(ks[3], shape)) / 16
  s0 = jax.random.normal(ks[4], (b, h, dk, dv), jnp.float32)
  return q, k, v, g, s0


# ------------------------------------------------------------------ chunk kernel


def chunk_decay_section(args) -> dict:
  smoke = args.smoke
  out = {"checks": {}, "timings": {}}
  b, t, h, dk, dv = (1, 40, 2, 16, 32) if smoke else (2, 1000, 4, 64, 128)
  bs = cd.ChunkDecayBlockSizes(chunk=32, sub_chunk=16, block_v=16, split_dkv=True) if smoke else None
  for decay in ("none", "scalar", "vector"):
    q, k, v, g, s0 = _inputs(b, t, h, dk, dv, decay, jnp.float32)
    kern = jax.jit(lambda q, k, v, g, s0: cd.chunk_decay_attention(
        q, k, v, g, initial_state=s0, return_state=True, block_sizes=bs))
    xla = jax.jit(lambda q, k, v, g, s0: ops.decay_linear_attention(
        q, k, v, g, initial_state=s0, return_state=True, implementation="xla"))
    names = ("q", "k", "v", "s0") if g is None else ("q", "k", "v", "log_decay", "s0")
    argnums = (0, 1, 2, 4) if g is None else (0, 1, 2, 3, 4)
    loss = lambda f: jax.jit(jax.grad(
        lambda *a: jnp.sum(f(*a)[0] ** 2) + jnp.sum(f(*a)[1]), argnums=argnums))
    o1, s1 = kern(q, k, v, g, s0)
    o2, s2 = xla(q, k, v, g, s0)
    g1, g2 = loss(kern)(q, k, v, g, s0), loss(xla)(q, k, v, g, s0)
    errs = {"o": max_rel_err(o1, o2), "state": max_rel_err(s1, s2)}
    errs.update({f"d{n}": max_rel_err(x, y) for n, x, y in zip(names, g1, g2)})
    errs["ok"] = bool(max(errs.values()) < 1e-3)
    out["checks"][f"float32_{decay}"] = errs

  b, t, h, dk, dv = (1, 64, 2, 16, 16) if smoke else (4, 8192, 16, 128, 128)
  q, k, v, g, _ = _inputs(b, t, h, dk, dv, "vector", jnp.bfloat16)
  flops = chunk_flops(b, t, h, dk, dv)
  # The default splits the dk/dv sweep in two (no register spills, ~13% more
  # backward FLOPs); one sweep for both is timed to check that the split pays.
  one_sweep = dataclasses.replace(bs or cd.ChunkDecayBlockSizes.default("gpu", q.dtype),
                                  split_dkv=False)
  impls = {
      "pallas": lambda q, k, v, g: cd.chunk_decay_attention(q, k, v, g, block_sizes=bs),
      "pallas_one_dkv_sweep": lambda q, k, v, g: cd.chunk_decay_attention(
          q, k, v, g, block_sizes=one_sweep),
      "xla_chunk": lambda q, k, v, g: ops.decay_linear_attention(q, k, v, g, implementation="xla"),
  }
  reps = 2 if smoke else 10
  for name, f in impls.items():
    fwd = jax.jit(f)
    fwdbwd = jax.jit(jax.grad(lambda q, k, v, g: jnp.sum(f(q, k, v, g).astype(jnp.float32)),
                              argnums=(0, 1, 2, 3)))
    ms_f, ms_fb = timeit(fwd, q, k, v, g, reps=reps), timeit(fwdbwd, q, k, v, g, reps=reps)
    out["timings"][name] = {"fwd_ms": ms_f, "fwdbwd_ms": ms_fb,
                            "fwd_tflops": flops / ms_f / 1e9, "fwdbwd_tflops": 3 * flops / ms_fb / 1e9}
  try:
    fla = fla_chunk_gla_timings(q, k, v, g, flops, reps) if not smoke else {"skipped": "smoke run"}
  except Exception:  # noqa: BLE001 - fla's API drifts between versions; keep our numbers
    fla = {"error": traceback.format_exc()[-2000:]}
  out["timings"]["fla_chunk_gla"] = fla
  base = out["timings"]["pallas"]
  for other in ("pallas_one_dkv_sweep", "xla_chunk", "fla_chunk_gla"):
    o = out["timings"].get(other, {})
    if "fwd_ms" in o:  # > 1: the Pallas kernel is faster
      out[f"speedup_vs_{other}"] = {"fwd": o["fwd_ms"] / base["fwd_ms"],
                                    "fwdbwd": o["fwdbwd_ms"] / base["fwdbwd_ms"]}
  out["shape"] = dict(B=b, T=t, H=h, K=dk, V=dv, dtype="bfloat16", decay="per key channel")
  return out


def fla_chunk_gla_timings(q, k, v, g, flops, reps) -> dict:
  """flash-linear-attention's Triton ``chunk_gla`` (torch), for comparison only."""
  try:
    import torch
    from fla.ops.gla import chunk_gla
  except Exception as e:  # noqa: BLE001 - any import failure means: not available
    return {"skipped": f"fla not importable: {e!r}"}
  dev = "cuda"
  to_t = lambda x: torch.tensor(np.asarray(x.astype(jnp.float32)), device=dev)
  tq, tk, tv = (to_t(x).to(torch.bfloat16).requires_grad_() for x in (q, k, v))
  tg = to_t(g).requires_grad_()  # fla layout is also [B, T, H, K]

  def run(bwd):
    o, _ = chunk_gla(tq, tk, tv, tg, scale=q.shape[-1] ** -0.5)
    if bwd:
      o.float().sum().backward()
    return o

  def time_torch(bwd):
    run(bwd)
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
      t0 = time.perf_counter()
      run(bwd)
      torch.cuda.synchronize()
      ts.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(ts))

  with torch.no_grad():
    ms_f = time_torch(False)
  ms_fb = time_torch(True)
  return {"fwd_ms": ms_f, "fwdbwd_ms": ms_fb, "fwd_tflops": flops / ms_f / 1e9,
          "fwdbwd_tflops": 3 * flops / ms_fb / 1e9}


# ------------------------------------------------------------- delta-rule kernel


def _delta_inputs(b, t, h, dk, dv, dtype, seed=0):
  """Unit keys, sigmoid beta, Gated DeltaNet's gate (logsigmoid / 16), a state."""
  ks = jax.random.split(jax.random.PRNGKey(seed), 6)
  q = jax.random.normal(ks[0], (b, t, h, dk), jnp.float32)
  k = jax.random.normal(ks[1], (b, t, h, dk), jnp.float32)
  k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
  v = jax.random.normal(ks[2], (b, t, h, dv), jnp.float32)
  beta = jax.nn.sigmoid(jax.random.normal(ks[3], (b, t, h)))
  g = jax.nn.log_sigmoid(jax.random.normal(ks[4], (b, t, h))) / 16
  s0 = jax.random.normal(ks[5], (b, h, dk, dv), jnp.float32)
  return q.astype(dtype), k.astype(dtype), v.astype(dtype), beta, g, s0


def chunk_delta_section(args) -> dict:
  smoke = args.smoke
  out = {"checks": {}, "timings": {}}
  b, t, h, dk, dv = (1, 40, 2, 16, 32) if smoke else (2, 1000, 4, 64, 128)
  kw = dict(chunk_size=16, block_sizes=cdl.ChunkDeltaBlockSizes(block_v=16)) if smoke else {}
  names = ("q", "k", "v", "beta", "log_decay", "s0")
  for gated in (False, True):
    q, k, v, beta, g, s0 = _delta_inputs(b, t, h, dk, dv, jnp.float32)
    g = g if gated else None
    kern = lambda q, k, v, beta, g, s0: cdl.chunk_delta_attention(
        q, k, v, beta, g, initial_state=s0, return_state=True, **kw)
    xla = lambda q, k, v, beta, g, s0: ops.delta_rule(
        q, k, v, beta, g, initial_state=s0, return_state=True, form="chunk",
        chunk_size=kw.get("chunk_size", 64))
    argnums = tuple(i for i in range(6) if gated or i != 4)
    loss = lambda f: jax.jit(jax.grad(
        lambda *a: jnp.sum(f(*a)[0] ** 2) + jnp.sum(f(*a)[1]), argnums=argnums))
    o1, s1 = jax.jit(kern)(q, k, v, beta, g, s0)
    o2, s2 = jax.jit(xla)(q, k, v, beta, g, s0)
    g1, g2 = loss(kern)(q, k, v, beta, g, s0), loss(xla)(q, k, v, beta, g, s0)
    errs = {"o": max_rel_err(o1, o2), "state": max_rel_err(s1, s2)}
    errs.update({f"d{names[i]}": max_rel_err(x, y) for i, x, y in zip(argnums, g1, g2)})
    errs["ok"] = bool(max(errs.values()) < 1e-3)
    out["checks"][f"float32_{'gated' if gated else 'deltanet'}"] = errs

  b, t, h, dk, dv = (1, 64, 2, 16, 16) if smoke else (4, 8192, 16, 128, 128)
  q, k, v, beta, g, _ = _delta_inputs(b, t, h, dk, dv, jnp.bfloat16)
  flops = chunk_flops(b, t, h, dk, dv)
  impls = {
      "pallas": lambda q, k, v, beta, g: cdl.chunk_delta_attention(q, k, v, beta, g, **kw),
      "xla_chunk": lambda q, k, v, beta, g: ops.delta_rule(q, k, v, beta, g, form="chunk"),
  }
  reps = 2 if smoke else 10
  for name, f in impls.items():
    fwd = jax.jit(f)
    fwdbwd = jax.jit(jax.grad(lambda *a: jnp.sum(f(*a).astype(jnp.float32)),
                              argnums=(0, 1, 2, 3, 4)))
    a = (q, k, v, beta, g)
    ms_f, ms_fb = timeit(fwd, *a, reps=reps), timeit(fwdbwd, *a, reps=reps)
    out["timings"][name] = {"fwd_ms": ms_f, "fwdbwd_ms": ms_fb,
                            "fwd_tflops": flops / ms_f / 1e9, "fwdbwd_tflops": 3 * flops / ms_fb / 1e9}
  base, other = out["timings"]["pallas"], out["timings"]["xla_chunk"]
  out["speedup_vs_xla_chunk"] = {"fwd": other["fwd_ms"] / base["fwd_ms"],
                                 "fwdbwd": other["fwdbwd_ms"] / base["fwdbwd_ms"]}
  out["shape"] = dict(B=b, T=t, H=h, K=dk, V=dv, dtype="bfloat16", gate="scalar per head")
  return out


def _dplr_variants(b, t, h, dk, dv, dtype, chunk_size, seed=0):
  """``{name: fn(q, v, s0, log_alpha, implementation)}`` for KDA, RWKV-7 and Gated
  DeltaProduct (R = 2) on shared inputs, and those inputs ``(q, v, s0, log_alpha)``."""
  q, k, v, beta, _, s0 = _delta_inputs(b, t, h, dk, dv, dtype, seed)
  ks = jax.random.split(jax.random.PRNGKey(seed + 1), 3)
  log_alpha = jax.nn.log_sigmoid(jax.random.normal(ks[0], (b, t, h, dk))) / 16
  icl = jax.nn.sigmoid(jax.random.normal(ks[1], (b, t, h, dk)))
  k2 = jnp.stack([k, jnp.roll(k, 1, axis=1)], axis=3)
  beta2 = jnp.stack([beta, 1 - beta], axis=-1)
  kw = dict(chunk_size=chunk_size, form="chunk")
  fns = {
      "kda": lambda q, v, s0, g, impl: ops.kda(q, k, v, beta, g, initial_state=s0,
                                               return_state=True, implementation=impl, **kw),
      "rwkv7": lambda q, v, s0, g, impl: ops.rwkv7(q, k, v, g, k, icl, initial_state=s0,
                                                   return_state=True, implementation=impl, **kw),
      "gated_deltaproduct": lambda q, v, s0, g, impl: ops.gated_deltaproduct(
          q, k2, jnp.stack([v, -v], axis=3), beta2, g[..., 0], initial_state=s0,
          return_state=True, implementation=impl, **kw),
  }
  return fns, (q, v, s0, log_alpha)


def chunk_dplr_section(args) -> dict:
  smoke = args.smoke
  out = {"checks": {}, "timings": {}}
  b, t, h, dk, dv = (1, 40, 2, 16, 32) if smoke else (2, 1000, 4, 64, 128)
  chunk = 16 if smoke else 64
  fns, a = _dplr_variants(b, t, h, dk, dv, jnp.float32, chunk)
  names = ("q", "v", "s0", "log_decay")
  for variant, f in fns.items():
    kern = lambda *x, f=f: f(*x, "pallas")
    xla = lambda *x, f=f: f(*x, "xla")
    loss = lambda fn: jax.jit(jax.grad(
        lambda *x: jnp.sum(fn(*x)[0] ** 2) + jnp.sum(fn(*x)[1]), argnums=(0, 1, 2, 3)))
    o1, s1 = jax.jit(kern)(*a)
    o2, s2 = jax.jit(xla)(*a)
    errs = {"o": max_rel_err(o1, o2), "state": max_rel_err(s1, s2)}
    errs.update({f"d{n}": max_rel_err(x, y) for n, x, y in zip(names, loss(kern)(*a),
                                                               loss(xla)(*a))})
    errs["ok"] = bool(max(errs.values()) < 1e-3)
    out["checks"][f"float32_{variant}"] = errs

  b, t, h, dk, dv = (1, 64, 2, 16, 16) if smoke else (4, 8192, 16, 128, 128)
  fns, a = _dplr_variants(b, t, h, dk, dv, jnp.bfloat16, chunk)
  kda = fns["kda"]
  reps = 2 if smoke else 10
  for name, impl in (("pallas", "pallas"), ("xla_chunk", "xla")):
    f = lambda q, v, s0, g, impl=impl: kda(q, v, s0, g, impl)[0]
    fwdbwd = jax.jit(jax.grad(lambda *x: jnp.sum(f(*x).astype(jnp.float32)),
                              argnums=(0, 1, 2, 3)))
    out["timings"][name] = {"fwd_ms": timeit(jax.jit(f), *a, reps=reps),
                            "fwdbwd_ms": timeit(fwdbwd, *a, reps=reps)}
  base, other = out["timings"]["pallas"], out["timings"]["xla_chunk"]
  out["speedup_vs_xla_chunk"] = {"fwd": other["fwd_ms"] / base["fwd_ms"],
                                 "fwdbwd": other["fwdbwd_ms"] / base["fwdbwd_ms"]}
  out["shape"] = dict(B=b, T=t, H=h, K=dk, V=dv, dtype="bfloat16", variant="kda",
                      chunk_size=chunk)
  return out


# -------------------------------------------------------------------- linear scan


def scan_section(args) -> dict:
  smoke = args.smoke
  out = {}
  b, t, d = (2, 21, 12) if smoke else (4, 4096, 2048)
  ks = jax.random.split(jax.random.PRNGKey(1), 3)
  a = jax.random.uniform(ks[0], (b, t, d), minval=0.5, maxval=1.0)
  x = jax.random.normal(ks[1], (b, t, d))
  h0 = jax.random.normal(ks[2], (b, d))
  kern = lambda a, x, h0: scan_kernel.linear_scan(a, x, h0=h0, return_state=True)
  xla = lambda a, x, h0: ops.linear_scan(a, x, h0=h0, return_state=True, implementation="xla")
  loss = lambda f: jax.jit(jax.grad(lambda *z: jnp.sum(f(*z)[0] ** 2) + jnp.sum(f(*z)[1]),
                                    argnums=(0, 1, 2)))
  h1, s1 = jax.jit(kern)(a, x, h0)
  h2, s2 = jax.jit(xla)(a, x, h0)
  errs = {"h": max_rel_err(h1, h2), "state": max_rel_err(s1, s2)}
  errs.update({f"d{n}": max_rel_err(p, r) for n, p, r in
               zip(("a", "b", "h0"), loss(kern)(a, x, h0), loss(xla)(a, x, h0))})
  errs["ok"] = bool(max(errs.values()) < 1e-3)
  out["checks"] = {"float32": errs}
  reps = 2 if smoke else 10
  out["timings"] = {}
  for name, f in (("pallas", kern), ("xla_chunk", xla)):
    fb = jax.jit(jax.grad(lambda a, x: jnp.sum(f(a, x, h0)[0]), argnums=(0, 1)))
    out["timings"][name] = {"fwd_ms": timeit(jax.jit(f), a, x, h0, reps=reps),
                            "fwdbwd_ms": timeit(fb, a, x, reps=reps)}
  out["shape"] = dict(B=b, T=t, D=d, dtype="float32")
  return out


# ---------------------------------------------------------------- flash attention


# Float32 agreement of the kernel with the naive softmax (max abs error; inputs
# are unit normals, T <= 1024): the forward is exact to rounding, gradients sum
# over T keys.
FLASH_TOLERANCE = {"max_abs_err_fwd_vs_naive_f32": 1e-3, "max_abs_err_grads_vs_naive_f32": 1e-2}


def flash_section(args) -> dict:
  """Flash attention vs cuDNN and XLA (``gpu_check_flash.flash_section``), plus an
  ``ok`` flag from its float32 errors and the kernel having compiled and run."""
  out = gpu_check_flash.flash_section(args)
  errs = {name: out[name] for name in FLASH_TOLERANCE if name in out}
  errs["ok"] = bool("pallas" not in out["errors"] and len(errs) == len(FLASH_TOLERANCE)
                    and all(errs[n] <= tol for n, tol in FLASH_TOLERANCE.items()))
  out["checks"] = {"float32": errs}
  return out


def verified_default(result: dict, smoke: bool) -> str:
  """The ``implementation=None`` default this run has verified, as a sentence."""
  if smoke or result["backend"] != "gpu":
    return ("implementation=None default: nothing verified (smoke run, or no GPU); it stays "
            f"XLA everywhere (PALLAS_DEFAULT_BACKENDS = {dispatch.PALLAS_DEFAULT_BACKENDS}).")
  bad = [name for name in SECTIONS
         if "error" in result.get(name, {})
         or any(isinstance(c, dict) and c.get("ok") is False
                for c in result.get(name, {}).get("checks", {}).values())
         or not result.get(name, {}).get("checks")]
  device = result["devices"][0] if result["devices"] else "this GPU"
  if bad:
    return (f"implementation=None default: NOT verified on {device}: {', '.join(bad)} failed; "
            "keep PALLAS_DEFAULT_BACKENDS = () (XLA on GPU).")
  return (f"implementation=None default: verified on {device} (chunk decay, chunk delta, chunk "
          "DPLR, linear scan and flash attention agree with XLA): set PALLAS_DEFAULT_BACKENDS = (\"gpu\",) in "
          "linear_attention/engines/dispatch.py to make the kernels the GPU default.")


# --------------------------------------------------------------------------- main


SECTIONS = {"chunk_decay": chunk_decay_section, "chunk_delta": chunk_delta_section,
            "chunk_dplr": chunk_dplr_section, "scan": scan_section, "flash": flash_section}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--smoke", action="store_true",
                 help="tiny shapes; on CPU the kernels run in interpret mode")
  outputs.add_out(p, "gpu_check.json", what="JSON output path")
  p.add_argument("--sections", default=",".join(SECTIONS),
                 help="comma-separated subset of " + ",".join(SECTIONS))
  args = p.parse_args(argv)
  if not args.smoke and jax.default_backend() != "gpu":
    print("no GPU found: run with --smoke for the interpret-mode sanity version")
    return 2
  result = {"backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()],
            "jax": jax.__version__, "smoke": args.smoke}
  start = time.perf_counter()
  failed = False
  for name in args.sections.split(","):
    t0 = time.perf_counter()
    try:
      result[name] = SECTIONS[name](args)
    except Exception:  # noqa: BLE001 - record and go on with the other sections
      result[name] = {"error": traceback.format_exc()}
      failed = True
    result[name]["seconds"] = time.perf_counter() - t0
    print(f"== {name} ({result[name]['seconds']:.1f}s)")
    print(json.dumps({k: v for k, v in result[name].items() if k != "seconds"}, indent=1)[:4000])
    checks = result[name].get("checks", {})
    failed |= any(isinstance(c, dict) and c.get("ok") is False for c in checks.values())
  result["total_seconds"] = time.perf_counter() - start
  result["verified_default"] = verified_default(result, args.smoke)
  write_json(args.out, result)
  print(f"wrote {args.out} in {result['total_seconds']:.0f}s; {'FAILED' if failed else 'ok'}")
  print(result["verified_default"])
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
