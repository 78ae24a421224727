"""linear_attention: linear and sub-quadratic attention in JAX."""

from linear_attention import _xla_workarounds

_xla_workarounds.apply()

from linear_attention import ops  # noqa: E402  (after the XLA flags)

__version__ = "0.1.0"
