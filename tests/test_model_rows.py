"""The per-config model's redundant rows remove no plan.

The rows (formulations/pipeline.md, "add_pool_work" and "Pair flows") only tighten the LP
relaxation: every plan of a config must still be a solution of its model. Checked two ways
on small free instances of three node types (pools hosting several stages, memory that
binds): every admitted plan of every complete config, pinned in the model (its y, n, r fixed
by CP-SAT's fix_variables_to_their_hinted_value), is feasible with a model objective at most
the plan's own (the model is a relaxation); and each config's model, solved on its own (no
heuristic, no cutoff), reaches brute force's optimum of the config.
"""
from __future__ import annotations

import math

import pytest

from milp_plan import predict
from milp_plan.deadline import Deadline
from milp_plan.formulations.pipeline import PipelineModel
from milp_plan.instance import InstanceSpec, build_instance
from milp_plan.job import Limits
from milp_plan.result import objective_of
from milp_plan.solvers import bruteforce, driver
from milp_plan.solvers.backends import make_backend
from milp_plan.solvers.driver import PROOF_TOL
from instances import COMPARABLE_BW, write_instance
from test_trust import _completions

# (write_instance keywords, global batch, limits, every k-th admitted plan pinned): three node
# types of 1-GPU nodes, so a pool hosts up to two stages (a third to half of the plans); in the
# second case memory binds (0.003 GiB on the fast type: recompute and the option differ between
# positions), hops cost time, the fast type is billed per GPU and the objective is min-cost
CASES = [
    (dict(layers=3, gpn=1, counts=(2, 2), third=True), 2, Limits(), 1),
    (dict(layers=4, gpn=1, counts=(2, 1), third=True, memory_gib=(0.003, None, None), bw=COMPARABLE_BW[0],
          billing=("gpu", "node")), 2, Limits("min-cost", time_limit_s=1.0), 5),
]


def _instance(tmp, kw, gbs):
    spec = write_instance(tmp, **kw)
    return build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": gbs}))


def complete_configs(prepared):
    """Every complete config below the free search's parents (test_trust._completions)."""
    return [kid for c in prepared.coefs for kid in _completions(prepared, c)]


def _free_configs(inst):
    return complete_configs(driver.prepare(inst, None, "free"))


def _pinned(coef, limits, cand):
    """The model's run with the plan `cand` (options, layers, recomputed layers) pinned."""
    be = make_backend("cpsat")
    model = PipelineModel(coef, limits, be)
    model.build()
    model.hint(*cand)
    be.parameters["fix_variables_to_their_hinted_value"] = True
    return model, be.solve(10.0, 1, 1, work=5.0)


@pytest.mark.parametrize("case, basis", [(0, predict.SIMULATED), (0, predict.CLOSED_FORM), (1, predict.CLOSED_FORM)])
def test_every_plan_of_every_free_config_solves_its_model(tmp_path, monkeypatch, case, basis):
    """add_pool_work rows exist on the closed-form basis only (add_steady_period); the pair
    flows on both."""
    if basis == predict.CLOSED_FORM:
        monkeypatch.setattr(predict, "STEP_SIM_MAX_OPERATIONS", 0)
    kw, gbs, limits, every = CASES[case]
    inst = _instance(tmp_path, kw, gbs)
    pinned = multi = 0
    for coef in _free_configs(inst):
        admitted = [p for p in bruteforce.candidate_plans(inst, coef.cfg) if limits.admit(p)]
        for plan in admitted[::every]:
            cand = driver.candidate_of(coef, plan)
            if cand is None:   # an option the config's space drops as dominated
                continue
            model, run = _pinned(coef, limits, cand)
            assert run.status in ("optimal", "feasible"), (coef.cfg.label(), cand, run.status)
            value = objective_of(plan, limits)
            assert model.objective_in_units(run.objective) <= value * (1 + 1e-9) + 1e-12, (coef.cfg.label(), cand)
            pinned += 1
            multi += len({coef.pool_of[o] for o in cand[0]}) < len(cand[0])
    assert pinned >= 100 and multi >= 40   # plans enough, many with a pool hosting two stages


def _with_optima(inst, limits):
    """(coef, its brute-force optimum, inf when it has no plan) of every free config with options."""
    from test_bounds import config_optimum
    for coef in _free_configs(inst):
        if coef.options:
            yield coef, config_optimum(inst, coef, limits)


@pytest.mark.parametrize("basis", [predict.SIMULATED, predict.CLOSED_FORM])
def test_every_free_config_model_alone_reaches_its_optimum(tmp_path, monkeypatch, basis):
    """No heuristic and no cutoff (driver._solve_model): the rows must not cut the optimum."""
    if basis == predict.CLOSED_FORM:
        monkeypatch.setattr(predict, "STEP_SIM_MAX_OPERATIONS", 0)
    kw, gbs, limits, _ = CASES[0]
    inst = _instance(tmp_path, kw, gbs)
    solved = 0
    for coef, best in _with_optima(inst, limits):
        plan, bound = driver._solve_model(coef, limits, "cpsat", None, None, Deadline(60.0, work=30.0), 1, 0.0)
        if best == math.inf:
            assert plan is None
            continue
        got = objective_of(plan, limits)
        assert best * (1 - 1e-9) <= got <= best * (1 + PROOF_TOL), (coef.cfg.label(), got, best)
        solved += 1
    assert solved >= 50


def test_a_run_closed_near_the_bound_returns_the_optimum_or_solves_on(tmp_path, monkeypatch):
    """driver._solve_model closes a config's run at a plan within CLOSE_GAP of the bound it is
    given (CpsatBackend.solve's stop_at). Given each config's brute-force optimum as its bound,
    the plan returned is within PROOF_TOL / 2 of it and the bound returned at most it; given
    0.9 x it with CLOSE_GAP = 0.2 (the run may close at plans up to 8% above the optimum), a
    plan priced more than PROOF_TOL / 2 above that bound is solved on, so the optimum is still
    returned."""
    kw, gbs, limits, _ = CASES[0]
    inst = _instance(tmp_path, kw, gbs)
    solved = 0
    for coef, best in _with_optima(inst, limits):
        if best == math.inf:
            continue
        for lb, gap in ((best, driver.CLOSE_GAP), (0.9 * best, 0.2)):
            monkeypatch.setattr(driver, "CLOSE_GAP", gap)
            plan, bound = driver._solve_model(coef, limits, "cpsat", None, None, Deadline(60.0, work=30.0), 1, lb)
            got = objective_of(plan, limits)
            assert best * (1 - 1e-9) <= got <= best * (1 + PROOF_TOL / 2) and bound <= best * (1 + 1e-9), \
                (coef.cfg.label(), lb, got, best, bound)
        solved += 1
    assert solved >= 50
