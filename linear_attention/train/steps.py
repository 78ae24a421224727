"""The loss, its gradient (with gradient accumulation) and the jitted train and eval steps.

Split from :mod:`~linear_attention.train.trainer`, which re-exports these names.
"""

from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp
import optax
from flax import nnx


def first_argmax(logits: jax.Array) -> jax.Array:
  """``jnp.argmax(logits, -1)`` (the first index of the maximum) for finite ``logits``.

  XLA on CPU lowers ``argmax`` to a two-output (value, index) reduction that runs several
  times slower than two plain reductions; over a vocabulary of 8192 it cost as much as the
  head's matmul. Non-finite rows may differ from ``argmax`` (the loss is then non-finite too).
  """
  top = jnp.max(logits, axis=-1, keepdims=True)
  idx = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
  return jnp.min(jnp.where(logits == top, idx, logits.shape[-1]), axis=-1)


def loss_and_metrics(model: nnx.Module, batch: Mapping[str, jax.Array], kind: str,
                     max_targets: int | None = None):
  """Masked cross-entropy.

  ``kind="lm"``: ``inputs, targets [B, T]`` int, ``mask [B, T]`` float (1 = counted); the loss
  is the mean over counted tokens. ``kind="classify"``: ``inputs [B, T]``, ``mask [B, T]``
  bool (True = real token), ``label [B]``; the mean over sequences.

  ``max_targets`` (``"lm"`` only): a bound on the counted positions of any row (the dataset's
  ``max_targets_per_row``). The logits are then computed at the first ``max_targets``
  counted positions of each row only; the loss and accuracy are the same as without it.

  Returns:
    ``(loss, {"loss_sum", "correct", "weight"})`` with float32 scalars (sums, so that
    evaluation batches add up exactly).
  """
  if kind == "lm":
    labels, w = batch["targets"], batch["mask"].astype(jnp.float32)
    if max_targets:
      # Stable sort of "not counted" puts each row's counted positions first, in order.
      pos = jnp.argsort(w <= 0, axis=-1, stable=True)[:, :max_targets]
      labels, w = (jnp.take_along_axis(a, pos, axis=1) for a in (labels, w))
      logits = model(batch["inputs"], positions=pos)
    else:
      logits = model(batch["inputs"])
  else:
    logits = model(batch["inputs"], batch["mask"])
    labels = batch["label"]
    w = jnp.ones(labels.shape, jnp.float32)
  logits = logits.astype(jnp.float32)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  correct = (first_argmax(logits) == labels).astype(jnp.float32)
  loss_sum, weight = jnp.sum(ce * w), jnp.sum(w)
  loss = loss_sum / jnp.maximum(weight, 1.0)
  return loss, {"loss_sum": loss_sum, "correct": jnp.sum(correct * w), "weight": weight}


