"""Evaluating language models on text: :mod:`~linear_attention.eval.perplexity`."""
