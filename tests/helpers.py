"""Shared test utilities: random inputs, closeness checks, gradient checks."""

from __future__ import annotations

import os

import chex
import jax
import jax.numpy as jnp
import numpy as np

# Tolerances for bfloat16 inputs with float32 state and accumulation: bfloat16
# keeps 8 mantissa bits (relative rounding 2**-8 ~ 0.4%) and every form rounds
# its inputs once, so outputs agree with the float32 reference to a few
# rounding steps of the output's own magnitude.
BF16_RTOL = 5e-2
BF16_ATOL = 5e-2


def rand(key, shape, dtype=jnp.float32, scale=1.0):
  """Standard normal array times ``scale``."""
  return (scale * jax.random.normal(key, shape, jnp.float32)).astype(dtype)


def keys(seed: int, n: int):
  """``n`` independent PRNG keys from one seed."""
  return list(jax.random.split(jax.random.PRNGKey(seed), n))


def _as_f32(x):
  return np.asarray(jnp.asarray(x, jnp.float32))


def assert_close(actual, expected, rtol=1e-4, atol=1e-4, err_msg=""):
  """``actual`` is finite and within ``atol + rtol * |expected|`` of ``expected``.

  Both are compared as float32 (so bfloat16 results meet float32 references).
  """
  a, e = _as_f32(actual), _as_f32(expected)
  assert np.all(np.isfinite(a)), f"non-finite values in result {err_msg}"
  chex.assert_trees_all_close(a, e, rtol=rtol, atol=atol, custom_message=err_msg)


def assert_tree_close(actual, expected, rtol=1e-4, atol=1e-4, err_msg=""):
  """:func:`assert_close` over two pytrees of one structure (``None`` leaves drop out)."""
  chex.assert_trees_all_equal_structs(actual, expected)
  a = jax.tree_util.tree_map(_as_f32, actual)
  e = jax.tree_util.tree_map(_as_f32, expected)
  for i, leaf in enumerate(jax.tree_util.tree_leaves(a)):
    assert np.all(np.isfinite(leaf)), f"non-finite values in leaf {i} {err_msg}"
  chex.assert_trees_all_close(a, e, rtol=rtol, atol=atol, custom_message=err_msg)


def value_and_grads(fn, args, argnums=None, seed=0):
  """``(fn(*args), grads)`` of ``sum(out * w)`` over every output leaf, one jit.

  ``w`` is a fixed random cotangent per leaf (so every output element counts),
  drawn with numpy: ``jax.random`` inside the jit would add a sampler to
  every compile. ``argnums`` defaults to every argument.
  """
  argnums = tuple(range(len(args))) if argnums is None else tuple(argnums)
  rng = np.random.default_rng(seed)
  ws = [rng.standard_normal(l.shape).astype(np.float32)
        for l in jax.tree_util.tree_leaves(jax.eval_shape(fn, *args))]

  def loss(*a):
    leaves = jax.tree_util.tree_leaves(fn(*a))
    return sum(jnp.sum(l.astype(jnp.float32) * w) for l, w in zip(leaves, ws))

  grad = jax.grad(loss, argnums=argnums)
  return jax.jit(lambda *a: (fn(*a), grad(*a)))(*args)


def grads_of(fn, args, argnums, cotangent_key=0):
  """Gradients of ``sum(fn(*args) * w)`` for a fixed random ``w`` per output leaf.

  A random cotangent (rather than ``sum``) makes every output element matter.
  """

  def loss(*a):
    out = fn(*a)
    leaves = jax.tree_util.tree_leaves(out)
    ks = jax.random.split(jax.random.PRNGKey(cotangent_key), len(leaves))
    return sum(
        jnp.sum(l.astype(jnp.float32) * jax.random.normal(k, l.shape, jnp.float32))
        for l, k in zip(leaves, ks)
    )

  return jax.grad(loss, argnums=argnums)(*args)


def decode_all(layer, x):
  """Token-by-token outputs ``[B, T, ...]`` of a mixer or model ``layer`` through its cache."""
  cache = layer.init_cache(x.shape[0], x.shape[1])
  ys = []
  for t in range(x.shape[1]):
    y, cache = layer.decode_step(x[:, t], cache)
    ys.append(y)
  return jnp.stack(ys, axis=1)


def load_experiment(name: str):
  """The script ``experiments/<folder>/<name>.py`` (script folders, not packages), loaded once."""
  import importlib.util
  import pathlib
  import sys
  key = f"la_experiment_{name}"
  if key not in sys.modules:
    found = sorted((pathlib.Path(ROOT) / "experiments").glob(f"*/{name}.py"))
    assert len(found) == 1, f"experiments/*/{name}.py: found {found}"
    path = found[0]
    spec = importlib.util.spec_from_file_location(key, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[key] = mod
    spec.loader.exec_module(mod)
  return sys.modules[key]


def wait_for(predicate, proc, what: str, deadline_s: float) -> None:
  """Polls ``predicate()`` until it holds; fails when ``proc`` (a ``subprocess.Popen``) ends
  first or after ``deadline_s`` seconds, naming ``what`` was awaited (a test never hangs)."""
  import time
  deadline = time.monotonic() + deadline_s
  while time.monotonic() < deadline:
    if predicate():
      return
    assert proc.poll() is None, f"the process ended (rc {proc.returncode}) before {what}"
    time.sleep(0.05)
  raise AssertionError(f"timed out after {deadline_s:g} s waiting for {what}")


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fake_device_env(devices: int, fast_compile: bool = False) -> dict:
  """The environment of a subprocess that sees ``devices`` fake CPU devices.

  ``fast_compile`` adds ``--xla_backend_optimization_level=0``, which cuts CPU compile time
  about threefold and leaves the numerics the tests check unchanged.
  """
  flags = f"--xla_force_host_platform_device_count={devices}"
  if fast_compile:
    flags += " --xla_backend_optimization_level=0"
  return dict(os.environ, JAX_PLATFORMS="cpu",
              XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " " + flags).strip())


def run_on_fake_devices(script: str, done: str, *, devices: int = 4, workdir=None,
                        timeout: int = 600, fast_compile: bool = False) -> str:
  """Runs Python source ``script`` from the repository root on ``devices`` fake CPU devices.

  The main pytest process has one CPU device, so multi-device checks run in a subprocess.
  ``workdir`` (when given) is bound to ``WORKDIR`` in the script. The test fails, with the
  tail of the output, unless the script exits 0 and prints the line marker ``done``.
  Returns the subprocess's stdout.
  """
  import subprocess
  import sys
  if workdir is not None:
    script = f"WORKDIR = {str(workdir)!r}\n" + script
  p = subprocess.run([sys.executable, "-c", script], cwd=ROOT,
                     env=fake_device_env(devices, fast_compile), capture_output=True, text=True,
                     timeout=timeout)
  assert p.returncode == 0 and done in p.stdout, (p.stdout + p.stderr)[-4000:]
  return p.stdout
