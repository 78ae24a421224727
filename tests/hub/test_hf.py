"""linear_attention.hub against transformers itself (CI's hf stage; skipped without torch).

For every family of ``make_fixtures.FAMILIES``, a fresh random checkpoint made by
transformers (another seed than the committed fixtures, a longer prompt): logits within
1e-4 relative, greedy tokens equal to ``generate``'s, and ``save_pretrained`` loaded back by
transformers' ``from_pretrained`` giving the same logits (float32 exactly; bfloat16 too).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from linear_attention import hub  # noqa: E402
from linear_attention.models import generate  # noqa: E402
from tests.hub import make_fixtures  # noqa: E402

pytestmark = pytest.mark.hf

# 3 rows of 37 tokens: past several chunks of every chunked form, not a multiple of any.
PROMPT = np.random.default_rng(7).integers(0, make_fixtures.VOCAB, (3, 37))


def rel_err(a, b) -> float:
  return float(np.max(np.abs(np.asarray(a, np.float32) - b)) / np.max(np.abs(b)))


def hf_logits(model, prompt=PROMPT):
  with torch.no_grad():
    return model(torch.from_numpy(prompt)).logits.float().numpy()


@pytest.mark.parametrize("name", list(make_fixtures.FAMILIES))
def test_against_transformers(name, tmp_path):
  ref = make_fixtures.make(name, tmp_path / "ckpt", seed=1)
  ref_logits, ref_tokens = make_fixtures.logits_and_tokens(
      ref, PROMPT, 6, generate=make_fixtures.FAMILIES[name][2])
  model = hub.from_pretrained(tmp_path / "ckpt")
  err = rel_err(model(jnp.asarray(PROMPT, jnp.int32)), ref_logits)
  print(f"{name}: logits rel err {err:.2e}")
  assert err < 1e-4
  if ref_tokens is not None:
    tokens = generate(model, jnp.asarray(PROMPT, jnp.int32), 6, temperature=0)
    np.testing.assert_array_equal(np.asarray(tokens), ref_tokens)

  hub.save_pretrained(model, tmp_path / "saved")
  back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "saved").float().eval()
  assert type(back) is type(ref)
  # Equal to transformers loading its own checkpoint (a reloaded MoE can differ from the
  # in-memory model in the last bit: its experts are fused at load).
  own = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt").float().eval()
  np.testing.assert_array_equal(hf_logits(back), hf_logits(own))

  hub.save_pretrained(model, tmp_path / "saved_bf16", dtype="bfloat16", max_shard_size=8192)
  back16 = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "saved_bf16")
  assert next(back16.parameters()).dtype == torch.bfloat16
  # The same bfloat16 weights on both sides (an MoE's routing flips under rounding, so the
  # float32 logits are no reference for it), read into float32 by both (a bfloat16 torch
  # model would also round the float32 buffers, MiniMax's decay tables).
  ours16 = hub.from_pretrained(tmp_path / "saved_bf16", dtype="float32")
  back32 = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "saved_bf16",
                                                             dtype=torch.float32).eval()
  assert rel_err(ours16(jnp.asarray(PROMPT, jnp.int32)), hf_logits(back32)) < 1e-4


def test_transformers_shards_load(tmp_path):
  ref = make_fixtures.build("mamba2", seed=2)
  ref.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
  assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
  model = hub.from_pretrained(tmp_path / "sharded")
  assert rel_err(model(jnp.asarray(PROMPT, jnp.int32)), hf_logits(ref)) < 1e-4


def test_finetune_save_and_perplexity_against_transformers(tmp_path):
  """Fine-tune the Mamba fixture two steps (``config.init_from``), save it: transformers
  loads the result with this project's logits, and the perplexity command's NLL is the one
  transformers' logits give."""
  import math

  from configs import finetune
  from linear_attention import train
  from linear_attention.data.tokenizer import load_tokenizer
  from linear_attention.eval import perplexity as ppl
  from tests.hub.tiny_tokenizer import checkpoint_with_tokenizer

  ckpt = checkpoint_with_tokenizer(tmp_path)
  c = finetune.get_config("size=smoke")
  with c.unlocked():
    c.init_from, c.data.text_file = str(ckpt), str(tmp_path / "text.txt")
    c.data.seq_len, c.data.batch_size, c.train.steps, c.optim.lr = 16, 2, 2, 1e-2
  final = train.train_and_evaluate(c, str(tmp_path / "run"), verbose=False)
  saved = final["hf_dir"]
  back = transformers.AutoModelForCausalLM.from_pretrained(saved).float().eval()
  ours = hub.from_pretrained(saved)
  assert rel_err(ours(jnp.asarray(PROMPT, jnp.int32)), hf_logits(back)) < 1e-4
  ids = load_tokenizer(saved).encode((tmp_path / "text.txt").read_text())[:200]
  lg = hf_logits(back, ids[None].astype(np.int64))[0].astype(np.float64)
  lse = np.log(np.exp(lg - lg.max(-1, keepdims=True)).sum(-1)) + lg.max(-1)
  want = (lse[:-1] - lg[np.arange(len(ids) - 1), ids[1:]]).mean()
  got = ppl.perplexity(ours, ids)
  assert got["mean_nll"] == pytest.approx(want, rel=1e-4)
  assert got["perplexity"] == pytest.approx(math.exp(want), rel=1e-4)
