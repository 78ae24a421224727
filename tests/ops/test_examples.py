"""The ``Examples:`` blocks of the public ops' docstrings run (doctest), so they cannot go
stale; the ops listed in ``WITH_EXAMPLES`` must have one."""

from __future__ import annotations

import doctest
import inspect

import pytest

from linear_attention import ops

# Every engine's entry point and step, and the variants on the delta and DPLR engines (and
# their steps), GLA, RetNet and Forgetting Attention.
WITH_EXAMPLES = (
    "decay_linear_attention", "decay_linear_attention_step", "delta_rule", "delta_rule_step",
    "deltanet", "gated_deltanet", "dplr_attention", "dplr_attention_step", "kda", "rwkv7",
    "gated_deltaproduct", "linear_scan", "softmax_attention", "forgetting_attention", "gla",
    "retention", "deltanet_step", "gated_deltanet_step", "kda_step", "rwkv7_step", "rwkv7_bonus",
    "gated_deltaproduct_step", "forgetting_attention_step")


def _public_ops():
  return {name: fn for name, fn in sorted(vars(ops).items())
          if inspect.isfunction(fn) and not name.startswith("_")}


def _examples(fn):
  return doctest.DocTestFinder(recurse=False).find(fn, fn.__name__, globs={})


def test_listed_ops_have_examples():
  missing = [n for n in WITH_EXAMPLES if not any(t.examples for t in _examples(getattr(ops, n)))]
  assert not missing, f"no Examples: block in {missing}"


@pytest.mark.parametrize("name", [n for n, fn in _public_ops().items()
                                  if any(t.examples for t in _examples(fn))])
def test_docstring_examples_run(name):
  runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
  for test in _examples(getattr(ops, name)):
    runner.run(test)
  result = runner.summarize(verbose=False)
  assert result.attempted and not result.failed, f"{name}: {result.failed} example(s) failed"
