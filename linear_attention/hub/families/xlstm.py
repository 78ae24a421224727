"""xLSTM (``model_type="xlstm"``, e.g. NX-AI/xLSTM-7b): pre-norm blocks of
``nn.MLSTMLayer`` (xLSTM-7B's mLSTM layer) and a SwiGLU feed-forward, a final RMSNorm, an
untied head and the output logits soft-capped.

The checkpoints' mLSTM starts each state at ``m = 0`` and adds ``eps`` to the read's
denominator (the layer's ``initial_m`` and ``eps``); its gate pre-activations are soft-capped
at ``gate_soft_cap``. Both ``weight_mode`` layouts load: ``"single"`` (one tensor per
projection, as NX-AI/xLSTM-7b is stored) and ``"fused"`` (q, k, v and the output gate in one
tensor, the two gates in another, the feed-forward's gate and up in a third).
"""

from __future__ import annotations

from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np
from flax import nnx

from linear_attention.hub import core
from linear_attention.hub.families import maps
from linear_attention.hub.families.common import embeddings_and_head, get, require
from linear_attention.models.blocks import LayerSpec
from linear_attention.models.lm import LanguageModel

# transformers' xLSTMConfig defaults.
_DEFAULTS = dict(num_heads=8, norm_eps=1e-6, qk_dim_factor=0.5, v_dim_factor=1.0,
                 gate_soft_cap=15.0, output_logit_soft_cap=30.0, eps=1e-6, chunk_size=64,
                 ffn_proj_factor=2.667, ffn_round_up_to_multiple_of=64, weight_mode="single")


def _get(config, key):
  return get(config, key, _DEFAULTS[key])


def _round_up(x: float, multiple: int) -> int:
  return int(((x + multiple - 1) // multiple) * multiple)


def _dims(config: Mapping[str, Any]) -> tuple[int, int, int, int]:
  """``(hidden, qk_dim, v_dim, ffn_hidden)`` as transformers' xLSTM layers compute them."""
  d = get(config, "hidden_size", get(config, "embedding_dim", None))
  if d is None:
    raise ValueError("config.json of model_type 'xlstm' needs 'hidden_size' or 'embedding_dim'.")
  qk = int(d * _get(config, "qk_dim_factor"))
  v = int(d * _get(config, "v_dim_factor"))
  ffn = _round_up(d * _get(config, "ffn_proj_factor"), _get(config, "ffn_round_up_to_multiple_of"))
  return d, qk, v, ffn


def _layers(config):
  return get(config, "num_hidden_layers", get(config, "num_blocks", None))


def build(config: Mapping[str, Any], *, rngs: nnx.Rngs, dtype=None,
          param_dtype=jnp.float32) -> LanguageModel:
  """The ``LanguageModel`` of an xLSTM ``config.json``."""
  require(config, "use_bias", False, False)
  require(config, "add_out_norm", True, True)
  if _get(config, "weight_mode") not in ("single", "fused"):
    raise ValueError(f"config.json weight_mode={config['weight_mode']!r} is not supported for "
                     "model_type 'xlstm' (supported: 'single', 'fused').")
  d, _, _, ffn = _dims(config)
  eps = float(_get(config, "norm_eps"))
  # The layer computes int(d * factor) as transformers' does.
  kwargs = dict(qk_dim_factor=float(_get(config, "qk_dim_factor")),
                v_dim_factor=float(_get(config, "v_dim_factor")),
                gate_soft_cap=float(_get(config, "gate_soft_cap")), norm_eps=eps,
                eps=float(_get(config, "eps")), initial_m=0.0,
                chunk_size=int(_get(config, "chunk_size")))
  spec = LayerSpec("mlstm_layer", _get(config, "num_heads"), mixer_kwargs=kwargs, mlp="swiglu",
                   mlp_hidden=ffn, norm_eps=eps)
  cap = get(config, "output_logit_soft_cap", _DEFAULTS["output_logit_soft_cap"])
  return LanguageModel(get(config, "vocab_size"), d, layers=[spec] * _layers(config),
                       tie_embeddings=get(config, "tie_word_embeddings", False), norm_eps=eps,
                       logit_soft_cap=None if cap is None else float(cap), rngs=rngs,
                       dtype=dtype, param_dtype=param_dtype)


def _mixer(m: str, pm: tuple) -> list:
  return [core.linear(m + "q.weight", pm + ("q_proj", "kernel")),
          core.linear(m + "k.weight", pm + ("k_proj", "kernel")),
          core.linear(m + "v.weight", pm + ("v_proj", "kernel")),
          core.linear(m + "ogate_preact.weight", pm + ("o_gate", "kernel")),
          core.linear(m + "igate_preact.weight", pm + ("i_gate", "kernel")),
          core.same(m + "igate_preact.bias", pm + ("i_gate", "bias")),
          core.linear(m + "fgate_preact.weight", pm + ("f_gate", "kernel")),
          core.same(m + "fgate_preact.bias", pm + ("f_gate", "bias"))]


def _mixer_fused(m: str, pm: tuple, qk: int, v: int, h: int) -> list:
  # transformers splits qkv_opreact's rows at (qk, 2 qk, 2 qk + v) and ifgate_preact's at H.
  gates = (pm + ("i_gate", "bias"), pm + ("f_gate", "bias"))
  return [maps.rows(m + "qkv_opreact.weight",
                    [pm + (p, "kernel") for p in ("q_proj", "k_proj", "v_proj", "o_gate")],
                    1, (qk, qk, v, v)),
          maps.rows(m + "ifgate_preact.weight", [pm + ("i_gate", "kernel"),
                                                 pm + ("f_gate", "kernel")], 1, (h, h)),
          core.Split(gates, m + "ifgate_preact.bias", lambda a: list(np.split(a, 2)),
                     np.concatenate)]


def tensors(config: Mapping[str, Any]) -> list:
  """Checkpoint names of every parameter."""
  _, qk, v, _ = _dims(config)
  fused = _get(config, "weight_mode") == "fused"
  h = _get(config, "num_heads")
  out = embeddings_and_head(config, "backbone.embeddings.weight", "backbone.out_norm.weight",
                            False)
  for i in range(_layers(config)):
    hf, p = f"backbone.blocks.{i}.", ("backbone", "blocks", i)
    m, pm = hf + "mlstm_layer.", p + ("mixer",)
    out.append(core.same(hf + "norm_mlstm.weight", p + ("mixer_norm", "scale")))
    out += _mixer_fused(m, pm, qk, v, h) if fused else _mixer(m, pm)
    out += [core.reshaped(m + "multihead_norm.weight", pm + ("o_norm", "scale"), (h, v // h)),
            core.linear(m + "out_proj.weight", pm + ("out_proj", "kernel")),
            core.same(hf + "norm_ffn.weight", p + ("mlp_norm", "scale")),
            core.linear(hf + "ffn.proj_down.weight", p + ("mlp", "down", "kernel"))]
    up = p + ("mlp", "up", "kernel")
    if fused:  # the gate rows, then the up rows: the SwiGLU's fused kernel as it is
      out.append(core.linear(hf + "ffn.proj_up_gate_z.weight", up))
    else:
      out.append(core.linears([hf + "ffn.proj_up_gate.weight", hf + "ffn.proj_up.weight"], up))
  return out


XLSTM = core.register(core.Family("xlstm", "xLSTMForCausalLM", build, tensors))
