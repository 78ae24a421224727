"""Experiment configs: one ``get_config(arg)`` file per task (see ``configs/common.py``)."""
