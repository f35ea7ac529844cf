"""The GPU-budget bound of a free parent (solvers/parent_bounds.py) against brute force.

The bound's pieces: least_layer_sum (the least stage-time sum of pp stages sharing a GPU
budget, by Lagrange duality at a vertex of the layer splits) against every split of the
layers, solved on its own; least_step (its minimum over the steady period Z) against a dense
grid of Z and against every small pipeline of whole GPUs; and gpu_budget_bound on every config
(parents and their completions) of random small free instances against the exhaustive
optimum of what lies below it.
"""
from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import HealthCheck, assume, given, settings

import milp_plan.solvers.driver as drv
from milp_plan.deadline import Deadline
from milp_plan.instance import InstanceSpec, build_instance
from milp_plan.job import Limits
from milp_plan.solvers import bruteforce
from milp_plan.solvers.bounds import config_lower_bound
from milp_plan.solvers.parent_bounds import gpu_budget_bound, least_layer_sum, least_step
from instances import EXAMPLES, limits_for, small_free_instances, write_instance
from test_bounds import REL, config_optimum


def splits(L: int, pp: int):
    """Every split of L layers over pp stages of at least one layer each."""
    for cuts in itertools.combinations(range(1, L), pp - 1):
        yield [b - a for a, b in zip((0,) + cuts, cuts + (L,))]


def split_least_sum(n: list[int], C: float, Z: float) -> float:
    """min sum_s x_s over 0 < x_s <= Z with sum_s n_s / x_s <= C, for one split n (convex: x_s =
    min(Z, sqrt(lam n_s)), lam by bisection until the budget is met); inf when L / Z > C."""
    if sum(n) / Z > C * (1 + 1e-12):
        return math.inf
    def used(lam: float) -> float:
        return sum(k / min(Z, math.sqrt(lam * k)) for k in n)
    lo, hi = 0.0, 1.0
    while used(hi) > C:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if used(mid) > C else (lo, mid)
    return sum(min(Z, math.sqrt(hi * k)) for k in n)


def test_least_layer_sum_by_hand():
    # pp 2, L 5, C 1: unbounded, the split (1, 4) with x = (3, 6): 1/3 + 4/6 = 1, sum 9 = (1 + sqrt 4)^2;
    # at Z 5 the 4-layer stage is capped: x = 5 uses 4/5, the other needs 1 / (1/5) = 5: sum 10
    # (the split (2, 3) also gives 5 + 5); below Z = L / C = 5 nothing meets the budget
    assert least_layer_sum(math.inf, 1.0, 2, 5) == pytest.approx(9.0)
    assert least_layer_sum(5.0, 1.0, 2, 5) == pytest.approx(10.0)
    assert least_layer_sum(4.9, 1.0, 2, 5) == math.inf


@pytest.mark.parametrize("L,pp", [(5, 1), (5, 2), (6, 3), (8, 4), (9, 2), (7, 7)])
def test_least_layer_sum_is_the_least_over_every_split(L, pp):
    """Equal (not only below): the vertex split (pp - 1 stages of one layer) is the minimiser."""
    C = 2.0
    for Z in (L / C, L / C * 1.05, 1.3, 2.0, 3.0, 5.0, math.inf):
        if Z < L / C:
            continue
        brute = min(split_least_sum(n, C, Z) for n in splits(L, pp))
        assert least_layer_sum(Z, C, pp, L) == pytest.approx(brute, rel=1e-6), (Z, L, pp)


def test_least_step_by_hand_where_the_fastest_option_binds():
    """GPUs to spare (C = 1e9): only the per-layer floor a_min = 1 binds. pp 2, L 5: some stage
    holds >= 3 layers, so Z >= 3, and S >= 5 a_min = 5: T >= 3 max(3, 5 / 2) + 5 = 14, which
    the split (3, 2) at one second a layer reaches."""
    assert least_step(3.0, 1.0, 0.0, 0.0, 1e9, 1.0, 2, 5) == pytest.approx(14.0)


@pytest.mark.parametrize("w_z,w_sum,pp,L,a_min", [(7.0, 1.0, 3, 9, 0.0), (3.0, 1.0, 4, 8, 0.2), (15.0, 0.5, 2, 6, 0.05),
                                                  (0.0, 1.0, 5, 10, 0.0), (4.0, 0.0, 3, 7, 0.0)])
def test_least_step_is_the_least_over_z(w_z, w_sum, pp, L, a_min):
    """Below the value at every Z of a dense grid, and within 0.1% of their least."""
    C, rest, extra = 4.0, 0.3, 0.1
    got = least_step(w_z, w_sum, rest, extra, C, a_min, pp, L)
    z0 = max(L / C, a_min * math.ceil(L / pp))
    s_inf = max(least_layer_sum(math.inf, C, pp, L), L * a_min)
    values = []
    for i in range(4000):
        Z = z0 * 1.001 ** i
        S = extra + max(least_layer_sum(Z, C, pp, L), s_inf)
        values.append(w_z * max(Z, S / pp) + w_sum * S + rest)
    assert got <= min(values) * (1 + 1e-12)
    assert got >= min(values) * (1 - 1e-3)


