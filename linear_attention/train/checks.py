"""The checks a run makes before it writes anything: :func:`check_run` and its parts.

Split from :mod:`~linear_attention.train.trainer`, which re-exports these names;
:func:`check_batch` also checks every later batch, and :func:`check_context_parallel`
every evaluation of a checkpoint.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import ml_collections
import numpy as np
from flax import nnx

from linear_attention.train import errors
from linear_attention.train import optim
from linear_attention.train import rundir
from linear_attention.train import sharding
from linear_attention.train.build import _model_and_optimizer, check_init_from, data_config
from linear_attention.train.steps import _train_step_fn

EARLY_STOP_METRICS = ("", "accuracy", "loss")


def _check_config(config: ml_collections.ConfigDict) -> None:
  t = config.train
  if t.steps < 0:
    raise ValueError(f"config.train.steps must be >= 0, got {t.steps}.")
  for f in ("log_every", "eval_every", "checkpoint_every"):
    if t[f] < 0:
      raise ValueError(f"config.train.{f} must be >= 0 (0 = never), got {t[f]}.")
  spd = t.get("steps_per_dispatch", 1)
  if isinstance(spd, bool) or not isinstance(spd, int) or spd < 1:
    raise ValueError(f"config.train.steps_per_dispatch must be an int >= 1, got {spd!r}.")
  param_dtype = config.model.get("param_dtype", "float32")
  if param_dtype != "float32" and t.steps > 0:
    raise ValueError(f"config.model.param_dtype={param_dtype!r} is for inference (evaluation, "
                     "generation); training keeps float32 parameters and optimizer state. "
                     "For bfloat16 compute set config.model.dtype='bfloat16' and leave "
                     "config.model.param_dtype='float32'.")
  accum = t.get("accum_steps", 1)
  if isinstance(accum, bool) or not isinstance(accum, int) or accum < 1:
    raise ValueError(f"config.train.accum_steps must be an int >= 1, got {accum!r}.")
  metric = t.get("early_stop_metric", "")
  if metric not in EARLY_STOP_METRICS:
    raise ValueError(f"config.train.early_stop_metric must be one of {list(EARLY_STOP_METRICS)}, "
                     f"got {metric!r}.")
  if metric and not t.eval_every:
    raise ValueError("config.train.early_stop_metric needs config.train.eval_every > 0 (the "
                     "stop is checked at each evaluation), got 0.")
  optim.lr_schedule(config.optim, max(int(t.steps), 1))  # an unknown schedule fails here


def check_batch(batch: Mapping[str, np.ndarray], ds, step: int, split: str) -> None:
  """Refuses a batch whose token ids (or labels) fall outside the dataset's vocabulary.

  Out-of-range ids do not fail inside the model: the embedding lookup gives NaN logits
  (ids >= vocab) or wraps around (negative ids) under ``jit``. One min/max per array on the
  host costs microseconds per step.

  Raises:
    DataError: naming the array, the offending id, the vocabulary size, the step and split.
  """
  checks = [("inputs", batch["inputs"], None, ds.vocab_size)]
  if ds.kind == "lm":
    checks.append(("targets", batch["targets"], np.asarray(batch["mask"]) > 0, ds.vocab_size))
  elif "label" in batch and ds.num_classes:
    checks.append(("label", batch["label"], None, ds.num_classes))
  for name, arr, where, size in checks:
    arr = np.asarray(arr)
    if where is not None:
      arr = arr[where]
    if arr.size == 0:
      continue
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= size:
      bad = lo if lo < 0 else hi
      what = "classes" if name == "label" else "vocabulary"
      raise errors.DataError(
          f"the {split} batch of step {step} holds {name} id {bad}, outside the {what} of "
          f"size {size} (valid ids 0..{size - 1}); the dataset breaks the data contract.")


def check_context_parallel(model: nnx.Module, ds, mesh) -> None:
  """With a sharded sequence (``config.mesh.seq > 1``): ``seq`` divides the dataset's
  sequence length and every mixer of ``model`` runs context-parallel.

  Raises:
    ValueError: naming ``config.mesh.seq`` and, for mixers, the ones that cannot run
      sharded and the ones that can.
  """
  s = sharding.seq_size(mesh)
  if s == 1:
    return
  sharding.check_seq_len(int(ds.seq_len), mesh)
  from linear_attention.nn import registry
  names = getattr(getattr(model, "backbone", model), "mixer_names", ())
  bad = sorted({n for n in names if not registry.spec(n).cls.context_parallel})
  if bad:
    able = list(registry.select(context_parallel=True))
    raise ValueError(f"config.mesh.seq={s} shards the sequence, but mixer(s) {bad} cannot run "
                     f"that way; context-parallel mixers: {able}.")


def check_run(config: ml_collections.ConfigDict, dataset=None, *, abstract: bool = False):
  """Every check a run makes before it writes anything: the config's fields, the dataset,
  the model and every layer option (by tracing one training step on abstract inputs, which
  reaches the checks that the ops make at trace time), the mesh and the first batch.

  Args:
    config: the run's ConfigDict.
    dataset: as in :func:`train_and_evaluate`.
    abstract: build the model and optimizer with ``nnx.eval_shape`` (no parameter values;
      for checking a config without training it).

  Returns:
    ``(dataset, model, optimizer, mesh)``.

  Raises:
    ConfigError (a ValueError): the first problem found, in one line.
  """
  try:
    _check_config(config)
    check_init_from(config)
    check_mixer_kwargs(config.model)
    if dataset is None:
      from linear_attention import data  # the trainer's tests can run without the task code
      dataset = data.make_dataset(data_config(config))
    ds = dataset
    if abstract:
      model, opt = nnx.eval_shape(lambda: _model_and_optimizer(config, ds, build=False))
    else:
      model, opt = _model_and_optimizer(config, ds)
    mesh = sharding.make_mesh(config.mesh)
    if ds.batch_size % mesh.shape[sharding.DATA]:
      raise ValueError(f"config.data.batch_size ({ds.batch_size}) must be divisible by the "
                       f"{mesh.shape[sharding.DATA]} devices of the data axis (config.mesh.data).")
    accum = int(config.train.get("accum_steps", 1))
    if ds.batch_size % (mesh.shape[sharding.DATA] * accum):
      raise ValueError(f"config.data.batch_size ({ds.batch_size}) must be divisible by "
                       f"config.train.accum_steps ({accum}) times the "
                       f"{mesh.shape[sharding.DATA]} devices of the data axis: each device "
                       "splits its rows into accum_steps micro-batches.")
    check_context_parallel(model, ds, mesh)
    first = ds.batch(0, split="train")
    check_batch(first, ds, 0, "train")
    check_first_step(model, opt, ds, mesh, first, accum_steps=accum)
  except errors.ConfigError:
    raise
  except (ValueError, ModuleNotFoundError) as e:  # all of it refused before anything written
    raise errors.ConfigError(str(e)) from e
  return ds, model, opt, mesh


def check_first_step(model: nnx.Module, opt: nnx.Optimizer, ds, mesh,
                     batch: Mapping[str, np.ndarray], accum_steps: int = 1) -> None:
  """Traces one training step on abstract inputs (``jax.eval_shape``: nothing computed or
  compiled), under the mesh as the real step is, so that a layer option the ops check
  only at trace time (a chunk size, a form, a window wider than a shard) fails here.

  Raises:
    ValueError: from the layer or op that refused its option.
  """
  graphdef, state = nnx.split((model, opt))
  shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), state)
  batch = {k: jax.ShapeDtypeStruct(np.shape(v), np.asarray(v).dtype) for k, v in batch.items()}
  step = _train_step_fn(graphdef, ds.kind, getattr(ds, "max_targets_per_row", None),
                        accum_steps)
  with sharding.mesh_context(mesh):
    jax.eval_shape(step, shapes, batch)


def check_mixer_kwargs(mcfg: Mapping[str, Any]) -> None:
  """Refuses options of mixers the model does not use: they would change nothing, yet be
  stored in ``config.json`` and block a later resume without them.

  Raises:
    ValueError: naming every such ``config.model.mixer_kwargs.<mixer>.<option>``, its value
      and default, and the mixers the model uses.
  """
  from linear_attention.nn import registry
  mk = mcfg.get("mixer_kwargs") or {}
  mk = mk.to_dict() if isinstance(mk, ml_collections.ConfigDict) else dict(mk)
  used = rundir.used_mixers(mcfg)
  defaults = _mixer_option_defaults()
  bad = []
  for name, opts in sorted(mk.items()):
    if name in used or name not in registry.MIXERS:  # unknown names: the model refuses them
      continue
    for k, v in sorted(dict(opts or {}).items()):
      if k not in defaults.get(name, {}) or v != defaults[name][k]:
        bad.append(f"config.model.mixer_kwargs.{name}.{k}={v!r}")
  if bad:
    raise ValueError(f"{', '.join(bad)} set(s) an option of a mixer this model does not use "
                     f"(its mixers: {sorted(used)}); drop it, or set config.model.mixer / "
                     "config.model.pattern to a model that uses it.")


_OPTION_DEFAULTS: dict = {}


def _mixer_option_defaults() -> dict:
  """``{mixer: {option: default}}`` as the configs declare them (cached)."""
  if not _OPTION_DEFAULTS:
    from linear_attention.nn import registry
    import inspect
    for name in registry.MIXERS:
      s = registry.spec(name)
      params = inspect.signature(s.cls.__init__).parameters
      _OPTION_DEFAULTS[name] = {k: s.defaults.get(k, params[k].default)
                                for k in registry.mixer_kwargs(name)}
  return _OPTION_DEFAULTS
