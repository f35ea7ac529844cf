"""bounds.coupled_budget_bound: under a $/step budget B a plan with d stages on the dearest node
type pays at least P(d) (least_usd_per_hour_with), so P(d) T <= 3600 B caps d, and the config's
bound over the plans with at most that many dear stages bounds them all. It prunes, so it must
never exceed the config's best admitted plan (brute force, at budgets on every plan's own
$/step), and must bite where the fast GPUs are the dear ones."""
from __future__ import annotations

import math

import pytest

from milp_plan.instance import InstanceSpec, build_instance
from milp_plan.job import Limits
from milp_plan.solvers import bruteforce
from milp_plan.solvers.bounds import (budget_bound, config_lower_bound, coupled_budget_bound, dear_type, full_bound,
                                      least_usd_per_hour_with)
from milp_plan.solvers.driver import prepare
from instances import write_instance
from test_bounds import REL

BUDGETS = 6   # budgets per config in the brute-force check: on plans' own $/step, spread over their range


def _coef(prepared, pp, tp, dp):
    return next(c for c in prepared.coefs if c.cfg.pp == pp and (c.cfg.uniform.tp, c.cfg.uniform.dp) == (tp, dp))


def test_the_price_of_d_dear_stages_fills_the_rest_with_the_cheapest(tmp_path):
    """2 nodes x 2 GPUs of each type: fast 8 $/node-h (4 $/GPU-h, the dear type), slow 2 $/node-h
    (1 $/GPU-h). pp 3, 1-GPU stages: P(d) = 4 d + (3 - d) = 3, 6, 9, 12. pp 6: the slow type holds
    at most 4 stages, so d >= 2: P(2) = 8 + 4 = 12, P(4) = 16 + 2 = 18; d = 5 needs 5 fast GPUs
    of 4: inf. dp 2, pp 3 (2-GPU stages): P(1) = 8 + 2 x 2 = 12."""
    spec = write_instance(tmp_path, layers=6, gpn=2, counts=(2, 2), prices=(8.0, 2.0))
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": 4}))
    prepared = prepare(inst)
    c3 = _coef(prepared, pp=3, tp=1, dp=1)
    assert dear_type(c3) == 0   # 'fast'
    assert [least_usd_per_hour_with(c3, 0, d) for d in range(4)] == pytest.approx([3.0, 6.0, 9.0, 12.0])
    c6 = _coef(prepared, pp=6, tp=1, dp=1)
    assert [least_usd_per_hour_with(c6, 0, d) for d in range(7)] == \
        [math.inf, math.inf, pytest.approx(12.0), pytest.approx(15.0), pytest.approx(18.0), math.inf, math.inf]
    assert least_usd_per_hour_with(_coef(prepared, pp=3, tp=1, dp=2), 0, 1) == pytest.approx(12.0)


def test_the_price_of_the_other_stages_takes_the_cheapest_type_first(tmp_path):
    """The same with a third type, one 'mid' node of 2 GPUs at 3 $/node-h (1.5 $/GPU-h). pp 5,
    1-GPU stages: d = 0 takes the 4 slow GPUs and one mid, 4 + 1.5 = 5.5 (the mid ones first:
    3 + 3 = 6); d = 1: 4 + 4 = 8; d = 2: 8 + 3 = 11; d = 4: 16 + 1 = 17; d = 5: inf."""
    spec = write_instance(tmp_path, layers=6, gpn=2, counts=(2, 2), prices=(8.0, 2.0), third=True)
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": 4}))
    c5 = _coef(prepare(inst), pp=5, tp=1, dp=1)
    assert dear_type(c5) == 0
    assert [least_usd_per_hour_with(c5, 0, d) for d in range(6)] == \
        [pytest.approx(5.5), pytest.approx(8.0), pytest.approx(11.0), pytest.approx(14.0), pytest.approx(17.0), math.inf]


def _coupled_configs(inst):
    """(Coefficients, every plan by brute force) of each config the coupling can touch: pp >= 2,
    a dearest node type, and a plan."""
    for coef in prepare(inst).coefs:
        if coef.cfg.pp < 2 or dear_type(coef) is None:
            continue
        plans = list(bruteforce.candidate_plans(inst, coef.cfg, None))
        if plans:
            yield coef, plans


