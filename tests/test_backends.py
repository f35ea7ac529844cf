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


def test_cpsat_runs_without_presolve_inclusion_detection():
    """OR-Tools 9.15's presolve inclusion detection certifies wrong optima (google/or-tools#5293;
    a free-mode config of mixed-128 was proven 0.9% above its optimum: backends.CpsatBackend).
    Every CP-SAT run switches it off, and still solves: x + y >= 3, x, y in 0..5, min 2x + y."""
    from milp_plan.solvers.backends import make_backend
    be = make_backend("cpsat")
    seen = []

    class Recording(be.cp.CpSolver):
        def solve(self, model, *args):
            seen.append(self.parameters.presolve_inclusion_work_limit)
            return super().solve(model, *args)
    be.cp = type("cp", (), {**{k: getattr(be.cp, k) for k in dir(be.cp) if not k.startswith("__")},
                            "CpSolver": Recording})
    x, y = be.new_int(0, 5, "x"), be.new_int(0, 5, "y")
    be.add(x + y >= 3)
    be.minimize(2 * x + y)
    run = be.solve(10, 1)
    assert seen == [0] and run.status == "optimal" and run.objective == 3
