"""``train_and_evaluate(config, workdir)``: the training loop.

One run: build the dataset (``linear_attention.data``) and the model from the config,
validate everything, then train with AdamW, evaluate at an interval and at the end, write
metrics and checkpoints to ``workdir`` and return the final metrics. Rerunning it on the
same ``workdir`` resumes from the latest complete checkpoint; since a batch is a pure
function of (seed, split, step), the resumed run is the uninterrupted one, bit for bit on CPU.

Config fields used (see ``configs/common.py``): ``model.*``, ``optim.*``, ``train.*``,
``mesh.*`` and ``data`` (passed to ``data.make_dataset``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import threading
import time
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx

from linear_attention import models
from linear_attention.train import checkpoint as ckpt_lib
from linear_attention.train import errors
from linear_attention.train import metrics as metrics_lib
from linear_attention.train import optim
from linear_attention.train import rundir
from linear_attention.train import sharding
# Re-exported: callers catch these as ``trainer.NonFiniteLossError`` and read the file names.
from linear_attention.train.errors import NonFiniteLossError, PreemptedError  # noqa: F401
from linear_attention.train.rundir import (CONFIG_FILE, FINAL_METRICS_FILE,  # noqa: F401
                                           load_config, load_final_metrics, prepare_workdir)

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


# ----------------------------------------------------------------------------- model


def _build_model(mcfg: Mapping[str, Any], vocab_size: int, kind: str,
                 num_classes: int | None, seed: int) -> nnx.Module:
  """:func:`create_model`'s model, initialised op by op (or abstractly under ``eval_shape``)."""
  if kind not in ("lm", "classify"):
    raise ValueError(f"dataset kind must be 'lm' or 'classify', got {kind!r}.")
  if mcfg["dtype"] not in DTYPES:
    raise ValueError(f"config.model.dtype must be one of {list(DTYPES)}, got {mcfg['dtype']!r}.")
  param_dtype = mcfg.get("param_dtype", "float32")
  if param_dtype not in DTYPES:
    raise ValueError(f"config.model.param_dtype must be one of {list(DTYPES)}, got "
                     f"{param_dtype!r}.")
  mk = mcfg["mixer_kwargs"]
  mk = mk.to_dict() if isinstance(mk, ml_collections.ConfigDict) else dict(mk or {})
  pattern = mcfg["pattern"] or None
  common = dict(mixer=None if pattern else mcfg["mixer"], pattern=pattern,
                num_heads=mcfg["num_heads"], mlp_ratio=mcfg["mlp_ratio"], mixer_kwargs=mk,
                short_conv=int(mcfg.get("short_conv", 0)), dtype=DTYPES[mcfg["dtype"]],
                param_dtype=DTYPES[param_dtype],
                remat=mcfg.get("remat", "none"), scan_layers=bool(mcfg.get("scan_layers", False)))
  num_layers = mcfg["num_layers"] if mcfg["num_layers"] > 0 else None
  rngs = nnx.Rngs(params=seed)
  if kind == "lm":
    return models.LanguageModel(vocab_size, mcfg["d_model"], num_layers,
                                tie_embeddings=mcfg["tie_embeddings"], rngs=rngs, **common)
  return models.SequenceClassifier(vocab_size, num_classes, mcfg["d_model"], num_layers,
                                   pooling=mcfg["pooling"], rngs=rngs, **common)


def create_model(mcfg: Mapping[str, Any], vocab_size: int, kind: str,
                 num_classes: int | None, seed: int) -> nnx.Module:
  """The model named by ``config.model``: a ``LanguageModel`` (kind ``"lm"``) or a
  ``SequenceClassifier`` (kind ``"classify"``).

  ``mcfg.pattern`` (hybrid letters such as ``"RRA"``) wins over ``mcfg.mixer`` when non-empty.

  Raises:
    ValueError: unknown mixer or pattern letter (listing the valid ones), bad sizes.
  """
  def build():
    return _build_model(mcfg, vocab_size, kind, num_classes, seed)

  # The parameters are initialised by one compiled program: op by op, the initialisers
  # dispatched hundreds of small programs (about 2.7 s of a smoke-size trainer's start), and
  # with JAX's persistent compilation cache a second start of the same model skips the
  # compile (1.0 s). Same values as op by op: the same keys and initialisers.
  graphdef, _ = nnx.split(nnx.eval_shape(build))
  return nnx.merge(graphdef, jax.jit(lambda: nnx.state(build()))())


# ----------------------------------------------------------------------------- loss


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


_make_steps = make_steps  # the name experiments/bench_train.py uses


# ----------------------------------------------------------------------------- helpers


