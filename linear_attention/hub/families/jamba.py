"""Jamba (``model_type="jamba"``, ai21labs/AI21-Jamba-*): pre-norm blocks of Mamba (with
weighted RMSNorms on ``dt``, ``B`` and ``C``) or attention without positional encoding (every
``attn_layer_period``-th layer from ``attn_layer_offset``), each followed by a SwiGLU or, every
``expert_layer_period``-th layer from ``expert_layer_offset``, a mixture of experts (softmax
top-k, the chosen weights not renormalised).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import jax.numpy as jnp
from flax import nnx

from linear_attention.hub import core
from linear_attention.hub.families import maps
from linear_attention.hub.families.common import embeddings_and_head, get, require
from linear_attention.models.blocks import LayerSpec
from linear_attention.models.lm import LanguageModel


def layer_kinds(config: Mapping[str, Any]) -> list[tuple[str, bool]]:
  """Every layer's ``(kind, moe)``: kind ``"attention"`` or ``"mamba"``, and whether its MLP
  is the mixture of experts (transformers' ``layers_block_type`` / ``layers_num_experts``)."""
  n, experts = get(config, "num_hidden_layers"), get(config, "num_experts", 16)
  a_period, a_offset = get(config, "attn_layer_period", 8), get(config, "attn_layer_offset", 4)
  e_period, e_offset = get(config, "expert_layer_period", 2), get(config, "expert_layer_offset", 1)
  return [("attention" if i % a_period == a_offset else "mamba",
           experts > 1 and i % e_period == e_offset) for i in range(n)]


def _dt_rank(config: Mapping[str, Any]) -> int:
  rank = get(config, "mamba_dt_rank", "auto")
  return math.ceil(get(config, "hidden_size") / 16) if rank == "auto" else int(rank)


def _specs(config: Mapping[str, Any]) -> list[LayerSpec]:
  for key, supported, default in (("hidden_act", "silu", "silu"),
                                  ("mamba_proj_bias", False, False),
                                  ("mamba_conv_bias", True, True),
                                  ("sliding_window", None, None)):
    require(config, key, supported, default)
  eps = float(get(config, "rms_norm_eps", 1e-6))
  d, heads = get(config, "hidden_size"), get(config, "num_attention_heads")
  mamba = dict(d_state=get(config, "mamba_d_state", 16), expand=get(config, "mamba_expand", 2),
               conv_width=get(config, "mamba_d_conv", 4), dt_rank=_dt_rank(config),
               bcdt_norm_eps=eps, bcdt_norm_weights=True)
  attn = dict(num_kv_heads=get(config, "num_key_value_heads", heads), head_dim=d // heads,
              use_rope=False)
  moe = dict(num_experts=get(config, "num_experts", 16),
             top_k=get(config, "num_experts_per_tok", 2), score="softmax", renormalize=False)
  hidden = get(config, "intermediate_size")
  out = []
  for kind, is_moe in layer_kinds(config):
    mixer = ("mamba", 1, mamba) if kind == "mamba" else ("softmax", heads, attn)
    mlp = dict(mlp="moe", mlp_kwargs=moe) if is_moe else dict(mlp="swiglu")
    out.append(LayerSpec(mixer[0], mixer[1], mixer_kwargs=mixer[2], mlp_hidden=hidden,
                         norm_eps=eps, **mlp))
  return out


def build(config: Mapping[str, Any], *, rngs: nnx.Rngs, dtype=None,
          param_dtype=jnp.float32) -> LanguageModel:
  """The ``LanguageModel`` of a Jamba ``config.json``."""
  return LanguageModel(get(config, "vocab_size"), get(config, "hidden_size"),
                       layers=_specs(config),
                       tie_embeddings=get(config, "tie_word_embeddings", False),
                       norm_eps=float(get(config, "rms_norm_eps", 1e-6)), rngs=rngs,
                       dtype=dtype, param_dtype=param_dtype)


def tensors(config: Mapping[str, Any]) -> list:
  """Checkpoint names of every parameter."""
  out = embeddings_and_head(config, "model.embed_tokens.weight", "model.final_layernorm.weight",
                            False)
  for i, (kind, is_moe) in enumerate(layer_kinds(config)):
    hf, p = f"model.layers.{i}.", ("backbone", "blocks", i)
    pm = p + ("mixer",)
    out += [core.same(hf + "input_layernorm.weight", p + ("mixer_norm", "scale")),
            core.same(hf + "pre_ff_layernorm.weight", p + ("mlp_norm", "scale"))]
    if kind == "mamba":
      m = hf + "mamba."
      out += [core.linear(m + "in_proj.weight", pm + ("in_proj", "kernel")),
              core.conv1d(m + "conv1d.weight", pm + ("conv", "weight")),
              core.same(m + "conv1d.bias", pm + ("conv", "bias")),
              core.linear(m + "x_proj.weight", pm + ("x_proj", "kernel")),
              core.linear(m + "dt_proj.weight", pm + ("dt_proj", "kernel")),
              core.same(m + "dt_proj.bias", pm + ("dt_bias",)),
              core.same(m + "A_log", pm + ("A_log",)),
              core.same(m + "D", pm + ("D",)),
              core.same(m + "dt_layernorm.weight", pm + ("dt_norm",)),
              core.same(m + "b_layernorm.weight", pm + ("b_norm",)),
              core.same(m + "c_layernorm.weight", pm + ("c_norm",)),
              core.linear(m + "out_proj.weight", pm + ("out_proj", "kernel"))]
    else:
      out += [core.linear(hf + f"self_attn.{n}_proj.weight", pm + (f"{n}_proj", "kernel"))
              for n in "qkvo"]
    f = hf + "feed_forward."
    if is_moe:
      out += ([core.linear(f + "router.weight", p + ("mlp", "router"))]
              + maps.experts(f + "experts.", p + ("mlp",), get(config, "num_experts", 16)))
    else:
      out += maps.swiglu(f + "gate_proj.weight", f + "up_proj.weight", f + "down_proj.weight",
                         p + ("mlp",))
  return out


JAMBA = core.register(core.Family("jamba", "JambaForCausalLM", build, tensors))
