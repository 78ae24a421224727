"""Helpers for ``get_sweep()``: lists of override dicts ``{"model.mixer": "gla", ...}``."""

from __future__ import annotations

import itertools
from typing import Any, Iterable, Mapping, Sequence


def _axis(key: str, values: Sequence[Any] | Iterable[Mapping[str, Any]]) -> list[dict]:
  return [{key: v} for v in values]


def product(*axes: Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Any]], **kw) -> list[dict]:
  """The Cartesian product of override lists; the last axis varies fastest.

  ``product({"model.mixer": ["gla", "softmax"]}, {"optim.lr": [1e-3, 3e-3]})`` and
  ``product(model__mixer=[...])`` are not the same form: keyword names use ``__`` for ``.``.
  Each positional axis is a list of override dicts or a one-key dict ``{key: [values]}``.

  Returns:
    A list of merged override dicts.
  """
  lists = [_normalise(a) for a in axes] + [_axis(k.replace("__", "."), v) for k, v in kw.items()]
  out = []
  for combo in itertools.product(*lists):
    merged: dict = {}
    for d in combo:
      _merge(merged, d)
    out.append(merged)
  return out


def zip_(*axes: Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Any]], **kw) -> list[dict]:
  """Element-wise merge of override lists of equal length.

  ``zip_({"model.mixer": ["gla", "softmax"]}, {"optim.lr": [1e-3, 3e-4]})`` gives two points.

  Raises:
    ValueError: the lists differ in length.
  """
  lists = [_normalise(a) for a in axes] + [_axis(k.replace("__", "."), v) for k, v in kw.items()]
  lengths = [len(x) for x in lists]
  if len(set(lengths)) > 1:
    raise ValueError(f"zip_ needs lists of equal length, got lengths {lengths}.")
  out = []
  for combo in zip(*lists):
    merged: dict = {}
    for d in combo:
      _merge(merged, d)
    out.append(merged)
  return out


def _normalise(axis) -> list[dict]:
  if isinstance(axis, Mapping):
    if len(axis) != 1:
      raise ValueError(f"a dict axis must have exactly one key mapping to a list of values, "
                       f"got keys {list(axis)}; use zip_ or a list of dicts for several keys.")
    (k, v), = axis.items()
    if isinstance(v, (str, bytes)) or not isinstance(v, Iterable):
      raise ValueError(f"the values of sweep key {k!r} must be a list, got {v!r}.")
    return _axis(k, list(v))
  axis = list(axis)
  for d in axis:
    if not isinstance(d, Mapping):
      raise ValueError(f"a sweep axis must be a list of dicts, got an element {d!r}.")
  return [dict(d) for d in axis]


def _merge(into: dict, d: Mapping[str, Any]) -> None:
  for k, v in d.items():
    if k in into and into[k] != v:
      raise ValueError(f"sweep key {k!r} is set twice in one point ({into[k]!r} and {v!r}).")
    into[k] = v
