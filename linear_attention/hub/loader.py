"""``from_pretrained`` and ``save_pretrained``: any registered family, one tensor at a time."""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from linear_attention.hub import checkpoint
from linear_attention.hub import families  # noqa: F401  (registers every family)
from linear_attention.hub.core import (FAMILIES, Alias, Constant, Family, Path, Split, Tensor,
                                       check_coverage)


def family_of(config: Mapping[str, Any]) -> Family:
  """The :class:`Family` of a parsed ``config.json``.

  Raises:
    ValueError: no ``model_type``, or one no family handles (listing those that are).
  """
  model_type = config.get("model_type")
  if model_type not in FAMILIES:
    raise ValueError(f"config.json model_type {model_type!r} is not supported; supported: "
                     f"{sorted(FAMILIES)}.")
  return FAMILIES[model_type]


def supported() -> tuple[str, ...]:
  """The ``model_type`` values :func:`from_pretrained` loads, sorted."""
  return tuple(sorted(FAMILIES))


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
      fixed = {e.name for e in family.tensors(config) if isinstance(e, Constant)}
      codes = {reader.dtype(n) for n in files if n not in fixed}
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
      if isinstance(e, Constant):
        if e.name in files:
          stored_value = reader.get(e.name)
          # A 16-bit checkpoint rounds the buffer to 8 (bfloat16) or 11 (float16) bits.
          rtol = e.rtol if stored_value.dtype.itemsize >= 4 else max(e.rtol, 2.0 ** -8)
          if not np.allclose(stored_value.astype(np.float32), e.value, rtol=rtol, atol=0):
            bad_shapes.append(f"{e.name} (must equal the value its config gives, within "
                              f"rtol={rtol})")
        continue
      if isinstance(e, Split):
        values, paths, names = e.load(reader.get(e.name)), e.paths, (e.name,)
      else:
        values, paths, names = [e.load([reader.get(n) for n in e.names])], (e.path,), e.names
      for p, value in zip(paths, values):
        # Contiguous before the read buffer is dropped: at most two host copies of one tensor.
        var, value = variables[p], np.ascontiguousarray(value)
        if tuple(value.shape) != tuple(var.shape):
          bad_shapes.append(f"{' + '.join(names)}: checkpoint gives {tuple(value.shape)}, "
                            f"the parameter {'/'.join(map(str, p))} is {tuple(var.shape)}")
          continue
        var.set_value(jnp.asarray(value, dtype=jdtype))
      del values
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

  Examples:
    >>> import tempfile
    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> from linear_attention import hub
    >>> config = dict(model_type="mamba", vocab_size=64, hidden_size=16, state_size=4,
    ...               num_hidden_layers=2, intermediate_size=32, time_step_rank=2)
    >>> model = hub.family_of(config).build(config, rngs=nnx.Rngs(0))  # random weights
    >>> with tempfile.TemporaryDirectory() as path:
    ...   hub.save_pretrained(model, path, config=config)  # config.json + model.safetensors
    ...   loaded = hub.from_pretrained(path)
    >>> tokens = jnp.array([[1, 2, 3]])
    >>> bool(jnp.allclose(loaded(tokens), model(tokens)))
    True
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
  tensors = [e for e in entries if isinstance(e, (Tensor, Split))]
  paths_of = lambda t: t.paths if isinstance(t, Split) else (t.path,)
  stored = {}
  for p in (p for t in tensors for p in paths_of(t)):
    v = variables[p]
    d = dtype or np.dtype(v.dtype)
    if d not in checkpoint.DTYPE_NAMES:
      raise ValueError(f"parameter {'/'.join(map(str, p))} has dtype {v.dtype}; pass "
                       f"dtype= one of {sorted(checkpoint.DTYPE_NAMES.values())}.")
    stored[p] = d
  sizes = {}
  for t in tensors:
    n = sum(int(np.prod(variables[p].shape)) * stored[p].itemsize for p in paths_of(t))
    names = (t.name,) if isinstance(t, Split) else t.names
    for name in names:
      sizes[name] = n // len(names)

  def value(p):
    return np.asarray(jax.device_get(variables[p][...])).astype(stored[p])

  constants = [e for e in entries if isinstance(e, Constant)]
  for c in constants:  # after the parameters, in the order arrays() yields them
    sizes[c.name] = c.value.nbytes

  def arrays():
    for t in tensors:
      if isinstance(t, Split):
        yield t.name, t.save([value(p) for p in t.paths])
        continue
      for name, a in zip(t.names, t.save(value(t.path))):
        yield name, a
    for c in constants:  # float32 whatever dtype: a decay near 1 rounds to 1 in bfloat16
      yield c.name, c.value.astype(np.float32)

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