class TrainWindow:
  """The training metrics of the steps since the last log line.

  Per-step metrics stay on the device until :meth:`drain` fetches them in one transfer (so
  the host does not wait on every step) and checks them; :meth:`summary` turns the window
  into the logged record and starts a new one. Throughput counts the steps after
  :meth:`restart_clock`, less the time handed to :meth:`exclude`.

  Args:
    checkpoint_dir: named in the non-finite error (the last good state is there).
    last_checkpoint: returns the newest saved step (None before the first), for that error.
  """

  def __init__(self, checkpoint_dir: str, last_checkpoint=lambda: None):
    self.checkpoint_dir = checkpoint_dir
    self.last_checkpoint = last_checkpoint
    self._pending: list[tuple[int, dict]] = []
    self._loss: list[float] = []
    self._accuracy: list[float] = []
    self.restart_clock()

  def add(self, step: int, metrics: dict, num_steps: int = 1) -> None:
    """Queues the (device) metrics of the steps that end with ``step`` completed steps:
    scalars for one step, ``[num_steps]`` arrays (a fused dispatch) for several."""
    self._pending.append((step, metrics, num_steps))
    self._steps += num_steps

  @property
  def num_pending(self) -> int:
    """Steps whose metrics are still on the device."""
    return sum(n for _, _, n in self._pending)

  @property
  def has_values(self) -> bool:
    return bool(self._loss)

  def drain(self) -> None:
    """Fetches the queued metrics; raises on the first non-finite step.

    Raises:
      NonFiniteLossError: naming the step and whether the loss, the gradient norm or both.
    """
    if not self._pending:
      return
    got = jax.device_get([m for _, m, _ in self._pending])
    for (last, _, n), ms in zip(self._pending, got):
      rows = [ms] if n == 1 else [{k: v[i] for k, v in ms.items()} for i in range(n)]
      for i, m in enumerate(rows):
        if not bool(m["finite"]):
          raise NonFiniteLossError(non_finite_message(last - n + 1 + i, float(m["loss"]),
                                                      float(m["grad_norm"]),
                                                      self.checkpoint_dir,
                                                      self.last_checkpoint()))
        self._loss.append(float(m["loss"]))
        self._accuracy.append(float(m["accuracy"]))
    self._pending = []

  def restart_clock(self) -> None:
    """Throughput counts from now (after compilation, after a log line)."""
    self._t0, self._steps = time.time(), 0

  def exclude(self, seconds: float) -> None:
    """Leaves ``seconds`` (an evaluation, a checkpoint save) out of the throughput."""
    self._t0 += seconds

  def summary(self, tokens_per_step: int, **extra: float) -> dict[str, float]:
    """``{"loss", "accuracy", "tokens_per_s", **extra}`` of the drained steps; starts a new
    window."""
    el = time.time() - self._t0
    out = {"loss": float(np.mean(self._loss)), "accuracy": float(np.mean(self._accuracy)),
           "tokens_per_s": self._steps * tokens_per_step / el if el > 0 and self._steps else 0.0,
           **extra}
    self._loss, self._accuracy = [], []
    self.restart_clock()
    return out



def dispatch_steps(tcfg: Mapping[str, Any]) -> int:
  """Training steps fused into one dispatch: ``train.steps_per_dispatch`` (1 when absent)
  reduced to its greatest common divisor with the non-zero ``log_every``, ``eval_every`` and
  ``checkpoint_every``, so that every step that logs, evaluates or saves ends a dispatch
  (and only one fused length is ever compiled)."""
  k = int(tcfg.get("steps_per_dispatch", 1))
  for f in ("log_every", "eval_every", "checkpoint_every"):
    if tcfg[f] > 0:
      k = math.gcd(k, int(tcfg[f]))
  return max(k, 1)


def _put_steps(batches: Mapping[str, np.ndarray], mesh) -> dict:
  """Places stacked host batches ``[K, B, ...]`` on the mesh, rows split over the data axis
  and the sequence over the seq axis (the steps axis is not split: every device runs every
  step on its slice)."""
  out = {}
  for k, v in batches.items():
    sh = jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec(None, *sharding.batch_spec(v.ndim - 1, mesh)))
    out[k] = jax.make_array_from_callback(v.shape, sh, lambda idx, v=v: v[idx])
  return out


