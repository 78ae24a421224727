"""Granite-4.0-H (``model_type="granitemoehybrid"``, ibm-granite/granite-4.0-h-*): pre-norm
blocks of Mamba-2 or attention (NoPE, or RoPE with ``position_embedding_type="rope"``) then a
SwiGLU MLP (``shared_mlp``), with Granite's multipliers: embeddings times
``embedding_multiplier``, attention logits times ``attention_multiplier``, each branch times
``residual_multiplier`` before its residual add, logits over ``logits_scaling``.

With ``num_local_experts > 0`` (granite-4.0-h-tiny, -small) the MLP is ``nn.moe.MoE``: the
top ``num_experts_per_tok`` of the router's logits, softmax over them (softmax scores
renormalised over the chosen experts), SwiGLU experts of width ``intermediate_size``, plus
the ``shared_mlp``.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax.numpy as jnp
from flax import nnx

from linear_attention.hub import core
from linear_attention.hub.families import mamba2
from linear_attention.hub.families.common import embeddings_and_head, get, number, require
from linear_attention.models.blocks import LayerSpec
from linear_attention.models.lm import LanguageModel

_MAMBA_KEYS = dict(heads="mamba_n_heads", head_dim="mamba_d_head", state="mamba_d_state",
                   groups="mamba_n_groups", conv="mamba_d_conv", expand="mamba_expand",
                   eps="rms_norm_eps", bias="mamba_proj_bias", conv_bias="mamba_conv_bias")


def layer_kinds(config: Mapping[str, Any]) -> list[str]:
  """Every layer's kind: ``"mamba"`` or ``"attention"``."""
  kinds = config.get("layer_types") or config.get("layers_block_type")
  if kinds is None:
    kinds = ["mamba"] * get(config, "num_hidden_layers")
  names = {"mamba": "mamba", "linear_attention": "mamba", "attention": "attention",
           "full_attention": "attention"}
  bad = sorted({k for k in kinds if k not in names})
  if bad:
    raise ValueError(f"config.json layer_types has unknown kinds {bad}; known: {sorted(names)}.")
  return [names[k] for k in kinds]


def _rope(config: Mapping[str, Any]) -> dict:
  kind = config.get("position_embedding_type")
  if kind in (None, "nope"):
    return dict(use_rope=False)
  if kind != "rope":
    raise ValueError(f"config.json position_embedding_type={kind!r} is not supported "
                     f"(supported: 'rope', 'nope', null).")
  params = config.get("rope_parameters") or {}
  rope_type = params.get("rope_type", (config.get("rope_scaling") or {}).get("rope_type",
                                                                           "default"))
  if rope_type != "default" or params.get("partial_rotary_factor", 1.0) != 1.0:
    raise ValueError(f"config.json rope_parameters {params!r}: only the default RoPE over the "
                     f"whole head is supported.")
  return dict(use_rope=True, rope_base=float(params.get("rope_theta",
                                                        config.get("rope_theta", 10000.0))))


def _specs(config: Mapping[str, Any]) -> list[LayerSpec]:
  for key, supported, default in (("attention_bias", False, False), ("hidden_act", "silu", "silu")):
    require(config, key, supported, default)
  eps = float(get(config, "rms_norm_eps", 1e-6))
  d = get(config, "hidden_size")
  heads = get(config, "num_attention_heads")
  attn = dict(num_kv_heads=get(config, "num_key_value_heads", heads),
              head_dim=get(config, "head_dim", d // heads),
              scale=number(get(config, "attention_multiplier", 1.0)), **_rope(config))
  m_heads, m_kwargs = mamba2.mixer_kwargs(config, **_MAMBA_KEYS)
  common = dict(mlp="swiglu", mlp_hidden=get(config, "shared_intermediate_size"), norm_eps=eps,
                residual_scale=number(get(config, "residual_multiplier", 1.0)))
  experts = get(config, "num_local_experts", 0)
  if experts:  # routed experts plus the shared MLP (softmax over the top-k router logits)
    common.update(mlp="moe", mlp_hidden=get(config, "intermediate_size"), mlp_kwargs=dict(
        num_experts=experts, top_k=get(config, "num_experts_per_tok"), score="softmax",
        renormalize=True, shared_hidden=get(config, "shared_intermediate_size")))
  return [LayerSpec("mamba2", m_heads, mixer_kwargs=m_kwargs, **common) if kind == "mamba"
          else LayerSpec("softmax", heads, mixer_kwargs=attn, **common)
          for kind in layer_kinds(config)]


def build(config: Mapping[str, Any], *, rngs: nnx.Rngs, dtype=None,
          param_dtype=jnp.float32) -> LanguageModel:
  """The ``LanguageModel`` of a Granite-4.0-H ``config.json``."""
  return LanguageModel(get(config, "vocab_size"), get(config, "hidden_size"),
                       layers=_specs(config),
                       tie_embeddings=get(config, "tie_word_embeddings", False),
                       norm_eps=float(get(config, "rms_norm_eps", 1e-6)),
                       embed_scale=number(get(config, "embedding_multiplier", 1.0)),
                       logit_scale=1.0 / number(get(config, "logits_scaling", 1.0)),
                       rngs=rngs, dtype=dtype, param_dtype=param_dtype)


def tensors(config: Mapping[str, Any]) -> list:
  """Checkpoint names of every parameter."""
  out = embeddings_and_head(config, "model.embed_tokens.weight", "model.norm.weight", False)
  experts = get(config, "num_local_experts", 0)
  for i, kind in enumerate(layer_kinds(config)):
    hf, p = f"model.layers.{i}.", ("backbone", "blocks", i)
    shared = p + ("mlp", "shared") if experts else p + ("mlp",)
    out += [core.same(hf + "input_layernorm.weight", p + ("mixer_norm", "scale")),
            core.same(hf + "post_attention_layernorm.weight", p + ("mlp_norm", "scale")),
            # input_linear is gate then up, side by side: the SwiGLU's fused kernel.
            core.linear(hf + "shared_mlp.input_linear.weight", shared + ("up", "kernel")),
            core.linear(hf + "shared_mlp.output_linear.weight", shared + ("down", "kernel"))]
    if experts:  # [E, out, in] stacks, transposed per expert to the MoE's [E, in, out]
      moe = hf + "block_sparse_moe."
      t = lambda name, attr: core.Tensor(p + ("mlp", attr), (moe + name,),
                                         lambda a: a[0].transpose(0, 2, 1),
                                         lambda v: [v.transpose(0, 2, 1)])
      out += [core.linear(moe + "router.layer.weight", p + ("mlp", "router")),
              t("input_linear.weight", "gate_up"), t("output_linear.weight", "down")]
    if kind == "mamba":
      out += mamba2.mixer_tensors(hf + "mamba.", p + ("mixer",), config, groups="mamba_n_groups",
                                  heads="mamba_n_heads", head_dim="mamba_d_head")
    else:
      out += [core.linear(hf + f"self_attn.{n}_proj.weight", p + ("mixer", f"{n}_proj", "kernel"))
              for n in "qkvo"]
  return out


GRANITE_4_H = core.register(core.Family("granitemoehybrid", "GraniteMoeHybridForCausalLM", build,
                                         tensors))
