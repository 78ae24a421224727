"""Kimi Linear (``model_type="kimi_linear"``, moonshotai/Kimi-Linear-48B-A3B-*): pre-norm
blocks of Kimi Delta Attention (``linear_attention``) or multi-head latent attention without
positional encoding (``full_attention``), each followed by a mixture of experts (``sparse``)
or a SwiGLU (``dense``, the first ``first_k_dense_replace`` layers).

- KDA (``nn.KimiDeltaAttention``) with ``linear_head_dim`` heads, separate q/k/v
  convolutions, a low-rank per-channel forget gate and a low-rank sigmoid output gate.
- MLA (``nn.MultiHeadLatentAttention``, NoPE), with or without the low-rank query
  (``q_lora_rank``).
- MoE with sigmoid scores, the load-balancing bias (``e_score_correction_bias``) in the
  choice only, group-limited top-k, renormalised weights times ``routed_scaling_factor``, and
  ``num_shared_experts`` shared experts as one SwiGLU.

Both transformers' config keys and the original checkpoints' (``linear_attn_config``,
``num_experts_per_token``, ``num_shared_experts``, ...) are read.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax.numpy as jnp
from flax import nnx

from linear_attention.hub import core
from linear_attention.hub.families import maps
from linear_attention.hub.families.common import embeddings_and_head, get, require
from linear_attention.models.blocks import LayerSpec
from linear_attention.models.lm import LanguageModel

_MISSING = object()


def first(config: Mapping[str, Any], keys: tuple[str, ...], default: Any = _MISSING) -> Any:
  """The value of the first of ``keys`` present (transformers' name or the original's)."""
  for key in keys:
    if config.get(key) is not None:
      return config[key]
  return get(config, keys[0]) if default is _MISSING else default


def _linear(config: Mapping[str, Any], key: str, original: str, default: Any) -> Any:
  return first(config, (key,), (config.get("linear_attn_config") or {}).get(original, default))


def layer_types(config: Mapping[str, Any]) -> tuple[list[str], list[str]]:
  """Every layer's mixer kind (``"linear_attention"``/``"full_attention"``) and MLP kind
  (``"dense"``/``"sparse"``), with transformers' defaults."""
  n = get(config, "num_hidden_layers")
  kinds = config.get("layer_types")
  lac = config.get("linear_attn_config") or {}
  if kinds is None and "full_attn_layers" in lac and "kda_layers" in lac:
    kinds = [None] * n
    for i in lac["full_attn_layers"]:
      kinds[i - 1] = "full_attention"  # 1-based in the original config
    for i in lac["kda_layers"]:
      kinds[i - 1] = "linear_attention"
  elif kinds is None:
    kinds = ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(n)]
  mlps = config.get("mlp_layer_types")
  if mlps is None:
    k = get(config, "first_k_dense_replace", 1)
    mlps = ["dense" if i < k else "sparse" for i in range(n)]
  if (len(kinds) != n or set(kinds) - {"linear_attention", "full_attention"} or len(mlps) != n
      or set(mlps) - {"dense", "sparse"}):
    raise ValueError(f"config.json layer_types/mlp_layer_types must list num_hidden_layers={n} "
                     f"layers of linear_attention/full_attention and dense/sparse, got "
                     f"{kinds!r} and {mlps!r}.")
  return list(kinds), list(mlps)


def _moe(config: Mapping[str, Any]) -> dict:
  act = config.get("moe_router_activation_func", "sigmoid")
  if act != "sigmoid":
    raise ValueError(f"config.json moe_router_activation_func={act!r} is not supported for "
                     "model_type 'kimi_linear' (supported: 'sigmoid').")
  shared = first(config, ("num_shared_experts", "n_shared_experts"), 1)
  return dict(num_experts=first(config, ("num_experts", "num_local_experts"), 256),
              top_k=first(config, ("num_experts_per_token", "num_experts_per_tok"), 8),
              score="sigmoid", score_bias=True,
              renormalize=bool(first(config, ("moe_renormalize", "norm_topk_prob"), True)),
              routed_scale=float(get(config, "routed_scaling_factor", 2.446)),
              num_groups=first(config, ("num_expert_group", "n_group"), 1),
              topk_groups=first(config, ("topk_group",), 1),
              shared_hidden=get(config, "moe_intermediate_size", 1024) * shared)


def _linear_dims(config: Mapping[str, Any]) -> tuple[int, int, int]:
  """``(heads, head_dim, conv width)`` of the KDA layers."""
  return (_linear(config, "linear_num_heads", "num_heads", 32),
          _linear(config, "linear_head_dim", "head_dim", 128),
          _linear(config, "linear_conv_kernel_dim", "short_conv_kernel_size", 4))


def _mla(config: Mapping[str, Any]) -> dict:
  return dict(kv_lora_rank=get(config, "kv_lora_rank", 512),
              q_lora_rank=config.get("q_lora_rank"),
              qk_nope_head_dim=get(config, "qk_nope_head_dim", 128),
              qk_rope_head_dim=get(config, "qk_rope_head_dim", 64),
              v_head_dim=get(config, "v_head_dim", 128), use_rope=False)


