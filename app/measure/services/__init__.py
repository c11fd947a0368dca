"""Micro benchmarks as API jobs."""
