"""Config files: arguments, sizes, locking, validation; sweep helpers."""

from __future__ import annotations

import importlib

import ml_collections
import pytest

from configs import common
from linear_attention import data
from linear_attention import sweep

CONFIGS = ("text_lm", "mqar", "selective_copying", "induction_heads", "listops", "finetune")


@pytest.mark.parametrize("name", CONFIGS)
def test_smoke_config_is_locked_and_valid(name):
  mod = importlib.import_module(f"configs.{name}")
  c = mod.get_config("size=smoke")
  assert isinstance(c, ml_collections.ConfigDict) and c.is_locked
  with pytest.raises(AttributeError):
    c.optim.lrr = 1.0  # a typo is an error
  with pytest.raises(KeyError):
    c.update_from_flattened_dict({"train.stepz": 3})
  for section in ("model", "optim", "train", "mesh", "data"):
    assert section in c
  assert data.normalize_config(c.data)["task"] in data.TASKS
  assert mod.get_config(None).data.seq_len >= c.data.seq_len  # default size is bigger


@pytest.mark.parametrize("name", ["mqar", "listops"])
def test_config_arguments(name):
  mod = importlib.import_module(f"configs.{name}")
  c = mod.get_config("mixer=mamba2,size=smoke")
  assert c.model.mixer == "mamba2" and c.model.pattern == ""
  assert mod.get_config("pattern=RRA,size=smoke").model.pattern == "RRA"
  with pytest.raises(ValueError, match="unknown mixer 'nope'.*softmax"):
    mod.get_config("mixer=nope")
  with pytest.raises(ValueError, match="unknown config argument 'sise'.*size"):
    mod.get_config("sise=smoke")
  with pytest.raises(ValueError, match="size='huge'.*smoke"):
    mod.get_config("size=huge")
  with pytest.raises(ValueError, match="key=value"):
    mod.get_config("smoke")


def test_text_config_default_is_gla_on_kjv():
  from configs import text_lm
  c = text_lm.get_config(None)
  assert c.model.mixer == "gla" and c.data.corpus == "kjv" and c.data.task == "text"
  assert text_lm.get_config("corpus=python_stdlib").data.corpus == "python_stdlib"


def test_parse_arg_types():
  out = common.parse_arg("a=3,b=0.5,c=false,d=x", dict(a=1, b=1.0, c=True, d="y", e=2))
  assert (out.a, out.b, out.c, out.d, out.e) == (3, 0.5, False, "x", 2)
  with pytest.raises(ValueError, match="a='x' must be a int"):
    common.parse_arg("a=x", dict(a=1))


def test_product_and_zip():
  p = sweep.product({"model.mixer": ["gla", "softmax"]}, {"optim.lr": [1e-3, 3e-3]})
  assert p == [{"model.mixer": "gla", "optim.lr": 1e-3}, {"model.mixer": "gla", "optim.lr": 3e-3},
               {"model.mixer": "softmax", "optim.lr": 1e-3},
               {"model.mixer": "softmax", "optim.lr": 3e-3}]
  z = sweep.zip_({"model.mixer": ["gla", "softmax"]}, {"optim.lr": [1e-3, 3e-4]})
  assert z == [{"model.mixer": "gla", "optim.lr": 1e-3}, {"model.mixer": "softmax", "optim.lr": 3e-4}]
  nested = sweep.product(z, {"train.seed": [0, 1]})
  assert len(nested) == 4 and nested[1] == {"model.mixer": "gla", "optim.lr": 1e-3, "train.seed": 1}
  with pytest.raises(ValueError, match="equal length"):
    sweep.zip_({"a": [1, 2]}, {"b": [1]})
  with pytest.raises(ValueError, match="set twice"):
    sweep.product([{"a": 1}], [{"a": 2}])


def test_mqar_sweep_points():
  from configs import mqar
  pts = mqar.get_sweep()
  assert len(pts) == len({tuple(sorted(p.items())) for p in pts}) >= 2
  c = mqar.get_config("size=smoke")
  for p in pts:  # every key is a real config field
    c2 = ml_collections.ConfigDict(c.to_dict())
    c2.update_from_flattened_dict(p)
