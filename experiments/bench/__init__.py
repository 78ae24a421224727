"""Benchmarks: the scripts (``bench_*.py``, ``param_table.py``, ``softmax_baseline.py``,
each run as ``python experiments/bench/<script>.py``), and this package, the op benchmark
behind ``bench_ops.py``:

- ``cases.py``: the cases, declared (op, inputs by shape, keyword arguments, FLOP count,
  lengths, group); a new op's case goes there.
- ``flops.py``: forward FLOP counts and memory estimates.
- ``measure.py``: compiling and timing one (case, T) in a subprocess; memory plans.
- ``report.py``: the table, result files (through ``linear_attention.io.write_json``) and
  merging them.
"""
