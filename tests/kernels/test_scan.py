"""The linear-scan Pallas kernel against the ops/ XLA twin, in interpret mode on CPU.

One test class over the GPU (``interpret=True``) and TPU
(``interpret=pltpu.InterpretParams()``) kernel paths; natively on that hardware.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.experimental.pallas import tpu as pltpu

from linear_attention import ops
from linear_attention.engines.scan import pallas as ks
from tests.helpers import BF16_ATOL, BF16_RTOL, assert_close, keys, rand

B, T = 2, 21  # T: not a multiple of the TPU chunk (8)

PATHS = {
    "gpu": dict(platform="gpu", block_sizes=ks.ScanBlockSizes(block_d=8)),  # 2 channel blocks
    "tpu": dict(platform="tpu", block_sizes=ks.ScanBlockSizes(chunk=8)),
}


@pytest.fixture(params=sorted(PATHS))
def path(request):
  p = dict(PATHS[request.param])
  native = jax.default_backend() == p["platform"]
  interpret = False if native else (pltpu.InterpretParams() if p["platform"] == "tpu" else True)
  return dict(p, interpret=interpret)


def make(dtype=jnp.float32, shape=(3, 5)):
  ka, kb, kh = keys(3, 3)
  a = jax.random.uniform(ka, (B, T) + shape, minval=-1.0, maxval=1.0).astype(dtype)
  return a, rand(kb, (B, T) + shape, dtype), rand(kh, (B,) + shape)


class TestLinearScanKernel:

  @pytest.mark.parametrize("reverse", [False, True])
  def test_forward_and_vjp_match_xla(self, path, reverse):
    a, b, h0 = make()
    kernel = lambda a, b, h0: ks.linear_scan(a, b, h0=h0, reverse=reverse, return_state=True, **path)
    xla = lambda a, b, h0: ops.linear_scan(a, b, h0=h0, reverse=reverse, return_state=True,
                                           form="recurrent")
    out, vjp = jax.vjp(kernel, a, b, h0)
    ref, vjp_ref = jax.vjp(xla, a, b, h0)
    assert_close(out[0], ref[0], 1e-5, 1e-5, "h")
    assert_close(out[1], ref[1], 1e-5, 1e-5, "state")
    cts = (rand(keys(5, 1)[0], out[0].shape), rand(keys(6, 1)[0], out[1].shape))
    for name, x, e in zip(("a", "b", "h0"), vjp(cts), vjp_ref(cts)):
      assert_close(x, e, 1e-4, 1e-4, name)

  def test_bfloat16_inputs(self, path):
    a, b, h0 = make(jnp.bfloat16, shape=(4,))
    h = ks.linear_scan(a, b, h0=h0, **path)
    assert h.dtype == jnp.bfloat16
    f32 = lambda x: x.astype(jnp.float32)
    assert_close(h, ops.linear_scan(f32(a), f32(b), h0=h0, form="recurrent"), BF16_RTOL, BF16_ATOL)


def test_dispatch_and_unsupported_arguments():
  # The op through the kernel, packed segments included:
  # tests/ops/test_conformance.py::test_kernel_matches_reference_and_xla.
  a, b, h0 = make()
  with pytest.raises(ValueError, match="'a'|a: dtype|support a"):
    ops.linear_scan(a.astype(jnp.complex64), b, implementation="pallas")
  with pytest.raises(ValueError, match="form"):
    ops.linear_scan(a, b, form="associative", implementation="pallas")
  with pytest.raises(ValueError, match="implementation"):
    ops.linear_scan(a, b, implementation="cuda")
  with pytest.raises(ValueError, match="block_sizes.chunk"):
    ks.linear_scan(a, b, platform="tpu", block_sizes=ks.ScanBlockSizes(chunk=12))


def test_tiling_per_platform():
  """engines/dispatch's scan tiling: Triton blocks are powers of two over all of T; Mosaic
  blocks are a multiple of 128 channels (or all of them) and T is padded to the chunk."""
  from linear_attention.engines import dispatch
  assert dispatch.scan_tiling("gpu", 200, 33, 128, 8) == (128, 256, 33)
  assert dispatch.scan_tiling("gpu", 3, 33, 128, 8) == (4, 4, 33)
  assert dispatch.scan_tiling("tpu", 200, 33, 128, 8) == (128, 256, 40)
  assert dispatch.scan_tiling("tpu", 40, 21, 128, 8) == (40, 40, 24)
  assert dispatch.scan_tiling("tpu", 384, 16, 256, 8) == (256, 512, 16)
  with pytest.raises(ValueError, match="platform must be one of"):
    dispatch.scan_tiling("cpu", 8, 8, 128, 8)
