"""The full bound's end-stage terms (bounds._EndStages, formulations/pipeline.md "The end stages
at Z") against exhaustive enumeration: at each steady-period point Z the first and the last
stage hold at least the layers the other stages cannot hold at Z, so z >= each end's least
time there, and stage 0's reduction and tied all-reduce are read at those layers per option.
tests/test_bounds.py checks every bound against every config's optimum on random instances;
here the terms are shown load-bearing and their pieces checked by brute force.
"""
from __future__ import annotations

import math
import random

from milp_plan.formulations.space import free_completions
from milp_plan.instance import InstanceSpec, build_instance
from milp_plan.job import Limits
from milp_plan.solvers import bounds
from milp_plan.solvers.bounds import _least_time, config_lower_bound, usable_options
from milp_plan.solvers.driver import prepare
from instances import COMPARABLE_BW, write_instance
from test_bounds import _coef, config_optimum

REL = 1e-9


def test_least_time_is_the_least_over_the_recompute_counts_that_fit():
    """bounds._least_time(o, s, n) on the default instance, where the A10's 24 GB force
    recomputing: the least a n + rho r + c over r = 0 (no full recompute) or 1 <= r <= n whose
    memory a_m n + rho_m r + c_m fits the capacity at position s, by enumeration of r (None
    when none fits; the bound's slack of 1e-6 of the capacity may admit one more n). Some
    case must need more than one recompute (load-bearing)."""
    inst = build_instance(InstanceSpec(model="gpt3-6.7b", global_batch_size=256))
    prepared = prepare(inst, None, "free")
    rng = random.Random(11)
    complete = [cfg for coef in rng.sample(prepared.coefs, 10)
                for cfg in free_completions(prepared.inst, coef.cfg, prepared.fix)]
    forced = 0
    for cfg in rng.sample(complete, min(16, len(complete))):
        coef = _coef(prepared, cfg)
        for o in range(len(coef.options)):
            cap = coef.capacity(o)
            for s in sorted({0, cfg.pp - 1}):
                t, mem = coef.time(o, s)[0], coef.memory(o, s)
                for n in range(1, inst.model.num_layers + 1):
                    rs = range(1, n + 1) if coef.full(o) else [0]
                    fits = [r for r in rs if mem(n, r) <= cap]
                    got = _least_time(coef, o, s, n)
                    if not fits:
                        assert got is None or any(mem(n, r) <= cap * (1 + 1e-6) for r in rs), (cfg.label(), o, s, n)
                        continue
                    assert got is not None and got <= min(t(n, r) for r in fits) * (1 + REL), (cfg.label(), o, s, n)
                    assert got >= min(t(n, r) for r in rs) * (1 - REL)
                    forced += coef.full(o) and min(fits) > 1
    assert forced > 0


def _without_end_stages(coef, limits):
    """The full bound with the end-stage terms off (what it was before them)."""
    of = bounds._EndStages.of
    bounds._EndStages.of = classmethod(lambda cls, *a, **k: None)
    try:
        return config_lower_bound(coef, limits)
    finally:
        bounds._EndStages.of = of


def test_end_stages_lift_free_bounds_to_their_optimum_and_never_past_it(tmp_path):
    """A small free instance (one fast and two slow single-GPU nodes, 4 MB GPUs so that memory
    binds, slow links, 2 samples per step): every complete config's full bound is at most its
    exhaustive optimum, and the end terms lift some config's bound from below 97% of its
    optimum to within 1% of it (without them the bound reads stage 0's reduction at one layer
    and z at the bottleneck's a n alone)."""
    spec = write_instance(tmp_path, layers=4, gpn=1, counts=(1, 2), bw=COMPARABLE_BW[1], memory_gib=(0.004, 0.004, None),
                          fast_ms=(0.5, 1.0), slow_ms=(0.5, 1.0))
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": 2}))
    prepared, limits, tight = prepare(inst, None, "free"), Limits(), 0
    for parent in prepared.coefs:
        for cfg in free_completions(inst, parent.cfg):
            coef = _coef(prepared, cfg)
            lb, best = config_lower_bound(coef, limits), config_optimum(inst, coef, limits)
            assert (best == math.inf) if lb is None else lb <= best * (1 + REL), (cfg.label(), lb, best)
            if lb is not None and usable_options(coef, limits) is not None:
                before = _without_end_stages(coef, limits)
                assert before is None or before <= lb * (1 + REL)   # the terms only lift
                tight += best < math.inf and lb >= 0.99 * best and before < 0.97 * best
    assert tight > 0


