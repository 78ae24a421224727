"""Numerical limits of a few ops in float32, measured at small shapes (README, "Numerical limits").

Prints four findings: mLSTM's error against a float64 reference at T=800 per form; how far
a NaN in one key spreads in each form of Gated DeltaNet (packed segments, chunk 16); the
input scale at which softmax and ELU linear attention start returning NaN; and ReBased's
float32 error against a float64 reference per form, by the size of the token's normaliser
``z_t = sum_j (q~_t . k~_j)^2 / D`` (small when a query is nearly orthogonal to every key
before it: the division then amplifies the features' rounding).

    python experiments/probes/probe_numerics.py
"""

from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)  # the float64 reference

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from linear_attention import ops  # noqa: E402
from linear_attention.ops import feature_maps  # noqa: E402


def normal(seed: int, shape) -> jax.Array:
  return jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float32)


def main() -> None:
  b, t, h, d = 1, 800, 2, 16
  q, k, v = normal(0, (b, t, h, d)), normal(1, (b, t, h, d)), normal(2, (b, t, h, d))
  i_gate, f_gate = normal(3, (b, t, h)), normal(4, (b, t, h)) + 3.0
  ref = ops.mlstm(*(x.astype(jnp.float64) for x in (q, k, v, i_gate, f_gate)), form="recurrent")
  for form in ("parallel", "chunk", "recurrent"):
    o = ops.mlstm(q, k, v, i_gate, f_gate, form=form)
    err = float(jnp.max(jnp.abs(o - ref)) / jnp.max(jnp.abs(ref)))
    print(f"mlstm T={t} {form:9s} relative error vs float64: {err:.2e}")

  t = 64
  q, k, v = normal(5, (b, t, 1, 8)), normal(6, (b, t, 1, 8)), normal(7, (b, t, 1, 8))
  k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
  beta, gate = jax.nn.sigmoid(normal(8, (b, t, 1))), -jax.nn.softplus(normal(9, (b, t, 1)))
  seg = jnp.asarray([[0] * 32 + [1] * 32])
  k_nan = k.at[0, 40, 0, 0].set(jnp.nan)
  for form in ("recurrent", "chunk", "parallel"):
    o = ops.gated_deltanet(q, k_nan, v, beta, gate, form=form, chunk_size=16, segment_ids=seg)
    rows = np.where(np.isnan(np.asarray(o)).any(axis=(0, 2, 3)))[0]
    print(f"gated_deltanet NaN key at t=40 (segments 0-31, 32-63) {form:9s} NaN outputs at "
          f"t={rows.min()}..{rows.max()} ({len(rows)} tokens)")

  for scale in (1e10, 1e20, 1e30):
    soft = ops.softmax_attention(q * scale, k * scale, v, causal=True)
    elu = ops.linear_attention(q * scale, k * scale, v, feature_map="elu")
    print(f"q, k x {scale:.0e}: softmax NaN {bool(jnp.isnan(soft).any())}, "
          f"ELU linear attention NaN {bool(jnp.isnan(elu).any())}")

  rebased()


def rebased(b: int = 32, t: int = 64, h: int = 4, d: int = 16, segment: int = 16) -> None:
  """ReBased's per-token error against float64, grouped by the normaliser's size.

  Packed segments of ``segment`` tokens: the normaliser is smallest at a segment's first
  tokens (few keys), so many segment starts sample its small values.
  """
  q, k, v = normal(10, (b, t, h, d)), normal(11, (b, t, h, d)), normal(12, (b, t, h, d))
  gamma, beta = jnp.ones((d,)), jnp.zeros((d,))  # the layer's initial values
  seg = jnp.broadcast_to(jnp.arange(t) // segment, (b, t))
  as64 = lambda *xs: [x.astype(jnp.float64) for x in xs]  # noqa: E731
  ref = ops.rebased_attention(*as64(q, k, v, gamma, beta), form="parallel", segment_ids=seg)
  qn, kn = (feature_maps.affine_layer_norm(x, *as64(gamma, beta)) for x in as64(q, k))
  # The normaliser: unnormalised attention of the LayerNormed q, k over values of 1.
  z = ops.linear_attention(qn, kn, jnp.ones((b, t, h, 1), jnp.float64), feature_map="squared",
                           normalize=False, form="parallel", segment_ids=seg)[..., 0]
  scale = float(jnp.max(jnp.abs(ref)))
  bins = [(0.0, 1e-4), (1e-4, 1e-3), (1e-3, 1e-2), (1e-2, 1e-1), (1e-1, np.inf)]
  print(f"rebased B={b} T={t} H={h} D={d}, segments of {segment}: normaliser z from "
        f"{float(z.min()):.1e} to {float(z.max()):.1e}; tokens per z bin "
        + ", ".join(f"[{lo:.0e}, {hi:.0e}) {int(jnp.sum((z >= lo) & (z < hi)))}"
                    for lo, hi in bins))
  for form in ("parallel", "chunk", "recurrent"):
    o = ops.rebased_attention(q, k, v, gamma, beta, form=form, segment_ids=seg)
    err = jnp.max(jnp.abs(o - ref), axis=-1) / scale  # per token, relative to max |o|
    worst = [float(jnp.max(jnp.where((z >= lo) & (z < hi), err, 0.0))) for lo, hi in bins]
    print(f"rebased {form:9s} max error / max|o| per z bin: "
          + ", ".join(f"{w:.1e}" for w in worst)
          + f"; max of error x z: {float(jnp.max(err * z)):.1e}")

if __name__ == "__main__":
  main()
