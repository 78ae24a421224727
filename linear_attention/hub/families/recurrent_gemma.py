"""RecurrentGemma (``model_type="recurrent_gemma"``, e.g. google/recurrentgemma-2b, -9b):
Griffin. ``block_types`` (repeated over the layers) alternates ``nn.HawkBlock`` (the
recurrent block, RG-LRU) and ``nn.LocalAttention`` (multi-query sliding-window attention,
RoPE on part of each head, a bias on the output projection only); every block has a GeGLU
MLP with biases.

Gemma's conventions: RMSNorm weights are zero-centred (``1 + weight``, the blocks'
``norm_offset=1``), the embeddings are multiplied by ``sqrt(hidden_size)`` rounded to
bfloat16 (as transformers does), the logits are soft-capped, and the head is tied.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx

from linear_attention.hub import core
from linear_attention.hub.families.common import as_int, embeddings_and_head, get, require
from linear_attention.models.blocks import LayerSpec
from linear_attention.models.lm import LanguageModel

# transformers' RecurrentGemmaConfig defaults.
_DEFAULTS = dict(num_attention_heads=10, attention_window_size=2048, conv1d_width=4,
                 logits_soft_cap=30.0, rms_norm_eps=1e-6, attention_bias=False,
                 block_types=("recurrent", "recurrent", "attention"), rope_theta=10000.0,
                 partial_rotary_factor=0.5)


def _get(config, key):
  return get(config, key, _DEFAULTS[key])


def _rope(config: Mapping[str, Any]) -> tuple[float, float]:
  """``(rope_theta, partial_rotary_factor)`` from ``rope_parameters`` (transformers 5) or the
  top-level keys of older configs."""
  rope = dict(get(config, "rope_parameters", {}) or {})
  if rope.get("rope_type", "default") != "default":
    raise ValueError(f"config.json rope_parameters.rope_type={rope['rope_type']!r} is not "
                     "supported for model_type 'recurrent_gemma' (supported: 'default').")
  theta = rope.get("rope_theta", _get(config, "rope_theta"))
  factor = rope.get("partial_rotary_factor", _get(config, "partial_rotary_factor"))
  return float(theta), float(factor)


def _kinds(config: Mapping[str, Any]) -> list[str]:
  types = list(_get(config, "block_types"))
  bad = sorted(set(types) - {"recurrent", "attention"})
  if bad:
    raise ValueError(f"config.json block_types holds {bad}; supported: 'recurrent', "
                     "'attention'.")
  n = get(config, "num_hidden_layers")
  return [types[i % len(types)] for i in range(n)]


def embed_scale(d_model: int) -> float:
  """``sqrt(d_model)`` rounded to bfloat16, transformers' RecurrentGemma normaliser."""
  # NumPy through ml_dtypes: build() runs under nnx.eval_shape, where jnp values are traced.
  return float(np.asarray(math.sqrt(d_model), ml_dtypes.bfloat16).astype(np.float32))


def build(config: Mapping[str, Any], *, rngs: nnx.Rngs, dtype=None,
          param_dtype=jnp.float32) -> LanguageModel:
  """The ``LanguageModel`` of a RecurrentGemma ``config.json``."""
  require(config, "hidden_activation", "gelu_pytorch_tanh", "gelu_pytorch_tanh")
  d = get(config, "hidden_size")
  heads = _get(config, "num_attention_heads")
  kv_heads = get(config, "num_key_value_heads", heads)
  head_dim = d // heads
  theta, factor = _rope(config)
  eps = float(_get(config, "rms_norm_eps"))
  recurrent = dict(lru_width=get(config, "lru_width", d), conv_width=_get(config, "conv1d_width"))
  attention = dict(window=_get(config, "attention_window_size"), num_kv_heads=kv_heads,
                   head_dim=head_dim, rope_base=theta,
                   rotary_dim=as_int(config, "partial_rotary_factor", head_dim * factor),
                   use_bias=bool(_get(config, "attention_bias")), out_bias=True)
  hidden = get(config, "intermediate_size") // 2
  layers = [LayerSpec("hawk" if kind == "recurrent" else "local", heads,
                      mixer_kwargs=recurrent if kind == "recurrent" else attention,
                      mlp="geglu_bias", mlp_hidden=hidden, norm_eps=eps, norm_offset=1.0)
            for kind in _kinds(config)]
  cap = get(config, "logits_soft_cap", _DEFAULTS["logits_soft_cap"])
  return LanguageModel(get(config, "vocab_size"), d, layers=layers,
                       tie_embeddings=get(config, "tie_word_embeddings", True), norm_eps=eps,
                       norm_offset=1.0, embed_scale=embed_scale(d),
                       logit_soft_cap=None if cap is None else float(cap), rngs=rngs,
                       dtype=dtype, param_dtype=param_dtype)


