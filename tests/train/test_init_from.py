"""Fine-tuning an imported checkpoint (``config.init_from``, ``configs/finetune.py``): the
model and tokenizer come from the checkpoint, the result is saved with ``save_pretrained``,
a resumed run restores its own weights, and every conflict is refused before anything is
written. The checkpoint is the Mamba fixture with a word-level tokenizer trained in the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from linear_attention import hub, train
from linear_attention.train import errors, results
from tests.hub.tiny_tokenizer import checkpoint_with_tokenizer

pytest.importorskip("tokenizers")
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def finetune_config(ckpt, text_file, steps=2, **model):
  from configs import finetune
  c = finetune.get_config("size=smoke")
  with c.unlocked():
    c.init_from, c.data.text_file = str(ckpt), str(text_file)
    c.data.seq_len, c.data.batch_size = 16, 2
    c.train.steps, c.train.checkpoint_every, c.train.eval_batches = steps, 2, 1
    c.optim.lr = 1e-2  # large enough that two steps move every weight visibly
    c.model.update(model)
  return c


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
  """A 2-step fine-tune of the Mamba fixture: ``(checkpoint, text file, workdir, final)``."""
  tmp = tmp_path_factory.mktemp("init_from")
  ckpt = checkpoint_with_tokenizer(tmp)
  wd = tmp / "run"
  final = train.train_and_evaluate(finetune_config(ckpt, tmp / "text.txt"), str(wd),
                                   verbose=False)
  return ckpt, tmp / "text.txt", wd, final


def test_finetune_saves_a_checkpoint_that_loads(tuned):
  ckpt, _, wd, final = tuned
  hf = wd / "hf"
  assert final["hf_dir"] == str(hf) and final["step"] == 2
  assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(hf))
  assert json.loads((hf / "config.json").read_text())["model_type"] == "mamba"
  before, after = load_file(ckpt / "model.safetensors"), load_file(hf / "model.safetensors")
  assert set(before) == set(after)
  assert all(not np.array_equal(before[k], after[k]) for k in before)  # every tensor trained
  # The saved model is the run's last checkpoint.
  trained, _, step = results.load_model(str(wd))
  assert step == 2
  ids = np.array([[1, 2, 3, 4, 5]], np.int32)
  np.testing.assert_allclose(np.asarray(hub.from_pretrained(hf)(ids)), np.asarray(trained(ids)),
                             rtol=1e-5, atol=1e-6)
  # Text was tokenized with the checkpoint's tokenizer: no bits-per-byte of tokens.
  assert "validation_bits_per_byte" not in final


def test_resume_restores_the_trained_weights_not_init_from(tuned, tmp_path):
  import shutil
  ckpt, text, wd, _ = tuned
  moved = tmp_path / "ckpt"
  shutil.copytree(ckpt, moved)
  run = tmp_path / "run"
  shutil.copytree(wd, run)
  os.remove(run / "final_metrics.json")
  # The checkpoint it started from now holds other weights: a resume that reloaded it
  # would show them.
  w = load_file(moved / "model.safetensors")
  save_file({k: v * 3 for k, v in w.items()}, str(moved / "model.safetensors"))
  cfg = finetune_config(ckpt, text, steps=3)
  with cfg.unlocked():
    cfg.save_hf = str(tmp_path / "out")
  # init_from is part of what the checkpoints depend on: only the same path resumes.
  final = train.train_and_evaluate(cfg, str(run), verbose=False)
  assert final["step"] == 3 and final["hf_dir"] == str(tmp_path / "out")
  step2 = load_file(wd / "hf" / "model.safetensors")
  step3 = load_file(tmp_path / "out" / "model.safetensors")
  diff = max(float(np.max(np.abs(step3[k] - step2[k]))) for k in step2)
  assert 0 < diff < 0.05  # one more step of lr 1e-2, not the tripled weights


def test_sample_with_the_checkpoint_tokenizer(tuned):
  ckpt, _, wd, _ = tuned
  from linear_attention.data.tokenizer import load_tokenizer
  from linear_attention.models import generate
  tok = load_tokenizer(str(ckpt))
  texts = [results.sample_text(str(d), "the cat sat", 6, temperature=0)
           for d in (wd, wd / "hf", ckpt)]
  assert texts[0] == texts[1]  # the run's checkpoint and its saved copy
  for d, text in zip((wd / "hf", ckpt), texts[1:]):
    ids = generate(hub.from_pretrained(d), tok.encode("the cat sat")[None], 6, temperature=0)
    assert text == tok.decode(np.asarray(ids[0]))
    assert text.split()[:3] == ["the", "cat", "sat"] and len(text.split()) == 9


def test_sample_without_tokenizer_takes_token_ids(tuned, tmp_path):
  import shutil
  d = tmp_path / "bare"
  shutil.copytree(tuned[0], d)
  os.remove(d / "tokenizer.json")
  out = results.sample_text(str(d), "1 2 3", 4, temperature=0)
  assert out.split()[:3] == ["1", "2", "3"] and len(out.split()) == 7
  with pytest.raises(ValueError, match="no tokenizer.json.*token ids"):
    results.sample_text(str(d), "the cat", 4)


def test_sample_flag_on_a_checkpoint_directory(tuned):
  cmd = [sys.executable, "-m", "linear_attention.main", f"--workdir={tuned[2] / 'hf'}",
         "--sample=the dog", "--sample_tokens=3", "--temperature=0"]
  p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, p.stderr[-2000:]
  assert p.stdout.split()[:2] == ["the", "dog"] and len(p.stdout.split()) == 5


def test_abstract_check_builds_the_checkpoint_model(tuned):
  """``check_run(abstract=True)`` (a config check without training) builds the checkpoint's
  model shapes, reading no weights."""
  from linear_attention.train import trainer
  ckpt, text, _, _ = tuned
  ds, model, _, _ = trainer.check_run(finetune_config(ckpt, text), abstract=True)
  assert model.vocab_size == ds.vocab_size == 64
  assert json.loads(model.hub_config)["model_type"] == "mamba"


def _refused(cfg, tmp_path, match):
  with pytest.raises(errors.ConfigError, match=match):
    train.train_and_evaluate(cfg, str(tmp_path / "refused"), verbose=False)
  assert not (tmp_path / "refused").exists()  # refused before anything was written


def test_model_fields_with_init_from_are_refused(tuned, tmp_path):
  ckpt, text, _, _ = tuned
  _refused(finetune_config(ckpt, text, d_model=64), tmp_path,
           r"config.init_from=.*config.model.d_model=64.*configs/finetune.py")
  from configs import text_lm
  c = text_lm.get_config("size=smoke")
  with c.unlocked():
    c.init_from = str(ckpt)
  _refused(c, tmp_path, r"config.model.mixer='gla', .*config.model.d_model=64")


def test_data_that_is_not_the_checkpoints_tokens_is_refused(tuned, tmp_path):
  import shutil
  ckpt, text, _, _ = tuned
  bare = tmp_path / "bare"
  shutil.copytree(ckpt, bare)
  os.remove(bare / "tokenizer.json")
  _refused(finetune_config(bare, text), tmp_path, r"has no tokenizer.json.*bytes.*vocabulary 64")
  from configs import mqar
  c = mqar.get_config("size=smoke")
  with c.unlocked():
    c.init_from, c.data.vocab_size, c.train.steps = str(ckpt), 8192, 1
    c.model.update(dict(mixer="", pattern="", d_model=0, num_layers=0, num_heads=0,
                        mlp_ratio=0.0, short_conv=0))
  _refused(c, tmp_path, r"data's vocabulary \(8192 ids.*larger than the checkpoint's "
                        r"\(vocab_size 64")


def test_bad_init_from_and_save_hf_without_it_are_refused(tuned, tmp_path):
  _, text, _, _ = tuned
  _refused(finetune_config(tmp_path / "nowhere", text), tmp_path, r"does not exist")
  from configs import text_lm
  c = text_lm.get_config("size=smoke")
  with c.unlocked():
    c.save_hf = str(tmp_path / "hf")
  _refused(c, tmp_path, r"config.save_hf=.*set config.init_from")


def test_readme_commands_run_on_the_fixture(tuned, tmp_path):
  """The README's "Generate, evaluate, fine-tune and save back" commands, on the fixture
  (the fine-tune cut to two steps of 16 tokens)."""
  import re
  import shlex
  ckpt, text, _, _ = tuned
  readme = open(os.path.join(ROOT, "README.md")).read()
  block = re.search(r"### Generate, evaluate, fine-tune and save back.*?```bash\n(.*?)```",
                    readme, re.S).group(1)
  lines = [ln for ln in block.replace("\\\n", " ").splitlines()
           if ln.strip() and not ln.startswith("#")]
  assert len(lines) == 4
  for line in lines:
    line = (line.replace("ckpt/mamba-130m", str(ckpt)).replace("book.txt", str(text))
            .replace("runs/ft", str(tmp_path / "ft")).replace("size=small", "size=smoke"))
    args = shlex.split(line)
    assert args[:2] == ["python", "-m"], line
    if "configs/finetune.py" in line:
      args += ["--config.data.seq_len=16", "--config.train.steps=2", "--quiet"]
    p = subprocess.run([sys.executable] + args[1:], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, (line, p.stderr[-2000:])
    if "perplexity" in line:
      assert re.match(r"\d+ tokens  mean NLL [\d.]+ nats  perplexity [\d.]+  bits/byte", p.stdout)
    if "--sample" in line:
      assert p.stdout.split()[1] == "river"  # ("The" is [UNK] to the lower-case tokenizer)
  assert (tmp_path / "ft" / "hf" / "model.safetensors").is_file()


MESH_SCRIPT = """
import jax, numpy as np
assert jax.device_count() == 2, jax.devices()
from safetensors.numpy import load_file
from linear_attention import train
from tests.hub.tiny_tokenizer import checkpoint_with_tokenizer
from tests.train.test_init_from import finetune_config
import pathlib
tmp = pathlib.Path(WORKDIR)
ckpt = checkpoint_with_tokenizer(tmp, "mamba2")
out = {}
for name, data, fsdp, seq in [("single", 1, False, 1), ("fsdp", 2, True, 1), ("seq", 1, False, 2)]:
  cfg = finetune_config(ckpt, tmp / "text.txt")
  with cfg.unlocked():
    cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.seq = data, fsdp, seq
  res = train.train_and_evaluate(cfg, str(tmp / name), verbose=False)
  out[name] = (res["validation_loss"], load_file(tmp / name / "hf" / "model.safetensors"))
