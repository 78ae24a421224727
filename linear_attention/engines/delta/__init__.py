"""The delta-rule engine: ``engine.py`` (XLA forms), ``terms.py`` (chunk algebra), ``pallas/``."""
