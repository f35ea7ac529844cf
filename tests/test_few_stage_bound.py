"""The full bound of a complete three-stage config on the simulated basis
(bounds._few_stage_bound, formulations/pipeline.md "A few stages: every split"): over every
split of the layers into three stages and every tuple of stage options, the longest of the step
graph's known paths at each stage's least forward, backward and reduction within memory. Here:
its branch and bound against plain enumeration, and the bound against every complete config's
exhaustive optimum (never past it, and lifting some to it)."""
from __future__ import annotations

import itertools
import math
import random

import numpy as np

from milp_plan.formulations.space import free_completions
from milp_plan.instance import InstanceSpec, build_instance
from milp_plan.job import Limits
from milp_plan.schedules import schedule_of
from milp_plan.solvers import bounds
from milp_plan.solvers.bounds import config_lower_bound
from milp_plan.solvers.driver import prepare
from test_bounds import _coef
from test_two_stage_bound import lifted_to_optimum

REL = 1e-9


def _plain_least(stages, comps, W, hops, wrap) -> float:
    """Every option tuple and split, one at a time: the least of the longest path."""
    Wf, Wb, Wh, Ww, Wd, Wq = W
    best = math.inf
    for pick in itertools.product(*(range(len(r)) for r, _ in stages)):
        for comp in comps:
            at = np.array([stages[s][0][k][comp[s]] for s, k in enumerate(pick)])     # (pp, 4)
            if not np.isfinite(at).all():
                continue
            e = max(stages[0][1][pick[0]], stages[-1][1][pick[-1]])
            d = at[:, 2].copy()
            d[0] += e
            d[-1] += e
            lengths = Wf @ at[:, 0] + Wb @ at[:, 1] + Wd @ d + Wq * at[:, 3].max() + Wh @ hops + Ww * wrap
            best = min(best, float(lengths.max()))
    return best


