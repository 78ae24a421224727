"""Shared defaults of every experiment config and the ``key=value,...`` argument parser.

A config file ``configs/<task>.py`` defines ``get_config(arg)``; ``arg`` is the text after
the colon in ``--config=configs/mqar.py:mixer=gla,size=smoke``. The returned ConfigDict is
locked: overriding a key that does not exist (a typo) is an error before anything runs.

Fields:
  data.*    passed to ``linear_attention.data.make_dataset`` (task-specific fields).
  model.*   mixer or pattern (names from ``linear_attention.nn.MIXERS`` / ``PATTERN_LETTERS``),
            d_model, num_layers, num_heads, mlp_ratio, tie_embeddings, mixer_kwargs
            ({mixer name: {kwarg: value}}, see below), pooling (classifiers), dtype (compute
            dtype: "bfloat16" is mixed precision, see the README), param_dtype ("float32";
            "bfloat16" for inference only), short_conv (width of a causal convolution before every mixer; 0 = none),
            remat ("none", "block", "mixer_only" or a jax.checkpoint_policies name: what
            the backward pass recomputes instead of keeping), scan_layers (run the blocks as
            a lax.scan over the pattern's repeating unit: compile time flat in depth, and
            what makes remat save memory; see linear_attention.models.stack).
  model.mixer_kwargs.<mixer>.<option>
            every registry mixer's own options with their defaults (the layer's keyword
            arguments, ``linear_attention.nn.mixer_kwargs(name)``; ``dtype`` and
            ``param_dtype`` come from ``model.dtype``), so one option is set from the
            command line: ``--config.model.mixer_kwargs.gla.chunk_size=128``, a tuple as
            ``--config.model.mixer_kwargs.mamba2.a_init_range='(0.03,0.5)'``. An option
            whose default is None (computed by the layer) takes a value of its type.
            The decay initialisation of the Mamba family is set this way: ``mamba``:
            ``a_init_scale, dt_min, dt_max, dt_init_floor``; ``mamba2``, ``gated_deltanet``,
            ``kda``: ``a_init_range, dt_min, dt_max, dt_init_floor``; ``hawk``:
            ``min_rad, max_rad, c``; ``gla``: ``gate_logit_normalizer``.
  optim.*   lr (peak), warmup_steps, schedule (cosine, linear or constant after the
            warmup), final_lr_ratio (cosine/linear end / peak), weight_decay,
            b1, b2, eps, clip_norm (global norm; <= 0 disables).
  train.*   steps, eval_every, eval_batches (0: the dataset's default), log_every, seed
            (parameter init), checkpoint_every, keep_checkpoints, async_checkpoints,
            early_stop_metric ("" off, "accuracy" or "loss") and early_stop_value (stop at
            the first evaluation with accuracy >= / loss <= it), steps_per_dispatch (training
            steps fused into one jitted call, a ``lax.scan``; reduced to its gcd with the
            logging, evaluation and checkpoint intervals; 1 = one call per step),
            accum_steps (each batch's gradient summed over that many micro-batches inside
            the step, a lax.scan: the same update with 1/accum_steps of the activations;
            data.batch_size must be divisible by accum_steps times the data devices).
  init_from a transformers checkpoint directory (``""``: none): the model is built from its
            ``config.json`` and weights (``linear_attention.hub``) instead of ``model.*``,
            and the text data uses its ``tokenizer.json``; see ``configs/finetune.py``.
  save_hf   where a run from ``init_from`` writes the trained model as a transformers
            checkpoint (``""``: ``<workdir>/hf``).
  mesh.*    data (devices on the data axis, -1 = all left by seq), fsdp (shard params and
            optimizer state over that axis instead of replicating them), seq (devices the
            sequence is split over, context parallelism; 1 = off; it must divide
            data.seq_len and every mixer must support it, see nn.context_parallel).
"""

from __future__ import annotations

from typing import Any, Mapping

import ml_collections

