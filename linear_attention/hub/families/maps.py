"""Weight-map pieces of the attention, delta-rule and mixture-of-experts families
(Qwen3-Next, OLMo-Hybrid, Kimi Linear): fused projections of unequal widths, per-expert
tensors stacked into one parameter, a fused checkpoint tensor split over several
parameters, and the model pieces of ``nn/`` they fill (SwiGLU, MoE, attention, MLA, Gated
DeltaNet, KDA)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from linear_attention.hub import core

Path = core.Path


def linears(names: Sequence[str], path: Path, widths: Sequence[int]) -> core.Tensor:
  """Torch ``nn.Linear`` weights ``[w_i, in]`` side by side in one kernel ``[in, sum w_i]``
  (like :func:`core.linears`, for unequal widths: q, k and v of other sizes)."""
  names, widths = tuple(names), tuple(widths)
  cuts = np.cumsum(widths)[:-1]
  return core.Tensor(tuple(path), names, lambda a: np.concatenate([x.T for x in a], axis=1),
                     lambda v: [p.T for p in np.split(v, cuts, axis=1)])


def convs(names: Sequence[str], path: Path) -> core.Tensor:
  """Depthwise torch ``Conv1d`` weights ``[C_i, 1, W]`` side by side in one
  ``ShortConv.weight [W, sum C_i]`` (separate q, k and v convolutions).

  Written back as transformers 5 writes them: the channels cut into ``len(names)`` chunks of
  ``ceil(C / n)`` (``torch.chunk``), which are not the q/k/v widths when these differ;
  transformers (and the loading here) concatenates them, so either layout loads."""
  names = tuple(names)

  def cuts(c):
    size = -(-c // len(names))
    return [size * i for i in range(1, len(names)) if size * i < c]
  return core.Tensor(tuple(path), names,
                     lambda a: np.concatenate([x[:, 0, :].T for x in a], axis=1),
                     lambda v: [p.T[:, None, :] for p in np.split(v, cuts(v.shape[1]), axis=1)])


def rows(name: str, paths: Sequence[Path], groups: int, parts: Sequence[int],
         owners: Sequence[int] | None = None) -> core.Split:
  """One torch weight ``[groups * sum(parts), in]`` whose rows come in ``groups`` blocks of
  ``len(parts)`` parts (Qwen3-Next's per-key-head groups; its gated attention's per-head
  query and gate). Part ``j`` of every block, in block order, belongs to parameter
  ``owners[j]`` (default ``j``); a parameter with several parts gets them side by side, in
  part order. Parameters are kernels ``[in, width]``."""
  parts = tuple(parts)
  owners = tuple(range(len(parts))) if owners is None else tuple(owners)
  if len(owners) != len(parts) or sorted(set(owners)) != list(range(len(paths))):
    raise ValueError(f"owners {owners} must give each of the {len(paths)} paths a part.")
  cuts = np.cumsum(parts)[:-1]

  def load(a):
    blocks = np.split(a.reshape((groups, sum(parts)) + a.shape[1:]), cuts, axis=1)
    flat = [b.reshape((-1,) + a.shape[1:]).T for b in blocks]  # each [in, groups * part]
    return [np.concatenate([f for f, o in zip(flat, owners) if o == k], axis=1)
            for k in range(len(paths))]

  def save(values):
    pieces, taken = [], [0] * len(paths)
    for size, o in zip(parts, owners):
      w = groups * size
      pieces.append(values[o][:, taken[o]:taken[o] + w].T.reshape((groups, size, -1)))
      taken[o] += w
    full = np.concatenate(pieces, axis=1)
    return full.reshape((-1, full.shape[-1]))

  return core.Split(tuple(tuple(p) for p in paths), name, load, save)


def stacked(names: Sequence[str], path: Path) -> core.Tensor:
  """Per-expert torch weights ``[out, in]`` as one ``[E, in, out]`` parameter."""
  names = tuple(names)
  return core.Tensor(tuple(path), names, lambda a: np.stack([x.T for x in a]),
                     lambda v: [x.T for x in v])


def stacked_pairs(gates: Sequence[str], ups: Sequence[str], path: Path) -> core.Tensor:
  """Per-expert gate and up weights ``[F, in]`` as one ``[E, in, 2F]`` parameter (each
  expert's gate columns, then its up columns)."""
  gates, ups = tuple(gates), tuple(ups)
  e = len(gates)

  def load(a):
    return np.stack([np.concatenate([g.T, u.T], axis=1) for g, u in zip(a[:e], a[e:])])

  def save(v):
    f = v.shape[-1] // 2
    return [x[:, :f].T for x in v] + [x[:, f:].T for x in v]

  return core.Tensor(tuple(path), gates + ups, load, save)


def swiglu(gate: str, up: str, down: str, path: Path) -> list:
  """A SwiGLU (``nn.mlp.MLP`` or the blocks' ``GLUMLP``) from its three torch weights."""
  return [core.linears([gate, up], tuple(path) + ("up", "kernel")),
          core.linear(down, tuple(path) + ("down", "kernel"))]


def experts(prefix: str, path: Path, num_experts: int, gate: str = "gate_proj",
            up: str = "up_proj", down: str = "down_proj") -> list:
  """The routed experts ``{prefix}{j}.{gate,up,down}.weight`` of an ``nn.moe.MoE``."""
  n = lambda w: [f"{prefix}{j}.{w}.weight" for j in range(num_experts)]
  return [stacked_pairs(n(gate), n(up), tuple(path) + ("gate_up",)),
          stacked(n(down), tuple(path) + ("down",))]


def reshaped(name: str, path: Path, shape: tuple[int, ...], stored: tuple[int, ...]) -> core.Tensor:
  """A tensor stored with shape ``stored`` whose parameter has ``shape`` (Kimi's ``A_log``
  ``[1, 1, H, 1]`` onto ``[H]``); written back in the stored shape."""
  return core.Tensor(tuple(path), (name,), lambda a: a[0].reshape(shape),
                     lambda v: [v.reshape(stored)])
