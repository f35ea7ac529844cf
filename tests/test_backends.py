"""What differs between the exact backends and must not change an answer."""
from __future__ import annotations

import pytest

from milp_plan.instance import InstanceSpec, build_instance
from milp_plan.job import Limits
from milp_plan.solvers import bruteforce
from milp_plan.solvers.driver import solve
from instances import write_instance


def test_cbc_reads_large_values_back_inexactly_without_an_internal_error(tmp_path):
    """CBC returns its solution through a text file with 8 significant digits: on this min-cost
    instance the $/step products W = T u exceed 1e8 model units, so the model's objective read
    back (1321740400000) lay 4e4 units above the exact one (1321740360000) and the drift check
    raised an InternalError (exit 3) on a valid optimum. Found by the random cross-check; every
    backend must now return brute force's optimum."""
    spec = write_instance(tmp_path, layers=6, fast_ms=(2, 4), slow_ms=(2, 4), gpn=2, counts=(1, 1), prices=(8, 1),
                          third=True, bw=(0.02, 0.002), billing=("gpu", "node"))
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": 2}))
    fastest = bruteforce.solve(inst, Limits()).plan.predicted.step_time_s
    limits = Limits("min-cost", time_limit_s=50 * fastest)   # test_solve's "min-cost-loose"
    ref = bruteforce.solve(inst, limits)
    for backend in ("cpsat", "highs", "cbc"):
        got = solve(inst, limits, backend=backend)
        assert got.status == "optimal", backend
        assert got.objective == pytest.approx(ref.objective, rel=1e-4), backend
