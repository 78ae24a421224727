"""One registry of sequence mixers: ``make_mixer(name, d_model, num_heads, rngs=...)``.

Every entry builds a layer ``x [B, T, D] -> [B, T, D]``. ``CAUSAL_MIXERS``
can decode token by token (``init_cache`` / ``decode_step``); the encoder
mixers (``longformer``, ``bigbird``, ``linformer``) cannot.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping

from flax import nnx

from linear_attention.nn import attention, delta, gated, linear, recurrent

# name -> (layer class, defaults that differ from the class's own).
_REGISTRY: dict[str, tuple[Callable[..., Any], Mapping[str, Any]]] = {
    "softmax": (attention.SoftmaxAttention, {}),
    "local": (attention.LocalAttention, {}),
    "linear": (linear.LinearAttention, {}),
    "performer": (linear.LinearAttention, {"feature_map": "favor+"}),
    "gla": (gated.GatedLinearAttention, {}),
    "retnet": (gated.MultiScaleRetention, {}),
    "hgrn2": (gated.HGRN2, {}),
    "rwkv6": (gated.RWKV6TimeMix, {}),
    "mamba2": (gated.Mamba2, {}),
    "deltanet": (delta.DeltaNet, {}),
    "gated_deltanet": (delta.GatedDeltaNet, {}),
    "mamba": (recurrent.Mamba, {}),
    "hawk": (recurrent.HawkBlock, {}),
    "s4d": (recurrent.S4DLayer, {}),
    "longformer": (attention.LongformerAttention, {}),
    "bigbird": (attention.BigBirdAttention, {}),
    "linformer": (attention.LinformerAttention, {}),
}

MIXERS: tuple[str, ...] = tuple(_REGISTRY)
ENCODER_MIXERS: tuple[str, ...] = ("longformer", "bigbird", "linformer")
CAUSAL_MIXERS: tuple[str, ...] = tuple(n for n in MIXERS if n not in ENCODER_MIXERS)

# Pattern letters of hybrid stacks (``LanguageModel(pattern="RRL")``).
PATTERN_LETTERS: dict[str, str] = {
    "A": "softmax", "L": "local", "R": "hawk", "M": "mamba", "S": "mamba2", "G": "gla",
    "D": "gated_deltanet", "N": "deltanet", "T": "retnet", "H": "hgrn2", "W": "rwkv6",
    "K": "linear", "P": "performer", "4": "s4d",
}

_FIXED = ("self", "d_model", "num_heads", "rngs")


def mixer_kwargs(name: str) -> tuple[str, ...]:
  """The keyword arguments ``make_mixer(name, ...)`` accepts besides the fixed ones."""
  cls, _ = _lookup(name)
  return tuple(p for p in inspect.signature(cls.__init__).parameters if p not in _FIXED)


def _lookup(name: str):
  if name not in _REGISTRY:
    raise ValueError(f"unknown mixer {name!r}; valid mixers: {list(MIXERS)}.")
  return _REGISTRY[name]


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
  """
  cls, defaults = _lookup(name)
  valid = mixer_kwargs(name)
  bad = sorted(k for k in kwargs if k not in valid)
  if bad:
    raise ValueError(
        f"mixer {name!r} got invalid keyword argument(s) {bad}; valid: {list(valid)}.")
  return cls(d_model, num_heads, rngs=rngs, **{**defaults, **kwargs})