class _HostBatches:
  """The training batches of one chunk of steps, made on the host and checked.

  With ``prefetch``, a background thread makes the next chunk (whose end ``chunk_end(step)``
  gives) while the device runs the current one; since a batch is a pure function of
  (seed, split, step), the batches are the same either way.
  """

  def __init__(self, ds, chunk_end, prefetch: bool):
    self.ds, self.chunk_end = ds, chunk_end
    self._pool = None
    if prefetch:
      from concurrent.futures import ThreadPoolExecutor
      self._pool = ThreadPoolExecutor(1, thread_name_prefix="batches")
    self._next: tuple[int, int, Any] | None = None

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    if self._pool is not None:
      self._pool.shutdown(wait=True, cancel_futures=True)

  def _make(self, step: int, n: int) -> list[dict]:
    return [self.ds.batch(s, split="train") for s in range(step, step + n)]

  def get(self, step: int, n: int) -> list[dict]:
    """The ``n`` batches of steps ``step .. step + n - 1``, checked.

    Raises:
      DataError: a batch holds an id outside the vocabulary (naming its step).
    """
    if self._next is not None and self._next[:2] == (step, n):
      got = self._next[2].result()
    else:
      got = self._make(step, n)
    self._next = None
    for i, b in enumerate(got):
      check_batch(b, self.ds, step + i, "train")
    if self._pool is not None:
      nxt = self.chunk_end(step + n)
      if nxt > step + n:
        self._next = (step + n, nxt - step - n,
                      self._pool.submit(self._make, step + n, nxt - step - n))
    return got


def _check_config(config: ml_collections.ConfigDict) -> None:
  t = config.train
  if t.steps < 0:
    raise ValueError(f"config.train.steps must be >= 0, got {t.steps}.")
  for f in ("log_every", "eval_every", "checkpoint_every"):
    if t[f] < 0:
      raise ValueError(f"config.train.{f} must be >= 0 (0 = never), got {t[f]}.")
  spd = t.get("steps_per_dispatch", 1)
  if isinstance(spd, bool) or not isinstance(spd, int) or spd < 1:
    raise ValueError(f"config.train.steps_per_dispatch must be an int >= 1, got {spd!r}.")
  param_dtype = config.model.get("param_dtype", "float32")
  if param_dtype != "float32" and t.steps > 0:
    raise ValueError(f"config.model.param_dtype={param_dtype!r} is for inference (evaluation, "
                     "generation); training keeps float32 parameters and optimizer state. "
                     "For bfloat16 compute set config.model.dtype='bfloat16' and leave "
                     "config.model.param_dtype='float32'.")
  accum = t.get("accum_steps", 1)
  if isinstance(accum, bool) or not isinstance(accum, int) or accum < 1:
    raise ValueError(f"config.train.accum_steps must be an int >= 1, got {accum!r}.")
  metric = t.get("early_stop_metric", "")
  if metric not in EARLY_STOP_METRICS:
    raise ValueError(f"config.train.early_stop_metric must be one of {list(EARLY_STOP_METRICS)}, "
                     f"got {metric!r}.")
  if metric and not t.eval_every:
    raise ValueError("config.train.early_stop_metric needs config.train.eval_every > 0 (the "
                     "stop is checked at each evaluation), got 0.")
  optim.lr_schedule(config.optim, max(int(t.steps), 1))  # an unknown schedule fails here


def check_batch(batch: Mapping[str, np.ndarray], ds, step: int, split: str) -> None:
  """Refuses a batch whose token ids (or labels) fall outside the dataset's vocabulary.

  Out-of-range ids do not fail inside the model: the embedding lookup gives NaN logits
  (ids >= vocab) or wraps around (negative ids) under ``jit``. One min/max per array on the
  host costs microseconds per step.

  Raises:
    DataError: naming the array, the offending id, the vocabulary size, the step and split.
  """
  checks = [("inputs", batch["inputs"], None, ds.vocab_size)]
  if ds.kind == "lm":
    checks.append(("targets", batch["targets"], np.asarray(batch["mask"]) > 0, ds.vocab_size))
  elif "label" in batch and ds.num_classes:
    checks.append(("label", batch["label"], None, ds.num_classes))
  for name, arr, where, size in checks:
    arr = np.asarray(arr)
    if where is not None:
      arr = arr[where]
    if arr.size == 0:
      continue
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= size:
      bad = lo if lo < 0 else hi
      what = "classes" if name == "label" else "vocabulary"
      raise errors.DataError(
          f"the {split} batch of step {step} holds {name} id {bad}, outside the {what} of "
          f"size {size} (valid ids 0..{size - 1}); the dataset breaks the data contract.")


class _SigtermFlag:
  """Turns SIGTERM and a first SIGINT into a flag checked between steps (main thread only):
  the loop saves a checkpoint and stops. A second SIGINT interrupts at once."""

  def __init__(self):
    self.set = False
    self.name = ""
    self._old: dict = {}

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      self._old = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}
    return self

  def _handle(self, signum, frame):
    if signum == signal.SIGINT and self.set:
      raise KeyboardInterrupt
    self.set, self.name = True, signal.Signals(signum).name

  def __exit__(self, *exc):
    for s, h in self._old.items():
      signal.signal(s, h)


