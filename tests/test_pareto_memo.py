"""A Pareto sweep's solves share what they proved (driver.Prepared.found and .proven): the
front is the one a sweep without that memory finds, with fewer configs solved."""
from __future__ import annotations

import pytest

from milp_plan import solve as solving
from milp_plan.instance import InstanceSpec, build_instance
from milp_plan.job import Limits
from milp_plan.pareto import pareto_front
from milp_plan.result import PROOF_TOL
from milp_plan.solve import SolveRequest
from milp_plan.solvers import driver
from instances import COMPARABLE_BW, write_instance


def test_within_is_the_subset_order_of_the_limits():
    """A bound proven under `old` holds under `new` only when `new` admits fewer plans and
    minimises the same."""
    t = Limits("min-time")
    assert driver.within(Limits("min-time", budget_usd_per_step=1.0), t)
    assert not driver.within(t, Limits("min-time", budget_usd_per_step=1.0))
    assert driver.within(Limits("min-time", budget_usd_per_step=1.0), Limits("min-time", budget_usd_per_step=1.0))
    assert not driver.within(Limits("min-time", budget_usd_per_step=1.5), Limits("min-time", budget_usd_per_step=1.0))
    assert not driver.within(Limits("min-cost"), t)   # another objective
    # a Pareto sweep's min-cost solves: a looser time limit and a tighter budget are not a subset
    assert not driver.within(Limits("min-cost", time_limit_s=2.0, budget_usd_per_step=0.5),
                             Limits("min-cost", time_limit_s=1.0, budget_usd_per_step=1.0))
    assert driver.within(Limits("min-cost", time_limit_s=1.0, budget_usd_per_hour=3.0, budget_usd_per_step=0.5),
                         Limits("min-cost", time_limit_s=1.0, budget_usd_per_step=1.0))


def test_a_min_time_bound_above_a_time_limit_proves_the_config_empty():
    """A min-time solve under a 1.0 $/step budget proved a config no faster than 2.0 s: a
    min-cost solve that admits fewer plans (budget <= 1.0) and wants at most 1.9 s has none of
    it; at 2.0 s a plan of exactly 2.0 s may exist; a looser budget admits plans the proof did
    not cover; a min-cost bound says nothing about time."""
    from types import SimpleNamespace
    cfg = object()
    prepared = SimpleNamespace(proven={cfg: [(Limits("min-time", budget_usd_per_step=1.0), 2.0),
                                             (Limits("min-cost", time_limit_s=5.0), 9.0)]},
                               _and_twin=lambda c: (c,))   # no dominating twin (driver.Prepared.twin)

    def too_slow(limits):
        return driver.Prepared.too_slow(prepared, cfg, limits)
    assert too_slow(Limits("min-cost", time_limit_s=1.9, budget_usd_per_step=0.9))
    assert too_slow(Limits("min-cost", time_limit_s=1.9, budget_usd_per_step=1.0))
    assert not too_slow(Limits("min-cost", time_limit_s=2.0, budget_usd_per_step=0.9))
    assert not too_slow(Limits("min-cost", time_limit_s=1.9, budget_usd_per_step=1.1))
    assert not too_slow(Limits("min-cost", time_limit_s=1.9))
    assert not too_slow(Limits("min-time", budget_usd_per_step=0.9))   # no time limit
    assert not driver.Prepared.too_slow(prepared, object(), Limits("min-cost", time_limit_s=0.1))


def sweep(inst, monkeypatch, remember: bool):
    solved = []
    run = solving.run

    def counted(*a, **k):
        r = run(*a, **k)
        solved.append(r.work)
        return r
    with monkeypatch.context() as m:
        m.setattr(solving, "run", counted)
        if not remember:
            m.setattr(driver, "known", lambda prepared, limits: [])
            m.setattr(driver.Prepared, "carried", lambda self, cfg, limits: 0.0)
            m.setattr(driver.Prepared, "too_slow", lambda self, cfg, limits: False)
        front = pareto_front(inst, SolveRequest("cpsat", None, 600.0, work_limit=60.0))
    return front, solved


