"""Mamba (``model_type="mamba"``, e.g. state-spaces/mamba-130m-hf) and Falcon-Mamba
(``"falcon_mamba"``, tiiuae/falcon-mamba-7b): a stack of pre-norm ``nn.Mamba`` blocks, no MLP.

Falcon-Mamba is Mamba with weightless RMSNorms on ``B``, ``C`` and ``dt``'s low-rank input
(``mixer_rms_eps``), the layer's ``bcdt_norm_eps`` option.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import jax.numpy as jnp
from flax import nnx

from linear_attention.hub import core
from linear_attention.hub.families.common import as_int, embeddings_and_head, get, require
from linear_attention.models.blocks import LayerSpec
from linear_attention.models.lm import LanguageModel


def _dims(config: Mapping[str, Any]) -> dict:
  for key, supported, default in (("hidden_act", "silu", "silu"), ("use_bias", False, False),
                                  ("use_conv_bias", True, True)):
    require(config, key, supported, default)
  d = get(config, "hidden_size")
  expand = get(config, "expand", 2)
  d_inner = get(config, "intermediate_size", int(expand * d))
  if d_inner != expand * d:
    raise ValueError(f"config.json intermediate_size={d_inner} must equal expand * hidden_size "
                     f"= {expand} * {d}.")
  rank = get(config, "time_step_rank", "auto")
  rank = math.ceil(d / 16) if rank == "auto" else rank
  return dict(d_model=d, expand=as_int(config, "expand", expand), dt_rank=int(rank),
              d_state=get(config, "state_size", 16), conv_width=get(config, "conv_kernel", 4),
              layers=get(config, "num_hidden_layers"), eps=get(config, "layer_norm_epsilon", 1e-5))


def build(config: Mapping[str, Any], *, rngs: nnx.Rngs, dtype=None,
          param_dtype=jnp.float32) -> LanguageModel:
  """The ``LanguageModel`` of a Mamba or Falcon-Mamba ``config.json``."""
  dims = _dims(config)
  kwargs = dict(d_state=dims["d_state"], expand=dims["expand"], conv_width=dims["conv_width"],
                dt_rank=dims["dt_rank"])
  if config.get("model_type") == "falcon_mamba":
    kwargs["bcdt_norm_eps"] = float(get(config, "mixer_rms_eps", 1e-6))
  spec = LayerSpec("mamba", 1, mixer_kwargs=kwargs, norm_eps=dims["eps"])
  return LanguageModel(get(config, "vocab_size"), dims["d_model"], layers=[spec] * dims["layers"],
                       tie_embeddings=get(config, "tie_word_embeddings", True),
                       norm_eps=dims["eps"], rngs=rngs, dtype=dtype, param_dtype=param_dtype)


def tensors(config: Mapping[str, Any]) -> list:
  """Checkpoint names of every parameter."""
  out = embeddings_and_head(config, "backbone.embeddings.weight", "backbone.norm_f.weight", True)
  for i in range(_dims(config)["layers"]):
    hf, p = f"backbone.layers.{i}.", ("backbone", "blocks", i)
    m, pm = hf + "mixer.", p + ("mixer",)
    out += [core.same(hf + "norm.weight", p + ("mixer_norm", "scale")),
            core.linear(m + "in_proj.weight", pm + ("in_proj", "kernel")),
            core.conv1d(m + "conv1d.weight", pm + ("conv", "weight")),
            core.same(m + "conv1d.bias", pm + ("conv", "bias")),
            core.linear(m + "x_proj.weight", pm + ("x_proj", "kernel")),
            core.linear(m + "dt_proj.weight", pm + ("dt_proj", "kernel")),
            core.same(m + "dt_proj.bias", pm + ("dt_bias",)),
            core.same(m + "A_log", pm + ("A_log",)),
            core.same(m + "D", pm + ("D",)),
            core.linear(m + "out_proj.weight", pm + ("out_proj", "kernel"))]
  return out


MAMBA = core.register(core.Family("mamba", "MambaForCausalLM", build, tensors))
FALCON_MAMBA = core.register(core.Family("falcon_mamba", "FalconMambaForCausalLM", build, tensors))
