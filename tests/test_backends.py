"""What differs between the exact backends and must not change an answer."""
from __future__ import annotations

import pytest

from milp_plan.instance import InstanceSpec, build_instance
from milp_plan.job import Limits
from milp_plan.solvers import bruteforce
from milp_plan.solvers.backends import CpsatBackend
from milp_plan.solvers.driver import solve
from instances import write_instance

_REAL_SOLVE = CpsatBackend.solve   # before any test patches it


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


def test_highs_runs_without_presolve_and_keeps_stdout_clean(tmp_path, capfd):
    """The brute-force cross-check's instance on which HiGHS's presolve lost a min-cost config's
    optimum (backends.HIGHS_OPTIONS: 2 node types of two 1-GPU nodes each, 8 layers, batch 4,
    no flash attention, min-cost under 1.613x the fastest step): HiGHS now finds brute force's
    optimum (with presolve, an internal error: the objective of its "optimal" solution lies
    4.4e-6 above the cost model's price of the plan it returned; HiGHS's power-of-two objective
    scaling, user_objective_scale -10 to -30, does not help: not the objective's magnitude),
    and the debug line highspy prints to stdout on the way (transformNewIntegerFeasibleSolution)
    goes to stderr, so the CLI's stdout (--json) stays its own."""
    from instances import limits_for
    spec = write_instance(tmp_path, layers=8, fast_ms=(0.5, 1.0), slow_ms=(0.75, 1.5), gpn=1, counts=(2, 2),
                          prices=(4.0, 1.0), bw=(1e9, 1e9), billing=("node", "node"))
    # without flash attention, as the hunt's example (with it, presolve finds this optimum)
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": 4, "flash_attention": False}))
    limits = limits_for("min-cost", bruteforce.solve(inst, Limits()).plan)
    ref = bruteforce.solve(inst, limits)
    capfd.readouterr()
    got = solve(inst, limits, backend="highs", time_limit_s=60)
    out, err = capfd.readouterr()
    assert got.status == "optimal" and got.objective == pytest.approx(ref.objective, rel=1e-9)
    assert "HighsMipSolverData" not in out and "HighsMipSolverData" in err


def _hinted_model():
    """min x + 10 y over x, y in 0..20 with x + y >= 5 (optimum x = 5, y = 0), hinted at x = 20,
    y = 0, presolve off (it solves so small a model outright, before any solution is reported)."""
    from milp_plan.solvers.backends import make_backend
    be = make_backend("cpsat")
    be.parameters["cp_model_presolve"] = False
    x, y = be.new_int(0, 20, "x"), be.new_int(0, 20, "y")
    be.add(x + y >= 5)
    be.minimize(x + 10 * y)
    be.hint(x, 20)
    be.hint(y, 0)
    return be, x, y


def test_cpsat_stops_at_the_first_solution_at_or_below_stop_at():
    """`stop_at` (CpsatBackend.solve): min x + 10 y over x, y in 0..20 with x + y >= 5, started
    from the hint x = 20, y = 0 (objective 20; the optimum is x = 5, y = 0: 5). Stopping at 30
    closes on the hint's solution, the first found, with its objective and a bound no higher
    (status "closed", the bound CP-SAT proved, here below it); stopping at 4, below the optimum, never stops: "optimal" at 5; the same
    call twice stops at the same solution (one worker: deterministic). Presolve is off here: it
    solves so small a model outright, before the first solution is reported."""
    def run(stop_at):
        be, x, y = _hinted_model()
        got = be.solve(10, 1, stop_at=stop_at)
        return got.status, got.objective, got.bound, (got.value(x), got.value(y))
    status, obj, bound, xy = run(30.0)
    assert status == "closed" and obj == 20 and bound < obj and xy == (20, 0)   # not proven: its own bound
    assert run(30.0) == (status, obj, bound, xy)
    assert run(4.0)[:2] == ("optimal", 5)


def test_cpsat_stops_at_the_first_solution_stop_if_accepts():
    """`stop_if` (CpsatBackend.solve): the model of the stop_at test, started from the hint x = 20,
    y = 0. A predicate that holds for x >= 10 stops on the hint's solution, the first found
    (status "stopped", its objective 20 and CP-SAT's bound below it); one that never holds
    lets the run prove the optimum 5, having been asked about every solution found on the way."""
    def run(accept):
        be, x, y = _hinted_model()
        asked = []

        def stop_if(value):
            asked.append((value(x), value(y)))
            return accept(value(x))
        got = be.solve(10, 1, stop_if=stop_if)
        return got.status, got.objective, got.bound, asked
    status, obj, bound, asked = run(lambda x: x >= 10)
    assert status == "stopped" and obj == 20 and bound < obj and asked == [(20, 0)]
    status, obj, bound, asked = run(lambda x: False)
    assert status == "optimal" and obj == bound == 5 and asked[0] == (20, 0) and asked[-1] == (5, 0)


