"""The Mamba-1 / Mamba-2 ablation options of issue 30 (the induction-heads probe).

Mamba-2: ``dt_from_conv``, ``bc_from_conv``; Mamba-1: ``scalar_a``, ``dt_from_input``,
``equal_a_init``. Each:
default-preserving (same parameters when off), changes the output when on, decodes as it
trains, isolates packed segments, and has finite gradients. The two layouts meet: Mamba-2
with head dimension 1, ``dt_from_conv``, ``bc_from_conv`` and no norm computes Mamba-1 with
``scalar_a`` once the weights are copied across (its ``dt`` projection is the product of
Mamba-1's two).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from linear_attention import nn as lnn
from tests import helpers

B, T, D, H, N = 2, 13, 16, 2, 4

OPTIONS = [("mamba2", dict(dt_from_conv=True)), ("mamba2", dict(bc_from_conv=True)),
           ("mamba2", dict(dt_from_conv=True, bc_from_conv=True, norm=False)),
           ("mamba", dict(scalar_a=True)), ("mamba", dict(dt_from_input=True)),
           ("mamba", dict(scalar_a=True, dt_from_input=True)),
           ("mamba", dict(equal_a_init=True))]


def _layer(name, heads=H, seed=0, **kw):
  return lnn.make_mixer(name, D, heads, rngs=nnx.Rngs(seed), d_state=N, **kw)


def _x(seed=1):
  return helpers.rand(jax.random.PRNGKey(seed), (B, T, D), jnp.float32)


@pytest.mark.parametrize("name,kw", OPTIONS)
def test_option_decodes_as_it_trains_and_changes_the_output(name, kw):
  x = _x()
  layer = _layer(name, **kw)
  y = layer(x)
  assert y.shape == x.shape
  assert not np.allclose(y, _layer(name)(x), atol=1e-3), kw
  np.testing.assert_allclose(helpers.decode_all(layer, x), y, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("name,kw", OPTIONS)
def test_option_isolates_segments_and_has_gradients(name, kw):
  x = _x()
  layer = _layer(name, **kw)
  cut = 6
  seg = jnp.broadcast_to((jnp.arange(T) >= cut).astype(jnp.int32), (B, T))
  packed = layer(x, segment_ids=seg)
  np.testing.assert_allclose(packed[:, :cut], layer(x[:, :cut]), rtol=2e-4, atol=2e-5)
  np.testing.assert_allclose(packed[:, cut:], layer(x[:, cut:]), rtol=2e-4, atol=2e-5)
  graphdef, params, rest = nnx.split(layer, nnx.Param, ...)
  grads = jax.grad(lambda p: jnp.sum(nnx.merge(graphdef, p, rest)(x) ** 2))(params)
  leaves = jax.tree.leaves(grads)
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in leaves)
  # Every parameter the option adds or reshapes is trained (a nonzero gradient).
  assert all(float(jnp.max(jnp.abs(g))) > 0 for g in leaves), kw


def test_defaults_are_unchanged():
  """Off, the options add no parameter and leave the draws alone (existing runs stay valid)."""
  for name, kw in (("mamba2", dict(dt_from_conv=False, bc_from_conv=False)),
                   ("mamba", dict(scalar_a=False, dt_from_input=False, equal_a_init=False))):
    a = nnx.state(_layer(name), nnx.Param)
    b = nnx.state(_layer(name, **kw), nnx.Param)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
      np.testing.assert_array_equal(u, v)
  assert _layer("mamba2").x_proj is None and _layer("mamba").u_proj is None


def test_scalar_a_is_one_decay_per_channel_in_range():
  layer = _layer("mamba", scalar_a=True, a_init_scale=0.5)
  a = np.exp(np.asarray(layer.A_log[...]))
  assert a.shape == (layer.d_inner,)
  assert a.min() >= 0.5 * 1.0 - 1e-6 and a.max() <= 0.5 * N + 1e-6 and a.std() > 0
  full, _, _ = layer._params()
  assert full.shape == (layer.d_inner, N)
  np.testing.assert_array_equal(full[:, 0], full[:, -1])


def test_equal_a_init_starts_as_scalar_a_and_learns_per_state_dimension():
  """Same seed: the same function as ``scalar_a`` at init (every parameter equal, ``A``
  broadcast over ``N``), but ``A``'s gradient differs across the state dimensions, which
  ``scalar_a`` sums into one."""
  eq, sc = _layer("mamba", equal_a_init=True), _layer("mamba", scalar_a=True)
  a_eq, a_sc = np.asarray(eq.A_log[...]), np.asarray(sc.A_log[...])
  assert a_eq.shape == (eq.d_inner, N)
  np.testing.assert_array_equal(a_eq, np.broadcast_to(a_sc[:, None], a_eq.shape))
  x = _x()
  np.testing.assert_array_equal(eq(x), sc(x))
  graphdef, params, rest = nnx.split(eq, nnx.Param, ...)
  g = jax.grad(lambda p: jnp.sum(nnx.merge(graphdef, p, rest)(x) ** 2))(params)["A_log"][...]
  assert float(jnp.max(jnp.abs(g[:, 0] - g[:, -1]))) > 0
  with pytest.raises(ValueError, match="equal_a_init"):
    _layer("mamba", scalar_a=True, equal_a_init=True)


def test_dt_from_input_reads_the_layer_input():
  """``dt`` of Mamba-1's ``dt_from_input`` depends on ``u`` itself, not on the conv'd ``x``:
  zeroing the conv leaves ``dt`` moving with ``u``; by default it would not move."""
  u = _x()
  for kw, moves in ((dict(dt_from_input=True), True), (dict(), False)):
    layer = _layer("mamba", **kw)
    layer.conv.weight.set_value(jnp.zeros_like(layer.conv.weight[...]))
    x = layer.conv(layer.in_proj(u)[..., :layer.d_inner])
    dt, _, _ = layer._ssm_inputs(x, u)
    assert bool(jnp.any(jnp.abs(dt) > 1e-6)) == moves, kw


def test_mamba2_at_head_dim_1_with_mamba1_layout_is_mamba1_with_scalar_a():
  m1 = _layer("mamba", scalar_a=True, seed=3)
  di, r = m1.d_inner, m1.dt_rank
  m2 = _layer("mamba2", heads=di, dt_from_conv=True, bc_from_conv=True, norm=False, seed=4)
  w_in = m1.in_proj.kernel[...]
  m2.in_proj.kernel.set_value(jnp.concatenate([w_in[:, di:], w_in[:, :di]], 1))  # z, x order
  m2.conv.weight.set_value(m1.conv.weight[...])
  m2.conv.bias.set_value(m1.conv.bias[...])
  w_x = m1.x_proj.kernel[...]
  w_dt = w_x[:, :r] @ m1.dt_proj.kernel[...]  # Mamba-1's low-rank dt, as one matrix
  m2.x_proj.kernel.set_value(jnp.concatenate([w_x[:, r:], w_dt], 1))  # B, C, then dt
  for p in ("A_log", "dt_bias", "D"):
    getattr(m2, p).set_value(getattr(m1, p)[...])
  m2.out_proj.kernel.set_value(m1.out_proj.kernel[...])
  x = _x()
  np.testing.assert_allclose(m2(x), m1(x), rtol=1e-4, atol=1e-5)