def check_context_parallel(model: nnx.Module, ds, mesh) -> None:
  """With a sharded sequence (``config.mesh.seq > 1``): ``seq`` divides the dataset's
  sequence length and every mixer of ``model`` runs context-parallel.

  Raises:
    ValueError: naming ``config.mesh.seq`` and, for mixers, the ones that cannot run
      sharded and the ones that can.
  """
  s = sharding.seq_size(mesh)
  if s == 1:
    return
  sharding.check_seq_len(int(ds.seq_len), mesh)
  from linear_attention.nn import registry
  names = getattr(getattr(model, "backbone", model), "mixer_names", ())
  bad = sorted({n for n in names if not registry.spec(n).cls.context_parallel})
  if bad:
    able = list(registry.select(context_parallel=True))
    raise ValueError(f"config.mesh.seq={s} shards the sequence, but mixer(s) {bad} cannot run "
                     f"that way; context-parallel mixers: {able}.")


def evaluate(eval_fn, state, ds, mesh, num_batches: int | None, split: str = "validation"):
  """Loss and accuracy summed over ``ds.eval_batches(split, num_batches)``."""
  tot = {"loss_sum": 0.0, "correct": 0.0, "weight": 0.0}
  for i, b in enumerate(ds.eval_batches(split=split, num_batches=num_batches)):
    check_batch(b, ds, i, split)
    out = jax.device_get(eval_fn(state, sharding.put_batch(b, mesh)))
    for k in tot:
      tot[k] += float(out[k])
  w = max(tot["weight"], 1.0)
  return {"loss": tot["loss_sum"] / w, "accuracy": tot["correct"] / w}


# ----------------------------------------------------------------------------- main loop


EARLY_STOP_METRICS = ("", "accuracy", "loss")


def non_finite_message(step: int, loss: float, grad_norm: float, directory: str,
                       last_checkpoint: int | None = None) -> str:
  """The stop message of a non-finite step, naming which of the two was not finite.

  ``last_checkpoint``: the newest saved step (None: none was saved yet). The optimiser
  settings cannot change in the same workdir (``config.json`` refuses it), so the advice
  says where a changed setting can go.
  """
  bad = [n for n, v in (("loss", loss), ("gradient norm", grad_norm)) if not math.isfinite(v)]
  head = (f"non-finite {' and '.join(bad) or 'value'} at step {step} (loss {loss}, gradient "
          f"norm {grad_norm}); stopping without saving this state.")
  workdir = os.path.dirname(directory)
  if last_checkpoint is None:
    return (f"{head} No checkpoint was saved before it: rerun with a lower config.optim.lr "
            f"or a smaller config.optim.clip_norm, and the run starts over in {workdir}.")
  return (f"{head} The last checkpoint (step {last_checkpoint}) in {directory} is from before "
          f"it; rerunning resumes there with the same settings. To change config.optim.lr or "
          f"config.optim.clip_norm, start over in another --workdir (config.json in {workdir} "
          "fixes the optimiser settings).")


def describe_final(final: Mapping[str, Any]) -> str:
  """A finished run's final metrics as one readable line."""
  parts = []
  for key in ("validation_loss", "validation_accuracy", "validation_bits_per_byte",
              "train_loss", "train_accuracy"):
    if isinstance(final.get(key), (int, float)):
      parts.append(f"{key.replace('_', ' ')} {final[key]:.4f}")
  if final.get("num_params"):
    parts.append(f"{int(final['num_params']):,} parameters")
  if isinstance(final.get("elapsed"), (int, float)):
    parts.append(f"trained in {final['elapsed']:.0f}s")
  if final.get("stopped_early"):
    parts.append("stopped early")
  return ", ".join(parts) or "no metrics recorded"


def early_stop_reached(tcfg: Mapping[str, Any], res: Mapping[str, float]) -> bool:
  """Whether validation results ``res`` meet ``train.early_stop_metric``/``early_stop_value``.

  ``"accuracy"`` stops at or above the value (Zoology stops MQAR at 0.99), ``"loss"`` at or
  below it; ``""`` (the default, also when the field is absent) never stops.
  """
  metric = tcfg.get("early_stop_metric", "")
  if not metric:
    return False
  value = float(tcfg["early_stop_value"])
  return res[metric] >= value if metric == "accuracy" else res[metric] <= value


