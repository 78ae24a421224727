"""Config handling: defaults, validation messages, describe, and the step/split arguments."""

from __future__ import annotations

import ml_collections
import numpy as np
import pytest

from linear_attention import data


def test_tasks_and_defaults_build():
  assert set(data.TASKS) == {"mqar", "selective_copying", "induction_heads", "listops", "text"}
  for task in data.TASKS:
    cfg = data.default_data_config(task)
    assert isinstance(cfg, ml_collections.ConfigDict) and cfg.task == task
    for field in ("batch_size", "seq_len", "seed", "num_eval_batches"):
      assert field in cfg
    ds = data.make_dataset(cfg)
    assert ds.task == task and ds.seq_len == cfg.seq_len and ds.batch_size == cfg.batch_size
    assert ds.kind in data.KINDS
    assert (ds.num_classes is None) == (ds.kind == "lm")


def test_default_config_is_locked_and_typed():
  cfg = data.default_data_config("mqar")
  cfg.seq_len = 128
  cfg.num_kv_pairs = 8
  assert data.make_dataset(cfg).batch(0)["inputs"].shape == (64, 128)
  with pytest.raises(AttributeError):
    cfg.num_kv_pair = 4  # misspelt new field
  with pytest.raises(TypeError):
    cfg.seq_len = "long"


def test_mapping_and_configdict_agree():
  d = dict(task="mqar", seq_len=64, num_kv_pairs=4, vocab_size=64, batch_size=4)
  a = data.make_dataset(d).batch(2)
  b = data.make_dataset(ml_collections.ConfigDict(d)).batch(2)
  assert all(np.array_equal(a[k], b[k]) for k in a)


def test_unknown_or_missing_task_lists_valid_names():
  for bad in ({"task": "mqr"}, {"seq_len": 4}, {"task": 3}):
    with pytest.raises(ValueError) as e:
      data.make_dataset(bad)
    for name in data.TASKS:
      assert name in str(e.value)
  with pytest.raises(ValueError, match="mqar"):
    data.default_data_config("nope")


def test_unknown_field_is_named():
  with pytest.raises(ValueError, match="num_kv_pair'") as e:
    data.make_dataset({"task": "mqar", "num_kv_pair": 4})
  assert "num_kv_pairs" in str(e.value)  # the valid fields are listed
  with pytest.raises(ValueError, match="corpus"):
    data.make_dataset({"task": "mqar", "corpus": "kjv"})  # a field of another task


@pytest.mark.parametrize("cfg,field", [
    (dict(task="mqar", seq_len="64"), "seq_len"),
    (dict(task="mqar", seq_len=64.0), "seq_len"),
    (dict(task="mqar", batch_size=True), "batch_size"),
    (dict(task="mqar", power_a="small"), "power_a"),
    (dict(task="mqar", power_a=float("nan")), "power_a"),
    (dict(task="mqar", random_non_queries=1), "random_non_queries"),
    (dict(task="text", corpus=5), "corpus"),
    (dict(task="mqar", batch_size=0), "batch_size"),
    (dict(task="mqar", seed=-1), "seed"),
    (dict(task="mqar", num_eval_batches=-1), "num_eval_batches"),
    (dict(task="mqar", seq_len=60, num_kv_pairs=16), "seq_len"),
    (dict(task="mqar", vocab_size=16, num_kv_pairs=8, seq_len=64), "num_kv_pairs"),
    (dict(task="mqar", power_a=0.0), "power_a"),
    (dict(task="mqar", num_kv_pairs=0), "num_kv_pairs"),
    (dict(task="selective_copying", seq_len=31, num_tokens=16), "seq_len"),
    (dict(task="selective_copying", vocab_size=2), "vocab_size"),
    (dict(task="selective_copying", num_tokens=0), "num_tokens"),
    (dict(task="induction_heads", vocab_size=2), "vocab_size"),
    (dict(task="induction_heads", seq_len=2), "seq_len"),
])
def test_bad_values_name_the_field(cfg, field):
  with pytest.raises(ValueError, match=f"'{field}'"):
    data.make_dataset(cfg)


def test_non_mapping_config():
  with pytest.raises(ValueError, match="Mapping"):
    data.make_dataset(["task", "mqar"])


