"""Benchmarks and measurements, run from the repository root: `python -m bench.NAME ...`."""
