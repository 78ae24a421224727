"""``SeqContext``, the ``context=`` argument of every engine and token mixer; it lives in
:mod:`linear_attention.engines.context` (with the sharded machinery behind it)."""

from linear_attention.engines.context import SeqContext  # noqa: F401
