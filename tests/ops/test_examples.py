"""The ``Examples:`` blocks of the public ops' docstrings run (doctest), so they cannot go
stale; every public function of :mod:`linear_attention.ops` must have one."""

from __future__ import annotations

import doctest
import inspect

import pytest

from linear_attention import ops


def _public_ops():
  """Every function a user reaches as ``ops.<name>``: the ops, their steps and helpers."""
  return {name: fn for name, fn in sorted(vars(ops).items())
          if inspect.isfunction(fn) and not name.startswith("_")}


def _examples(fn):
  return doctest.DocTestFinder(recurse=False).find(fn, fn.__name__, globs={})


def test_public_ops_are_found():
  # Guards the collection itself: an empty or partial namespace scan would pass vacuously.
  names = _public_ops()
  assert {"gla", "gla_step", "softmax_attention", "random_projection", "s4d_init"} <= set(names)
  assert len(names) > 60, sorted(names)


def test_every_public_op_has_examples():
  missing = [n for n, fn in _public_ops().items() if not any(t.examples for t in _examples(fn))]
  assert not missing, f"no Examples: block in the docstrings of {missing}"


@pytest.mark.parametrize("name", sorted(_public_ops()))
def test_docstring_examples_run(name):
  runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
  for test in _examples(getattr(ops, name)):
    runner.run(test)
  result = runner.summarize(verbose=False)
  assert result.attempted and not result.failed, f"{name}: {result.failed} example(s) failed"
