"""A fast heuristic plan per Config: greedy device grouping, then the layer partition that
minimises the bottleneck stage time.

Device grouping: the usable node types sorted by per-layer time (fastest first), each
filled up to the stages it can hold until pp stages are placed; the same sorted by price
per GPU-hour (cheapest first); j < pp stages on the fastest type and the rest cheapest-first
(what a budget trades); the fastest type at both ends and the others between (the end stages
hold the embedding and the head and all-reduce their tied gradient: on the shipped default's
pp 4 x dp 8 config, A100, A10, A10, A100 gives 1.375 s where the contiguous groupings' best
gives 1.587 s); every single type that can hold all pp stages alone; and every order of up to
four types, each filled in turn, of which the two whose layer partition has the least
closed-form estimate are built (where memory binds, the type that takes the most layers fits
them only late in the pipeline: `ordered_sequences`). Layer partition: for a
candidate bottleneck z, stage s holds at most min(floor((z - c_s) / a_s), memory room)
layers (multiples of vpp, at least vpp); the smallest z whose capacities cover the L
layers is found by bisection over the values a_s j + c_s, and the surplus is taken from
the slowest stages. Full recompute uses the fewest recomputed layers r for which the
partition fits in memory. Every candidate becomes a plan through build_plan and is scored
by predict.evaluate (plan.predicted): the heuristic never trusts its own arithmetic.

The driver uses the best heuristic plan as the first incumbent (it prunes Configs whose
bound cannot beat it and is the answer when the time limit allows nothing better) and
as the solver's hint for its Config. It works on Megatron-mode Configs, whose stage
options are one per node type (a "type" below is an option index); free mode starts
from the Megatron-mode optimum instead (solvers/driver.py).
"""
from __future__ import annotations

import bisect
import itertools

from typing import Sequence

from milp_plan.deadline import WORK, Deadline
from milp_plan.formulations.placement import build_plan, fits
from milp_plan.formulations.coefficients import Coefficients
from milp_plan.formulations.space import matches_pins
from milp_plan.job import Limits
from milp_plan.plan import Plan
from milp_plan.result import objective_of
from milp_plan.units import SECONDS_PER_HOUR

ORDERED_TYPES = 4   # ordered_sequences: every order of at most this many types (4! = 24)
ORDERS_BUILT = 2    # of those, the candidates built into plans (the least estimates)

Candidate = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]  # (option, layers, recomputed layers) per stage


def type_sequences(coef: Coefficients) -> list[tuple[int, ...]]:
    """Greedy grouping fastest-first, cheapest-first (per GPU-hour; budgets and min-cost),
    j < pp stages of the fastest type then cheapest-first, the fastest type at both ends with
    the others fastest-first between (pp >= 3), and each type alone when it holds all pp stages."""
    pp = coef.cfg.pp
    usable = range(len(coef.options))
    speed = {k: coef.time(k, min(1, pp - 1))[0].a for k in usable}
    price = {k: coef.types[coef.options[k].k].usd_per_gpu_hour for k in usable}
    most = {k: coef.max_stages(coef.pool_of[k]) for k in usable}
    fastest = sorted(usable, key=lambda k: (speed[k], k))
    cheapest = sorted(usable, key=lambda k: (price[k], k))

    def fill(head: list[int], order: list[int]) -> None:
        seq = _filled(head, order, most, pp)
        if seq is not None and seq not in seqs:
            seqs.append(seq)
    seqs: list[tuple[int, ...]] = []
    fill([], fastest)
    fill([], cheapest)
    if fastest:  # fewer stages on the fastest type, the rest cheapest-first (a budget's trade)
        top = fastest[0]
        for j in range(most[top] - 1, 0, -1):
            fill([top] * j, cheapest)
        if pp >= 3 and most[top] >= 2:  # the fastest type at both ends, the others between
            middle: list[int] = []
            for k in fastest[1:] + [top]:
                middle += [k] * min(most[k] - (2 if k == top else 0), pp - 2 - len(middle))
            if len(middle) == pp - 2 and (top, *middle, top) not in seqs:
                seqs.append((top, *middle, top))
    for k in fastest:
        if most[k] >= pp and (k,) * pp not in seqs:
            seqs.append((k,) * pp)
    return seqs


