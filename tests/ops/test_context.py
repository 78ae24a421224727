"""``context=``: what the conformance suite's context check does not cover.

``test_conformance.py`` checks every op that declares ``context`` forms against the
unsharded op on 4 fake CPU devices. The cases here are the edges: gates strong enough to
underflow, the stateless and bidirectional feature maps, reversed and grouped scans,
bidirectional S4D, a convolution halo and an attention window as long as a slice, softmax
in bfloat16 and without a mask, log-linear attention's aligned path, the ops inside the
caller's own ``shard_map``, a concrete mesh without ``jax.set_mesh``, the per-device memory
of the selective scan, and the errors. Each compares the op with a :class:`SeqContext`
against the same op without one (values and gradients, ``rtol = atol = 2e-4``). The
``case_*`` functions run in the conformance suite's 4-device subprocess
(``test_conformance.context_cases``); the checks that need one device run here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, NamedSharding
from jax.sharding import PartitionSpec as P

from linear_attention import ops
from linear_attention.engines.context import SeqContext
from tests.helpers import assert_tree_close, keys, rand, value_and_grads
from tests.ops import multidevice

B, T, H, K, V = 2, 32, 2, 4, 3  # 8 tokens per device on 4 devices, 16 on 2
CHUNK = 4
TOL = dict(rtol=2e-4, atol=2e-4)
# Boundaries inside slices (row 0) and exactly on the device edges 8 and 16 (row 1).
SEG = np.array([[0] * 5 + [1] * 10 + [2] * 17, [3] * 8 + [5] * 8 + [6] * 16], np.int32)
MESHES = {"seq4": ((4,), ("seq",), None), "data2_seq2": ((2, 2), ("data", "seq"), "data")}


def _unit(x):
  return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def _compare(op, args, *, seg=True, state=True, meshes=("seq4",), **kw):
  """``op(*args, context=...)`` against ``op(*args)``: values and gradients.

  ``op`` takes ``segment_ids`` and ``return_state`` unless ``seg`` / ``state`` say not.
  ``meshes``: keys of ``MESHES``.
  """
  extra = dict(kw)
  if seg:
    extra["segment_ids"] = jnp.asarray(SEG)
  if state:
    extra["return_state"] = True
  want = value_and_grads(lambda *a: op(*a, **extra), args)
  for name in meshes:
    shape, names, batch_axis = MESHES[name]
    mesh = jax.make_mesh(shape, names)
    ctx = SeqContext(mesh, "seq", batch_axis)
    with jax.set_mesh(mesh):
      got = value_and_grads(lambda *a: op(*a, context=ctx, **extra), args)
    o = jax.tree_util.tree_leaves(got[0])[0]
    assert o.sharding.spec[1] == "seq", o.sharding
    assert_tree_close(got, want, err_msg=f"mesh {shape}", **TOL)


BOTH = ("seq4", "data2_seq2")


def _qkv(seed):
  kq, kk, kv = keys(seed, 3)
  return rand(kq, (B, T, H, K)), _unit(rand(kk, (B, T, H, K))), rand(kv, (B, T, H, V))


def _s0(seed):
  return rand(keys(seed, 1)[0], (B, H, K, V))


def _gate(seed, shape, strength=1.0):
  return -strength * jax.random.uniform(keys(seed, 1)[0], shape)


def _beta(seed, shape):
  return jax.random.uniform(keys(seed, 1)[0], shape, minval=0.1, maxval=1.9)


def _auto_meshes():
  """SeqContexts on Auto-axes meshes ``(4,)`` and ``(2, 2)`` (the batch over "data")."""
  auto = jax.sharding.AxisType.Auto
  return {"seq4": SeqContext(jax.make_mesh((4,), ("seq",), axis_types=(auto,))),
          "data2_seq2": SeqContext(jax.make_mesh((2, 2), ("data", "seq"), axis_types=(auto,) * 2),
                                   batch_axis="data")}


# ------------------------------------------------------------------- strong gates


def case_strong_gates():
  """Gates down to -20 per step (per channel in the decay engine, per head in the delta
  rule): exact underflow, no NaN or Inf in values or gradients."""
  q, k, v = _qkv(0)
  s0 = _s0(3)
  _compare(lambda q, k, v, g, s0, **kw: ops.decay_linear_attention(
      q, k, v, g, chunk_size=CHUNK, initial_state=s0, **kw),
      (q, k, v, _gate(2, (B, T, H, K), strength=20.0), s0))
  beta = _beta(21, (B, T, H))
  g = _gate(23, (B, T, H))
  _compare(lambda q, k, v, beta, g, **kw: ops.delta_rule(
      q, k, v, beta, g, chunk_size=CHUNK, **kw), (q, k, v, beta, 20.0 * g))


def case_grouped_value_heads():
  """Grouped value heads (q, k with one head, v, beta, gates and state with H = 2): the
  delta rule and KDA (through the DPLR engine) with segments, state and gradients."""
  q, k, v = _qkv(60)
  q, k = q[:, :, :1], k[:, :, :1]
  beta, s0 = _beta(61, (B, T, H)), _s0(62)
  _compare(lambda q, k, v, beta, g, s0, **kw: ops.gated_deltanet(
      q, k, v, beta, g, chunk_size=CHUNK, initial_state=s0, **kw),
      (q, k, v, beta, _gate(63, (B, T, H)), s0))
  _compare(lambda q, k, v, beta, g, s0, **kw: ops.kda(
      q, k, v, beta, g, chunk_size=CHUNK, initial_state=s0, **kw),
      (q, k, v, beta, _gate(64, (B, T, H, K)), s0))


def case_feature_maps():
  """The positive map's running key shift (stateless, normalised) and the bidirectional
  form (a reversed engine pass on the flipped global arrays)."""
  q, k, v = _qkv(10)
  _compare(lambda q, k, v, **kw: ops.linear_attention(
      q, k, v, feature_map="favor+", key=jax.random.PRNGKey(0), chunk_size=CHUNK, **kw),
      (q, k, v), state=False)
  _compare(lambda q, k, v, **kw: ops.linear_attention(
      q, k, v, feature_map="elu", causal=False, chunk_size=CHUNK, **kw), (q, k, v),
      state=False)


# ------------------------------------------------------------------ the scan engine


def case_linear_scan_reverse():
  ka, kb, kh = keys(38, 3)
  a = jax.random.uniform(ka, (B, T, 3, 2), minval=-1.0, maxval=1.0)
  bb = rand(kb, (B, T, 3, 2))
  h0 = rand(kh, (B, 3, 2))
  _compare(lambda a, b, h0, **kw: ops.linear_scan(a, b, h0=h0, form="recurrent", reverse=True,
                                                  **kw), (a, bb, h0))


def case_outside_set_mesh():
  """A concrete mesh needs no ``jax.set_mesh`` around the call (the README's example):
  Gated DeltaNet's output, state and gradients on an explicit-axes mesh, eager."""
  q, k, v = _qkv(41)
  beta = jax.nn.sigmoid(rand(keys(42, 1)[0], (B, T, H)))
  g = -jax.nn.softplus(rand(keys(43, 1)[0], (B, T, H)))
  ctx = SeqContext(jax.make_mesh((4,), ("seq",)))
  fn = lambda q, k, v, **kw: ops.gated_deltanet(q, k, v, beta, g, chunk_size=CHUNK,
                                               return_state=True, **kw)
  assert_tree_close(value_and_grads(lambda *a: fn(*a, context=ctx), (q, k, v)),
                    value_and_grads(fn, (q, k, v)), **TOL)


def case_s4d_bidirectional():
  d, n = 3, 4
  a_re, a_im = ops.s4d_init("lin", n, d)
  kb, ku = keys(40, 2)
  bp = rand(kb, (d, n))
  log_dt = jnp.log(0.1) * jnp.ones(d)
  u = rand(ku, (B, T, d))
  c2 = rand(keys(42, 1)[0], (2, d, n))
  _compare(lambda u, a_re, c2, **kw: ops.s4d(u, a_re, a_im, bp, c2, log_dt, bidirectional=True,
                                             chunk_size=CHUNK, **kw), (u, a_re, c2),
           state=False)


def case_selective_scan_groups_and_reset():
  d, n = 4, 3
  kx, kdt, ka, kb, kc, kz, kh = keys(43, 7)
  x, dt = rand(kx, (B, T, d)), rand(kdt, (B, T, d))
  a = -jnp.exp(rand(ka, (d, n)))
  h0 = rand(kh, (B, d, n))
  # Grouped B, C (two groups of two channels) and an A = -inf channel (a hard reset at
  # every step) through the recurrent form's own fold.
  a = a.at[1, 2].set(-jnp.inf)
  bg, cg = rand(kb, (B, T, 2, n)), rand(kc, (B, T, 2, n))
  _compare(lambda x, dt, bg, cg, h0, **kw: ops.selective_scan(
      x, dt, a, bg, cg, None, None, form="recurrent", chunk_size=CHUNK, initial_state=h0, **kw),
      (x, dt, bg, cg, h0))


def case_selective_scan_memory():
  """The recurrent form keeps ``[B, D, N]`` states with a context too: per device, the
  compiled forward + backward plan (temporaries + arguments) on 4 devices is 0.59x the
  unsharded one at this size (0.41x at T = 4096, D = 64); it was 5.8x when the context
  ran the scan engine on ``[B, T / 4, D, N]`` inputs."""
  t, d, n = 1024, 32, 16
  kx, kdt, ka, kb, kc = keys(50, 5)
  args = (rand(kx, (B, t, d)), rand(kdt, (B, t, d)), -jnp.exp(rand(ka, (d, n))),
          rand(kb, (B, t, n)), rand(kc, (B, t, n)))

  def plan(ctx):
    loss = lambda *a: jnp.sum(ops.selective_scan(*a, form="recurrent", context=ctx) ** 2)
    m = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4))).lower(*args).compile()
    m = m.memory_analysis()
    return m.temp_size_in_bytes + m.argument_size_in_bytes

  mesh = jax.make_mesh((4,), ("seq",))
  with jax.set_mesh(mesh):
    sharded = plan(SeqContext(mesh))
  ratio = sharded / plan(None)
  assert ratio < 0.75, f"per-device memory {ratio:.2f}x the unsharded plan"


