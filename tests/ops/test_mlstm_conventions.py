"""mLSTM's ``eps`` (in the read's denominator) and ``initial_m`` (a fresh state's
stabiliser) options: every form and the step against a plain float32 reference written
here, forward and gradient, with packed segments (where a fresh state starts mid-row);
and against transformers' own xLSTM kernels when torch is installed."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from linear_attention import ops
from tests import helpers

FORMS = ("parallel", "chunk", "recurrent")
B, T, H, K, V = 2, 19, 2, 8, 6
EPS, M0 = 1e-2, 0.0  # eps large enough to move outputs well past the tolerances


def _inputs(seed, t=T):
  rng = np.random.default_rng(seed)
  n = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
  # Small input gates keep |n q| near the exp(-m) floor, where both options matter.
  return n(B, t, H, K), n(B, t, H, K), n(B, t, H, V), 1.5 * n(B, t, H) - 3.0, 1.0 + n(B, t, H)


def _segments(t=T):
  return jnp.asarray(np.array([[0] * 7 + [1] * (t - 7), [0] * 12 + [3] * (t - 12)]), jnp.int32)


def _reference(q, k, v, ig, fg, segment_ids, eps, m0):
  """xLSTM's stabilised step (as transformers' mlstm_recurrent_step_native writes it) in a
  Python loop, float32: fresh state (0, 0, m0) at t = 0 and at each segment start."""
  b, t, h, dk = q.shape
  c = jnp.zeros((b, h, dk, v.shape[-1]))
  n = jnp.zeros((b, h, dk))
  m = jnp.full((b, h), m0)
  out = []
  for i in range(t):
    if i > 0:
      start = (segment_ids[:, i] != segment_ids[:, i - 1])[:, None]
      c = jnp.where(start[..., None, None], 0.0, c)
      n = jnp.where(start[..., None], 0.0, n)
      m = jnp.where(start, m0, m)
    log_f = jax.nn.log_sigmoid(fg[:, i])
    m_new = jnp.maximum(log_f + m, ig[:, i])
    f_w, i_w = jnp.exp(log_f + m - m_new), jnp.exp(ig[:, i] - m_new)
    c = f_w[..., None, None] * c + i_w[..., None, None] * k[:, i, :, :, None] * v[:, i, :, None]
    n = f_w[..., None] * n + i_w[..., None] * k[:, i]
    qs = q[:, i] * dk ** -0.5
    num = jnp.einsum("bhk,bhkv->bhv", qs, c)
    den = jnp.maximum(jnp.abs(jnp.einsum("bhk,bhk->bh", qs, n)), jnp.exp(-m_new)) + eps
    out.append(num / den[..., None])
    m = m_new
  return jnp.stack(out, axis=1), (c, n, m)


@pytest.mark.parametrize("form", FORMS)
def test_forms_match_the_reference_forward_and_gradient(form):
  q, k, v, ig, fg = _inputs(0)
  seg = _segments()
  ref = lambda q, k, v, ig, fg: _reference(q, k, v, ig, fg, seg, EPS, M0)
  fn = lambda q, k, v, ig, fg: ops.mlstm(q, k, v, ig, fg, form=form, chunk_size=8,
                                         segment_ids=seg, return_state=True, eps=EPS,
                                         initial_m=M0)
  want = helpers.value_and_grads(ref, (q, k, v, ig, fg))
  got = helpers.value_and_grads(fn, (q, k, v, ig, fg))
  helpers.assert_tree_close(got, want, 2e-4, 2e-4, form)


def test_options_change_the_output():
  """Guard against a test that passes because the options do nothing: eps moves the
  output by more than the tolerances above, and so does initial_m given eps (without eps
  the read does not depend on the stabiliser, so neither does the output)."""
  q, k, v, ig, fg = _inputs(1)
  diff = lambda a, b: np.max(np.abs(np.asarray(a) - np.asarray(b)))
  base = ops.mlstm(q, k, v, ig, fg)
  with_eps = ops.mlstm(q, k, v, ig, fg, eps=EPS)
  assert diff(with_eps, base) > 2e-3
  assert diff(ops.mlstm(q, k, v, ig, fg, eps=EPS, initial_m=M0), with_eps) > 5e-4
  assert diff(ops.mlstm(q, k, v, ig, fg, initial_m=M0), base) < 1e-5


def test_step_matches_the_sequence():
  q, k, v, ig, fg = _inputs(2)
  want, want_state = ops.mlstm(q, k, v, ig, fg, form="recurrent", return_state=True, eps=EPS,
                               initial_m=M0)
  state = ops.init_mlstm_state(B, H, K, V, initial_m=M0)
  np.testing.assert_array_equal(np.asarray(state[2]), 0.0)
  for t in range(T):
    o, state = ops.mlstm_step(state, q[:, t], k[:, t], v[:, t], ig[:, t], fg[:, t], eps=EPS)
    helpers.assert_close(o, want[:, t], 1e-5, 1e-5, f"t={t}")
  helpers.assert_tree_close(state, want_state, 1e-5, 1e-5)


def test_initial_state_gradient_with_the_options():
  """With an explicit initial state, initial_m only acts at segment starts; the forms'
  gradients with respect to the state agree."""
  q, k, v, ig, fg = _inputs(3)
  seg = _segments()
  rng = np.random.default_rng(4)
  s0 = (jnp.asarray(rng.standard_normal((B, H, K, V)), jnp.float32),
        jnp.asarray(rng.standard_normal((B, H, K)), jnp.float32),
        jnp.asarray(rng.standard_normal((B, H)), jnp.float32))
  outs = {}
  for form in FORMS:
    fn = lambda s0, form=form: ops.mlstm(q, k, v, ig, fg, form=form, chunk_size=8,
                                         initial_state=s0, segment_ids=seg, eps=EPS,
                                         initial_m=M0)
    outs[form] = helpers.value_and_grads(fn, (s0,))
  for form in FORMS[1:]:
    helpers.assert_tree_close(outs[form], outs["parallel"], 2e-4, 2e-4, form)


def test_bad_options_name_themselves():
  q, k, v, ig, fg = _inputs(5, t=4)
  with pytest.raises(ValueError, match=r"\beps must be a finite number >= 0"):
    ops.mlstm(q, k, v, ig, fg, eps=-1.0)
  with pytest.raises(ValueError, match=r"\binitial_m must be a real number or -inf"):
    ops.mlstm(q, k, v, ig, fg, initial_m=float("inf"))
  with pytest.raises(ValueError, match=r"\binitial_m must be"):
    ops.init_mlstm_state(B, H, K, V, initial_m=float("nan"))
  state = ops.init_mlstm_state(B, H, K, V)
  with pytest.raises(ValueError, match=r"\beps must be"):
    ops.mlstm_step(state, q[:, 0], k[:, 0], v[:, 0], ig[:, 0], fg[:, 0], eps=float("inf"))


def _hf_xlstm():
  pytest.importorskip("torch")
  return pytest.importorskip("transformers.models.xlstm.modeling_xlstm")


@pytest.mark.hf
@pytest.mark.parametrize("t", [19, 24])
def test_matches_transformers_xlstm_kernels(t):
  """transformers' xLSTM-7B backend (chunks of 8 through its chunkwise kernel, the rest
  through its recurrent one, m starting at 0, eps 1e-6) against the op's chunk form."""
  hf = _hf_xlstm()
  import torch
  if not hasattr(hf, "wrap_chunkwise_arbitrary_sequence_length"):
    pytest.skip("transformers uses the external xlstm package's kernels here")
  q, k, v, ig, fg = _inputs(6, t)
  to = lambda x: torch.from_numpy(np.asarray(jnp.moveaxis(x, 2, 1)).copy())
  h, (c, n, m) = hf.wrap_chunkwise_arbitrary_sequence_length(
      mlstm_chunkwise_kernel=hf.mlstm_chunkwise_native_autograd,
      mlstm_sequence_kernel=hf.mlstm_recurrent_sequence_native,
      mlstm_step_kernel=hf.mlstm_recurrent_step_native,
      query=to(q), key=to(k), value=to(v), igate=to(ig), fgate=to(fg), chunk_size=8,
      eps=1e-6, return_last_states=True)
  o, (c2, n2, m2) = ops.mlstm(q, k, v, ig, fg, chunk_size=8, eps=1e-6, initial_m=0.0,
                              return_state=True)
  helpers.assert_close(o, np.moveaxis(h.numpy(), 1, 2), 1e-5, 1e-5)
  helpers.assert_tree_close((c2, n2, m2), (c.numpy(), n.numpy(), m.numpy()[..., 0]), 1e-5, 1e-5)
