"""The bounds' shared terms give exactly the bound a config computes on its own (issue 19).

1. `_option_terms` (memoised per OptionTermsKey) and a uniform config's options and pools (per
   coefficients.OptionsKey): every key names everything its value reads. Random configs of
   shipped instances, in both modes and under every kind of limit, are bounded twice: with a
   fresh coefficient cache each (nothing shared), and through one cache warmed by the configs
   in a random order.
2. WeakFamilyBounds (the weak family bound, its terms computed once per group of families)
   against `scalar_weak_bound`, the per-family computation it replaced, on random families.

The bounds must be equal as floats (==), None included, so the search orders and prunes the
same configs and returns the same plan."""
from __future__ import annotations

import itertools
import math
import random

import pytest

from milp_plan.formulations.coefficients import Coefficients, SharedCoefficients
from milp_plan.instance import InstanceSpec, build_instance
from milp_plan.job import Limits
from milp_plan.solvers import bounds
from milp_plan.solvers.bounds import WeakFamilyBounds, config_lower_bound, family_lower_bound
from milp_plan.solvers.driver import prepare

LIMITS = [Limits(), Limits("min-cost", time_limit_s=9.0), Limits("min-time", budget_usd_per_hour=60.0),
          Limits("min-time", budget_usd_per_step=0.19)]


def bounds_of(coef: Coefficients, limits: Limits, variants) -> list:
    """Every bound the driver asks of a config (and of its family when it has variants)."""
    got = [config_lower_bound(coef, limits, memory=False)]
    if coef.cfg.complete:
        got.append(config_lower_bound(coef, limits, memory=True))
    if len(variants) > 1:
        got += [family_lower_bound(coef, limits, variants, weak=True), family_lower_bound(coef, limits, variants),
                *config_lower_bound(coef, limits, memory=False, variants=variants)]
    return got


@pytest.mark.parametrize("mode", ["megatron", "free", "both"])
@pytest.mark.parametrize("limits", LIMITS, ids=["min-time", "min-cost", "budget-h", "budget-step"])
def test_shared_terms_give_the_bound_of_a_fresh_cache(mode, limits):
    """both: free mode's configs with its Megatron-mode start's (driver.prepare gives them one
    cache, so the free search reads what the start computed) in one random order."""
    inst = build_instance(InstanceSpec(model="gpt3-6.7b", global_batch_size=256))
    rng = random.Random(19)
    cases = []
    for space in (["megatron", "free"] if mode == "both" else [mode]):
        prepared = prepare(inst, None, space)
        families = prepared.families()
        picked = rng.sample(families, min(60, len(families)))
        if space == "free":  # parents with open stage sizes, and their children
            kids = [[k.cfg] for i in picked[:10] for k in prepared.children(prepared.coef(i[0]))]
        else:
            kids = []
        cases += [[prepared.configs[i] for i in members] for members in picked] + kids
    warm = SharedCoefficients(inst)
    # warm the shared cache in a random order first, so each config finds terms another made
    order = list(range(len(cases)))
    rng.shuffle(order)
    shared = {j: bounds_of(Coefficients(inst, cases[j][0], warm), limits, cases[j]) for j in order}
    for j, variants in enumerate(cases):
        fresh = bounds_of(Coefficients(inst, variants[0], SharedCoefficients(inst)), limits, variants)
        assert shared[j] == fresh, (variants[0].label(), shared[j], fresh)