def check_run(config: ml_collections.ConfigDict, dataset=None, *, abstract: bool = False):
  """Every check a run makes before it writes anything: the config's fields, the dataset,
  the model and every layer option (by tracing one training step on abstract inputs, which
  reaches the checks that the ops make at trace time), the mesh and the first batch.

  Args:
    config: the run's ConfigDict.
    dataset: as in :func:`train_and_evaluate`.
    abstract: build the model and optimizer with ``nnx.eval_shape`` (no parameter values;
      for checking a config without training it).

  Returns:
    ``(dataset, model, optimizer, mesh)``.

  Raises:
    ConfigError (a ValueError): the first problem found, in one line.
  """
  try:
    _check_config(config)
    check_mixer_kwargs(config.model)
    if dataset is None:
      from linear_attention import data  # the trainer's tests can run without the task code
      dataset = data.make_dataset(config.data)
    ds = dataset
    if abstract:
      model, opt = nnx.eval_shape(lambda: _model_and_optimizer(config, ds, build=False))
    else:
      model, opt = _model_and_optimizer(config, ds)
    mesh = sharding.make_mesh(config.mesh)
    if ds.batch_size % mesh.shape[sharding.DATA]:
      raise ValueError(f"config.data.batch_size ({ds.batch_size}) must be divisible by the "
                       f"{mesh.shape[sharding.DATA]} devices of the data axis (config.mesh.data).")
    accum = int(config.train.get("accum_steps", 1))
    if ds.batch_size % (mesh.shape[sharding.DATA] * accum):
      raise ValueError(f"config.data.batch_size ({ds.batch_size}) must be divisible by "
                       f"config.train.accum_steps ({accum}) times the "
                       f"{mesh.shape[sharding.DATA]} devices of the data axis: each device "
                       "splits its rows into accum_steps micro-batches.")
    check_context_parallel(model, ds, mesh)
    first = ds.batch(0, split="train")
    check_batch(first, ds, 0, "train")
    check_first_step(model, opt, ds, mesh, first, accum_steps=accum)
  except errors.ConfigError:
    raise
  except (ValueError, ModuleNotFoundError) as e:  # all of it refused before anything written
    raise errors.ConfigError(str(e)) from e
  return ds, model, opt, mesh


def _model_and_optimizer(config: ml_collections.ConfigDict, ds, build: bool = True):
  make = create_model if build else _build_model
  model = make(config.model, ds.vocab_size, ds.kind, ds.num_classes, int(config.train.seed))
  return model, optim.make_optimizer(model, config.optim, int(config.train.steps))


def check_first_step(model: nnx.Module, opt: nnx.Optimizer, ds, mesh,
                     batch: Mapping[str, np.ndarray], accum_steps: int = 1) -> None:
  """Traces one training step on abstract inputs (``jax.eval_shape``: nothing computed or
  compiled), under the mesh as the real step is, so that a layer option the ops check
  only at trace time (a chunk size, a form, a window wider than a shard) fails here.

  Raises:
    ValueError: from the layer or op that refused its option.
  """
  graphdef, state = nnx.split((model, opt))
  shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), state)
  batch = {k: jax.ShapeDtypeStruct(np.shape(v), np.asarray(v).dtype) for k, v in batch.items()}
  step = _train_step_fn(graphdef, ds.kind, getattr(ds, "max_targets_per_row", None),
                        accum_steps)
  with sharding.mesh_context(mesh):
    jax.eval_shape(step, shapes, batch)


def check_mixer_kwargs(mcfg: Mapping[str, Any]) -> None:
  """Refuses options of mixers the model does not use: they would change nothing, yet be
  stored in ``config.json`` and block a later resume without them.

  Raises:
    ValueError: naming every such ``config.model.mixer_kwargs.<mixer>.<option>``, its value
      and default, and the mixers the model uses.
  """
  from linear_attention.nn import registry
  mk = mcfg.get("mixer_kwargs") or {}
  mk = mk.to_dict() if isinstance(mk, ml_collections.ConfigDict) else dict(mk)
  used = rundir.used_mixers(mcfg)
  defaults = _mixer_option_defaults()
  bad = []
  for name, opts in sorted(mk.items()):
    if name in used or name not in registry.MIXERS:  # unknown names: the model refuses them
      continue
    for k, v in sorted(dict(opts or {}).items()):
      if k not in defaults.get(name, {}) or v != defaults[name][k]:
        bad.append(f"config.model.mixer_kwargs.{name}.{k}={v!r}")
  if bad:
    raise ValueError(f"{', '.join(bad)} set(s) an option of a mixer this model does not use "
                     f"(its mixers: {sorted(used)}); drop it, or set config.model.mixer / "
                     "config.model.pattern to a model that uses it.")


_OPTION_DEFAULTS: dict = {}