def _specs(config: Mapping[str, Any]) -> list[LayerSpec]:
  for key, supported, default in (("hidden_act", "silu", "silu"),
                                  ("attention_bias", False, False),
                                  ("mla_use_nope", True, True)):
    require(config, key, supported, default)
  eps = float(get(config, "rms_norm_eps", 1e-5))
  heads, head_dim, conv = _linear_dims(config)
  kda = dict(head_dim=head_dim, conv_width=conv, norm_eps=eps)
  moe = _moe(config)
  out = []
  for kind, mlp in zip(*layer_types(config)):
    mixer = (("kda", heads, kda) if kind == "linear_attention" else
             ("mla", get(config, "num_attention_heads", 32), _mla(config)))
    mlp_spec = (dict(mlp="moe", mlp_hidden=get(config, "moe_intermediate_size", 1024),
                     mlp_kwargs=moe) if mlp == "sparse" else
                dict(mlp="swiglu", mlp_hidden=get(config, "intermediate_size", 9216)))
    out.append(LayerSpec(mixer[0], mixer[1], mixer_kwargs=mixer[2], norm_eps=eps, **mlp_spec))
  return out


def build(config: Mapping[str, Any], *, rngs: nnx.Rngs, dtype=None,
          param_dtype=jnp.float32) -> LanguageModel:
  """The ``LanguageModel`` of a Kimi Linear ``config.json``."""
  return LanguageModel(get(config, "vocab_size"), get(config, "hidden_size"),
                       layers=_specs(config),
                       tie_embeddings=get(config, "tie_word_embeddings", False),
                       norm_eps=float(get(config, "rms_norm_eps", 1e-5)), rngs=rngs,
                       dtype=dtype, param_dtype=param_dtype)


def tensors(config: Mapping[str, Any]) -> list:
  """Checkpoint names of every parameter (the MLPs under ``block_sparse_moe``, the experts'
  ``w1``/``w3``/``w2`` for gate/up/down, as the original checkpoints and transformers write)."""
  out = embeddings_and_head(config, "model.embed_tokens.weight", "model.norm.weight", False)
  heads, head_dim, _ = _linear_dims(config)
  num_experts = _moe(config)["num_experts"]
  q_lora = config.get("q_lora_rank")
  for i, (kind, mlp) in enumerate(zip(*layer_types(config))):
    hf, p = f"model.layers.{i}.", ("backbone", "blocks", i)
    pm, m = p + ("mixer",), hf + "self_attn."
    out += [core.same(hf + "input_layernorm.weight", p + ("mixer_norm", "scale")),
            core.same(hf + "post_attention_layernorm.weight", p + ("mlp_norm", "scale"))]
    if kind == "linear_attention":
      lin = lambda name, *path: core.linear(m + name + ".weight", pm + path + ("kernel",))
      out += [maps.linears([m + f"{n}_proj.weight" for n in "qkv"], pm + ("qkv_proj", "kernel"),
                           [heads * head_dim] * 3),
              maps.convs([m + f"{n}_conv1d.weight" for n in "qkv"], pm + ("conv", "weight")),
              maps.reshaped(m + "A_log", pm + ("A_log",), (heads,), (1, 1, heads, 1)),
              core.same(m + "dt_bias", pm + ("dt_bias",)),
              core.same(m + "o_norm.weight", pm + ("o_norm", "scale")),
              lin("f_a_proj", "f_down"), lin("f_b_proj", "f_up"), lin("b_proj", "b_proj"),
              lin("g_a_proj", "out_down"), lin("g_b_proj", "out_up"), lin("o_proj", "o_proj")]
    else:
      lin = lambda name, attr: core.linear(m + name + ".weight", pm + (attr, "kernel"))
      out += [lin("kv_a_proj_with_mqa", "kv_a_proj"), lin("kv_b_proj", "kv_b_proj"),
              lin("o_proj", "o_proj"),
              core.same(m + "kv_a_layernorm.weight", pm + ("kv_a_norm", "scale"))]
      if q_lora is None:
        out.append(lin("q_proj", "q_proj"))
      else:
        out += [lin("q_a_proj", "q_a_proj"), lin("q_b_proj", "q_b_proj"),
                core.same(m + "q_a_layernorm.weight", pm + ("q_a_norm", "scale"))]
    b, pb = hf + "block_sparse_moe.", p + ("mlp",)
    if mlp == "dense":
      out += maps.swiglu(b + "gate_proj.weight", b + "up_proj.weight", b + "down_proj.weight", pb)
    else:
      out += [core.linear(b + "gate.weight", pb + ("router",)),
              core.same(b + "gate.e_score_correction_bias", pb + ("score_bias",))]
      out += maps.experts(b + "experts.", pb, num_experts, gate="w1", up="w3", down="w2")
      if _moe(config)["shared_hidden"]:
        out += maps.swiglu(b + "shared_experts.gate_proj.weight",
                           b + "shared_experts.up_proj.weight",
                           b + "shared_experts.down_proj.weight", pb + ("shared",))
  return out


KIMI_LINEAR = core.register(core.Family("kimi_linear", "KimiLinearForCausalLM", build, tensors))