def _micro_batches(batch: Mapping[str, jax.Array], accum_steps: int) -> dict:
  """``[B, ...]`` fields -> ``[accum_steps, B / accum_steps, ...]``: micro-batch ``j`` holds
  rows ``j, j + k, j + 2k, ...``, so each device's contiguous rows split into ``k`` local
  micro-batches and no row moves between devices."""
  def split(x):
    return jnp.swapaxes(x.reshape(x.shape[0] // accum_steps, accum_steps, *x.shape[1:]), 0, 1)
  return {k: split(v) for k, v in batch.items()}


def accumulated_grads(model: nnx.Module, batch: Mapping[str, jax.Array], kind: str,
                      max_targets: int | None = None, accum_steps: int = 1):
  """The loss, its metric sums and the gradient of ``model`` on ``batch``, computed on
  ``accum_steps`` micro-batches one after the other (a ``lax.scan``).

  Each micro-batch adds the gradient of its summed loss; the sum is divided by the counted
  positions of the whole batch at the end, so the result is the gradient of the whole
  batch's mean loss (to float32 rounding) with the activations of one micro-batch alive at
  a time. ``batch``'s row count must be divisible by ``accum_steps``.

  Returns:
    ``(loss, {"loss_sum", "correct", "weight"}, grads)`` as :func:`loss_and_metrics` and
    ``nnx.grad`` give them.
  """
  if accum_steps == 1:
    grad_fn = nnx.value_and_grad(loss_and_metrics, has_aux=True)
    (loss, aux), grads = grad_fn(model, batch, kind, max_targets)
    return loss, aux, grads

  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  def summed(params, rest, b):  # pure in the parameters: the scan body is its own trace
    _, aux = loss_and_metrics(nnx.merge(graphdef, params, rest), b, kind, max_targets)
    return aux["loss_sum"], aux

  grad_fn = jax.value_and_grad(summed, has_aux=True)

  def micro(carry, b):
    grads, sums = carry
    (_, aux), g = grad_fn(params, rest, b)
    return (jax.tree.map(jnp.add, grads, g), jax.tree.map(jnp.add, sums, aux)), None

  zeros = jax.tree.map(jnp.zeros_like, params)
  sums0 = {k: jnp.zeros((), jnp.float32) for k in ("loss_sum", "correct", "weight")}
  (grads, aux), _ = jax.lax.scan(micro, (zeros, sums0), _micro_batches(batch, accum_steps))
  weight = jnp.maximum(aux["weight"], 1.0)
  grads = jax.tree.map(lambda g: g / weight.astype(g.dtype), grads)
  return aux["loss_sum"] / weight, aux, grads


def _train_step_fn(graphdef, kind: str, max_targets: int | None, accum_steps: int = 1):
  """The un-jitted one-step update ``(state, batch) -> (state, metrics)``; ``accum_steps``
  micro-batches per step (see :func:`accumulated_grads`)."""

  def train_step(state, batch):
    model, opt = nnx.merge(graphdef, state)
    loss, aux, grads = accumulated_grads(model, batch, kind, max_targets, accum_steps)
    gnorm = optax.tree.norm(grads)
    opt.update(model, grads)
    out = {"loss": loss, "accuracy": aux["correct"] / jnp.maximum(aux["weight"], 1.0),
           "grad_norm": gnorm, "finite": jnp.isfinite(loss) & jnp.isfinite(gnorm)}
    return nnx.state((model, opt)), out

  return train_step


def make_steps(graphdef, kind: str, state_sh, batch_sh, repl, max_targets: int | None = None,
               accum_steps: int = 1):
  """Jitted train and eval steps on the flat ``(model, optimizer)`` state (the train step
  on ``accum_steps`` micro-batches of each batch; evaluation on the whole batch).

  ``jax.jit`` over ``nnx.split`` state (rather than ``nnx.jit`` on the objects) gives explicit
  in/out shardings (replicated or FSDP) and donates the old state's buffers.
  """
  train_step = _train_step_fn(graphdef, kind, max_targets, accum_steps)

  def eval_step(state, batch):
    model, _ = nnx.merge(graphdef, state)
    return loss_and_metrics(model, batch, kind, max_targets)[1]

  train = jax.jit(train_step, in_shardings=(state_sh, batch_sh), out_shardings=(state_sh, repl),
                  donate_argnums=0)
  evaluate = jax.jit(eval_step, in_shardings=(state_sh, batch_sh), out_shardings=repl)
  return train, evaluate


def make_fused_steps(graphdef, kind: str, state_sh, batch_sh, repl,
                     max_targets: int | None = None, accum_steps: int = 1):
  """A jitted ``(state, batches) -> (state, metrics)`` running one step per leading row.

  ``batches`` is a batch with a leading steps axis (``[K, B, ...]``); the steps run in a
  ``lax.scan`` inside one dispatch, so the host and the device meet once per ``K`` steps.
  The metrics come back stacked (``[K]`` per name). The parameters after ``K`` fused steps
  equal those of ``K`` calls of :func:`make_steps`' train step to float32 rounding (XLA may
  fuse the scan body differently). ``batch_sh``: the sharding of one batch (rows over the
  data axis), or None; the stacked batch adds an unsharded leading axis.
  """
  train_step = _train_step_fn(graphdef, kind, max_targets, accum_steps)

  def train_many(state, batches):
    return jax.lax.scan(train_step, state, batches)

  def stacked(sh):
    if not isinstance(sh, jax.sharding.NamedSharding):
      return sh
    return jax.sharding.NamedSharding(sh.mesh, jax.sharding.PartitionSpec(None, *sh.spec))

  # One sharding for the whole batch, or one per field (a sharded sequence).
  stacked_sh = jax.tree.map(stacked, batch_sh)
  return jax.jit(train_many, in_shardings=(state_sh, stacked_sh),
                 out_shardings=(state_sh, repl), donate_argnums=0)
