"""Blocks, hybrid stacks, language model, classifier, generation with a cache."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from linear_attention import models
from linear_attention import nn as lnn
from tests import helpers

V, D, H = 41, 32, 2
SMALL = {"local": {"window": 4}, "mamba": {"d_state": 8}, "performer": {"num_features": 16}}


def lm(**kw):
  args = dict(num_heads=H, mixer_kwargs=SMALL, rngs=nnx.Rngs(0))
  args.update(kw)
  return models.LanguageModel(V, D, **args)


def tokens(b=2, t=11, seed=0):
  return jax.random.randint(jax.random.PRNGKey(seed), (b, t), 0, V)


@functools.partial(jax.jit, static_argnums=0)
def _logits(graphdef, state, toks):
  return nnx.merge(graphdef, state)(toks)


@functools.partial(jax.jit, static_argnums=0)
def _decode_logits(graphdef, state, toks):
  model = nnx.merge(graphdef, state)

  def body(cache, tok):
    logits, cache = model.decode_step(tok, cache)
    return cache, logits

  _, out = jax.lax.scan(body, model.init_cache(toks.shape[0], toks.shape[1]), toks.T)
  return jnp.swapaxes(out, 0, 1)


def test_hybrid_pattern_builds_blocks_in_order():
  model = lm(pattern="RRAM", num_layers=6)
  assert model.mixer_names == ("hawk", "hawk", "softmax", "mamba", "hawk", "hawk")
  kinds = [type(b.mixer) for b in model.blocks]
  assert kinds == [lnn.HawkBlock, lnn.HawkBlock, lnn.SoftmaxAttention, lnn.Mamba,
                   lnn.HawkBlock, lnn.HawkBlock]
  assert lm(pattern="RL").mixer_names == ("hawk", "local")  # num_layers defaults to len
  assert lm(pattern=["gla", "softmax"], num_layers=3).mixer_names == ("gla", "softmax", "gla")
  assert models.resolve_pattern(2, "gla") == ("gla", "gla")


def test_pattern_and_config_errors():
  unused = next(c for c in "QVUOIC" if c not in lnn.PATTERN_LETTERS)
  with pytest.raises(ValueError, match="letter"):
    lm(pattern=f"R{unused}A")
  with pytest.raises(ValueError, match="unknown mixer"):
    lm(mixer="transformerx", num_layers=1)
  with pytest.raises(ValueError, match="encoder mixers"):
    lm(mixer="linformer", num_layers=1)
  with pytest.raises(ValueError, match="mixer_kwargs"):
    lm(mixer="gla", num_layers=1, mixer_kwargs={"window": 3})


def test_language_model_forward_and_tied_embeddings():
  tied = lm(mixer="gla", num_layers=2)
  untied = lm(mixer="gla", num_layers=2, tie_embeddings=False)
  out = tied(tokens())
  assert out.shape == (2, 11, V) and out.dtype == jnp.float32
  assert models.count_params(untied) == models.count_params(tied) + D * V
  assert tied.lm_head is None


def test_logits_at_positions_are_the_forward_logits_there():
  model = lm(mixer="gla", num_layers=1)
  toks = tokens()
  pos = jnp.array([[0, 5, 10], [3, 3, 1]])
  np.testing.assert_allclose(model(toks, positions=pos),
                             jnp.take_along_axis(model(toks), pos[..., None], axis=1), rtol=1e-6)
  with pytest.raises(ValueError, match="positions"):
    model(toks, positions=pos[0])


def test_hybrid_decode_matches_forward():
  model = lm(pattern="RLSPA", mixer_kwargs={**SMALL, "mamba2": {"d_state": 8}})
  toks = tokens(t=13)
  graphdef, state = nnx.split(model)
  helpers.assert_close(_decode_logits(graphdef, state, toks), _logits(graphdef, state, toks),
                       rtol=1e-4, atol=3e-4)


@pytest.mark.parametrize("t", [1, 5])
def test_feed_equals_decode_step_at_every_position(t):
  """``feed`` (head on the last position only) gives the last logits and the cache that
  ``decode_step`` gives token by token."""
  model = lm(pattern="RLA", mixer_kwargs={**SMALL})
  toks = tokens(t=t)
  cache = model.init_cache(toks.shape[0], 8)
  for i in range(t):
    logits, cache = model.decode_step(toks[:, i], cache)
  fed, fed_cache = model.feed(toks, model.init_cache(toks.shape[0], 8))
  np.testing.assert_allclose(fed, logits, rtol=1e-5, atol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5),
               fed_cache, cache)


def test_generate_greedy_is_argmax_of_forward():
  model = lm(pattern="RA", num_layers=2)
  prompt = tokens(t=4)
  out = models.generate(model, prompt, 6, temperature=0.0)
  assert out.shape == (2, 10) and out.dtype == jnp.int32
  np.testing.assert_array_equal(out[:, :4], prompt)
  # Teacher forcing the generated sequence: each new token is the argmax of its prefix.
  logits = model(out)
  np.testing.assert_array_equal(out[:, 4:], jnp.argmax(logits[:, 3:-1], axis=-1))
  # top_k=1 sampling is greedy; sampling is reproducible from the key.
  k1 = models.generate(model, prompt, 6, temperature=1.0, top_k=1, key=jax.random.PRNGKey(3))
  np.testing.assert_array_equal(k1, out)
  s1 = models.generate(model, prompt, 6, temperature=1.0, key=jax.random.PRNGKey(5))
  s2 = models.generate(model, prompt, 6, temperature=1.0, key=jax.random.PRNGKey(5))
  np.testing.assert_array_equal(s1, s2)
  assert int(s1.min()) >= 0 and int(s1.max()) < V


def test_generate_rejects_bad_arguments():
  model = lm(mixer="gla", num_layers=1)
  with pytest.raises(ValueError, match="key"):
    models.generate(model, tokens(t=2), 3, temperature=1.0)
  with pytest.raises(ValueError, match="prompt"):
    models.generate(model, tokens()[0], 3, temperature=0.0)


@pytest.mark.parametrize("kw,match", [
    (dict(temperature=-0.5), "temperature must be a finite number >= 0"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_k=0), "top_k must be None or an int in 1..vocab_size=41, got 0"),
    (dict(top_k=V + 1), "top_k .* got 42"),
])
def test_generate_refuses_bad_sampling_arguments_by_name(kw, match):
  with pytest.raises(ValueError, match=match):
    models.generate(lm(mixer="gla", num_layers=1), tokens(t=2), 3, key=jax.random.PRNGKey(0),
                    **kw)


@pytest.mark.parametrize("bad", [V, V + 7, -1])
def test_token_ids_outside_the_vocabulary_are_refused_with_the_id_and_size(bad):
  model = lm(mixer="gla", num_layers=1)
  prompt = tokens(t=3).at[1, 2].set(bad)
  with pytest.raises(ValueError, match=f"prompt holds token id {bad}, outside the vocabulary "
                                       f"of size {V}"):
    models.generate(model, prompt, 2, temperature=0.0)
  with pytest.raises(ValueError, match=f"token id {bad}.*size {V}"):
    model(prompt)  # eager forward: concrete ids are checked too
  with pytest.raises(ValueError, match="integer token ids"):
    models.generate(model, prompt.astype(jnp.float32), 2, temperature=0.0)


@pytest.mark.parametrize("kw,match", [
    (dict(vocab_size=0), "vocab_size must be an int >= 1, got 0"),
    (dict(d_model=0), "d_model must be an int >= 1, got 0"),
    (dict(num_layers=0), "num_layers .* must be an int >= 1"),
    (dict(num_heads=0), "num_heads must be an int >= 1, got 0"),
])
def test_model_sizes_are_checked_by_name(kw, match):
  args = dict(vocab_size=V, d_model=D, num_layers=1, num_heads=H)
  args.update(kw)
  with pytest.raises(ValueError, match=match):
    models.LanguageModel(args.pop("vocab_size"), args.pop("d_model"), args.pop("num_layers"),
                         mixer="gla", rngs=nnx.Rngs(0), **args)


@pytest.mark.parametrize("mixer", ["softmax", "local"])
def test_decoding_past_the_cache_raises_eagerly_and_flags_under_jit(mixer):
  model = lm(mixer=mixer, num_layers=1, mixer_kwargs={"local": {"window": 8}})
  tok = jnp.zeros((1,), jnp.int32)
  cache = model.init_cache(1, 2)
  for _ in range(2):
    _, cache = model.decode_step(tok, cache)
  with pytest.raises(ValueError, match="position 2, but the cache was made by "
                                       "init_cache\\(max_len=2\\)"):
    model.decode_step(tok, cache)

  graphdef, state = nnx.split(model)

  @jax.jit
  def decode(state, cache):
    m = nnx.merge(graphdef, state)
    out = []
    for _ in range(5):
      logits, cache = m.decode_step(tok, cache)
      out.append(logits)
    return jnp.stack(out), cache

  logits, cache = decode(state, model.init_cache(1, 2))
  assert bool(jnp.all(jnp.isfinite(logits)))  # clamped, never NaN
  assert bool(lnn.mixer.cache_overflowed(cache))
  exact, fits = decode(state, model.init_cache(1, 5))
  assert not bool(lnn.mixer.cache_overflowed(fits))
  helpers.assert_close(logits[:2], exact[:2])  # within the limit nothing changed


def test_a_local_cache_as_long_as_the_window_decodes_forever():
  model = lm(mixer="local", num_layers=1)  # window 4
  cache = model.init_cache(1, 4)
  for _ in range(9):
    _, cache = model.decode_step(jnp.zeros((1,), jnp.int32), cache)
  assert not bool(lnn.mixer.cache_overflowed(cache))


def test_mean_pooling_ignores_padding():
  # A causal mixer: the hidden states of the real tokens do not see the padding, so the
  # padded, masked row must pool to the unpadded row.
  clf = models.SequenceClassifier(V, 3, D, 1, mixer="gla", pooling="mean", num_heads=H,
                                  rngs=nnx.Rngs(0))
  toks = tokens(t=11)
  padded = toks.at[:, 7:].set(5)
  mask = jnp.broadcast_to(jnp.arange(11) < 7, (2, 11))
  helpers.assert_close(clf(padded, mask=mask), clf(toks[:, :7]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("pooling,mixer", [("mean", "linformer"), ("cls", "longformer"),
                                           ("last", "gla")])
def test_classifier(pooling, mixer):
  kw = {"linformer": {"max_len": 12, "proj_len": 4}, "longformer": {"window": 3}}
  clf = models.SequenceClassifier(V, 3, D, 1, mixer=mixer, pooling=pooling, num_heads=H,
                                  mixer_kwargs=kw, rngs=nnx.Rngs(0))
  toks = tokens(t=11)
  out = clf(toks)
  assert out.shape == (2, 3) and bool(jnp.all(jnp.isfinite(out)))
  if pooling == "last":
    # Causal mixer: tokens after the last real one cannot change the result.
    mask = jnp.arange(11) < 7
    changed = toks.at[:, 7:].set(0)
    helpers.assert_close(clf(toks, mask=mask), clf(changed, mask=mask))


def test_bfloat16_model():
  model = lm(pattern="RA", param_dtype=jnp.bfloat16, dtype=jnp.bfloat16)
  toks = tokens(t=6)
  assert model(toks).dtype == jnp.bfloat16
  cache = model.init_cache(2, 6)
  logits, cache = model.decode_step(toks[:, 0], cache)
  assert logits.dtype == jnp.bfloat16
  assert cache[0]["state"].dtype == jnp.float32  # Hawk's RG-LRU state
  assert cache[1]["k"].dtype == jnp.bfloat16  # the KV cache follows the params


def test_count_params_and_redraw():
  model = lm(pattern="P", num_layers=2)
  n = models.count_params(model)
  everything = sum(x.size for x in jax.tree_util.tree_leaves(nnx.state(model)))
  proj = model.blocks[0].mixer.projection[...]
  assert everything == n + 2 * proj.size  # random features are state, not parameters
  assert models.redraw_random_features(model, jax.random.PRNGKey(9)) == 2
  assert not np.allclose(proj, model.blocks[0].mixer.projection[...])
  b0, b1 = (blk.mixer.projection[...] for blk in model.blocks)
  assert not np.allclose(b0, b1)  # each layer gets its own draw