def test_sweep_with_memory_finds_the_same_front_with_fewer_solves(tmp_path, monkeypatch):
    """The same 6-layer instance as test_trust's front test (2 x 2 fast GPUs at 8 $/node-h,
    2 x 2 slow at 2 $/GPU-h): both sweeps complete, with the same points, and the one with
    memory does less work (each later solve starts from the plans found before and skips
    configs an earlier min-time solve, under a looser budget, proved no better, and configs a
    min-time solve proved slower than the next min-cost solve's time limit): 5.07 work units
    against 6.29 (11.26 against 13.17 before the coupled bounds, bounds.coupled_budget_bound
    and coupled_cost_bound, the warm start's price check, the recorded heap bounds and the
    recomputing twins; 18.07 against 18.42 before bounds.budget_bound and Prepared.too_slow). Before
    pareto.NEXT_POINT_REL it solved fewer configs, most of the saving being the last point's twins."""
    spec = write_instance(tmp_path, layers=6, gpn=2, counts=(2, 2), prices=(8.0, 2.0), bw=COMPARABLE_BW[0],
                          billing=("node", "gpu"))
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": 4}))
    with_memory, work_with = sweep(inst, monkeypatch, True)
    without, work_without = sweep(inst, monkeypatch, False)
    assert with_memory.complete and without.complete
    pts = [(p.predicted.step_time_s, p.predicted.usd_per_step) for p in with_memory.points]
    assert len(pts) >= 3
    assert pts == [(pytest.approx(p.predicted.step_time_s, rel=PROOF_TOL),
                    pytest.approx(p.predicted.usd_per_step, rel=PROOF_TOL)) for p in without.points]
    assert sum(work_with) < sum(work_without), (work_with, work_without)


def test_each_min_time_solve_asks_for_the_margin_below_the_last_point(monkeypatch):
    """The sweep's budgets (pareto.NEXT_POINT_REL): the next point must cost at least 1e-5
    (relative) less than the last. A budget one float below it let the models' $/step
    rounding (about 1e-6) admit the last point's twins, cut off one at a time until a config
    ran out of cuts and the front stayed incomplete (bench_pareto.py). Fake solves: points
    (1 s, 10 $) and (2 s, 5 $), then none."""
    from types import SimpleNamespace
    from milp_plan import pareto
    asked = []

    def run(inst, req, limits, prepared=None):
        asked.append((limits.objective, limits.budget_usd_per_step))
        b = limits.budget_usd_per_step
        point = (1.0, 10.0) if b is None else (2.0, 5.0) if b >= 5.0 else None
        if point is None:
            return SimpleNamespace(plan=None, status="infeasible")
        predicted = SimpleNamespace(step_time_s=point[0], usd_per_step=point[1])
        return SimpleNamespace(plan=SimpleNamespace(predicted=predicted), status="optimal")
    monkeypatch.setattr(solving, "run", run)
    front = pareto_front(None, SolveRequest("warm-start"))
    rel = pareto.NEXT_POINT_REL
    assert rel == PROOF_TOL / 10 == 1e-5
    assert asked == [("min-time", None), ("min-cost", None), ("min-time", 10.0 * (1 - rel)),
                     ("min-cost", 10.0 * (1 - rel)), ("min-time", 5.0 * (1 - rel))]
    assert [p.predicted.usd_per_step for p in front.points] == [10.0, 5.0] and front.complete


def test_only_a_sweep_records_the_bounds_its_heap_pruned():
    """A solve that stops because the heap's least bound reaches the incumbent records every
    complete config still on the heap, at its bound, for a sweep's later solves (_Heap.record:
    at least the incumbent, so a later solve under fewer plans skips them); a single solve does
    not (0.5 s of CPU at scale-1024, 0.8-1.0 s at scale-8192, Megatron mode)."""
    inst = build_instance(InstanceSpec(cluster="two-type-32", model="gpt3-6.7b", global_batch_size=256))
    limits = Limits()
    sweep = driver.prepare(inst, None, "megatron", sweep=True)
    got = driver.solve(inst, limits, prepared=sweep, time_limit_s=600)
    once = driver.prepare(inst, None, "megatron")
    assert driver.solve(inst, limits, prepared=once, time_limit_s=600).objective == got.objective
    assert len(sweep.proven) > 10 * len(once.proven) > 0
    pruned = [lb for cfg, rows in sweep.proven.items() if cfg not in once.proven for _, lb in rows]
    assert pruned and min(pruned) >= got.objective * (1 - 1e-9)
