"""The deprecated ``sequence_parallel_*`` wrappers: 4 fake CPU devices against the ops.

The algorithms behind ``context=`` are checked engine by engine in
``tests/ops/test_context.py``; these cases check that the wrappers still take their old
arguments (``mesh``, ``axis_name``, ``batch_axis``, the local body inside a user
``shard_map``) and give the op's result. The multi-device cases run in one subprocess
(:mod:`tests.ops.multidevice`); argument checks and a one-device mesh run here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from linear_attention import ops
from linear_attention.ops import sequence_parallel as sp
from tests.helpers import assert_close, assert_tree_close, grads_of, keys, rand
from tests.ops import multidevice

B, T, H, K, V = 2, 32, 2, 4, 3  # 8 tokens per device on 4 devices
CHUNK = 4
TOL = dict(rtol=2e-4, atol=2e-4)
# Boundaries inside slices (row 0) and exactly on the slice edges 8 and 16 (row 1).
SEG = np.array([[0] * 5 + [1] * 10 + [2] * 17, [3] * 8 + [5] * 8 + [6] * 16], np.int32)


def make(decay, seed=0, strength=1.0, t=T):
  kq, kk, kv, kg, ks = keys(seed, 5)
  q, k = rand(kq, (B, t, H, K)), rand(kk, (B, t, H, K))
  v = rand(kv, (B, t, H, V))
  shape = {"none": None, "scalar": (B, t, H), "vector": (B, t, H, K)}[decay]
  g = None if shape is None else -strength * jax.random.uniform(kg, shape)
  s0 = rand(ks, (B, H, K, V))
  return q, k, v, g, s0


def _compare(decay, *, mesh, seg=None, strengths=(1.0,), with_s0=True, **kw):
  """Outputs, final state and gradients of the sharded op against ``ops`` (chunk form).

  Each side compiles once (value and gradients in one jit) and runs for every
  decay strength.
  """
  seg = None if seg is None else jnp.asarray(seg)

  def ref(q, k, v, g, s0):
    return ops.decay_linear_attention(q, k, v, g, form="chunk", chunk_size=CHUNK,
                                      initial_state=s0, return_state=True, segment_ids=seg)

  def par(q, k, v, g, s0):
    return sp.sequence_parallel_decay_attention(
        q, k, v, g, mesh=mesh, chunk_size=CHUNK, initial_state=s0, return_state=True,
        segment_ids=seg, **kw)

  argnums = (0, 1, 2) + ((3,) if decay != "none" else ()) + ((4,) if with_s0 else ())
  par_fn, ref_fn = _value_and_grads(par, argnums), _value_and_grads(ref, argnums)
  with jax.set_mesh(mesh):
    for strength in strengths:
      q, k, v, g, s0 = make(decay, strength=strength)
      args = (q, k, v, g, s0 if with_s0 else None)
      got, want = par_fn(*args), ref_fn(*args)
      assert got[0][0].sharding.spec[1] == "seq", got[0][0].sharding
      assert_tree_close(got, want, **TOL)


def _value_and_grads(fn, argnums):
  return jax.jit(lambda *a: (fn(*a), grads_of(fn, a, argnums)))


# ----------------------------------------------------------- multi-device cases


def _mesh4():
  return jax.make_mesh((4,), ("seq",))


def case_segments_vector():
  _compare("vector", mesh=_mesh4(), seg=SEG)


def case_batch_axis_auto_mesh():
  """A 2 x 2 mesh: batch over "data", sequence over "seq"; Auto axes, under jit."""
  mesh = jax.make_mesh((2, 2), ("data", "seq"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  q, k, v, g, s0 = make("scalar", seed=1)
  f = jax.jit(lambda *a: sp.sequence_parallel_decay_attention(
      *a, mesh=mesh, batch_axis="data", chunk_size=CHUNK, initial_state=s0, return_state=True))
  o, s = f(q, k, v, g)
  assert o.sharding.spec[:2] == ("data", "seq"), o.sharding
  ro, rs = ops.decay_linear_attention(q, k, v, g, chunk_size=CHUNK, initial_state=s0,
                                      return_state=True)
  assert_close(o, ro, **TOL)
  assert_close(s, rs, **TOL)
  # Without return_state: just the output.
  o2 = sp.sequence_parallel_decay_attention(q, k, v, g, mesh=mesh, batch_axis="data",
                                            chunk_size=CHUNK)
  assert_close(o2, ops.decay_linear_attention(q, k, v, g, chunk_size=CHUNK), **TOL)


def case_local_inside_user_shard_map():
  """The local body in the user's own shard_map: a replicated final state, and grads."""
  mesh = _mesh4()
  q, k, v, g, s0 = make("vector", seed=2)
  spec = P(None, "seq")

  def f(q, k, v, g, s0):
    body = lambda *a: sp.sequence_parallel_decay_attention_local(
        *a[:4], axis_name="seq", chunk_size=CHUNK, initial_state=a[4], return_state=True)
    put = lambda x, s: jax.device_put(x, NamedSharding(mesh, s))
    return jax.shard_map(body, mesh=mesh, in_specs=(spec,) * 4 + (P(),),
                         out_specs=(spec, P()))(*(put(x, spec) for x in (q, k, v, g)),
                                                put(s0, P()))

  def ref(q, k, v, g, s0):
    return ops.decay_linear_attention(q, k, v, g, chunk_size=CHUNK, initial_state=s0,
                                      return_state=True)

  args = (q, k, v, g, s0)
  with jax.set_mesh(mesh):
    assert_tree_close(_value_and_grads(f, (0, 1, 2, 3, 4))(*args),
                      _value_and_grads(ref, (0, 1, 2, 3, 4))(*args), **TOL)


