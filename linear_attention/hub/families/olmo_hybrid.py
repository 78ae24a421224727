"""OLMo-Hybrid (``model_type="olmo_hybrid"``, allenai/Olmo-Hybrid-*): Gated DeltaNet layers
(pre-norm blocks) and softmax-attention layers (post-norm blocks, OLMo-2's
``x + RMSNorm(attn(x))``), each with a SwiGLU MLP.

- Gated DeltaNet with separate q/k/v projections and convolutions, head sizes of their own
  (``linear_key_head_dim``, ``linear_value_head_dim``), ``beta`` doubled
  (``linear_allow_neg_eigval``) and an output norm of epsilon 1e-5.
- Attention with a full-width q/k RMSNorm and RoPE, or none (NoPE) when ``rope_parameters``
  has no ``rope_theta`` (the released checkpoints).
"""

from __future__ import annotations

from typing import Any, Mapping

import jax.numpy as jnp
from flax import nnx

from linear_attention.hub import core
from linear_attention.hub.families import maps
from linear_attention.hub.families.common import embeddings_and_head, get, require
from linear_attention.hub.families import qwen3_next
from linear_attention.models.blocks import LayerSpec
from linear_attention.models.lm import LanguageModel


def layer_types(config: Mapping[str, Any]) -> list[str]:
  """Every layer's kind; by default attention every fourth layer, and at least the last."""
  if config.get("layer_types") is None:
    n = get(config, "num_hidden_layers")
    kinds = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(n)]
    if "full_attention" not in kinds:
      kinds[-1] = "full_attention"
    config = dict(config, layer_types=kinds)
  return qwen3_next.layer_types(config)


def rope_theta(config: Mapping[str, Any]) -> float | None:
  """RoPE's base, or ``None`` for no positional encoding."""
  params = config.get("rope_parameters")
  if params is None:
    return None
  kind = params.get("rope_type", params.get("type", "default"))
  if kind != "default":
    raise ValueError(f"config.json rope_type {kind!r} is not supported for model_type "
                     "'olmo_hybrid' (supported: 'default').")
  theta = params.get("rope_theta")
  return None if theta is None else float(theta)


def linear_dims(config: Mapping[str, Any]) -> tuple[int, int, int, int]:
  """``(key heads, value heads, key head dim, value head dim)`` with transformers' defaults."""
  d, heads = get(config, "hidden_size"), get(config, "num_attention_heads")
  hk = get(config, "linear_num_key_heads", heads)
  hv = get(config, "linear_num_value_heads", heads)
  dk = get(config, "linear_key_head_dim", int(0.75 * d / hk))
  dv = get(config, "linear_value_head_dim", 2 * dk)
  return hk, hv, dk, dv


def _specs(config: Mapping[str, Any]) -> list[LayerSpec]:
  for key, supported, default in (("hidden_act", "silu", "silu"),
                                  ("attention_bias", False, False)):
    require(config, key, supported, default)
  d = get(config, "hidden_size")
  eps = float(get(config, "rms_norm_eps", 1e-6))
  heads = get(config, "num_attention_heads")
  theta = rope_theta(config)
  attn = dict(num_kv_heads=get(config, "num_key_value_heads", heads),
              head_dim=get(config, "head_dim", d // heads), qk_norm="full", qk_norm_eps=eps,
              use_rope=theta is not None, rope_base=theta or 10000.0)
  hk, hv, dk, dv = linear_dims(config)
  gdn = dict(num_v_heads=hv, head_k_dim=dk, head_v_dim=dv,
             conv_width=get(config, "linear_conv_kernel_dim", 4),
             allow_neg_eigval=bool(get(config, "linear_allow_neg_eigval", True)), norm_eps=1e-5)
  mlp = dict(mlp="swiglu", mlp_hidden=get(config, "intermediate_size"), norm_eps=eps)
  return [LayerSpec("gated_deltanet", hk, mixer_kwargs=gdn, **mlp) if kind == "linear_attention"
          else LayerSpec("softmax", heads, mixer_kwargs=attn, post_norm=True, **mlp)
          for kind in layer_types(config)]


def build(config: Mapping[str, Any], *, rngs: nnx.Rngs, dtype=None,
          param_dtype=jnp.float32) -> LanguageModel:
  """The ``LanguageModel`` of an OLMo-Hybrid ``config.json``."""
  return LanguageModel(get(config, "vocab_size"), get(config, "hidden_size"),
                       layers=_specs(config),
                       tie_embeddings=get(config, "tie_word_embeddings", False),
                       norm_eps=float(get(config, "rms_norm_eps", 1e-6)), rngs=rngs,
                       dtype=dtype, param_dtype=param_dtype)


def tensors(config: Mapping[str, Any]) -> list:
  """Checkpoint names of every parameter, as transformers writes them (OLMo-core's names:
  ``attention_layer_norm``/``feedforward_layer_norm`` for the Gated DeltaNet layers' norms,
  ``feedforward_layer_norm``/``post_feedforward_layernorm`` for the attention layers')."""
  out = embeddings_and_head(config, "model.embed_tokens.weight", "model.norm.weight", False)
  hk, hv, dk, dv = linear_dims(config)
  widths = (hk * dk, hk * dk, hv * dv)
  for i, kind in enumerate(layer_types(config)):
    hf, p = f"model.layers.{i}.", ("backbone", "blocks", i)
    pm = p + ("mixer",)
    out += maps.swiglu(hf + "mlp.gate_proj.weight", hf + "mlp.up_proj.weight",
                       hf + "mlp.down_proj.weight", p + ("mlp",))
    if kind == "linear_attention":
      m = hf + "linear_attn."
      out += [core.same(hf + "attention_layer_norm.weight", p + ("mixer_norm", "scale")),
              core.same(hf + "feedforward_layer_norm.weight", p + ("mlp_norm", "scale")),
              maps.linears([m + f"{n}_proj.weight" for n in "qkv"], pm + ("qkv_proj", "kernel"),
                           widths),
              maps.convs([m + f"{n}_conv1d.weight" for n in "qkv"], pm + ("conv", "weight")),
              core.same(m + "A_log", pm + ("A_log",)),
              core.same(m + "dt_bias", pm + ("dt_bias",)),
              core.same(m + "o_norm.weight", pm + ("o_norm", "scale"))]
      out += [core.linear(m + f"{n}_proj.weight", pm + (f"{n}_proj", "kernel"))
              for n in "abgo"]
    else:
      m = hf + "self_attn."
      out += [core.same(hf + "feedforward_layer_norm.weight", p + ("mixer_norm", "scale")),
              core.same(hf + "post_feedforward_layernorm.weight", p + ("mlp_norm", "scale")),
              core.same(m + "q_norm.weight", pm + ("q_norm", "scale")),
              core.same(m + "k_norm.weight", pm + ("k_norm", "scale"))]
      out += [core.linear(m + f"{n}_proj.weight", pm + (f"{n}_proj", "kernel")) for n in "qkvo"]
  return out


OLMO_HYBRID = core.register(core.Family("olmo_hybrid", "OlmoHybridForCausalLM", build, tensors))