def test_the_branch_and_bound_finds_the_enumerated_least():
    """_least_longest_path against plain enumeration on random rows (some stages not fitting
    some layer counts), 1F1B / GPipe / interleaved paths of 3 stages: equal to the least where
    that is below the cutoff, else at least the cutoff and at most the least; with chunks of
    one split at a time too (the cut between chunks); at most the least when its cell budget
    runs out."""
    rng = random.Random(7)
    checked = cut = 0
    for trial in range(60):
        name = rng.choice(["1f1b", "gpipe", "interleaved"])
        sched = schedule_of(name, 2 if name == "interleaved" else 1)
        m, units = rng.choice([3, 6]) if name == "interleaved" else rng.choice([2, 3, 4, 6]), rng.randint(3, 9)
        W = bounds._few_stage_paths(sched, 3, m)
        comps = bounds._compositions(units, 3) - 1
        stages = []
        for s in range(3):
            k = rng.randint(1, 3)
            n = np.arange(1, units + 1, dtype=float)[None, :, None]
            rows = np.concatenate([rng.uniform(0.1, 1.0) * n, rng.uniform(0.2, 2.0) * n,
                                   np.full((1, units, 1), rng.uniform(0.0, 1.0)), 0.01 * n], axis=2)
            rows = np.repeat(rows, k, axis=0) * np.array([rng.uniform(0.7, 1.3) for _ in range(k)])[:, None, None]
            rows[:, :, 2] = rng.uniform(0.0, 1.0)     # a reduction that trades against speed
            for o in range(k):
                rows[o, rng.randint(units // 2, units):] = np.inf     # memory holds no more layers
            stages.append((rows, np.array([rng.uniform(0.0, 0.5) for _ in range(k)])))
        hops, wrap = np.array([rng.uniform(0, 0.1) for _ in range(2)]), rng.uniform(0, 0.1)
        least = _plain_least(stages, comps, W, hops, wrap)
        for cutoff in (math.inf, least * 1.01, least * 0.99):
            for cells in (bounds.FEW_STAGE_CELLS, 1):
                old = bounds.FEW_STAGE_CELLS
                bounds.FEW_STAGE_CELLS = cells
                try:
                    got, spent = bounds._least_longest_path(stages, comps, W, hops, wrap, cutoff)
                finally:
                    bounds.FEW_STAGE_CELLS = old
                assert spent > 0
                if least < cutoff:
                    assert got == least or math.isclose(got, least, rel_tol=1e-12), (trial, cutoff, got, least)
                    checked += 1
                else:
                    assert min(cutoff, least) * (1 - 1e-12) <= got <= least * (1 + 1e-12), (trial, got, least)
                    cut += 1
        # a budget spent after the relaxed pass and one chunk: still below the least
        tight_budget = len(comps) * len(W[0]) + 1
        got, _ = bounds._least_longest_path(stages, comps, W, hops, wrap, math.inf, tight_budget)
        assert got <= least * (1 + 1e-12)
    assert checked >= 100 and cut >= 30, (checked, cut)


def _without_few_stages(coef, limits):
    """The full bound without the few-stage term (what it was before it)."""
    few = bounds._few_stage_bound
    bounds._few_stage_bound = lambda *a, **k: (0.0, 0)
    try:
        return config_lower_bound(coef, limits)
    finally:
        bounds._few_stage_bound = few


def test_few_stages_lift_free_bounds_to_their_optimum_and_never_past_it(tmp_path):
    """On test_two_stage_bound's small free instance every complete three-stage config's full
    bound is at most its exhaustive optimum, the few-stage term only lifts it, lifts several,
    and lifts some from below 95% of the optimum to the optimum itself (e.g. 1F1B, 4
    micro-batches of one sample, a 2-GPU stage and two of 1: 0.0498 -> 0.0550, the optimum;
    the other terms read the stages' fewest layers and least options apart)."""
    seen, lifted, tight = lifted_to_optimum(tmp_path, 3, _without_few_stages, 0.95)
    assert seen >= 10 and lifted >= 10 and tight >= 3, (seen, lifted, tight)


def _every_option_tuple(coef, limits, caps, usable, unit) -> float:
    """The few-stage bound's step term by plain enumeration: every option tuple of every pool
    tuple a plan may have (no option dropped), every split, each path's length summed term by
    term from its PathTerms."""
    cfg, L = coef.cfg, coef.inst.model.num_layers
    pp = cfg.pp
    paths = bounds._split_paths(cfg.sched, pp, coef.m)
    comps = bounds._compositions(L // unit, pp) - 1
    least, inter = bounds._hop_floors(coef)
    sync = bounds._sync_by_end(coef, caps, usable)
    kind = {o: coef.options[o].k for o in usable}
    best = math.inf
    for opts in itertools.product(usable, repeat=pp):
        pools = [coef.pool_of[o] for o in opts]
        types = [kind[o] for o in opts]
        if any(pools.count(q) > caps[q] for q in set(pools)) or any(r not in types for r in coef.required_types) or \
                any(sum(coef.options[o].group for o in opts if kind[o] == k) > bounds._type_gpus(coef, k, limits)
                    for k in set(types)):
            continue
        rows = [bounds._stage_rows(coef, o, s, unit)[comps[:, s]] for s, o in enumerate(opts)]   # (C, 4) each
        fits = np.all([np.isfinite(r).all(axis=1) for r in rows], axis=0)
        rows = [np.where(np.isfinite(r), r, 0.0) for r in rows]
        e = max(sync[opts[0]], sync[opts[-1]])
        hops = [inter if a != b else least for a, b in zip(types, types[1:])]
        wrap = inter if types[-1] != types[0] else least
        longest = np.full(len(comps), -math.inf)
        for p in paths:
            length = sum(p.fwd[s] * rows[s][:, 0] + p.bwd[s] * rows[s][:, 1]
                         + p.dp[s] * (rows[s][:, 2] + (e if s in (0, pp - 1) else 0.0)) for s in range(pp))
            length = length + (1.0 if sum(p.opt) else 0.0) * np.max([r[:, 3] for r in rows], axis=0) \
                + sum(h * x for h, x in zip(p.hop, hops)) + p.wrap * wrap
            longest = np.maximum(longest, length)
        if fits.any():
            best = min(best, float(longest[fits].min()))
    return best


def test_dropping_dominated_options_keeps_the_bound_on_the_default():
    """On the default instance (GPT-3 6.7B, batch 256, free mode; tied embeddings, so the ends'
    all-reduce counts), six complete three-stage configs of 10 stage options or more: the
    few-stage bound, its dominated options dropped and its splits cut by branch and bound,
    equals plain enumeration over every option tuple and split."""
    inst = build_instance(InstanceSpec(cluster="default", model="gpt3-6.7b", global_batch_size=256))
    prepared, limits, done = prepare(inst, None, "free"), Limits(), 0
    for parent in prepared.coefs:
        if parent.cfg.pp != 3 or done >= 6:
            continue
        for cfg in free_completions(inst, parent.cfg):
            coef = _coef(prepared, cfg)
            placed = bounds._placed(coef, limits, True, None)
            if placed is None or len(placed[0][3]) < 10 or done >= 6:
                continue
            (caps, _, _, usable), _, _, unit, _ = placed
            got, _ = bounds._few_stage_bound(coef, limits, caps, usable, unit, 0.0)
            want = _every_option_tuple(coef, limits, caps, usable, unit)
            assert (got is None) == (want == math.inf)
            if got is not None:
                assert math.isclose(got, want * (1 - 1e-9), rel_tol=1e-12), (cfg.label(), got, want)
                done += 1
    assert done == 6
