"""Benchmarks: runnable modules that print their figures (``python -m dapo_exp.benchmarks.<name>``).

They are measurements, not tests: nothing here asserts. Each prints the command,
the date and the machine next to its table, so a figure pasted into the docs (docs/results/benchmarks.md)
or the experiment log says where it came from.
"""