def test_stage_zero_options_count_their_time_and_tail_together():
    """bounds.EndTerms.step, hand case: stage 0 may run option A (time 1.0 s, tail 3.0 s over the
    bound's) or B (1.5 s, tail 0); the last stage takes at least 0.8 s. With w_z = 4, w_sum = 1,
    z = 0.5, S = 3 and rest = 0.25: A gives 4 x max(0.8, 1.0) + 3.0 = 7.0, B 4 x 1.5 + 0 = 6.0,
    so T >= 3 + 0.25 + 6.0 = 9.25 (a plan may run B). Separate minima (time 1.0, tail 0) would
    give 7.25, A's pair alone 10.25 (too much). The front keeps the options no other beats in
    both time and tail. The chain term (w S + c) is a floor of its own, and so is the last
    stage's own tail path."""
    from milp_plan.solvers.bounds import EndCase, EndTerms, _pairs_front
    assert _pairs_front([(1.5, 0.0), (1.0, 2.0), (2.0, 0.5), (1.0, 2.5)]) == ((1.0, 2.0), (1.5, 0.0))
    terms = EndTerms((EndCase(_pairs_front([(1.0, 3.0), (1.5, 0.0)]), 0.8, 0.0, 0.0),))
    assert terms.step(4.0, 1.0, 0.5, 3.0, 0.25) == 3.0 + 0.25 + 6.0
    terms = EndTerms((EndCase(_pairs_front([(1.0, 2.0), (1.5, 0.0)]), 0.8, 0.0, 0.0),))
    assert terms.step(4.0, 1.0, 0.5, 3.0, 0.25) == 9.25
    assert EndTerms((EndCase(((1.0, 0.0),), 1.2, 20.0, 0.0),), 0.5).step(4.0, 1.0, 0.5, 3.0, 0.25) == 0.5 * 3.0 + 20.0
    assert EndTerms((EndCase(((1.0, 0.0),), 1.2, 0.0, 30.0),), 0.0, 0.5).step(4.0, 1.0, 0.5, 3.0, 0.25) == 0.5 * 3.0 + 30.0


def test_the_ends_node_types_are_taken_together():
    """bounds.EndTerms.step over the ends' type pairs, hand case: types X and Y host one stage
    each (pp 2), so one end runs on each. Stage 0 on X takes 1.0 s, on Y 2.0 s (tails 0); the
    last stage on X takes 1.0 s with its own tail path at 12.0 s, on Y 2.0 s with 3.0 s. With
    w_z = 4, w_sum = 1, z = 0.5, S = 3 and rest = 0.25: (X, Y) gives z = 2.0, 3.25 + 4 x 2.0 =
    11.25 (own path 3.0); (Y, X) gives z = 1.0, 3.25 + 4 x 2.0 = 11.25, own path 12.0, so 12.0;
    the bound is 11.25. Each end at its own least (X first, X last) would give 3.25 + 4 x 1.0 =
    7.25 with the own path at its least, 3.0: a pair no plan has."""
    from milp_plan.solvers.bounds import EndCase, EndTerms
    x0, y0, x1, y1 = ((1.0, 0.0),), ((2.0, 0.0),), (1.0, 12.0), (2.0, 3.0)
    cases = (EndCase(x0, y1[0], 0.0, y1[1]), EndCase(y0, x1[0], 0.0, x1[1]))
    assert EndTerms(cases).step(4.0, 1.0, 0.5, 3.0, 0.25) == 11.25
    assert EndTerms(cases + (EndCase(x0, x1[0], 0.0, y1[1]),)).step(4.0, 1.0, 0.5, 3.0, 0.25) == 7.25


def test_the_last_stages_own_tail_lifts_bounds_below_each_configs_optimum():
    """The last stage's own tail path (Schedule.tail_path: the fill's forwards, its m micro-batches,
    its reduction and tied all-reduce, EndTerms.w_own / c_own) on two-type-32 (16 A100 + 16 A10
    GPUs, real profiles), Megatron mode: on some interleaved configs the A10s' reduction at the
    last stage outlasts the drain back to stage 0, and the bound rises by more than 5% (tp 1,
    dp 8, pp 4, micro-batch 1, vpp 4: 2.392 -> 2.541 s against its optimum 2.716 s). Every
    lifted config's bound stays at or below its optimum, solved exactly by CP-SAT."""
    from milp_plan.deadline import Deadline
    from milp_plan.solvers import driver
    inst = build_instance(InstanceSpec(cluster="two-type-32", model="gpt3-6.7b", global_batch_size=256))
    prepared, limits = prepare(inst, None, "megatron"), Limits()
    terms_at = bounds._EndStages._terms_at

    def without_own(self, z, below):
        got = terms_at(self, z, below)
        return None if got is None else got._replace(w_own=0.0, cases=tuple(c._replace(c_own=0.0) for c in got.cases))
    lifted = []
    for coef in prepared.coefs:
        if coef.cfg.pp < 4 or coef.cfg.uniform.tp > 1 or coef.cfg.uniform.mbs > 2:
            continue   # where the lifts are (the test's cost: about 200 bounds and a few solves)
        lb = config_lower_bound(coef, limits)
        bounds._EndStages._terms_at = without_own
        try:
            before = config_lower_bound(_coef(prepared, coef.cfg), limits)
        finally:
            bounds._EndStages._terms_at = terms_at
        if lb is not None and before is not None and lb > before * (1 + REL):
            lifted.append((lb / before, lb, coef))
    assert max(lifted, key=lambda x: x[0])[0] > 1.05
    for _, lb, coef in lifted:
        plan, _ = driver._solve_config(coef, limits, "cpsat", None, None, Deadline(60.0), 1, 0.0)
        assert plan is not None and lb <= plan.predicted.step_time_s * (1 + REL), coef.cfg.label()
