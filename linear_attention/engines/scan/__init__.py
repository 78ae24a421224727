"""The elementwise linear-recurrence engine: ``engine.py`` (XLA forms), ``pallas/`` (its kernel)."""
