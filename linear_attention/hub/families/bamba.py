"""Bamba (``model_type="bamba"``, ibm-ai-platform/Bamba-9B-*): pre-norm blocks of Mamba-2 or
attention (at ``attn_layer_indices``; partial RoPE over ``partial_rotary_factor`` of each
head), each followed by a SwiGLU MLP.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax.numpy as jnp
from flax import nnx

from linear_attention.hub import core
from linear_attention.hub.families import mamba2
from linear_attention.hub.families.common import embeddings_and_head, get, require
from linear_attention.models.blocks import LayerSpec
from linear_attention.models.lm import LanguageModel

_MAMBA_KEYS = dict(heads="mamba_n_heads", head_dim="mamba_d_head", state="mamba_d_state",
                   groups="mamba_n_groups", conv="mamba_d_conv", expand="mamba_expand",
                   eps="rms_norm_eps", bias="mamba_proj_bias", conv_bias="mamba_conv_bias")


def layer_kinds(config: Mapping[str, Any]) -> list[str]:
  """Every layer's kind: ``"mamba"`` or ``"attention"``."""
  attn = set(get(config, "attn_layer_indices", None) or ())
  n = get(config, "num_hidden_layers")
  bad = sorted(i for i in attn if not 0 <= i < n)
  if bad:
    raise ValueError(f"config.json attn_layer_indices {bad} are outside 0..{n - 1}.")
  return ["attention" if i in attn else "mamba" for i in range(n)]


def _attention(config: Mapping[str, Any]) -> dict:
  d = get(config, "hidden_size")
  heads = get(config, "num_attention_heads")
  head_dim = get(config, "head_dim", d // heads)
  params = dict(config.get("rope_parameters") or {})
  for old in ("rope_theta", "partial_rotary_factor"):  # transformers 4 kept them top-level
    if old in config and old not in params:
      params[old] = config[old]
  if params.get("rope_type", "default") != "default":
    raise ValueError(f"config.json rope_parameters rope_type={params['rope_type']!r} is not "
                     f"supported (only 'default').")
  rotary = int(head_dim * float(params.get("partial_rotary_factor", 0.5)))
  return dict(num_kv_heads=get(config, "num_key_value_heads", heads), head_dim=head_dim,
              rope_base=float(params.get("rope_theta", 10000.0)), rotary_dim=rotary)


def _specs(config: Mapping[str, Any]) -> list[LayerSpec]:
  for key, supported, default in (("attention_bias", False, False), ("mlp_bias", False, False)):
    require(config, key, supported, default)
  eps = float(get(config, "rms_norm_eps", 1e-5))
  m_heads, m_kwargs = mamba2.mixer_kwargs(config, **_MAMBA_KEYS)
  attn = _attention(config)
  common = dict(mlp="swiglu", mlp_hidden=get(config, "intermediate_size"), norm_eps=eps)
  return [LayerSpec("mamba2", m_heads, mixer_kwargs=m_kwargs, **common) if kind == "mamba"
          else LayerSpec("softmax", get(config, "num_attention_heads"), mixer_kwargs=attn,
                         **common)
          for kind in layer_kinds(config)]


def build(config: Mapping[str, Any], *, rngs: nnx.Rngs, dtype=None,
          param_dtype=jnp.float32) -> LanguageModel:
  """The ``LanguageModel`` of a Bamba ``config.json``."""
  return LanguageModel(get(config, "vocab_size"), get(config, "hidden_size"),
                       layers=_specs(config),
                       tie_embeddings=get(config, "tie_word_embeddings", False),
                       norm_eps=float(get(config, "rms_norm_eps", 1e-5)), rngs=rngs,
                       dtype=dtype, param_dtype=param_dtype)


def tensors(config: Mapping[str, Any]) -> list:
  """Checkpoint names of every parameter."""
  out = embeddings_and_head(config, "model.embed_tokens.weight", "model.final_layernorm.weight",
                            False)
  for i, kind in enumerate(layer_kinds(config)):
    hf, p = f"model.layers.{i}.", ("backbone", "blocks", i)
    out += [core.same(hf + "input_layernorm.weight", p + ("mixer_norm", "scale")),
            core.same(hf + "pre_ff_layernorm.weight", p + ("mlp_norm", "scale")),
            core.linears([hf + "feed_forward.gate_proj.weight", hf + "feed_forward.up_proj.weight"],
                         p + ("mlp", "up", "kernel")),
            core.linear(hf + "feed_forward.down_proj.weight", p + ("mlp", "down", "kernel"))]
    if kind == "mamba":
      out += mamba2.mixer_tensors(hf + "mamba.", p + ("mixer",), config, groups="mamba_n_groups",
                                  heads="mamba_n_heads", head_dim="mamba_d_head")
    else:
      out += [core.linear(hf + f"self_attn.{n}_proj.weight", p + ("mixer", f"{n}_proj", "kernel"))
              for n in "qkvo"]
  return out


BAMBA = core.register(core.Family("bamba", "BambaForCausalLM", build, tensors))
