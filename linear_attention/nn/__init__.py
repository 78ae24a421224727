"""Flax NNX sequence-mixer layers: parameters plus one call into ``ops``.

Build any of them by name with :func:`make_mixer`; :data:`MIXERS` lists the
names, :data:`CAUSAL_MIXERS` those that decode with a cache, :func:`spec` what the
project knows about one and :func:`select` the names that match a tag.
"""

from linear_attention.nn.attention import (BigBirdAttention, ForgettingAttention,
                                           LinformerAttention, LocalAttention,
                                           LongformerAttention, MultiHeadLatentAttention,
                                           SoftmaxAttention)
from linear_attention.nn.mixer import Mixer
from linear_attention.nn.modules import RandomFeatures
from linear_attention.nn.delta import (DeltaNet, GatedDeltaNet, GatedDeltaProduct,
                                       KimiDeltaAttention, RWKV7TimeMix)
from linear_attention.nn.gated import (HGRN2, GatedLinearAttention, LightningAttention,
                                       LogLinearMamba2, Mamba2, MultiScaleRetention, RWKV6TimeMix)
from linear_attention.nn.linear import Based, LinearAttention, ReBased
from linear_attention.nn.recurrent import HawkBlock, Mamba, S4DLayer
from linear_attention.nn.xlstm import MLSTM
from linear_attention.nn.mlp import MLP
from linear_attention.nn.moe import MoE
from linear_attention.nn.norm import RMSNorm
from linear_attention.nn.registry import (CAUSAL_MIXERS, ENCODER_MIXERS, MIXERS, PATTERN_LETTERS,
                                          MixerSpec, make_mixer, mixer_kwargs, select, spec)
