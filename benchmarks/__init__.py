"""The ckptfs benchmark harness: ``python -m benchmarks [--quick] [--only CASE ...] [--output FILE]``.

Generates its own checkpoints with torch into a temporary directory, runs every measurement in a fresh
Python process (``benchmarks/_worker.py``) with warm-up and repetitions, and writes docs/benchmarks.md:
machine facts, method, medians with min-max, the ratio ckptfs/peer and whether each target is met.

This package must stay light to import: the parent process never imports torch; workers do.
"""
