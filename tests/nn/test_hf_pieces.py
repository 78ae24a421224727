"""The shared model pieces (MoE, attention options, MLA, Gated DeltaNet and KDA head sizes)
against transformers' own torch modules with copied weights, float32.

Skipped without torch/transformers (the ``[hf]`` extra)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import jax
import jax.numpy as jnp
from flax import nnx

from linear_attention.nn import attention, delta, moe, mlp
from tests.helpers import decode_all

pytestmark = pytest.mark.hf

RTOL = 1e-4


def t2j(t) -> jnp.ndarray:
  return jnp.asarray(t.detach().numpy())


def set_linear(layer, weight, bias=None):
  """An ``nnx.Linear`` from a torch ``[out, in]`` weight."""
  layer.kernel.set_value(t2j(weight).T)
  if bias is not None:
    layer.bias.set_value(t2j(bias))


def set_swiglu(dst: mlp.MLP, gate, up, down):
  dst.up.kernel.set_value(jnp.concatenate([t2j(gate).T, t2j(up).T], axis=1))
  dst.down.kernel.set_value(t2j(down).T)


def rel_err(a, b) -> float:
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def set_experts(dst: moe.MoE, experts):
  dst.gate_up.set_value(t2j(experts.gate_up_proj).transpose(0, 2, 1))
  dst.down.set_value(t2j(experts.down_proj).transpose(0, 2, 1))


def test_moe_matches_qwen3_next_sparse_block():
  from transformers.models.qwen3_next import configuration_qwen3_next as cq, modeling_qwen3_next as mq
  torch.manual_seed(0)
  cfg = cq.Qwen3NextConfig(hidden_size=32, num_experts=8, num_experts_per_tok=3,
                           moe_intermediate_size=16, shared_expert_intermediate_size=24,
                           norm_topk_prob=True, initializer_range=0.2)
  ref = mq.Qwen3NextSparseMoeBlock(cfg).float()
  for p in ref.parameters():
    torch.nn.init.normal_(p, std=0.2)
  layer = moe.MoE(32, 8, 3, 16, score="softmax", shared_hidden=24, shared_gate=True,
                  rngs=nnx.Rngs(0))
  layer.router.set_value(t2j(ref.gate.weight).T)
  set_experts(layer, ref.experts)
  se = ref.shared_expert
  set_swiglu(layer.shared, se.gate_proj.weight, se.up_proj.weight, se.down_proj.weight)
  layer.shared_gate.kernel.set_value(t2j(ref.shared_expert_gate.weight).T)
  x = torch.randn(2, 7, 32)
  want = ref(x).detach().numpy()
  got = layer(t2j(x))
  assert rel_err(got, want) < RTOL


@pytest.mark.parametrize("groups", [1, 2])
def test_moe_matches_kimi_linear_moe(groups):
  from transformers.models.kimi_linear import (configuration_kimi_linear as ck,
                                               modeling_kimi_linear as mk)
  torch.manual_seed(1)
  cfg = ck.KimiLinearConfig(hidden_size=32, num_local_experts=8, num_experts_per_tok=2,
                            moe_intermediate_size=16, n_shared_experts=2, n_group=groups,
                            topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True)
  ref = mk.KimiLinearMoE(cfg).float()
  for p in ref.parameters():
    torch.nn.init.normal_(p, std=0.2)
  ref.gate.e_score_correction_bias.normal_(std=0.1)
  layer = moe.MoE(32, 8, 2, 16, score="sigmoid", score_bias=True, routed_scale=2.5,
                  num_groups=groups, topk_groups=1, shared_hidden=32, rngs=nnx.Rngs(0))
  layer.router.set_value(t2j(ref.gate.weight).T)
  layer.score_bias.set_value(t2j(ref.gate.e_score_correction_bias))
  set_experts(layer, ref.experts)
  se = ref.shared_experts
  set_swiglu(layer.shared, se.gate_proj.weight, se.up_proj.weight, se.down_proj.weight)
  x = torch.randn(2, 5, 32)
  assert rel_err(layer(t2j(x)), ref(x).detach().numpy()) < RTOL


def causal_mask(t: int):
  return torch.full((t, t), float("-inf")).triu(1)[None, None]


def randomize(module, std=0.2):
  with torch.no_grad():
    for p in module.parameters():
      p.normal_(std=std)


def qwen3_next_config(**kw):
  from transformers.models.qwen3_next import configuration_qwen3_next as cq
  base = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
              linear_value_head_dim=12, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
              num_hidden_layers=4, vocab_size=64)
  base.update(kw)
  cfg = cq.Qwen3NextConfig(**base)
  cfg._attn_implementation = "eager"
  return cfg


def test_gated_attention_matches_qwen3_next():
  """Per-head zero-centred q/k norm, output gate, partial RoPE (a quarter), GQA."""
  from transformers.models.qwen3_next import modeling_qwen3_next as mq
  torch.manual_seed(2)
  cfg = qwen3_next_config()
  ref = mq.Qwen3NextAttention(cfg, 3).float()
  randomize(ref)
  rot = mq.Qwen3NextRotaryEmbedding(cfg)
  h, dh = 4, 16
  layer = attention.SoftmaxAttention(32, h, num_kv_heads=2, head_dim=dh, rotary_dim=4,
                                     qk_norm="head", norm_offset=1, output_gate=True,
                                     rope_base=cfg.rope_parameters["rope_theta"],
                                     rngs=nnx.Rngs(0))
  wq = ref.q_proj.weight.reshape(h, 2, dh, 32)
  set_linear(layer.q_proj, wq[:, 0].reshape(h * dh, 32))
  set_linear(layer.g_proj, wq[:, 1].reshape(h * dh, 32))
  set_linear(layer.k_proj, ref.k_proj.weight)
  set_linear(layer.v_proj, ref.v_proj.weight)
  set_linear(layer.o_proj, ref.o_proj.weight)
  layer.q_norm.scale.set_value(t2j(ref.q_norm.weight))
  layer.k_norm.scale.set_value(t2j(ref.k_norm.weight))
  t = 11
  x = torch.randn(2, t, 32)
  pos = torch.arange(t)[None].expand(2, t)
  want = ref(x, rot(x, pos), causal_mask(t))[0].detach().numpy()
  got = layer(t2j(x))
  assert rel_err(got, want) < RTOL
  assert rel_err(decode_all(layer, t2j(x)), want) < RTOL


def test_full_width_qk_norm_attention_matches_olmo_hybrid():
  from transformers.models.olmo_hybrid import (configuration_olmo_hybrid as co,
                                               modeling_olmo_hybrid as mo)
  torch.manual_seed(3)
  cfg = co.OlmoHybridConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                            num_hidden_layers=2, vocab_size=64,
                            rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
  cfg._attn_implementation = "eager"
  ref = mo.OlmoHybridAttention(cfg, 1).float()
  randomize(ref)
  rot = mo.OlmoHybridRotaryEmbedding(cfg)
  layer = attention.SoftmaxAttention(32, 4, num_kv_heads=2, qk_norm="full",
                                     qk_norm_eps=cfg.rms_norm_eps, rope_base=500000.0,
                                     rngs=nnx.Rngs(0))
  for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
    set_linear(getattr(layer, name), getattr(ref, name).weight)
  layer.q_norm.scale.set_value(t2j(ref.q_norm.weight))
  layer.k_norm.scale.set_value(t2j(ref.k_norm.weight))
  t = 9
  x = torch.randn(2, t, 32)
  pos = torch.arange(t)[None].expand(2, t)
  want = ref(x, rot(x, pos), causal_mask(t))[0].detach().numpy()
  assert rel_err(layer(t2j(x)), want) < RTOL
  assert rel_err(decode_all(layer, t2j(x)), want) < RTOL


def kimi_config(**kw):
  from transformers.models.kimi_linear import configuration_kimi_linear as ck
  base = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=8,
              qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, q_lora_rank=None,
              linear_num_heads=2, linear_head_dim=12, num_hidden_layers=2, vocab_size=64,
              rms_norm_eps=1e-5)
  base.update(kw)
  cfg = ck.KimiLinearConfig(**base)
  cfg._attn_implementation = "eager"
  return cfg


def set_mla(layer, ref):
  if ref.q_proj is not None:
    set_linear(layer.q_proj, ref.q_proj.weight)
  else:
    set_linear(layer.q_a_proj, ref.q_a_proj.weight, ref.q_a_proj.bias)
    layer.q_a_norm.scale.set_value(t2j(ref.q_a_layernorm.weight))
    set_linear(layer.q_b_proj, ref.q_b_proj.weight)
  set_linear(layer.kv_a_proj, ref.kv_a_proj_with_mqa.weight, ref.kv_a_proj_with_mqa.bias)
  layer.kv_a_norm.scale.set_value(t2j(ref.kv_a_layernorm.weight))
  set_linear(layer.kv_b_proj, ref.kv_b_proj.weight)
  set_linear(layer.o_proj, ref.o_proj.weight, ref.o_proj.bias)


@pytest.mark.parametrize("q_lora_rank", [None, 6])
def test_mla_matches_kimi_linear(q_lora_rank):
  from transformers.models.kimi_linear import modeling_kimi_linear as mk
  torch.manual_seed(4)
  cfg = kimi_config(q_lora_rank=q_lora_rank)
  ref = mk.KimiLinearAttention(cfg, 0).float()
  randomize(ref)
  layer = attention.MultiHeadLatentAttention(32, 4, kv_lora_rank=8, q_lora_rank=q_lora_rank,
                                             qk_nope_head_dim=8, qk_rope_head_dim=4,
                                             v_head_dim=6, rngs=nnx.Rngs(0))
  set_mla(layer, ref)
  t = 10
  x = torch.randn(2, t, 32)
  want = ref(x, causal_mask(t))[0].detach().numpy()
  assert rel_err(layer(t2j(x)), want) < RTOL
  assert rel_err(decode_all(layer, t2j(x)), want) < RTOL


def set_conv(conv, weight):
  conv.weight.set_value(t2j(weight[:, 0, :]).T)


def test_gated_deltanet_grouped_heads_matches_qwen3_next():
  """2 q/k heads of 8, 4 value heads of 12: transformers' fused, per-key-head-grouped
  in_proj_qkvz/in_proj_ba rows regrouped into the layer's projections."""
  from transformers.models.qwen3_next import modeling_qwen3_next as mq
  torch.manual_seed(5)
  cfg = qwen3_next_config()
  ref = mq.Qwen3NextGatedDeltaNet(cfg, 0).float()
  randomize(ref)
  hk, hv, dk, dv = 2, 4, 8, 12
  g = hv // hk
  layer = delta.GatedDeltaNet(32, hk, num_v_heads=hv, head_k_dim=dk, head_v_dim=dv,
                              norm_eps=cfg.rms_norm_eps, rngs=nnx.Rngs(0))
  w = ref.in_proj_qkvz.weight.reshape(hk, 2 * dk + 2 * g * dv, 32)
  q, k = w[:, :dk].reshape(-1, 32), w[:, dk:2 * dk].reshape(-1, 32)
  v, z = w[:, 2 * dk:2 * dk + g * dv].reshape(-1, 32), w[:, 2 * dk + g * dv:].reshape(-1, 32)
  set_linear(layer.qkv_proj, torch.cat([q, k, v]))
  set_linear(layer.g_proj, z)
  ba = ref.in_proj_ba.weight.reshape(hk, 2 * g, 32)
  set_linear(layer.b_proj, ba[:, :g].reshape(hv, 32))
  set_linear(layer.a_proj, ba[:, g:].reshape(hv, 32))
  set_conv(layer.conv, ref.conv1d.weight)
  layer.A_log.set_value(t2j(ref.A_log))
  layer.dt_bias.set_value(t2j(ref.dt_bias))
  layer.o_norm.scale.set_value(t2j(ref.norm.weight))
  set_linear(layer.o_proj, ref.out_proj.weight)
  x = torch.randn(2, 13, 32)
  want = ref(x).detach().numpy()
  assert rel_err(layer(t2j(x)), want) < RTOL
  assert rel_err(decode_all(layer, t2j(x)), want) < RTOL