# ------------------------------------------------------- halos and gathered attention


def _randn(seed, *shapes, dtype=jnp.float32):
  keys = jax.random.split(jax.random.PRNGKey(seed), len(shapes))
  return [jax.random.normal(k, s, dtype) for k, s in zip(keys, shapes)]


def _check(fn, args, *, tol=TOL, name=""):
  """``fn(*args, context=ctx)`` against ``fn(*args)``: every output (``fn`` returns a list,
  one entry per variant, so that a case compiles once per mesh) and every argument's
  gradient, jitted, on each mesh (the sharded call traced under ``jax.set_mesh``)."""

  def both(context):
    f = lambda *a: fn(*a, context=context)
    shapes = jax.eval_shape(f, *args)
    # Fixed random cotangents, so that no gradient is a plain sum.
    ws = [jax.random.normal(jax.random.PRNGKey(9 + i), s.shape) for i, s in enumerate(shapes)]
    loss = lambda *a: sum(jnp.sum(o.astype(jnp.float32) * w) for o, w in zip(f(*a), ws))
    return jax.jit(lambda *a: (f(*a), jax.grad(loss, argnums=tuple(range(len(a))))(*a)))

  want = both(None)(*args)
  for mesh_name, ctx in _auto_meshes().items():
    with jax.set_mesh(ctx.mesh):
      got = both(ctx)(*args)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
      np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                 err_msg=f"{name} {mesh_name} {jax.tree_util.keystr(path)}",
                                 **tol)


