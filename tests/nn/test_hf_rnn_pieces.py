"""The RecurrentGemma, xLSTM-7B and LFM2 layers against transformers' own torch modules,
with the torch module's random weights copied in (float32, odd lengths): forward, and
token-by-token decoding against the same forward. Skipped without torch/transformers."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from linear_attention.nn import recurrent, xlstm
from tests import helpers

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = pytest.mark.hf

B, T = 2, 19


def _np(t):
  return t.detach().numpy().copy()


def _dense(layer, torch_linear):
  """Copies ``torch.nn.Linear`` into an ``nnx.Linear`` (kernel is the transpose)."""
  layer.kernel.set_value(jnp.asarray(_np(torch_linear.weight).T))
  if torch_linear.bias is not None:
    layer.bias.set_value(jnp.asarray(_np(torch_linear.bias)))


def _randomise(module, seed):
  """Every parameter of a torch module drawn normal (std 0.3), so no init hides an error."""
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for p in module.parameters():
      p.copy_(0.3 * torch.randn(p.shape, generator=g))


def _input(d, seed=0):
  return np.random.default_rng(seed).standard_normal((B, T, d)).astype(np.float32)


def test_mlstm_layer_matches_xlstm_7b_layer():
  from transformers import xLSTMConfig
  from transformers.models.xlstm import modeling_xlstm as hf
  if not hasattr(hf, "xLSTMLayer"):
    pytest.skip("transformers uses the external xlstm package here")
  cfg = xLSTMConfig(hidden_size=64, num_heads=2, chunk_size=8, vocab_size=16,
                    num_hidden_layers=1)
  ref = hf.xLSTMLayer(cfg).eval()
  _randomise(ref, 0)
  with torch.no_grad():  # gates near xLSTM-7B's: i~ around -3, forget near 1
    ref.igate_preact.bias.add_(-3.0)
    ref.fgate_preact.bias.add_(3.0)
  layer = xlstm.MLSTMLayer(64, 2, chunk_size=8, rngs=nnx.Rngs(0))
  for ours, theirs in ((layer.q_proj, ref.q), (layer.k_proj, ref.k), (layer.v_proj, ref.v),
                       (layer.o_gate, ref.ogate_preact), (layer.i_gate, ref.igate_preact),
                       (layer.f_gate, ref.fgate_preact), (layer.out_proj, ref.out_proj)):
    _dense(ours, theirs)
  layer.o_norm.scale.set_value(jnp.asarray(_np(ref.multihead_norm.weight).reshape(2, -1)))
  x = _input(64)
  with torch.no_grad():
    want, _ = ref(torch.from_numpy(x))
  got = layer(jnp.asarray(x))
  helpers.assert_close(got, _np(want), 1e-5, 1e-5)
  helpers.assert_close(helpers.decode_all(layer, jnp.asarray(x)), _np(want), 1e-5, 1e-5)


def test_hawk_block_matches_recurrentgemma_recurrent_block():
  from transformers import RecurrentGemmaConfig
  from transformers.models.recurrent_gemma import modeling_recurrent_gemma as hf
  cfg = RecurrentGemmaConfig(hidden_size=32, lru_width=48, num_attention_heads=4,
                             conv1d_width=4, num_hidden_layers=1, vocab_size=16)
  ref = hf.RecurrentGemmaRecurrentBlock(cfg, 0).eval()
  _randomise(ref, 1)
  layer = recurrent.HawkBlock(32, 4, lru_width=48, conv_width=4, rngs=nnx.Rngs(0))
  _dense(layer.y_proj, ref.linear_y)
  _dense(layer.x_proj, ref.linear_x)
  _dense(layer.out_proj, ref.linear_out)
  layer.conv.weight.set_value(jnp.asarray(_np(ref.conv_1d.weight)[:, 0].T))
  layer.conv.bias.set_value(jnp.asarray(_np(ref.conv_1d.bias)))
  for ours, w, b in ((layer.gate_r, ref.rg_lru.recurrent_gate_weight,
                      ref.rg_lru.recurrent_gate_bias),
                     (layer.gate_i, ref.rg_lru.input_gate_weight, ref.rg_lru.input_gate_bias)):
    ours.w.set_value(jnp.asarray(_np(w)))
    ours.b.set_value(jnp.asarray(_np(b)))
  layer.log_lambda.set_value(-jnp.asarray(_np(ref.rg_lru.recurrent_param)))
  x = _input(32, 1)
  with torch.no_grad():
    want, _ = ref(torch.from_numpy(x), position_ids=torch.arange(T)[None].expand(B, T),
                  attention_mask=None, use_cache=False)
  got = layer(jnp.asarray(x))
  helpers.assert_close(got, _np(want), 1e-5, 1e-5)
  helpers.assert_close(helpers.decode_all(layer, jnp.asarray(x)), _np(want), 1e-5, 1e-5)


@pytest.mark.parametrize("use_bias", [False, True])
def test_gated_short_conv_matches_lfm2_short_conv(use_bias):
  from transformers import Lfm2Config
  from transformers.models.lfm2 import modeling_lfm2 as hf
  cfg = Lfm2Config(hidden_size=32, conv_L_cache=3, conv_bias=use_bias, num_hidden_layers=1,
                   vocab_size=16, num_attention_heads=2, num_key_value_heads=1)
  ref = hf.Lfm2ShortConv(cfg, 0).eval()
  _randomise(ref, 2)
  layer = recurrent.GatedShortConv(32, conv_width=3, use_bias=use_bias, rngs=nnx.Rngs(0))
  _dense(layer.in_proj, ref.in_proj)
  _dense(layer.out_proj, ref.out_proj)
  layer.conv.weight.set_value(jnp.asarray(_np(ref.conv.weight)[:, 0].T))
  if use_bias:
    layer.conv.bias.set_value(jnp.asarray(_np(ref.conv.bias)))
  x = _input(32, 2)
  with torch.no_grad():
    want = ref(torch.from_numpy(x))
  got = layer(jnp.asarray(x))
  helpers.assert_close(got, _np(want), 1e-5, 1e-5)
  helpers.assert_close(helpers.decode_all(layer, jnp.asarray(x)), _np(want), 1e-5, 1e-5)


def test_mlstm_layer_bad_options_name_themselves():
  with pytest.raises(ValueError, match=r"\bgate_soft_cap must be None"):
    xlstm.MLSTMLayer(64, 2, gate_soft_cap=0.0, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"\bqk_dim .* must be divisible|qk_dim"):
    xlstm.MLSTMLayer(64, 3, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"\beps must be"):
    xlstm.MLSTMLayer(64, 2, eps=-1.0, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"\binitial_m must be"):
    xlstm.MLSTM(32, 2, initial_m=float("nan"), rngs=nnx.Rngs(0))


def test_local_attention_matches_recurrentgemma_attention():
  """Multi-query sliding-window attention with RoPE on half of each head and a bias on the
  output projection only; decoding runs past the window (the rolling cache)."""
  from transformers import RecurrentGemmaConfig
  from transformers.models.recurrent_gemma import modeling_recurrent_gemma as hf
  from linear_attention.nn import attention
  window = 5
  cfg = RecurrentGemmaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=1,
                             attention_window_size=window, num_hidden_layers=1, vocab_size=16)
  cfg._attn_implementation = "eager"
  ref = hf.RecurrentGemmaAttention(cfg, 0).eval()
  _randomise(ref, 3)
  head_dim = 32 // 4
  layer = attention.LocalAttention(32, 4, window=window, num_kv_heads=1,
                                   rotary_dim=head_dim // 2, out_bias=True,
                                   rope_base=cfg.rope_parameters["rope_theta"], rngs=nnx.Rngs(0))
  for ours, theirs in ((layer.q_proj, ref.q_proj), (layer.k_proj, ref.k_proj),
                       (layer.v_proj, ref.v_proj), (layer.o_proj, ref.o_proj)):
    _dense(ours, theirs)
  x = _input(32, 3)
  i = np.arange(T)
  visible = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - window)
  mask = torch.from_numpy(np.where(visible, 0.0, -np.inf).astype(np.float32))[None, None]
  with torch.no_grad():
    want, _ = ref(torch.from_numpy(x), position_ids=torch.arange(T)[None].expand(B, T),
                  attention_mask=mask)
  got = layer(jnp.asarray(x))
  helpers.assert_close(got, _np(want), 1e-5, 1e-5)
  helpers.assert_close(helpers.decode_all(layer, jnp.asarray(x)), _np(want), 1e-5, 1e-5)
