"""Qwen3-Next (``model_type="qwen3_next"``, Qwen/Qwen3-Next-80B-A3B-*): pre-norm blocks of
Gated DeltaNet (``linear_attention``) or gated softmax attention (``full_attention``), each
followed by a mixture of experts (or a SwiGLU on ``mlp_only_layers``).

- Gated DeltaNet with fewer q/k heads than value heads (``nn.GatedDeltaNet``'s
  ``num_v_heads``), the output gate ``z`` and ``beta``/``a`` coming from the checkpoint's
  fused ``in_proj_qkvz`` and ``in_proj_ba`` (rows grouped per key head).
- Attention with a per-head zero-centred q/k RMSNorm, a sigmoid output gate (the second half
  of each head's ``q_proj`` rows) and RoPE on the first ``partial_rotary_factor`` of each head.
- Every RMSNorm of the blocks and the final one scales by ``1 + weight``.
- MoE: softmax top-k routing, renormalised with ``norm_topk_prob``, and a shared expert
  gated by ``sigmoid(x W)``.
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


def layer_types(config: Mapping[str, Any]) -> list[str]:
  """Every layer's mixer kind, ``"linear_attention"`` or ``"full_attention"``."""
  n = get(config, "num_hidden_layers")
  kinds = config.get("layer_types")
  if kinds is None:
    every = get(config, "full_attention_interval", 4)
    kinds = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n)]
  bad = sorted(set(kinds) - {"linear_attention", "full_attention"})
  if bad or len(kinds) != n:
    raise ValueError(f"config.json layer_types must list num_hidden_layers={n} of "
                     f"'linear_attention'/'full_attention', got {kinds!r}.")
  return list(kinds)


def is_moe(config: Mapping[str, Any], i: int) -> bool:
  """Whether layer ``i``'s MLP is the mixture of experts (transformers' rule)."""
  return (i not in (get(config, "mlp_only_layers", []) or []) and get(config, "num_experts", 0) > 0
          and (i + 1) % get(config, "decoder_sparse_step", 1) == 0)


def rope(config: Mapping[str, Any]) -> tuple[float, float]:
  """``(rope_theta, partial_rotary_factor)`` from ``rope_parameters`` (or the old top-level
  keys); only the default RoPE type is supported."""
  params = dict(config.get("rope_parameters") or {})
  kind = params.get("rope_type", params.get("type", "default"))
  scaling = config.get("rope_scaling")
  if kind != "default" or scaling:
    raise ValueError(f"config.json rope_type {kind!r} (rope_scaling={scaling!r}) is not "
                     "supported for model_type 'qwen3_next' (supported: 'default').")
  theta = params.get("rope_theta", get(config, "rope_theta", 10000.0))
  factor = params.get("partial_rotary_factor", get(config, "partial_rotary_factor", 0.25))
  return float(theta), float(factor)


def _specs(config: Mapping[str, Any]) -> list[LayerSpec]:
  for key, supported, default in (("hidden_act", "silu", "silu"),
                                  ("attention_bias", False, False)):
    require(config, key, supported, default)
  d = get(config, "hidden_size")
  eps = float(get(config, "rms_norm_eps", 1e-6))
  heads = get(config, "num_attention_heads", 16)
  head_dim = get(config, "head_dim", 256)
  theta, factor = rope(config)
  attn = dict(num_kv_heads=get(config, "num_key_value_heads", 2), head_dim=head_dim,
              rope_base=theta, rotary_dim=int(head_dim * factor), qk_norm="head",
              qk_norm_eps=eps, norm_offset=1, output_gate=True)
  gdn = dict(num_v_heads=get(config, "linear_num_value_heads", 32),
             head_k_dim=get(config, "linear_key_head_dim", 128),
             head_v_dim=get(config, "linear_value_head_dim", 128),
             conv_width=get(config, "linear_conv_kernel_dim", 4), norm_eps=eps)
  moe = dict(num_experts=get(config, "num_experts", 512),
             top_k=get(config, "num_experts_per_tok", 10), score="softmax",
             renormalize=bool(get(config, "norm_topk_prob", True)),
             shared_hidden=get(config, "shared_expert_intermediate_size", 512), shared_gate=True)
  out = []
  for i, kind in enumerate(layer_types(config)):
    mixer = ("gated_deltanet", get(config, "linear_num_key_heads", 16), gdn) if (
        kind == "linear_attention") else ("softmax", heads, attn)
    if is_moe(config, i):
      mlp = dict(mlp="moe", mlp_hidden=get(config, "moe_intermediate_size", 512), mlp_kwargs=moe)
    else:
      mlp = dict(mlp="swiglu", mlp_hidden=get(config, "intermediate_size", 5632))
    out.append(LayerSpec(mixer[0], mixer[1], mixer_kwargs=mixer[2], norm_eps=eps, norm_offset=1,
                         **mlp))
  return out


