"""Nemotron-H (``model_type="nemotron_h"``, nvidia/Nemotron-H-*, NVIDIA-Nemotron-Nano-*-v2):
one mixer per layer, ``x + mixer(RMSNorm(x))``: Mamba-2, attention without positional
encoding, or a squared-ReLU MLP.

The layer kinds come from ``layers_block_type`` (``"linear_attention"``, ``"full_attention"``,
``"mlp"``) or the older ``hybrid_override_pattern`` (``M``, ``*``, ``-``). MoE layers
(``"moe"`` / ``E``, Nemotron-3) are not supported yet: the config is refused, naming them.
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

_PATTERN = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
_LEGACY = {"mamba": "linear_attention", "attention": "full_attention"}
_MAMBA_KEYS = dict(heads="mamba_num_heads", head_dim="mamba_head_dim", state="ssm_state_size",
                   expand=None, act="mamba_hidden_act")


# Older configs' names, which transformers reads in place of the current ones.
_RENAMED = {"mamba_n_groups": "n_groups", "mamba_d_conv": "conv_kernel", "mamba_expand": "expand",
            "mamba_dt_limit": "time_step_limit", "mamba_conv_bias": "use_conv_bias",
            "mamba_chunk_size": "chunk_size"}


def _current(config: Mapping[str, Any]) -> dict:
  config = dict(config)
  for old, new in _RENAMED.items():
    if old in config:
      config[new] = config.pop(old)
  return config


def layer_kinds(config: Mapping[str, Any]) -> list[str]:
  """Every layer's kind, ``"linear_attention"``, ``"full_attention"`` or ``"mlp"``."""
  kinds = config.get("layers_block_type") or config.get("layer_types")
  if kinds is None:
    pattern = get(config, "hybrid_override_pattern")
    bad = sorted(set(pattern) - set(_PATTERN))
    if bad:
      raise ValueError(f"config.json hybrid_override_pattern has unknown letters {bad}; "
                       f"known: {_PATTERN}.")
    kinds = [_PATTERN[c] for c in pattern]
  kinds = [_LEGACY.get(k, k) for k in kinds]
  unsupported = sorted({k for k in kinds if k not in ("linear_attention", "full_attention", "mlp")})
  if unsupported:
    raise ValueError(f"config.json layers_block_type has {unsupported} layers, which are not "
                     f"supported yet (supported: linear_attention, full_attention, mlp).")
  if get(config, "num_nextn_predict_layers", 0):
    raise ValueError("config.json num_nextn_predict_layers > 0 (multi-token prediction layers) "
                     "is not supported.")
  return kinds


def _specs(config: Mapping[str, Any]) -> list[LayerSpec]:
  config = _current(config)
  for key, supported, default in (("attention_bias", False, False), ("mlp_bias", False, False),
                                  ("mlp_hidden_act", "relu2", "relu2"),
                                  ("sliding_window", None, None)):
    require(config, key, supported, default)
  eps = float(get(config, "layer_norm_epsilon", 1e-5))
  d = get(config, "hidden_size")
  heads = get(config, "num_attention_heads")
  attn = dict(num_kv_heads=get(config, "num_key_value_heads", heads),
              head_dim=get(config, "head_dim", d // heads), use_rope=False)
  m_heads, m_kwargs = mamba2.mixer_kwargs(config, **_MAMBA_KEYS)
  out = []
  for kind in layer_kinds(config):
    if kind == "linear_attention":
      out.append(LayerSpec("mamba2", m_heads, mixer_kwargs=m_kwargs, norm_eps=eps))
    elif kind == "full_attention":
      out.append(LayerSpec("softmax", heads, mixer_kwargs=attn, norm_eps=eps))
    else:
      out.append(LayerSpec(None, mlp="relu2", mlp_hidden=get(config, "intermediate_size"),
                           norm_eps=eps))
  return out


def build(config: Mapping[str, Any], *, rngs: nnx.Rngs, dtype=None,
          param_dtype=jnp.float32) -> LanguageModel:
  """The ``LanguageModel`` of a Nemotron-H ``config.json``."""
  return LanguageModel(get(config, "vocab_size"), get(config, "hidden_size"),
                       layers=_specs(config),
                       tie_embeddings=get(config, "tie_word_embeddings", False),
                       norm_eps=float(get(config, "layer_norm_epsilon", 1e-5)), rngs=rngs,
                       dtype=dtype, param_dtype=param_dtype)


def tensors(config: Mapping[str, Any]) -> list:
  """Checkpoint names of every parameter (transformers writes the ``backbone.`` prefix)."""
  config = _current(config)
  out = embeddings_and_head(config, "backbone.embeddings.weight", "backbone.norm_f.weight", False)
  for i, kind in enumerate(layer_kinds(config)):
    hf, p = f"backbone.layers.{i}.", ("backbone", "blocks", i)
    m = hf + "mixer."
    if kind == "mlp":
      out += [core.same(hf + "norm.weight", p + ("mlp_norm", "scale")),
              core.linear(m + "up_proj.weight", p + ("mlp", "up", "kernel")),
              core.linear(m + "down_proj.weight", p + ("mlp", "down", "kernel"))]
      continue
    out.append(core.same(hf + "norm.weight", p + ("mixer_norm", "scale")))
    if kind == "linear_attention":
      out += mamba2.mixer_tensors(m, p + ("mixer",), config, heads="mamba_num_heads",
                                  head_dim="mamba_head_dim")
    else:
      out += [core.linear(m + f"{n}_proj.weight", p + ("mixer", f"{n}_proj", "kernel"))
              for n in "qkvo"]
  return out


NEMOTRON_H = core.register(core.Family("nemotron_h", "NemotronHForCausalLM", build, tensors))
