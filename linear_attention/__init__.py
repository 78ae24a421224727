"""linear_attention: linear and sub-quadratic attention in JAX."""

from linear_attention import ops

__version__ = "0.1.0"
