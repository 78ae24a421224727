"""Every public ``*_step`` in ``linear_attention.ops`` follows one convention.

``foo_step(state, <foo's leading positional arguments>, *, <foo's keyword
options>) -> (out, new_state)``: the state first (lax.scan's ``f(carry, x)``
order), then the sequence op's per-token arguments with the same names in the
same order. The step functions are found by name, so a new one that breaks the
rule fails here.
"""

from __future__ import annotations

import inspect
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from linear_attention import ops
from tests.helpers import assert_close
from tests.ops import conformance as cf

# Steps whose sequence op is not named ``foo_step`` minus ``_step``.
SEQUENCE_OP = {
    "sliding_window_step": "sliding_window_attention",
    "loglinear_decay_step": "loglinear_decay_attention",
}
# Steps whose first argument is a KV cache (a NamedTuple of growing buffers), not a state.
CACHE_STEPS = {"sliding_window_step", "forgetting_attention_step"}
POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)

STEPS = sorted(n for n in dir(ops) if n.endswith("_step") and not n.startswith("_")
               and inspect.isfunction(getattr(ops, n)))


def _params(fn):
  params = inspect.signature(fn).parameters.values()
  positional = [p for p in params if p.kind in POSITIONAL]
  keyword = {p.name: p for p in params if p.kind == inspect.Parameter.KEYWORD_ONLY}
  return positional, keyword


def test_all_step_functions_are_found():
  assert len(STEPS) == 25, STEPS


@pytest.mark.parametrize("name", STEPS)
def test_step_signature_mirrors_the_sequence_op(name):
  step = getattr(ops, name)
  seq = getattr(ops, SEQUENCE_OP.get(name, name[:-len("_step")]))
  step_pos, step_kw = _params(step)
  seq_pos, seq_kw = _params(seq)
  want_first = "cache" if name in CACHE_STEPS else "state"
  assert step_pos[0].name == want_first, f"{name}: first argument {step_pos[0].name}"
  assert step_pos[0].default is inspect.Parameter.empty, f"{name}: the state has a default"
  assert [p.name for p in step_pos[1:]] == [p.name for p in seq_pos], name
  for p, q in zip(step_pos[1:], seq_pos):
    assert p.default is q.default, f"{name}: default of {p.name}"
  for key, p in step_kw.items():
    assert key in seq_kw, f"{name}: option {key} is not an option of {seq.__name__}"
    assert p.default == seq_kw[key].default, f"{name}: default of {key}"
  # The docstring's argument list (or body) names the state before the first input.
  doc = inspect.getdoc(step).split("Examples:", 1)[0].strip()  # the prose, not the example
  body = doc.split("Args", 1)[1] if "Args" in doc else doc.split("\n\n", 1)[-1]
  first = re.search(rf"\b{want_first}\b", body)
  second = re.search(rf"\b{step_pos[1].name}\b", body)
  assert first and (second is None or first.start() < second.start()), f"{name}: {body[:80]}"


@pytest.mark.parametrize("spec", cf.WITH_STEP, ids=lambda s: s.name)
def test_step_returns_out_then_a_state_like_the_one_given(spec):
  """``(out, new_state)``, never ``(new_state, out)``: the new state has the given one's
  structure, shapes and dtypes; ``out`` is one token in the inputs' dtype."""
  rng = np.random.default_rng(3)
  arrays = spec.make(rng, 2, jnp.float32)
  state = spec.make_state(rng, arrays) if spec.make_state else spec.step_state(arrays)
  result = spec.step(state, spec.at(arrays, 0))
  assert isinstance(result, tuple) and len(result) == 2
  out, new_state = result
  assert out.dtype == arrays[0].dtype and out.shape[0] == arrays[0].shape[0]
  assert jax.tree_util.tree_structure(new_state) == jax.tree_util.tree_structure(state)
  for new, old in zip(jax.tree_util.tree_leaves(new_state), jax.tree_util.tree_leaves(state)):
    assert (new.shape, new.dtype) == (old.shape, old.dtype), spec.name


