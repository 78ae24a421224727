"""The one writer of results and metrics JSON files, for the package and ``experiments/``.

Every results file (benchmarks, studies, sweep summaries, ``final_metrics.json``,
``config.json``) goes through :func:`write_json`, so they share one convention:

- the write is atomic: the text goes to a temporary file in the same folder, which then
  replaces ``path``. A reader (a notebook, ``sweep --collect``, another host) sees the old
  file or the new one, never half of one, and concurrent writers of one path do not
  collide;
- JSON has no NaN or infinity, so non-finite floats are written as ``null`` (a reader
  gets ``None``: "no value"), never as the non-standard ``NaN`` token or a string;
- NumPy and JAX scalars and arrays become Python numbers and lists; tuples become lists;
  any other object is written as its ``str``.

This module imports nothing beyond the standard library, so the GPU check scripts (whose
machine lacks ml-collections) can use it too.
"""

from __future__ import annotations

import json
import math
import os
import uuid
from typing import Any


def to_jsonable(obj: Any) -> Any:
  """``obj`` with the conventions above applied, recursively (dict keys become strings)."""
  if isinstance(obj, float):
    return obj if math.isfinite(obj) else None
  if isinstance(obj, (str, int, bool)) or obj is None:
    return obj
  if isinstance(obj, dict):
    return {str(k): to_jsonable(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [to_jsonable(v) for v in obj]
  if hasattr(obj, "tolist") and hasattr(obj, "dtype"):  # NumPy / JAX scalars and arrays
    return to_jsonable(obj.tolist())
  return str(obj)


def write_json(path: str, obj: Any, indent: int = 1) -> str:
  """Writes ``obj`` as JSON to ``path`` atomically, creating its folder.

  Args:
    path: the file to (over)write.
    obj: dicts, lists, numbers, strings; see the module docstring for the rest.
    indent: JSON indentation.

  Returns:
    ``path``.
  """
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  text = json.dumps(to_jsonable(obj), indent=indent, allow_nan=False) + "\n"
  # A unique temporary name: two processes writing one file (array tasks of a sweep)
  # must not rename each other's half-written file.
  tmp = f"{path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
  try:
    with open(tmp, "w") as f:
      f.write(text)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
  return path
