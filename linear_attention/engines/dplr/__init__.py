"""The DPLR engine: ``engine.py`` (XLA forms), ``terms.py`` (chunk algebra), ``pallas/``."""