def _filled(head: list[int], order: Sequence[int], most: dict[int, int], pp: int) -> tuple[int, ...] | None:
    """`head`, then the types of `order` not in it, each on as many stages as it holds (`most`)
    until pp are placed; None where they hold fewer."""
    seq = list(head)
    for k in order:
        if k not in head:
            seq += [k] * min(most[k], pp - len(seq))
    return tuple(seq) if len(seq) == pp else None


def ordered_sequences(coef: Coefficients, base: list[tuple[int, ...]] | None = None) -> list[tuple[int, ...]]:
    """Every order of the types, each filled in turn up to the stages it holds (at most
    ORDERED_TYPES types; beyond, type_sequences' own reversed), less those type_sequences
    gives (`base`, where the caller has them). Under 1F1B and interleaving a later stage holds
    fewer micro-batches in flight, so where memory binds, the type that takes the most layers
    belongs late: GPT-3 175B on mixed-128 (pp 24, batch 64) runs A100, L40S, H100 at 7.706
    s/step, fastest-first at 9.978."""
    pp, base = coef.cfg.pp, type_sequences(coef) if base is None else base
    usable = range(len(coef.options))
    most = {k: coef.max_stages(coef.pool_of[k]) for k in usable}
    if len(usable) > ORDERED_TYPES:
        return [seq[::-1] for seq in base if seq[::-1] not in base]
    out: list[tuple[int, ...]] = []
    for order in itertools.permutations(usable):
        seq = _filled([], order, most, pp)
        if seq is not None and seq not in base and seq not in out:
            out.append(seq)
    return out


