"""The points of a sweep: building override lists, naming their directories, loading a config's ``get_sweep``."""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import itertools
import json
import os
import re
import sys
from typing import Any, Iterable, Mapping, Sequence




STATUS_FILE = "sweep_status.json"


def product(*axes: Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Any]], **kw) -> list[dict]:
  """The Cartesian product of override lists; the last axis varies fastest.

  ``product({"model.mixer": ["gla", "softmax"]}, {"optim.lr": [1e-3, 3e-3]})`` gives four
  points. Each positional axis is a list of override dicts or a one-key dict
  ``{key: [values]}``; keyword axes name the key with ``__`` for ``.``
  (``product(model__mixer=["gla", "softmax"])``).

  Returns:
    A list of merged override dicts.

  Raises:
    ValueError: a malformed axis, or one key set to two values in one point.
  """
  return [_merged(combo) for combo in itertools.product(*_axes(axes, kw))]


def zip_(*axes: Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Any]], **kw) -> list[dict]:
  """Element-wise merge of override lists of equal length (axes as in :func:`product`).

  ``zip_({"model.mixer": ["gla", "softmax"]}, {"optim.lr": [1e-3, 3e-4]})`` gives two points.

  Raises:
    ValueError: the lists differ in length, or a malformed axis.
  """
  lists = _axes(axes, kw)
  lengths = [len(x) for x in lists]
  if len(set(lengths)) > 1:
    raise ValueError(f"zip_ needs lists of equal length, got lengths {lengths}.")
  return [_merged(combo) for combo in zip(*lists)]


def _axes(axes, kw) -> list[list[dict]]:
  return ([_normalise(a) for a in axes]
          + [[{k.replace("__", "."): v} for v in vals] for k, vals in kw.items()])


def _normalise(axis) -> list[dict]:
  """A list of override dicts from a list of dicts or a one-key ``{key: [values]}``."""
  if isinstance(axis, Mapping):
    if len(axis) != 1:
      raise ValueError(f"a dict axis must have exactly one key mapping to a list of values, "
                       f"got keys {list(axis)}; use zip_ or a list of dicts for several keys.")
    (k, v), = axis.items()
    if isinstance(v, (str, bytes)) or not isinstance(v, Iterable):
      raise ValueError(f"the values of sweep key {k!r} must be a list, got {v!r}.")
    return [{k: x} for x in v]
  axis = list(axis)
  for d in axis:
    if not isinstance(d, Mapping):
      raise ValueError(f"a sweep axis must be a list of dicts, got an element {d!r}.")
  return [dict(d) for d in axis]


def _merged(dicts: Iterable[Mapping[str, Any]]) -> dict:
  out: dict = {}
  for d in dicts:
    for k, v in d.items():
      if k in out and out[k] != v:
        raise ValueError(f"sweep key {k!r} is set twice in one point ({out[k]!r} and {v!r}).")
      out[k] = v
  return out


