"""Performance benchmarks: run on demand (`python -m bench.placement`), never part of the test suite."""
