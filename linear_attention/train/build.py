"""The model and optimizer that a run's config names: :func:`create_model`.

Split from :mod:`~linear_attention.train.trainer`, which re-exports these names; the
pre-write checks (:mod:`~linear_attention.train.checks`) build the model too, so it
lives below both.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from linear_attention import models
from linear_attention.train import optim

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def _build_model(mcfg: Mapping[str, Any], vocab_size: int, kind: str,
                 num_classes: int | None, seed: int) -> nnx.Module:
  """:func:`create_model`'s model, initialised op by op (or abstractly under ``eval_shape``)."""
  if kind not in ("lm", "classify"):
    raise ValueError(f"dataset kind must be 'lm' or 'classify', got {kind!r}.")
  if mcfg["dtype"] not in DTYPES:
    raise ValueError(f"config.model.dtype must be one of {list(DTYPES)}, got {mcfg['dtype']!r}.")
  param_dtype = mcfg.get("param_dtype", "float32")
  if param_dtype not in DTYPES:
    raise ValueError(f"config.model.param_dtype must be one of {list(DTYPES)}, got "
                     f"{param_dtype!r}.")
  mk = mcfg["mixer_kwargs"]
  mk = mk.to_dict() if isinstance(mk, ml_collections.ConfigDict) else dict(mk or {})
  pattern = mcfg["pattern"] or None
  common = dict(mixer=None if pattern else mcfg["mixer"], pattern=pattern,
                num_heads=mcfg["num_heads"], mlp_ratio=mcfg["mlp_ratio"], mixer_kwargs=mk,
                short_conv=int(mcfg.get("short_conv", 0)), dtype=DTYPES[mcfg["dtype"]],
                param_dtype=DTYPES[param_dtype],
                remat=mcfg.get("remat", "none"), scan_layers=bool(mcfg.get("scan_layers", False)))
  num_layers = mcfg["num_layers"] if mcfg["num_layers"] > 0 else None
  rngs = nnx.Rngs(params=seed)
  if kind == "lm":
    return models.LanguageModel(vocab_size, mcfg["d_model"], num_layers,
                                tie_embeddings=mcfg["tie_embeddings"], rngs=rngs, **common)
  return models.SequenceClassifier(vocab_size, num_classes, mcfg["d_model"], num_layers,
                                   pooling=mcfg["pooling"], rngs=rngs, **common)


def create_model(mcfg: Mapping[str, Any], vocab_size: int, kind: str,
                 num_classes: int | None, seed: int) -> nnx.Module:
  """The model named by ``config.model``: a ``LanguageModel`` (kind ``"lm"``) or a
  ``SequenceClassifier`` (kind ``"classify"``).

  ``mcfg.pattern`` (hybrid letters such as ``"RRA"``) wins over ``mcfg.mixer`` when non-empty.

  Raises:
    ValueError: unknown mixer or pattern letter (listing the valid ones), bad sizes.
  """
  def build():
    return _build_model(mcfg, vocab_size, kind, num_classes, seed)

  # The parameters are initialised by one compiled program: op by op, the initialisers
  # dispatched hundreds of small programs (about 2.7 s of a smoke-size trainer's start), and
  # with JAX's persistent compilation cache a second start of the same model skips the
  # compile (1.0 s). Same values as op by op: the same keys and initialisers.
  graphdef, _ = nnx.split(nnx.eval_shape(build))
  return nnx.merge(graphdef, jax.jit(lambda: nnx.state(build()))())


# ----------------------------------------------------------------------------- init_from

# ``config.model`` fields that a checkpoint's config.json decides: with ``config.init_from``
# they must keep these "unset" values (configs/finetune.py sets them).
MODEL_FROM_CHECKPOINT = dict(mixer="", pattern="", d_model=0, num_layers=0, num_heads=0,
                             mlp_ratio=0.0, short_conv=0)
# Fields the imported model does not take: they must keep their default.
MODEL_DEFAULTS_WITH_CHECKPOINT = dict(dtype="float32", param_dtype="float32")


def init_from(config: Mapping[str, Any]) -> str:
  """``config.init_from`` (``""`` when absent: a config written before the field existed)."""
  return str(config.get("init_from", "") or "")


def data_config(config: ml_collections.ConfigDict) -> dict:
  """``config.data`` as the run reads it: with ``config.init_from`` and no
  ``data.tokenizer``, text is tokenized with the checkpoint's own ``tokenizer.json``."""
  d = config.data.to_dict() if hasattr(config.data, "to_dict") else dict(config.data)
  src = init_from(config)
  if src and d.get("task") == "text" and not d.get("tokenizer"):
    from linear_attention.data.tokenizer import find_tokenizer
    found = find_tokenizer(os.path.expanduser(src))
    if found:
      d["tokenizer"] = found
  return d


