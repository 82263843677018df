"""Benchmark peers from other projects, built at benchmark time from their installed headers (never part of
the wheel): :mod:`.flashinfer_dit`."""
