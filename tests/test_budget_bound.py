"""bounds.budget_bound: a config's full bound tightened by the least $/h of its GPUs under a $/step
budget (the Pareto sweep's solves: min-time under a budget, min-cost under a time limit and a
budget). It prunes, so it must never exceed the config's best admitted plan (brute force), and
None only where the config has none."""
from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, assume, given, settings

from milp_plan.instance import InstanceSpec, build_instance
from milp_plan.job import Limits
from milp_plan.solvers import bruteforce
from milp_plan.solvers.bounds import budget_bound, config_lower_bound, full_bound, least_usd_per_hour
from milp_plan.solvers.driver import prepare
from instances import EXAMPLES, small_free_instances, small_instances, write_instance
from test_bounds import REL, config_optimum


def _coef(prepared, pp, tp, dp):
    """A config of these pp, tp and dp (its stages' GPUs, whatever else it picks)."""
    return next(c for c in prepared.coefs if c.cfg.pp == pp and (c.cfg.uniform.tp, c.cfg.uniform.dp) == (tp, dp))


def test_least_usd_per_hour_takes_the_cheapest_gpus_until_a_type_runs_out(tmp_path):
    """2 nodes x 2 GPUs of each type, node-billed: fast 8 $/node-h (4 $/GPU-h), slow 2 $/node-h
    (1 $/GPU-h). pp = 3 stages of 1 GPU: the 3 cheapest GPUs, 3 x 1 = 3 $/h. pp = 6: the 4 slow
    GPUs and 2 fast ones, 4 x 1 + 2 x 4 = 12 $/h (the capacity-free bound said 6 x 1 = 6). dp 2,
    pp 3 (6 GPUs): the same 12 $/h."""
    spec = write_instance(tmp_path, layers=6, gpn=2, counts=(2, 2), prices=(8.0, 2.0))
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": 4}))
    prepared = prepare(inst)
    assert least_usd_per_hour(_coef(prepared, pp=3, tp=1, dp=1)) == pytest.approx(3.0)
    assert least_usd_per_hour(_coef(prepared, pp=6, tp=1, dp=1)) == pytest.approx(12.0)
    assert least_usd_per_hour(_coef(prepared, pp=3, tp=1, dp=2)) == pytest.approx(12.0)


def test_a_budget_below_the_least_price_times_the_least_time_proves_the_config_empty(tmp_path):
    """Same cluster, pp = 6 (12 $/h at least): with T_lb its min-time bound, a $/step budget just
    under 12 T_lb / 3600 leaves no plan (None), one well above it leaves the bound valid."""
    spec = write_instance(tmp_path, layers=6, gpn=2, counts=(2, 2), prices=(8.0, 2.0))
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": 4}))
    coef = _coef(prepare(inst), pp=6, tp=1, dp=1)
    t_lb = config_lower_bound(coef, Limits("min-time"), memory=True)
    assert budget_bound(coef, Limits(budget_usd_per_step=12.0 * t_lb / 3600 * 0.999), t_lb) is None
    loose = Limits(budget_usd_per_step=12.0 * t_lb / 3600 * 10)
    assert budget_bound(coef, loose, t_lb) >= t_lb


SWEEP_LIMITS = ("min-time-budget", "min-cost-budget")


def sweep_limits(kind: str, fastest) -> Limits:
    """A Pareto sweep's two kinds of solve, around brute force's fastest plan (T, C): min-time
    under a budget a little below C, and min-cost under 1.3 T and that budget."""
    t, usd = fastest.predicted.step_time_s, fastest.predicted.usd_per_step
    if kind == "min-time-budget":
        return Limits("min-time", budget_usd_per_step=usd * 0.93)
    return Limits("min-cost", time_limit_s=t * 1.3, budget_usd_per_step=usd * 0.93)


def check_budget_bounds(inst, prepared, coef, limits, fix=None) -> float:
    """Every plan of the config pays at least least_usd_per_hour, and its full bound (for a free
    parent, every child's too) is at most its best admitted plan; returns that optimum."""
    if coef.cfg.complete:
        plans = list(bruteforce.candidate_plans(inst, coef.cfg, fix))
        p_min = least_usd_per_hour(coef)
        assert all(p.predicted.usd_per_hour >= p_min * (1 - REL) for p in plans), coef.cfg.label()
        best = config_optimum(inst, coef, limits, fix)
    else:
        best = min([check_budget_bounds(inst, prepared, kid, limits, fix) for kid in prepared.children(coef)],
                   default=math.inf)
    lb = full_bound(coef, limits)
    if lb is None:
        assert best == math.inf, (coef.cfg.label(), "None but a plan exists", best)
    else:
        assert lb <= best * (1 + REL), (coef.cfg.label(), lb, best)
    return best


def check(case, tmp, mode, most, kind):
    kw, gbs, _, flash = case
    spec = write_instance(tmp, **kw)
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": gbs, "flash_attention": flash}))
    assume(sum(bruteforce.count_candidates(inst, c, None) for c in bruteforce.solved_configs(inst, None, mode)) <= most)
    fastest = bruteforce.solve(inst, Limits(), mode=mode)
    assume(fastest.plan is not None)
    limits = sweep_limits(kind, fastest.plan)
    prepared = prepare(inst, None, mode)
    optima = [check_budget_bounds(inst, prepared, coef, limits) for coef in prepared.coefs]
    assert min(optima) == (bruteforce.solve(inst, limits, mode=mode).objective or math.inf)


@pytest.mark.parametrize("kind", SWEEP_LIMITS)
@settings(max_examples=4 * EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
@given(case=small_instances())
def test_megatron_budget_bounds_never_exceed_the_config_optimum(tmp_path_factory, case, kind):
    check(case, tmp_path_factory.mktemp("inst"), "megatron", 6_000, kind)


@pytest.mark.parametrize("kind", SWEEP_LIMITS)
@settings(max_examples=3 * EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
@given(case=small_free_instances())
def test_free_budget_bounds_never_exceed_the_config_optimum(tmp_path_factory, case, kind):
    check(case, tmp_path_factory.mktemp("inst"), "free", 6_000, kind)
