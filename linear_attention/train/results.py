"""Reading a run directory: its config, final metrics and checkpoints, and evaluating a
checkpoint on changed data. Nothing here writes to the workdir, so it is safe on a run
that is still training.

``load_model`` gives the trained model and ``sample_text`` the text a byte-level language
model writes after a prompt. ``load_config`` and ``load_final_metrics`` read plain files and are defined in
:mod:`~linear_attention.train.rundir` (the trainer needs them too, and this module imports
the trainer); every checkpoint read goes through the one wrapper,
:class:`~linear_attention.train.checkpoint.Checkpointer`, opened read-only.
"""

from __future__ import annotations

import math
import os
import pathlib
from typing import Any, Mapping

import jax
from flax import nnx

from linear_attention.train import build
from linear_attention.train import checkpoint as ckpt_lib
from linear_attention.train import sharding
from linear_attention.train import trainer
from linear_attention.train.rundir import load_config, load_final_metrics  # noqa: F401


def load_checkpoint(workdir: str, step: int | None = None) -> dict:
  """The raw arrays of a checkpoint in ``workdir`` (default: the newest), as nested dicts.

  For inspection and tests; training restores through ``train_and_evaluate``.

  Raises:
    ValueError: no complete checkpoint in ``workdir``.
  """
  ckpt = ckpt_lib.Checkpointer(workdir, read_only=True)
  try:
    return ckpt.restore_raw(step)
  finally:
    ckpt.close()


def _restore(workdir: str, config, ds, step: int | None):
  """The run's model and optimiser state restored from ``step`` (default: the newest that
  restores): ``(model, graphdef, state, state shardings, mesh, step)``."""
  model, opt = build._model_and_optimizer(config, ds)
  mesh = sharding.make_mesh(config.mesh)
  graphdef, state = nnx.split((model, opt))
  state_sh = sharding.state_shardings(state, mesh, bool(config.mesh.fsdp))
  state = jax.device_put(state, state_sh)
  ckpt = ckpt_lib.Checkpointer(workdir, read_only=True)
  try:
    if step is None:
      step, state = ckpt.restore_latest(state)
      if not step:
        raise ValueError(f"no complete checkpoint in {workdir!r}.")
    else:
      state = ckpt.restore(step, state)
  finally:
    ckpt.close()
  model, _ = nnx.merge(graphdef, state)
  return model, graphdef, state, state_sh, mesh, int(step)


def load_model(workdir: str, step: int | None = None):
  """The trained model of a run directory: ``(model, config, step)``.

  Args:
    workdir: a run directory of ``train_and_evaluate``.
    step: the checkpoint (default: the newest that restores).

  Raises:
    ValueError: not a run directory, or no checkpoint.
    CheckpointError: checkpoints exist but none restores.
  """
  from linear_attention import data

  config = load_config(workdir)
  model, _, _, _, _, step = _restore(workdir, config,
                                     data.make_dataset(build.data_config(config)), step)
  return model, config, step


def is_hf_checkpoint(path: str) -> bool:
  """Whether ``path`` is a transformers checkpoint directory (weights and a ``config.json``
  with ``model_type``) rather than a training run directory."""
  from linear_attention.hub import checkpoint
  if not any(os.path.isfile(os.path.join(path, f)) for f in (checkpoint.SINGLE, checkpoint.INDEX)):
    return False
  try:
    return "model_type" in checkpoint.read_config(pathlib.Path(path))
  except ValueError:
    return False


def sample_text(workdir: str, prompt: str, max_new_tokens: int = 200, *,
                temperature: float = 0.8, top_k: int | None = None, seed: int = 0,
                step: int | None = None) -> str:
  """Text that a trained language model writes after ``prompt``: the prompt, then
  ``max_new_tokens`` sampled tokens, decoded.

  ``workdir`` is a text run (``configs/text_lm.py``: bytes decoded as UTF-8, an incomplete
  character replaced; ``configs/finetune.py``: its tokenizer) or a transformers checkpoint
  directory (loaded with ``linear_attention.hub``; its ``tokenizer.json`` encodes and
  decodes). A checkpoint without ``tokenizer.json`` takes the prompt as token ids
  (``"510 3158 8516"``) and returns the ids.

  Args:
    workdir: the run or checkpoint directory; prompt: non-empty text; temperature: 0 is
      greedy; top_k, seed: sampling (see ``models.generate``); step: the run's checkpoint
      (default newest).

  Raises:
    ValueError: not a text run (another task's tokens are not text: use :func:`load_model`
      and ``models.generate``), an empty prompt, a checkpoint without ``tokenizer.json`` and
      a prompt that is not token ids, or no checkpoint.
  """
  import jax.numpy as jnp
  import numpy as np

  from linear_attention import models
  from linear_attention.data.tokenizer import find_tokenizer, load_tokenizer

  if is_hf_checkpoint(workdir):
    from linear_attention import hub
    tok_path = find_tokenizer(workdir)
    if tok_path is None:
      try:
        ids = np.asarray([int(t) for t in prompt.replace(",", " ").split()], np.int32)
      except ValueError:
        raise ValueError(f"{workdir!r} has no tokenizer.json to encode the prompt: copy the "
                         "checkpoint's tokenizer.json there, or give the prompt as token ids "
                         f"(e.g. '1 2 3'), got {prompt!r}.") from None
    model = hub.from_pretrained(workdir)
  else:
    config = load_config(workdir)
    if config.data.get("task") != "text":
      raise ValueError(f"sample_text needs a text run (configs/text_lm.py or finetune.py), but "
                       f"{workdir!r} trained data.task={config.data.get('task')!r}; use "
                       "load_model() and linear_attention.models.generate for token ids.")
    tok_path = build.data_config(config).get("tokenizer") or None
    if tok_path is None:
      ids = np.frombuffer(prompt.encode("utf-8"), np.uint8).astype(np.int32)
    model = None
  tok = load_tokenizer(tok_path) if tok_path else None
  if tok is not None:
    ids = tok.encode(prompt)
  if not ids.size:
    raise ValueError("prompt must be non-empty text (and give at least one token).")
  if model is None:
    model, _, _ = load_model(workdir, step)
  out = np.asarray(models.generate(model, jnp.asarray(ids)[None], max_new_tokens,
                                   temperature=temperature, top_k=top_k,
                                   key=jax.random.PRNGKey(seed))[0])
  if tok is not None:
    return tok.decode(out)
  if is_hf_checkpoint(workdir):
    return " ".join(map(str, out.tolist()))
  return bytes(out.astype(np.uint8).tolist()).decode("utf-8", errors="replace")