def _budgets(plans) -> list[float]:
    """At most BUDGETS of the plans' own $/step values, spread over their range, each also one
    hair below (the plan at it just out)."""
    costs = sorted({p.predicted.usd_per_step for p in plans})
    picked = {costs[round(i * (len(costs) - 1) / max(BUDGETS - 1, 1))] for i in range(min(BUDGETS, len(costs)))}
    return sorted(b for c in picked for b in (c, c * (1 - 1e-7)))


@pytest.mark.parametrize("kw", [
    dict(layers=6, gpn=2, counts=(2, 2), prices=(8.0, 2.0), fast_ms=(1.0, 2.0), slow_ms=(2.5, 5.0)),
    dict(layers=5, gpn=2, counts=(2, 1), prices=(8.0, 1.0), fast_ms=(1.0, 2.0), slow_ms=(1.5, 3.0), billing=("gpu", "node")),
])
def test_the_coupled_bound_never_exceeds_the_config_optimum_and_bites(tmp_path, kw):
    """Every config with both types (pp >= 2), at budgets on its plans' own $/step: the full
    bound (with the coupling; floor: the config's optimum without a budget, which holds under
    one) is at most the best admitted plan, None only where none is admitted; and somewhere the
    coupling raises it above budget_bound's (so a wrong coupling has something to break)."""
    spec = write_instance(tmp_path, **kw)
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": 4}))
    bites = 0
    for coef, plans in _coupled_configs(inst):
        floor = min(p.predicted.step_time_s for p in plans)
        for budget in _budgets(plans):
            limits = Limits("min-time", budget_usd_per_step=budget)
            best = min([p.predicted.step_time_s for p in plans if limits.admit(p)], default=math.inf)
            got = full_bound(coef, limits, floor)
            if got is None:
                assert best == math.inf, (coef.cfg.label(), budget, "None but a plan exists", best)
                continue
            assert got <= best * (1 + REL), (coef.cfg.label(), budget, got, best)
            lb = config_lower_bound(coef, limits, memory=True)
            bites += got > budget_bound(coef, limits, max(lb, floor)) * (1 + 1e-6)
    assert bites > 0


def test_the_coupled_bound_leaves_other_limits_alone(tmp_path):
    """No $/step budget, min-cost, or no bound: the bound comes back as it went in."""
    spec = write_instance(tmp_path, layers=6, gpn=2, counts=(2, 2), prices=(8.0, 2.0))
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": 4}))
    coef = _coef(prepare(inst), pp=3, tp=1, dp=1)
    assert coupled_budget_bound(coef, Limits("min-time"), 0.5) == 0.5
    assert coupled_budget_bound(coef, Limits("min-cost", budget_usd_per_step=1e-9), 0.5) == 0.5
    assert coupled_budget_bound(coef, Limits("min-time", budget_usd_per_step=1.0), None) is None


def test_the_warm_start_skips_only_candidates_over_budget(tmp_path):
    """warmstart.over_price: every heuristic candidate it skips, built, is over a budget (the
    $/h one, or the $/step one at the config's proven step bound), at budgets on the plans' own
    values; and it skips some."""
    from milp_plan.formulations.placement import build_plan
    from milp_plan.heuristics import warmstart
    spec = write_instance(tmp_path, layers=6, gpn=2, counts=(2, 2), prices=(8.0, 2.0), fast_ms=(1.0, 2.0),
                          slow_ms=(2.5, 5.0))
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": 4}))
    skipped = 0
    for coef in prepare(inst).coefs:
        built = [(c, build_plan(inst, coef.cfg, [coef.options[o] for o in c[0]], c[1], c[2], None))
                 for c in warmstart.candidates(coef)]
        for plan in [p for _, p in built][:2]:
            for limits in (Limits("min-time", budget_usd_per_step=plan.predicted.usd_per_step * (1 - 1e-7)),
                           Limits("min-time", budget_usd_per_hour=plan.predicted.usd_per_hour * (1 - 1e-7))):
                least = full_bound(coef, limits) or 0.0
                for (opts, _, _), p in built:
                    if warmstart.over_price(coef, limits, opts, least):
                        skipped += 1
                        assert not limits.admit(p), (coef.cfg.label(), limits)
    assert skipped > 0