def case_halo_as_long_as_a_slice():
  """A convolution of width 6 and a window of 6: the halo is the whole previous slice
  (5 tokens a device); the window also without the causal mask."""
  t = 20
  seg = jnp.asarray(np.array([[0] * 3 + [1] * 9 + [2] * 8, [5] * 10 + [6] * 5 + [5] * 5],
                             np.int32))
  x, w6 = _randn(1, (B, t, 6), (6, 6))
  q, k, v = _randn(5, (B, t, 2, 4), (B, t, 2, 4), (B, t, 2, 3))

  def fn(x, w6, q, k, v, context):
    return [ops.causal_conv1d(x, w6, segment_ids=seg, context=context)] + [
        ops.sliding_window_attention(q, k, v, window=6, causal=causal, segment_ids=s,
                                     block_size=4, context=context)
        for causal in (True, False) for s in (None, seg)]

  _check(fn, (x, w6, q, k, v), name="halo")


def case_softmax_unmasked_and_bfloat16():
  """Softmax attention without the causal mask (both algorithms), and in bfloat16
  (``2e-2`` against the unsharded bfloat16 call: one bfloat16 rounding apart)."""
  q, k, v = _randn(2, (B, T, 2, 4), (B, T, 2, 4), (B, T, 2, 3))
  seg = jnp.asarray(SEG)
  _check(lambda q, k, v, context: [
      ops.softmax_attention(q, k, v, causal=False, segment_ids=s, algorithm=algorithm,
                            block_size=4, context=context)
      for algorithm in ("naive", "blockwise") for s in (None, seg)], (q, k, v), name="softmax")
  qb, kb, vb = _randn(3, (B, T, 2, 4), (B, T, 2, 4), (B, T, 2, 4), dtype=jnp.bfloat16)
  _check(lambda q, k, v, context: [ops.softmax_attention(
      q, k, v, causal=True, segment_ids=seg, context=context)],
         (qb, kb, vb), tol=dict(rtol=2e-2, atol=2e-2), name="softmax bf16")


