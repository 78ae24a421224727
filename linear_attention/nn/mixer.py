"""The mixer interface and the argument checks every mixer shares.

Every mixer layer maps ``x [B, T, D] -> y [B, T, D]`` (``__call__``) and, when
it is causal, decodes one token at a time with an explicit cache::

    cache = layer.init_cache(batch, max_len, dtype)   # a pytree of arrays
    y_t, cache = layer.decode_step(x_t, cache)        # x_t, y_t: [B, D]

The cache is a plain dict of arrays, so it travels through ``jax.jit`` and
``lax.scan`` unchanged in structure and dtypes. Recurrent states are float32
(complex64 for S4D) whatever ``dtype`` is; ``dtype`` only sets the storage of
cached activations (keys and values of the attention caches).
"""

from __future__ import annotations

import functools
import math
import operator
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from linear_attention.nn import context_parallel

Array = jax.Array
Dtype = Any


def check_positive(name: str, value: Any) -> None:
  """Raises a ``ValueError`` naming ``name`` unless ``value`` is an integer >= 1 (a Python or
  NumPy int, not a bool or a float)."""
  try:
    ok = not isinstance(value, bool) and operator.index(value) >= 1
  except TypeError:
    ok = False
  if not ok:
    raise ValueError(f"{name} must be an int >= 1, got {value!r}.")


def check_features(name: str, x: Any, width: int, rank: int, layout: str) -> None:
  """Raises a ``ValueError`` naming ``name`` unless ``x`` is a floating array of ``rank``
  dimensions whose last one is ``width``. Shapes and dtypes are static, so this also holds
  under ``jit``."""
  shape = getattr(x, "shape", None)
  if shape is None or len(shape) != rank:
    raise ValueError(f"{name} must have shape {layout} (rank {rank}), got "
                     f"{'a ' + type(x).__name__ if shape is None else f'shape {tuple(shape)}'}.")
  if shape[-1] != width:
    raise ValueError(f"{name} must have shape {layout} with d_model={width} last, got shape "
                     f"{tuple(shape)}.")
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise ValueError(f"{name} must be a floating-point array (embedded tokens), got dtype "
                     f"{x.dtype}; embed integer token ids first (e.g. nnx.Embed).")


def check_divisible(name: str, value: int, by_name: str, by: int) -> None:
  """Raises a ``ValueError`` unless ``by`` divides ``value``."""
  if by <= 0 or value % by:
    raise ValueError(f"{name}={value} must be divisible by {by_name}={by}.")


# Options that several layers share, checked once by name (None: the layer computes it).
_POSITIVE_INTS = frozenset((
    "chunk_size", "d_state", "conv_width", "gate_low_rank", "mix_low_rank", "decay_low_rank",
    "a_low_rank", "num_householder", "num_levels", "ngroups", "qkv_block_size", "feature_dim",
    "block_size", "window", "head_dim", "num_kv_heads", "num_features", "proj_len", "max_len",
    "lru_width", "dt_rank", "num_window_blocks"))
_NON_NEGATIVE_INTS = frozenset(("seed", "num_global", "num_global_blocks", "num_random_blocks"))
_POSITIVE_NUMBERS = frozenset((
    "norm_eps", "qk_norm_eps", "dt_min", "dt_max", "dt_init_floor", "rope_base", "c", "gate_logit_normalizer",
    "a_init_scale", "expand", "expand_k", "expand_v", "slope_scale"))


def check_options(layer: str, options: dict) -> None:
  """Raises a ``ValueError`` naming ``layer`` and the option when one of the shared options
  in ``options`` is out of its range (a non-positive size or epsilon gives a shape error or
  NaN much later, far from its cause)."""
  for name, value in options.items():
    if value is None:
      continue
    if name in _POSITIVE_INTS or name in _NON_NEGATIVE_INTS:
      low = 1 if name in _POSITIVE_INTS else 0
      try:
        ok = not isinstance(value, bool) and operator.index(value) >= low
      except TypeError:
        ok = False
      if not ok:
        raise ValueError(f"{layer} option {name} must be an int >= {low}, got {value!r}.")
    elif name in _POSITIVE_NUMBERS:
      ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0)
      if not ok:
        raise ValueError(f"{layer} option {name} must be a finite number > 0, got {value!r}.")