def test_step_split_and_num_batches_checked():
  ds = data.make_dataset(dict(task="induction_heads", batch_size=2, seq_len=8))
  for bad in (-1, 1.0, True, "3"):
    with pytest.raises(ValueError, match="step"):
      ds.batch(bad)
  with pytest.raises(ValueError, match="validation"):
    ds.batch(0, split="valid")
  for bad in (0, -2, 1.5):
    with pytest.raises(ValueError, match="num_batches"):
      ds.eval_batches("validation", bad)
  with pytest.raises(ValueError, match="split"):
    ds.eval_batches("dev")


def test_describe_is_one_line():
  for task in data.TASKS:
    line = data.describe(data.default_data_config(task))
    assert line.startswith(task + ":") and "\n" not in line and "seq_len=" in line
  line = data.describe({"task": "mqar", "num_kv_pairs": 4})
  assert "num_kv_pairs=4" in line and "power_a=0.01" in line
  with pytest.raises(ValueError, match="bogus"):
    data.describe({"task": "mqar", "bogus": 1})
  ds = data.make_dataset({"task": "text", "seq_len": 32})
  assert "corpus_bytes=" in ds.describe() and "corpus_bytes=" in repr(ds)


def _config_from_argv(*overrides):
  """The config that ``python -m linear_attention.main`` would build from these flags."""
  import os

  from absl import flags
  from ml_collections import config_flags
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  argv = ["prog", f"--config={root}/configs/mqar.py:mixer=mamba2,size=smoke", *overrides]
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", default=None, flag_values=fv, sys_argv=argv)
  fv(argv)
  return fv.config


def test_every_registry_mixer_has_a_dotted_override_subconfig():
  from configs import common
  from linear_attention.nn import registry
  mk = common.mixer_kwargs_config()
  assert sorted(mk) == sorted(registry.MIXERS)
  for name in registry.MIXERS:
    assert set(mk[name]) <= set(registry.mixer_kwargs(name)), name
  assert mk.gla.chunk_size == 64 and tuple(mk.mamba2.a_init_range) == (1.0, 16.0)
  assert mk.mamba.a_init_scale == 1.0 and mk.hawk.min_rad == 0.9
  assert mk.performer.feature_map == "favor+"  # the registry's default, not the class's


def test_mixer_kwargs_dotted_overrides_reach_the_layer():
  import jax
  import numpy as np
  from linear_attention.train import trainer
  c = _config_from_argv("--config.model.mixer_kwargs.gla.chunk_size=128",
                        "--config.model.mixer_kwargs.mamba2.a_init_range=(0.03,0.5)",
                        "--config.model.mixer_kwargs.mamba.dt_rank=3",
                        "--config.model.mixer_kwargs.hawk.min_rad=0.99")
  mk = c.model.mixer_kwargs
  assert mk.gla.chunk_size == 128 and tuple(mk.mamba2.a_init_range) == (0.03, 0.5)
  assert mk.mamba.dt_rank == 3 and mk.hawk.min_rad == 0.99
  model = trainer.create_model(c.model, 64, "lm", None, 0)
  a = np.concatenate([np.exp(np.asarray(x)).ravel() for p, x in
                      jax.tree_util.tree_leaves_with_path(nnx_state(model))
                      if "A_log" in jax.tree_util.keystr(p)])
  assert a.size and a.min() >= 0.03 * (1 - 1e-6) and a.max() <= 0.5 * (1 + 1e-6)
  with pytest.raises(Exception, match="chunk_sise"):
    _config_from_argv("--config.model.mixer_kwargs.gla.chunk_sise=128")  # a typo is refused


def test_default_mixer_kwargs_build_the_same_model():
  import jax
  from linear_attention.train import trainer
  c = _config_from_argv()
  empty = c.model.to_dict()
  empty["mixer_kwargs"] = {}
  a = nnx_state(trainer.create_model(c.model, 64, "lm", None, 0))
  b = nnx_state(trainer.create_model(empty, 64, "lm", None, 0))
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(x, y)


def nnx_state(model):
  from flax import nnx
  return nnx.state(model, nnx.Param)