def case_loglinear_aligned():
  """No segments, no initial state, 8 tokens a device: log-linear attention's aligned
  Fenwick form per slice, with every level distinct (L = 6 = log2(32) + 1)."""
  kq, kk, kv, kg, kl = keys(60, 5)
  args = (rand(kq, (B, T, H, K)), rand(kk, (B, T, H, K)), rand(kv, (B, T, H, V)),
          -jax.random.uniform(kg, (B, T, H)), jax.nn.softplus(rand(kl, (B, T, H, 6))))

  def op(q, k, v, g, lam, **kw):
    o, (s, pos) = ops.loglinear_decay_attention(q, k, v, g, lam, chunk_size=CHUNK,
                                                return_state=True, **kw)
    return o, s, pos

  _compare(op, args, seg=False, state=False, meshes=BOTH)


# ---------------------------------------------- inside the caller's own shard_map


def case_local_slices():
  """The same context inside a user ``shard_map`` over ``"seq"``: the ops see local slices."""
  mesh = jax.make_mesh((4,), ("seq",))
  spec = P(None, "seq")
  q, k, v = _qkv(44)
  beta, g, s0 = _beta(45, (B, T, H)), _gate(46, (B, T, H)), _s0(47)
  seg = jnp.asarray(SEG)

  def sharded(q, k, v, beta, g, s0):
    def body(q, k, v, beta, g, s0, seg):
      ctx = SeqContext(jax.sharding.get_abstract_mesh(), "seq")
      o1, s1 = ops.gated_deltanet(q, k, v, beta, g, chunk_size=CHUNK, initial_state=s0,
                                  return_state=True, segment_ids=seg, context=ctx)
      o2, s2 = ops.gla(q, k, v, jnp.broadcast_to(g[..., None], q.shape), chunk_size=CHUNK,
                       initial_state=s0, return_state=True, segment_ids=seg, context=ctx)
      h, s3 = ops.linear_scan(jnp.exp(g), q[..., 0], h0=s0[..., 0, 0], return_state=True,
                              segment_ids=seg, context=ctx)
      return o1, s1, o2, s2, h, s3
    put = lambda x, s: jax.device_put(x, NamedSharding(mesh, s))
    return jax.shard_map(body, mesh=mesh, in_specs=(spec,) * 5 + (P(), spec),
                         out_specs=(spec, P(), spec, P(), spec, P()))(
                             *(put(x, spec) for x in (q, k, v, beta, g)), put(s0, P()),
                             put(seg, spec))

  def ref(q, k, v, beta, g, s0):
    kw = dict(chunk_size=CHUNK, initial_state=s0, return_state=True, segment_ids=seg)
    o1, s1 = ops.gated_deltanet(q, k, v, beta, g, **kw)
    o2, s2 = ops.gla(q, k, v, jnp.broadcast_to(g[..., None], q.shape), **kw)
    h, s3 = ops.linear_scan(jnp.exp(g), q[..., 0], h0=s0[..., 0, 0], return_state=True,
                            segment_ids=seg)
    return o1, s1, o2, s2, h, s3

  args = (q, k, v, beta, g, s0)
  with jax.set_mesh(mesh):
    assert_tree_close(value_and_grads(sharded, args), value_and_grads(ref, args), **TOL)


