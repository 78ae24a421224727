"""The ``Examples:`` blocks of the public docstrings run (doctest), so they cannot go stale:
every public function of :mod:`linear_attention.ops` and of its feature maps must have one,
as must the entry points in ``ENTRY_POINTS`` (``SeqContext`` and the first calls into ``nn``,
``models``, ``hub``); any other public function or class of those namespaces with an example
has it run too."""

from __future__ import annotations

import doctest
import inspect

import pytest

from linear_attention import hub, models, nn, ops
from linear_attention.ops import feature_maps

# The first call a user makes into each layer of the package above ops.
ENTRY_POINTS = (("ops", "SeqContext"), ("nn", "make_mixer"), ("models", "LanguageModel"),
                ("models", "generate"), ("hub", "save_pretrained"))
NAMESPACES = {"ops": ops, "nn": nn, "models": models, "hub": hub}


def _public_ops():
  """Every function a user reaches as ``ops.<name>`` (the ops, their steps and helpers) and
  the feature maps of ``ops.feature_maps`` (``feature_maps.<name>``)."""
  found = {name: fn for name, fn in sorted(vars(ops).items())
           if inspect.isfunction(fn) and not name.startswith("_")}
  found.update({f"feature_maps.{name}": fn for name, fn in sorted(vars(feature_maps).items())
                if inspect.isfunction(fn) and not name.startswith("_")
                and fn.__module__ == feature_maps.__name__ and fn is not ops.random_projection})
  return found


def _examples(fn):
  return doctest.DocTestFinder(recurse=False).find(fn, fn.__name__, globs={})


def _run_examples(name, obj):
  runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
  for test in _examples(obj):
    runner.run(test)
  result = runner.summarize(verbose=False)
  assert result.attempted and not result.failed, f"{name}: {result.failed} example(s) failed"


def test_public_ops_are_found():
  # Guards the collection itself: an empty or partial namespace scan would pass vacuously.
  names = _public_ops()
  assert {"gla", "gla_step", "softmax_attention", "random_projection", "s4d_init",
          "feature_maps.apply_feature_map"} <= set(names)
  assert len(names) > 70, sorted(names)


def test_every_public_op_has_examples():
  missing = [n for n, fn in _public_ops().items() if not any(t.examples for t in _examples(fn))]
  assert not missing, f"no Examples: block in the docstrings of {missing}"


@pytest.mark.parametrize("name", sorted(_public_ops()))
def test_docstring_examples_run(name):
  _run_examples(name, _public_ops()[name])


def _public_entry_points():
  """Public functions and classes of ``NAMESPACES``, but not ops' functions (tested above)."""
  return {f"{ns}.{name}": obj for ns, mod in NAMESPACES.items()
          for name, obj in sorted(vars(mod).items())
          if (inspect.isclass(obj) or (inspect.isfunction(obj) and ns != "ops"))
          and not name.startswith("_")}


def test_entry_points_have_examples():
  found = _public_entry_points()
  missing = [f"{ns}.{n}" for ns, n in ENTRY_POINTS
             if not any(t.examples for t in _examples(found[f"{ns}.{n}"]))]
  assert not missing, f"no Examples: block in the docstrings of {missing}"


@pytest.mark.parametrize("name", [n for n, obj in _public_entry_points().items()
                                  if any(t.examples for t in _examples(obj))])
def test_entry_point_examples_run(name):
  _run_examples(name, _public_entry_points()[name])