def test_gated_deltanet_head_sizes_match_olmo_hybrid():
  from transformers.models.olmo_hybrid import (configuration_olmo_hybrid as co,
                                               modeling_olmo_hybrid as mo)
  torch.manual_seed(6)
  cfg = co.OlmoHybridConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=2,
                            vocab_size=64, linear_num_key_heads=2, linear_num_value_heads=2,
                            linear_key_head_dim=12, linear_value_head_dim=24)
  ref = mo.OlmoHybridGatedDeltaNet(cfg, 0).float()
  randomize(ref)
  layer = delta.GatedDeltaNet(32, 2, head_k_dim=12, head_v_dim=24, allow_neg_eigval=True,
                              norm_eps=1e-5, rngs=nnx.Rngs(0))
  set_linear(layer.qkv_proj, torch.cat([ref.q_proj.weight, ref.k_proj.weight, ref.v_proj.weight]))
  for name in ("a_proj", "b_proj", "g_proj", "o_proj"):
    set_linear(getattr(layer, name), getattr(ref, name).weight)
  set_conv(layer.conv, ref.conv1d.weight)
  layer.A_log.set_value(t2j(ref.A_log))
  layer.dt_bias.set_value(t2j(ref.dt_bias))
  layer.o_norm.scale.set_value(t2j(ref.o_norm.weight))
  x = torch.randn(2, 70, 32)  # more than one chunk of 64
  want = ref(x).detach().numpy()
  assert rel_err(layer(t2j(x)), want) < RTOL
  assert rel_err(decode_all(layer, t2j(x[:, :9])), want[:, :9]) < RTOL