def _checked_init(init):
  @functools.wraps(init)
  def wrapper(self, d_model, num_heads=1, *args, **kwargs):
    check_positive("d_model", d_model)
    check_positive("num_heads", num_heads)
    check_options(type(self).__name__, kwargs)
    init(self, d_model, num_heads, *args, **kwargs)
    self.d_model = d_model
  wrapper._mixer_checked = True
  return wrapper


def _checked_call(call):
  @functools.wraps(call)
  def wrapper(self, x, *args, **kwargs):
    check_features("x", x, self.d_model, 3, "[batch, seq, d_model]")
    check_context_parallel(self)
    return call(self, x, *args, **kwargs)
  wrapper._mixer_checked = True
  return wrapper


def _checked_decode(decode):
  @functools.wraps(decode)
  def wrapper(self, x, cache, *args, **kwargs):
    check_features("x", x, self.d_model, 2, "[batch, d_model]")
    return decode(self, x, cache, *args, **kwargs)
  wrapper._mixer_checked = True
  return wrapper


class Mixer(nnx.Module):
  """Base class of the sequence mixers: documents the interface and checks its arguments.

  Subclasses set ``self.causal`` and implement ``__init__(d_model, num_heads, ...)``,
  ``__call__(x [B, T, D], segment_ids=None)`` and, when causal, ``init_cache`` and
  ``decode_step(x [B, D], cache)``. Each of these a subclass defines is wrapped once, here,
  with the shared argument checks (``d_model`` and ``num_heads`` >= 1; ``x`` floating, of
  the right rank and width), so no layer repeats them and every layer names the argument.

  ``context_parallel = True`` declares that the layer runs with the sequence sharded over
  a ``"seq"`` mesh axis (every op that mixes tokens gets
  ``context=``:func:`~linear_attention.nn.context_parallel.context`). It is not
  inherited: a subclass that changes how it mixes tokens must declare it again, and until
  then it refuses a sharded sequence with a ``ValueError`` naming it.
  """

  causal: bool = True
  context_parallel: bool = False

  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    if "context_parallel" not in cls.__dict__:
      cls.context_parallel = False
    for name, wrap in (("__init__", _checked_init), ("__call__", _checked_call),
                       ("decode_step", _checked_decode)):
      fn = cls.__dict__.get(name)
      if fn is not None and not getattr(fn, "_mixer_checked", False):
        setattr(cls, name, wrap(fn))

  def init_cache(self, batch: int, max_len: int, dtype: Dtype = jnp.float32) -> dict:
    """An empty decoding cache for ``batch`` rows and up to ``max_len`` tokens."""
    raise NotImplementedError(
        f"{type(self).__name__} (causal={self.causal}) has no decoding cache: only causal "
        "mixers can generate token by token.")

  def decode_step(self, x: Array, cache: dict) -> tuple[Array, dict]:
    """One token ``x [B, D]`` in, ``(y [B, D], new_cache)`` out."""
    raise NotImplementedError(
        f"{type(self).__name__} (causal={self.causal}) cannot decode token by token.")


def _subclasses(cls) -> list[type]:
  out = []
  for sub in cls.__subclasses__():
    out += [sub] + _subclasses(sub)
  return out


def check_context_parallel(layer: Mixer) -> None:
  """Raises a ``ValueError`` naming ``layer``'s class when the sequence is sharded and the
  class does not declare ``context_parallel = True``."""
  n = context_parallel.seq_size()
  if n > 1 and not type(layer).context_parallel:
    able = sorted({c.__name__ for c in _subclasses(Mixer) if c.context_parallel})
    raise ValueError(
        f"mixer {type(layer).__name__} cannot run with the sequence sharded over mesh axis "
        f"{context_parallel.SEQ!r} ({n} devices, config.mesh.seq); context-parallel mixer "
        f"classes: {able}. Use config.mesh.seq=1 for this model.")


def cache_overflowed(cache: Any) -> Array:
  """True where any attention cache in ``cache`` (a layer's or a model's list of them) was
  decoded past its ``init_cache(max_len)``: a bool scalar, usable under ``jit``."""
  flags = [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(cache)
           if getattr(path[-1], "key", None) == "overflow"]
  return jnp.any(jnp.stack(flags)) if flags else jnp.zeros((), bool)
