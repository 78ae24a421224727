"""linear_attention.hub against transformers-made fixtures (no torch needed).

The fixtures (``tests/hub/fixtures/<family>/``) are tiny float32 checkpoints written by
transformers with its logits and greedy tokens (``make_fixtures.py``): the loaded model must
give the same logits (1e-4 relative) and, decoding with the O(1) state, the same tokens;
``save_pretrained`` must write back the same tensors.
"""

from __future__ import annotations

import json
import pathlib
import shutil

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from linear_attention import hub
from linear_attention.models import generate
from linear_attention.nn import make_mixer
from linear_attention.models.blocks import Block, LayerSpec
from linear_attention.models.lm import LanguageModel

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
NAMES = sorted(p.name for p in FIXTURES.iterdir() if (p / "config.json").is_file())
RTOL = 1e-4


def rel_err(a, b) -> float:
  return float(np.max(np.abs(np.asarray(a, np.float32) - b)) / np.max(np.abs(b)))


def expected(name):
  return np.load(FIXTURES / name / "expected.npz")


_MODELS = {}


def loaded(name):
  if name not in _MODELS:
    _MODELS[name] = hub.from_pretrained(FIXTURES / name)
  return _MODELS[name]


def copy_fixture(name, tmp_path) -> pathlib.Path:
  d = tmp_path / name
  shutil.copytree(FIXTURES / name, d)
  return d


def test_every_family_has_a_fixture():
  families = {json.loads((FIXTURES / n / "config.json").read_text())["model_type"] for n in NAMES}
  assert families == set(hub.supported())


@pytest.mark.parametrize("name", NAMES)
def test_logits_match_transformers(name):
  e = expected(name)
  logits = loaded(name)(jnp.asarray(e["prompt"], jnp.int32))
  assert logits.shape == e["logits"].shape
  assert rel_err(logits, e["logits"]) < RTOL


@pytest.mark.parametrize("name", [n for n in NAMES if "tokens" in expected(n)])
def test_greedy_generation_matches_transformers(name):
  e = expected(name)
  prompt = jnp.asarray(e["prompt"], jnp.int32)
  tokens = generate(loaded(name), prompt, e["tokens"].shape[1] - prompt.shape[1], temperature=0)
  np.testing.assert_array_equal(np.asarray(tokens), e["tokens"])


@pytest.mark.parametrize("name", NAMES)
def test_save_pretrained_round_trip(name, tmp_path):
  out = tmp_path / "out"
  hub.save_pretrained(loaded(name), out)
  original = load_file(FIXTURES / name / "model.safetensors")
  written = load_file(out / "model.safetensors")
  assert sorted(written) == sorted(original)
  config = json.loads((FIXTURES / name / "config.json").read_text())
  # Buffers the config determines are recomputed: torch's exp and NumPy's differ in the last bit.
  constants = {e.name: e.rtol for e in hub.family_of(config).tensors(config)
               if isinstance(e, hub.Constant)}
  for k in original:
    if k in constants:
      np.testing.assert_allclose(written[k], original[k], rtol=constants[k], atol=0, err_msg=k)
    else:
      np.testing.assert_array_equal(written[k], original[k], err_msg=k)
  config = json.loads((out / "config.json").read_text())
  assert config["model_type"] == json.loads((FIXTURES / name / "config.json").read_text())[
      "model_type"]
  assert config["architectures"] == [hub.family_of(config).architecture]
  e = expected(name)
  again = hub.from_pretrained(out)(jnp.asarray(e["prompt"], jnp.int32))
  assert rel_err(again, e["logits"]) < RTOL


def test_sharded_bfloat16_round_trip(tmp_path):
  model = loaded("mamba2")
  hub.save_pretrained(model, tmp_path / "bf16", dtype="bfloat16", max_shard_size=4096)
  index = json.loads((tmp_path / "bf16" / "model.safetensors.index.json").read_text())
  shards = set(index["weight_map"].values())
  assert len(shards) > 1 and not (tmp_path / "bf16" / "model.safetensors").exists()
  assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
  back = hub.from_pretrained(tmp_path / "bf16")  # dtype from the checkpoint: bfloat16
  assert back.backbone.embed.embedding[...].dtype == jnp.bfloat16
  original = load_file(FIXTURES / "mamba2" / "model.safetensors")
  for shard in shards:
    for k, v in load_file(tmp_path / "bf16" / shard).items():
      assert v.dtype == ml_dtypes.bfloat16
      np.testing.assert_array_equal(v, original[k].astype(ml_dtypes.bfloat16), err_msg=k)
  e = expected("mamba2")
  assert rel_err(back(jnp.asarray(e["prompt"], jnp.int32)), e["logits"]) < 5e-2


