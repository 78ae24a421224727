"""Autoregressive generation with the recurrent / KV cache, compiled once.

The model is split into a graph definition (static) and its state (traced),
merged again inside ``jax.jit``; the prompt is fed token by token through
``decode_step`` (a ``lax.scan``), then new tokens are sampled in a second scan.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from linear_attention.models import lm
from linear_attention.nn.modules import RandomFeatures

Array = jax.Array


def sample_logits(logits: Array, key: Array, *, temperature: float = 1.0,
                  top_k: int | None = None) -> Array:
  """Samples ``[B]`` token ids from ``logits [B, V]``; ``temperature=0`` is greedy."""
  logits = logits.astype(jnp.float32)
  if temperature == 0:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  logits = logits / temperature
  if top_k is not None:
    kth = lax.top_k(logits, top_k)[0][..., -1:]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def shard_batch(tree, mesh: jax.sharding.Mesh | None, batch: int, axis: str = "data"):
  """Constrains every array of ``tree`` whose leading axis is ``batch`` to be split over the
  mesh axis ``axis`` (the rest replicated); ``tree`` unchanged when ``mesh`` is None.

  For caches and per-row arrays inside ``jit``: each device then keeps and updates only its
  rows' states, with no collective in a decode step.
  """
  if mesh is None:
    return tree
  rows = NamedSharding(mesh, P(axis))
  repl = NamedSharding(mesh, P())
  return jax.tree.map(
      lambda x: lax.with_sharding_constraint(x, rows if x.ndim and x.shape[0] == batch else repl),
      tree)


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "temperature",
                                             "top_k", "cache_dtype", "mesh"))
def _generate(graphdef, state, prompt, key, *, max_new_tokens, temperature, top_k, cache_dtype,
              mesh):
  model = nnx.merge(graphdef, state)
  b, tp = prompt.shape
  cache = shard_batch(model.init_cache(b, tp + max_new_tokens, cache_dtype), mesh, b)

  if hasattr(model, "feed"):  # the vocabulary head once, on the last prompt position
    last, cache = model.feed(prompt, cache)
  else:
    def feed(cache, tok):
      logits, cache = model.decode_step(tok, cache)
      return cache, logits

    cache, logits = lax.scan(feed, cache, prompt.T)
    last = logits[-1]

  def step(carry, k):
    logits, cache = carry
    tok = sample_logits(logits, k, temperature=temperature, top_k=top_k)
    logits, cache = model.decode_step(tok, cache)
    return (logits, cache), tok

  _, new = lax.scan(step, (last, cache), jax.random.split(key, max_new_tokens))
  return jnp.concatenate([prompt.astype(jnp.int32), new.T], axis=1)


def generate(model: nnx.Module, prompt: Array, max_new_tokens: int, *, temperature: float = 1.0,
             top_k: int | None = None, key: Array | None = None, cache_dtype=None,
             mesh: jax.sharding.Mesh | None = None) -> Array:
  """Extends ``prompt [B, Tp]`` by ``max_new_tokens`` sampled tokens.

  Args:
    model: a :class:`~linear_attention.models.lm.LanguageModel` (anything with
      ``init_cache(batch, max_len, dtype)`` and ``decode_step(tokens, cache)``).
    prompt: ``[B, Tp]`` int token ids, ``Tp >= 1``.
    max_new_tokens: tokens to add.
    temperature: softmax temperature; 0 means greedy.
    top_k: sample among the ``top_k`` most likely tokens only.
    key: PRNG key (needed unless greedy).
    cache_dtype: storage dtype of KV caches (default: the parameter dtype).
    mesh: decode at batch over devices: a mesh with a ``"data"`` axis whose size divides
      ``B``. The prompt's rows and every cache are split over it, the parameters
      replicated; the tokens equal the single-device ones. None: no sharding.

  Returns:
    ``[B, Tp + max_new_tokens]`` int32: the prompt then the new tokens.

  Raises:
    ValueError: a prompt that is not ``[B, Tp]`` integer ids, an id outside the model's
      vocabulary (checked when the prompt is concrete), ``max_new_tokens < 1``, a negative
      or non-finite ``temperature``, ``top_k`` outside ``1 .. vocab_size``, no ``key``
      when sampling, or a ``mesh`` without a ``"data"`` axis dividing ``B``.

  Examples:
    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> from linear_attention.models import LanguageModel, generate
    >>> model = LanguageModel(64, 16, mixer="gla", num_layers=2, num_heads=2, rngs=nnx.Rngs(0))
    >>> out = generate(model, jnp.array([[1, 2, 3]]), 4, temperature=0)  # greedy
    >>> out.shape  # the prompt, then 4 new tokens
    (1, 7)
    >>> out[:, :3].tolist()
    [[1, 2, 3]]
  """
  if getattr(prompt, "ndim", None) != 2 or prompt.shape[1] < 1:
    raise ValueError(f"prompt must have shape [B, Tp] with Tp >= 1, got "
                     f"{list(getattr(prompt, 'shape', [type(prompt).__name__]))}.")
  vocab = getattr(model, "vocab_size", None)
  if vocab is not None:
    lm.check_token_ids(prompt, vocab, "prompt")
  if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
    raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}.")
  if not (isinstance(temperature, (int, float)) and math.isfinite(temperature)
          and temperature >= 0):
    # A negative temperature would sample the inverted distribution.
    raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got "
                     f"{temperature!r}.")
  if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1
                            or (vocab is not None and top_k > vocab)):
    raise ValueError(f"top_k must be None or an int in 1..vocab_size={vocab}, got {top_k!r}.")
  if key is None:
    if temperature != 0:
      raise ValueError("key is required when sampling (temperature != 0).")
    key = jax.random.PRNGKey(0)
  graphdef, state = nnx.split(model)
  if mesh is not None:
    n = dict(mesh.shape).get("data")
    if n is None or prompt.shape[0] % n:
      raise ValueError(f"mesh must have a 'data' axis whose size divides the batch "
                       f"{prompt.shape[0]}, got mesh axes {dict(mesh.shape)}.")
    # Sharding constraints inside jit need Auto axes (jax.make_mesh's default is Explicit).
    mesh = jax.sharding.Mesh(mesh.devices, mesh.axis_names,
                             axis_types=(jax.sharding.AxisType.Auto,) * len(mesh.axis_names))
    prompt = jax.device_put(prompt, NamedSharding(mesh, P("data")))
    state = jax.device_put(state, NamedSharding(mesh, P()))
  return _generate(graphdef, state, prompt, key, max_new_tokens=int(max_new_tokens),
                   temperature=float(temperature), top_k=top_k, cache_dtype=cache_dtype,
                   mesh=mesh)


def redraw_random_features(model: nnx.Module, key: Array) -> int:
  """Redraws every :class:`RandomFeatures` projection in ``model``; returns how many."""
  n = 0
  for _, node in nnx.iter_graph(model):
    if isinstance(node, RandomFeatures):
      node.redraw(jax.random.fold_in(key, n))
      n += 1
  return n