def case_gla_and_ssd_wrappers():
  mesh = _mesh4()
  q, k, v, g, s0 = make("vector", seed=3)
  with jax.set_mesh(mesh):
    assert_tree_close(
        sp.sequence_parallel_gla(q, k, v, g, mesh=mesh, chunk_size=CHUNK, initial_state=s0,
                                 return_state=True),
        ops.gla(q, k, v, g, chunk_size=CHUNK, initial_state=s0, return_state=True), **TOL)
    kx, kdt, ka, kb, kc, kd = keys(4, 6)
    x = rand(kx, (B, T, 4, 3))
    dt = rand(kdt, (B, T, 4))
    a = -jnp.exp(rand(ka, (4,)))
    bb, cc = rand(kb, (B, T, 2, 5)), rand(kc, (B, T, 2, 5))
    d = rand(kd, (4,))
    kw = dict(dt_bias=jnp.ones(4), dt_softplus=True, chunk_size=CHUNK, return_state=True)
    assert_tree_close(sp.sequence_parallel_ssd(x, dt, a, bb, cc, d, mesh=mesh, **kw),
                      ops.ssd(x, dt, a, bb, cc, d, **kw), **TOL)


def case_errors():
  """Checks that need a mesh axis of size 4."""
  q, k, v, g, _ = make("scalar", t=30)
  try:
    sp.sequence_parallel_decay_attention(q, k, v, g, mesh=_mesh4())
  except ValueError as e:
    assert "T = 30 must be divisible by the size of mesh axis 'seq' (4)" in str(e), e
  else:
    raise AssertionError("no ValueError for T = 30 on 4 devices")
  mesh = jax.make_mesh((2, 2), ("data", "seq"))
  q, k, v, g, _ = make("scalar")
  try:
    sp.sequence_parallel_decay_attention(q[:1], k[:1], v[:1], g[:1], mesh=mesh,
                                         batch_axis="data")
  except ValueError as e:
    assert "B = 1 must be divisible by the size of batch_axis 'data' (2)" in str(e), e
  else:
    raise AssertionError("no ValueError for B = 1 over 2 devices")


CASES = multidevice.cases(globals())


def _run_cases() -> None:
  multidevice.run_cases(CASES)


def test_four_devices():
  """Every case of ``CASES`` on 4 fake CPU devices, in one subprocess."""
  multidevice.check_in_subprocess("tests.ops.test_sequence_parallel", CASES)


# ------------------------------------------------------- in-process (one device)


def test_one_device_mesh_matches_engine():
  mesh = jax.make_mesh((1,), ("seq",))
  _compare("scalar", mesh=mesh, seg=SEG, with_s0=False)


def test_errors():
  mesh = jax.make_mesh((1,), ("seq",))
  q, k, v, g, s0 = make("scalar")
  with pytest.raises(ValueError, match="axis_name must be one of the mesh axes"):
    sp.sequence_parallel_decay_attention(q, k, v, g, mesh=mesh, axis_name="time")
  with pytest.raises(ValueError, match="mesh must be a jax.sharding.Mesh"):
    sp.sequence_parallel_decay_attention(q, k, v, g, mesh="seq")
  with pytest.raises(ValueError, match="batch_axis"):
    sp.sequence_parallel_decay_attention(q, k, v, g, mesh=mesh, batch_axis="seq")
  with pytest.raises(ValueError, match="log_decay must have shape"):
    sp.sequence_parallel_decay_attention(q, k, v, g[..., :1], mesh=mesh)
  with pytest.raises(ValueError, match="log_decay must be <= 0"):
    sp.sequence_parallel_decay_attention(q, k, v, -g, mesh=mesh)
  with pytest.raises(ValueError, match="initial_state"):
    sp.sequence_parallel_decay_attention(q, k, v, g, mesh=mesh, initial_state=s0[:, :1])
  with pytest.raises(ValueError, match="segment_ids"):
    sp.sequence_parallel_decay_attention(q, k, v, g, mesh=mesh, segment_ids=SEG[:, :5])
  # The local body outside any shard_map binding its axis.
  with pytest.raises(ValueError, match="axis_name must name a mesh axis bound"):
    sp.sequence_parallel_decay_attention_local(q, k, v, g, axis_name="seq")