def _mixer_option_defaults() -> dict:
  """``{mixer: {option: default}}`` as the configs declare them (cached)."""
  if not _OPTION_DEFAULTS:
    from linear_attention.nn import registry
    import inspect
    for name in registry.MIXERS:
      s = registry.spec(name)
      params = inspect.signature(s.cls.__init__).parameters
      _OPTION_DEFAULTS[name] = {k: s.defaults.get(k, params[k].default)
                                for k in registry.mixer_kwargs(name)}
  return _OPTION_DEFAULTS


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *, dataset=None,
                       verbose: bool = True) -> dict:
  """Trains and evaluates the model of ``config``, resuming from ``workdir`` if possible.

  Args:
    config: the run's ConfigDict (``configs/*.py``).
    workdir: run directory (created). Holds ``config.json``, ``metrics.jsonl``,
      ``tensorboard/``, ``checkpoints/`` and ``final_metrics.json``.
    dataset: an object following the data contract; default ``data.make_dataset(config.data)``.
    verbose: print progress and the final result (stderr).

  Returns:
    The final metrics: ``step``, ``train_loss``, ``train_accuracy``, ``validation_loss``,
    ``validation_accuracy``, ``num_params``, ``elapsed`` (and ``bits_per_byte`` for text).

  Raises:
    ConfigError (a ValueError): bad config, unknown mixer, unwritable workdir, missing corpus,
      a first batch outside the vocabulary, a config that differs from the workdir's
      ``config.json`` in a field the checkpoints depend on, or a workdir locked by another
      live run; raised before anything is written.
    CheckpointError: the workdir has checkpoints and none restores (damaged newer ones are
      skipped with one line each).
    DataError: a later batch broke the data contract (an id outside the vocabulary).
    NonFiniteLossError: the loss or gradient norm became NaN/Inf (the message names the step
      and which of the two).
    PreemptedError: SIGTERM (or a first SIGINT) arrived during training; a checkpoint of
      the last completed step was saved (outside the training loop the command line exits
      130 at once: nothing was trained since the last checkpoint, or the last one is
      complete).
  """
  t_start = time.time()
  ds, model, opt, mesh = check_run(config, dataset)
  try:
    workdir = prepare_workdir(workdir)  # only now, after everything above validated
  except errors.ConfigError:
    raise
  except (ValueError, ModuleNotFoundError) as e:
    raise errors.ConfigError(str(e)) from e
  lead = jax.process_index() == 0
  # One run per workdir: the lock is held until this process returns or dies.
  with rundir.WorkdirLock(workdir) if lead else contextlib.nullcontext() as lock:
    return _train(config, workdir, ds, model, opt, mesh, lock, verbose=verbose, t_start=t_start)


def _train(config: ml_collections.ConfigDict, workdir: str, ds, model: nnx.Module,
           opt: nnx.Optimizer, mesh, lock: rundir.WorkdirLock | None, *, verbose: bool,
           t_start: float) -> dict:
  """The run itself, in a validated and locked workdir (see :func:`train_and_evaluate`):
  set up the sharded state and steps, restore, train, evaluate, finish."""
  run = _Run(config, workdir, ds, mesh, verbose=verbose, t_start=t_start)
  if lock is not None and lock.took_over:
    run.say(rundir.describe_takeover(lock.took_over))
  run.setup(model, opt)
  done_before = run.restore()
  if done_before is not None:
    return done_before
  run.open_logs(model)
  try:
    val = run.loop()
  finally:
    run.close()
  return run.finish(val)


