"""Every option of every registry mixer, fed one invalid value, is refused before a run
writes anything (issue 41, items 1 and 9).

The in-process part calls the trainer's pre-write validation (``trainer.check_run`` with an
abstract model: no parameter is initialised and nothing compiles) for each option; a few
real command lines check that the same refusals are one line, exit 2 and an absent workdir.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from configs import common
from linear_attention.nn import registry
from linear_attention.train import errors, trainer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The invalid value fed to each option, by the type of its default; a bool's only invalid
# values are of another type, which the config refuses on assignment (exit 2 on the
# command line, see test_cli_refuses_bad_layer_options).
_BY_TYPE = {int: 0, float: -1.0, str: "nope", tuple: (16.0, 1.0)}
# Options where the type's value above is valid.
_SPECIAL = {
    "seed": -1, "num_global": -1, "num_global_blocks": -1, "num_random_blocks": -1,
    "lower_bound": 1.0, "initial_m": float("nan"),
}


def _options():
  kw = common.mixer_kwargs_config()
  for name in registry.MIXERS:
    for opt in kw[name]:
      yield name, opt


def _invalid(name: str, opt: str):
  field = common.mixer_kwargs_config()[name].get_ref(opt)
  kind = field.get_type()
  if opt in _SPECIAL:
    return _SPECIAL[opt]
  if kind is bool:
    return None
  return _BY_TYPE[kind]


def _config(name: str):
  from configs import listops, mqar
  if registry.spec(name).causal:
    c = mqar.get_config(f"mixer={name},size=smoke")
    c.unlock()
    c.data.seq_len, c.data.batch_size, c.data.num_kv_pairs = 16, 2, 2
  else:  # encoder mixers: a classifier
    c = listops.get_config(f"mixer={name},size=smoke")
    c.unlock()
    c.data.seq_len, c.data.batch_size, c.data.min_length, c.data.max_length = 17, 2, 8, 17
  c.model.d_model, c.model.num_layers, c.model.num_heads = 32, 1, 2
  c.model.mixer_kwargs[name].update(registry.spec(name).tiny)
  return c


@pytest.mark.parametrize("name", registry.MIXERS)
def test_every_option_of_every_mixer_is_refused_before_writing(name):
  assert trainer.check_run(_config(name), abstract=True)  # the valid config passes
  missed = []
  for mixer, opt in _options():
    if mixer != name:
      continue
    bad = _invalid(mixer, opt)
    c = _config(mixer)
    if bad is None:  # a bool: another type is refused by the config itself
      with pytest.raises(TypeError):
        c.model.mixer_kwargs[mixer][opt] = "maybe"
      continue
    c.model.mixer_kwargs[mixer][opt] = bad
    try:
      trainer.check_run(c, abstract=True)
    except errors.ConfigError:
      continue
    missed.append(f"{opt}={bad!r}")
  assert not missed, f"{name}: accepted before writing: {missed}"


def test_the_probe_covers_every_option_of_every_registry_mixer():
  kw = common.mixer_kwargs_config()
  assert set(kw) == set(registry.MIXERS)
  for name in registry.MIXERS:
    for opt in registry.mixer_kwargs(name):
      if opt in ("dtype", "param_dtype"):
        continue
      assert opt in kw[name], f"{name}.{opt} has no config field, so the probe misses it"