def test_dtype_argument_casts(tmp_path):
  model = hub.from_pretrained(FIXTURES / "mamba", dtype=jnp.bfloat16)
  assert model.backbone.blocks[0].mixer.in_proj.kernel[...].dtype == jnp.bfloat16
  with pytest.raises(ValueError, match="dtype must be None or one of"):
    hub.from_pretrained(FIXTURES / "mamba", dtype="int8")


def test_dt_limit_is_applied(tmp_path):
  # The fixture's limit binds: without it the logits move away from transformers'.
  d = copy_fixture("mamba2_dt_limit", tmp_path)
  config = json.loads((d / "config.json").read_text())
  config["time_step_limit"] = [0.0, 1e9]
  (d / "config.json").write_text(json.dumps(config))
  e = expected("mamba2_dt_limit")
  assert rel_err(hub.from_pretrained(d)(jnp.asarray(e["prompt"], jnp.int32)), e["logits"]) > 1e-2


# ----------------------------------------------------------------------------- errors


def _edit_tensors(d, edit):
  tensors = load_file(d / "model.safetensors")
  edit(tensors)
  save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})


def test_missing_tensor_is_named(tmp_path):
  d = copy_fixture("mamba", tmp_path)
  _edit_tensors(d, lambda t: t.pop("backbone.layers.1.mixer.D"))
  with pytest.raises(ValueError, match=r"missing from the checkpoint: backbone\.layers\.1\.mixer\.D"):
    hub.from_pretrained(d)


def test_extra_tensor_is_named(tmp_path):
  d = copy_fixture("mamba", tmp_path)
  _edit_tensors(d, lambda t: t.update({"backbone.layers.0.mixer.extra": np.zeros(3, np.float32)}))
  with pytest.raises(ValueError, match=r"does not use: backbone\.layers\.0\.mixer\.extra"):
    hub.from_pretrained(d)


def test_wrong_shape_is_named(tmp_path):
  d = copy_fixture("mamba2", tmp_path)
  _edit_tensors(d, lambda t: t.update({"backbone.layers.0.mixer.A_log": np.zeros(5, np.float32)}))
  with pytest.raises(ValueError, match=r"backbone\.layers\.0\.mixer\.A_log: checkpoint gives \(5,\)"):
    hub.from_pretrained(d)


def test_untied_head_differing_from_embeddings_is_refused(tmp_path):
  d = copy_fixture("mamba", tmp_path)  # tied: a stored lm_head.weight must repeat the embeddings
  _edit_tensors(d, lambda t: t.update(
      {"lm_head.weight": t["backbone.embeddings.weight"] + 1}))
  with pytest.raises(ValueError, match="lm_head.weight .must equal backbone.embeddings.weight"):
    hub.from_pretrained(d)


def test_unknown_model_type(tmp_path):
  d = copy_fixture("mamba", tmp_path)
  (d / "config.json").write_text(json.dumps({"model_type": "not_a_model"}))
  with pytest.raises(ValueError, match="model_type 'not_a_model' is not supported; supported:"):
    hub.from_pretrained(d)


def test_unsupported_config_value(tmp_path):
  d = copy_fixture("mamba", tmp_path)
  config = json.loads((d / "config.json").read_text())
  config["use_bias"] = True
  (d / "config.json").write_text(json.dumps(config))
  with pytest.raises(ValueError, match="use_bias=True is not supported"):
    hub.from_pretrained(d)


@pytest.mark.parametrize("key, value", [("sliding_window", 4), ("router_jitter_noise", 0.1),
                                        ("hidden_act", "gelu")])
def test_minimax_refuses_what_it_cannot_reproduce(key, value, tmp_path):
  d = copy_fixture("minimax", tmp_path)
  config = json.loads((d / "config.json").read_text())
  config[key] = value
  (d / "config.json").write_text(json.dumps(config))
  with pytest.raises(ValueError, match=f"{key}={value!r} is not supported"):
    hub.from_pretrained(d)


def test_minimax_decay_buffers_must_match_the_config(tmp_path):
  d = copy_fixture("minimax", tmp_path)
  tensors = load_file(d / "model.safetensors")
  tensors["model.layers.0.self_attn.slope_rate"] *= 2
  save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
  with pytest.raises(ValueError, match="slope_rate .must equal the value its config gives"):
    hub.from_pretrained(d)


def test_hub_name_says_how_to_download():
  with pytest.raises(ValueError, match="huggingface-cli download state-spaces/mamba-130m-hf "
                                       "--local-dir DIR"):
    hub.from_pretrained("state-spaces/mamba-130m-hf")


