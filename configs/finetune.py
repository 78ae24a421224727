"""Fine-tuning an imported transformers checkpoint on text with its own tokenizer.

``--config=configs/finetune.py:size=small --config.init_from=ckpt/mamba-130m`` (required).
The model (sizes, layers, vocabulary, weights) comes from the checkpoint's ``config.json``
and safetensors (``linear_attention.hub.from_pretrained``), so the ``model.*`` size fields
are left unset here and refused when given; the text (``data.corpus``, or a file with
``--config.data.text_file=...``) is tokenized with the checkpoint's ``tokenizer.json``
(``--config.data.tokenizer=...`` names another). At the end the trained model is written as
a transformers checkpoint to ``<workdir>/hf`` (or ``--config.save_hf=DIR``), with the
tokenizer copied beside it. Mesh options (``mesh.data``, ``mesh.fsdp``, ``mesh.seq``),
``model.remat``, ``model.scan_layers``, checkpoints and resuming work as for every config. Arguments:
  corpus  ``kjv`` or ``python_stdlib`` (replaced by ``data.text_file`` when that is set);
  size    ``smoke`` (a few steps, to try the pipeline) or ``small``.
"""

from __future__ import annotations

from configs import common

SIZES = {
    "smoke": dict(seq_len=64, batch_size=4, steps=4, lr=1e-4, warmup_steps=1, eval_every=0,
                  eval_batches=2, log_every=2),
    "small": dict(seq_len=512, batch_size=8, steps=500, lr=3e-5, warmup_steps=50,
                  eval_every=250, eval_batches=16, log_every=25),
}

def get_config(arg: str | None = None):
  """The config for ``arg`` (``"size=small,corpus=kjv"``); see the module docstring."""
  args = common.parse_arg(arg, dict(size="small", corpus="kjv"))
  common.check_choice("size", args.size, SIZES)
  s = SIZES[args.size]
  c = common.base_config("text")
  c.data.corpus = args.corpus
  c.data.seq_len, c.data.batch_size = s["seq_len"], s["batch_size"]
  from linear_attention.train.build import MODEL_FROM_CHECKPOINT
  c.model.update(MODEL_FROM_CHECKPOINT)  # the checkpoint decides these
  c.optim.lr, c.optim.warmup_steps, c.optim.weight_decay = s["lr"], s["warmup_steps"], 0.0
  c.train.steps, c.train.eval_every, c.train.eval_batches = s["steps"], s["eval_every"], s["eval_batches"]
  c.train.log_every = s["log_every"]
  c.train.checkpoint_every = max(s["steps"] // 4, 1)
  c.train.steps_per_dispatch = 1
  return common.finalize(c)
