"""``context=`` with the default form and with the kernels, forward-mode through ``auto``,
and the ``scale`` check.

* The gradient of every engine with an ``"auto"`` form (the delta-rule and DPLR engines
  pair a values form with a gradient form), and of the decay and scan engines' default,
  works at one token per device (``jit(grad(...))`` on 4 fake devices, ``T = 4``) and
  equals the unsharded gradient. At one token per device the UT inverse of a 1-token
  chunk once came back invariant over the mesh and broke the ``custom_vjp``'s types.
* ``implementation="pallas"`` with a context is refused in one line naming both
  arguments, by every engine and variant (no JAX-internal error).
* ``jax.jvp``/``jax.jacfwd`` through ``form="auto"`` says to name a form.
* ``scale`` must be finite and positive.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from linear_attention import ops
from linear_attention.engines.context import SeqContext
from tests.helpers import assert_tree_close
from tests.ops import multidevice

B, T, H, K = 1, 4, 2, 4  # one token per device on 4 devices


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  n = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
  q, v = n(B, T, H, K), n(B, T, H, K)
  k = n(B, T, H, K)
  k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
  beta = jax.nn.sigmoid(n(B, T, H))
  return q, k, v, beta, jax.nn.log_sigmoid(n(B, T, H)), jax.nn.log_sigmoid(n(B, T, H, K))


def _ops():
  """name -> ``f(q, context=...)`` for every engine (and DPLR/delta variant) whose
  ``form`` defaults to ``"auto"``."""
  q, k, v, beta, g, gk = _inputs()
  a = jax.nn.sigmoid(v)
  return {
      "delta_rule": lambda q, **c: ops.delta_rule(q, k, v, beta, **c),
      "deltanet": lambda q, **c: ops.deltanet(q, k, v, beta, **c),
      "gated_deltanet": lambda q, **c: ops.gated_deltanet(q, k, v, beta, g, **c),
      "dplr_attention": lambda q, **c: ops.dplr_attention(q, k, v, -beta[..., None] * k, k, gk,
                                                          **c),
      "dplr_attention_a_none": lambda q, **c: ops.dplr_attention(q, k, v, None, k, gk, **c),
      "kda": lambda q, **c: ops.kda(q, k, v, beta, gk, **c),
      "rwkv7": lambda q, **c: ops.rwkv7(q, k, v, gk, k, a, **c),
      "gated_deltaproduct": lambda q, **c: ops.gated_deltaproduct(
          q, k[:, :, :, None], v[:, :, :, None], beta[..., None], g, **c),
      "decay_linear_attention": lambda q, **c: ops.decay_linear_attention(q, k, v, gk, **c),
      "gla": lambda q, **c: ops.gla(q, k, v, gk, **c),
      "linear_scan": lambda q, **c: ops.linear_scan(jax.nn.sigmoid(v), q, **c),
  }


def case_auto_gradient_at_one_token_per_device():
  mesh = jax.make_mesh((4,), ("seq",))
  ctx = SeqContext(mesh)
  q = _inputs(1)[0]
  for name, f in _ops().items():
    loss = lambda q, **c: jnp.sum(jnp.sin(f(q, **c)))
    want = jax.value_and_grad(loss)(q)
    with jax.set_mesh(mesh):
      got = jax.jit(jax.value_and_grad(lambda q: loss(q, context=ctx)))(q)
    assert_tree_close(got, want, 2e-5, 2e-5, name)


CASES = multidevice.cases(globals())


def _run_cases():
  multidevice.run_cases(CASES)


def test_four_devices():
  multidevice.check_in_subprocess("tests.ops.test_context_forms", CASES)


@pytest.mark.parametrize("name", sorted(_ops()))
def test_pallas_with_a_context_is_refused_in_one_line(name):
  ctx = SeqContext(jax.make_mesh((1,), ("seq",)))
  q = _inputs()[0]
  with pytest.raises(ValueError, match=r"^implementation='pallas' does not run with context="):
    _ops()[name](q, context=ctx, implementation="pallas")


def test_pallas_with_a_context_is_refused_by_softmax_too():
  ctx = SeqContext(jax.make_mesh((1,), ("seq",)))
  q = _inputs()[0]
  with pytest.raises(ValueError, match=r"^implementation='pallas' does not run with context="):
    ops.softmax_attention(q, q, q, context=ctx, implementation="pallas")


@pytest.mark.parametrize("name", ["deltanet", "gated_deltanet", "kda", "rwkv7",
                                  "gated_deltaproduct"])
def test_forward_mode_through_auto_says_to_name_a_form(name):
  f = _ops()[name]
  q = _inputs()[0]
  for transform in (lambda: jax.jvp(f, (q,), (q,)), lambda: jax.jacfwd(f)(q)):
    with pytest.raises(ValueError, match=r"form='auto' .* name the form form='recurrent'"):
      transform()
  _, tangent = jax.jvp(lambda q: f(q, form="recurrent"), (q,), (q,))
  assert tangent.shape == q.shape


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), 0.0, -1.0])
@pytest.mark.parametrize("name", ["gla", "deltanet", "kda", "softmax"])
def test_scale_must_be_finite_and_positive(name, scale):
  q, k, v, beta, _, gk = _inputs()
  call = {"gla": lambda s: ops.gla(q, k, v, gk, scale=s),
          "deltanet": lambda s: ops.deltanet(q, k, v, beta, scale=s),
          "kda": lambda s: ops.kda(q, k, v, beta, gk, scale=s),
          "softmax": lambda s: ops.softmax_attention(q, k, v, scale=s)}[name]
  with pytest.raises(ValueError, match=r"^scale must be a finite number > 0"):
    call(scale)
  assert call(0.5).shape == q.shape
