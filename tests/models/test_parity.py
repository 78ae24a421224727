"""Size parity: every mixer's model matches the softmax model's parameter count."""

from __future__ import annotations

import pytest
from flax import nnx

from linear_attention import models
from linear_attention.nn import registry


def _built_count(**kw):
  return models.count_params(models.LanguageModel(64, 128, rngs=nnx.Rngs(0), **kw))


@pytest.mark.parametrize("mixer", registry.CAUSAL_MIXERS)
def test_every_mixer_matches_softmax_within_5_percent(mixer):
  ratio = models.matched_mlp_ratio(64, 128, 2, mixer=mixer, num_heads=2)
  ref = _built_count(num_layers=2, mixer="softmax", num_heads=2)
  got = _built_count(num_layers=2, mixer=mixer, num_heads=2, mlp_ratio=ratio)
  assert abs(got - ref) / ref < 0.05, (mixer, got, ref)
  # The abstract count is the real one.
  assert models.lm_param_count(64, 128, 2, mixer=mixer, num_heads=2, mlp_ratio=ratio) == got


def test_hybrid_pattern_matches():
  ratio = models.matched_mlp_ratio(64, 128, 3, pattern="RRL", num_heads=2)
  ref = _built_count(num_layers=3, mixer="softmax", num_heads=2)
  got = _built_count(num_layers=3, pattern="RRL", num_heads=2, mlp_ratio=ratio)
  assert abs(got - ref) / ref < 0.05


def test_table_rows_and_default_gap():
  rows = models.parity_table(64, 64, 2, num_heads=2, mixers=("softmax", "retnet"))
  assert [r["mixer"] for r in rows] == ["softmax", "retnet"]
  assert rows[0]["rel_diff"] == 0.0
  retnet = rows[1]
  # RetNet's mixer is larger than attention's, so its matched MLP is narrower.
  assert retnet["mixer_params"] > rows[0]["mixer_params"]
  assert retnet["mlp_hidden"] < rows[0]["mlp_hidden"]
  assert abs(retnet["rel_diff"]) < 0.05 < abs(retnet["default_params"] / rows[0]["params"] - 1)


def test_budget_too_small_raises():
  with pytest.raises(ValueError, match="no MLP width"):
    models.matched_mlp_ratio(64, 64, 2, mixer="retnet", num_heads=2, reference_mlp_ratio=0.125)
