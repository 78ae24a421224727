"""Form pairing: one form for the values, another for the gradient (``form="auto"``)."""

from __future__ import annotations

import contextlib
import functools
import os

import jax

from linear_attention.common.checks import FORMS, check_choice


def resolve_auto_form(form: str, defaults: dict[str, tuple[str, str]]) -> tuple[str, str]:
  """``(values form, gradient form)`` for ``form``: a named form is both; ``"auto"`` is
  ``defaults[jax.default_backend()]`` (on one CPU thread ``defaults["cpu:1"]`` where given,
  see :func:`one_cpu_thread`), else ``("chunk", "chunk")``.

  The two differ where one form computes the values faster and the other differentiates
  faster (on CPU the token scan against the chunk form, for the delta-rule engines);
  :func:`with_gradient_of` runs such a pair.

  Raises:
    ValueError: ``form`` is not one of :data:`FORMS` nor ``"auto"``.
  """
  check_choice("form", form, FORMS + ("auto",))
  if form != "auto":
    return form, form
  backend = jax.default_backend()
  if backend == "cpu" and one_cpu_thread() and "cpu:1" in defaults:
    return defaults["cpu:1"]
  return defaults.get(backend, ("chunk", "chunk"))


def one_cpu_thread() -> bool:
  """Whether XLA's CPU backend runs its ops on one thread (``XLA_FLAGS`` holds
  ``--xla_cpu_multi_thread_eigen=false``, as the studies set it): an engine's
  ``DEFAULT_FORMS`` may then name another pair under the key ``"cpu:1"``."""
  flags = os.environ.get("XLA_FLAGS", "").split()
  return "--xla_cpu_multi_thread_eigen=false" in flags


def with_gradient_of(values_fn, gradient_fn):
  """``values_fn``, with the reverse-mode derivative of ``gradient_fn`` (the same function
  computed another way, e.g. a token scan and the chunk form of one recurrence).

  A plain call (or ``jax.vmap``) runs ``values_fn``; ``jax.grad``/``jax.vjp`` run
  ``gradient_fn`` forward and backward, so the values and the gradient each take the faster
  path. It is a ``jax.custom_vjp``: forward-mode (``jax.jvp``, ``jax.jacfwd``) is not
  defined through it -- name a form to get it. Integer arguments get ``float0``
  cotangents, as ``jax.vjp`` gives them.
  """
  @jax.custom_vjp
  def run(*args):
    return values_fn(*args)

  def forward(*args):
    return jax.vjp(gradient_fn, *args)  # (values, the pullback as the residual)

  def backward(pullback, cotangent):
    return pullback(cotangent)

  run.defvjp(forward, backward)

  return run


def in_forms(forms_fn, form: str, gradient_form: str, **static):
  """``forms_fn(*args, form=form, **static)``, differentiated through ``gradient_form``
  (:func:`with_gradient_of`) when the two forms differ; the pair comes from
  :func:`resolve_auto_form`."""
  values = functools.partial(forms_fn, form=form, **static)
  if gradient_form == form:
    return values
  return with_gradient_of(values, functools.partial(forms_fn, form=gradient_form, **static))


@contextlib.contextmanager
def forward_mode_needs_a_form(form: str):
  """Around an engine's call in ``form``: JAX's generic error for a forward-mode derivative
  through a ``custom_vjp`` (the ``"auto"`` pairing of :func:`with_gradient_of`, or a chunk
  form's written-out gradient) becomes a ``ValueError`` that says which form has one."""
  try:
    yield
  except TypeError as e:
    if "forward-mode" not in str(e):
      raise
    raise ValueError(
        f"form={form!r} has a custom reverse-mode gradient and no forward-mode derivative "
        "(jax.jvp, jax.jacfwd, jax.linearize); name the form form='recurrent' to take one.") \
        from None
