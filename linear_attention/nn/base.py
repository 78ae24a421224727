"""Building blocks shared by the mixer layers, under their historical import path.

The interface and its checks live in :mod:`linear_attention.nn.mixer`, the small modules
(rope, short convolution, head norm, projections) in :mod:`linear_attention.nn.modules`;
``from linear_attention.nn import base`` and ``base.ShortConv`` keep working for callers.
"""

from linear_attention.nn.mixer import (Array, Dtype, Mixer, cache_overflowed,  # noqa: F401
                                       check_divisible, check_features, check_positive)
from linear_attention.nn.modules import (HeadNorm, RandomFeatures, ShortConv,  # noqa: F401
                                         dense, inverse_softplus, log_uniform, merge_heads,
                                         param, positions_of, repeat_kv, rope, split_heads,
                                         token_shift)