def test_path_rounds_under_a_budget_keep_every_config_optimum(tmp_path, monkeypatch):
    """Under a $/step budget each CP-SAT round after a critical path is added starts from the
    bound the last round proved (PipelineModel.add_objective_floor). Every config's model solved
    on its own (cutoff just above its optimum, so the $/step big-M proves fast) must still end
    at brute force's optimum of that config: transfers comparable to stage time, so plans'
    critical paths differ and rounds happen (counted)."""
    from milp_plan import predict
    from milp_plan.deadline import Deadline
    from milp_plan.solvers import driver
    from instances import COMPARABLE_BW
    from test_bounds import config_optimum
    spec = write_instance(tmp_path, layers=6, gpn=2, counts=(2, 2), prices=(8.0, 2.0), bw=COMPARABLE_BW[0],
                          billing=("node", "gpu"))
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": 4}))
    rounds = []
    real = predict.critical_path
    monkeypatch.setattr(predict, "critical_path", lambda i, p: rounds.append(1) or real(i, p))
    fastest = bruteforce.solve(inst, Limits()).plan
    limits = Limits("min-time", budget_usd_per_step=fastest.predicted.usd_per_step * 0.93)
    for coef in prepare(inst).coefs:
        best = config_optimum(inst, coef, limits)
        if not coef.options or best == math.inf:
            continue
        plan, bound = driver._solve_config(coef, limits, "cpsat", best * 1.01, None, Deadline(60.0), 1, 0.0)
        assert plan is not None, coef.cfg.label()
        assert best * (1 - 1e-9) <= plan.predicted.step_time_s <= best * (1 + 1e-4), (coef.cfg.label(), best)
    assert rounds


def test_a_recomputing_config_is_never_better_than_its_dominating_twin(tmp_path):
    """driver.Prepared.twin: where a recomputing Megatron config has a twin (recompute none)
    that holds a stage's most layers at every position, the twin's best admitted plan is at
    least as good under every objective and limit (brute force over both configs), so a bound
    proved for the twin holds for it; with binding memory (a few MiB a GPU) some configs have
    no twin, and some do."""
    from test_bounds import config_optimum
    spec = write_instance(tmp_path, layers=4, gpn=2, counts=(2, 2), prices=(8.0, 2.0), fast_ms=(1.0, 2.0),
                          slow_ms=(2.5, 5.0), memory_gib=(0.004, 0.003, None))
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": 4}))
    prepared = prepare(inst)
    fastest = bruteforce.solve(inst, Limits()).plan
    t, usd = fastest.predicted.step_time_s, fastest.predicted.usd_per_step
    every = [Limits(), Limits("min-cost", time_limit_s=1.5 * t), Limits("min-time", budget_usd_per_step=0.9 * usd),
             Limits("min-time", budget_usd_per_hour=10.0)]
    twins = lonely = 0
    for i, cfg in enumerate(prepared.configs):
        if cfg.uniform.recompute == "none":
            continue
        twin = prepared.twin(cfg)
        if twin is None:
            lonely += 1
            continue
        twins += 1
        mine, theirs = prepared.coef(i), prepared.coef(prepared.configs.index(twin))
        for limits in every:
            assert config_optimum(inst, theirs, limits) <= config_optimum(inst, mine, limits) * (1 + REL), \
                (cfg.label(), limits)
    assert twins > 0 and lonely > 0


def test_the_coupled_cost_bound_never_exceeds_the_config_optimum_and_bites(tmp_path):
    """coupled_cost_bound (min-cost under a time limit and a $/step budget): at time limits on
    the plans' own step times, the full bound is at most the config's cheapest admitted plan,
    None only where none is admitted, and somewhere above budget_bound's."""
    spec = write_instance(tmp_path, layers=6, gpn=2, counts=(2, 2), prices=(8.0, 2.0), fast_ms=(1.0, 2.0),
                          slow_ms=(2.5, 5.0))
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": 4}))
    bites = 0
    for coef, plans in _coupled_configs(inst):
        times = sorted({p.predicted.step_time_s for p in plans})
        loose = 2 * max(p.predicted.usd_per_step for p in plans)
        for t in {times[round(i * (len(times) - 1) / (BUDGETS - 1))] for i in range(BUDGETS)}:
            for limit in (t, t * (1 - 1e-7)):
                limits = Limits("min-cost", time_limit_s=limit, budget_usd_per_step=loose)
                best = min([p.predicted.usd_per_step for p in plans if limits.admit(p)], default=math.inf)
                got = full_bound(coef, limits)
                if got is None:
                    assert best == math.inf, (coef.cfg.label(), limit, "None but a plan exists", best)
                    continue
                assert got <= best * (1 + REL), (coef.cfg.label(), limit, got, best)
                lb = config_lower_bound(coef, limits, memory=True)
                bites += got > budget_bound(coef, limits, lb) * (1 + 1e-6)
    assert bites > 0