def _concat(names: list[str], path: tuple) -> core.Tensor:
  """Equal-sized vectors side by side (the fused gate and up biases)."""
  n = len(names)
  return core.Tensor(tuple(path), tuple(names), lambda a: np.concatenate(a),
                     lambda v: list(np.split(v, n)))


def _negated(name: str, path: tuple) -> core.Tensor:
  """``recurrent_param`` is ``-Lambda`` of ``nn.HawkBlock`` (``a = sigmoid(Lambda)^c``)."""
  return core.Tensor(tuple(path), (name,), lambda a: -a[0], lambda v: [-v])


def tensors(config: Mapping[str, Any]) -> list:
  """Checkpoint names of every parameter."""
  bias = bool(_get(config, "attention_bias"))
  out = embeddings_and_head(config, "model.embed_tokens.weight", "model.final_norm.weight", True)
  for i, kind in enumerate(_kinds(config)):
    hf, p = f"model.layers.{i}.", ("backbone", "blocks", i)
    t, pm = hf + "temporal_block.", p + ("mixer",)
    out += [core.same(hf + "temporal_pre_norm.weight", p + ("mixer_norm", "scale")),
            core.same(hf + "channel_pre_norm.weight", p + ("mlp_norm", "scale"))]
    if kind == "recurrent":
      for theirs, ours in (("linear_y", "y_proj"), ("linear_x", "x_proj"),
                           ("linear_out", "out_proj")):
        out += [core.linear(t + theirs + ".weight", pm + (ours, "kernel")),
                core.same(t + theirs + ".bias", pm + (ours, "bias"))]
      r = t + "rg_lru."
      out += [core.conv1d(t + "conv_1d.weight", pm + ("conv", "weight")),
              core.same(t + "conv_1d.bias", pm + ("conv", "bias")),
              _negated(r + "recurrent_param", pm + ("log_lambda",)),
              core.same(r + "recurrent_gate_weight", pm + ("gate_r", "w")),
              core.same(r + "recurrent_gate_bias", pm + ("gate_r", "b")),
              core.same(r + "input_gate_weight", pm + ("gate_i", "w")),
              core.same(r + "input_gate_bias", pm + ("gate_i", "b"))]
    else:
      for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
        out.append(core.linear(t + proj + ".weight", pm + (proj, "kernel")))
        if bias or proj == "o_proj":
          out.append(core.same(t + proj + ".bias", pm + (proj, "bias")))
    m, pp = hf + "mlp_block.", p + ("mlp",)
    out += [core.linears([m + "gate_proj.weight", m + "up_proj.weight"], pp + ("up", "kernel")),
            _concat([m + "gate_proj.bias", m + "up_proj.bias"], pp + ("up", "bias")),
            core.linear(m + "down_proj.weight", pp + ("down", "kernel")),
            core.same(m + "down_proj.bias", pp + ("down", "bias"))]
  return out


RECURRENT_GEMMA = core.register(core.Family("recurrent_gemma", "RecurrentGemmaForCausalLM",
                                            build, tensors))
