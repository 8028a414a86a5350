"""Benchmarks of durable-workflows: ``python -m benchmarks NAME`` (see ``__main__``).

Each workload is a module with ``main(quick, repeat, out_dir) -> dict`` that prints a table
and writes ``results/NAME.json``. They are kept out of the test suite's paths; a quick mode
of each runs as a smoke test (tests/test_benchmarks_smoke.py) so the harness never rots.
"""
