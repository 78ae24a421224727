"""The model and optimizer that a run's config names: :func:`create_model`.

Split from :mod:`~linear_attention.train.trainer`, which re-exports these names; the
pre-write checks (:mod:`~linear_attention.train.checks`) build the model too, so it
lives below both.
"""

from __future__ import annotations

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


def _model_and_optimizer(config: ml_collections.ConfigDict, ds, build: bool = True):
  make = create_model if build else _build_model
  model = make(config.model, ds.vocab_size, ds.kind, ds.num_classes, int(config.train.seed))
  return model, optim.make_optimizer(model, config.optim, int(config.train.steps))
