"""MiniMax-Text-01 (``model_type="minimax"``, MiniMaxAI/MiniMax-Text-01-hf): blocks of
lightning attention (``linear_attention``) or softmax attention with RoPE
(``full_attention``), each followed by a mixture of experts.

- Lightning attention: ``nn.LightningAttention`` with the per-layer decay factor
  ``1 - i / (L - 1) + 1e-5`` of transformers (its ``slope_scale``). The decay tables
  transformers stores as buffers (``slope_rate``, ``query_decay``, ``key_decay``,
  ``diagonal_decay``) are checked against the config at load and written back at save.
- Blocks: the residual is the normalised input, ``h = RMSNorm(x)``, then
  ``h * alpha + mixer(h) * beta`` (``*_alpha_factor`` / ``*_beta_factor``, per layer kind
  and for the MLP).
- MoE: softmax top-k routing renormalised over the chosen experts, no shared expert.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np
from flax import nnx

from linear_attention.hub import core
from linear_attention.hub.families import maps
from linear_attention.hub.families.common import embeddings_and_head, get, number, require
from linear_attention.models.blocks import LayerSpec
from linear_attention.models.lm import LanguageModel
from linear_attention.nn.gated import lightning_slopes

_KINDS = ("linear_attention", "full_attention")


def layer_types(config: Mapping[str, Any]) -> list[str]:
  """Every layer's kind, ``"linear_attention"`` or ``"full_attention"`` (transformers'
  default: full attention on even layers)."""
  n = get(config, "num_hidden_layers")
  kinds = config.get("layer_types")
  if kinds is None:
    kinds = ["full_attention" if (i + 1) % 2 else "linear_attention" for i in range(n)]
  if len(kinds) != n or set(kinds) - set(_KINDS):
    raise ValueError(f"config.json layer_types must list num_hidden_layers={n} of "
                     f"{_KINDS}, got {kinds!r}.")
  return list(kinds)


def slope_scale(config: Mapping[str, Any], i: int) -> float:
  """Layer ``i``'s factor on the lightning slopes (transformers' ``get_slope_rate``)."""
  n = get(config, "num_hidden_layers")
  return 1 - i / (n - 1 + 1e-5) + 1e-5


def _head_dim(config: Mapping[str, Any]) -> int:
  return get(config, "head_dim", get(config, "hidden_size") // get(config, "num_attention_heads"))


def _rope_theta(config: Mapping[str, Any]) -> float:
  params = dict(config.get("rope_parameters") or {})
  kind = params.get("rope_type", "default")
  if kind != "default" or config.get("rope_scaling"):
    raise ValueError(f"config.json rope_type {kind!r} is not supported for model_type "
                     f"'minimax' (supported: 'default').")
  return float(params.get("rope_theta", get(config, "rope_theta", 1e6)))


def _specs(config: Mapping[str, Any]) -> list[LayerSpec]:
  for key, supported, default in (("hidden_act", "silu", "silu"), ("sliding_window", None, None),
                                  ("router_jitter_noise", 0.0, 0.0)):
    require(config, key, supported, default)
  eps = float(get(config, "rms_norm_eps", 1e-5))
  heads, head_dim = get(config, "num_attention_heads"), _head_dim(config)
  attn = dict(num_kv_heads=get(config, "num_key_value_heads", heads), head_dim=head_dim,
              rope_base=_rope_theta(config))
  moe = dict(num_experts=get(config, "num_local_experts", 8),
             top_k=get(config, "num_experts_per_tok", 2), score="softmax", renormalize=True)
  f = lambda key: number(get(config, key, 1.0))
  out = []
  for i, kind in enumerate(layer_types(config)):
    if kind == "linear_attention":
      mixer = ("lightning", dict(head_dim=head_dim, slope_scale=slope_scale(config, i)))
      ab = (f("linear_attn_alpha_factor"), f("linear_attn_beta_factor"))
    else:
      mixer = ("softmax", attn)
      ab = (f("full_attn_alpha_factor"), f("full_attn_beta_factor"))
    out.append(LayerSpec(mixer[0], heads, mixer_kwargs=mixer[1], mlp="moe",
                         mlp_hidden=get(config, "intermediate_size"), mlp_kwargs=moe,
                         norm_eps=eps, norm_residual=True,
                         residual_alpha=(ab[0], f("mlp_alpha_factor")),
                         residual_scale=(ab[1], f("mlp_beta_factor"))))
  return out


def build(config: Mapping[str, Any], *, rngs: nnx.Rngs, dtype=None,
          param_dtype=jnp.float32) -> LanguageModel:
  """The ``LanguageModel`` of a MiniMax ``config.json``."""
  return LanguageModel(get(config, "vocab_size"), get(config, "hidden_size"),
                       layers=_specs(config),
                       tie_embeddings=get(config, "tie_word_embeddings", False),
                       norm_eps=float(get(config, "rms_norm_eps", 1e-5)), rngs=rngs,
                       dtype=dtype, param_dtype=param_dtype)


def decay_tables(config: Mapping[str, Any], i: int) -> dict[str, np.ndarray]:
  """Layer ``i``'s lightning buffers as transformers stores them, float32: ``slope_rate``
  ``[H, 1, 1]``, ``query_decay`` / ``key_decay`` ``[H, block, 1]``, ``diagonal_decay``
  ``[1, H, block, block]``."""
  s = lightning_slopes(get(config, "num_attention_heads"), slope_scale(config, i))[:, None, None]
  block = get(config, "block_size", 256)
  r = np.arange(1, block + 1, dtype=np.float32)
  # Exponents in float32 as torch forms them; exp in float64, rounded once, gives torch's
  # float32 exp bit for bit where NumPy's float32 exp is a last bit off.
  exp = lambda x: np.exp(x.astype(np.float64)).astype(np.float32)
  d = s * (r[:, None] - r[None, :])[None]
  return dict(slope_rate=s, query_decay=exp(-s * r[:, None]),
              key_decay=exp(-s * (block - r[:, None])),
              diagonal_decay=exp(np.where(d >= 0, -d, -np.inf))[None])


def tensors(config: Mapping[str, Any]) -> list:
  """Checkpoint names of every parameter (and the lightning layers' buffers)."""
  out = embeddings_and_head(config, "model.embed_tokens.weight", "model.norm.weight", False)
  experts = get(config, "num_local_experts", 8)
  for i, kind in enumerate(layer_types(config)):
    hf, p = f"model.layers.{i}.", ("backbone", "blocks", i)
    a, pm = hf + "self_attn.", p + ("mixer",)
    out += [core.same(hf + "input_layernorm.weight", p + ("mixer_norm", "scale")),
            core.same(hf + "post_attention_layernorm.weight", p + ("mlp_norm", "scale"))]
    if kind == "linear_attention":
      out += [core.linear(a + "qkv_proj.weight", pm + ("qkv_proj", "kernel")),
              core.linear(a + "output_gate.weight", pm + ("g_proj", "kernel")),
              core.same(a + "norm.weight", pm + ("o_norm", "scale")),
              core.linear(a + "out_proj.weight", pm + ("o_proj", "kernel"))]
      out += [core.Constant(a + name, value) for name, value in decay_tables(config, i).items()]
    else:
      out += [core.linear(a + f"{n}_proj.weight", pm + (f"{n}_proj", "kernel")) for n in "qkvo"]
    m = hf + "block_sparse_moe."
    out += ([core.linear(m + "gate.weight", p + ("mlp", "router"))]
            + maps.experts(m + "experts.", p + ("mlp",), experts, gate="w1", up="w3", down="w2"))
  return out


MINIMAX = core.register(core.Family("minimax", "MiniMaxForCausalLM", build, tensors))