def _qkv(rng, b=2, h=2, dk=4, dv=3):
  return (jnp.asarray(rng.normal(size=(b, h, dk)), jnp.float32),
          jnp.asarray(rng.normal(size=(b, h, dk)), jnp.float32),
          jnp.asarray(rng.normal(size=(b, h, dv)), jnp.float32))


def test_old_argument_order_raises_naming_state():
  """A call written for the order before the convention (state after the inputs) is refused."""
  rng = np.random.default_rng(0)
  q, k, v = _qkv(rng)
  s = jnp.zeros((2, 2, 4, 3), jnp.float32)
  g = -jnp.abs(jnp.asarray(rng.normal(size=(2, 2, 4)), jnp.float32))
  beta = jnp.full((2, 2), 0.5, jnp.float32)
  x, dt = jnp.ones((2, 2, 3), jnp.float32), jnp.full((2, 2), 0.1, jnp.float32)
  a, bc = -jnp.ones((2,), jnp.float32), jnp.ones((2, 1, 4), jnp.float32)
  xc, w = jnp.ones((2, 5), jnp.float32), jnp.ones((4, 5), jnp.float32)
  old_calls = {
      "gla_step": lambda: ops.gla_step(q, k, v, s, g),
      "kda_step": lambda: ops.kda_step(q, k, v, beta, g, s),
      "ssd_step": lambda: ops.ssd_step(x, dt, a, bc, bc, jnp.zeros((2, 2, 4, 3))),
      "mlstm_step": lambda: ops.mlstm_step(q, k, v, beta, beta, ops.init_mlstm_state(2, 2, 4, 3)),
      "causal_conv1d_step": lambda: ops.causal_conv1d_step(xc, jnp.zeros((2, 3, 5)), w),
  }
  for name, call in old_calls.items():
    with pytest.raises(ValueError, match=r"^state \(the first argument of every \*_step"):
      call()


def test_old_argument_order_raises_for_caches():
  rng = np.random.default_rng(1)
  q, k, v = _qkv(rng, dv=4)
  cache = ops.init_sliding_window_cache(2, 2, 3, 4, 4)
  with pytest.raises(ValueError, match=r"^cache must be a SlidingWindowCache"):
    ops.sliding_window_step(q, k, v, cache, window=3)
  fcache = ops.init_forgetting_cache(2, 2, 3, 4, 4)
  with pytest.raises(ValueError, match=r"^cache must be a ForgettingCache"):
    ops.forgetting_attention_step(q, k, v, jnp.zeros((2, 2)), fcache)


def test_new_order_runs_under_lax_scan_as_documented():
  """The ops module doc's example: scan the step over time-major inputs, compare with gla."""
  rng = np.random.default_rng(2)
  b, t, h, dk, dv = 2, 7, 2, 4, 3
  q, k = (jnp.asarray(rng.normal(size=(b, t, h, dk)), jnp.float32) for _ in range(2))
  v = jnp.asarray(rng.normal(size=(b, t, h, dv)), jnp.float32)
  log_g = -jnp.asarray(rng.uniform(0.01, 1.0, size=(b, t, h, dk)), jnp.float32)
  s0 = jnp.asarray(rng.normal(size=(b, h, dk, dv)), jnp.float32)
  want, want_state = ops.gla(q, k, v, log_g, form="recurrent", initial_state=s0,
                             return_state=True)
  xs = tuple(jnp.moveaxis(x, 1, 0) for x in (q, k, v, log_g))
  state, o = lax.scan(lambda s, x: ops.gla_step(s, *x)[::-1], s0, xs)
  assert_close(jnp.moveaxis(o, 0, 1), want, 1e-5, 1e-5)
  assert_close(state, want_state, 1e-5, 1e-5)
  # The gradient through the scan reaches the initial state.
  grad = jax.grad(lambda s: jnp.sum(lax.scan(lambda c, x: ops.gla_step(c, *x)[::-1], s, xs)[1]))
  want_grad = jax.grad(lambda s: jnp.sum(ops.gla(q, k, v, log_g, form="recurrent",
                                                 initial_state=s)))
  assert_close(grad(s0), want_grad(s0), 1e-5, 1e-5)
