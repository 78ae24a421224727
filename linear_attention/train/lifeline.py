"""A trainer stops (saving a checkpoint) when the sweep that started it dies, even by SIGKILL.

The sweep starts its trainers in sessions of their own (a Ctrl-C reaches them once, through
the sweep), so a sweep killed outright (SIGKILL, the out-of-memory killer, a crash) used to
leave them training as orphans. The lifeline is a pipe: the parent keeps its write end and
never writes; each child gets the read end (``pass_fds``) and its number in
:data:`ENV`. When the parent process ends, however it ends, the kernel closes the write end
and the child's read returns end-of-file; the child then sends itself SIGTERM, which the
trainer handles as a stop (a checkpoint of the last completed step, exit 3; exit 130 before
training starts). A pipe needs no polling and works on Linux and macOS alike, unlike
``PR_SET_PDEATHSIG`` (Linux only, and fired by the exit of the parent *thread* that forked).

Nothing here imports JAX.
"""

from __future__ import annotations

import os
import signal
import stat
import threading
from typing import Any, Mapping

ENV = "LINEAR_ATTENTION_LIFELINE_FD"

_lock = threading.Lock()
_pipe: tuple[int, int] | None = None  # (read, write) ends; the write end is never written to


def popen_kwargs(env: Mapping[str, str] | None = None) -> dict[str, Any]:
  """The ``subprocess.Popen`` arguments that hand a child this process's lifeline.

  Args:
    env: the child's environment (default: this process's).

  Returns:
    ``{"env": ..., "pass_fds": (fd,)}``; the child calls :func:`watch`.
  """
  global _pipe
  with _lock:
    if _pipe is None:
      # Both ends non-inheritable (os.pipe's default): no child holds the write end open,
      # and only those given pass_fds get the read end.
      _pipe = os.pipe()
  read_fd = _pipe[0]
  return {"env": {**(os.environ if env is None else env), ENV: str(read_fd)},
          "pass_fds": (read_fd,)}


def watch(what: str = "the sweep that started this trainer") -> bool:
  """In the child: SIGTERM to this process once the parent's lifeline closes.

  Reads and removes :data:`ENV` (a grandchild must not watch its grandparent's pipe); does
  nothing without it, or when it names no pipe.

  Args:
    what: the parent, as the line printed on stderr names it.

  Returns:
    Whether a watcher thread was started.
  """
  value = os.environ.pop(ENV, None)
  try:
    fd = int(value) if value else -1
    if fd < 0 or not stat.S_ISFIFO(os.fstat(fd).st_mode):
      return False
  except (ValueError, OSError):
    return False

  def wait() -> None:
    try:
      while os.read(fd, 1):  # the parent never writes: this returns at end-of-file only
        pass
    except OSError:
      return
    os.write(2, f"{what} has exited: stopping (SIGTERM to this process)\n".encode())
    os.kill(os.getpid(), signal.SIGTERM)

  threading.Thread(target=wait, name="lifeline", daemon=True).start()
  return True