@pytest.mark.parametrize("G,pp,L", [(4, 2, 5), (6, 3, 6), (5, 4, 7), (8, 3, 9)])
def test_least_step_bounds_every_pipeline_of_whole_gpus(G, pp, L):
    """One GPU type at w GPU-seconds a layer: every pipeline of pp stages (g_s >= 1 GPUs, sum
    <= G, n_s >= 1 layers) has T = w_z max_s t_s + w_sum sum_s t_s, t_s = n_s w / g_s; the bound
    (C = G / w) is below each, and near the best where the stages can split the GPUs evenly."""
    w, w_z, w_sum = 0.5, 6.0, 1.0
    best = math.inf
    for n in splits(L, pp):
        for g in itertools.product(range(1, G + 1), repeat=pp):
            if sum(g) <= G:
                t = [k * w / x for k, x in zip(n, g)]
                best = min(best, w_z * max(t) + w_sum * sum(t))
    got = least_step(w_z, w_sum, 0.0, 0.0, G / w, 0.0, pp, L)
    assert got <= best * (1 + REL)
    assert got >= 0.75 * best   # the relaxation (real GPUs, real layers) stays close


def assert_budget_bound_valid(inst, prepared, coef, limits) -> float:
    """gpu_budget_bound of this config and of every config below it never exceeds the best
    admitted plan below it (None: there is none); returns that optimum."""
    if coef.cfg.complete:
        best = config_optimum(inst, coef, limits)
    else:
        best = min([assert_budget_bound_valid(inst, prepared, kid, limits) for kid in prepared.children(coef)],
                   default=math.inf)
    lb = gpu_budget_bound(coef, limits)
    assert (best == math.inf) if lb is None else lb <= best * (1 + REL), (coef.cfg.label(), lb, best)
    return best


