"""The short convolution before every mixer (``short_conv``): decode equals forward,
packed segments stay separate, parameters are counted, bad widths are refused."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from linear_attention import models
from tests import helpers
from tests.models.test_models import D, H, SMALL, V, _decode_logits, _logits, lm, tokens


@pytest.mark.parametrize("mixer", ["softmax", "gla", "mamba2"])
def test_decode_with_short_conv_matches_forward(mixer):
  model = lm(mixer=mixer, num_layers=2, short_conv=3)
  graphdef, state = nnx.split(model)
  toks = tokens(t=9)
  helpers.assert_close(_decode_logits(graphdef, state, toks), _logits(graphdef, state, toks),
                       atol=2e-4, rtol=2e-4)


def test_short_conv_is_a_previous_token_path_and_respects_segments():
  """Changing token 3 changes the output at 3 and 4 (window 2) and nothing before; with
  a segment starting at 4, position 4 no longer sees token 3 through the convolution."""
  model = lm(mixer="softmax", num_layers=1, short_conv=2)
  toks = tokens(b=1, t=8)
  other = toks.at[0, 3].set((toks[0, 3] + 1) % V)
  h = lambda t, seg=None: model.backbone.blocks[0].pre_conv(model.backbone.embed(t), seg)
  diff = np.abs(np.asarray(h(toks) - h(other))).sum(-1)[0]
  assert np.all(diff[:3] == 0) and diff[3] > 0 and diff[4] > 0 and np.all(diff[5:] == 0)
  seg = jnp.array([[0, 0, 0, 0, 1, 1, 1, 1]])
  diff = np.abs(np.asarray(h(toks, seg) - h(other, seg))).sum(-1)[0]
  assert diff[3] > 0 and diff[4] == 0


def test_short_conv_parameters_and_errors():
  base = models.count_params(lm(mixer="gla", num_layers=2))
  with_conv = models.count_params(lm(mixer="gla", num_layers=2, short_conv=4))
  assert with_conv - base == 2 * (4 * D + D)  # weight [W, D] and bias [D] per block
  rows = models.parity_table(V, D, 2, num_heads=H, mixers=("gla",), short_conv=4)
  plain = models.parity_table(V, D, 2, num_heads=H, mixers=("gla",))
  assert rows[0]["mlp_ratio"] == plain[0]["mlp_ratio"]
  assert rows[0]["params"] - plain[0]["params"] == 2 * (4 * D + D)
  for bad in (1, -2):
    with pytest.raises(ValueError, match="short_conv"):
      lm(mixer="gla", num_layers=1, short_conv=bad)