def test_not_a_checkpoint_directory(tmp_path):
  with pytest.raises(ValueError, match="does not exist"):
    hub.from_pretrained(tmp_path / "nowhere")
  with pytest.raises(ValueError, match="has no config.json"):
    hub.from_pretrained(tmp_path)
  (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
  with pytest.raises(ValueError, match="neither model.safetensors nor"):
    hub.from_pretrained(tmp_path)


def test_save_needs_a_config(tmp_path):
  from flax import nnx
  model = LanguageModel(16, 8, 1, mixer="mamba", mlp_ratio=0, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="config is required"):
    hub.save_pretrained(model, tmp_path)


# ----------------------------------------------------------------------------- layer specs


def test_layer_specs_build_mixed_blocks():
  from flax import nnx
  layers = [LayerSpec("mamba2", 2, mixer_kwargs=dict(d_state=4)),
            LayerSpec(None, mlp="relu2", mlp_hidden=12),
            LayerSpec("softmax", 2, mixer_kwargs=dict(num_kv_heads=1, head_dim=6), mlp="swiglu",
                      mlp_hidden=8)]
  model = LanguageModel(16, 8, layers=layers, rngs=nnx.Rngs(0))
  assert model.mixer_names == ("mamba2", None, "softmax")
  assert model.blocks[1].mixer is None and model.blocks[1].mlp.up.kernel.shape == (8, 12)
  assert model.blocks[2].mixer.q_proj.kernel.shape == (8, 12)
  tokens = jnp.array([[1, 2, 3, 4, 5]], jnp.int32)
  full = model(tokens)
  cache = model.init_cache(1, 8)
  steps = []
  for t in range(tokens.shape[1]):
    logits, cache = model.decode_step(tokens[:, t], cache)
    steps.append(logits)
  np.testing.assert_allclose(np.stack(steps, 1), full, rtol=1e-4, atol=1e-5)


def test_layer_spec_validation():
  from flax import nnx
  with pytest.raises(ValueError, match="needs a mixer or an mlp"):
    LayerSpec(None)
  with pytest.raises(ValueError, match="mixer must be one of"):
    LayerSpec("nope")
  with pytest.raises(ValueError, match="mlp_hidden must be an int > 0"):
    LayerSpec("mamba", mlp="swiglu")
  with pytest.raises(ValueError, match="do not also give"):
    LanguageModel(16, 8, 2, layers=[LayerSpec("mamba")], rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="mlp must be one of"):
    Block(8, "mamba", 1, mlp="gelu", rngs=nnx.Rngs(0))


def test_decoding_equals_the_forward_pass_with_a_binding_dt_limit():
  # transformers' own decoding step skips time_step_limit; here both paths clamp dt.
  model = loaded("mamba2_dt_limit")
  prompt = jnp.asarray(expected("mamba2_dt_limit")["prompt"], jnp.int32)
  full = model(prompt)
  cache = model.init_cache(prompt.shape[0], prompt.shape[1])
  steps = []
  for t in range(prompt.shape[1]):
    logits, cache = model.decode_step(prompt[:, t], cache)
    steps.append(logits)
  np.testing.assert_allclose(np.stack(steps, 1), full, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("make, match", [
    (lambda r: make_mixer("mamba2", 16, 4, d_state=4, dt_limit=(0.1, 0.05), rngs=r),
     "dt_limit must be None or"),
    (lambda r: make_mixer("mamba", 16, 1, d_state=4, bcdt_norm_eps=-1.0, rngs=r),
     "bcdt_norm_eps must be a number"),
    (lambda r: make_mixer("softmax", 16, 2, rotary_dim=3, rngs=r),
     "rotary_dim must be"),
    (lambda r: make_mixer("softmax", 16, 2, scale=0.0, rngs=r),
     "scale must be None or a number > 0"),
    (lambda r: LanguageModel(16, 8, layers=[LayerSpec("mamba")], logit_scale=0, rngs=r),
     "logit_scale must be a number > 0"),
    (lambda r: Block(8, "mamba", 1, residual_scale="x", rngs=r), "residual_scale must be a number"),
])
def test_checkpoint_options_are_checked_by_name(make, match):
  from flax import nnx
  with pytest.raises(ValueError, match=match):
    make(nnx.Rngs(0))


def test_nemotron_h_older_config_names(tmp_path):
  # Released Nemotron-H configs use hybrid_override_pattern and mamba_* names.
  d = copy_fixture("nemotron_h", tmp_path)
  config = json.loads((d / "config.json").read_text())
  letters = {"linear_attention": "M", "full_attention": "*", "mlp": "-"}
  config["hybrid_override_pattern"] = "".join(letters[k] for k in config.pop("layers_block_type"))
  config["mamba_n_groups"] = config.pop("n_groups")
  config["mamba_d_conv"] = config.pop("conv_kernel")
  (d / "config.json").write_text(json.dumps(config))
  e = expected("nemotron_h")
  assert rel_err(hub.from_pretrained(d)(jnp.asarray(e["prompt"], jnp.int32)), e["logits"]) < RTOL