def test_kda_head_size_matches_kimi_linear():
  from transformers.models.kimi_linear import modeling_kimi_linear as mk
  torch.manual_seed(7)
  cfg = kimi_config()
  ref = mk.KimiLinearDeltaAttention(cfg, 1).float()
  randomize(ref)
  with torch.no_grad():
    ref.forget_gate.A_log.uniform_(0.0, 1.0)
  layer = delta.KimiDeltaAttention(32, 2, head_dim=12, norm_eps=cfg.rms_norm_eps,
                                   rngs=nnx.Rngs(0))
  set_linear(layer.qkv_proj, torch.cat([ref.q_proj.weight, ref.k_proj.weight, ref.v_proj.weight]))
  set_conv(layer.conv, ref.conv1d.weight)
  fg = ref.forget_gate
  set_linear(layer.f_down, fg.f_a_proj.weight)
  set_linear(layer.f_up, fg.f_b_proj.weight)
  layer.A_log.set_value(t2j(fg.A_log).reshape(-1))
  layer.dt_bias.set_value(t2j(fg.dt_bias))
  set_linear(layer.b_proj, ref.b_proj.weight)
  set_linear(layer.out_down, ref.g_a_proj.weight)
  set_linear(layer.out_up, ref.g_b_proj.weight)
  layer.o_norm.scale.set_value(t2j(ref.o_norm.weight))
  set_linear(layer.o_proj, ref.o_proj.weight)
  x = torch.randn(2, 11, 32)
  want = ref(x).detach().numpy()
  assert rel_err(layer(t2j(x)), want) < RTOL
  assert rel_err(decode_all(layer, t2j(x)), want) < RTOL
