"""cdclake benchmarks: `python -m benchmarks [--quick]` (see README.md)."""
