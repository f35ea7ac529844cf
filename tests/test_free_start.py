"""The free-mode heuristic (heuristics/free_start.py) and the driver's use of its plans.

Its plan is a plan like any other: the checker accepts it, the cost model prices it as it
says, it meets the limits, it is never below the config's optimum (brute force), and the
same inputs give the same plan. The driver takes it as the config's cutoff: the bound the
search then records for the config (Prepared.proven, which a Pareto sweep's later solves
read) must stay at most the config's optimum.
"""
from __future__ import annotations

import math

from milp_plan import predict
from milp_plan.job import Limits
from milp_plan.heuristics import free_start
from milp_plan.formulations.placement import build_plan
from milp_plan.result import objective_of
from milp_plan.solvers import driver
from test_bounds import config_optimum
from test_model_rows import CASES, complete_configs, _instance as rows_instance

# test_model_rows' second case: three node types of 1-GPU nodes (two fast, one slow, one mid),
# memory binding on the fast type (0.003 GiB: recompute and the option differ between
# positions), hops that cost time, global batch 2
KW, GBS = CASES[1][:2]


def _instance(tmp):
    return rows_instance(tmp, KW, GBS)


def _three_pool_configs(inst):
    prepared = driver.prepare(inst, None, "free")
    return prepared, [c for c in complete_configs(prepared) if len(c.pools) >= 3 and c.options]


def test_free_start_plans_are_valid_priced_and_never_below_the_optimum(tmp_path):
    inst = _instance(tmp_path)
    _, coefs = _three_pool_configs(inst)
    tried = found = optimal = 0
    for limits in (Limits(), Limits("min-cost", time_limit_s=0.05)):
        for coef in coefs:
            tried += 1
            got = free_start.best_plan(coef, limits)
            best = config_optimum(inst, coef, limits)
            if got is None:
                continue
            plan, cand = got
            driver._require_valid(inst, plan, "free_start", coef.cfg, coef.pins)   # raises on a rejection
            assert limits.admit(plan)
            again = predict.evaluate(inst, plan)   # the cost model's own pricing of the plan
            assert again.step_time_s == plan.predicted.step_time_s
            assert again.usd_per_hour == plan.predicted.usd_per_hour
            rebuilt = build_plan(inst, coef.cfg, [coef.options[o] for o in cand[0]], cand[1], cand[2], None)
            assert rebuilt == plan   # the candidate is the plan
            value = objective_of(plan, limits)
            assert value >= best * (1 - 1e-9), (coef.cfg.label(), value, best)
            assert free_start.best_plan(coef, limits) == got   # deterministic
            found += 1
            optimal += value <= best * (1 + 1e-9)
    assert tried >= 20 and found >= 10 and optimal >= found // 2, (tried, found, optimal)


def test_free_start_runs_on_many_pools_only(tmp_path, monkeypatch):
    """driver.many_pools: free configs of three pools or more, never a Megatron-mode one; the
    heuristic is called on exactly those configs' solves."""
    inst = _instance(tmp_path)
    prepared = driver.prepare(inst, None, "free")
    coefs = complete_configs(prepared)
    assert any(driver.many_pools(c) for c in coefs) and not all(driver.many_pools(c) for c in coefs)
    assert all(driver.many_pools(c) == (len(c.pools) >= driver.MANY_POOLS) for c in coefs)
    assert not any(driver.many_pools(c) for c in prepared.base.coefs)
    called = []
    monkeypatch.setattr(free_start, "best_plan", lambda coef, *a, **k: called.append(coef.cfg))
    from milp_plan.deadline import Deadline
    some = [c for c in coefs if driver.many_pools(c)][:5] + [c for c in coefs if not driver.many_pools(c)][:5]
    for coef in some:
        driver._solve_config(coef, Limits(), "cpsat", None, None, Deadline(60.0, work=10.0), 1, 0.0)
    assert called == [c.cfg for c in some[:5]] and len(called) == 5


def test_the_search_records_no_bound_above_a_configs_optimum(tmp_path):
    """Every (limits, bound) the search leaves in Prepared.proven, with the heuristic's plan as
    the cutoff of the configs it runs on, is at most the config's optimum under those limits."""
    inst = _instance(tmp_path)
    prepared = driver.prepare(inst, None, "free")
    limits = Limits()
    res = driver.solve(inst, limits, mode="free", prepared=prepared, time_limit_s=60)
    assert res.status == "optimal"
    coefs = {c.cfg: c for c in complete_configs(prepared)}
    checked = 0
    for cfg, records in prepared.proven.items():
        if cfg not in coefs:
            continue
        best = config_optimum(inst, coefs[cfg], limits)
        for _, lb in records:
            assert lb <= best * (1 + 1e-9) or best == math.inf, (cfg.label(), lb, best)
            checked += 1
    assert checked >= 5


def test_a_config_solved_from_the_heuristics_plan_returns_its_optimum_and_a_bound(tmp_path):
    """With no incumbent (cutoff None) the heuristic's plan is the cutoff of every many-pool
    config: the config's plan is its optimum, and the bound it returns is never None (the
    search records it, Prepared.proven) and at most that optimum."""
    from milp_plan.deadline import Deadline
    inst = _instance(tmp_path)
    _, coefs = _three_pool_configs(inst)
    limits, stood = Limits(), 0
    for coef in coefs[:12]:
        best = config_optimum(inst, coef, limits)
        plan, bound = driver._solve_config(coef, limits, "cpsat", None, None, Deadline(60.0, work=10.0), 1, 0.0)
        if best == math.inf:
            assert plan is None
            continue
        assert best * (1 - 1e-9) <= objective_of(plan, limits) <= best * (1 + driver.PROOF_TOL), coef.cfg.label()
        assert bound is not None and bound <= best * (1 + 1e-9), (coef.cfg.label(), bound, best)
        stood += free_start.best_plan(coef, limits)[0] == plan   # the heuristic's plan was the optimum
    assert stood >= 3