def scalar_weak_bound(coef: Coefficients, limits: Limits, variants) -> float | None:
    """The weak family bound as config_lower_bound computed it per family before WeakFamilyBounds
    (memory=False, no bottleneck bound: z >= S / pp alone), from the bound's own helpers."""
    pairs, vpps = bounds._family_terms(coef, variants)
    cfg, L = coef.cfg, coef.inst.model.num_layers
    caps = {q: bounds._affordable_stages(coef, q, limits) for q in range(len(coef.pools))}
    O = [o for o in range(len(coef.options)) if caps[coef.pool_of[o]] > 0]
    if not O or sum(caps.values()) < cfg.pp:
        return None
    t = {o: [coef.time(o, s)[0] for s in (0, cfg.pp - 1)] for o in O}
    alts: dict = {}
    for o in O:
        alts.setdefault(coef.pool_of[o], []).append((t[o][0].a, L))
    by_type: dict = {}
    for q in sorted(alts):
        by_type.setdefault(coef.pools[q].k, []).append((coef.pools[q].group, caps[q], bounds._front(alts[q])))
    gpu_hour = {k: coef.types[k].usd_per_gpu_hour for k in by_type}
    slots = [bounds.SlotType(bounds._type_gpus(coef, k, limits), (pool,), k in coef.required_types, gpu_hour[k])
             for k, pools in sorted(by_type.items()) for pool in pools]
    least = (bounds._least_layer_sum(math.inf, slots, cfg.pp, L, 1, coupled=False),  # shared by every pp
             bounds._least_usd_per_hour(math.inf, slots, L, 1))
    if least[0] == math.inf:
        return None
    rho = min(t[o][0].rho if coef.full(o) else 0.0 for o in O)
    if cfg.pp == 1:
        ends = min(t[o][0].c for o in O)
    else:
        ends = min(t[o][0].c for o in O) + min(t[o][1].c for o in O)
    price = {o: gpu_hour[coef.options[o].k] * coef.options[o].group for o in O}
    forced = [min(price[o] for o in O if coef.options[o].k == k) for k in sorted(coef.required_types)]
    gpu_usd = sum(forced) + min(price.values()) * (cfg.pp - len(forced))
    if limits.budget_usd_per_hour is not None and gpu_usd > limits.budget_usd_per_hour * (1 + 1e-9):
        return None
    least_work = min(price[o] * t[o][0].a for o in O)
    dp = min(d(v) for d in [coef.dp_time(o, 0)[0] for o in O] for v in vpps)   # piece 0 (bounds.py)
    opt = min(coef.opt_time(o, 0).a for o in O) * math.ceil(L / cfg.pp)
    got = [bounds._finish_bound(slots, cfg, L, 1, [], 0.0, least, dp + opt + offset, ends + cfg.pp * rho, gpu_usd,
                                w_z, w_sum, limits, False, least_work)
           for w_z, w_sum, _, offset in pairs]
    return None if None in got else max(got)


@pytest.mark.parametrize("cluster,model,gbs", [("default", "gpt3-6.7b", 256), ("two-type-32", "gpt3-6.7b", 256),
                                               ("default", "gpt3-2.7b", 80), ("mixed-128", "gpt3-13b", 512)])
@pytest.mark.parametrize("limits", LIMITS, ids=["min-time", "min-cost", "budget-h", "budget-step"])
def test_weak_family_bounds_equal_the_scalar_bound(cluster, model, gbs, limits):
    inst = build_instance(InstanceSpec(cluster=cluster, model=model, global_batch_size=gbs))
    prepared = prepare(inst, None, "megatron")
    families = [ms for ms in prepared.families() if len(ms) > 1]
    rng = random.Random(19)
    picked = rng.sample(families, min(150, len(families)))
    weak = WeakFamilyBounds(limits)  # one for all, as the driver uses it: groups share terms
    for members in picked:
        variants = [prepared.configs[i] for i in members]
        got = weak.bound(variants[0], variants, make=lambda _, i=members[0]: prepared.coef(i))
        fresh = Coefficients(inst, variants[0], SharedCoefficients(inst))
        want = scalar_weak_bound(fresh, limits, variants)
        assert got == want, (variants[0].label(), got, want)
        assert family_lower_bound(fresh, limits, variants, weak=True) == want


def memory_terms(coef: Coefficients, direct: bool = False) -> tuple:
    """What the full bound reads of a config's memory: each option's room at the bound's
    positions (Coefficients.rooms, from the options' memory parts shared by every config with
    those ends) and its recompute pieces there (memoised per FitsKey: the option and each
    position's in-flight counts), its least time at the ends for layer counts up to L (per
    memory fit's key), and the options and pools left after `_undominated` (per the worst
    positions' in-flight counts). direct: computed from the config's own fits, no memo."""
    pp, L = coef.cfg.pp, coef.inst.model.num_layers
    positions = tuple(sorted({0, max(pp - 2, 0), pp - 1}))
    O = range(len(coef.options))
    if direct:
        rooms = [max(coef.layer_room(o, s) for s in positions) for o in O]
        every = bounds._every_recompute_pieces(coef, list(O), positions, dict(zip(O, rooms)))
        pieces = [every[o] for o in O]
        times = [bounds._least_time(coef, o, s, n) for o in O for s in {0, pp - 1} for n in range(1, L + 1, 3)]
    else:
        every = coef.rooms(positions)
        rooms = [every[o] for o in O]
        made = bounds.shared_recompute_pieces(coef, positions, dict(zip(O, rooms)), list(O))
        pieces = [made[o] for o in O]
        ends = bounds._EndStages(coef, lambda: (), 0.0)
        times = [ends._time(o, s, n) for o in O for s in {0, pp - 1} for n in range(1, L + 1, 3)]
    return (rooms, pieces, times, coef.options, coef.pool_of, [(p.k, p.group) for p in coef.pools])


