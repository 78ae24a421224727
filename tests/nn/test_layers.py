"""Every registry mixer: shapes, jit + grad, decode == forward, bfloat16, split/merge."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from linear_attention import nn as lnn
from linear_attention.nn import modules
from tests import helpers

B, T, D, H = 2, 17, 32, 2



def build(name, param_dtype=jnp.float32, seed=0):
  dtype = None if param_dtype == jnp.float32 else param_dtype
  return lnn.make_mixer(name, D, H, rngs=nnx.Rngs(seed), param_dtype=param_dtype, dtype=dtype,
                        **lnn.spec(name).tiny)


def inputs(dtype=jnp.float32, seed=1):
  return helpers.rand(jax.random.PRNGKey(seed), (B, T, D), dtype)


def _loss_and_out(graphdef, params, rest, x, w):
  model = nnx.merge(graphdef, params, rest)
  y = model(x)
  return jnp.sum(y.astype(jnp.float32) * w), y


_grad_fn = jax.jit(jax.value_and_grad(_loss_and_out, argnums=1, has_aux=True),
                   static_argnums=0)


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, x):
  return nnx.merge(graphdef, state)(x)


@functools.partial(jax.jit, static_argnums=(0, 3))
def _decode_all(graphdef, state, x, cache_dtype):
  """Teacher-forced decoding of ``x [B, T, D]`` token by token; returns outputs and caches."""
  model = nnx.merge(graphdef, state)
  cache0 = model.init_cache(x.shape[0], x.shape[1], cache_dtype)

  def body(cache, x_t):
    y_t, cache = model.decode_step(x_t, cache)
    return cache, y_t

  cache, ys = jax.lax.scan(body, cache0, jnp.swapaxes(x, 0, 1))
  return jnp.swapaxes(ys, 0, 1), cache0, cache


@pytest.mark.parametrize("name", lnn.MIXERS)
def test_forward_grad_and_decode(name):
  """Jitted forward and gradient are finite; decode == forward for causal mixers."""
  model = build(name)
  x = inputs()
  w = helpers.rand(jax.random.PRNGKey(2), (B, T, D))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  (loss, y), grads = _grad_fn(graphdef, params, rest, x, w)
  assert y.shape == (B, T, D) and y.dtype == jnp.float32
  assert np.isfinite(float(loss))
  leaves = jax.tree_util.tree_leaves(grads)
  assert leaves and all(bool(jnp.all(jnp.isfinite(g))) for g in leaves)
  # Every parameter takes part: none has an identically zero gradient.
  zero = [p for p, g in jax.tree_util.tree_leaves_with_path(grads) if not bool(jnp.any(g != 0))]
  assert not zero, f"parameters without gradient: {zero}"
  if name not in lnn.CAUSAL_MIXERS:
    return
  # Teacher-forced decoding, one token at a time, equals the full forward.
  ys, cache0, cache = _decode_all(graphdef, nnx.merge_state(params, rest), x, jnp.float32)
  helpers.assert_close(ys, y, rtol=1e-4, atol=2e-4, err_msg=name)
  # The cache keeps its structure and dtypes, as lax.scan and jit need.
  assert jax.tree_util.tree_structure(cache0) == jax.tree_util.tree_structure(cache)
  assert jax.tree.map(lambda a: a.dtype, cache0) == jax.tree.map(lambda a: a.dtype, cache)


@pytest.mark.parametrize("name", lnn.MIXERS)
def test_bfloat16_params_float32_state(name):
  model = build(name, param_dtype=jnp.bfloat16)
  params = jax.tree_util.tree_leaves(nnx.state(model, nnx.Param))
  assert all(p.dtype == jnp.bfloat16 for p in params)
  x = inputs(jnp.bfloat16)
  graphdef, state = nnx.split(model)
  y = _forward(graphdef, state, x)
  assert y.shape == (B, T, D) and y.dtype == jnp.bfloat16
  assert bool(jnp.all(jnp.isfinite(y.astype(jnp.float32))))
  if name not in lnn.CAUSAL_MIXERS:
    with pytest.raises(NotImplementedError):
      model.init_cache(B, T, jnp.bfloat16)
    return
  ys, _, cache = _decode_all(graphdef, state, x, jnp.bfloat16)
  assert ys.dtype == jnp.bfloat16
  scale = float(jnp.max(jnp.abs(y.astype(jnp.float32))))
  helpers.assert_close(ys, y, rtol=helpers.BF16_RTOL, atol=helpers.BF16_ATOL * scale,
                       err_msg=name)
  # Recurrent states stay float32 (complex64 for S4D); only KV caches take the bf16 dtype.
  for path, leaf in jax.tree_util.tree_leaves_with_path(cache):
    key = path[-1].key
    if key in ("k", "v", "latent", "k_rope"):  # attention caches (MLA's: its latents)
      assert leaf.dtype == jnp.bfloat16, path
    elif key not in ("pos", "limit", "overflow"):  # counters and the overflow flag
      assert leaf.dtype in (jnp.float32, jnp.complex64), (path, leaf.dtype)


@pytest.mark.parametrize("name", lnn.MIXERS)
def test_split_merge_round_trip(name):
  model = build(name)
  graphdef, state = nnx.split(model)
  clone = nnx.merge(graphdef, state)
  assert type(clone) is type(model) and clone is not model
  g2, s2 = nnx.split(clone)
  assert g2 == graphdef
  helpers.assert_tree_close(nnx.to_pure_dict(s2), nnx.to_pure_dict(state), rtol=0, atol=0)


def test_segment_ids_isolate_packed_sequences():
  """Two packed sequences give the outputs of two separate calls (a few mixers)."""
  x = inputs()[:, :16]
  seg = jnp.asarray([[0] * 8 + [1] * 8] * B)
  apart = jnp.concatenate([x[:, :8], x[:, 8:]], axis=0)  # [2B, 8, D]
  for name in ("softmax", "gla", "hawk", "gated_deltanet"):
    graphdef, state = nnx.split(build(name))
    packed = _forward_seg(graphdef, state, x, seg)
    alone = _forward(graphdef, state, apart)
    helpers.assert_close(jnp.concatenate([packed[:, :8], packed[:, 8:]], axis=0), alone,
                         atol=2e-4, err_msg=name)


@functools.partial(jax.jit, static_argnums=0)
def _forward_seg(graphdef, state, x, segment_ids):
  return nnx.merge(graphdef, state)(x, segment_ids=segment_ids)


def test_random_feature_redraw():
  model = build("performer")
  assert isinstance(model.projection, modules.RandomFeatures)
  before = model.projection[...]
  x = inputs()
  y0 = model(x)
  n_params = sum(p.size for p in jax.tree_util.tree_leaves(nnx.state(model, nnx.Param)))
  model.redraw(jax.random.PRNGKey(123))
  after = model.projection[...]
  assert after.shape == before.shape and after.dtype == before.dtype
  assert not np.allclose(before, after)
  y1 = model(x)
  assert y1.shape == y0.shape and not np.allclose(y0, y1)
  # Not a parameter: gradients and optimisers skip it, the parameter count is unchanged.
  assert not jax.tree_util.tree_leaves(nnx.filter_state(nnx.state(model, nnx.Param), modules.RandomFeatures))
  assert sum(p.size for p in jax.tree_util.tree_leaves(nnx.state(model, nnx.Param))) == n_params
  # Orthogonal (favor+) rows come in orthogonal blocks.
  blk = np.asarray(after[:D // H])
  gram = blk @ blk.T
  np.testing.assert_allclose(gram - np.diag(np.diag(gram)), 0, atol=1e-3)


@pytest.mark.parametrize("name", lnn.MIXERS)
def test_layer_arguments_are_checked_by_name(name):
  kw = lnn.spec(name).tiny
  for d, h, match in ((0, 2, "d_model must be an int >= 1, got 0"),
                      (16, 0, "num_heads must be an int >= 1, got 0")):
    with pytest.raises(ValueError, match=match):
      lnn.make_mixer(name, d, h, rngs=nnx.Rngs(0), **kw)
  layer = build(name)
  width = layer.d_model
  cases = [(jnp.ones((2, 8, width + 2)), "x must have shape \\[batch, seq, d_model\\] with "
                                         f"d_model={width} last, got shape \\(2, 8, {width + 2}\\)"),
           (jnp.ones((8, width)), "x must have shape \\[batch, seq, d_model\\] \\(rank 3\\)"),
           (jnp.ones((2, 8, width), jnp.int32), "x must be a floating-point array.*int32")]
  for x, match in cases:
    with pytest.raises(ValueError, match=match):
      layer(x)
  if layer.causal:
    cache = layer.init_cache(2, 4)
    with pytest.raises(ValueError, match="x must have shape \\[batch, d_model\\]"):
      layer.decode_step(jnp.ones((2, 1, width)), cache)


def test_registry_errors():
  with pytest.raises(ValueError, match="unknown mixer 'nope'.*softmax"):
    lnn.make_mixer("nope", D, H, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="windw"):
    lnn.make_mixer("local", D, H, rngs=nnx.Rngs(0), windw=4)
  assert "window" in lnn.mixer_kwargs("local")
  assert set(lnn.CAUSAL_MIXERS) | set(lnn.ENCODER_MIXERS) == set(lnn.MIXERS)
  with pytest.raises(ValueError, match="unknown mixer 'nope'"):
    lnn.spec("nope")
  with pytest.raises(ValueError, match="study must be one of .*got 'nope'"):
    lnn.select(study="nope")
  with pytest.raises(ValueError, match="family must be one of"):
    lnn.MixerSpec("x", object, "nope")
  with pytest.raises(ValueError, match="unknown studies \\['nope'\\]"):
    lnn.MixerSpec("x", object, "linear", studies=frozenset({"nope"}))


def test_registry_selection():
  """Selections are subsets in registry order; every letter names a distinct mixer."""
  assert lnn.select() == lnn.MIXERS
  assert lnn.select(causal=False) == lnn.ENCODER_MIXERS
  for study in lnn.registry.STUDIES:
    names = lnn.select(study=study)
    assert names and list(names) == [m for m in lnn.MIXERS if m in names], study
  assert all(lnn.spec(m).gating == "data" for m in lnn.select(gating="data"))
  assert "softmax" not in lnn.select(gating="data") and "gla" in lnn.select(gating="data")
  assert sorted(lnn.PATTERN_LETTERS.values()) == sorted(
      m for m in lnn.MIXERS if lnn.spec(m).letter)


def test_initialisation_ranges():
  hawk = build("hawk")
  a = jax.nn.sigmoid(hawk.log_lambda[...]) ** hawk.c
  assert float(a.min()) >= 0.9 - 1e-6 and float(a.max()) <= 0.999 + 1e-6
  for name in ("mamba", "mamba2", "gated_deltanet"):
    dt = jax.nn.softplus(build(name).dt_bias[...])
    assert float(dt.min()) >= 1e-3 * (1 - 1e-4) and float(dt.max()) <= 1e-1 * (1 + 1e-4), name
  gqa = build("softmax")
  assert gqa.k_proj.kernel[...].shape == (D, D // H)  # one kv head of width D / H


def _decay(name, seed=0, **kw):
  return lnn.make_mixer(name, D, H, rngs=nnx.Rngs(seed), **{**lnn.spec(name).tiny, **kw})


def test_decay_init_defaults_are_the_reference():
  mamba = _decay("mamba")
  n = mamba.A_log[...].shape[-1]
  np.testing.assert_array_equal(mamba.A_log[...][0], np.log(np.arange(1, n + 1, dtype=np.float32)))
  for name in ("mamba2", "gated_deltanet", "kda", "gated_deltaproduct", "loglinear_mamba2"):
    a = np.exp(_decay(name).A_log[...])
    assert a.min() >= 1.0 and a.max() <= 16.0, name
    # Passing the documented defaults changes nothing (existing results stay valid).
    explicit = _decay(name, a_init_range=(1.0, 16.0), dt_min=1e-3, dt_max=1e-1,
                      dt_init_floor=1e-4)
    np.testing.assert_array_equal(explicit.A_log[...], _decay(name).A_log[...])
    np.testing.assert_array_equal(explicit.dt_bias[...], _decay(name).dt_bias[...])


def test_decay_init_options_move_the_start():
  mamba = _decay("mamba", a_init_scale=1 / 32, dt_min=0.01, dt_max=0.02)
  n = mamba.A_log[...].shape[-1]
  np.testing.assert_allclose(np.exp(mamba.A_log[...])[0], np.arange(1, n + 1) / 32, rtol=1e-6)
  dt = jax.nn.softplus(mamba.dt_bias[...])
  assert float(dt.min()) >= 0.01 * (1 - 1e-4) and float(dt.max()) <= 0.02 * (1 + 1e-4)
  for name in ("mamba2", "gated_deltanet", "kda"):
    a = np.exp(_decay(name, a_init_range=(0.03, 0.5)).A_log[...])
    assert a.min() >= 0.03 * (1 - 1e-6) and a.max() <= 0.5 * (1 + 1e-6), name
  hawk = _decay("hawk", min_rad=0.99, max_rad=0.9999)
  a = jax.nn.sigmoid(hawk.log_lambda[...]) ** hawk.c
  assert float(a.min()) >= 0.99 - 1e-6 and float(a.max()) <= 0.9999 + 1e-6


@pytest.mark.parametrize("name,kw,match", [
    ("mamba", dict(a_init_scale=0.0), "a_init_scale"),
    ("mamba", dict(dt_min=0.2, dt_max=0.1), "dt_min"),
    ("mamba2", dict(a_init_range=(2.0, 1.0)), "a_init_range"),
    ("mamba2", dict(a_init_range=(0.0, 1.0)), "a_init_range"),
    ("gated_deltanet", dict(dt_init_floor=-1.0), "dt_init_floor"),
    ("kda", dict(a_init_range=1.0), "a_init_range"),
    ("hawk", dict(min_rad=0.9, max_rad=1.0), "max_rad"),
    ("hawk", dict(min_rad=0.0), "min_rad"),
])
def test_decay_init_rejects_bad_values(name, kw, match):
  with pytest.raises(ValueError, match=match):
    _decay(name, **kw)


def test_mamba2_ablation_options():
  x = inputs()
  base = _decay("mamba2")
  for kw in (dict(norm=False), dict(bc_activation=False)):
    layer = _decay("mamba2", **kw)
    y = layer(x)
    assert y.shape == x.shape and bool(jnp.all(jnp.isfinite(y)))
    assert not np.allclose(y, base(x)), kw
    # The decode step agrees with the parallel form under the option too.
    cache = layer.init_cache(B, T)
    steps = []
    for t in range(T):
      o, cache = layer.decode_step(x[:, t], cache)
      steps.append(o)
    np.testing.assert_allclose(jnp.stack(steps, 1), y, rtol=2e-4, atol=2e-5)
