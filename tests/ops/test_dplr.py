"""Checks of the DPLR engine that only it needs (the shared ones: test_conformance.py).

* identities: with ``a = 0`` the diagonal-decay engine; the delta rule, Gated DeltaNet, KDA with a uniform decay and
  Gated DeltaProduct with one step are the same recurrence, so they must agree;
  DeltaProduct's R steps are Gated DeltaNet over the interleaved sequence;
* the engine itself, with general (non-delta) ``a, b``, rank 2 and chunks of
  several sub-chunks, against a plain scan;
* strong decays (log decays down to -20 per step, ``-inf``): finite, and all
  forms agree, gradients included;
* RWKV-7 against a transcription of the paper's equations in its own
  row-vector layout (``wkv [V, K]``), from the raw quantities;
* bad inputs only these ops have.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from linear_attention import ops
from linear_attention.engines import chunks
from tests import helpers

F32 = jnp.float32
B, H, K, V = 2, 2, 8, 6
FORMS = ("parallel", "chunk", "recurrent")


def _rng(seed):
  return np.random.default_rng(seed)


def _normal(rng, *shape, scale=1.0):
  return jnp.asarray(scale * rng.standard_normal(shape), F32)


def _unit(x):
  return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def _delta_inputs(seed, t):
  rng = _rng(seed)
  q, k, v = _normal(rng, B, t, H, K), _unit(_normal(rng, B, t, H, K)), _normal(rng, B, t, H, V)
  beta = jnp.asarray(rng.uniform(0.05, 1.95, (B, t, H)), F32)
  g = jax.nn.log_sigmoid(2.0 + _normal(rng, B, t, H))
  s0 = _normal(rng, B, H, K, V, scale=0.5)
  seg = jnp.asarray(np.stack([np.repeat([0, 1, 2], [t // 3, t // 3, t - 2 * (t // 3)]),
                              np.zeros(t, int)]), jnp.int32)
  return q, k, v, beta, g, s0, seg


@pytest.mark.parametrize("form", FORMS)
def test_zero_correction_is_the_diagonal_engine(form):
  """With ``a = 0`` the transition is ``diag(exp g)``: the decay engine, per-channel decay."""
  t = 37
  q, k, v, _, _, s0, seg = _delta_inputs(3, t)
  rng = _rng(4)
  g = jax.nn.log_sigmoid(2.0 + _normal(rng, B, t, H, K))
  b = _normal(rng, B, t, H, K)  # read vector of a zero correction: must not matter
  kw = dict(form=form, chunk_size=16, initial_state=s0, return_state=True, segment_ids=seg)
  got = ops.dplr_attention(q, k, v, jnp.zeros_like(k), b, g, **kw)
  want = ops.decay_linear_attention(q, k, v, g, **kw)
  helpers.assert_tree_close(got, want, rtol=1e-5, atol=1e-5, err_msg=form)


@pytest.mark.parametrize("form", FORMS)
def test_identities_with_the_delta_rule(form):
  """Rank one, D = gate * I, a = -beta k, b = gate * k (the gate acts first), write beta k."""
  t = 37
  q, k, v, beta, g, s0, seg = _delta_inputs(0, t)
  kw = dict(form=form, chunk_size=16, initial_state=s0, return_state=True, segment_ids=seg)
  want_gated = ops.gated_deltanet(q, k, v, beta, g, **kw)
  want_plain = ops.deltanet(q, k, v, beta, **kw)
  gate = jnp.exp(g)[..., None]
  got = {
      "dplr": ops.dplr_attention(q, beta[..., None] * k, v, -beta[..., None] * k, gate * k, g,
                                 **kw),
      "kda": ops.kda(q, k, v, beta, jnp.broadcast_to(g[..., None], k.shape), **kw),
      "deltaproduct": ops.gated_deltaproduct(q, k[:, :, :, None], v[:, :, :, None],
                                             beta[..., None], g, **kw),
  }
  for name, out in got.items():
    helpers.assert_tree_close(out, want_gated, 1e-5, 1e-5, f"{name} against gated_deltanet")
  plain = ops.dplr_attention(q, beta[..., None] * k, v, -beta[..., None] * k, k, **kw)
  helpers.assert_tree_close(plain, want_plain, 1e-5, 1e-5, "dplr against deltanet")
  plain = ops.gated_deltaproduct(q, k[:, :, :, None], v[:, :, :, None], beta[..., None], **kw)
  helpers.assert_tree_close(plain, want_plain, 1e-5, 1e-5, "deltaproduct against deltanet")


def test_deltaproduct_is_gated_deltanet_on_the_interleaved_sequence():
  """R Householder steps per token = Gated DeltaNet over T R steps, the gate on each
  token's first step, the output read at its last (DeltaProduct's own construction)."""
  t, r = 11, 3
  rng = _rng(1)
  q = _normal(rng, B, t, H, K)
  k, v = _unit(_normal(rng, B, t, H, r, K)), _normal(rng, B, t, H, r, V)
  beta = jnp.asarray(rng.uniform(0.05, 1.95, (B, t, H, r)), F32)
  g = jax.nn.log_sigmoid(1.0 + _normal(rng, B, t, H))
  flat = lambda x: x.reshape((B, t * r) + x.shape[3:])
  q_flat = flat(jnp.broadcast_to(q[:, :, :, None], (B, t, H, r, K)).swapaxes(2, 3))
  g_flat = flat(jnp.concatenate([g[..., None], jnp.zeros((B, t, H, r - 1))], -1).swapaxes(2, 3))
  want, want_state = ops.gated_deltanet(
      q_flat, flat(k.swapaxes(2, 3)), flat(v.swapaxes(2, 3)), flat(beta.swapaxes(2, 3)), g_flat,
      form="recurrent", return_state=True)
  for form in FORMS:
    o, state = ops.gated_deltaproduct(q, k, v, beta, g, form=form, chunk_size=4,
                                      return_state=True)
    helpers.assert_close(o, want[:, r - 1::r], 1e-5, 1e-5, form)
    helpers.assert_close(state, want_state, 1e-5, 1e-5, form)


def _engine_inputs(seed, t, r, scale_ab=0.3):
  rng = _rng(seed)
  sub = (B, t, H, r)
  return (_normal(rng, B, t, H, K), _normal(rng, *sub, K, scale=0.5), _normal(rng, *sub, V),
          _normal(rng, *sub, K, scale=scale_ab), _normal(rng, *sub, K, scale=scale_ab))


def _plain_engine(q, k, v, a, b, g, s0, seg, scale):
  """Token by token, sub-step by sub-step, with explicit transition matrices (numpy, float64)."""
  q, k, v, a, b, g, s0 = (np.asarray(x, np.float64) for x in (q, k, v, a, b, g, s0))
  seg = np.asarray(seg)
  bsz, t, h, r, dk = k.shape
  o = np.zeros((bsz, t, h, v.shape[-1]))
  s = s0.copy()
  for i in range(t):
    for n in range(bsz):
      if i > 0 and seg[n, i] != seg[n, i - 1]:
        s[n] = 0.0
    for j in range(r):
      decay = np.exp(g[:, i]) if j == 0 else np.ones((bsz, h, dk))
      transition = (decay[..., :, None] * np.eye(dk)
                    + a[:, i, :, j, :, None] * b[:, i, :, j, None, :])
      s = transition @ s + k[:, i, :, j, :, None] * v[:, i, :, j, None, :]
    o[:, i] = scale * np.einsum("bhk,bhkv->bhv", q[:, i], s)
  return o, s


@pytest.mark.parametrize("r", [1, 2])
def test_engine_general_rank_against_a_plain_scan(r):
  """General a, b (not delta-like), per-channel decay, segments, an initial state, and
  chunks of 64 sub-steps (four sub-chunks of the in-chunk scores: the bridged pairs)."""
  t = 70
  q, k, v, a, b = _engine_inputs(2, t, r)
  rng = _rng(3)
  g = jax.nn.log_sigmoid(2.0 + _normal(rng, B, t, H, K))
  s0 = _normal(rng, B, H, K, V, scale=0.5)
  seg = jnp.asarray(np.stack([np.repeat([0, 1, 2], [25, 30, 15]), np.zeros(t, int)]), jnp.int32)
  want_o, want_s = _plain_engine(q, k, v, a, b, g, s0, seg, K**-0.5)
  for form in FORMS:
    o, s = ops.dplr_attention(q, k, v, a, b, g, form=form, chunk_size=64 // r, initial_state=s0,
                    return_state=True, segment_ids=seg)
    helpers.assert_close(o, want_o, 2e-4, 2e-4, form)
    helpers.assert_close(s, want_s, 2e-4, 2e-4, form)
  # The step function, token by token, from the same state (first 5 tokens, one segment).
  state = s0
  for i in range(5):
    o_t, state = ops.dplr_attention_step(state, q[:, i], k[:, i], v[:, i], a[:, i], b[:, i],
                                         g[:, i])
    helpers.assert_close(o_t, want_o[:, i], 2e-4, 2e-4, f"step {i}")


def test_chunk_blocks_carry_state_and_segments():
  """Long inputs run as blocks of ``_BLOCK_CHUNKS`` chunks with the state carried: chunks of 2
  tokens (4 sub-steps) make blocks of 128 tokens, so T = 270 is three blocks, with a segment
  running across the first boundary; equal to the recurrent form, gradients included."""
  from linear_attention.engines.dplr import engine
  assert engine._BLOCK_CHUNKS == 64  # the lengths below are chosen for it
  t = 270
  q, k, v, a, b = _engine_inputs(7, t, 2)
  rng = _rng(8)
  g = jax.nn.log_sigmoid(2.0 + _normal(rng, B, t, H, K))
  s0 = _normal(rng, B, H, K, V, scale=0.5)
  seg = jnp.asarray(np.stack([np.repeat([0, 1, 2], [100, 110, 60]), np.zeros(t, int)]), jnp.int32)
  def run(form, *xs):
    return ops.dplr_attention(*xs[:6], form=form, chunk_size=2, initial_state=xs[6],
                              return_state=True, segment_ids=seg)

  args = (q, k, v, a, b, g, s0)
  want = helpers.value_and_grads(lambda *x: run("recurrent", *x), args)
  got = helpers.value_and_grads(lambda *x: run("chunk", *x), args)
  helpers.assert_tree_close(got, want, 1e-4, 1e-4, "chunk blocks against recurrent")


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("variant", ["kda", "deltaproduct"])
def test_delta_maps_fast_path_is_the_general_engine(variant, form):
  """KDA and Gated DeltaProduct hand the engine ``a = None`` (``a = -`` the write key), whose
  chunk form computes its in-chunk scores once (``A_qa = -A_qk``, ``L_ba = -L_bk``): the same
  outputs, final state and gradients (the initial state's included) as the general engine
  given ``a = -`` the write key, with packed segments, an initial state and an odd length
  (37 tokens: chunks of 16 sub-steps, the last one short)."""
  from linear_attention.ops import dplr
  t = 37
  q, k, v, beta, g, s0, seg = _delta_inputs(21, t)
  rng = _rng(22)
  if variant == "kda":
    g = jax.nn.log_sigmoid(2.0 + _normal(rng, B, t, H, K))  # per channel
    fast_op, engine_map, chunk = ops.kda, dplr._kda_map, 16
  else:  # R = 2 steps per token
    k = jnp.stack([k, _unit(_normal(rng, B, t, H, K))], axis=3)
    v = jnp.stack([v, _normal(rng, B, t, H, V)], axis=3)
    beta = jnp.stack([beta, jnp.asarray(rng.uniform(0.05, 1.95, (B, t, H)), F32)], axis=-1)
    fast_op, engine_map, chunk = ops.gated_deltaproduct, dplr._deltaproduct_map, 8
  kw = dict(form=form, chunk_size=chunk, return_state=True, segment_ids=seg)

  wk, a, _ = engine_map(k, beta, g, F32)
  helpers.assert_close(a, -wk, 0, 0, "the map's a is minus its write key")

  def general(q, k, v, beta, g, s0):
    wk, a, b = engine_map(k, beta, g, F32)
    return ops.dplr_attention(q, wk, v, a, b, g, initial_state=s0, **kw)

  fast = lambda q, k, v, beta, g, s0: fast_op(q, k, v, beta, g, initial_state=s0, **kw)
  args = (q, k, v, beta, g, s0)
  helpers.assert_tree_close(helpers.value_and_grads(fast, args),
                            helpers.value_and_grads(general, args), 2e-5, 2e-5,
                            f"{variant} {form}")


@pytest.mark.parametrize("op", ["kda", "rwkv7"])
def test_strong_decay_is_finite_and_forms_agree(op):
  """Log decays down to -20 per step, some -inf, chunks of 32: no overflow, no NaN, the
  same outputs, states and gradients in every form."""
  t = 45
  rng = _rng(4)
  q, k, v = _normal(rng, B, t, H, K), _unit(_normal(rng, B, t, H, K)), _normal(rng, B, t, H, V)
  g = jnp.asarray(rng.uniform(-20.0, 0.0, (B, t, H, K)), F32)
  g = g.at[:, 7, :, 2].set(-jnp.inf).at[0, 20:].set(-20.0)
  s0 = _normal(rng, B, H, K, V)
  if op == "kda":
    beta = jnp.asarray(rng.uniform(0.05, 1.95, (B, t, H)), F32)
    run = lambda q, g, s0, form: ops.kda(q, k, v, beta, g, form=form, chunk_size=32,
                                         initial_state=s0, return_state=True)
  else:
    a = jnp.asarray(rng.uniform(0.05, 0.95, (B, t, H, K)), F32)
    kappa = _unit(_normal(rng, B, t, H, K))
    run = lambda q, g, s0, form: ops.rwkv7(q, k, v, g, kappa, a, form=form, chunk_size=32,
                                           initial_state=s0, return_state=True)
  results = {form: helpers.value_and_grads(lambda q, g, s0, form=form: run(q, g, s0, form),
                                           (q, g, s0)) for form in FORMS}
  for form in FORMS:
    for leaf in jax.tree_util.tree_leaves(results[form]):
      assert np.all(np.isfinite(np.asarray(leaf))), f"{op} {form}: non-finite"
  for form in ("parallel", "chunk"):
    helpers.assert_tree_close(results[form], results["recurrent"], 1e-4, 1e-4,
                              f"{op} {form} against recurrent")


def _paper_rwkv7(r, w, k, v, a, xi, alpha, rho, wkv0):
  """RWKV-7's time mixing as the paper writes it, per head with row vectors and
  ``wkv [V, K]`` (numpy, float64):

      kappa = k * xi;  kappa_hat = kappa / ||kappa||;  k_tilde = k * lerp(1, a, alpha)
      wkv_t = wkv_{t-1} (diag(w_t) - kappa_hat^T (a * kappa_hat)) + v_t^T k_tilde
      p_t   = wkv_t r_t^T + (r_t (rho * k_tilde)^T) v_t
  """
  r, w, k, v, a, xi, alpha, rho, wkv = (np.asarray(x, np.float64)
                                         for x in (r, w, k, v, a, xi, alpha, rho, wkv0))
  bsz, t, h, dk = r.shape
  out = np.zeros(v.shape)
  wkv = wkv.copy()
  for n in range(bsz):
    for head in range(h):
      s = wkv[n, head]
      for i in range(t):
        kap = k[n, i, head] * xi[head]
        kap_hat = kap / np.linalg.norm(kap)
        k_tilde = k[n, i, head] * (1.0 + (a[n, i, head] - 1.0) * alpha[head])
        g = np.diag(w[n, i, head]) - np.outer(kap_hat, a[n, i, head] * kap_hat)
        s = s @ g + np.outer(v[n, i, head], k_tilde)
        bonus = np.dot(r[n, i, head], rho[head] * k_tilde) * v[n, i, head]
        out[n, i, head] = s @ r[n, i, head] + bonus
      wkv[n, head] = s
  return out, wkv


@pytest.mark.parametrize("form", FORMS)
def test_rwkv7_matches_the_papers_equations(form):
  t = 21
  rng = _rng(5)
  r, k, v = _normal(rng, B, t, H, K), _normal(rng, B, t, H, K), _normal(rng, B, t, H, V)
  w = np.exp(-np.exp(-0.5) / (1.0 + np.exp(-rng.standard_normal((B, t, H, K)))))  # (0.545, 1)
  a = 1.0 / (1.0 + np.exp(-rng.standard_normal((B, t, H, K))))
  xi, alpha = _normal(rng, H, K, scale=0.5) + 1.0, jnp.asarray(rng.uniform(0, 2, (H, K)), F32)
  rho = _normal(rng, H, K, scale=0.5)
  wkv0 = _normal(rng, B, H, V, K, scale=0.5)
  want, want_wkv = _paper_rwkv7(r, w, k, v, a, xi, alpha, rho, wkv0)

  a = jnp.asarray(a, F32)
  kappa = _unit(k * xi)
  k_tilde = k * (1.0 + (a - 1.0) * alpha)
  o, state = ops.rwkv7(r, k_tilde, v, jnp.log(jnp.asarray(w, F32)), kappa, a, rho, form=form,
                       chunk_size=8, initial_state=jnp.swapaxes(wkv0, -1, -2),
                       return_state=True)
  helpers.assert_close(o, want, 1e-4, 1e-4, "output")
  helpers.assert_close(jnp.swapaxes(state, -1, -2), want_wkv, 1e-4, 1e-4, "state (wkv)")
  # The layer's split: the op without the bonus, plus rwkv7_bonus.
  o_plain = ops.rwkv7(r, k_tilde, v, jnp.log(jnp.asarray(w, F32)), kappa, a, form=form,
                      chunk_size=8, initial_state=jnp.swapaxes(wkv0, -1, -2))
  helpers.assert_close(o_plain + ops.rwkv7_bonus(r, k_tilde, v, rho), want, 1e-4, 1e-4, "split")


def test_bad_inputs_name_the_argument():
  t = 5
  q, k, v, a, b = _engine_inputs(6, t, 2)
  beta = jnp.full((B, t, H, 2), 0.5)
  cases = [
      (lambda: ops.dplr_attention(q, k, v, a[:, :, 0, 0], b), r"\ba must have shape"),
      (lambda: ops.dplr_attention(q, k, v, a, b[:, :, :, :1]), r"\bb must have shape"),
      (lambda: ops.dplr_attention(q, k[:, :, :, 0], v, a, b), r"\bk must have shape"),
      (lambda: ops.dplr_attention(q, k, v[:, :, :, 0], a, b), r"\bv must have shape"),
      (lambda: ops.dplr_attention(q, k, v, a, b, jnp.zeros((B, t, H, 2))), r"\blog_decay\b"),
      (lambda: ops.gated_deltaproduct(q, k[:, :, :, 0], v, beta), r"\bk must have shape"),
      (lambda: ops.gated_deltaproduct(q, k, v, beta[..., 0]), r"\bbeta must have shape"),
      (lambda: ops.gated_deltaproduct(q, k, v, 5.0 * beta), r"\bbeta must be >= 0 and <= 2"),
      (lambda: ops.gated_deltaproduct(q, k, v, beta, jnp.zeros((B, t, H, K))),
       r"\blog_decay must have shape"),
      (lambda: ops.kda(q, k[:, :, :, 0], v[:, :, :, 0], beta[..., 0], jnp.zeros((B, t, H))),
       r"\blog_alpha must have shape"),
      (lambda: ops.rwkv7(q, k[:, :, :, 0], v[:, :, :, 0], jnp.zeros((B, t, H, K)),
                         a[:, :, :, 0], a[:, :, :, 0], jnp.zeros((K,))),
       r"\bbonus must have shape"),
      (lambda: ops.rwkv7(q, k[:, :, :, 0], v[:, :, :, 0], jnp.zeros((B, t, H, K)),
                         a[:, :, :, 0, :4], a[:, :, :, 0]), r"\bkappa must have shape"),
      (lambda: ops.dplr_attention_step(jnp.zeros((B, H, K, V)), q[:, 0], k[:, 0], v[:, 0],
                                       a[:, 0, :, 0], b[:, 0]), r"\bb must have shape"),
  ]
  for i, (call, match) in enumerate(cases):
    with pytest.raises(ValueError, match=match):
      call()
      pytest.fail(f"case {i} ({match}) did not raise")



def test_default_chunk_size_by_backend(monkeypatch):
  """``chunk_size=None`` (the default) is 32 tokens on CPU and 64 elsewhere; a default call
  is the call with that size, bit for bit."""
  from linear_attention.ops import dplr
  for backend, want in (("cpu", 32), ("gpu", 64), ("tpu", 64)):
    monkeypatch.setattr(jax, "default_backend", lambda b=backend: b)
    assert dplr.resolve_chunk_size(None) == want, backend
    assert dplr.resolve_chunk_size(12) == 12
  monkeypatch.undo()
  t = 70  # three chunks of 32 on CPU, the last one short
  q, k, v, beta, g, s0, seg = _delta_inputs(12, t)
  log_alpha = jnp.broadcast_to(g[..., None], g.shape + (K,))
  kw = dict(initial_state=s0, return_state=True, segment_ids=seg, form="chunk")
  size = dplr.resolve_chunk_size(None)
  helpers.assert_tree_close(ops.kda(q, k, v[..., :K], beta, log_alpha, **kw),
                            ops.kda(q, k, v[..., :K], beta, log_alpha, chunk_size=size, **kw),
                            rtol=0, atol=0)


@pytest.mark.parametrize("name", ["intra_scores", "intra_scores_by_diagonals"])
@pytest.mark.parametrize("c", [64, 16, 12, 7])
def test_intra_scores_of_several_inputs_against_dense_pairs(c, name):
  """The chunk form's shared in-chunk scores (two row and two column inputs, one call) equal
  the dense ``sum_k x_ik y_jk exp(G_ik - G_jk)``, ``j <= i``, forward and gradient in float64,
  with sub-chunks of 8, 8, 4 (c = 12) and 1 (c = 7) (8, 4, 3, 1 by diagonals: the largest
  divisor at most ``sqrt(c)``), and steps down to the -inf floor."""
  from linear_attention import common
  if name == "intra_scores_by_diagonals":
    assert chunks._diagonal_subchunk(c) == {64: 8, 16: 4, 12: 3, 7: 1}[c]
  with jax.enable_x64(True):
    rng = _rng(c)
    x, y = (jnp.asarray(rng.standard_normal((2, 3, 2, c, 5))) for _ in range(2))
    g = jnp.asarray(-rng.uniform(0, 3, (2, 3, c, 5)))
    g = g.at[0, 0, c // 2].set(-jnp.inf).at[1, 2, 1, 3].set(-20.0)
    gc = jnp.cumsum(common.floor_log_decay(g), axis=-2)
    tri = np.tril(np.ones((c, c), bool))[..., None]

    def dense(x, y, gc):
      e = jnp.exp(jnp.where(tri, gc[..., :, None, :] - gc[..., None, :, :], -jnp.inf))
      return jnp.einsum("...rik,...pjk,...ijk->...rpij", x, y, e)

    ct = jnp.asarray(rng.standard_normal((2, 3, 2, 2, c, c)))
    loss = lambda f: lambda *a: jnp.sum(ct * f(*a))
    got = jax.value_and_grad(loss(getattr(chunks, name)), (0, 1, 2))(x, y, gc)
    want = jax.value_and_grad(loss(dense), (0, 1, 2))(x, y, gc)
    assert np.all(np.isfinite(np.asarray(got[0])))
    helpers.assert_tree_close(got, want, 1e-10, 1e-10, f"c={c}")
