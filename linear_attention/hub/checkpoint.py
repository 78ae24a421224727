"""Reading and writing transformers' checkpoint layout: ``config.json`` plus safetensors.

A directory holds ``model.safetensors``, or shards named in ``model.safetensors.index.json``
(``{"weight_map": {tensor name: shard file}}``). Tensors are read one at a time (see
:class:`Reader`), so reading never holds more than the tensor being placed besides the model
itself. NumPy arrays throughout (bfloat16 through ``ml_dtypes``), so no torch is needed.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
from typing import Iterator, Mapping

import ml_dtypes
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
CONFIG = "config.json"
# safetensors dtype codes of the floating dtypes a checkpoint may hold.
DTYPES = {"F32": np.dtype(np.float32), "BF16": np.dtype(ml_dtypes.bfloat16),
          "F16": np.dtype(np.float16)}
DTYPE_NAMES = {np.dtype(np.float32): "float32", np.dtype(ml_dtypes.bfloat16): "bfloat16",
               np.dtype(np.float16): "float16"}
READ_DTYPES = {**DTYPES, "F64": np.dtype(np.float64), "I64": np.dtype(np.int64),
               "I32": np.dtype(np.int32), "I16": np.dtype(np.int16), "I8": np.dtype(np.int8),
               "U8": np.dtype(np.uint8), "BOOL": np.dtype(bool)}
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def check_directory(path) -> pathlib.Path:
  """``path`` as a directory holding ``config.json``.

  Raises:
    ValueError: a path that does not exist (for a hub name such as ``"org/model"``, the
      message says how to download it first: nothing here uses the network), or a
      directory without ``config.json``.
  """
  p = pathlib.Path(os.fspath(path)).expanduser()
  if not p.is_dir():
    if isinstance(path, str) and _HUB_NAME.match(path) and not p.exists():
      raise ValueError(
          f"path {path!r} is not a local directory. linear_attention.hub reads local "
          f"checkpoints only (no network); on a connected machine download it first:\n"
          f"  huggingface-cli download {path} --local-dir DIR\n"
          f"(or `hf download {path} --local-dir DIR`), then pass DIR.")
    raise ValueError(f"path must be a checkpoint directory (config.json and safetensors), got "
                     f"{str(p)!r}, which {'is not a directory' if p.exists() else 'does not exist'}.")
  if not (p / CONFIG).is_file():
    raise ValueError(f"path {str(p)!r} has no {CONFIG}: not a transformers checkpoint directory.")
  return p


def read_config(directory: pathlib.Path) -> dict:
  """The parsed ``config.json``."""
  with open(directory / CONFIG) as f:
    return json.load(f)


def tensor_files(directory: pathlib.Path) -> dict[str, pathlib.Path]:
  """Tensor name -> the safetensors file holding it.

  Raises:
    ValueError: no ``model.safetensors`` and no index, or an index naming a missing shard.
  """
  index = directory / INDEX
  if index.is_file():
    with open(index) as f:
      weight_map = json.load(f).get("weight_map")
    if not isinstance(weight_map, dict):
      raise ValueError(f"{index} has no 'weight_map' object.")
    files = {n: directory / fn for n, fn in weight_map.items()}
    missing = sorted({str(p.name) for p in files.values() if not p.is_file()})
    if missing:
      raise ValueError(f"{index} names shard file(s) {missing} that are not in {directory}.")
    return files
  single = directory / SINGLE
  if single.is_file():
    with safe_open(single, framework="numpy") as f:
      return {n: single for n in f.keys()}
  bin_files = sorted(p.name for p in directory.glob("*.bin"))
  raise ValueError(f"{directory} has neither {SINGLE} nor {INDEX}"
                   + (f" (only PyTorch pickles {bin_files}: convert them to safetensors first)"
                      if bin_files else "") + ".")


class Reader:
  """Reads tensors by name from safetensors files, one at a time; a context manager.

  ``shape(name)`` and ``dtype(name)`` read the file's header only. ``get(name)`` reads that
  tensor's bytes straight into a fresh array (``numpy.fromfile`` at its offset): no mapping
  of the file stays resident, so loading holds the model plus the tensor being placed, even
  with shards of several GB (a memory map would keep every page read counted in RSS until
  the file is closed).
  """

  def __init__(self, files: Mapping[str, pathlib.Path]):
    self.files = dict(files)
    self._headers: dict[pathlib.Path, tuple[int, dict]] = {}

  def __enter__(self) -> "Reader":
    return self

  def __exit__(self, *exc) -> None:
    self._headers.clear()

  def _entry(self, name: str) -> tuple[pathlib.Path, int, dict]:
    path = self.files[name]
    if path not in self._headers:
      with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        self._headers[path] = (8 + n, json.loads(f.read(n)))
    start, header = self._headers[path]
    if name not in header:
      raise ValueError(f"{path.name} does not hold tensor {name!r} (its index says it does).")
    return path, start, header[name]

  def shape(self, name: str) -> tuple[int, ...]:
    return tuple(self._entry(name)[2]["shape"])

  def dtype(self, name: str) -> str:
    """The safetensors dtype code (``"F32"``, ``"BF16"``, ...)."""
    return self._entry(name)[2]["dtype"]

  def get(self, name: str) -> np.ndarray:
    path, start, entry = self._entry(name)
    code = entry["dtype"]
    if code not in READ_DTYPES:
      raise ValueError(f"tensor {name!r} has dtype {code}; readable: {sorted(READ_DTYPES)}.")
    dtype = READ_DTYPES[code]
    begin, end = entry["data_offsets"]
    count = (end - begin) // dtype.itemsize
    array = np.fromfile(path, dtype=dtype.newbyteorder("<"), count=count, offset=start + begin)
    return array.reshape(entry["shape"])


def write(directory: pathlib.Path, tensors: Iterator[tuple[str, np.ndarray]], sizes: Mapping[str, int],
          max_shard_bytes: int) -> None:
  """Writes ``tensors`` (name, array), in order, as one file or as shards plus an index.

  ``sizes`` (name -> bytes) plans the shards before any array is made, so only one shard's
  arrays are held at a time.
  """
  shards: list[list[str]] = [[]]
  used = 0
  for name, n in sizes.items():
    if shards[-1] and used + n > max_shard_bytes:
      shards.append([])
      used = 0
    shards[-1].append(name)
    used += n
  names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
  if len(shards) == 1:
    names = [SINGLE]
  shard_of = {n: i for i, shard in enumerate(shards) for n in shard}
  pending: dict[str, np.ndarray] = {}
  current = 0
  for name, array in tensors:
    i = shard_of[name]
    if i != current:
      save_file(pending, str(directory / names[current]), metadata={"format": "pt"})
      pending, current = {}, i
    pending[name] = np.ascontiguousarray(array)
  save_file(pending, str(directory / names[current]), metadata={"format": "pt"})
  if len(shards) > 1:
    index = {"metadata": {"total_size": int(sum(sizes.values()))},
             "weight_map": {n: names[shard_of[n]] for n in sizes}}
    with open(directory / INDEX, "w") as f:
      json.dump(index, f, indent=2, sort_keys=True)
