"""Flash-attention section of the GPU check: Pallas kernel vs cuDNN and XLA.

Call ``flash_section(args)`` from ``experiments/checks/gpu_check.py`` (``args`` needs
only an optional ``smoke`` attribute), or run this file alone:

    python experiments/checks/gpu_check_flash.py [--smoke] [--out results/gpu_check_flash.json]

On a GPU: bfloat16, B=4, T=8192, H=16, D=128, causal. Times (median of
``repeats`` runs, milliseconds) the forward and forward+backward of the Pallas
kernel, ``jax.nn.dot_product_attention(implementation="cudnn")`` and the XLA
path (``ops.softmax_attention(implementation="xla")``, the blockwise online
softmax at this length); checks the kernel's output and gradients against XLA.
FLOPs: forward ``4 * B * H * T * T * D``, halved when causal; forward+backward
counts 3.5x the forward (backward = 2.5x forward, the FlashAttention-2
convention). With ``smoke`` (or on CPU) it runs a tiny interpret-mode version.
Needs only jax (no ml-collections).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # the package and experiments/

from experiments import outputs  # noqa: E402
from linear_attention.engines import dispatch  # pylint: disable=g-import-not-at-top
from linear_attention.engines.softmax import pallas as fa  # pylint: disable=g-import-not-at-top
from linear_attention.io import write_json  # pylint: disable=g-import-not-at-top
from linear_attention.ops import softmax_attention  # pylint: disable=g-import-not-at-top


def _time(fn, *args, repeats: int) -> float:
  """Median wall time in ms of a jitted ``fn(*args)`` after one warm-up call."""
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return float(np.median(times) * 1e3)


def _fwd_bwd(attn):
  def loss(q, k, v):
    return jnp.sum(attn(q, k, v).astype(jnp.float32))
  return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def _max_err(a, b) -> float:
  return float(jnp.max(jnp.abs(jnp.asarray(a, jnp.float32) - jnp.asarray(b, jnp.float32))))


def flash_section(args=None) -> dict:
  """Runs the flash-attention check; returns a JSON-ready dict (see module doc)."""
  smoke = bool(getattr(args, "smoke", False)) or dispatch.current_platform() != "gpu"
  if smoke:
    b, t, h, d, repeats, interpret = 1, 100, 2, 32, 1, True
    blocks = fa.FlashBlockSizes(32, 32, 32, 32, 32, 32)
  else:
    b, t, h, d, repeats, interpret = 4, 8192, 16, 128, 5, False
    blocks = None
  causal = True
  kq, kk, kv = jax.random.split(jax.random.PRNGKey(0), 3)
  q, k, v = (jax.random.normal(x, (b, t, h, d), jnp.bfloat16) for x in (kq, kk, kv))
  flops_fwd = 4 * b * h * t * t * d * (0.5 if causal else 1.0)
  flops_fb = 3.5 * flops_fwd
  out = {"shape": dict(B=b, T=t, H=h, D=d, causal=causal, dtype="bfloat16"),
         "smoke": smoke, "device": str(jax.devices()[0]),
         "flop_convention": "fwd = 4*B*H*T*T*D * 0.5 (causal); fwd+bwd = 3.5 x fwd",
         "ms": {}, "tflops": {}, "errors": {}}

  impls = {
      "pallas": lambda q, k, v: fa.flash_attention(q, k, v, causal=causal, block_sizes=blocks,
                                                   interpret=interpret),
      "xla": lambda q, k, v: softmax_attention(q, k, v, causal=causal, implementation="xla"),
  }
  if not smoke:
    impls["cudnn"] = lambda q, k, v: jax.nn.dot_product_attention(
        q, k, v, is_causal=True, implementation="cudnn")
  for name, attn in impls.items():
    try:
      fwd = jax.jit(attn)
      out["ms"][f"{name}_fwd"] = _time(fwd, q, k, v, repeats=repeats)
      out["ms"][f"{name}_fwd_bwd"] = _time(_fwd_bwd(attn), q, k, v, repeats=repeats)
      out["tflops"][f"{name}_fwd"] = flops_fwd / out["ms"][f"{name}_fwd"] / 1e9
      out["tflops"][f"{name}_fwd_bwd"] = flops_fb / out["ms"][f"{name}_fwd_bwd"] / 1e9
    except Exception as e:  # pylint: disable=broad-except
      out["errors"][name] = f"{type(e).__name__}: {str(e)[:300]}"

  # Correctness in bf16 on the timed shape (forward vs XLA and cuDNN) ...
  o = jax.jit(impls["pallas"])(q, k, v)
  out["max_abs_err_fwd_vs_xla_bf16"] = _max_err(o, jax.jit(impls["xla"])(q, k, v))
  if "cudnn" in impls and "cudnn" not in out["errors"]:
    out["max_abs_err_fwd_vs_cudnn_bf16"] = _max_err(o, jax.jit(impls["cudnn"])(q, k, v))
  # ... and forward + gradients in float32 on a smaller shape vs the naive path.
  ts = min(t, 1024)
  qs, ks, vs = (x[:1, :ts].astype(jnp.float32) for x in (q, k, v))
  g = _fwd_bwd(impls["pallas"])(qs, ks, vs)
  g_ref = _fwd_bwd(lambda q, k, v: softmax_attention(q, k, v, causal=causal,
                                                     algorithm="naive"))(qs, ks, vs)
  out["max_abs_err_grads_vs_naive_f32"] = max(_max_err(a, e) for a, e in zip(g, g_ref))
  out["max_abs_err_fwd_vs_naive_f32"] = _max_err(
      impls["pallas"](qs, ks, vs), softmax_attention(qs, ks, vs, causal=causal,
                                                     algorithm="naive"))
  ms = out["ms"]
  for other in ("cudnn", "xla"):
    for kind in ("fwd", "fwd_bwd"):
      if f"{other}_{kind}" in ms and f"pallas_{kind}" in ms:
        # > 1 means the Pallas kernel is faster.
        out[f"speedup_vs_{other}_{kind}"] = ms[f"{other}_{kind}"] / ms[f"pallas_{kind}"]
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--smoke", action="store_true", help="tiny interpret-mode run")
  outputs.add_out(parser, "gpu_check_flash.json")
  args = parser.parse_args()
  result = flash_section(args)
  write_json(args.out, result)
  print(json.dumps(result, indent=2))


if __name__ == "__main__":
  main()