_BOOL = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def parse_arg(arg: str | None, defaults: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """Parses ``"k1=v1,k2=v2"`` against ``defaults`` (which fixes the valid keys and types).

  Returns:
    A ConfigDict with every key of ``defaults``, overridden by ``arg``.

  Raises:
    ValueError: an item without ``=``, an unknown key (listing the valid ones) or a value
      that does not parse as the default's type.
  """
  out = dict(defaults)
  for item in (arg or "").split(","):
    item = item.strip()
    if not item:
      continue
    if "=" not in item:
      raise ValueError(f"config argument item {item!r} must be key=value; valid keys: "
                       f"{sorted(defaults)}.")
    key, value = (s.strip() for s in item.split("=", 1))
    if key not in defaults:
      raise ValueError(f"unknown config argument {key!r}; valid keys: {sorted(defaults)}.")
    default = defaults[key]
    try:
      if isinstance(default, bool):
        if value.lower() not in _BOOL:
          raise ValueError
        out[key] = _BOOL[value.lower()]
      elif isinstance(default, int):
        out[key] = int(value)
      elif isinstance(default, float):
        out[key] = float(value)
      else:
        out[key] = value
    except ValueError:
      raise ValueError(f"config argument {key}={value!r} must be a "
                       f"{type(default).__name__}.") from None
  return ml_collections.ConfigDict(out)


def check_choice(name: str, value: str, choices) -> None:
  """ValueError naming ``name`` unless ``value`` is in ``choices``."""
  if value not in choices:
    raise ValueError(f"config argument {name}={value!r} is not valid; choose one of "
                     f"{list(choices)}.")


# Set by model.dtype, not per mixer.
_MODEL_LEVEL_KWARGS = ("dtype", "param_dtype")
_NONE_TYPES = {"int": int, "float": float, "str": str, "bool": bool,
               "tuple[float, float]": tuple}


def mixer_kwargs_config() -> ml_collections.ConfigDict:
  """``{mixer: {option: default}}`` for every registry mixer, so that dotted overrides
  (``--config.model.mixer_kwargs.gla.chunk_size=128``) find their field.

  The defaults are the layer's (its signature, then the registry's ``defaults``), so a config
  that overrides nothing builds the same layers as passing no kwargs. An option whose default
  is ``None`` becomes a typed placeholder (its annotation's type: ``int | None`` -> int), which
  stays None unless overridden; one without a plain type is left out.
  """
  import inspect

  from linear_attention.nn import registry

  out = ml_collections.ConfigDict()
  for name in registry.MIXERS:
    s = registry.spec(name)
    params = inspect.signature(s.cls.__init__).parameters
    fields = {}
    for k in registry.mixer_kwargs(name):
      if k in _MODEL_LEVEL_KWARGS:
        continue
      default = s.defaults.get(k, params[k].default)
      if default is None:
        kind = _NONE_TYPES.get(str(params[k].annotation).split("|")[0].strip())
        if kind is not None:
          fields[k] = ml_collections.config_dict.placeholder(kind)
      elif isinstance(default, (bool, int, float, str, tuple)):
        fields[k] = default
    out[name] = ml_collections.ConfigDict(fields)
  return out


def base_config(task: str) -> ml_collections.ConfigDict:
  """Every field with its shared default; ``data`` starts from the task's defaults."""
  from linear_attention import data

  c = ml_collections.ConfigDict()
  c.data = data.default_data_config(task)
  c.model = ml_collections.ConfigDict(dict(
      mixer="gla", pattern="", d_model=128, num_layers=2, num_heads=4, mlp_ratio=8 / 3,
      tie_embeddings=True, mixer_kwargs=mixer_kwargs_config(), pooling="mean",
      dtype="float32", short_conv=0, remat="none", scan_layers=False,
      param_dtype="float32"))
  c.optim = ml_collections.ConfigDict(dict(
      lr=1e-3, warmup_steps=100, final_lr_ratio=0.1, weight_decay=0.1, b1=0.9, b2=0.95,
      eps=1e-8, clip_norm=1.0, schedule="cosine"))
  c.train = ml_collections.ConfigDict(dict(
      steps=1000, eval_every=250, eval_batches=0, log_every=50, seed=0,
      checkpoint_every=250, keep_checkpoints=2, async_checkpoints=True,
      early_stop_metric="", early_stop_value=0.0, steps_per_dispatch=10,
      accum_steps=1))
  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=False, seq=1))
  c.init_from = ""
  c.save_hf = ""
  return c


def apply_size(c: ml_collections.ConfigDict, s: Mapping[str, Any]) -> None:
  """Copies a size preset (``d_model, num_layers, num_heads, lr, warmup_steps, steps,
  eval_every, eval_batches, log_every``) into ``c``; checkpoints about every quarter of the
  run, at a step that is logged (a multiple of ``log_every``), so that the checkpoint folders
  carry the steps the progress lines and metrics show."""
  c.model.d_model, c.model.num_layers, c.model.num_heads = s["d_model"], s["num_layers"], s["num_heads"]
  c.optim.lr, c.optim.warmup_steps = s["lr"], s["warmup_steps"]
  c.train.steps, c.train.eval_every, c.train.eval_batches = s["steps"], s["eval_every"], s["eval_batches"]
  c.train.log_every = s["log_every"]
  log = max(int(s["log_every"]), 1)
  c.train.checkpoint_every = max(round(s["steps"] / 4 / log) * log, log)


def apply_model_args(c: ml_collections.ConfigDict, args: ml_collections.ConfigDict) -> None:
  """Sets ``model.mixer``/``model.pattern`` from the parsed argument, validating the names."""
  from linear_attention import models

  c.model.mixer = args.mixer
  c.model.pattern = args.get("pattern", "")
  # Fail at config time (unknown mixer -> list of valid ones), not after the data is built.
  models.resolve_pattern(max(c.model.num_layers, 1), None if c.model.pattern else c.model.mixer,
                         c.model.pattern or None)


def finalize(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Locks ``c`` so that overriding an unknown key raises."""
  c.lock()
  return c
