"""Uniform defaults: every engine's entry point takes ``chunk_size=None`` (the per-backend
length of ``engines.dispatch``) and ``form="auto"``; the one backend table of the kernels."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from linear_attention import common, ops
from linear_attention.engines import dispatch

ENGINES = {"decay": ops.decay_linear_attention, "delta": ops.delta_rule,
           "dplr": ops.dplr_attention, "scan": ops.linear_scan}


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_every_engine_defaults_to_auto_and_the_backend_chunk(engine):
  params = inspect.signature(ENGINES[engine]).parameters
  assert params["chunk_size"].default is None
  assert params["form"].default == "auto"


def test_chunk_size_table():
  assert dispatch.resolve_chunk_size(None, "decay", "cpu") == 64
  assert dispatch.resolve_chunk_size(None, "dplr", "cpu") == 32
  assert dispatch.resolve_chunk_size(None, "dplr", "gpu") == 64
  assert dispatch.resolve_chunk_size(12, "delta") == 12
  with pytest.raises(ValueError, match=r"^engine must be one of"):
    dispatch.resolve_chunk_size(None, "softmax")
  with pytest.raises(ValueError, match=r"^chunk_size must be an integer >= 1, got 0"):
    dispatch.resolve_chunk_size(0, "decay")


def test_lowering_table():
  assert dispatch.lowering("gpu", triton="t", mosaic_tpu="m") == "t"
  assert dispatch.lowering("tpu", triton="t", mosaic_tpu="m") == "m"
  with pytest.raises(ValueError, match=r"^platform must be one of \['gpu', 'tpu'\], got 'cpu'"):
    dispatch.lowering("cpu", triton="t", mosaic_tpu="m")


def test_a_default_call_is_the_call_with_the_resolved_defaults():
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.standard_normal((1, 70, 2, 4)), jnp.float32) for _ in range(3))
  g = jnp.asarray(-rng.uniform(0, 1, (1, 70, 2, 4)), jnp.float32)
  size = dispatch.resolve_chunk_size(None, "decay")
  np.testing.assert_array_equal(ops.gla(q, k, v, g), ops.gla(q, k, v, g, form="chunk",
                                                             chunk_size=size))
  a = jax.nn.sigmoid(q)
  np.testing.assert_array_equal(ops.linear_scan(a, k), ops.linear_scan(a, k, form="chunk",
                                                                       chunk_size=size))


def test_auto_can_depend_on_one_cpu_thread(monkeypatch):
  table = {"cpu": ("recurrent", "chunk"), "cpu:1": ("chunk", "chunk")}
  monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
  assert common.one_cpu_thread()
  assert common.resolve_auto_form("auto", table) == ("chunk", "chunk")
  assert common.resolve_auto_form("auto", {"cpu": ("recurrent", "chunk")}) == (
      "recurrent", "chunk")
  monkeypatch.setenv("XLA_FLAGS", "")
  assert not common.one_cpu_thread()
  assert common.resolve_auto_form("auto", table) == ("recurrent", "chunk")