def check_init_from(config: ml_collections.ConfigDict) -> None:
  """With ``config.init_from``: the model fields the checkpoint decides are unset, the
  directory holds a checkpoint of a supported family, and ``save_hf`` has a model to save.

  Raises:
    ValueError: naming each conflicting ``config.model.<field>`` with its value, or the
      checkpoint problem.
  """
  src = init_from(config)
  if not src:
    if config.get("save_hf"):
      raise ValueError(f"config.save_hf={config.save_hf!r} writes a model imported with "
                       "config.init_from as a transformers checkpoint; a registry model has no "
                       "transformers family: set config.init_from, or drop config.save_hf.")
    return
  m = config.model
  given = [f"config.model.{k}={m[k]!r}" for k, unset in MODEL_FROM_CHECKPOINT.items()
           if k in m and m[k] != unset]
  given += [f"config.model.{k}={m[k]!r}" for k, d in MODEL_DEFAULTS_WITH_CHECKPOINT.items()
            if k in m and m[k] != d]
  if given:
    raise ValueError(f"config.init_from={src!r} builds the model from the checkpoint's "
                     f"config.json, but {', '.join(given)} set(s) the model too (expected: "
                     f"{', '.join(f'{k}={v!r}' for k, v in MODEL_FROM_CHECKPOINT.items())}; "
                     "dtype float32); use --config=configs/finetune.py, whose "
                     "model fields are unset, or drop config.init_from.")
  from linear_attention.hub import checkpoint, loader
  loader.family_of(checkpoint.read_config(checkpoint.check_directory(os.path.expanduser(src))))


def load_init_model(config: ml_collections.ConfigDict, ds, abstract: bool = False) -> nnx.Module:
  """The model of ``config.init_from`` in float32 (abstract: built without reading weights,
  for a caller under ``nnx.eval_shape``), after checking that the data's tokens are the checkpoint's.

  Raises:
    ValueError: a classification dataset, a data vocabulary larger than the checkpoint's, or
      byte-level text for a checkpoint without ``tokenizer.json``.
  """
  from linear_attention import hub
  from linear_attention.hub import checkpoint, loader
  src = os.path.expanduser(init_from(config))
  if ds.kind != "lm":
    raise ValueError(f"config.init_from={src!r} is a language model; the dataset "
                     f"{config.data.get('task')!r} is a {ds.kind!r} task (use a text or token "
                     "task).")
  hf_config = checkpoint.read_config(checkpoint.check_directory(src))
  vocab = int(hf_config.get("vocab_size", 0))
  if config.data.get("task") == "text" and not getattr(ds, "tokenizer", ""):
    raise ValueError(f"config.init_from={src!r} has no tokenizer.json, so the text would be "
                     f"fed as bytes (ids 0..255), not the checkpoint's tokens (vocabulary "
                     f"{vocab}); put the checkpoint's tokenizer.json in {src!r} or name one "
                     "with config.data.tokenizer.")
  if ds.vocab_size > vocab:
    raise ValueError(f"the data's vocabulary ({ds.vocab_size} ids, data.task="
                     f"{config.data.get('task')!r}) is larger than the checkpoint's "
                     f"(vocab_size {vocab} in {src!r}/config.json): its ids would fall outside "
                     "the embedding; tokenize with the checkpoint's tokenizer.")
  if abstract:  # (the caller runs under nnx.eval_shape: nothing is initialised)
    model = loader.family_of(hf_config).build(hf_config, rngs=nnx.Rngs(0), dtype=jnp.float32,
                                              param_dtype=jnp.float32)
    model.hub_config = json.dumps(hf_config, sort_keys=True)
  else:
    model = hub.from_pretrained(src, dtype="float32")
  # Built layer by layer as the checkpoint names them; stacked here when scan_layers asks.
  model.backbone.set_layout(remat=config.model.get("remat", "none"),
                            scan_layers=bool(config.model.get("scan_layers", False)))
  return model


def _model_and_optimizer(config: ml_collections.ConfigDict, ds, build: bool = True):
  if init_from(config):
    model = load_init_model(config, ds, abstract=not build)
  else:
    make = create_model if build else _build_model
    model = make(config.model, ds.vocab_size, ds.kind, ds.num_classes, int(config.train.seed))
  return model, optim.make_optimizer(model, config.optim, int(config.train.steps))
