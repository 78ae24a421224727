"""The diagonal-decay linear-attention engine: ``engine.py`` (XLA forms), ``pallas/`` (its kernel)."""
