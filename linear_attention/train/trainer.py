"""``train_and_evaluate(config, workdir)``: the training loop.

One run: build the dataset (``linear_attention.data``) and the model from the config,
validate everything, then train with AdamW, evaluate at an interval and at the end, write
metrics and checkpoints to ``workdir`` and return the final metrics. Rerunning it on the
same ``workdir`` resumes from the latest complete checkpoint; since a batch is a pure
function of (seed, split, step), the resumed run is the uninterrupted one, bit for bit on CPU.

Config fields used (see ``configs/common.py``): ``model.*``, ``optim.*``, ``train.*``,
``mesh.*``, ``data`` (passed to ``data.make_dataset``), and ``init_from`` / ``save_hf``: a
transformers checkpoint to fine-tune instead of a ``model.*`` model, and where the trained
model is written back with ``hub.save_pretrained`` (``configs/finetune.py``).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import math
import os
import shutil
import signal
import sys
import threading
import time
from typing import Any, Mapping

import jax
import ml_collections
import numpy as np
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
# The model, the steps and the pre-write checks live in their own modules; tests, results.py,
# experiments and notebooks still reach them as ``trainer.<name>``, so they are re-exported.
from linear_attention.train.build import (DTYPES, _build_model,  # noqa: F401
                                          _model_and_optimizer, create_model, init_from)
from linear_attention.train.checks import (EARLY_STOP_METRICS, _check_config,  # noqa: F401
                                           _mixer_option_defaults, check_batch,
                                           check_context_parallel, check_first_step,
                                           check_mixer_kwargs, check_run)
from linear_attention.train.steps import (_micro_batches, _train_step_fn,  # noqa: F401
                                          accumulated_grads, first_argmax, loss_and_metrics,
                                          make_fused_steps, make_steps)

_make_steps = make_steps  # the name experiments/bench_train.py uses
# A checkpoint's files besides config.json and the weights that a saved fine-tune keeps.
HF_SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "generation_config.json", "chat_template.jinja")


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


@functools.cache
def _malloc_trim():
  """glibc's ``malloc_trim`` from the C library already loaded, or None (macOS, musl)."""
  try:
    return ctypes.CDLL(None).malloc_trim
  except (OSError, AttributeError):
    return None


def return_freed_host_memory() -> bool:
  """Returns the heap memory this process has freed to the operating system (glibc's
  ``malloc_trim``); False where the C library has no such call (macOS, musl).

  The parameter initialisation and each compile free hundreds of MB in small blocks that
  glibc otherwise keeps resident; the trainer calls this after placing the state and after
  each first compile, so that the step's own buffers do not stack on top of them.

  Examples:
    >>> isinstance(return_freed_host_memory(), bool)
    True
  """
  trim = _malloc_trim()
  if trim is None:
    return False
  trim(0)
  return True


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


_OPTION_DEFAULTS: dict = {}


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
    return_freed_host_memory()  # the initialiser's and the unsplit model's freed buffers
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
    # Bits per byte when the tokens are bytes (a tokenizer's tokens span several).
    self.is_text = config.data.get("task") == "text" and not getattr(ds, "tokenizer", "")
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
          return_freed_host_memory()  # the compiler's scratch, before the next step's buffers
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

  def save_hf(self) -> str:
    """Writes the trained model of a run from ``config.init_from`` as a transformers
    checkpoint (``config.save_hf``, default ``<workdir>/hf``) with the data's tokenizer and
    the checkpoint's tokenizer and generation files beside it; returns the directory."""
    from linear_attention import hub
    dest = os.path.abspath(os.path.expanduser(self.config.get("save_hf") or
                                              os.path.join(self.workdir, "hf")))
    model, _ = nnx.merge(self.graphdef, self.state)
    model.backbone.set_layout(remat="none", scan_layers=False)  # the checkpoint's layer names
    hub.save_pretrained(model, dest)
    src = os.path.expanduser(init_from(self.config))
    for name in HF_SIDE_FILES:
      if os.path.isfile(os.path.join(src, name)):
        shutil.copyfile(os.path.join(src, name), os.path.join(dest, name))
    if getattr(self.ds, "tokenizer", ""):  # the tokenizer the model was trained with
      tok = self.ds.tokenizer
      tok = os.path.join(tok, "tokenizer.json") if os.path.isdir(tok) else tok
      if os.path.abspath(tok) != os.path.join(dest, "tokenizer.json"):
        shutil.copyfile(tok, os.path.join(dest, "tokenizer.json"))
    return dest

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
    if lead and init_from(self.config):
      # Before the final metrics: a run stopped in between saves again when rerun.
      final["hf_dir"] = self.save_hf()
      self.say(f"saved the trained model as a transformers checkpoint in {final['hf_dir']}")
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
