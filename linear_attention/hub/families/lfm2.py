"""LFM2 (``model_type="lfm2"``, e.g. LiquidAI/LFM2-350M, -700M, -1.2B, -2.6B): a hybrid of
``nn.GatedShortConv`` blocks (LFM2's input- and output-gated short convolution) and
grouped-query attention with q/k RMSNorm per head (``layer_types``); every block has a
SwiGLU MLP. The final RMSNorm is the checkpoint's ``embedding_norm``; the head is tied.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax.numpy as jnp
from flax import nnx

from linear_attention.hub import core
from linear_attention.hub.families.common import embeddings_and_head, get
from linear_attention.models.blocks import LayerSpec
from linear_attention.models.lm import LanguageModel

# transformers' Lfm2Config defaults.
_DEFAULTS = dict(num_attention_heads=32, num_key_value_heads=8, norm_eps=1e-5,
                 conv_bias=False, conv_L_cache=3, block_multiple_of=256,
                 block_ffn_dim_multiplier=1.0, block_auto_adjust_ff_dim=True, rope_theta=1e6)


def _get(config, key):
  return get(config, key, _DEFAULTS[key])


def _kinds(config: Mapping[str, Any]) -> list[str]:
  """``"full_attention"`` or ``"conv"`` per layer (``layer_types``, else ``full_attn_idxs``)."""
  n = get(config, "num_hidden_layers")
  types = get(config, "layer_types", None)
  if types is None:
    idxs = get(config, "full_attn_idxs", None)
    attn = set(range(n) if idxs is None else idxs)
    types = ["full_attention" if i in attn else "conv" for i in range(n)]
  bad = sorted(set(types) - {"full_attention", "conv"})
  if bad or len(types) != n:
    raise ValueError(f"config.json layer_types must give 'full_attention' or 'conv' for each "
                     f"of the {n} layers, got {types!r}.")
  return list(types)


def _mlp_hidden(config: Mapping[str, Any]) -> int:
  """The feed-forward width as transformers' ``Lfm2MLP`` computes it."""
  hidden = get(config, "intermediate_size", get(config, "block_ff_dim", None))
  if _get(config, "block_auto_adjust_ff_dim"):
    hidden = int(2 * hidden / 3)
    mult = _get(config, "block_ffn_dim_multiplier")
    if mult is not None:
      hidden = int(mult * hidden)
      m = _get(config, "block_multiple_of")
      hidden = m * ((hidden + m - 1) // m)
  return hidden


def _rope_theta(config: Mapping[str, Any]) -> float:
  rope = dict(get(config, "rope_parameters", {}) or {})
  if rope.get("rope_type", "default") != "default":
    raise ValueError(f"config.json rope_parameters.rope_type={rope['rope_type']!r} is not "
                     "supported for model_type 'lfm2' (supported: 'default').")
  return float(rope.get("rope_theta", _get(config, "rope_theta")))


def _tied(config: Mapping[str, Any]) -> bool:
  return bool(get(config, "tie_word_embeddings", get(config, "tie_embedding", True)))


def build(config: Mapping[str, Any], *, rngs: nnx.Rngs, dtype=None,
          param_dtype=jnp.float32) -> LanguageModel:
  """The ``LanguageModel`` of an LFM2 ``config.json``."""
  d = get(config, "hidden_size")
  heads = _get(config, "num_attention_heads")
  eps = float(_get(config, "norm_eps"))
  attention = dict(num_kv_heads=_get(config, "num_key_value_heads"),
                   head_dim=get(config, "head_dim", d // heads), rope_base=_rope_theta(config),
                   qk_norm="head", qk_norm_eps=eps)
  conv = dict(conv_width=_get(config, "conv_L_cache"), use_bias=bool(_get(config, "conv_bias")))
  hidden = _mlp_hidden(config)
  layers = [LayerSpec("softmax" if kind == "full_attention" else "gated_conv", heads,
                      mixer_kwargs=attention if kind == "full_attention" else conv,
                      mlp="swiglu", mlp_hidden=hidden, norm_eps=eps)
            for kind in _kinds(config)]
  return LanguageModel(get(config, "vocab_size"), d, layers=layers, tie_embeddings=_tied(config),
                       norm_eps=eps, rngs=rngs, dtype=dtype, param_dtype=param_dtype)


def tensors(config: Mapping[str, Any]) -> list:
  """Checkpoint names of every parameter."""
  bias = bool(_get(config, "conv_bias"))
  out = embeddings_and_head(dict(config, tie_word_embeddings=_tied(config)),
                            "model.embed_tokens.weight", "model.embedding_norm.weight", True)
  for i, kind in enumerate(_kinds(config)):
    hf, p = f"model.layers.{i}.", ("backbone", "blocks", i)
    pm = p + ("mixer",)
    out += [core.same(hf + "operator_norm.weight", p + ("mixer_norm", "scale")),
            core.same(hf + "ffn_norm.weight", p + ("mlp_norm", "scale"))]
    if kind == "full_attention":
      a = hf + "self_attn."
      out += [core.linear(a + "q_proj.weight", pm + ("q_proj", "kernel")),
              core.linear(a + "k_proj.weight", pm + ("k_proj", "kernel")),
              core.linear(a + "v_proj.weight", pm + ("v_proj", "kernel")),
              core.linear(a + "out_proj.weight", pm + ("o_proj", "kernel")),
              core.same(a + "q_layernorm.weight", pm + ("q_norm", "scale")),
              core.same(a + "k_layernorm.weight", pm + ("k_norm", "scale"))]
    else:
      c = hf + "conv."
      out += [core.linear(c + "in_proj.weight", pm + ("in_proj", "kernel")),
              core.conv1d(c + "conv.weight", pm + ("conv", "weight")),
              core.linear(c + "out_proj.weight", pm + ("out_proj", "kernel"))]
      if bias:
        out += [core.same(c + "in_proj.bias", pm + ("in_proj", "bias")),
                core.same(c + "conv.bias", pm + ("conv", "bias")),
                core.same(c + "out_proj.bias", pm + ("out_proj", "bias"))]
    f = hf + "feed_forward."
    out += [core.linears([f + "w1.weight", f + "w3.weight"], p + ("mlp", "up", "kernel")),
            core.linear(f + "w2.weight", p + ("mlp", "down", "kernel"))]
  return out


LFM2 = core.register(core.Family("lfm2", "Lfm2ForCausalLM", build, tensors))
