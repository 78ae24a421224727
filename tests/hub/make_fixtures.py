"""Makes the hub test fixtures with transformers itself (needs torch and transformers).

For every family in :data:`FAMILIES`: a tiny transformers model from a small config, its
weights randomised (seeded), written by transformers' ``save_pretrained`` in float32, plus
``expected.npz``: transformers' logits on :data:`PROMPT` and its greedy ``generate`` tokens.
The main suite tests the loader from these files without torch
(``tests/hub/test_hub.py``); ``tests/hub/test_hf.py`` calls :func:`make` directly.

    PYTHONPATH=$PWD python tests/hub/make_fixtures.py            # all families
    PYTHONPATH=$PWD python tests/hub/make_fixtures.py mamba2     # one
"""

from __future__ import annotations

import pathlib
import shutil
import sys

import numpy as np

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
VOCAB = 64
# Two rows of 9 tokens: an odd length, not a multiple of any chunk size.
PROMPT = np.array([[3, 17, 42, 5, 9, 60, 1, 33, 8], [50, 2, 2, 19, 44, 7, 63, 12, 30]], np.int64)
NEW_TOKENS = 8
_COMMON = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, pad_token_id=0,
               bos_token_id=0, eos_token_id=None)

# name -> (transformers config class, its arguments, whether greedy generation is compared).
# transformers' Mamba-2 decoding step does not apply time_step_limit (its chunked forward
# does), so the fixture with a binding limit compares logits only.
FAMILIES = {
    "mamba": ("MambaConfig", dict(_COMMON, state_size=8, expand=2, conv_kernel=4,
                                  time_step_rank=4), True),
    "falcon_mamba": ("FalconMambaConfig", dict(_COMMON, state_size=8, expand=2, conv_kernel=4,
                                               time_step_rank=4, mixer_rms_eps=1e-6), True),
    "mamba2": ("Mamba2Config", dict(_COMMON, num_heads=4, head_dim=8, expand=2, state_size=8,
                                    n_groups=2, conv_kernel=4, chunk_size=4,
                                    tie_word_embeddings=False), True),
    "mamba2_dt_limit": ("Mamba2Config", dict(_COMMON, num_heads=4, head_dim=8, expand=2,
                                             state_size=8, n_groups=2, conv_kernel=4,
                                             chunk_size=4, tie_word_embeddings=True,
                                             time_step_limit=(0.02, 0.08)), False),
    "nemotron_h": ("NemotronHConfig", dict(
        {k: v for k, v in _COMMON.items() if k != "num_hidden_layers"},
        layers_block_type=["linear_attention", "mlp", "full_attention", "mlp",
                           "linear_attention"],
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, intermediate_size=24,
        ssm_state_size=8, mamba_num_heads=4, mamba_head_dim=8, n_groups=2, chunk_size=4),
        True),
    "granitemoehybrid": ("GraniteMoeHybridConfig", dict(
        _COMMON, num_hidden_layers=3, layer_types=["mamba", "attention", "mamba"], num_local_experts=0,
        shared_intermediate_size=24, num_attention_heads=4, num_key_value_heads=2,
        mamba_n_heads=4, mamba_d_head=8, mamba_n_groups=2, mamba_d_state=8, mamba_d_conv=4,
        mamba_expand=2, mamba_chunk_size=4, embedding_multiplier=3.0,
        attention_multiplier=0.2, residual_multiplier=0.5, logits_scaling=2.5,
        tie_word_embeddings=True), True),
    "granitemoehybrid_rope": ("GraniteMoeHybridConfig", dict(
        _COMMON, layer_types=["attention", "mamba"], num_local_experts=0, shared_intermediate_size=24,
        num_attention_heads=2, num_key_value_heads=1, mamba_n_heads=4, mamba_d_head=8,
        mamba_n_groups=1, mamba_d_state=8, mamba_expand=2, mamba_chunk_size=4,
        position_embedding_type="rope", rope_parameters={"rope_theta": 500.0,
                                                         "rope_type": "default"}), True),
    "granitemoehybrid_moe": ("GraniteMoeHybridConfig", dict(
        _COMMON, layer_types=["mamba", "attention"], num_local_experts=4, num_experts_per_tok=2,
        intermediate_size=8, shared_intermediate_size=24, num_attention_heads=2,
        num_key_value_heads=1, mamba_n_heads=4, mamba_d_head=8, mamba_n_groups=2,
        mamba_d_state=8, mamba_expand=2, mamba_chunk_size=4, residual_multiplier=0.5), True),
    "bamba": ("BambaConfig", dict(
        _COMMON, num_hidden_layers=3, attn_layer_indices=[1], intermediate_size=24,
        num_attention_heads=2, num_key_value_heads=1, mamba_n_heads=4, mamba_d_head=8,
        mamba_n_groups=2, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2,
        mamba_chunk_size=4, rope_parameters={"rope_theta": 300.0, "partial_rotary_factor": 0.5,
                                             "rope_type": "default"}), True),
    "qwen3_next": ("Qwen3NextConfig", dict(
        _COMMON, num_hidden_layers=4, layer_types=["linear_attention", "full_attention",
                                                   "linear_attention", "full_attention"],
        mlp_only_layers=[2], num_attention_heads=2, num_key_value_heads=1, head_dim=8,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=4,
        linear_value_head_dim=6, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8,
        shared_expert_intermediate_size=12, intermediate_size=24), True),
    "olmo_hybrid": ("OlmoHybridConfig", dict(
        _COMMON, num_hidden_layers=3, layer_types=["linear_attention", "full_attention",
                                                   "linear_attention"],
        num_attention_heads=2, num_key_value_heads=1, intermediate_size=24,
        linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=4,
        linear_value_head_dim=6, rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
        True),
    "olmo_hybrid_nope": ("OlmoHybridConfig", dict(
        _COMMON, layer_types=["full_attention", "linear_attention"], num_attention_heads=2,
        intermediate_size=24, linear_allow_neg_eigval=False, rope_parameters=None), True),
    "kimi_linear": ("KimiLinearConfig", dict(
        _COMMON, num_hidden_layers=3, layer_types=["linear_attention", "full_attention",
                                                   "linear_attention"],
        mlp_layer_types=["dense", "sparse", "sparse"], num_attention_heads=2,
        num_key_value_heads=2, kv_lora_rank=8, q_lora_rank=None, qk_nope_head_dim=4,
        qk_rope_head_dim=4, v_head_dim=6, linear_num_heads=2, linear_head_dim=8,
        num_local_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1,
        moe_intermediate_size=8, n_shared_experts=1, intermediate_size=24,
        routed_scaling_factor=2.5), True),
    "kimi_linear_q_lora": ("KimiLinearConfig", dict(
        _COMMON, layer_types=["full_attention", "linear_attention"],
        mlp_layer_types=["sparse", "dense"], num_attention_heads=2, num_key_value_heads=2,
        kv_lora_rank=6, q_lora_rank=6, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=4,
        linear_num_heads=1, linear_head_dim=12, num_local_experts=4, num_experts_per_tok=3,
        moe_intermediate_size=8, n_shared_experts=2, intermediate_size=24, norm_topk_prob=False),
        True),
    # Griffin's R, R, A pattern; the 9-token prompt runs past the attention window of 4.
    "recurrent_gemma": ("RecurrentGemmaConfig", dict(_COMMON, num_hidden_layers=3,
                                                     num_attention_heads=2, num_key_value_heads=1,
                                                     lru_width=24, intermediate_size=48,
                                                     attention_window_size=4, conv1d_width=4),
                        True),
    "lfm2": ("Lfm2Config", dict(_COMMON, num_hidden_layers=3, num_attention_heads=2,
                                num_key_value_heads=1, intermediate_size=48, block_multiple_of=16,
                                conv_L_cache=3, layer_types=["conv", "full_attention", "conv"]),
             True),
    # Lightning blocks of 4 tokens (the prompt spans three), every residual factor off 1.
    "minimax": ("MiniMaxConfig", dict(
        _COMMON, num_hidden_layers=3, layer_types=["linear_attention", "full_attention",
                                                   "linear_attention"],
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, intermediate_size=8,
        num_local_experts=4, num_experts_per_tok=2, block_size=4,
        linear_attn_alpha_factor=1.5, linear_attn_beta_factor=0.7, full_attn_alpha_factor=2.0,
        full_attn_beta_factor=0.5, mlp_alpha_factor=1.2, mlp_beta_factor=0.8,
        rope_parameters={"rope_theta": 1e4, "rope_type": "default"}), True),
    # Attention on odd layers, MoE (softmax top-2, not renormalised) on even ones.
    "jamba": ("JambaConfig", dict(
        _COMMON, num_hidden_layers=4, attn_layer_period=2, attn_layer_offset=1,
        expert_layer_period=2, expert_layer_offset=0, num_experts=4, num_experts_per_tok=2,
        intermediate_size=8, num_attention_heads=2, num_key_value_heads=1, mamba_d_state=8,
        mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4), True),
    # qk and v widths multiples of 64: transformers' xLSTM cache rounds them up to 64.
    "xlstm": ("xLSTMConfig", dict(_COMMON, num_heads=4, qk_dim_factor=4.0, v_dim_factor=4.0,
                                  chunk_size=4, tie_word_embeddings=False), True),
}


def build(name: str, seed: int = 0):
  """A transformers ``*ForCausalLM`` of family ``name`` with random float32 weights."""
  import torch
  import transformers
  cls_name, kwargs, _ = FAMILIES[name]
  config = getattr(transformers, cls_name)(**kwargs)
  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
  with torch.no_grad():
    # Every weight moved off its initial value (ones, zeros, arange), so that a swapped or
    # unused tensor shows in the logits.
    for p in model.parameters():
      p.add_(0.2 * torch.randn_like(p))
    for n, b in model.named_buffers():  # the MoE routers' load-balancing biases
      if n.endswith("e_score_correction_bias"):
        b.add_(0.1 * torch.randn_like(b))
  return model


def logits_and_tokens(model, prompt: np.ndarray = PROMPT, new_tokens: int = NEW_TOKENS,
                      generate: bool = True):
  """transformers' float32 logits ``[B, T, V]`` on ``prompt`` and greedy tokens ``[B, T + n]``."""
  import torch
  ids = torch.from_numpy(prompt)
  with torch.no_grad():
    logits = model(ids).logits.float().numpy()
    tokens = None
    if generate:
      # An explicit all-ones mask: without one, generate takes every pad_token_id (0) in
      # the prompt for padding and masks it out.
      tokens = model.generate(ids, attention_mask=torch.ones_like(ids),
                              max_new_tokens=new_tokens, do_sample=False,
                              min_new_tokens=new_tokens).numpy()
  return logits, tokens


def make(name: str, directory: pathlib.Path, seed: int = 0):
  """Writes family ``name``'s checkpoint and ``expected.npz`` to ``directory``; returns the
  transformers model."""
  model = build(name, seed)
  directory = pathlib.Path(directory)
  if directory.exists():
    shutil.rmtree(directory)
  model.save_pretrained(directory)
  logits, tokens = logits_and_tokens(model, generate=FAMILIES[name][2])
  extra = {} if tokens is None else {"tokens": tokens}
  np.savez(directory / "expected.npz", prompt=PROMPT, logits=logits, **extra)
  return model


def main(names):
  for name in names or FAMILIES:
    make(name, FIXTURES / name)
    size = sum(p.stat().st_size for p in (FIXTURES / name).iterdir())
    print(f"{name}: {size / 1024:.1f} KB in {FIXTURES / name}")


if __name__ == "__main__":
  main(sys.argv[1:])