class _Run:
  """The named steps of one run; :func:`_train` calls them in order.

  :meth:`setup` places the state and builds the jitted steps, :meth:`restore` finds the
  checkpoint to start from (or the finished result), :meth:`open_logs` starts the metric
  writer and the progress line, :meth:`loop` trains (evaluating, saving and stopping on
  the way) and returns the final validation result, :meth:`close` closes the writers and
  the checkpointer, :meth:`finish` writes and returns the final metrics.
  """

  def __init__(self, config: ml_collections.ConfigDict, workdir: str, ds, mesh, *,
               verbose: bool, t_start: float):
    self.config, self.workdir, self.ds, self.mesh = config, workdir, ds, mesh
    self.tcfg = config.train
    self.total = int(config.train.steps)
    self.lead = jax.process_index() == 0
    self.verbose, self.t_start = verbose, t_start
    self.say = (lambda line: print(line, file=sys.stderr, flush=True)) if verbose and self.lead \
        else (lambda line: None)

  # -- setup: the sharded state and the jitted steps
  def setup(self, model: nnx.Module, opt: nnx.Optimizer) -> None:
    ds, mesh = self.ds, self.mesh
    self.graphdef, state = nnx.split((model, opt))
    self.state_sh = sharding.state_shardings(state, mesh, bool(self.config.mesh.fsdp))
    self.state = jax.device_put(state, self.state_sh)
    self.repl = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    # Per-field shardings need the fields' ranks, so a batch, only when the sequence is
    # sharded (otherwise one row sharding fits every field, and the data stream sees no
    # extra request).
    self.batch_sh = (sharding.batch_sharding(mesh) if sharding.seq_size(mesh) == 1
                     else sharding.batch_shardings(ds.batch(0, split="train"), mesh))
    self.max_targets = getattr(ds, "max_targets_per_row", None)
    self.accum = int(self.tcfg.get("accum_steps", 1))
    self.train_fn, self.eval_fn = (sharding.under_mesh(f, mesh) for f in make_steps(
        self.graphdef, ds.kind, self.state_sh, self.batch_sh, self.repl, self.max_targets,
        self.accum))

  # -- restore: the checkpoint to start from, or the finished run's result
  def restore(self) -> dict | None:
    """Returns the stored final metrics when the workdir already finished this run, else
    None after restoring the newest checkpoint that loads into ``self.state``."""
    workdir, tcfg, total = self.workdir, self.tcfg, self.total
    # Compared before anything is written: a refused change leaves the workdir as it was.
    self.changed = rundir.check_rerun_config(workdir, self.config,
                                             ckpt_lib.newest_step_on_disk(workdir))
    ckpt = self.ckpt = ckpt_lib.Checkpointer(workdir, tcfg.checkpoint_every,
                                             tcfg.keep_checkpoints, tcfg.async_checkpoints)
    try:
      latest = ckpt.latest_step() or 0
      done_before = load_final_metrics(workdir) if self.lead else None
      finished = done_before is not None and not self.changed and (
          (latest >= total and done_before.get("step") == total)
          or (done_before.get("stopped_early") and done_before.get("step") == latest))
      if finished:
        ckpt.close()
        if self.verbose and self.lead:
          print(f"{workdir} already finished at step {done_before['step']}: "
                f"{describe_final(done_before)}", flush=True)
        return done_before
      # The newest checkpoint that restores; damaged newer ones are set aside and said.
      self.start, self.state = ckpt.restore_latest(self.state, say=self.say)
    except BaseException:
      ckpt.close()
      raise
    return None

  # -- logs: config.json, the metric writer and the progress line
  def open_logs(self, model: nnx.Module) -> None:
    config, ds, mesh, workdir, start, total = (self.config, self.ds, self.mesh, self.workdir,
                                               self.start, self.total)
    if self.changed:
      self.say(self.changed)
    if self.lead:
      rundir.write_config(workdir, config)
    self.writer = metrics_lib.MetricWriter(workdir, start, enabled=self.lead, say=self.say)
    self.schedule = optim.lr_schedule(config.optim, total)
    self.num_params = models.count_params(model)
    self.tokens_per_step = ds.batch_size * ds.seq_len
    self.eval_n = int(self.tcfg.eval_batches) if self.tcfg.eval_batches > 0 else None
    self.is_text = config.data.get("task") == "text"
    self.progress = metrics_lib.Progress(total, start, enabled=self.verbose and self.lead)
    if start and self.lead and not self.verbose:  # quiet (a sweep's point): the log still says it resumed
      print(f"resuming at step {start} of {total} from {self.ckpt.directory}", file=sys.stderr,
            flush=True)
    self.progress.message(f"workdir {workdir}: {self.num_params:,} parameters, "
                          + (f"resuming at step {start}" if start else "starting at step 0")
                          + f" of {total}, {mesh.shape[sharding.DATA]} device(s)"
                          + (" (FSDP)" if config.mesh.fsdp else "")
                          + (f" x {sharding.seq_size(mesh)} along the sequence"
                             if sharding.seq_size(mesh) > 1 else ""))

  # -- evaluation
  def run_eval(self, step: int) -> dict:
    res = evaluate(self.eval_fn, self.state, self.ds, self.mesh, self.eval_n)
    if self.is_text:
      res["bits_per_byte"] = res["loss"] / math.log(2)
    self.writer.write(step, "validation", res)
    self.progress.message(f"step {step}: validation "
                          + "  ".join(f"{k} {v:.4f}" for k, v in res.items()))
    return res

  # -- the loop
  def loop(self) -> dict:
    """Trains from ``self.start`` to the end (or an early stop); returns the validation
    result the final metrics report."""
    ds, mesh, tcfg, total, ckpt = self.ds, self.mesh, self.tcfg, self.total, self.ckpt
    progress, writer, schedule = self.progress, self.writer, self.schedule
    self.stopped_at, last_eval = None, None
    window = TrainWindow(ckpt.directory, ckpt.latest_step)
    self.last_train: dict[str, float] = {}
    per_dispatch = dispatch_steps(tcfg)
    fused_fn = (sharding.under_mesh(make_fused_steps(
        self.graphdef, ds.kind, self.state_sh, self.batch_sh, self.repl, self.max_targets,
        self.accum), mesh) if per_dispatch > 1 else None)
    compiled: set[str] = set()

    def chunk_end(step: int) -> int:
      # Chunks end at multiples of ``per_dispatch``, which divides every logging, evaluation
      # and checkpoint interval: each step where something happens ends a chunk.
      return min((step // per_dispatch + 1) * per_dispatch, total)

    batches = _HostBatches(ds, chunk_end, prefetch=per_dispatch > 1)

    with _SigtermFlag() as sigterm, batches:
      # Said once the loop's handler is in place: from here a first Ctrl-C saves and exits 3.
      progress.message("compiling the training step...")
      step = self.start
      while step < total:
        done = chunk_end(step)
        host = batches.get(step, done - step)
        if done - step == per_dispatch > 1:
          kind = "fused"
          stacked = {k: np.stack([b[k] for b in host]) for k in host[0]}
          self.state, m = fused_fn(self.state, _put_steps(stacked, mesh))
          window.add(done, m, per_dispatch)
        else:  # a chunk shorter than per_dispatch (a resumed or final one): one step at a time
          kind = "single"
          for i, one in enumerate(host):
            self.state, m = self.train_fn(self.state, sharding.put_batch(one, mesh))
            window.add(step + i + 1, m)
        if kind not in compiled:  # leave compilation out of tokens/s (the loss still counts)
          compiled.add(kind)
          window.drain()
          window.restart_clock()
          if len(compiled) == 1:
            progress.restart(done)
        step = done
        log_now = (tcfg.log_every and done % tcfg.log_every == 0) or done == total
        eval_now = bool(tcfg.eval_every and done % tcfg.eval_every == 0 and done != total)
        preempt = sigterm.set
        save_now = done == total or preempt or ckpt.should_save(done)
        if log_now or eval_now or save_now or window.num_pending >= 64:
          window.drain()  # every saved or logged state has passed the finiteness check
        if log_now and window.has_values:
          self.last_train = window.summary(self.tokens_per_step, lr=float(schedule(done - 1)),
                                           elapsed=time.time() - self.t_start)
          writer.write(done, "train", self.last_train)
          progress.update(done, self.last_train["loss"], self.last_train["tokens_per_s"])
        if eval_now:
          t_eval = time.time()
          last_eval = self.run_eval(done)
          window.exclude(time.time() - t_eval)  # evaluation time is not training throughput
          if early_stop_reached(tcfg, last_eval):
            self.stopped_at = done
            progress.message(f"step {done}: validation {tcfg.early_stop_metric} reached "
                             f"{tcfg.early_stop_value}; stopping early")
            save_now = True
        if save_now:
          t_save = time.time()
          ckpt.save(done, self.state,
                    force=done == total or preempt or self.stopped_at is not None)
          window.exclude(time.time() - t_save)  # nor is the (synchronous part of a) save
        if preempt:
          ckpt.wait_until_finished()
          raise PreemptedError(f"{sigterm.name} at step {done}; checkpoint saved in "
                               f"{ckpt.directory}. Rerun the same command to resume.")
        if self.stopped_at is not None:
          break
      window.drain()
      if (self.stopped_at is None and self.start >= total and total > 0
          and ckpt.latest_step() != total):
        ckpt.save(total, self.state, force=True)
      # Still under the loop's handler: a stop while the last checkpoint is written waits
      # for it (outside, a signal exits at once and the write would be lost).
      ckpt.wait_until_finished()
      if sigterm.set and self.stopped_at is None:  # (an early stop has only its metrics to write)
        raise PreemptedError(f"{sigterm.name} at step {step}; checkpoint saved in "
                             f"{ckpt.directory}. Rerun the same command to resume.")
    return last_eval if self.stopped_at is not None else self.run_eval(total)

  def close(self) -> None:
    self.progress.close()
    self.writer.flush()
    self.writer.close()
    self.ckpt.close()

  # -- finish: the final metrics
  def finish(self, val: dict) -> dict:
    workdir, lead, stopped_at = self.workdir, self.lead, self.stopped_at
    final = {"step": self.total if stopped_at is None else stopped_at,
             "num_params": self.num_params, "elapsed": time.time() - self.t_start,
             "stopped_early": stopped_at is not None}
    last_train = self.last_train
    if not last_train:  # resumed after the last step: the last logged training window
      last_train = (metrics_lib.read_metrics(workdir, "train") or [{}])[-1]
    if "loss" in last_train:
      final.update(train_loss=last_train["loss"], train_accuracy=last_train["accuracy"])
    final.update({f"validation_{k}": v for k, v in val.items()})
    if lead:
      metrics_lib.write_json(os.path.join(workdir, FINAL_METRICS_FILE), final)
      # The run finished: an error.log left by an interrupted attempt must not make the
      # directory look failed (its text is kept in error.resolved.log).
      rundir.resolve_error_log(workdir)
    if self.verbose and lead:
      unit = "nats/token" if self.ds.kind == "lm" else "nats/example"
      line = f"final validation loss {val['loss']:.4f} {unit}  accuracy {val['accuracy']:.4f}"
      if self.is_text:
        line += f"  bits/byte {val['bits_per_byte']:.4f}"
      print(line + f"  (metrics, checkpoints and TensorBoard logs in {workdir})", flush=True)
    return final
