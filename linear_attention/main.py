r"""Command line: ``python -m linear_attention.main --config=configs/mqar.py:mixer=gla,size=smoke
--workdir=runs/x [--config.optim.lr=1e-3 ...]``.

Parses the (locked) config, optionally joins a multi-host run, and calls
``linear_attention.train.train_and_evaluate(config, workdir)``. Rerunning the same command
resumes from the workdir's latest complete checkpoint.

Multi-host: ``--coordinator_address=host:port --num_processes=N --process_id=i`` (or the
environment variables ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``,
``JAX_PROCESS_ID``; or ``--distributed`` alone where JAX detects the cluster itself, e.g.
SLURM or Cloud TPU). Every process runs the same command with its own ``--process_id``
and the same ``--workdir`` (a shared filesystem); process 0 writes the metrics, the config
and the logs, and every process takes part in each checkpoint. On CPUs the processes talk
through Gloo. Two processes on one machine::

    for i in 0 1; do python -m linear_attention.main --config=configs/mqar.py:size=smoke \
      --workdir=runs/mp --coordinator_address=127.0.0.1:12355 --num_processes=2 \
      --process_id=$i & done; wait

When one process dies, the others fail at their next collective with one ``error:`` line
(exit 1); rerunning every process resumes from the last checkpoint.

Fine-tuning a transformers checkpoint (``linear_attention.hub``) on text with its own
tokenizer, the result written back as a checkpoint to ``runs/ft/hf``::

    python -m linear_attention.main --config=configs/finetune.py --workdir=runs/ft \
      --config.init_from=ckpt/mamba-130m --config.data.text_file=book.txt

JAX's own flags are accepted too (``--jax_platforms=cpu``, ``--jax_enable_x64``, ...).

Exit status (``linear_attention.train.errors.EXIT_CODES``); the last line of a failure is
one ``error: ...`` line:

- 0: finished, or had finished before;
- 1: runtime failure after the run started (an I/O error, no checkpoint that restores, an
  internal error); the traceback is appended to ``<workdir>/error.log``;
- 2: bad configuration or workdir, found before anything was written: a typo, a bad value,
  a config that differs from the workdir's ``config.json`` in a field the checkpoints depend
  on, a workdir locked by another live run;
- 3: stopped by SIGTERM (or a first Ctrl-C) during training, after saving a checkpoint of
  the last completed step (rerun to resume);
- 4: the loss or the gradient norm became non-finite (the state was not saved);
- 130: interrupted (a second Ctrl-C, or a Ctrl-C or SIGTERM outside the training loop:
  start-up, final evaluation; nothing trained since the last checkpoint is lost).

``--workdir=DIR --sample=PROMPT`` trains nothing: it prints the text the language model
trained in ``DIR`` (a text run: bytes, or a fine-tune's tokenizer) writes after ``PROMPT``
(``--sample_tokens``, ``--temperature``, ``--seed``). ``DIR`` may also be a transformers
checkpoint directory (``linear_attention.hub``), with its ``tokenizer.json``; without one the
prompt is token ids (``--sample="510 3158"``) and the output too.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys

INTERRUPTED_MESSAGE = ("error: interrupted; rerun the same command to resume from the last "
                       "checkpoint (or to start again if none was saved).\n")


def _exit_on_interrupt(signum, frame) -> None:
  """SIGINT or SIGTERM outside the training loop (start-up, restore, final evaluation): one
  line and exit 130 at once, from any point (SIGTERM's default was a silent exit -15, which a
  sweep could not tell from a kill).

  Python's default (a ``KeyboardInterrupt`` wherever the main thread happens to be) went
  wrong during start-up: raised inside an import, or a library's ``except BaseException``,
  it was swallowed (the run went on and exited 0) or left a half-imported module, and the
  interpreter's shutdown with XLA's and orbax's threads still running crashed (exit 139)
  or hung. Nothing written before training is left half-done by an exit here (the config
  and metrics files are replaced atomically; the run lock is freed by the kernel). The
  training loop installs its own handler (SIGTERM or a first Ctrl-C saves a checkpoint,
  exit 3).
  """
  os.write(2, INTERRUPTED_MESSAGE.encode())
  try:
    sys.stdout.flush()
  except Exception:  # noqa: BLE001 -- a flush interrupted mid-write; exit regardless
    pass
  os._exit(130)


if __name__ == "__main__":  # before the heavy imports: an interrupt is never lost
  for _signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(_signum, _exit_on_interrupt)


def _config_path(argv) -> str | None:
  for i, a in enumerate(argv):
    if a.startswith("--config="):
      return a.split("=", 1)[1].split(":", 1)[0]
    if a == "--config" and i + 1 < len(argv):
      return argv[i + 1].split(":", 1)[0]
  return None


def _add_config_root(argv) -> None:
  """Puts the directory above the config file on ``sys.path`` so ``from configs import common``
  works from any working directory."""
  path = _config_path(argv)
  if path:
    root = os.path.dirname(os.path.dirname(os.path.abspath(path)))
    if root not in sys.path:
      sys.path.insert(0, root)


_add_config_root(sys.argv)

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
from absl import logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

FLAGS = flags.FLAGS
_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file, optionally with an argument: configs/mqar.py:mixer=gla,size=smoke.",
    lock_config=True)
flags.DEFINE_string("workdir", None, "Run directory (checkpoints, metrics, config). Required.")
flags.DEFINE_bool("distributed", False,
                  "Call jax.distributed.initialize() (auto-detected cluster, or the flags below).")
flags.DEFINE_string("coordinator_address", os.environ.get("JAX_COORDINATOR_ADDRESS"),
                    "Multi-host: address:port of process 0.")
flags.DEFINE_integer("num_processes", int(os.environ.get("JAX_NUM_PROCESSES", "0")) or None,
                     "Multi-host: number of processes.")
flags.DEFINE_integer("process_id", int(os.environ["JAX_PROCESS_ID"])
                     if "JAX_PROCESS_ID" in os.environ else None, "Multi-host: this process's id.")
flags.DEFINE_integer("heartbeat_timeout_s", 100,
                     "Multi-host: seconds without a heartbeat after which a process counts as "
                     "dead and the others stop (JAX's default, 100).")
flags.DEFINE_bool("quiet", False, "No progress output (the final line is still printed).")
flags.DEFINE_string("sample", None,
                    "Train nothing: print text the language model in --workdir (a text run, "
                    "or a transformers checkpoint directory with its tokenizer.json) writes "
                    "after this prompt (no --config needed).")
flags.DEFINE_integer("sample_tokens", 200, "With --sample: tokens (bytes) to generate.")
flags.DEFINE_float("temperature", 0.8, "With --sample: sampling temperature (0: greedy).")
flags.DEFINE_integer("seed", 0, "With --sample: the sampling seed.")


_DISTRIBUTED = []  # non-empty once this process joined a multi-process run


def _fail(msg: str, code: int = 2):
  print(f"error: {msg}", file=sys.stderr, flush=True)
  if _DISTRIBUTED or code in (1, 3, 130):
    # A stopped or failed run's threads (XLA, orbax, the batch prefetcher) may still be
    # busy: the interpreter's shutdown then crashed, hung, or printed their late errors
    # after this line. The trainer's cleanup (the checkpoint written, the files closed) has
    # run by now.
    # A failed process must not enter JAX's shutdown barrier at exit: with a peer gone it
    # waits for the heartbeat timeout and then aborts with pages of C++ logs.
    sys.stdout.flush()
    os._exit(code)
  sys.exit(code)


def _parse_flags(argv):
  """absl flag parsing with one-line errors (no traceback) for bad configs and overrides."""
  path = _config_path(argv)
  if path and not os.path.isfile(path):  # config_flags would say it in four lines
    _fail(f"config file {path!r} not found.")
  try:
    return FLAGS(argv)
  except flags.Error as e:
    text = str(e)
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    # config_flags wraps a get_config() exception in its traceback: keep its last line.
    if "Error whilst parsing config file" in text and lines:
      text = lines[-1]
    _fail(f"{text}\nusage: python -m linear_attention.main --config=configs/<task>.py[:k=v,...] "
          "--workdir=DIR [--config.<field>=value ...]")
  except (AttributeError, KeyError, TypeError, ValueError) as e:
    # config_flags raises these bare for an override of a missing field or of a wrong type.
    detail = " ".join(str(e).encode().decode("unicode_escape").replace("'", "").split())
    what = "no such config field" if isinstance(e, (AttributeError, KeyError)) else "bad value"
    _fail(f"invalid config override in {culprits(argv[1:], detail)}: {what}: {detail}")


def culprits(argv, detail: str) -> list[str]:
  """The ``--config.*`` flags of ``argv`` that config_flags' error ``detail`` names (a field
  of their path), else all of them: a sweep's point passes a dozen, and listing every one
  for one typo hid which was wrong."""
  flags_ = [a for a in argv if a.startswith("--config.")]
  # "no such config field: stepz Did you mean "steps" ...": only the part before the hint.
  named = detail.split("field:")[-1].split("Did you mean")[0]
  hit = [a for a in flags_ if any(re.search(rf"\b{re.escape(part)}\b", named)
                                  for part in a[len("--config."):].partition("=")[0].split("."))]
  return hit or flags_


def _check_workdir(workdir: str) -> None:
  """Fails fast (before the heavy imports) when ``workdir`` cannot be created; creates nothing."""
  path = os.path.abspath(os.path.expanduser(workdir))
  probe = path
  while not os.path.exists(probe):
    probe = os.path.dirname(probe)
  if not os.path.isdir(probe):
    _fail(f"workdir {path!r} cannot be created: {probe!r} is not a directory.")
  if not os.access(probe, os.W_OK | os.X_OK):
    _fail(f"workdir {path!r} is not writable ({probe!r} is not writable).")


def _maybe_initialize_distributed() -> None:
  if not (FLAGS.distributed or FLAGS.coordinator_address or FLAGS.num_processes):
    return
  import jax
  # CPU processes reach each other through Gloo; without it the first cross-process collective
  # fails. Accelerator backends ignore the setting.
  if "JAX_CPU_COLLECTIVES_IMPLEMENTATION" not in os.environ:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  kw = {}
  if FLAGS.coordinator_address:
    kw["coordinator_address"] = FLAGS.coordinator_address
  if FLAGS.num_processes:
    kw["num_processes"] = FLAGS.num_processes
  if FLAGS.process_id is not None:
    kw["process_id"] = FLAGS.process_id
  jax.distributed.initialize(heartbeat_timeout_seconds=FLAGS.heartbeat_timeout_s, **kw)
  _DISTRIBUTED.append(True)


_PEER_SIGNS = ("barrier", "deadline_exceeded", "heartbeat", "timeouterror", "gloo",
               "connection reset", "unavailable", "coordination service")


def peer_hint(error: BaseException, distributed: bool) -> str:
  """For a multi-process run, what a collective's or barrier's timeout means: a peer died.

  JAX's coordination errors name processes as ``task:N`` (the process id); the hint names
  the ones the message mentions, else says that a peer was lost. Empty for one process or
  an unrelated error.
  """
  text = f"{type(error).__name__}: {error}"
  if not distributed or not any(w in text.lower() for w in _PEER_SIGNS):
    return ""
  tasks = sorted({int(t) for t in re.findall(r"task:(\d+)", text)})
  who = (f"process(es) {', '.join(map(str, tasks))}" if tasks else "another process")
  return (f"; {who} of this multi-process run was probably lost (killed or stalled): check "
          "its output, then rerun every process to resume from the last checkpoint")


def _one_line(error: BaseException) -> str:
  """The first line of ``error``'s message (orbax and TensorStore messages run to pages)."""
  lines = str(error).strip().splitlines()
  return lines[0] if lines else type(error).__name__