def build(config: Mapping[str, Any], *, rngs: nnx.Rngs, dtype=None,
          param_dtype=jnp.float32) -> LanguageModel:
  """The ``LanguageModel`` of a Qwen3-Next ``config.json``."""
  return LanguageModel(get(config, "vocab_size"), get(config, "hidden_size"),
                       layers=_specs(config),
                       tie_embeddings=get(config, "tie_word_embeddings", False),
                       norm_eps=float(get(config, "rms_norm_eps", 1e-6)), norm_offset=1,
                       rngs=rngs, dtype=dtype, param_dtype=param_dtype)


def moe_tensors(hf: str, p: tuple, num_experts: int) -> list:
  """A Qwen-style sparse MoE block (``gate``, ``experts.<j>``, ``shared_expert``,
  ``shared_expert_gate``) under checkpoint prefix ``hf`` and model path ``p``."""
  return ([core.linear(hf + "gate.weight", p + ("router",))]
          + maps.experts(hf + "experts.", p, num_experts)
          + maps.swiglu(hf + "shared_expert.gate_proj.weight", hf + "shared_expert.up_proj.weight",
                        hf + "shared_expert.down_proj.weight", p + ("shared",))
          + [core.linear(hf + "shared_expert_gate.weight", p + ("shared_gate", "kernel"))])


def tensors(config: Mapping[str, Any]) -> list:
  """Checkpoint names of every parameter."""
  out = embeddings_and_head(config, "model.embed_tokens.weight", "model.norm.weight", False)
  hk, hv = get(config, "linear_num_key_heads", 16), get(config, "linear_num_value_heads", 32)
  dk, dv = get(config, "linear_key_head_dim", 128), get(config, "linear_value_head_dim", 128)
  g = hv // hk
  heads, head_dim = get(config, "num_attention_heads", 16), get(config, "head_dim", 256)
  for i, kind in enumerate(layer_types(config)):
    hf, p = f"model.layers.{i}.", ("backbone", "blocks", i)
    pm = p + ("mixer",)
    out += [core.same(hf + "input_layernorm.weight", p + ("mixer_norm", "scale")),
            core.same(hf + "post_attention_layernorm.weight", p + ("mlp_norm", "scale"))]
    if kind == "linear_attention":
      m = hf + "linear_attn."
      out += [maps.rows(m + "in_proj_qkvz.weight", [pm + ("qkv_proj", "kernel"),
                                                    pm + ("g_proj", "kernel")],
                        hk, [dk, dk, g * dv, g * dv], owners=[0, 0, 0, 1]),
              maps.rows(m + "in_proj_ba.weight", [pm + ("b_proj", "kernel"),
                                                  pm + ("a_proj", "kernel")], hk, [g, g]),
              core.conv1d(m + "conv1d.weight", pm + ("conv", "weight")),
              core.same(m + "A_log", pm + ("A_log",)),
              core.same(m + "dt_bias", pm + ("dt_bias",)),
              core.same(m + "norm.weight", pm + ("o_norm", "scale")),
              core.linear(m + "out_proj.weight", pm + ("o_proj", "kernel"))]
    else:
      m = hf + "self_attn."
      out += [maps.rows(m + "q_proj.weight", [pm + ("q_proj", "kernel"), pm + ("g_proj", "kernel")],
                        heads, [head_dim, head_dim]),
              core.linear(m + "k_proj.weight", pm + ("k_proj", "kernel")),
              core.linear(m + "v_proj.weight", pm + ("v_proj", "kernel")),
              core.linear(m + "o_proj.weight", pm + ("o_proj", "kernel")),
              core.same(m + "q_norm.weight", pm + ("q_norm", "scale")),
              core.same(m + "k_norm.weight", pm + ("k_norm", "scale"))]
    if is_moe(config, i):
      out += moe_tensors(hf + "mlp.", p + ("mlp",), get(config, "num_experts", 512))
    else:
      out += maps.swiglu(hf + "mlp.gate_proj.weight", hf + "mlp.up_proj.weight",
                         hf + "mlp.down_proj.weight", p + ("mlp",))
  return out


QWEN3_NEXT = core.register(core.Family("qwen3_next", "Qwen3NextForCausalLM", build, tensors))
