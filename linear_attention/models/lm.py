"""Causal language model and sequence classifier over a stack of mixer blocks.

A stack is one mixer repeated (``mixer="gla"``) or a hybrid pattern of
letters (``pattern="RRL"``: Griffin's two recurrent blocks per local
attention; letters in ``linear_attention.nn.PATTERN_LETTERS``), repeated
cyclically to ``num_layers``. A model given layer by layer (real checkpoints) passes
``layers=``: a list of :class:`~linear_attention.models.blocks.LayerSpec`, one per block.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from linear_attention.models import stack
from linear_attention.models.blocks import Block, LayerSpec
from linear_attention.nn import modules
from linear_attention.nn import norm as norm_lib
from linear_attention.nn.mixer import check_positive
from linear_attention.nn import registry

Array = jax.Array


def check_token_ids(tokens: Any, vocab_size: int, name: str = "tokens") -> None:
  """Raises a ``ValueError`` unless ``tokens`` are integer ids in ``[0, vocab_size)``.

  The dtype is checked always; the values only where they are concrete (not under
  ``jit``), since an out-of-range id does not fail in the embedding: it gives NaN logits
  (id >= vocab) or wraps around (negative ids).
  """
  dtype = getattr(tokens, "dtype", None)
  if dtype is None or not jnp.issubdtype(dtype, jnp.integer):
    raise ValueError(f"{name} must be integer token ids, got "
                     f"{'dtype ' + str(dtype) if dtype is not None else type(tokens).__name__}.")
  if isinstance(tokens, jax.core.Tracer) or tokens.size == 0:
    return
  host = np.asarray(tokens)  # concrete: a constant even inside a traced function
  lo, hi = int(host.min()), int(host.max())
  if lo < 0 or hi >= vocab_size:
    raise ValueError(f"{name} holds token id {lo if lo < 0 else hi}, outside the vocabulary of "
                     f"size {vocab_size} (valid ids 0..{vocab_size - 1}).")


def resolve_pattern(num_layers: int | None, mixer: str | None = None,
                    pattern: str | Sequence[str] | None = None,
                    letters: Mapping[str, str] | None = None) -> tuple[str, ...]:
  """The mixer name of every layer.

  Args:
    num_layers: number of blocks; ``None`` means ``len(pattern)``.
    mixer: one registry name for every block (when ``pattern`` is None).
    pattern: a string of letters (``"RRA"``) or a sequence of registry names,
      repeated cyclically (and truncated) to ``num_layers``.
    letters: letter -> mixer name; default ``nn.PATTERN_LETTERS``.

  Raises:
    ValueError: unknown letters or names, or neither/both of ``mixer`` and ``pattern``.
  """
  if num_layers is not None:
    check_positive("num_layers (None: the pattern's length)", num_layers)
  if pattern is None:
    if mixer is None or num_layers is None:
      raise ValueError("give mixer= and num_layers=, or a pattern=.")
    names = (mixer,) * num_layers
  else:
    if isinstance(pattern, str):
      letters = registry.PATTERN_LETTERS if letters is None else letters
      unknown = sorted(set(c for c in pattern if c not in letters))
      if unknown:
        raise ValueError(f"unknown pattern letter(s) {unknown}; valid letters: {dict(letters)}.")
      unit = tuple(letters[c] for c in pattern)
    else:
      unit = tuple(pattern)
    if not unit:
      raise ValueError("pattern must not be empty.")
    n = len(unit) if num_layers is None else num_layers
    names = tuple(unit[i % len(unit)] for i in range(n))
  for name in set(names):
    if name not in registry.MIXERS:
      raise ValueError(f"unknown mixer {name!r}; valid mixers: {list(registry.MIXERS)}.")
  return names


def _check_scale(name: str, value) -> float:
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
    raise ValueError(f"{name} must be a number > 0, got {value!r}.")
  return float(value)


class Backbone(nnx.Module):
  """Token embedding, a stack of :class:`Block`, final RMSNorm: tokens -> hidden ``[B, T, D]``.

  ``mixer_kwargs`` maps a mixer name to the keyword arguments of every block
  using that mixer (e.g. ``{"local": {"window": 128}}``). ``short_conv`` (a width,
  0 for none) puts a depthwise causal convolution before every mixer (see
  :class:`~linear_attention.models.blocks.Block`).

  ``layers`` (a sequence of :class:`~linear_attention.models.blocks.LayerSpec`) gives every
  block its own mixer, heads, options and MLP instead; ``mixer``, ``pattern``,
  ``num_layers``, ``num_heads``, ``mlp_ratio``, ``mixer_kwargs`` and ``short_conv`` are then
  unused and must keep their defaults (``norm_eps`` is the final norm's, ``norm_offset``
  its zero-centred scale: 1 for ``1 + scale``, as the blocks' ``LayerSpec.norm_offset``).

  ``embed_scale`` multiplies the token embeddings (Granite's ``embedding_multiplier``,
  Gemma's ``sqrt(D)``).

  ``remat`` (``"none"``, ``"block"``,
  ``"mixer_only"`` or a ``jax.checkpoint_policies`` name) and ``scan_layers`` choose what
  the backward pass keeps and whether the stack is stored stacked and run as a scan over its
  repeating unit (``blocks`` is then a :class:`~linear_attention.models.stack.StackedBlocks`,
  whose parameters are the unscanned model's stacked; see
  :mod:`linear_attention.models.stack`); neither changes the values.
  """

  def __init__(self, vocab_size: int, d_model: int, num_layers: int | None = None, *,
               mixer: str | None = "softmax", pattern: str | Sequence[str] | None = None,
               num_heads: int = 4, mlp_ratio: float = 8 / 3,
               mixer_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
               pattern_letters: Mapping[str, str] | None = None, norm_eps: float = 1e-6,
               short_conv: int = 0, layers: Sequence[LayerSpec] | None = None,
               embed_scale: float = 1.0, norm_offset: float = 0.0, rngs: nnx.Rngs,
               dtype=None, param_dtype=jnp.float32,
               remat: str = "none", scan_layers: bool = False):
    check_positive("vocab_size", vocab_size)
    stack.check_remat(remat)
    self.remat, self.scan_layers = remat, bool(scan_layers)
    check_positive("d_model", d_model)
    self.embed_scale = _check_scale("embed_scale", embed_scale)
    if layers is not None:
      self._init_layers(vocab_size, d_model, layers, num_layers=num_layers, pattern=pattern,
                        mixer_kwargs=mixer_kwargs, short_conv=short_conv, norm_eps=norm_eps,
                        norm_offset=norm_offset, rngs=rngs, dtype=dtype,
                        param_dtype=param_dtype)
      self._stack_if_scanned()
      return
    if norm_offset:
      raise ValueError(f"norm_offset applies to models given by layers=, got {norm_offset!r}.")
    names = resolve_pattern(num_layers, mixer, pattern, pattern_letters)
    mixer_kwargs = dict(mixer_kwargs or {})
    unknown = sorted(set(mixer_kwargs) - set(registry.MIXERS))
    if unknown:
      raise ValueError(f"mixer_kwargs keys must be mixer names, got {unknown}; "
                       f"valid: {list(registry.MIXERS)}.")
    self.mixer_names = names
    self.d_model, self.vocab_size = d_model, vocab_size
    self.param_dtype = param_dtype
    self.embed = nnx.Embed(vocab_size, d_model, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.blocks = nnx.List([
        Block(d_model, name, num_heads, mlp_ratio=mlp_ratio,
              mixer_kwargs=mixer_kwargs.get(name), norm_eps=norm_eps, short_conv=short_conv,
              rngs=rngs, dtype=dtype,
              param_dtype=param_dtype) for name in names])
    self.final_norm = nnx.RMSNorm(d_model, epsilon=norm_eps, dtype=dtype,
                                  param_dtype=param_dtype, rngs=rngs)
    self._stack_if_scanned()

  def set_layout(self, *, remat: str, scan_layers: bool) -> None:
    """Sets ``remat`` and stores the blocks stacked (``scan_layers``, when they repeat) or one
    module per block, e.g. for an imported checkpoint built layer by layer, or to save a
    trained stacked model layer by layer; the values it computes are unchanged.

    Example:
      >>> from flax import nnx
      >>> bb = Backbone(32, 8, 4, mixer="gla", num_heads=2, rngs=nnx.Rngs(0))
      >>> bb.set_layout(remat="block", scan_layers=True)
      >>> type(bb.blocks).__name__, len(bb.blocks)
      ('StackedBlocks', 4)
      >>> bb.set_layout(remat="none", scan_layers=False)
      >>> type(bb.blocks).__name__
      'List'
    """
    stack.check_remat(remat)
    self.remat, self.scan_layers = remat, bool(scan_layers)
    stacked = isinstance(self.blocks, stack.StackedBlocks)
    if self.scan_layers and not stacked:
      self._stack_if_scanned()
    elif stacked and not self.scan_layers:
      self.blocks = nnx.List(list(self.blocks))

  def _stack_if_scanned(self):
    # Built layer by layer first, so the scanned model's parameters are the unscanned
    # model's (same keys, same order) stacked.
    if self.scan_layers:
      stacked = stack.stack_blocks(list(self.blocks))
      if stacked is not None:
        self.blocks = stacked

  def _init_layers(self, vocab_size, d_model, layers, *, num_layers, pattern, mixer_kwargs,
                   short_conv, norm_eps, norm_offset, rngs, dtype, param_dtype):
    layers = tuple(layers)
    if not layers or not all(isinstance(s, LayerSpec) for s in layers):
      raise ValueError(f"layers must be a non-empty sequence of LayerSpec, got "
                       f"{[type(s).__name__ for s in layers]}.")
    given = {k: v for k, v in dict(num_layers=num_layers, pattern=pattern,
                                   mixer_kwargs=mixer_kwargs).items() if v is not None}
    if short_conv:
      given["short_conv"] = short_conv
    if given:
      raise ValueError(f"layers= describes every block; do not also give {sorted(given)}.")
    self.mixer_names = tuple(s.mixer for s in layers)
    self.d_model, self.vocab_size = d_model, vocab_size
    self.param_dtype = param_dtype
    self.embed = nnx.Embed(vocab_size, d_model, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.blocks = nnx.List([Block.from_spec(d_model, s, rngs=rngs, dtype=dtype,
                                            param_dtype=param_dtype) for s in layers])
    self.final_norm = (norm_lib.RMSNorm(d_model, eps=norm_eps, offset=norm_offset,
                                        param_dtype=param_dtype) if norm_offset else
                       nnx.RMSNorm(d_model, epsilon=norm_eps, dtype=dtype,
                                   param_dtype=param_dtype, rngs=rngs))

  def run(self, x: Array, segment_ids: Array | None = None) -> Array:
    """Embedded ``x [B, T, D]`` through the blocks and the final norm."""
    x = stack.run_blocks(self.blocks, x, segment_ids, remat=self.remat)
    return self.final_norm(x)

  def __call__(self, tokens: Array, segment_ids: Array | None = None) -> Array:
    """``tokens [B, T]`` int -> hidden ``[B, T, D]``."""
    check_token_ids(tokens, self.vocab_size)
    return self.run(self.embed_tokens(tokens), segment_ids)

  def embed_tokens(self, tokens: Array) -> Array:
    """``tokens`` -> embeddings (times ``embed_scale``)."""
    x = self.embed(tokens)
    return x if self.embed_scale == 1.0 else x * self.embed_scale

  def init_cache(self, batch: int, max_len: int, dtype=None) -> list:
    """One cache per block (a list pytree)."""
    dtype = self.param_dtype if dtype is None else dtype
    return [blk.init_cache(batch, max_len, dtype) for blk in self.blocks]

  def decode_step(self, tokens: Array, cache: list) -> tuple[Array, list]:
    """``tokens [B]`` -> ``(hidden [B, D], cache)``."""
    check_token_ids(tokens, self.vocab_size)
    x = self.embed_tokens(tokens)
    new = []
    for blk, c in zip(self.blocks, cache):
      x, c = blk.decode_step(x, c)
      new.append(c)
    return self.final_norm(x), new


class LanguageModel(nnx.Module):
  """Causal language model: :class:`Backbone` then a (tied or separate) vocabulary head.

  Args:
    vocab_size: ``V``.
    d_model: ``D``.
    num_layers: blocks (``None`` with a pattern: ``len(pattern)``).
    mixer: registry name of every block, or
    pattern: hybrid letters such as ``"RRA"`` (see :func:`resolve_pattern`).
    num_heads, mlp_ratio, mixer_kwargs, pattern_letters, short_conv: see
      :class:`Backbone` and :class:`~linear_attention.models.blocks.Block`.
    tie_embeddings: reuse the embedding matrix as the output head.
    layers: one :class:`~linear_attention.models.blocks.LayerSpec` per block, instead of
      ``mixer``/``pattern`` and the shared options (see :class:`Backbone`).
    norm_offset: with ``layers``, 1 for a zero-centred final norm scale (``1 + scale``).
    embed_scale: multiplies the token embeddings.
    logit_scale: multiplies the logits (Granite's ``1 / logits_scaling``).
    logit_soft_cap: ``cap * tanh(logits / cap)`` on the (scaled) logits (Gemma's and
      xLSTM-7B's 30); None for none.
    remat, scan_layers: activation checkpointing and a scan over repeated blocks (see
      :class:`Backbone`).

  ``__call__(tokens [B, T]) -> logits [B, T, V]``; generation via
  ``init_cache(batch, max_len)`` and ``decode_step(tokens [B], cache) ->
  (logits [B, V], cache)``.

  Examples:
    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> from linear_attention.models import LanguageModel
    >>> # a hybrid: two GLA blocks, then softmax attention
    >>> model = LanguageModel(64, 16, pattern="GGA", num_heads=2, rngs=nnx.Rngs(0))
    >>> tokens = jnp.array([[1, 2, 3, 4]])
    >>> logits = model(tokens)
    >>> logits.shape  # [B, T, vocab]
    (1, 4, 64)
    >>> cache = model.init_cache(1, 4)
    >>> for t in range(4):
    ...   step_logits, cache = model.decode_step(tokens[:, t], cache)
    >>> bool(jnp.allclose(step_logits, logits[:, 3], atol=1e-4))
    True
  """

  def __init__(self, vocab_size: int, d_model: int, num_layers: int | None = None, *,
               mixer: str | None = "softmax", pattern: str | Sequence[str] | None = None,
               num_heads: int = 4, mlp_ratio: float = 8 / 3,
               mixer_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
               pattern_letters: Mapping[str, str] | None = None, tie_embeddings: bool = True,
               norm_eps: float = 1e-6, short_conv: int = 0,
               layers: Sequence[LayerSpec] | None = None, norm_offset: float = 0.0,
               embed_scale: float = 1.0, logit_scale: float = 1.0,
               logit_soft_cap: float | None = None, rngs: nnx.Rngs, dtype=None,
               param_dtype=jnp.float32, remat: str = "none", scan_layers: bool = False):
    modules.check_soft_cap("logit_soft_cap", logit_soft_cap)
    self.logit_soft_cap = None if logit_soft_cap is None else float(logit_soft_cap)
    self.backbone = Backbone(vocab_size, d_model, num_layers, mixer=mixer, pattern=pattern,
                             num_heads=num_heads, mlp_ratio=mlp_ratio, mixer_kwargs=mixer_kwargs,
                             pattern_letters=pattern_letters, norm_eps=norm_eps,
                             short_conv=short_conv, layers=layers, embed_scale=embed_scale,
                             norm_offset=norm_offset, rngs=rngs, dtype=dtype,
                             param_dtype=param_dtype, remat=remat, scan_layers=scan_layers)
    self.logit_scale = _check_scale("logit_scale", logit_scale)
    non_causal = [n for n in self.backbone.mixer_names if n in registry.ENCODER_MIXERS]
    if non_causal:
      raise ValueError(f"a causal language model cannot use the encoder mixers {non_causal}.")
    self.tie_embeddings = tie_embeddings
    self.lm_head = None if tie_embeddings else modules.dense(
        d_model, vocab_size, rngs=rngs, dtype=dtype, param_dtype=param_dtype)

  @property
  def mixer_names(self) -> tuple[str, ...]:
    """The mixer of every block, in order."""
    return self.backbone.mixer_names

  @property
  def vocab_size(self) -> int:
    """``V``: token ids are ``0 .. V-1``."""
    return self.backbone.vocab_size

  @property
  def blocks(self):
    """The blocks of the backbone, in order."""
    return self.backbone.blocks

  def _logits(self, h):
    logits = self.backbone.embed.attend(h) if self.lm_head is None else self.lm_head(h)
    logits = logits if self.logit_scale == 1.0 else logits * self.logit_scale
    return modules.soft_cap(logits, self.logit_soft_cap)

  def __call__(self, tokens: Array, segment_ids: Array | None = None,
               positions: Array | None = None) -> Array:
    """``tokens [B, T]`` -> logits ``[B, T, V]`` (compute dtype).

    ``positions [B, K]`` int: the logits at those positions only, ``[B, K, V]``. Tasks that
    are scored at a few positions per row (recall, copying) skip the ``[B, T, V]`` head,
    which dominates the cost with a large vocabulary.
    """
    h = self.backbone(tokens, segment_ids)
    if positions is not None:
      if positions.ndim != 2 or positions.shape[0] != tokens.shape[0]:
        raise ValueError(f"positions must be [B={tokens.shape[0]}, K] ints, got shape "
                         f"{positions.shape}.")
      h = jnp.take_along_axis(h, positions[..., None], axis=1)
    return self._logits(h)

  def init_cache(self, batch: int, max_len: int, dtype=None) -> list:
    """Per-block caches; recurrent states float32, KV caches in ``dtype`` (default: params)."""
    return self.backbone.init_cache(batch, max_len, dtype)

  def decode_step(self, tokens: Array, cache: list) -> tuple[Array, list]:
    """``tokens [B]`` int -> ``(logits [B, V], cache)``."""
    h, cache = self.backbone.decode_step(tokens, cache)
    return self._logits(h), cache

  def feed(self, tokens: Array, cache: list) -> tuple[Array, list]:
    """Feeds a prompt ``tokens [B, Tp]`` through the backbone's decode step, one position at
    a time (a ``lax.scan``): ``(logits [B, V] of the last position, cache)``.

    The same cache and last logits as :meth:`decode_step` at every position, with the
    vocabulary head run once instead of per token (per token it reads the whole ``[D, V]``
    head for one row).
    """
    def step(carry, tok):
      h, cache = self.backbone.decode_step(tok, carry[1])
      return (h, cache), None

    carry = self.backbone.decode_step(tokens[:, 0], cache)  # fixes the carry's dtype
    (h, cache), _ = jax.lax.scan(step, carry, tokens[:, 1:].T)
    return self._logits(h), cache


POOLINGS = ("mean", "cls", "last")


class SequenceClassifier(nnx.Module):
  """Sequence classifier: :class:`Backbone`, pooling, linear head.

  Pooling: ``"mean"`` over non-padding tokens (``mask [B, T]``, default all),
  ``"cls"`` a learned token prepended at position 0 whose output is used (for
  bidirectional mixers), ``"last"`` the last non-padding token (for causal ones).
  ``__call__(tokens [B, T], mask=None) -> logits [B, num_classes]``.
  """

  def __init__(self, vocab_size: int, num_classes: int, d_model: int,
               num_layers: int | None = None, *, mixer: str | None = "softmax",
               pattern: str | Sequence[str] | None = None, pooling: str = "mean",
               num_heads: int = 4, mlp_ratio: float = 8 / 3,
               mixer_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
               pattern_letters: Mapping[str, str] | None = None, norm_eps: float = 1e-6,
               short_conv: int = 0, rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32,
               remat: str = "none", scan_layers: bool = False):
    if pooling not in POOLINGS:
      raise ValueError(f"pooling must be one of {list(POOLINGS)}, got {pooling!r}.")
    check_positive("num_classes", num_classes)
    self.pooling = pooling
    self.backbone = Backbone(vocab_size, d_model, num_layers, mixer=mixer, pattern=pattern,
                             num_heads=num_heads, mlp_ratio=mlp_ratio, mixer_kwargs=mixer_kwargs,
                             pattern_letters=pattern_letters, norm_eps=norm_eps,
                             short_conv=short_conv, rngs=rngs,
                             dtype=dtype, param_dtype=param_dtype, remat=remat,
                             scan_layers=scan_layers)
    self.cls = (nnx.Param(0.02 * jax.random.normal(rngs.params(), (d_model,)).astype(param_dtype))
                if pooling == "cls" else None)
    self.head = modules.dense(d_model, num_classes, use_bias=True, rngs=rngs, dtype=dtype,
                           param_dtype=param_dtype)

  def __call__(self, tokens: Array, mask: Array | None = None) -> Array:
    """``tokens [B, T]`` int, optional bool ``mask`` broadcastable to ``[B, T]`` (True: real token) -> ``[B, C]``."""
    check_token_ids(tokens, self.backbone.vocab_size)
    b, t = tokens.shape
    mask = jnp.ones((b, t), bool) if mask is None else jnp.broadcast_to(mask.astype(bool), (b, t))
    x = self.backbone.embed_tokens(tokens)
    if self.cls is not None:
      cls = jnp.broadcast_to(self.cls[...].astype(x.dtype), (b, 1, x.shape[-1]))
      h = self.backbone.run(jnp.concatenate([cls, x], axis=1))
      pooled = h[:, 0]
    else:
      h = self.backbone.run(x)
      if self.pooling == "mean":
        w = mask.astype(jnp.float32)[..., None]
        pooled = (jnp.sum(h.astype(jnp.float32) * w, 1)
                  / jnp.maximum(jnp.sum(w, 1), 1.0)).astype(h.dtype)
      else:
        last = jnp.maximum(jnp.sum(mask, axis=1) - 1, 0)
        pooled = jnp.take_along_axis(h, last[:, None, None], axis=1)[:, 0]
    return self.head(pooled)


def count_params(model: nnx.Module, wrt=nnx.Param) -> int:
  """Number of scalars in the ``wrt`` variables of ``model`` (random features excluded)."""
  return int(sum(x.size for x in jax.tree_util.tree_leaves(nnx.state(model, wrt))))