def test_memory_terms_shared_by_what_they_read_equal_a_fresh_cache():
    """The bounds' memory terms are shared by every config whose positions hold as many micro-
    batches (coefficients.FitsKey, a stage position's key `Coefficients._position`), whatever its
    pp, schedule, vpp or micro-batch count: through one cache warmed by free parents and their
    children of every kind, each config's terms equal its own, computed from a fresh cache
    (nothing shared) without the memo."""
    inst = build_instance(InstanceSpec(model="gpt3-6.7b", global_batch_size=256))
    prepared = prepare(inst, None, "free")
    rng = random.Random(5)
    warm = SharedCoefficients(inst)
    cfgs = []
    # where memory binds: few stages of large micro-batches, every schedule
    binding = [c for c in prepared.configs if 2 <= c.pp <= 6 and c.samples >= 8]
    for cfg in rng.sample(binding, 12):
        parent = Coefficients(inst, cfg, warm)
        kids = prepared.children(parent)
        cfgs += [parent.cfg] + [k.cfg for k in rng.sample(kids, min(6, len(kids)))]
    rng.shuffle(cfgs)
    shared = [memory_terms(Coefficients(inst, cfg, warm)) for cfg in cfgs]
    for cfg, got in zip(cfgs, shared):
        assert got == memory_terms(Coefficients(inst, cfg, SharedCoefficients(inst)), direct=True), cfg.label()


