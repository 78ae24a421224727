"""Blocks, language model, classifier and cached generation over ``linear_attention.nn``."""

from linear_attention.models.blocks import (GLUMLP, MLPS, Block, LayerSpec, ReluSquaredMLP,
                                            mlp_hidden)
from linear_attention.models.generate import generate, redraw_random_features, sample_logits
from linear_attention.models.lm import (POOLINGS, Backbone, LanguageModel, SequenceClassifier,
                                        count_params, resolve_pattern)
from linear_attention.models.parity import (lm_param_count, matched_mlp_ratio, mixer_param_count,
                                            parity_table)