def _record_statuses(monkeypatch, drop: str | None = None) -> list:
    """CpsatBackend.solve patched to record each run's status in the list returned; `drop`: a
    keyword it ignores (stop_at or stop_if: every run then goes to its optimum)."""
    statuses: list = []

    def run(self, *a, **k):
        if drop is not None:
            k.pop(drop, None)
        got = _REAL_SOLVE(self, *a, **k)
        statuses.append(got.status)
        return got
    monkeypatch.setattr(CpsatBackend, "solve", run)
    return statuses


def test_path_rounds_stopped_at_a_missed_path_keep_the_optimum(monkeypatch):
    """On the simulated basis a config's run stops at its first solution whose plan misses its
    critical path (driver._solve_model's stop_if; pipeline.md, "add_paths"). On the shipped
    default's job (GPT-3 2.7B, batch 80, free mode, pinned to pp 5, interleaved v2) some runs
    stop so, and the solve returns the same plan, status and bound as with every round solved to
    its model's optimum."""
    from milp_plan.formulations.space import parse_fix
    inst = build_instance(InstanceSpec(global_batch_size=80))
    fix = parse_fix("schedule=interleaved,pp=5,vpp=2")
    statuses = _record_statuses(monkeypatch)
    lazy = solve(inst, Limits(), backend="cpsat", mode="free", fix=fix, time_limit_s=600)
    assert statuses.count("stopped") >= 1
    statuses = _record_statuses(monkeypatch, drop="stop_if")   # every round to its model's optimum
    whole = solve(inst, Limits(), backend="cpsat", mode="free", fix=fix, time_limit_s=600)
    assert "stopped" not in statuses
    assert lazy.status == whole.status == "optimal"
    assert lazy.best_bound == whole.best_bound and lazy.plan.to_json() == whole.plan.to_json()


def test_a_config_closed_at_its_bound_keeps_the_optimum(monkeypatch):
    """driver._solve_model stops a config's CP-SAT run at a plan within CLOSE_GAP of the
    config's proven bound (the search's lb): on two-type-32 (GPT-3 6.7B, batch 256, free mode,
    pp 2) one run closes so, and the solve returns the same objective and status as with every
    run solved to its optimum, within PROOF_TOL / 2, with a gap within PROOF_TOL."""
    from milp_plan.result import PROOF_TOL
    from milp_plan.solvers import driver
    inst = build_instance(InstanceSpec(cluster="two-type-32", model="gpt3-6.7b", global_batch_size=256))
    kw = dict(backend="cpsat", time_limit_s=600, mode="free", fix={"pp": 2})
    statuses = _record_statuses(monkeypatch)
    closed = solve(inst, Limits(), **kw)
    assert statuses.count("closed") >= 1
    statuses = _record_statuses(monkeypatch, drop="stop_at")   # every run to its optimum
    exact = solve(inst, Limits(), **kw)
    assert "closed" not in statuses
    assert closed.status == exact.status == "optimal" and closed.gap <= PROOF_TOL
    assert exact.objective <= closed.objective <= exact.objective * (1 + PROOF_TOL / 2)
    # closing 1% above the bound: the plans priced more than PROOF_TOL / 2 above it are solved on
    _record_statuses(monkeypatch)
    monkeypatch.setattr(driver, "CLOSE_GAP", 0.01)
    wide = solve(inst, Limits(), **kw)
    assert wide.status == "optimal" and exact.objective <= wide.objective <= exact.objective * (1 + PROOF_TOL / 2)


def test_cpsat_cuts_off_where_only_the_step_is_priced(tmp_path, monkeypatch):
    """The per-config model runs CP-SAT without cutting planes (cut_level 0) when no $/step term
    links the step to the prices (min-time, no $/step budget), and with them otherwise (the W
    rows' big-M: driver._solve_model). Either way each solve reaches
    brute force's optimum: the parameter only changes how fast it is proven."""
    spec = write_instance(tmp_path, layers=3, fast_ms=(2, 4), slow_ms=(2, 4), gpn=2, counts=(1, 1), prices=(8, 1),
                          bw=(0.02, 0.002), billing=("gpu", "node"))
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": 2}))
    fastest = bruteforce.solve(inst, Limits(), mode="free").plan
    cheapest = bruteforce.solve(inst, Limits("min-cost"), mode="free").plan.predicted.usd_per_step
    seen: list = []
    plain = CpsatBackend.solve

    def recording(self, *args, **kw):
        seen.append(self.parameters.get("cut_level"))
        return plain(self, *args, **kw)
    monkeypatch.setattr(CpsatBackend, "solve", recording)
    # the $/step budget lies between the cheapest plan's and the fastest's: it binds
    assert fastest.predicted.usd_per_step > 1.2 * cheapest
    for limits, cuts in ((Limits(), 0), (Limits(budget_usd_per_step=1.2 * cheapest), None),
                         (Limits("min-cost", time_limit_s=2 * fastest.predicted.step_time_s), None)):
        seen.clear()
        got = solve(inst, limits, backend="cpsat", mode="free")
        ref = bruteforce.solve(inst, limits, mode="free")
        assert got.status == "optimal" and got.objective == pytest.approx(ref.objective, rel=1e-4), limits
        assert seen and set(seen) == {cuts}, limits