def case_mixers_inside_user_shard_map():
  """Inside the caller's own ``shard_map`` the ops run their per-device bodies directly."""
  ctx = _auto_meshes()["seq4"]
  x, w = _randn(6, (B, T, 4), (3, 4))
  q, k, v = _randn(7, (B, T, 2, 4), (B, T, 2, 4), (B, T, 2, 4))
  spec = jax.sharding.PartitionSpec(None, "seq")

  def local(x, w, q, k, v):
    return (ops.causal_conv1d(x, w, context=ctx),
            ops.softmax_attention(q, k, v, causal=True, context=ctx),
            ops.sliding_window_attention(q, k, v, window=3, context=ctx))

  f = jax.shard_map(local, mesh=ctx.mesh, in_specs=(spec, jax.sharding.PartitionSpec(), spec,
                                                    spec, spec), out_specs=(spec,) * 3)
  with jax.set_mesh(ctx.mesh):
    got = jax.jit(f)(x, w, q, k, v)
  want = (ops.causal_conv1d(x, w), ops.softmax_attention(q, k, v, causal=True),
          ops.sliding_window_attention(q, k, v, window=3))
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, **TOL)


def case_errors():
  """A sequence the mesh axis does not divide: a ValueError naming ``context``."""
  ctx = SeqContext(jax.make_mesh((4,), ("seq",)), "seq")
  q, k, v = (x[:, :30] for x in _qkv(48))
  beta = _beta(49, (B, 30, H))
  for call in (lambda: ops.gated_deltanet(q, k, v, beta, beta * 0, context=ctx),
               lambda: ops.gla(q, k, v, -beta[..., None] * jnp.ones(K), context=ctx),
               lambda: ops.linear_scan(q, k, context=ctx),
               lambda: ops.kda(q, k, v, beta, -jnp.ones_like(q), context=ctx)):
    try:
      call()
    except ValueError as e:
      assert str(e).startswith("context:") and "T = 30" in str(e), e
    else:
      raise AssertionError("no ValueError for T = 30 on 4 devices")


def case_mixer_errors():
  ctx = _auto_meshes()["seq4"]
  x, w = _randn(8, (B, 8, 4), (4, 4))  # 2 tokens a device
  q = jnp.ones((B, 8, 1, 4))
  for fn, match in (
      (lambda: ops.causal_conv1d(x, w, context=ctx),
       "short convolution of width 4 needs at least 3 tokens per device"),
      (lambda: ops.sliding_window_attention(q, q, q, window=4, context=ctx),
       "sliding window of 4 needs at least 3 tokens per device"),
      (lambda: ops.softmax_attention(q[:, :6], q[:, :6], q[:, :6], context=ctx),
       "T = 6 must be divisible by the size of mesh axis 'seq' \\(4\\)"),
      (lambda: ops.softmax_attention(q, q, q, implementation="pallas", context=ctx),
       "implementation='pallas' does not run with context="),
      (lambda: ops.forgetting_attention(q, q, q, jnp.zeros((B, 8, 1)), context="seq"),
       "context must be None or a linear_attention.ops.context.SeqContext")):
    with pytest.raises(ValueError, match=match):
      with jax.set_mesh(ctx.mesh):
        fn()


CASES = multidevice.cases(globals())


# ------------------------------------------------------- in-process (one device)


def test_context_is_hashable_and_checked():
  mesh = jax.make_mesh((1,), ("seq",))
  assert hash(SeqContext(mesh)) == hash(SeqContext(mesh, "seq", None))
  assert SeqContext(mesh, batch_axis=[]) == SeqContext(mesh, batch_axis=())
  with pytest.raises(ValueError, match=r"context.axis_name must be one of the mesh axes \['seq'\], "
                                       r"got 'time'"):
    SeqContext(mesh, "time")
  with pytest.raises(ValueError, match="context.mesh must be a jax.sharding.Mesh"):
    SeqContext("seq")
  with pytest.raises(ValueError, match="context.batch_axis must name mesh axes other than"):
    SeqContext(mesh, "seq", "seq")