def _sample(workdir: str) -> None:
  """``--sample=PROMPT``: the prompt and its continuation by the run's newest checkpoint."""
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.ERROR)  # orbax warns that a read-only manager creates nothing
  from linear_attention.train import results
  try:
    text = results.sample_text(workdir, FLAGS.sample, FLAGS.sample_tokens,
                               temperature=FLAGS.temperature, seed=FLAGS.seed)
  except Exception as e:  # noqa: BLE001 -- one line and exit 2: nothing was written
    _fail(_one_line(e))
  print(text, flush=True)


def main(argv) -> None:
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
  if len(argv) > 1:
    _fail(f"unexpected positional arguments {argv[1:]}.")
  if FLAGS.workdir is None:
    _fail("--workdir is required.")
  if FLAGS.sample is not None:
    _sample(FLAGS.workdir)
    return
  from linear_attention.train import lifeline
  lifeline.watch()  # started by a sweep: stop (and save) if it dies
  if _CONFIG.value is None:
    _fail("--config is required (e.g. --config=configs/text_lm.py).")
  try:
    config = _CONFIG.value
    config.lock()  # touch it: a config file that failed to load raises here
  except (IOError, OSError) as e:
    _fail(str(e))
  _check_workdir(FLAGS.workdir)
  overrides = config_flags.get_override_values(FLAGS["config"])
  if overrides:
    print("overrides: " + json.dumps(overrides, default=str), file=sys.stderr, flush=True)
  _maybe_initialize_distributed()

  from linear_attention import train  # heavy imports after the cheap checks
  from linear_attention.train import errors, rundir
  try:
    train.train_and_evaluate(config, FLAGS.workdir, verbose=not FLAGS.quiet)
  except Exception as e:  # every failure ends in one line and a documented code
    code = errors.exit_code(e)
    if code == errors.EXIT_CONFIG:  # nothing was written: no log either
      _fail(_one_line(e), code)
    log = rundir.log_exception(os.path.abspath(os.path.expanduser(FLAGS.workdir)), e)
    known = isinstance(e, (errors.CheckpointError, errors.CheckpointWriteError,
                           errors.DataError, errors.PreemptedError, errors.NonFiniteLossError))
    msg = _one_line(e) if known else f"{type(e).__name__}: {_one_line(e)}"
    msg += peer_hint(e, bool(_DISTRIBUTED))
    _fail(msg + (f" (traceback in {log})" if log and not known else ""), code)
  except KeyboardInterrupt as e:  # a second Ctrl-C in the training loop
    for signum in (signal.SIGINT, signal.SIGTERM):
      signal.signal(signum, _exit_on_interrupt)
    rundir.log_exception(os.path.abspath(os.path.expanduser(FLAGS.workdir)), e)
    _fail(INTERRUPTED_MESSAGE[len("error: "):].strip(), errors.EXIT_INTERRUPTED)


_SHORT_HELP = ("--help", "-?", "--helpshort")  # absl's help of this module's flags only


def run() -> None:
  sys.argv = [("--help" if a == "-h" else a) for a in sys.argv]  # absl knows no -h
  if not any(a in _SHORT_HELP for a in sys.argv[1:]):  # --help needs no JAX (seconds to import)
    import jax
    jax.config.config_with_absl()  # JAX's own flags on this command line (--jax_platforms=cpu, ...)
  app.run(main, flags_parser=_parse_flags)


if __name__ == "__main__":
  run()
