"""``context=`` of the token mixers beside the engines: the causal convolution (a halo
from the previous device), softmax and Forgetting attention (all-gather attention) and
sliding-window attention (a halo on each side).

Each case compares the op with the sequence split over a mesh axis against the same op
without a context: outputs and the gradients of every input (weights, gates and the
convolution's initial state included), on meshes ``(4,)`` (``"seq"``) and ``(2, 2)``
(``"data", "seq"``), with packed segments whose boundaries fall inside a slice and on a
slice edge, and ``T = 20`` (5 tokens a device: odd). Tolerance ``rtol = atol = 2e-4`` in
float32 (the gathered softmax sums in another order); bfloat16 inputs: ``2e-2`` against
the unsharded bfloat16 call (one bfloat16 rounding of the output apart).

The 4 fake CPU devices need their own process: every case runs in one subprocess
(``XLA_FLAGS=--xla_force_host_platform_device_count=4``), as in
``test_sequence_parallel.py``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from linear_attention import ops
from linear_attention.engines.context import SeqContext
from tests.ops import multidevice

TOL = dict(rtol=2e-4, atol=2e-4)
B, T = 2, 20
# Row 0: boundaries inside slices (3, 12); row 1: on the slice edge 10, and an id reused.
SEG = np.array([[0] * 3 + [1] * 9 + [2] * 8, [5] * 10 + [6] * 5 + [5] * 5], np.int32)


def _meshes():
  auto = jax.sharding.AxisType.Auto
  return {"seq4": SeqContext(jax.make_mesh((4,), ("seq",), axis_types=(auto,))),
          "data2_seq2": SeqContext(jax.make_mesh((2, 2), ("data", "seq"), axis_types=(auto,) * 2),
                                   batch_axis="data")}


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
  for mesh_name, ctx in _meshes().items():
    with jax.set_mesh(ctx.mesh):
      got = both(ctx)(*args)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
      np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                 err_msg=f"{name} {mesh_name} {jax.tree_util.keystr(path)}",
                                 **tol)


# ----------------------------------------------------------------- the causal convolution


def case_conv():
  x, w, bias, s0 = _randn(0, (B, T, 6), (4, 6), (6,), (B, 3, 6))
  w6 = _randn(1, (6, 6))[0]  # halo 5 = the whole slice
  seg = jnp.asarray(SEG)

  def fn(x, w, bias, s0, w6, context):
    conv = lambda *a, **kw: ops.causal_conv1d(*a, context=context, **kw)
    # The initial state enters on the first device; the final state comes from the last.
    return [conv(x, w, bias), conv(x, w, bias, segment_ids=seg, activation="silu"),
            *conv(x, w, initial_state=s0, return_state=True),
            *conv(x, w, initial_state=s0, return_state=True, segment_ids=seg),
            conv(x, w6, segment_ids=seg)]

  _check(fn, (x, w, bias, s0, w6), name="conv")


# ----------------------------------------------------------------- all-gather attention


def case_softmax():
  q, k, v = _randn(2, (B, T, 2, 4), (B, T, 2, 4), (B, T, 2, 3))
  seg = jnp.asarray(SEG)

  def fn(q, k, v, context):
    return [ops.softmax_attention(q, k, v, causal=causal, segment_ids=s, algorithm=algorithm,
                                  block_size=4, context=context)
            for causal in (True, False) for algorithm in ("naive", "blockwise")
            for s in (None, seg)]

  _check(fn, (q, k, v), name="softmax")


def case_softmax_bfloat16():
  q, k, v = _randn(3, (B, T, 2, 4), (B, T, 2, 4), (B, T, 2, 4), dtype=jnp.bfloat16)
  _check(lambda q, k, v, context: [ops.softmax_attention(
      q, k, v, causal=True, segment_ids=jnp.asarray(SEG), context=context)],
         (q, k, v), tol=dict(rtol=2e-2, atol=2e-2), name="softmax bf16")


def case_forgetting():
  q, k, v, g = _randn(4, (B, T, 2, 4), (B, T, 2, 4), (B, T, 2, 3), (B, T, 2))
  log_f = jax.nn.log_sigmoid(g + 1.0)

  def fn(q, k, v, f, context):
    return [ops.forgetting_attention(q, k, v, f, segment_ids=s, algorithm=algorithm,
                                     block_size=4, context=context)
            for algorithm in ("naive", "blockwise") for s in (None, jnp.asarray(SEG))]

  _check(fn, (q, k, v, log_f), name="forgetting")


# ----------------------------------------------------------------- sliding windows


def case_sliding_window():
  q, k, v = _randn(5, (B, T, 2, 4), (B, T, 2, 4), (B, T, 2, 3))

  def fn(q, k, v, context):
    # Halo 2, and 5 = the whole slice.
    return [ops.sliding_window_attention(q, k, v, window=window, causal=causal, segment_ids=s,
                                         block_size=4, context=context)
            for window in (3, 6) for causal in (True, False) for s in (None, jnp.asarray(SEG))]

  _check(fn, (q, k, v), name="sliding window")


def case_inside_user_shard_map():
  """Inside the caller's own ``shard_map`` the ops run their per-device bodies directly."""
  ctx = _meshes()["seq4"]
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
  ctx = _meshes()["seq4"]
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


def _run_cases() -> None:
  """Subprocess entry point (4 fake devices)."""
  multidevice.run_cases(CASES)


def test_four_devices():
  """Every case on 4 fake CPU devices, in one subprocess."""
  multidevice.check_in_subprocess("tests.ops.test_context_mixers", CASES)


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
