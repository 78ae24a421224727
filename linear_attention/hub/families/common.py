"""Config reading and weight-map pieces the families share."""

from __future__ import annotations

import math
from typing import Any, Mapping

from linear_attention.hub import core

_MISSING = object()


def get(config: Mapping[str, Any], key: str, default: Any = _MISSING) -> Any:
  """``config[key]``, or ``default`` (transformers' default for that family) when absent.

  Raises:
    ValueError: ``key`` absent and no default.
  """
  if key in config and config[key] is not None:
    return config[key]
  if default is _MISSING:
    raise ValueError(f"config.json of model_type {config.get('model_type')!r} needs {key!r}.")
  return default


def require(config: Mapping[str, Any], key: str, supported: Any, default: Any) -> None:
  """Raises a ``ValueError`` unless ``config[key]`` (or its default) equals ``supported``."""
  value = get(config, key, default)
  if value != supported:
    raise ValueError(f"config.json {key}={value!r} is not supported for model_type "
                     f"{config.get('model_type')!r} (supported: {supported!r}).")


def as_int(config: Mapping[str, Any], key: str, value: Any) -> int:
  """``value`` as an int, or a ``ValueError`` naming ``key`` when it is not integral."""
  if isinstance(value, bool) or not float(value).is_integer():
    raise ValueError(f"config.json {key} must give an integer, got {value!r}.")
  return int(value)


def number(value: Any) -> float:
  """A float from ``config.json``, where transformers 5 writes infinities as
  ``{"__float__": "Infinity"}``."""
  if isinstance(value, Mapping) and "__float__" in value:
    return float(value["__float__"])
  return float(value)


def dt_limit(config: Mapping[str, Any]) -> tuple[float, float] | None:
  """transformers' ``time_step_limit`` as ``Mamba2``'s ``dt_limit`` (None when it is (0, inf))."""
  low, high = (number(v) for v in get(config, "time_step_limit", (0.0, math.inf)))
  return None if (low <= 0 and math.isinf(high)) else (float(low), float(high))


def embeddings_and_head(config: Mapping[str, Any], embed: str, final_norm: str,
                        tie_default: bool) -> list:
  """Embedding, final norm and (untied) head; a tied head is an optional :class:`core.Alias`."""
  out = [core.same(embed, ("backbone", "embed", "embedding")),
         core.same(final_norm, ("backbone", "final_norm", "scale"))]
  if get(config, "tie_word_embeddings", tie_default):
    out.append(core.Alias("lm_head.weight", embed))
  else:
    out.append(core.linear("lm_head.weight", ("lm_head", "kernel")))
  return out