for name in ("fsdp", "seq"):
  np.testing.assert_allclose(out[name][0], out["single"][0], rtol=2e-5)
  for k, v in out["single"][1].items():
    np.testing.assert_allclose(out[name][1][k], v, rtol=2e-4, atol=2e-6, err_msg=name + k)
print("INIT_FROM MESH OK")
"""


def test_finetune_under_fsdp_and_a_sharded_sequence_matches_one_device(tmp_path):
  """The Mamba-2 fixture fine-tuned on 2 fake devices, parameters and optimiser state
  sharded (``mesh.fsdp``) and the sequence split (``mesh.seq``): the saved weights and the
  validation loss of one device."""
  from tests.helpers import run_on_fake_devices
  run_on_fake_devices(MESH_SCRIPT, "INIT_FROM MESH OK", devices=2, workdir=tmp_path)


def test_finetune_with_remat_and_stacked_layers_matches_the_plain_one(tuned, tmp_path):
  """``model.remat=block`` and ``model.scan_layers`` on an imported checkpoint: the blocks
  are stacked after loading and saved back layer by layer, with the plain run's numbers."""
  ckpt, text, wd, final = tuned
  run = tmp_path / "stacked"
  got = train.train_and_evaluate(finetune_config(ckpt, text, remat="block", scan_layers=True),
                                 str(run), verbose=False)
  np.testing.assert_allclose(got["validation_loss"], final["validation_loss"], rtol=1e-5)
  plain, stacked = load_file(wd / "hf" / "model.safetensors"), load_file(
      run / "hf" / "model.safetensors")
  assert set(plain) == set(stacked)
  for k in plain:
    np.testing.assert_allclose(stacked[k], plain[k], rtol=1e-4, atol=1e-6, err_msg=k)
