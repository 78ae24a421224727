"""Numerical limits of a few ops in float32, measured at small shapes (README, "Numerical limits").

Prints three findings: mLSTM's error against a float64 reference at T=800 per form; how far
a NaN in one key spreads in each form of Gated DeltaNet (packed segments, chunk 16); and the
input scale at which softmax and ELU linear attention start returning NaN.

    python experiments/probe_numerics.py
"""

from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)  # the float64 reference

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from linear_attention import ops  # noqa: E402


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


if __name__ == "__main__":
  main()
