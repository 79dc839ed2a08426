"""Benchmarks behind `cachescope bench NAME`; each module has `run_bench(quick=False) -> dict`."""
