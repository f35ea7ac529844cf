"""Hypothesis profiles for the suite.

The default profile ("ci") is deterministic: the same examples on every run (derandomize) and
no example database, so `pytest -n 2` does the same work, and passes or fails the same way, on
every machine and every run; a failure is reproduced by running the test again. For fuzzing:

    MILP_PLAN_HYPOTHESIS=random pytest -n 2       # fresh random examples, failures remembered
    MILP_PLAN_EXAMPLES=4 pytest tests/test_solve.py   # 4x the examples in the brute-force cross-checks

Tests that set max_examples themselves keep it; the profile sets how the examples are drawn.
"""
from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("random", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("MILP_PLAN_HYPOTHESIS", "ci"))
