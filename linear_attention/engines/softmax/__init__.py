"""Exact softmax attention: ``engine.py`` (XLA algorithms), ``pallas/`` (flash attention)."""
