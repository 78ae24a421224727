"""The family registry and the loader/saver every family shares (see the package docstring)."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx

from linear_attention.hub import checkpoint

Path = tuple[Any, ...]


# ----------------------------------------------------------------------------- weight maps


@dataclasses.dataclass(frozen=True)
class Tensor:
  """One model parameter and the checkpoint tensor(s) it is made of.

  Attributes:
    path: the parameter's path in ``nnx.state(model)``, e.g.
      ``("backbone", "blocks", 0, "mixer", "in_proj", "kernel")``.
    names: the checkpoint tensor names it is read from (usually one).
    load: checkpoint arrays (in ``names`` order) -> the parameter's value (NumPy).
    save: the parameter's value (NumPy) -> the checkpoint arrays, in ``names`` order.
  """
  path: Path
  names: tuple[str, ...]
  load: Callable[[list[np.ndarray]], np.ndarray]
  save: Callable[[np.ndarray], list[np.ndarray]]


@dataclasses.dataclass(frozen=True)
class Alias:
  """A checkpoint tensor that repeats another (a tied ``lm_head.weight``): optional; when
  present it must equal ``of`` and is then counted as used. Never written."""
  name: str
  of: str


def same(name: str, path: Path) -> Tensor:
  """A tensor stored as the parameter is (norm weights, ``A_log``, biases, embeddings)."""
  return Tensor(tuple(path), (name,), lambda a: a[0], lambda v: [v])


def reshaped(name: str, path: Path, shape: tuple[int, ...]) -> Tensor:
  """A tensor stored flat whose parameter has ``shape`` (the per-group norm weights)."""
  return Tensor(tuple(path), (name,), lambda a: a[0].reshape(shape), lambda v: [v.reshape(-1)])


def linear(name: str, path: Path) -> Tensor:
  """A torch ``nn.Linear`` weight ``[out, in]`` onto an ``nnx.Linear`` kernel ``[in, out]``."""
  return Tensor(tuple(path), (name,), lambda a: a[0].T, lambda v: [v.T])


def linears(names: Sequence[str], path: Path) -> Tensor:
  """Several torch ``nn.Linear`` weights ``[out_i, in]`` onto one kernel ``[in, sum out_i]``
  (their outputs side by side, in ``names`` order; e.g. a SwiGLU's gate and up)."""
  names = tuple(names)

  def save(v):
    return [p.T for p in np.split(v, np.cumsum(sizes(v))[:-1], axis=1)]

  def sizes(v):  # equal parts: the layers that fuse projections fuse equal widths
    return [v.shape[1] // len(names)] * len(names)

  return Tensor(tuple(path), names, lambda a: np.concatenate([x.T for x in a], axis=1), save)


def conv1d(name: str, path: Path) -> Tensor:
  """A depthwise torch ``Conv1d`` weight ``[C, 1, W]`` onto ``ShortConv.weight [W, C]``."""
  return Tensor(tuple(path), (name,), lambda a: a[0][:, 0, :].T, lambda v: [v.T[:, None, :]])


# ----------------------------------------------------------------------------- families


@dataclasses.dataclass(frozen=True)
class Family:
  """How one transformers ``model_type`` maps onto this project's models.

  Attributes:
    model_type: ``config.json``'s ``model_type`` (e.g. ``"mamba2"``).
    architecture: the transformers class written to ``config.json``'s ``architectures``
      (e.g. ``"Mamba2ForCausalLM"``).
    build: ``build(config, *, rngs, dtype, param_dtype) -> nnx.Module``: the model of a
      parsed ``config.json``; raises ``ValueError`` naming a config key it does not support.
    tensors: ``tensors(config) -> list[Tensor | Alias]``: every parameter of that model with
      its checkpoint tensor names.
  """
  model_type: str
  architecture: str
  build: Callable[..., nnx.Module]
  tensors: Callable[[Mapping[str, Any]], list]


FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
  """Adds ``family`` to :data:`FAMILIES` (one per ``model_type``); returns it."""
  if family.model_type in FAMILIES:
    raise ValueError(f"model_type {family.model_type!r} is registered twice.")
  FAMILIES[family.model_type] = family
  return family


def family_of(config: Mapping[str, Any]) -> Family:
  """The :class:`Family` of a parsed ``config.json``.

  Raises:
    ValueError: no ``model_type``, or one no family handles (listing those that are).
  """
  from linear_attention.hub import families  # noqa: F401  (registers every family)
  model_type = config.get("model_type")
  if model_type not in FAMILIES:
    raise ValueError(f"config.json model_type {model_type!r} is not supported; supported: "
                     f"{sorted(FAMILIES)}.")
  return FAMILIES[model_type]


# ----------------------------------------------------------------------------- load


def _dtype(dtype, name: str = "dtype"):
  if dtype is None:
    return None
  try:
    d = np.dtype(jnp.dtype(dtype))
  except TypeError:
    d = None
  if d not in checkpoint.DTYPE_NAMES:
    raise ValueError(f"{name} must be None or one of {sorted(checkpoint.DTYPE_NAMES.values())}, "
                     f"got {dtype!r}.")
  return d


def _variables(model: nnx.Module) -> dict[Path, nnx.Variable]:
  return {tuple(p): v for p, v in nnx.to_flat_state(nnx.state(model))}


def _format_list(items, limit: int = 20) -> str:
  items = sorted(items, key=str)
  more = f" ... and {len(items) - limit} more" if len(items) > limit else ""
  return ", ".join(map(str, items[:limit])) + more


def check_coverage(entries: Sequence, variables: Mapping[Path, Any],
                   names: set[str] | None) -> None:
  """Raises one ``ValueError`` naming every parameter no entry sets, every entry path that
  is not a parameter, every tensor the checkpoint lacks and every checkpoint tensor left
  unused (``names``: the checkpoint's tensors; ``None`` skips the checkpoint checks)."""
  tensors = [e for e in entries if isinstance(e, Tensor)]
  paths = [t.path for t in tensors]
  problems = []
  dup = {p for p in paths if paths.count(p) > 1}
  if dup:
    problems.append(f"parameters set twice by the weight map: {_format_list(dup)}")
  unset = set(variables) - set(paths)
  if unset:
    problems.append(f"model parameters no checkpoint tensor sets: "
                    f"{_format_list('/'.join(map(str, p)) for p in unset)}")
  unknown = set(paths) - set(variables)
  if unknown:
    problems.append(f"weight-map paths that are not model parameters: "
                    f"{_format_list('/'.join(map(str, p)) for p in unknown)}")
  if names is not None:
    wanted = {n for t in tensors for n in t.names}
    missing = wanted - names
    if missing:
      problems.append(f"tensors missing from the checkpoint: {_format_list(missing)}")
    aliases = {a.name for a in entries if isinstance(a, Alias)}
    extra = names - wanted - aliases
    if extra:
      problems.append(f"checkpoint tensors this model does not use: {_format_list(extra)}")
  if problems:
    raise ValueError("checkpoint and model do not match:\n  " + "\n  ".join(problems))


def from_pretrained(path, *, dtype=None) -> nnx.Module:
  """Loads a local transformers checkpoint directory as a Flax NNX language model.

  Args:
    path: a directory with ``config.json`` and ``model.safetensors`` (or shards with
      ``model.safetensors.index.json``), as transformers' ``save_pretrained`` writes it.
    dtype: parameter and compute dtype (``"float32"``, ``"bfloat16"``, ``"float16"``);
      ``None``: the checkpoint's own (its first floating tensor's).

  Returns:
    The model: ``model(tokens [B, T]) -> logits [B, T, vocab]``, ``init_cache`` /
    ``decode_step`` for :func:`linear_attention.models.generate`; it remembers its config
    for :func:`save_pretrained`.

  Raises:
    ValueError: a hub name or a missing path (saying how to download it), an unsupported
      ``model_type`` or config value, or a checkpoint whose tensors do not match the model:
      every missing, unused or wrongly shaped tensor and every unset parameter, by name.
  """
  directory = checkpoint.check_directory(path)
  config = checkpoint.read_config(directory)
  family = family_of(config)
  files = checkpoint.tensor_files(directory)
  dtype = _dtype(dtype)
  with checkpoint.Reader(files) as reader:
    if dtype is None:
      codes = {reader.dtype(n) for n in files}
      float_codes = [c for c in ("F32", "BF16", "F16") if c in codes]
      dtype = checkpoint.DTYPES[float_codes[0]] if float_codes else np.dtype(np.float32)
    jdtype = jnp.dtype(dtype)
    # Built abstractly (shapes only): no random initialisation, no second copy in memory.
    model = nnx.eval_shape(lambda: family.build(config, rngs=nnx.Rngs(0), dtype=jdtype,
                                                param_dtype=jdtype))
    entries = family.tensors(config)
    variables = _variables(model)
    check_coverage(entries, variables, set(files))
    bad_shapes = []
    for e in entries:
      if isinstance(e, Alias):
        if e.name in files and not np.array_equal(reader.get(e.name), reader.get(e.of)):
          bad_shapes.append(f"{e.name} (must equal {e.of}: the config ties them)")
        continue
      var = variables[e.path]
      value = np.asarray(e.load([reader.get(n) for n in e.names]))
      if tuple(value.shape) != tuple(var.shape):
        bad_shapes.append(f"{' + '.join(e.names)}: checkpoint gives {tuple(value.shape)}, "
                          f"the parameter {'/'.join(map(str, e.path))} is {tuple(var.shape)}")
        continue
      var.set_value(jnp.asarray(value, dtype=jdtype))
      del value
    if bad_shapes:
      raise ValueError("checkpoint tensors with the wrong shape or value:\n  "
                       + "\n  ".join(bad_shapes))
  model.hub_config = json.dumps(config, sort_keys=True)
  return model


# ----------------------------------------------------------------------------- save


def save_pretrained(model: nnx.Module, path, *, config: Mapping[str, Any] | None = None,
                    dtype=None, max_shard_size: int = 5 * 2**30) -> None:
  """Writes ``model`` as a transformers checkpoint directory (``config.json`` + safetensors).

  Args:
    model: a model from :func:`from_pretrained` (or one built by a family, with ``config``).
    path: the output directory (created; files of the same names are replaced).
    config: the transformers config (a dict with ``model_type``); default: the model's own.
    dtype: the stored dtype; ``None``: the parameters' (float32, bfloat16 or float16).
    max_shard_size: bytes per safetensors file; larger checkpoints are sharded with an index.

  Raises:
    ValueError: no config, an unsupported ``model_type``, or a model whose parameters the
      family's weight map does not cover exactly.
  """
  if config is None:
    config = getattr(model, "hub_config", None)
    if config is None:
      raise ValueError("config is required for a model not loaded by from_pretrained "
                       "(a transformers config dict with 'model_type').")
    config = json.loads(config)
  config = dict(config)
  family = family_of(config)
  dtype = _dtype(dtype)
  if isinstance(max_shard_size, bool) or not isinstance(max_shard_size, int) or max_shard_size < 1:
    raise ValueError(f"max_shard_size must be an int >= 1 (bytes), got {max_shard_size!r}.")
  entries = family.tensors(config)
  variables = _variables(model)
  check_coverage(entries, variables, None)
  tensors = [e for e in entries if isinstance(e, Tensor)]
  stored = {}
  for t in tensors:
    v = variables[t.path]
    d = dtype or np.dtype(v.dtype)
    if d not in checkpoint.DTYPE_NAMES:
      raise ValueError(f"parameter {'/'.join(map(str, t.path))} has dtype {v.dtype}; pass "
                       f"dtype= one of {sorted(checkpoint.DTYPE_NAMES.values())}.")
    stored[t.path] = d
  sizes = {}
  for t in tensors:
    n = int(np.prod(variables[t.path].shape)) * stored[t.path].itemsize
    for name in t.names:
      sizes[name] = n // len(t.names)

  def arrays():
    for t in tensors:
      value = np.asarray(jax.device_get(variables[t.path][...])).astype(stored[t.path])
      for name, a in zip(t.names, t.save(value)):
        yield name, a

  directory = pathlib.Path(os.fspath(path)).expanduser()
  directory.mkdir(parents=True, exist_ok=True)
  for stale in (checkpoint.SINGLE, checkpoint.INDEX):
    (directory / stale).unlink(missing_ok=True)
  checkpoint.write(directory, arrays(), sizes, max_shard_size)
  config["architectures"] = [family.architecture]
  names = {checkpoint.DTYPE_NAMES[d] for d in stored.values()}
  config["dtype"] = names.pop() if len(names) == 1 else "float32"
  config.pop("torch_dtype", None)
  with open(directory / checkpoint.CONFIG, "w") as f:
    json.dump(config, f, indent=2, sort_keys=True)
