"""The op benchmark behind ``experiments/bench/bench_ops.py`` (the command line).

- ``cases.py``: the cases, declared (op, inputs by shape, keyword arguments, FLOP count,
  lengths, group); a new op's case goes there.
- ``flops.py``: forward FLOP counts and memory estimates.
- ``measure.py``: compiling and timing one (case, T) in a subprocess; memory plans.
- ``report.py``: the table, result files (through ``linear_attention.io.write_json``) and
  merging them.
"""
