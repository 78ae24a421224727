"""Mamba-2 (``model_type="mamba2"``, e.g. mistralai/Mamba-Codestral-7B-v0.1,
state-spaces/mamba2-*): a stack of pre-norm ``nn.Mamba2`` blocks, no MLP.

The checkpoints' gated RMSNorm has one weight per channel (``norm_per_channel``), and
``time_step_limit`` clamps ``dt`` (``dt_limit``). Also the mixer map of the Mamba-2 hybrids
(:func:`mixer_kwargs`, :func:`mixer_tensors`).
"""

from __future__ import annotations

from typing import Any, Mapping

import jax.numpy as jnp
from flax import nnx

from linear_attention.hub import core
from linear_attention.hub.families.common import dt_limit, embeddings_and_head, get, require
from linear_attention.models.blocks import LayerSpec
from linear_attention.models.lm import LanguageModel


def mixer_kwargs(config: Mapping[str, Any], *, heads: str = "num_heads",
                 head_dim: str = "head_dim", state: str = "state_size", groups: str = "n_groups",
                 conv: str = "conv_kernel", expand: str | None = "expand",
                 eps: str = "layer_norm_epsilon", bias: str = "use_bias",
                 conv_bias: str = "use_conv_bias", act: str = "hidden_act") -> tuple[int, dict]:
  """``(num_heads, nn.Mamba2 options)`` of a config; the key names differ by family
  (``expand=None``: the inner width is ``heads * head_dim`` whatever ``expand`` says)."""
  for key, supported, default in ((bias, False, False), (conv_bias, True, True),
                                  (act, "silu", "silu")):
    require(config, key, supported, default)
  d = get(config, "hidden_size")
  h, p = get(config, heads), get(config, head_dim)
  d_inner = h * p
  e = None if expand is None else get(config, expand, None)
  if e is not None and int(e * d) != d_inner:
    raise ValueError(f"config.json {heads} * {head_dim} = {d_inner} must equal {expand} * "
                     f"hidden_size = {e} * {d}.")
  return h, dict(d_state=get(config, state), ngroups=get(config, groups),
                 conv_width=get(config, conv, 4), d_inner=d_inner,
                 norm_eps=float(get(config, eps, 1e-5)), norm_per_channel=True,
                 dt_limit=dt_limit(config))


def mixer_tensors(m: str, pm: tuple, config: Mapping[str, Any], *, groups: str = "n_groups",
                  heads: str = "num_heads", head_dim: str = "head_dim") -> list:
  """The Mamba-2 mixer's tensors under the checkpoint prefix ``m`` and model path ``pm``."""
  g = get(config, groups)
  d_inner = get(config, heads) * get(config, head_dim)
  return [core.linear(m + "in_proj.weight", pm + ("in_proj", "kernel")),
          core.conv1d(m + "conv1d.weight", pm + ("conv", "weight")),
          core.same(m + "conv1d.bias", pm + ("conv", "bias")),
          core.same(m + "dt_bias", pm + ("dt_bias",)),
          core.same(m + "A_log", pm + ("A_log",)),
          core.same(m + "D", pm + ("D",)),
          core.reshaped(m + "norm.weight", pm + ("norm", "scale"), (g, d_inner // g)),
          core.linear(m + "out_proj.weight", pm + ("out_proj", "kernel"))]


def build(config: Mapping[str, Any], *, rngs: nnx.Rngs, dtype=None,
          param_dtype=jnp.float32) -> LanguageModel:
  """The ``LanguageModel`` of a Mamba-2 ``config.json``."""
  require(config, "rms_norm", True, True)
  heads, kwargs = mixer_kwargs(config)
  eps = float(get(config, "layer_norm_epsilon", 1e-5))
  spec = LayerSpec("mamba2", heads, mixer_kwargs=kwargs, norm_eps=eps)
  return LanguageModel(get(config, "vocab_size"), get(config, "hidden_size"),
                       layers=[spec] * get(config, "num_hidden_layers"),
                       tie_embeddings=get(config, "tie_word_embeddings", False), norm_eps=eps,
                       rngs=rngs, dtype=dtype, param_dtype=param_dtype)


def tensors(config: Mapping[str, Any]) -> list:
  """Checkpoint names of every parameter."""
  out = embeddings_and_head(config, "backbone.embeddings.weight", "backbone.norm_f.weight", False)
  for i in range(get(config, "num_hidden_layers")):
    hf, p = f"backbone.layers.{i}.", ("backbone", "blocks", i)
    out.append(core.same(hf + "norm.weight", p + ("mixer_norm", "scale")))
    out += mixer_tensors(hf + "mixer.", p + ("mixer",), config)
  return out


MAMBA2 = core.register(core.Family("mamba2", "Mamba2ForCausalLM", build, tensors))