def evaluate_checkpoint(workdir: str, data_overrides: Mapping[str, Any] | None = None, *,
                        num_batches: int | None = None, split: str = "validation",
                        step: int | None = None) -> dict:
  """Evaluates a trained run's checkpoint on its task with some data fields changed.

  For generalisation tests: a model trained at ``seq_len=256`` evaluated at 16k, an MQAR
  model on another number of pairs. Nothing in ``workdir`` is written.

  Args:
    workdir: a run directory of ``train_and_evaluate``.
    data_overrides: fields of ``config.data`` to change (``{"seq_len": 4096}``).
    num_batches: evaluation batches (``None``: the dataset's default).
    split: the split to evaluate.
    step: the checkpoint (default: the newest that restores).

  Returns:
    ``{"loss", "accuracy", "step"}`` (plus ``bits_per_byte`` for text).

  Raises:
    ValueError: not a run directory, no checkpoint, an override that changes the vocabulary
      or the classes (the model could not read it), or a bad data field.
    CheckpointError: checkpoints exist but none restores.
  """
  from linear_attention import data

  config = load_config(workdir)
  dcfg = build.data_config(config)
  trained = data.make_dataset(dcfg)
  dcfg.update(dict(data_overrides or {}))
  ds = data.make_dataset(dcfg)
  if (ds.vocab_size, ds.num_classes) != (trained.vocab_size, trained.num_classes):
    raise ValueError(f"data_overrides {dict(data_overrides)} change the vocabulary/classes from "
                     f"{(trained.vocab_size, trained.num_classes)} to "
                     f"{(ds.vocab_size, ds.num_classes)}; the trained model cannot read them.")
  model, graphdef, state, state_sh, mesh, step = _restore(workdir, config, ds, step)
  repl = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  trainer.check_context_parallel(model, ds, mesh)
  batch_sh = sharding.batch_shardings(next(iter(ds.eval_batches(split=split, num_batches=1))),
                                      mesh)
  _, eval_fn = trainer.make_steps(graphdef, ds.kind, state_sh, batch_sh, repl,
                                  getattr(ds, "max_targets_per_row", None))
  eval_fn = sharding.under_mesh(eval_fn, mesh)
  res = trainer.evaluate(eval_fn, state, ds, mesh, num_batches, split)
  if config.data.get("task") == "text" and not getattr(ds, "tokenizer", ""):
    res["bits_per_byte"] = res["loss"] / math.log(2)
  return {**res, "step": int(step)}


def plot_metrics(workdirs: str | list[str], path: str, metric: str = "loss") -> str:
  """Plots ``metric`` against the step for the train and validation records of one or more
  run directories (their ``metrics.jsonl``; safe while they train) into the image ``path``.

  Needs matplotlib (``pip install -e ".[notebooks]"``). Returns ``path``.

  Raises:
    ValueError: a directory without any ``metric`` record.
  """
  import os

  import matplotlib
  matplotlib.use("Agg")  # files only: no display needed
  import matplotlib.pyplot as plt

  from linear_attention.train import metrics as metrics_lib

  workdirs = [workdirs] if isinstance(workdirs, str) else list(workdirs)
  fig, ax = plt.subplots(figsize=(7, 4))
  for wd in workdirs:
    recs = [r for r in metrics_lib.read_metrics(wd) if isinstance(r.get(metric), (int, float))]
    if not recs:
      plt.close(fig)
      raise ValueError(f"no {metric!r} records in {os.path.join(wd, metrics_lib.METRICS_FILE)!r}.")
    name = os.path.basename(os.path.normpath(wd))
    for split, style in (("train", "-"), ("validation", "o--")):
      pts = [(r["step"], r[metric]) for r in recs if r.get("split") == split]
      if pts:
        ax.plot(*zip(*pts), style, label=f"{name} {split}")
  ax.set_xlabel("step")
  ax.set_ylabel(metric)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)
  return path
