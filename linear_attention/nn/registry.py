"""One registry of sequence mixers: ``make_mixer(name, d_model, num_heads, rngs=...)``.

Every entry builds a layer ``x [B, T, D] -> [B, T, D]`` and carries what the
rest of the project needs to know about it (:class:`MixerSpec`): whether it
is causal (decodes token by token with ``init_cache`` / ``decode_step``) or an
encoder mixer, its family and gating, its letter in hybrid patterns, the tiny
options the layer tests build it with, and the studies and benchmarks it
joins. Studies, benchmarks and tests select from here (:func:`select`), so a
new variant is one :class:`MixerSpec` entry below (see the README's "Adding a
variant").
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Mapping

from flax import nnx

from linear_attention.nn import attention, delta, gated, linear, recurrent, xlstm

FAMILIES = ("attention", "sparse", "lowrank", "linear", "decay", "delta", "ssm", "rnn")
GATINGS = ("none", "fixed", "data")
# What a mixer can join: the MQAR recall grid, the ListOps study, the byte-level
# LM corpus subset, the decode-latency and training-throughput benchmarks.
STUDIES = ("mqar", "listops", "lm_corpus", "bench_decode", "bench_train")


@dataclasses.dataclass(frozen=True)
class MixerSpec:
  """What the project knows about one mixer.

  Attributes:
    name: registry name (``model.mixer`` in configs).
    cls: the NNX layer class, called as ``cls(d_model, num_heads, rngs=..., **kwargs)``.
    family: the engine or kind it belongs to, one of :data:`FAMILIES`.
    gating: ``"none"`` (no decay), ``"fixed"`` (a decay that does not depend on
      the input, e.g. RetNet) or ``"data"`` (input-dependent gates or decays).
    causal: ``False`` for encoder mixers, which attend to the future and cannot decode.
    letter: its one-character code in hybrid patterns (``pattern="RRA"``), or ``None``.
    defaults: options that differ from the class's own defaults.
    tiny: options that make the layer small enough for the unit tests (T = 17, D = 32).
    studies: the studies and benchmarks it joins, a subset of :data:`STUDIES`.
  """
  name: str
  cls: Callable[..., Any]
  family: str
  gating: str = "none"
  causal: bool = True
  letter: str | None = None
  defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  tiny: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  studies: frozenset[str] = frozenset()

  def __post_init__(self):
    for field, value, valid in (("family", self.family, FAMILIES),
                                ("gating", self.gating, GATINGS)):
      if value not in valid:
        raise ValueError(f"MixerSpec {self.name!r}: {field} must be one of {valid}, got {value!r}.")
    bad = sorted(set(self.studies) - set(STUDIES))
    if bad:
      raise ValueError(f"MixerSpec {self.name!r}: unknown studies {bad}; valid: {STUDIES}.")


def _s(*names: str) -> frozenset[str]:
  return frozenset(names)


SPECS: tuple[MixerSpec, ...] = (
    MixerSpec("softmax", attention.SoftmaxAttention, "attention", letter="A",
              tiny=dict(num_kv_heads=1),
              studies=_s("mqar", "listops", "lm_corpus", "bench_decode", "bench_train")),
    MixerSpec("local", attention.LocalAttention, "sparse", letter="L", tiny=dict(window=5),
              studies=_s("bench_decode")),
    MixerSpec("linear", linear.LinearAttention, "linear", letter="K",
              studies=_s("mqar", "listops", "lm_corpus", "bench_decode")),
    MixerSpec("performer", linear.LinearAttention, "linear", letter="P",
              defaults=dict(feature_map="favor+"), tiny=dict(num_features=16),
              studies=_s("listops")),
    MixerSpec("retnet", gated.MultiScaleRetention, "decay", "fixed", letter="T",
              studies=_s("mqar", "bench_decode")),
    MixerSpec("gla", gated.GatedLinearAttention, "decay", "data", letter="G",
              tiny=dict(gate_low_rank=4),
              studies=_s("mqar", "listops", "lm_corpus", "bench_decode", "bench_train")),
    MixerSpec("hgrn2", gated.HGRN2, "decay", "data", letter="H"),
    MixerSpec("rwkv6", gated.RWKV6TimeMix, "decay", "data", letter="W",
              tiny=dict(mix_low_rank=4, decay_low_rank=8)),
    MixerSpec("mamba", recurrent.Mamba, "ssm", "data", letter="M", tiny=dict(d_state=8),
              studies=_s("mqar", "bench_decode")),
    MixerSpec("mamba2", gated.Mamba2, "decay", "data", letter="S", tiny=dict(d_state=8),
              studies=_s("mqar", "listops", "lm_corpus", "bench_decode", "bench_train")),
    MixerSpec("deltanet", delta.DeltaNet, "delta", letter="N", studies=_s("mqar")),
    MixerSpec("gated_deltanet", delta.GatedDeltaNet, "delta", "data", letter="D",
              studies=_s("mqar", "listops", "lm_corpus", "bench_decode")),
    MixerSpec("hawk", recurrent.HawkBlock, "rnn", "data", letter="R",
              studies=_s("mqar", "listops", "lm_corpus", "bench_decode", "bench_train")),
    MixerSpec("s4d", recurrent.S4DLayer, "ssm", "fixed", letter="4", tiny=dict(d_state=8)),
    MixerSpec("longformer", attention.LongformerAttention, "sparse", causal=False,
              tiny=dict(window=4, num_global=2), studies=_s("listops")),
    MixerSpec("bigbird", attention.BigBirdAttention, "sparse", causal=False,
              tiny=dict(block_size=2), studies=_s("listops")),
    MixerSpec("linformer", attention.LinformerAttention, "lowrank", causal=False,
              tiny=dict(max_len=17, proj_len=8), studies=_s("listops")),
    MixerSpec("rwkv7", delta.RWKV7TimeMix, "delta", "data", letter="7",
              tiny=dict(decay_low_rank=8, a_low_rank=8, gate_low_rank=8), studies=frozenset()),
    MixerSpec("kda", delta.KimiDeltaAttention, "delta", "data", letter="Z",
              tiny=dict(gate_low_rank=4), studies=frozenset()),
    MixerSpec("gated_deltaproduct", delta.GatedDeltaProduct, "delta", "data", letter="Y",
              tiny=dict(num_householder=2), studies=frozenset()),
    MixerSpec("based", linear.Based, "linear", letter="B", tiny=dict(feature_dim=4),
              studies=_s("mqar")),
    MixerSpec("rebased", linear.ReBased, "linear", letter="E", tiny=dict(feature_dim=4),
              studies=_s("mqar")),
    MixerSpec("forgetting", attention.ForgettingAttention, "attention", "data", letter="F",
              tiny=dict(num_kv_heads=1), studies=frozenset()),
    MixerSpec("mlstm", xlstm.MLSTM, "decay", "data", letter="X", studies=frozenset()),
    MixerSpec("loglinear_mamba2", gated.LogLinearMamba2, "decay", "data", letter="J",
              tiny=dict(d_state=8, num_levels=4), studies=frozenset()),
    MixerSpec("mlstm_layer", xlstm.MLSTMLayer, "decay", "data", studies=frozenset()),
    MixerSpec("gated_conv", recurrent.GatedShortConv, "rnn", "data", letter="C",
              studies=frozenset()),
    MixerSpec("mla", attention.MultiHeadLatentAttention, "attention", letter="Q",
              tiny=dict(kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
                        use_rope=True), studies=frozenset()),
    MixerSpec("lightning", gated.LightningAttention, "decay", "fixed", studies=frozenset()),
)

# The order is the order of every selection; studies name their runs by position in it, so
# append new variants rather than inserting them (a reordering renames finished runs).
_REGISTRY: dict[str, MixerSpec] = {s.name: s for s in SPECS}
if len(_REGISTRY) != len(SPECS):
  raise ValueError("duplicate mixer names in SPECS.")

MIXERS: tuple[str, ...] = tuple(_REGISTRY)
ENCODER_MIXERS: tuple[str, ...] = tuple(s.name for s in SPECS if not s.causal)
CAUSAL_MIXERS: tuple[str, ...] = tuple(s.name for s in SPECS if s.causal)

# Pattern letters of hybrid stacks (``LanguageModel(pattern="RRL")``).
PATTERN_LETTERS: dict[str, str] = {s.letter: s.name for s in SPECS if s.letter}
if len(PATTERN_LETTERS) != sum(1 for s in SPECS if s.letter):
  raise ValueError("two mixers share a pattern letter in SPECS.")

_FIXED = ("self", "d_model", "num_heads", "rngs")


def spec(name: str) -> MixerSpec:
  """The :class:`MixerSpec` of ``name``.

  Raises:
    ValueError: an unknown ``name`` (listing the valid ones).
  """
  if name not in _REGISTRY:
    raise ValueError(f"unknown mixer {name!r}; valid mixers: {list(MIXERS)}.")
  return _REGISTRY[name]


def select(*, study: str | None = None, family: str | None = None, gating: str | None = None,
           causal: bool | None = None, context_parallel: bool | None = None) -> tuple[str, ...]:
  """Mixer names, in registry order, that match every given criterion.

  Args:
    study: one of :data:`STUDIES`: the mixers that join it.
    family: one of :data:`FAMILIES`.
    gating: one of :data:`GATINGS`.
    causal: ``True`` for decoding mixers, ``False`` for encoder mixers.
    context_parallel: ``True`` for the mixers that run with the sequence sharded
      (``config.mesh.seq > 1``; their class declares it), ``False`` for the others
      (``nn.context_parallel.REFUSED`` says why).

  Returns:
    A tuple of names (possibly empty).

  Raises:
    ValueError: a criterion outside its valid values.
  """
  for arg, value, valid in (("study", study, STUDIES), ("family", family, FAMILIES),
                            ("gating", gating, GATINGS)):
    if value is not None and value not in valid:
      raise ValueError(f"{arg} must be one of {valid}, got {value!r}.")
  return tuple(s.name for s in SPECS
               if (study is None or study in s.studies)
               and (family is None or s.family == family)
               and (gating is None or s.gating == gating)
               and (causal is None or s.causal == causal)
               and (context_parallel is None or s.cls.context_parallel == context_parallel))


def mixer_kwargs(name: str) -> tuple[str, ...]:
  """The keyword arguments ``make_mixer(name, ...)`` accepts besides the fixed ones."""
  return tuple(p for p in inspect.signature(spec(name).cls.__init__).parameters
               if p not in _FIXED)


def make_mixer(name: str, d_model: int, num_heads: int = 1, *, rngs: nnx.Rngs,
               **kwargs) -> nnx.Module:
  """Builds the mixer ``name``.

  Args:
    name: one of :data:`MIXERS`.
    d_model: model width ``D``.
    num_heads: heads (ignored by the per-channel mixers ``mamba`` and ``s4d``).
    rngs: parameter PRNG streams.
    **kwargs: the layer's own options (see :func:`mixer_kwargs`), e.g.
      ``dtype``, ``param_dtype``, ``window``, ``feature_map``.

  Returns:
    The layer, mapping ``[B, T, D] -> [B, T, D]``.

  Raises:
    ValueError: for an unknown ``name`` (listing the valid ones) or a keyword
      the layer does not take (naming it and listing the valid ones).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from flax import nnx
    >>> from linear_attention import nn
    >>> layer = nn.make_mixer("gated_deltanet", 16, 2, rngs=nnx.Rngs(0))
    >>> x = jax.random.normal(jax.random.key(0), (1, 5, 16))  # [B, T, D]
    >>> y = layer(x)
    >>> y.shape
    (1, 5, 16)
    >>> cache = layer.init_cache(1, 5)
    >>> for t in range(5):  # decoding token by token gives the same outputs
    ...   y_t, cache = layer.decode_step(x[:, t], cache)
    >>> bool(jnp.allclose(y_t, y[:, 4], atol=1e-4))
    True
  """
  s = spec(name)
  valid = mixer_kwargs(name)
  bad = sorted(k for k in kwargs if k not in valid)
  if bad:
    raise ValueError(
        f"mixer {name!r} got invalid keyword argument(s) {bad}; valid: {list(valid)}.")
  return s.cls(d_model, num_heads, rngs=rngs, **{**s.defaults, **kwargs})