def load_sweep(config_arg: str) -> list[dict]:
  """The override dicts of ``get_sweep`` in the config file of ``config_arg`` (``path[:arg]``).

  Raises:
    ValueError: no such file, no ``get_sweep``, or a malformed result.
  """
  path, _, arg = config_arg.partition(":")
  if not os.path.isfile(path):
    raise ValueError(f"config file {path!r} not found.")
  root = os.path.dirname(os.path.dirname(os.path.abspath(path)))
  if root not in sys.path:
    sys.path.insert(0, root)
  spec = importlib.util.spec_from_file_location("_sweep_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  fn = getattr(module, "get_sweep", None)
  if fn is None:
    raise ValueError(f"config file {path!r} defines no get_sweep().")
  points = fn(arg or None) if inspect.signature(fn).parameters else fn()
  if not isinstance(points, Sequence) or not all(isinstance(p, Mapping) for p in points):
    raise ValueError(f"get_sweep() in {path!r} must return a list of dicts, got {points!r}.")
  out = []
  for p in points:
    out.append({(k[len("config."):] if k.startswith("config.") else k): v for k, v in p.items()})
  return out


def flag_value(v: Any) -> str:
  """A value as ``ml_collections.config_flags`` parses it back."""
  if isinstance(v, bool):
    return "True" if v else "False"
  if isinstance(v, float):
    return repr(v)
  if isinstance(v, (list, tuple)):
    return "(" + ",".join(flag_value(x) for x in v) + ("," if len(v) == 1 else "") + ")"
  return str(v)


def point_name(index: int, overrides: Mapping[str, Any]) -> str:
  """``"003-mixer=gla,lr=0.001"``: the index plus short key=value pairs, filesystem-safe.

  The pairs are cut at 80 characters, so two points may share the ``<overrides>`` part;
  :func:`point_dirs` tells them apart by the overrides their status files record.
  """
  parts = [f"{k.split('.')[-1]}={flag_value(v)}" for k, v in overrides.items()]
  name = re.sub(r"[^A-Za-z0-9_.,=+-]", "_", ",".join(parts))[:80]
  return f"{index:03d}-{name}" if name else f"{index:03d}"


_DIR_NAME = re.compile(r"(\d{3,})(?:-(.*))?")  # NNN[-<overrides>]


def _same_overrides(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
  """Equal as the trainer sees them (a JSON round trip turns tuples into lists)."""
  return ({k: flag_value(v) for k, v in a.items()}
          == {k: flag_value(v) for k, v in b.items()})


def point_dirs(workdir: str, points: Sequence[Mapping[str, Any]]) -> list[str]:
  """The directory name (under ``workdir``) of each point, reusing runs by their overrides.

  For each point, in order of preference: a finished run of its overrides (its own
  :func:`point_name` first, then any index); its own name if that holds an unfinished run of
  it; another index's unfinished run of it (resumed there); its own name if free. A run is
  a point's when its ``sweep_status.json`` records the same overrides or, without a status
  file, when its ``<overrides>`` name part equals the point's and was not cut short. Two
  points never share a directory; should a point's own name hold another point's run, the
  point gets the name plus a digest of its overrides.

  Args:
    workdir: the sweep directory (need not exist).
    points: override dicts, in sweep order.

  Returns:
    One name per point (``"003-mixer=gla"``), relative to ``workdir``.
  """
  runs: dict[str, dict | None] = {}
  if os.path.isdir(workdir):
    for name in sorted(os.listdir(workdir)):
      if _DIR_NAME.fullmatch(name) and os.path.isdir(os.path.join(workdir, name)):
        runs[name] = _read_json(os.path.join(workdir, name, STATUS_FILE))
  taken: set[str] = set()
  out = []
  for i, p in enumerate(points):
    own = point_name(i, p)
    suffix = own.partition("-")[2]

    def is_mine(name, p=p, own=own, suffix=suffix):
      rec = runs[name]
      if isinstance(rec, dict) and isinstance(rec.get("overrides"), dict):
        return _same_overrides(rec["overrides"], p)
      if name == own:
        return True
      # No record: only an uncut <overrides> part identifies the run.
      part = _DIR_NAME.fullmatch(name).group(2) or ""
      return part == suffix and 0 < len(suffix) < 80

    mine = [n for n in runs if n not in taken and is_mine(n)]
    done = [n for n in mine if (runs[n] or {}).get("status") == "done"]
    if done:
      pick = own if own in done else done[0]
    elif mine:
      pick = own if own in mine else mine[0]
    elif own in runs or own in taken:  # another point's run under this point's name
      digest = hashlib.sha1(json.dumps(sorted((k, flag_value(v)) for k, v in p.items()))
                            .encode()).hexdigest()[:8]
      pick = f"{own}-{digest}"
    else:
      pick = own
    taken.add(pick)
    out.append(pick)
  return out


def _read_json(path: str) -> Any:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, json.JSONDecodeError):
    return None
