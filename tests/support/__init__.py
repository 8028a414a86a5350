"""Helpers the tests share: flows, subprocess workers and scripts, servers, generators.

Modules whose classes are recorded by name in committed fixtures or asserted as recorded
type tags (``tests.flows``, ``tests.strategies``, ``tests.evil_module``, ``tests.recover_secret``)
stay at their old import paths, so those names keep resolving.
"""