def _caps(coef: Coefficients, stages: Sequence[tuple], r: int, z: float) -> list[int]:
    """Layers each stage holds with t_s <= z within its memory room (whole chunks); `stages`:
    each stage's (t fit, layer room with r recomputed layers), `_stage_terms`."""
    unit, L = coef.cfg.vpp, coef.inst.model.num_layers
    caps = []
    for t, room in stages:
        by_time = L if t.a <= 0 else int((z - t.c - t.rho * r) / t.a + 1e-9)
        caps.append(max(0, min(by_time, room, L)) // unit * unit)
    return caps


def _stage_terms(coef: Coefficients, types: Sequence[int], r: int) -> list[tuple]:
    """Each stage's (t fit, layer room with r recomputed layers): what `_caps` reads, for every z."""
    return [(coef.time(k, s)[0], coef.layer_room(k, s, r)) for s, k in enumerate(types)]


def partition(coef: Coefficients, types: Sequence[int], r: int) -> tuple[int, ...] | None:
    """Layers per stage minimising max_s t_s within memory (r recomputed layers), or None."""
    unit, L, pp = coef.cfg.vpp, coef.inst.model.num_layers, len(types)
    lo_n = max(unit, r)
    if L % unit or L < pp * lo_n:
        return None

    stages = _stage_terms(coef, types, r)

    def fits(z: float) -> list[int] | None:
        caps = _caps(coef, stages, r, z)
        if min(caps) < lo_n or sum(caps) < L:
            return None
        return caps
    # stages of one node type and position share a fit: each distinct fit once
    cands = sorted({t(j, r) for t in dict.fromkeys(t for t, _ in stages) for j in range(lo_n, L + 1, unit)})
    if not cands or fits(cands[-1]) is None:
        return None
    # the least candidate z that fits (fits is monotone in z)
    caps = fits(cands[bisect.bisect_left(range(len(cands)), True, key=lambda i: fits(cands[i]) is not None)])
    # take the surplus from the slowest stages first (their layers cost the most)
    surplus = sum(caps) - L
    slow_first = sorted(range(pp), key=lambda s: -stages[s][0].a)
    for s in slow_first:
        cut = min(surplus, caps[s] - lo_n) // unit * unit
        caps[s] -= cut
        surplus -= cut
    return tuple(caps) if surplus == 0 else None


def _candidate(coef: Coefficients, types: tuple[int, ...], dl: Deadline | None) -> Candidate | None:
    """The partition of `types` with the fewest recomputed layers that fit (least recompute
    time), or None (none fits, or the deadline `dl` ran out)."""
    unit, L = coef.cfg.vpp, coef.inst.model.num_layers
    for r in (range(unit, L // len(types) + 1, unit) if coef.shared_r else (0,)):
        if dl is not None and dl.expired():
            return None
        layers = partition(coef, types, r)
        if dl is not None:
            dl.charge(WORK.step)
        if layers is not None:
            return types, layers, (r,) * len(types)
    return None


def _estimate(coef: Coefficients, cand: Candidate) -> float:
    """The closed form's compute part of a candidate, sum_s t_s + (m - 1) max_s t_s: what
    orders the ordered sequences' candidates before any is built."""
    types, layers, rs = cand
    t = [coef.time(k, s)[0](n, r) for s, (k, n, r) in enumerate(zip(types, layers, rs))]
    return sum(t) + (coef.m - 1) * max(t)


def candidates(coef: Coefficients, dl: Deadline | None = None) -> list[Candidate]:
    """One candidate per type sequence, then the ORDERS_BUILT of the ordered sequences'
    candidates of least `_estimate`; those found before the deadline `dl` when it runs out."""
    out, base = [], type_sequences(coef)
    for types in base:
        if dl is not None and dl.expired():
            return out
        got = _candidate(coef, types, dl)
        if got is not None:
            out.append(got)
    more = [got for types in ordered_sequences(coef, base) if (got := _candidate(coef, types, dl)) is not None]
    return out + sorted(more, key=lambda c: _estimate(coef, c))[:ORDERS_BUILT]


def over_price(coef: Coefficients, limits: Limits, opts: Sequence[int], least_step_s: float) -> bool:
    """True when no plan with these stage options meets the limits' budgets: it rents at least
    P = sum_s $/GPU-hour x GPUs of stage s (whole nodes only add: bounds.least_usd_per_hour) and,
    with every plan of the config at least `least_step_s` long (a proven bound), pays at least
    P least_step_s / 3600 per step."""
    if limits.budget_usd_per_hour is None and limits.budget_usd_per_step is None:
        return False
    usd_h = sum(coef.stage_usd_per_hour(coef.options[o].k, coef.options[o].group) for o in opts)
    return ((limits.budget_usd_per_hour is not None and usd_h > limits.budget_usd_per_hour * (1 + 1e-9))
            or (limits.budget_usd_per_step is not None
                and usd_h * least_step_s / SECONDS_PER_HOUR > limits.budget_usd_per_step * (1 + 1e-9)))


def best_plan(coef: Coefficients, limits: Limits, dl: Deadline | None = None,
              least_step_s: float = 0.0) -> tuple[Plan, Candidate] | None:
    """The best heuristic plan of this Config under the limits (objective from the plan), or None
    (also when the deadline `dl` runs out first). `least_step_s`: a proven lower bound of the
    step time of the config's plans; candidates whose GPUs cost more than a budget allows at
    that step (`over_price`) are not built."""
    best = None
    for opts, layers, rs in candidates(coef, dl):
        if not fits(coef.inst, [coef.options[o] for o in opts]):  # mixed bundles share their types' nodes
            continue
        if over_price(coef, limits, opts, least_step_s):
            continue
        plan = build_plan(coef.inst, coef.cfg, [coef.options[o] for o in opts], layers, rs, None)
        if dl is not None:
            dl.charge(WORK.plan)
        if limits.admit(plan) and matches_pins(coef.inst, coef.pins, plan):
            key = objective_of(plan, limits)
            if best is None or key < best[0]:
                best = (key, plan, (opts, layers, rs))
    return None if best is None else (best[1], best[2])