@settings(max_examples=5 * EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
@given(small_free_instances())
def test_budget_bound_never_exceeds_what_lies_below(tmp_path_factory, case):
    kw, gbs, objective, flash = case
    spec = write_instance(tmp_path_factory.mktemp("inst"), **kw)
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": gbs, "flash_attention": flash}))
    assume(sum(bruteforce.count_candidates(inst, c) for c in bruteforce.solved_configs(inst, None, "free")) <= 6_000)
    fastest = bruteforce.solve(inst, Limits(), mode="free")
    assume(fastest.plan is not None)
    limits = limits_for(objective, fastest.plan)
    prepared = drv.prepare(inst, None, "free")
    for coef in prepared.coefs:
        assert_budget_bound_valid(inst, prepared, coef, limits)


def test_budget_bound_lifts_a_deep_parent_to_its_optimum(tmp_path):
    """8 one-GPU nodes (4 of each type, the same times: a block's f + b is 3 ms a sample), 8
    layers, pp 8, 8 samples per micro-batch (m = 1): 8 stages of >= 1 GPU on 8 GPUs hold one
    GPU and one layer each, t = 8 x 3 = 24 ms, T = sum_s t_s = 192 ms (1F1B, m - 1 = 0). The
    parent's pooled bound lets each stage run at the 8-GPU stage's pace (dp 8: 3 ms a layer)
    and gives 48 ms. The budget bound: w = 24 GPU-ms a layer for every option, C = 8 / w, the
    vertex split of 8 layers over 8 stages is one each: S >= (7 + sqrt 1)^2 / C = 8 w = 192 ms."""
    spec = write_instance(tmp_path, layers=8, gpn=1, counts=(4, 4), fast_ms=(1.0, 2.0), slow_ms=(1.0, 2.0))
    inst = build_instance(InstanceSpec(**{**spec.__dict__, "global_batch_size": 8}))
    prepared = drv.prepare(inst, {"pp": 8}, "free")
    parent = next(c for c in prepared.coefs if c.cfg.samples == 8 and c.cfg.schedule == "1f1b")
    limits = Limits()
    # (every plan below the parent is at 192 ms plus 3 us of transfers: the hand optimum; its brute
    # force takes 15 s, the random cases above check the bound against brute force)
    assert config_lower_bound(parent, limits, memory=True) == pytest.approx(0.048, rel=1e-4)
    assert gpu_budget_bound(parent, limits) == pytest.approx(0.192, rel=1e-4)


@pytest.mark.parametrize("cluster, model, gbs", [("default", "gpt3-6.7b", 256), ("scale-1024", "gpt3-175b", 1536)])
def test_budget_bound_asked_for_enough_is_exact_below_it(cluster, model, gbs):
    """gpu_budget_bound(enough=E) (the search passes its incumbent to the root bounds): the exact
    bound where that is below E, at least E where the exact one is, None exactly where it is
    None; and under a time limit (which may rule out the exact bound's plans, not a smaller
    bound's) the exact bound whatever E. On the simulated basis (the default: several weight
    pairs) and the closed form (scale-1024: one); the early exit takes place."""
    inst = build_instance(InstanceSpec(cluster=cluster, model=model, global_batch_size=gbs))
    parents = [c for c in drv.prepare(inst, None, "free").coefs if not c.cfg.complete][::7]
    short = 0
    for coef in parents:
        exact = gpu_budget_bound(coef, Limits())
        ref = exact if exact is not None else 1.0
        for enough in (ref * 0.97, ref, ref * 1.0001, ref * 1.5, math.inf):
            got = gpu_budget_bound(coef, Limits(), enough)
            if exact is None or exact < enough:
                assert got == exact, (coef.cfg.label(), enough)
            else:
                assert got >= enough, (coef.cfg.label(), enough, got, exact)
                short += got < exact
        timed = Limits(time_limit_s=ref * 1.2)
        assert gpu_budget_bound(coef, timed, ref * 0.5) == gpu_budget_bound(coef, timed)
    assert short >= len(parents) // 2


def test_capacity_is_at_least_what_any_option_per_type_achieves():
    """The default instance (free root, real profiles: options differ in GPU-seconds a layer):
    every node type's GPUs all running one of its options do at most C layer-micro-batches a
    second between them, for every choice of one option per type (C takes each type's most
    efficient); a_min is the least per-layer time of any option."""
    from milp_plan.solvers.parent_bounds import capacity
    inst = build_instance(InstanceSpec())
    prepared = drv.prepare(inst, None, "free")
    coef = next(c for c in prepared.coefs if c.cfg.pp == 4)
    C, a_min = capacity(coef, Limits())
    ends = sorted({0, 1, coef.cfg.pp - 1})
    pace = {}
    for o, opt in enumerate(coef.options):
        a = min(coef.time(o, s)[0].a for s in ends)
        assert a_min <= a
        nt = coef.types[opt.k]
        pace.setdefault(opt.k, []).append(nt.count * nt.gpus_per_node / (a * opt.group))
    assert len(pace) == 2 and len({round(p, 6) for p in pace[0]}) > 1   # the options' efficiency differs
    for choice in itertools.product(*pace.values()):
        assert sum(choice) <= C * (1 + 1e-12)
    assert C == pytest.approx(sum(max(p) for p in pace.values()))


def test_a_popped_parent_is_pruned_by_its_bounds_exactly_at_the_incumbent(monkeypatch):
    """The search (driver._solve) reads a popped free parent's cheap bound (config_lower_bound
    without memory, asked for the incumbent less REL_EPS) before its full bound: it prunes the
    parent where that bound reaches the incumbent, and full-bounds it where it does not; it
    opens a full-bounded parent exactly where its full bound is below the incumbent. On the
    default instance (GPT-3 6.7B, batch 256) 10 of its 285 parents' cheap bounds reach the
    incumbent and 4 lie within 3% below it; 120 of the full bounds reach it and 3 lie within 1%
    below it: a rule that pruned 3% (1%) early, or never, fails."""
    calls = []
    cheap, full, children = drv.config_lower_bound, drv.full_bound, drv.Prepared.children

    def spy_cheap(coef, limits, memory=True, *a, **k):
        got = cheap(coef, limits, memory, *a, **k)
        if not memory and not coef.cfg.complete and "enough" in k:
            calls.append(("cheap", coef.cfg, got, k["enough"]))
        return got

    def spy_full(coef, *a, **k):
        got = full(coef, *a, **k)
        calls.append(("full", coef.cfg, got, k.get("enough")))
        return got

    def spy_children(prepared, coef):
        calls.append(("open", coef.cfg))
        return children(prepared, coef)
    monkeypatch.setattr(drv, "config_lower_bound", spy_cheap)
    monkeypatch.setattr(drv, "full_bound", spy_full)
    monkeypatch.setattr(drv.Prepared, "children", spy_children)
    inst = build_instance(InstanceSpec(cluster="default", model="gpt3-6.7b", global_batch_size=256))
    res = drv.solve(inst, Limits(), mode="free", dl=Deadline(600.0, work=30))
    assert res.status == "optimal"
    pruned = near = full_pruned = full_near = 0
    for i, call in enumerate(calls):
        after = calls[i + 1][:2] if i + 1 < len(calls) else None
        if call[0] == "cheap":
            _, cfg, lb, enough = call
            assert lb is not None and enough < math.inf
            assert (after == ("full", cfg)) == (lb < enough), (cfg.label(), lb, enough)
            pruned += lb >= enough
            near += 0.97 * enough <= lb < enough
        elif call[0] == "full" and not call[1].complete:
            _, cfg, lb, enough = call
            assert lb is not None and enough < math.inf
            assert (after == ("open", cfg)) == (lb < enough), (cfg.label(), lb, enough)
            full_pruned += lb >= enough
            full_near += 0.99 * enough <= lb < enough
    assert pruned >= 5 and near >= 2 and full_pruned >= 50 and full_near >= 2, (pruned, near, full_pruned, full_near)
