"""``context=``: every engine and variant with the sequence split over fake CPU devices.

Each case compares an op called with a :class:`SeqContext` against the same op
without one: the output, the final state and the gradients of every floating
input (the initial state's included), rtol 2e-4, on meshes ``(4,)`` (``"seq"``)
and ``(2, 2)`` (``"data"`` x ``"seq"``, the batch split too), with packed
segments whose boundaries fall inside slices and on the device edges. The
multi-device cases run in one subprocess with 4 fake CPU devices
(:mod:`tests.ops.multidevice`); argument checks run here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, NamedSharding
from jax.sharding import PartitionSpec as P

from linear_attention import ops
from linear_attention.ops import scan as scan_ops
from linear_attention.engines.context import SeqContext
from tests.helpers import assert_tree_close, keys, rand, value_and_grads
from tests.ops import multidevice

B, T, H, K, V = 2, 32, 2, 4, 3  # 8 tokens per device on 4 devices, 16 on 2
CHUNK = 4
TOL = dict(rtol=2e-4, atol=2e-4)
# Boundaries inside slices (row 0) and exactly on the device edges 8 and 16 (row 1).
SEG = np.array([[0] * 5 + [1] * 10 + [2] * 17, [3] * 8 + [5] * 8 + [6] * 16], np.int32)
MESHES = {"seq4": ((4,), ("seq",), None), "data2_seq2": ((2, 2), ("data", "seq"), "data"),
          # Auto axes, as the trainer's mesh: XLA's partitioner then places the ops around
          # the context's shard_map itself (a segment start on a device edge was once lost).
          "seq4_auto": ((4,), ("seq",), None)}


def _unit(x):
  return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def _compare(op, args, *, seg=True, state=True, meshes=("seq4",), **kw):
  """``op(*args, context=...)`` against ``op(*args)``: values and gradients.

  ``op`` takes ``segment_ids`` and ``return_state`` unless ``seg`` / ``state`` say not.
  ``meshes``: keys of ``MESHES``; each engine runs one variant on both (compiling is
  what these tests spend their time on).
  """
  extra = dict(kw)
  if seg:
    extra["segment_ids"] = jnp.asarray(SEG)
  if state:
    extra["return_state"] = True
  want = value_and_grads(lambda *a: op(*a, **extra), args)
  for name in meshes:
    shape, names, batch_axis = MESHES[name]
    types = (jax.sharding.AxisType.Auto,) * len(names) if name.endswith("_auto") else None
    mesh = jax.make_mesh(shape, names, axis_types=types)
    ctx = SeqContext(mesh, "seq", batch_axis)
    with jax.set_mesh(mesh):
      got = value_and_grads(lambda *a: op(*a, context=ctx, **extra), args)
    o = jax.tree_util.tree_leaves(got[0])[0]
    assert o.sharding.spec[1] == "seq", o.sharding
    assert_tree_close(got, want, err_msg=f"mesh {shape}", **TOL)


BOTH = ("seq4", "data2_seq2")


def _qkv(seed, r=None):
  kq, kk, kv = keys(seed, 3)
  extra = () if r is None else (r,)
  return (rand(kq, (B, T, H, K)), _unit(rand(kk, (B, T, H) + extra + (K,))),
          rand(kv, (B, T, H) + extra + (V,)))


def _s0(seed, k=K, v=V):
  return rand(keys(seed, 1)[0], (B, H, k, v))


def _gate(seed, shape, strength=1.0):
  return -strength * jax.random.uniform(keys(seed, 1)[0], shape)


def _beta(seed, shape):
  return jax.random.uniform(keys(seed, 1)[0], shape, minval=0.1, maxval=1.9)


# --------------------------------------------------------------- the decay engine


def case_decay_engine():
  q, k, v = _qkv(0)
  s0 = _s0(3)
  _compare(lambda q, k, v, s0, **kw: ops.decay_linear_attention(
      q, k, v, None, chunk_size=CHUNK, initial_state=s0, **kw), (q, k, v, s0))
  # A per-channel gate down to -20 per step: exact underflow, no NaN or Inf.
  _compare(lambda q, k, v, g, s0, **kw: ops.decay_linear_attention(
      q, k, v, g, chunk_size=CHUNK, initial_state=s0, **kw),
      (q, k, v, _gate(2, (B, T, H, K), strength=20.0), s0), meshes=BOTH)


def case_gated_variants():
  q, k, v = _qkv(4)
  s0 = _s0(5)
  g = _gate(6, (B, T, H, K))
  _compare(lambda q, k, v, g, s0, **kw: ops.gla(q, k, v, g, chunk_size=CHUNK, initial_state=s0,
                                                 **kw), (q, k, v, g, s0))
  _compare(lambda q, k, v, s0, **kw: ops.retention(q, k, v, chunk_size=CHUNK, initial_state=s0,
                                                    **kw), (q, k, v, s0))
  _compare(lambda q, g, v, s0, **kw: ops.hgrn2(q, g, v, chunk_size=CHUNK, initial_state=s0,
                                                **kw), (q, g, v, s0))
  u = rand(keys(7, 1)[0], (H, K))
  _compare(lambda q, k, v, g, u, s0, **kw: ops.rwkv6(q, k, v, g, u, chunk_size=CHUNK,
                                                      initial_state=s0, **kw),
           (q, k, v, g, u, s0))


def case_ssd():
  kx, kdt, ka, kb, kc, kd = keys(8, 6)
  x = rand(kx, (B, T, 4, 3))
  dt = rand(kdt, (B, T, 4))
  a = -jnp.exp(rand(ka, (4,)))
  bb, cc = rand(kb, (B, T, 2, 5)), rand(kc, (B, T, 2, 5))
  d = rand(kd, (4,))
  s0 = rand(keys(9, 1)[0], (B, 4, 5, 3))
  _compare(lambda x, dt, a, bb, cc, d, s0, **kw: ops.ssd(
      x, dt, a, bb, cc, d, dt_bias=jnp.ones(4), dt_softplus=True, chunk_size=CHUNK,
      initial_state=s0, **kw), (x, dt, a, bb, cc, d, s0))


def case_linear_and_rebased():
  q, k, v = _qkv(10)
  s0 = _s0(11, v=V + 1)
  _compare(lambda q, k, v, s0, **kw: ops.linear_attention(
      q, k, v, feature_map="elu", chunk_size=CHUNK, initial_state=s0, **kw), (q, k, v, s0))
  # Stateless and normalised: the positive map's running key shift on the global arrays.
  _compare(lambda q, k, v, **kw: ops.linear_attention(
      q, k, v, feature_map="favor+", key=jax.random.PRNGKey(0), chunk_size=CHUNK, **kw),
      (q, k, v), state=False)
  # Bidirectional with segments: a reversed engine pass on the flipped global arrays.
  _compare(lambda q, k, v, **kw: ops.linear_attention(
      q, k, v, feature_map="elu", causal=False, chunk_size=CHUNK, **kw), (q, k, v),
      state=False)
  gamma, beta = 1.0 + 0.1 * rand(keys(12, 1)[0], (K,)), 0.1 * rand(keys(13, 1)[0], (K,))
  _compare(lambda q, k, v, gamma, beta, **kw: ops.rebased_attention(
      q, k, v, gamma, beta, chunk_size=CHUNK, **kw), (q, k, v, gamma, beta))


def case_mlstm():
  q, k, v = _qkv(14)
  ig, fg = rand(keys(15, 1)[0], (B, T, H)), 2.0 + rand(keys(16, 1)[0], (B, T, H))
  s0 = (_s0(17), rand(keys(18, 1)[0], (B, H, K)), rand(keys(19, 1)[0], (B, H)))
  _compare(lambda q, k, v, ig, fg, s0, **kw: ops.mlstm(
      q, k, v, ig, fg, chunk_size=CHUNK, initial_state=s0, **kw), (q, k, v, ig, fg, s0))


# ----------------------------------------------------------- the delta-rule engine


def case_delta_rule():
  q, k, v = _qkv(20)
  beta = _beta(21, (B, T, H))
  s0 = _s0(22)
  g = _gate(23, (B, T, H))
  _compare(lambda q, k, v, beta, s0, **kw: ops.deltanet(
      q, k, v, beta, form="recurrent", initial_state=s0, **kw), (q, k, v, beta, s0))
  _compare(lambda q, k, v, beta, g, s0, **kw: ops.gated_deltanet(
      q, k, v, beta, g, chunk_size=CHUNK, initial_state=s0, normalize_qk=True, **kw),
      (q, k, v, beta, g, s0), meshes=BOTH)
  # Strong gates (down to -20 per step): exact underflow, no NaN in values or gradients.
  _compare(lambda q, k, v, beta, g, **kw: ops.delta_rule(
      q, k, v, beta, g, chunk_size=CHUNK, **kw), (q, k, v, beta, 20.0 * g))


# ------------------------------------------------------------------ the DPLR engine


def case_dplr():
  q, k, v = _qkv(24)
  s0 = _s0(25)
  a = -0.5 * _unit(rand(keys(26, 1)[0], (B, T, H, K)))
  b = _unit(rand(keys(27, 1)[0], (B, T, H, K)))
  g = _gate(28, (B, T, H, K))
  _compare(lambda q, k, v, a, b, g, s0, **kw: ops.dplr_attention(
      q, k, v, a, b, g, form="recurrent", initial_state=s0, **kw), (q, k, v, a, b, g, s0))


def case_kda_rwkv7_deltaproduct():
  q, k, v = _qkv(29)
  s0 = _s0(30)
  beta = _beta(31, (B, T, H))
  g = _gate(32, (B, T, H, K))
  _compare(lambda q, k, v, beta, g, s0, **kw: ops.kda(
      q, k, v, beta, g, form="chunk", chunk_size=CHUNK, initial_state=s0, **kw),
      (q, k, v, beta, g, s0), meshes=BOTH)
  kappa = _unit(rand(keys(33, 1)[0], (B, T, H, K)))
  iclr = jax.nn.sigmoid(rand(keys(34, 1)[0], (B, T, H, K)))
  bonus = rand(keys(35, 1)[0], (H, K))
  _compare(lambda r, k, v, g, kappa, iclr, bonus, s0, **kw: ops.rwkv7(
      r, k, v, g, kappa, iclr, bonus=bonus, form="recurrent", initial_state=s0, **kw),
      (q, k, v, g, kappa, iclr, bonus, s0))
  _, k2, v2 = _qkv(36, r=2)
  beta2 = _beta(37, (B, T, H, 2))
  _compare(lambda q, k, v, beta, g, s0, **kw: ops.gated_deltaproduct(
      q, k, v, beta, g, form="recurrent", initial_state=s0, **kw),
      (q, k2, v2, beta2, g[..., 0], s0))


# ------------------------------------------------------------------ the scan engine


def case_linear_scan():
  ka, kb, kh = keys(38, 3)
  a = jax.random.uniform(ka, (B, T, 3, 2), minval=-1.0, maxval=1.0)
  bb = rand(kb, (B, T, 3, 2))
  h0 = rand(kh, (B, 3, 2))
  _compare(lambda a, b, h0, **kw: ops.linear_scan(a, b, h0=h0, chunk_size=CHUNK, **kw),
           (a, bb, h0))
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


def case_rg_lru():
  kx, kr, ki, kl = keys(39, 4)
  x, gr, gi = (rand(kk, (B, T, 6)) for kk in (kx, kr, ki))
  lam = rand(kl, (6,))
  _compare(lambda x, gr, gi, lam, **kw: ops.rg_lru(x, gr, gi, lam, chunk_size=CHUNK, **kw),
           (x, gr, gi, lam), meshes=("seq4", "seq4_auto"))


def case_s4d():
  d, n = 3, 4
  a_re, a_im = ops.s4d_init("lin", n, d)
  kb, kc, ku, kh = keys(40, 4)
  bp, cp = rand(kb, (d, n)), rand(kc, (d, n))
  log_dt = jnp.log(0.1) * jnp.ones(d)
  u = rand(ku, (B, T, d))
  h0 = (rand(kh, (B, d, n)) + 1j * rand(keys(41, 1)[0], (B, d, n))).astype(jnp.complex64)

  def causal(u, a_re, bp, cp, h0_re, h0_im, **kw):
    y, s = ops.s4d(u, a_re, a_im, bp, cp, log_dt, initial_state=h0_re + 1j * h0_im,
                   chunk_size=CHUNK, **kw)
    return y, s.real, s.imag

  _compare(causal, (u, a_re, bp, cp, h0.real, h0.imag))
  c2 = rand(keys(42, 1)[0], (2, d, n))
  _compare(lambda u, a_re, c2, **kw: ops.s4d(u, a_re, a_im, bp, c2, log_dt, bidirectional=True,
                                             chunk_size=CHUNK, **kw), (u, a_re, c2),
           state=False)


def case_selective_scan():
  d, n = 4, 3
  kx, kdt, ka, kb, kc, kz, kh = keys(43, 7)
  x, dt, z = rand(kx, (B, T, d)), rand(kdt, (B, T, d)), rand(kz, (B, T, d))
  a = -jnp.exp(rand(ka, (d, n)))
  bb, cc = rand(kb, (B, T, n)), rand(kc, (B, T, n))
  h0 = rand(kh, (B, d, n))
  for form, meshes in (("recurrent", BOTH), ("chunk", ("seq4",)), ("decay", ("seq4",))):
    _compare(lambda x, dt, a, bb, cc, z, h0, **kw: ops.selective_scan(
        x, dt, a, bb, cc, None, z, form=form, chunk_size=CHUNK, initial_state=h0, **kw),
        (x, dt, a, bb, cc, z, h0), meshes=meshes)
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


CASES = multidevice.cases(globals())


def _run_cases() -> None:
  multidevice.run_cases(CASES)


def test_four_devices():
  """Every case of ``CASES`` on 4 fake CPU devices, in one subprocess."""
  multidevice.check_in_subprocess("tests.ops.test_context", CASES)


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
        lambda a: scan_ops.linear_scan(a, a, reverse=True, context=SeqContext(
            jax.sharding.get_abstract_mesh(), "seq")),
        mesh=mesh, in_specs=spec, out_specs=spec)(q)
