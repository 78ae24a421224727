"""The family registry and the weight-map entries every family is written with (see the
package docstring)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from flax import nnx


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


@dataclasses.dataclass(frozen=True)
class Split:
  """One checkpoint tensor made of several model parameters: a fused projection that the
  model keeps as separate layers (Qwen3-Next's ``in_proj_qkvz``: the q/k/v projection and the
  output gate's).

  Attributes:
    paths: the parameters' paths in ``nnx.state(model)``.
    name: the checkpoint tensor.
    load: the checkpoint array -> the parameters' values (NumPy), in ``paths`` order.
    save: the parameters' values, in ``paths`` order -> the checkpoint array.
  """
  paths: tuple[Path, ...]
  name: str
  load: Callable[[np.ndarray], list[np.ndarray]]
  save: Callable[[list[np.ndarray]], np.ndarray]


@dataclasses.dataclass(frozen=True)
class Constant:
  """A checkpoint tensor that the config determines and no parameter holds (a persistent
  torch buffer: MiniMax's decay tables). Optional at load; when present it must equal
  ``value`` (float32 rounding allowed, ``rtol``), else the load fails naming it. Written by
  :func:`~linear_attention.hub.save_pretrained`, so that transformers finds it."""
  name: str
  value: np.ndarray
  rtol: float = 1e-5


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
  splits = [e for e in entries if isinstance(e, Split)]
  paths = [t.path for t in tensors] + [p for s in splits for p in s.paths]
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
    wanted = {n for t in tensors for n in t.names} | {s.name for s in splits}
    missing = wanted - names
    if missing:
      problems.append(f"tensors missing from the checkpoint: {_format_list(missing)}")
    aliases = {a.name for a in entries if isinstance(a, (Alias, Constant))}
    extra = names - wanted - aliases
    if extra:
      problems.append(f"checkpoint tensors this model does not use: {_format_list(extra)}")
  if problems:
    raise ValueError("checkpoint and model do not match:\n  " + "\n  ".join(problems))