@pytest.mark.parametrize("cluster, model, gbs, mode, seq", [
    ("default", "gpt3-6.7b", 256, "free", None),
    ("default", "gpt3-6.7b", 256, "megatron", None),
    ("mixed-128", "gpt3-13b", 512, "free", None),
    ("default", "gpt3-2.7b", 80, "free", 8192),    # long sequences: activations dominate
])
def test_memory_fits_from_parts_equal_the_cost_model(cluster, model, gbs, mode, seq):
    """Coefficients.memory (an option's MemoryParts weighed by the position's in-flight counts,
    shared by configs of any pp, m and schedule) gives costmodel.stage_memory_bytes for every
    layer count and recompute count, at every position of random configs of every schedule
    and their free children (pp == 1, the ends, interleaved chunks, full recompute). A term
    the parts drop or weigh wrongly (the embedding's in-flight count, the working layer of a
    full recompute) breaks it."""
    from milp_plan import costmodel as cm
    inst = build_instance(InstanceSpec(cluster=cluster, model=model, global_batch_size=gbs, seq_length=seq))
    prepared = prepare(inst, None, mode)
    rng = random.Random(11)
    shared = SharedCoefficients(inst)
    cfgs = rng.sample(prepared.configs, 12) + [c for c in prepared.configs if c.pp == 1][:2]
    if mode == "free":
        cfgs += [k.cfg for c in cfgs[:6] for k in rng.sample(prepared.children(Coefficients(inst, c, shared)), 1)]
    L, checked = inst.model.num_layers, 0
    for cfg in cfgs:
        coef = Coefficients(inst, cfg, shared)
        for o in rng.sample(range(len(coef.options)), min(6, len(coef.options))):
            opt = coef.options[o]
            for s in sorted({0, min(1, cfg.pp - 1), cfg.pp // 2, cfg.pp - 1}):
                fit = coef.memory(o, s)
                for n in (1, 2, L // 3, L):
                    for r in ((1, n) if opt.recompute == "full" else (0,)):
                        want = sum(cm.stage_memory_bytes(
                            inst, schedule=cfg.schedule, pp=cfg.pp, stage=s, m=coef.m, vpp=cfg.vpp,
                            kinds=[coef.kind] * n, tp=opt.tp, dp=opt.dp, mbs=opt.mbs,
                            sequence_parallel=cfg.sequence_parallel, distributed_optimizer=cfg.distributed_optimizer,
                            recompute=opt.recompute, recompute_layers=r, gpu=coef.types[opt.k].gpu.name)[:4])
                        assert fit(n, r) == pytest.approx(want, rel=1e-12), (cfg.label(), opt, s, n, r)
                        checked += 1
    assert checked > 200


def full_bound_of(prepared, i: int, limits: Limits) -> float | None:
    return bounds.full_bound(prepared.coef(i), limits)


@pytest.mark.parametrize("cluster, model, gbs, mode", [
    ("default", "gpt3-6.7b", 256, "free"),
    ("two-type-32", "gpt3-6.7b", 256, "megatron"),
])
@pytest.mark.parametrize("limits", LIMITS)
def test_the_full_bound_asked_for_enough_is_exact_below_it(cluster, model, gbs, mode, limits):
    """bounds.full_bound(enough=E) (the search passes its incumbent): the exact bound where that
    is below E, and at least E where the exact one is (None: no plan, or at least E); so the
    search prunes and orders exactly the configs it would with the exact bound. A point or a
    weight pair cut short below E would show as a smaller bound."""
    inst = build_instance(InstanceSpec(cluster=cluster, model=model, global_batch_size=gbs))
    prepared = prepare(inst, None, mode)
    rng = random.Random(3)
    order = rng.sample(range(len(prepared.configs)), len(prepared.configs))
    # ten with a plan under the limits (a budget leaves few), and two without
    cfgs = [*itertools.islice((prepared.configs[i] for i in order if full_bound_of(prepared, i, limits) is not None), 10),
            *itertools.islice((prepared.configs[i] for i in order if full_bound_of(prepared, i, limits) is None), 2)]
    if mode == "free":
        shared = SharedCoefficients(inst)
        cfgs += [k.cfg for c in cfgs[:5] for k in rng.sample(prepared.children(Coefficients(inst, c, shared)), 2)]
    below = 0
    for cfg in cfgs:
        exact = bounds.full_bound(Coefficients(inst, cfg, SharedCoefficients(inst)), limits)
        ref = exact if exact is not None else 1.0
        for enough in (ref * 0.97, ref, ref * 1.0001, ref * 1.5, math.inf):
            got = bounds.full_bound(Coefficients(inst, cfg, SharedCoefficients(inst)), limits, enough=enough)
            if exact is not None and exact < enough:
                assert got == exact, (cfg.label(), enough)
                below += 1
            else:
                assert got is None or got >= enough, (cfg.label(), enough, got, exact)
    assert below >= 10


@pytest.mark.parametrize("cluster, model, gbs, mode", [
    ("default", "gpt3-6.7b", 256, "free"),
    ("mixed-128", "gpt3-13b", 512, "free"),
    ("default", "gpt3-6.7b", 256, "megatron"),
])
def test_every_options_room_at_once_equals_each_options_room(cluster, model, gbs, mode):
    """Coefficients.rooms (every option's best room, numpy over the options' memory parts; the
    full bound reads it) equals each option's best layer_room over the positions (Python floats)
    on random configs and free children: equal ints, so the bounds are the same floats."""
    inst = build_instance(InstanceSpec(cluster=cluster, model=model, global_batch_size=gbs))
    prepared = prepare(inst, None, mode)
    rng = random.Random(1)
    shared = SharedCoefficients(inst)
    cfgs = rng.sample(prepared.configs, 30)
    if mode == "free":
        cfgs += [k.cfg for c in cfgs[:8] for k in prepared.children(Coefficients(inst, c, shared))[:3]]
    compared = binding = 0
    for cfg in cfgs:
        coef = Coefficients(inst, cfg, shared)
        positions = tuple(sorted({0, max(cfg.pp - 2, 0), cfg.pp - 1}))
        want = [max(coef.layer_room(o, s) for s in positions) for o in range(len(coef.options))]
        assert coef.rooms(positions) == want, cfg.label()
        compared += len(want)
        binding += sum(0 < w < inst.model.num_layers for w in want)
    assert compared >= 30 and binding >= 5   # memory binds somewhere: rooms strictly between 0 and L
