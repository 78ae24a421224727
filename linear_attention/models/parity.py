"""Size parity: give every mixer the same parameter budget.

Comparisons between mixers are only fair at equal size, but the mixers'
own parameter counts differ (RetNet's gates and group norms, Mamba's
in-projection, ...). The MLP of each block absorbs the difference: for a
model of a given width and depth, :func:`matched_mlp_ratio` returns the MLP
ratio that brings the model's total to the reference model's (softmax
attention with the default ``8/3`` GLU MLP), within the MLP's rounding of 8
hidden units per layer.

Parameter counts come from ``nnx.eval_shape``: nothing is allocated.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax.numpy as jnp
from flax import nnx

from linear_attention.models.blocks import mlp_hidden
from linear_attention.models.lm import LanguageModel, count_params, resolve_pattern
from linear_attention.nn import registry

DEFAULT_MLP_RATIO = 8 / 3


def mixer_param_count(name: str, d_model: int, num_heads: int,
                      mixer_kwargs: Mapping[str, Any] | None = None) -> int:
  """Parameters of one mixer ``name`` (random features excluded), counted abstractly."""
  layer = nnx.eval_shape(lambda: registry.make_mixer(
      name, d_model, num_heads, rngs=nnx.Rngs(0), **dict(mixer_kwargs or {})))
  return count_params(layer)


def lm_param_count(vocab_size: int, d_model: int, num_layers: int | None = None, **kwargs) -> int:
  """Parameters of ``LanguageModel(vocab_size, d_model, num_layers, **kwargs)``, counted abstractly."""
  model = nnx.eval_shape(lambda: LanguageModel(vocab_size, d_model, num_layers, rngs=nnx.Rngs(0),
                                               **kwargs))
  return count_params(model)


def matched_mlp_ratio(vocab_size: int, d_model: int, num_layers: int | None = None, *,
                      mixer: str | None = None, pattern: str | Sequence[str] | None = None,
                      num_heads: int = 4,
                      mixer_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
                      reference: str = "softmax",
                      reference_mlp_ratio: float = DEFAULT_MLP_RATIO,
                      tie_embeddings: bool = True) -> float:
  """The MLP ratio at which the model has the reference model's parameter count.

  Args:
    vocab_size, d_model, num_layers, mixer, pattern, num_heads, mixer_kwargs,
      tie_embeddings: the model, as for :class:`LanguageModel`.
    reference: the mixer of the reference model (same width, depth, heads).
    reference_mlp_ratio: the reference model's MLP ratio.

  Returns:
    A ratio ``r`` such that ``mlp_hidden(d_model, r)`` is a multiple of 8;
    the model built with ``mlp_ratio=r`` is within ``3 * 8 * d_model``
    parameters per layer of the reference.

  Raises:
    ValueError: when the mixers alone exceed the reference budget (no MLP
      width can match it).
  """
  names = resolve_pattern(num_layers, mixer, pattern)
  kwargs = dict(mixer_kwargs or {})
  depth = len(names)
  ref_hidden = mlp_hidden(d_model, reference_mlp_ratio)
  budget = depth * (mixer_param_count(reference, d_model, num_heads, kwargs.get(reference))
                    + 3 * d_model * ref_hidden)
  mixers = sum(mixer_param_count(n, d_model, num_heads, kwargs.get(n)) for n in names)
  # A GLU MLP of hidden width h holds 3*d*h weights; with h = 0 its norm goes too.
  hidden = round((budget - mixers) / (3 * d_model * depth) / 8) * 8
  if hidden < 8:
    raise ValueError(
        f"the mixers {sorted(set(names))} hold {mixers} parameters, more than the reference "
        f"budget of {budget} for {depth} layers at d_model={d_model}; no MLP width matches it.")
  return hidden / d_model


def parity_table(vocab_size: int, d_model: int, num_layers: int, *, num_heads: int = 4,
                 mixers: Sequence[str] = registry.CAUSAL_MIXERS,
                 reference: str = "softmax", short_conv: int = 0) -> list[dict[str, Any]]:
  """One row per mixer: its parameters at the default MLP, the matched MLP and the gap.

  ``short_conv`` (a width) adds the same convolution before every mixer of every
  model, the reference included, so the matched MLP ratios do not change with it.

  Each row: ``mixer``, ``mixer_params`` (one layer), ``default_params``,
  ``mlp_ratio``, ``mlp_hidden``, ``params``, ``rel_diff`` (to the reference).
  """
  ref = lm_param_count(vocab_size, d_model, num_layers, mixer=reference, num_heads=num_heads,
                       short_conv=short_conv)
  rows = []
  for name in mixers:
    ratio = matched_mlp_ratio(vocab_size, d_model, num_layers, mixer=name, num_heads=num_heads,
                              reference=reference)
    params = lm_param_count(vocab_size, d_model, num_layers, mixer=name, num_heads=num_heads,
                            mlp_ratio=ratio, short_conv=short_conv)
    rows.append(dict(
        mixer=name, mixer_params=mixer_param_count(name, d_model, num_heads),
        default_params=lm_param_count(vocab_size, d_model, num_layers, mixer=name,
                                      num_heads=num_heads, short_conv=short_conv),
        mlp_ratio=ratio, mlp_hidden=mlp_hidden(d_model, ratio), params=params,
        rel_diff=(params - ref) / ref))
  return rows
