"""Benchmarks behind ``python -m tilegemm.bench`` (one module per op family)."""