def test_bad_context_argument():
  q, k, v = _qkv(50)
  with pytest.raises(ValueError, match="context must be None or a .*SeqContext, got str"):
    ops.gla(q, k, v, _gate(51, (B, T, H, K)), context="seq")
  with pytest.raises(ValueError, match="context must be None or a .*SeqContext, got Mesh"):
    ops.deltanet(q, k, v, _beta(52, (B, T, H)), context=jax.make_mesh((1,), ("seq",)))


def test_indivisible_lengths_on_an_abstract_mesh():
  """The size checks need no devices: an abstract mesh of 4 along "seq", 2 along "data"."""
  ctx = SeqContext(AbstractMesh((2, 4), ("data", "seq")), "seq", "data")
  q, k, v = _qkv(53)
  with pytest.raises(ValueError, match=r"context: the sequence length T = 30 must be divisible "
                                       r"by the size of mesh axis 'seq' \(4\)"):
    ops.dplr_attention(q[:, :30], k[:, :30], v[:, :30], q[:, :30], k[:, :30], context=ctx)
  with pytest.raises(ValueError, match=r"context: the batch size B = 1 must be divisible by the "
                                       r"size of batch_axis 'data' \(2\)"):
    ops.rg_lru(q[:1, :, 0], q[:1, :, 0], q[:1, :, 0], q[0, 0, 0], context=ctx)


def test_one_device_mesh_matches():
  """A mesh of one device runs the same code path in this process."""
  mesh = jax.make_mesh((1,), ("seq",))
  q, k, v = _qkv(54)
  beta, g, s0 = _beta(55, (B, T, H)), _gate(56, (B, T, H)), _s0(57)
  fn = lambda ctx: (lambda q, k, v, beta, g, s0: ops.gated_deltanet(
      q, k, v, beta, g, chunk_size=CHUNK, initial_state=s0, return_state=True,
      segment_ids=jnp.asarray(SEG), context=ctx))
  args = (q, k, v, beta, g, s0)
  with jax.set_mesh(mesh):
    assert_tree_close(value_and_grads(fn(SeqContext(mesh)), args),
                      value_and_grads(fn(None), args), **TOL)


def test_local_only_refusals():
  """Variants that mix tokens outside their engine refuse local slices, naming ``context``."""
  mesh = jax.make_mesh((1,), ("seq",))
  spec = P(None, "seq")
  q, k, v = (jax.device_put(x, NamedSharding(mesh, spec)) for x in _qkv(58))

  def body(q, k, v):
    ctx = SeqContext(jax.sharding.get_abstract_mesh(), "seq")
    return ops.rwkv6(q, k, v, -jnp.ones_like(k), jnp.ones((H, K)), context=ctx)

  with pytest.raises(ValueError, match="context: rwkv6 shifts k, v and log_w"):
    jax.shard_map(body, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec)(q, k, v)
  with pytest.raises(ValueError, match="context: reverse=True needs the global arrays"):
    jax.shard_map(
        lambda a: ops.linear_scan(a, a, reverse=True, context=SeqContext(
            jax.sharding.get_abstract_mesh(), "seq")),
        mesh=mesh, in_specs=spec, out_specs=spec)(q)


def test_one_device_context_is_the_op():
  """A context over a 1-device axis runs the same bodies (halo of zeros, a gather of one)."""
  ctx = SeqContext(jax.make_mesh((1,), ("seq",)))
  x, w = _randn(10, (B, T, 4), (3, 4))
  q, k, v = _randn(11, (B, T, 2, 4), (B, T, 2, 4), (B, T, 2, 4))
  seg = jnp.asarray(SEG)
  np.testing.assert_allclose(ops.causal_conv1d(x, w, segment_ids=seg, context=ctx),
                             ops.causal_conv1d(x, w, segment_ids=seg), **TOL)
  np.testing.assert_allclose(
      ops.softmax_attention(q, k, v, causal=True, segment_ids=seg, context=ctx),
      ops.softmax_attention(q, k, v, causal=True, segment_ids=seg), **TOL)
  np.testing.assert_allclose(
      ops.sliding_window_attention(q, k, v, window=4, causal=False, segment_ids=seg,
                                   context=ctx),
      ops.sliding_window_attention(q, k, v, window=4, causal=False, segment_ids=seg), **TOL)
