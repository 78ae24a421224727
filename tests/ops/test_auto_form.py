"""``form="auto"`` of the delta-rule engines: one form's values, another form's gradient.

On CPU the token scan computes the values faster and the chunk form differentiates faster
(experiments/bench/bench_delta_forms.py), so ``auto`` pairs them through
``common.with_gradient_of``. These tests check the pairing itself: a default call's values are
the values form's bit for bit, its gradient (the initial state's included) is the gradient
form's bit for bit, on packed segments and an odd length; and the backend table.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from linear_attention import common, ops
from linear_attention.ops import delta, dplr
from tests import helpers

B, H, K, V = 2, 2, 8, 6
F32 = jnp.float32


def _inputs(seed: int, t: int):
  rng = np.random.default_rng(seed)
  normal = lambda *s: jnp.asarray(rng.standard_normal(s), F32)
  unit = lambda x: x / jnp.linalg.norm(x, axis=-1, keepdims=True)
  q, k, v = normal(B, t, H, K), unit(normal(B, t, H, K)), normal(B, t, H, V)
  k2, v2 = unit(normal(B, t, H, 2, K)), normal(B, t, H, 2, V)
  beta = jnp.asarray(rng.uniform(0.05, 1.95, (B, t, H)), F32)
  g = jax.nn.log_sigmoid(2.0 + normal(B, t, H))
  log_alpha = jax.nn.log_sigmoid(3.0 + normal(B, t, H, K))
  s0 = 0.5 * normal(B, H, K, V)
  seg = jnp.asarray(np.stack([np.repeat([0, 1, 2], [t // 3, t // 3, t - 2 * (t // 3)]),
                              np.zeros(t, int)]), jnp.int32)
  return dict(q=q, k=k, v=v, k2=k2, v2=v2, beta=beta, g=g, log_alpha=log_alpha, s0=s0, seg=seg)


# name -> (call(x, s0, **form kwargs) -> (o, state), R sub-steps per token)
CALLS = {
    "deltanet": (lambda x, s0, **f: ops.deltanet(
        x["q"], x["k"], x["v"], x["beta"], initial_state=s0, return_state=True,
        segment_ids=x["seg"], chunk_size=8, **f), 1),
    "gated_deltanet": (lambda x, s0, **f: ops.gated_deltanet(
        x["q"], x["k"], x["v"], x["beta"], x["g"], initial_state=s0, return_state=True,
        segment_ids=x["seg"], chunk_size=8, **f), 1),
    "kda": (lambda x, s0, **f: ops.kda(
        x["q"], x["k"], x["v"], x["beta"], x["log_alpha"], initial_state=s0,
        return_state=True, segment_ids=x["seg"], chunk_size=8, **f), 1),
    "rwkv7": (lambda x, s0, **f: ops.rwkv7(
        x["q"], x["k"], x["v"], x["log_alpha"], x["k"], 0.5 * x["beta"][..., None] * jnp.ones(K),
        initial_state=s0, return_state=True, segment_ids=x["seg"], chunk_size=8, **f), 1),
    "dplr_attention": (lambda x, s0, **f: ops.dplr_attention(
        x["q"], x["k"], x["v"], -x["beta"][..., None] * x["k"], x["k"], x["g"],
        initial_state=s0, return_state=True, segment_ids=x["seg"], chunk_size=8, **f), 1),
    "gated_deltaproduct": (lambda x, s0, **f: ops.gated_deltaproduct(
        x["q"], x["k2"], x["v2"], jnp.stack([x["beta"]] * 2, -1), x["g"], initial_state=s0,
        return_state=True, segment_ids=x["seg"], chunk_size=8, **f), 2),
}


def _pair(name: str) -> tuple[str, str]:
  steps = CALLS[name][1]
  return (common.resolve_auto_form("auto", delta.DEFAULT_FORMS) if name.endswith("deltanet")
          else dplr.resolve_form("auto", steps))


def test_backend_table(monkeypatch):
  """On CPU: the scan's values with the chunk form's gradient (the scan both ways with
  ``R > 1`` sub-steps); the chunk form on GPU and TPU; a named form is itself both ways."""
  for backend, one, product in (("cpu", ("recurrent", "chunk"), ("recurrent", "recurrent")),
                                ("gpu", ("chunk", "chunk"), ("chunk", "chunk")),
                                ("tpu", ("chunk", "chunk"), ("chunk", "chunk"))):
    monkeypatch.setattr(jax, "default_backend", lambda b=backend: b)
    assert dplr.resolve_form("auto") == one, backend
    assert dplr.resolve_form("auto", 2) == product, backend
    assert common.resolve_auto_form("auto", delta.DEFAULT_FORMS) == one, backend
    for form in common.FORMS:
      assert dplr.resolve_form(form, 2) == (form, form)
  with pytest.raises(ValueError, match=r"\bform must be one of .*'auto'.*got 'scan'"):
    dplr.resolve_form("scan")
  x = _inputs(0, 5)
  with pytest.raises(ValueError, match=r"\bform must be one of .*'auto'.*got 'scan'"):
    ops.gated_deltanet(x["q"], x["k"], x["v"], x["beta"], x["g"], form="scan")


@pytest.mark.parametrize("name", sorted(CALLS))
def test_values_and_gradient_come_from_their_forms(name):
  """A default call's ``(o, state)`` is the values form's, and its gradient with respect to
  the inputs and the initial state is the gradient form's, exactly (odd length, packed
  segments); both agree with the other form to rounding."""
  call, _ = CALLS[name]
  values_form, gradient_form = _pair(name)
  x = _inputs(1, 19)
  ct = jax.tree_util.tree_map(lambda y: jnp.cos(jnp.arange(y.size, dtype=F32)).reshape(y.shape),
                              call(x, x["s0"], form="recurrent"))
  loss = lambda form: lambda q, v, s0: sum(
      jnp.sum(c * y) for c, y in zip(ct, call(dict(x, q=q, v=v, v2=v[..., None, :].repeat(2, -2)),
                                              s0, **form)))
  args = (x["q"], x["v"], x["s0"])
  helpers.assert_tree_close(call(x, x["s0"]), call(x, x["s0"], form=values_form), 0, 0, name)
  got = jax.grad(loss({}), (0, 1, 2))(*args)
  helpers.assert_tree_close(got, jax.grad(loss(dict(form=gradient_form)), (0, 1, 2))(*args),
                            0, 0, name)
  other = "chunk" if gradient_form == "recurrent" else "recurrent"
  helpers.assert_tree_close(got, jax.grad(loss(dict(form=other)), (0, 1, 2))(*args),
                            2e-5, 2e-5, name)
  assert all(np.all(np.isfinite(np.asarray(g))) for g in got)


def test_jit_vmap_and_forward_mode():
  """``auto`` under ``jit`` and ``vmap`` is the plain call; forward-mode differentiation is not
  defined where the two forms differ (a ``jax.custom_vjp``: a ValueError says to name a form),
  and a named form gives it."""
  call, _ = CALLS["gated_deltanet"]  # (the DPLR chunk form has no forward mode of its own)
  x = _inputs(2, 11)
  o = lambda q, **f: call(dict(x, q=q), x["s0"], **f)[0]
  helpers.assert_tree_close(jax.jit(o)(x["q"]), o(x["q"]), 1e-6, 1e-6)
  batched = jax.vmap(o)(jnp.stack([x["q"], 2 * x["q"]]))
  helpers.assert_tree_close(batched, jnp.stack([o(x["q"]), o(2 * x["q"])]), 1e-6, 1e-6)
  if _pair("gated_deltanet")[0] != _pair("gated_deltanet")[1]:
    with pytest.raises(ValueError, match="form='auto' has a custom reverse-mode gradient"):
      jax.jvp(o, (x["q"],), (x["q"],))
  _, tangent = jax.jvp(lambda q: o(q, form="chunk"), (x["q"],), (x["q"],))
  _, want = jax.jvp(lambda q: o(q, form="recurrent"), (x["q"],), (x["q"],))
  helpers.assert_tree_close(tangent, want, 2e-5, 2e-5)


def test_with_gradient_of_takes_each_path():
  """``with_gradient_of(f, g)`` returns ``f``'s values and ``g``'s cotangents, integer and
  ``None`` arguments included."""
  f = lambda x, seg, s0: jnp.cumsum(x, 0) + s0 + seg
  g = lambda x, seg, s0: 2.0 * jnp.cumsum(x, 0) + 3.0 * s0 + seg  # a different map, on purpose
  run = common.with_gradient_of(f, g)
  x, seg, s0 = jnp.arange(4.0), jnp.arange(4), jnp.ones(4)
  np.testing.assert_array_equal(run(x, seg, s0), f(x, seg, s0))
  dx, ds0 = jax.grad(lambda x, s0: jnp.sum(run(x, seg, s0)), (0, 1))(x, s0)
  np.testing.assert_array_equal(dx, [8.0, 6.0, 4.0, 2.0])
  np.testing.assert_array_equal(ds0, [3.0] * 4)
  run_none = common.with_gradient_of(lambda x, s: x * 2, lambda x, s: x * 5)
  np.testing.assert_array_equal(jax.grad(lambda x: jnp.sum(run_none(x, None)))(x), [5.0] * 4)
