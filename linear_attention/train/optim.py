"""Optimiser: AdamW with linear warmup then a cosine, linear or constant schedule,
global-norm clipping, decay mask."""

from __future__ import annotations

from typing import Any, Mapping

import jax
import optax
from flax import nnx

from linear_attention.models import stack

# Parameter names never decayed whatever their rank: norm scales, biases (``b`` is the
# block-diagonal gates' bias of Hawk), and the log-space decay / step-size / skip
# parameters of the recurrent mixers (decaying them towards 0 changes the dynamics,
# not the capacity).
NO_DECAY_NAMES = frozenset({
    "scale", "bias", "b", "dt_bias", "A_log", "D", "log_lambda", "log_dt", "A_imag",
    "log_neg_A_real", "decay_base", "bonus", "maa_x", "maa_wkvrg",
})


SCHEDULES = ("cosine", "linear", "constant")


def lr_schedule(cfg: Mapping[str, Any], total_steps: int) -> optax.Schedule:
  """Linear warmup from 0 to ``cfg.lr`` over ``cfg.warmup_steps``, then ``cfg.schedule``.

  ``"cosine"`` (the default when the field is absent) and ``"linear"`` reach
  ``cfg.lr * cfg.final_lr_ratio`` at ``total_steps``; ``"constant"`` stays at
  ``cfg.lr`` (MQAR's phase transition needs the rate still high when the
  previous-token head forms, which a cosine over a short run is not).

  Raises:
    ValueError: an unknown ``cfg.schedule``.
  """
  kind = cfg.get("schedule", "cosine")
  if kind not in SCHEDULES:
    raise ValueError(f"config.optim.schedule must be one of {list(SCHEDULES)}, got {kind!r}.")
  warmup = int(min(cfg["warmup_steps"], max(total_steps - 1, 0)))
  decay_steps = max(total_steps - warmup, 1)
  peak, end = cfg["lr"], cfg["lr"] * cfg["final_lr_ratio"]
  if kind == "cosine":
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=peak, warmup_steps=warmup, decay_steps=warmup + decay_steps,
        end_value=end)
  after = (optax.constant_schedule(peak) if kind == "constant"
           else optax.linear_schedule(peak, end, decay_steps))
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), after], [warmup])


def _name(path) -> str:
  """The attribute name of a leaf: the last string key that is not the Variable's ``value``."""
  names = [str(getattr(p, "key", getattr(p, "name", p))) for p in path]
  names = [n for n in names if n not in (".value", "value", "raw_value")]
  return names[-1] if names else ""


def decay_mask(params) -> Any:
  """A pytree of bools like ``params``: True where weight decay applies.

  Decayed: parameters with ``ndim >= 2`` whose name is not in :data:`NO_DECAY_NAMES`
  (matrices, embeddings, convolution filters). Not decayed: every 1-D parameter, norm
  scales, biases and the recurrent mixers' decay/step parameters. A parameter stored
  stacked over layers (``model.scan_layers``) is judged by one layer's slice.
  """
  return jax.tree_util.tree_map_with_path(
      lambda path, x: bool(x.ndim - stack.layer_axes(path) >= 2
                           and _name(path) not in NO_DECAY_NAMES), params)


def make_tx(cfg: Mapping[str, Any], total_steps: int) -> optax.GradientTransformation:
  """``clip_by_global_norm`` then AdamW (decay masked by :func:`decay_mask`) on the schedule.

  Args:
    cfg: ``config.optim`` with ``lr, warmup_steps, final_lr_ratio, weight_decay, b1, b2,
      eps, clip_norm`` (``clip_norm <= 0`` disables clipping).
    total_steps: number of optimiser steps of the run (the schedule's horizon).
  """
  for field in ("lr", "b1", "b2", "eps"):
    if not cfg[field] > 0:
      raise ValueError(f"config.optim.{field} must be > 0, got {cfg[field]!r}.")
  if cfg["weight_decay"] < 0:
    raise ValueError(f"config.optim.weight_decay must be >= 0, got {cfg['weight_decay']!r}.")
  parts = []
  if cfg["clip_norm"] > 0:
    parts.append(optax.clip_by_global_norm(cfg["clip_norm"]))
  parts.append(optax.adamw(lr_schedule(cfg, total_steps), b1=cfg["b1"], b2=cfg["b2"],
                           eps=cfg["eps"], weight_decay=cfg["weight_decay"], mask=decay_mask))
  return optax.chain(*parts)


def make_optimizer(model: nnx.Module, cfg: Mapping[str, Any], total_steps: int) -> nnx.Optimizer:
  """``nnx.Optimizer(model, make_tx(cfg, total_steps), wrt=nnx.Param)``."""
  return nnx.Optimizer(model, make_tx(cfg, total_steps), wrt=nnx.Param)
