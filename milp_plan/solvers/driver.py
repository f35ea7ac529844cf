"""The exact planner: enumerate the global choices, bound them, solve the per-stage model.

Decomposition (exact): every plan belongs to exactly one config (space.py). For each
config a valid lower bound on the objective is computed from the cost model alone;
configs are solved in increasing bound order and the search stops when the next bound
is no better than the incumbent. The overall best bound is the minimum of the
incumbent and the bounds of every config not solved to optimality, so the reported gap
is honest even when the time limit cuts the search short.

Free mode: the configs are FreeConfigs (samples per micro-batch, pp, schedule) whose
node types' stage sizes are open. Configs are kept in one heap by bound: a popped config
with an open size is branched on one node type (space.free_children; the children keep
the larger of their bound and the parent's), a complete one is solved. Open configs left
when the time runs out keep their bounds, valid for everything below them.

Warm start. Megatron mode: before the exact search, heuristics/warmstart.py builds a
plan for each of the HEURISTIC_CONFIGS configs of least bound, or more until one has a
plan (greedy device grouping, bottleneck-optimal layer partition). The best is the first
incumbent, and each such config's model gets its plan as a hint. A short
--max-solve-time still returns that plan, with its gap. Free mode: the Megatron-mode
solve (FREE_BASE_SHARE of the time limit) gives the first incumbent, a free plan too.

Deadline (milp_plan/deadline.py): one Deadline bounds the whole search, enumeration,
bounding, warm start and each backend run, and ends it at once on SIGINT/SIGTERM. The
cheap bounding stops at BOUNDING_SHARE of the limit; configs it did not reach go on the
heap with bound 0 and are bounded when popped, so the search stays exact.

Lower bound of a config: formulations/pipeline.md, "Lower bound of a config"
(config_lower_bound, _bottleneck_bound).
"""
from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field
from typing import Callable

from milp_plan import check, costmodel
from milp_plan.deadline import Deadline, interrupted
from milp_plan.errors import InputError, InternalError
from milp_plan.formulations.build import build_plan
from milp_plan.formulations.coefficients import Coefficients
from milp_plan.formulations.pipeline import Limits, PipelineModel
from milp_plan.formulations.space import (Config, FreeConfig, StageOption, coverage_gap, enumerate_configs,
                                          explain_fix, free_children)
from milp_plan.instance import Instance
from milp_plan.plan import Plan, SolverRecord
from milp_plan.heuristics import warmstart as heuristic
from milp_plan.solvers.backends import BACKENDS, make_backend

REL_EPS = 1e-9
# `optimal`: no plan is better by more than this (relative), the default relative MIP gap of
# CPLEX, Gurobi and HiGHS; what remains is the integer models' rounding (pipeline.md)
PROOF_TOL = 1e-4
MAX_CUTS = 32     # plans a config's model may return over a limit (by rounding) before it is left open
HEURISTIC_CONFIGS = 16      # Configs of least bound given a heuristic plan before the exact search,
HEURISTIC_MAX_CONFIGS = 256  # ... or more, up to this many, until one has a plan,
HEURISTIC_SHARE = 0.1        # ... within this share of the time limit
BOUNDING_SHARE = 0.5         # the cheap bounding of every config stops at this share of the time limit
FREE_BASE_SHARE = 0.8        # free mode: the Megatron-mode solve that starts it gets at most this share


@dataclass
class Progress:
    elapsed_s: float
    incumbent: float | None
    bound: float | None
    done: int
    total: int


@dataclass
class SolveResult:
    status: str                  # optimal | feasible | infeasible | timeout
    objective: float | None      # seconds per step (min-time) or $ per step (min-cost)
    best_bound: float | None
    gap: float | None
    wall_time_s: float
    seed: int
    backend: str
    plan: Plan | None
    configs_total: int = 0
    configs_solved: int = 0
    configs_pruned: int = 0
    heuristic_objective: float | None = None   # the starting incumbent, before the exact search
    start: str = "heuristic"                   # where it came from: heuristic | Megatron-mode
    notes: list[str] = field(default_factory=list)


def objective_of(plan: Plan, limits: Limits) -> float:
    """The objective recomputed from the plan alone (the checker's numbers, not the solver's)."""
    return plan.predicted.usd_per_step if limits.objective == "min-cost" else plan.predicted.step_time_s


def _layer_room(coef: Coefficients, o: int, s: int) -> int:
    """Most layers stage position s can hold as option o within memory: a n + rho r + c <= cap
    with, under full recompute, 1 <= r <= n recomputed layers: r = n where recomputing saves
    memory (rho < 0), else r = 1."""
    L = coef.inst.model.num_layers
    mem = coef.memory(o, s)
    room, per = coef.capacity(o) - mem.c, mem.a
    if coef.full(o):
        if mem.rho < 0:
            per += mem.rho
        else:
            room -= mem.rho
    if room < per or room < 0:
        return 0
    return L if per <= 0 else min(L, int(room // per))


@dataclass(frozen=True)
class SlotType:
    """What one node type offers the bottleneck bound: at most `gpus` GPUs, split into
    stages of the given blocks, each (GPUs per stage, most stages, alternatives (a, room));
    `required`: it hosts at least one stage (free mode: the type has a stage size);
    `usd_per_gpu_hour`: the least a GPU of it costs (a stage of g GPUs at least g times that)."""

    gpus: int
    blocks: tuple[tuple[int, int, tuple[tuple[float, int], ...]], ...]
    required: bool = False
    usd_per_gpu_hour: float = 0.0


def _stage_layers(z: float, alts: tuple[tuple[float, int], ...], unit: int) -> int:
    """Most layers one stage holds with a n <= z: max over its (a, room) of min(floor(z / a),
    room), a multiple of `unit` (0 when below `unit`)."""
    # z / a + eps: z is itself a multiple of some a, and floor(5a / a) must not round to 4
    v = max(min(int(z / a + 1e-9) if a > 0 and z < math.inf else room, room) for a, room in alts) // unit * unit
    return v if v >= unit else 0


def _stage_runs(z: float, slot: SlotType, unit: int) -> list[tuple[int, int]]:
    """What a node type's successive stages add at most, with every a n <= z: runs of
    (layers, stages), non-increasing, so that the most layers j of its stages hold is the sum
    of its first j increments; it forms no more stages than the runs count. One block: v_b for each
    of its stages. Several (a free parent, stage size open): with v_max the most one stage
    holds and d the best layers per GPU, j stages hold at most min(j v_max, GPUs x d) (a
    concave relaxation of packing whole stages), and they are at most GPUs / smallest size
    and at most the blocks' stages together."""
    vals = [(g, most, v) for g, most, alts in slot.blocks if (v := _stage_layers(z, alts, unit))]
    if len(vals) <= 1:
        return [(v, most) for _, most, v in vals if most > 0]
    vmax = max(v for _, _, v in vals)
    cap = int(slot.gpus * max(v / g for g, _, v in vals))
    stages = min(slot.gpus // min(g for g, _, _ in vals), sum(most for _, most, _ in vals))
    full = min(cap // vmax, stages)
    runs = [(vmax, full), (cap - full * vmax, 1 if stages > full else 0), (0, max(stages - full - 1, 0))]
    return [(v, c) for v, c in runs if c > 0]


def _top_stages(runs: list[tuple[int, int]], j: int) -> tuple[int, int]:
    """(layers, stages) of the j largest increments of non-increasing runs (fewer stages when
    the runs hold fewer than j)."""
    total = taken = 0
    for v, count in sorted(runs, reverse=True):
        take = min(count, j - taken)
        total, taken = total + take * v, taken + take
    return total, taken


def _bottleneck_bound(slots: list[SlotType], pp: int, L: int, unit: int, cands: list[float]) -> float | None:
    """Smallest z such that pp stages, spread over the node types, hold L layers with every
    stage's a n <= z, among the breakpoints `cands`. A valid lower bound on max_s a_s n_s;
    None when even unbounded z cannot place L layers. Each type's most layers by stage count
    is concave (`_stage_runs`), so the best split of pp stages over the types takes the pp
    largest increments, after the first (largest) of each required type."""

    def fits(z: float) -> bool:
        total, rest, pool = 0, pp, []
        for slot in slots:
            runs = _stage_runs(z, slot, unit)
            if slot.required:
                if not runs:
                    return False
                (v, count), *more = runs
                total, rest, runs = total + v, rest - 1, [(v, count - 1)] + more
            pool += runs
        if rest < 0:
            return False
        got, taken = _top_stages(pool, rest)
        return taken == rest and total + got >= L
    if not cands or not fits(cands[-1]):
        return None
    lo, hi = 0, len(cands) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(cands[mid]):
            hi = mid
        else:
            lo = mid + 1
    return cands[lo]


def _breakpoints(slots: list[SlotType], L: int, unit: int) -> list[float]:
    """The z at which some stage's layer count floor(z / a) changes: a j for every per-layer
    time a and layer count j (multiples of `unit`)."""
    return sorted({a * j for slot in slots for _, _, alts in slot.blocks for a, _ in alts
                   for j in range(unit, L + 1, unit)})


def _most_layers(z: float, slot: SlotType, pp: int, unit: int) -> int:
    """At least the most layers a node type's stages hold with every a n <= z: its pp largest
    increments (`_stage_runs`)."""
    return _top_stages(_stage_runs(z, slot, unit), pp)[0]


def _least_layer_sum(z: float, slots: list[SlotType], pp: int, L: int, unit: int) -> float:
    """Least sum over stages of a_s n_s when every stage's a_s n_s <= z: node type k holds at
    most the layers its stages hold at z (`_most_layers`), each at k's least per-layer time;
    a required type holds at least `unit` layers. Greedy over the per-layer times (a
    relaxation: stage counts are not coupled across types)."""
    rows = []
    for slot in slots:
        a = min(a for _, _, alts in slot.blocks for a, _ in alts)
        cap = _most_layers(z, slot, pp, unit)
        rows.append((a, cap - unit if slot.required else cap))
    total = sum(a * unit for (a, _), slot in zip(rows, slots) if slot.required)
    left = L - sum(unit for slot in slots if slot.required)
    for a, cap in sorted(rows):
        take = min(max(cap, 0), left)
        total, left = total + take * a, left - take
    return total if left <= 0 else math.inf


JOINT_STEPS = 64  # _pipeline_bound: breakpoints evaluated at most (the full bound; the cheap one: none)


def _least_usd_per_hour(z: float, slots: list[SlotType], L: int, unit: int) -> float:
    """At least the $/h of any plan whose stages all have a n <= z: each stage s holds at most
    v_s(z) layers, so sum_s p_s >= sum_s (p_s / v_s) n_s >= L min over blocks of p_b / v_b(z)."""
    per_layer = [slot.usd_per_gpu_hour * g / v for slot in slots for g, _, alts in slot.blocks
                 if (v := _stage_layers(z, alts, unit))]
    return L * min(per_layer) if per_layer else math.inf


@dataclass(frozen=True)
class PipelineTerms:
    """What `_pipeline_bound` adds to the layer placement: the closed form's weights of the
    steady period and the stage sum, the stage sum's fixed part (ends, least recompute), the
    rest of T (transfers, reduction, optimizer) and the least $/h of pp stages."""

    w_z: float
    w_sum: float
    extra: float
    rest: float
    gpu_usd: float


def _pipeline_bound(slots: list[SlotType], pp: int, L: int, unit: int, cands: list[float], z_min: float,
                    terms: PipelineTerms, limits: Limits, steps: int = JOINT_STEPS,
                    least: tuple[float, float] | None = None) -> tuple[float, float] | None:
    """Lower bound on the objective over every plan whose steady period z >= max_s a_s n_s and
    z >= S / pp, S = sum_s t_s >= extra + sum_s a_s n_s. A plan with Z = max_s a_s n_s
    (>= z_min, the bottleneck bound) has S >= S(Z) = extra + _least_layer_sum(Z), so
    T >= T(Z) = w_z max(Z, S(Z) / pp) + w_sum S(Z) + rest, and $/h >= P(Z) = max(gpu_usd,
    _least_usd_per_hour(Z)). A Z where T(Z) or P(Z) T(Z) / 3600 breaks a limit holds no plan.
    S(Z) and P(Z) only fall at breakpoints, between which T(Z) rises, so the minimum is at
    z_min or a breakpoint; past the evaluated ones, T >= w_z max(Z, S_inf / pp) + w_sum S_inf
    + rest and P >= P_inf, with S_inf, P_inf at unbounded Z (every stage holds as many layers
    as memory lets it). Returns (the bound: T or $/step, S_inf), or None when no Z meets the limits."""
    w_z, w_sum, rest = terms.w_z, terms.w_sum, terms.rest
    layers_inf, usd_inf = least or (_least_layer_sum(math.inf, slots, pp, L, unit),
                                    _least_usd_per_hour(math.inf, slots, L, unit))
    s_inf = terms.extra + layers_inf
    p_inf = max(terms.gpu_usd, usd_inf)
    cost = limits.objective == "min-cost"

    def value(T: float, P: float) -> float | None:
        """The objective at (T, $/h), or None when a limit is broken."""
        usd = P * T / 3600
        if (limits.time_limit_s is not None and T > limits.time_limit_s * (1 + 1e-6)) or \
                (limits.budget_usd_per_hour is not None and P > limits.budget_usd_per_hour * (1 + 1e-9)) or \
                (limits.budget_usd_per_step is not None and usd > limits.budget_usd_per_step * (1 + 1e-9)):
            return None
        return usd if cost else T

    best = math.inf
    for i, z in enumerate([z_min] + ([x for x in cands if x > z_min] if steps else [])):
        tail = value(w_z * max(z, s_inf / pp) + w_sum * s_inf + rest, p_inf)
        if tail is None or tail >= best:
            break  # no Z from here on meets the limits, or beats the best
        if i == steps:
            best = tail
            break
        S = terms.extra + _least_layer_sum(z, slots, pp, L, unit)
        got = value(w_z * max(z, S / pp) + w_sum * S + rest,
                    max(terms.gpu_usd, _least_usd_per_hour(z, slots, L, unit)))
        if got is not None:
            best = min(best, got)
    return None if best == math.inf else (best, s_inf)


def _type_gpus(coef: Coefficients, k: int, limits: Limits) -> int:
    """GPUs of node type k a plan may use: its count, and what a $/h budget rents of it alone."""
    nt = coef.types[k]
    gpus = nt.count * nt.gpus_per_node
    if limits.budget_usd_per_hour is not None:
        cap = limits.budget_usd_per_hour * (1 + 1e-9)
        gpus = min(gpus, int(cap // nt.usd_per_hour) * nt.gpus_per_node if nt.billing == "node"
                   else int(cap // nt.usd_per_gpu_hour))
    return gpus


def _affordable_stages(coef: Coefficients, b: int, limits: Limits) -> int:
    """Most stages block b can hold in this config, and within a $/h budget on its own
    (a relaxation: other blocks' stages only add to the bill)."""
    most = coef.max_stages(b)
    if limits.budget_usd_per_hour is None:
        return most
    cap = limits.budget_usd_per_hour * (1 + 1e-9)
    return max([j for j in range(most + 1) if coef.usd_per_hour(b, j) <= cap])


def _p2p_lower_bound(coef: Coefficients) -> float:
    """costmodel.p2p_time_s at its least: pp - 1 hops, at least R - 1 of them between the R node
    types the config must use (and the interleaved wrap between two of them when R >= 2),
    each at least the cheapest transfer of its kind any block sends."""
    cfg, R = coef.cfg, len(coef.required_types)
    if cfg.pp < 2:
        return 0.0
    types = {blk.k for blk in coef.blocks}
    inter = [coef.hop_inter(b, j) for b, blk in enumerate(coef.blocks) for j in types if j != blk.k]
    same = [coef.hop_intra(b) if blk.place.stages_per_node >= 2 else coef.hop_inter(b, blk.k)
            for b, blk in enumerate(coef.blocks)]
    least = min(same + inter)
    crossing = max(R - 1, 0)
    hops = [least] * (cfg.pp - 1 - crossing) + [min(inter)] * crossing if inter else [least] * (cfg.pp - 1)
    wrap = min(inter) if (R >= 2 and inter) else least
    return costmodel.p2p_time_s(hops, wrap, cfg.schedule, cfg.vpp)


def _placement_terms(slots: list[SlotType], pp: int, L: int, unit: int):
    """(breakpoints, bottleneck bound, (least layer sum, least $/h) at unbounded z)."""
    cands = _breakpoints(slots, L, unit)
    z = _bottleneck_bound(slots, pp, L, unit, cands)
    least = None if z is None else (_least_layer_sum(math.inf, slots, pp, L, unit),
                                    _least_usd_per_hour(math.inf, slots, L, unit))
    return cands, z, least


def _memo_shared(coef: Coefficients, key: tuple | None, make):
    """make(), memoised in the instance's shared coefficient cache under `key` (None: not memoised)."""
    if key is None:
        return make()
    got = coef._shared.get(key)
    if got is None:
        got = coef._shared[key] = make()
    return got


def config_lower_bound(coef: Coefficients, limits: Limits, memory: bool = True,
                       variants: list[Config] | None = None,
                       _family: tuple | None = None) -> float | None | list[float | None]:
    """Valid lower bound on the objective of any plan of this config, or None when none fits.

    Every minimum below is over the stage options a stage may take (one per node type in
    Megatron mode); the bottleneck bound lets a node type's stages share its GPUs (whole
    nodes relaxed to GPUs).
    memory=False skips the memory rooms (every slot may hold all L layers), the transfers and
    the joint bound over the steady period and the stage sum (`_pipeline_bound`), and relaxes
    whole chunks (layer counts in multiples of vpp) to whole layers: a weaker, cheaper bound
    the driver uses to order and cut the search. With `variants` (memory=False only: configs
    that differ from coef.cfg in schedule and vpp alone, so they share its options and every
    term but the closed form's weights and the reduction at vpp layers) it returns the list
    of their bounds, computed once."""
    assert (variants is None and _family is None) or not memory
    none = None if variants is None else [None] * len(variants)
    cfg, L = coef.cfg, coef.inst.model.num_layers
    caps = {b: _affordable_stages(coef, b, limits) for b in range(len(coef.blocks))}
    O = [o for o in range(len(coef.options)) if caps[coef.block_of[o]] > 0]
    if not O or sum(caps.values()) < cfg.pp:
        return none
    t = {o: [coef.time(o, s)[0] for s in (0, cfg.pp - 1)] for o in O}
    # memory falls with the position among middle stages (fewer micro-batches in flight), so
    # the most room any position offers is at the first, the last or the last middle stage
    positions = sorted({0, max(cfg.pp - 2, 0), cfg.pp - 1})
    rooms = {o: max(_layer_room(coef, o, s) for s in positions) if memory else L for o in O}
    alts: dict[int, list[tuple[float, int]]] = {}
    for o in O:
        if rooms[o]:
            alts.setdefault(coef.block_of[o], []).append((t[o][0].a, rooms[o]))
    if coef.required_types - {coef.blocks[b].k for b in alts}:
        # a node type the config must use holds no layer within memory or budget
        return none
    by_type: dict[int, list] = {}
    for b in sorted(alts):
        by_type.setdefault(coef.blocks[b].k, []).append((coef.blocks[b].group, caps[b], tuple(alts[b])))
    gpu_hour = {k: coef.types[k].usd_per_gpu_hour for k in by_type}
    if memory:
        slots = [SlotType(_type_gpus(coef, k, limits), tuple(blocks), k in coef.required_types, gpu_hour[k])
                 for k, blocks in sorted(by_type.items())]
    else:  # cheap: each block offers its stages on its own (no GPU sharing where a type's size is open)
        slots = [SlotType(_type_gpus(coef, k, limits), (block,), k in coef.required_types, gpu_hour[k])
                 for k, blocks in sorted(by_type.items()) for block in blocks]
    # the cheap bound relaxes chunks to layers (unit 1: every split in multiples of vpp is a split),
    # so its placement terms depend on the slots and pp only, shared by every schedule and vpp
    unit = cfg.vpp if memory else 1
    if _family is not None and _family[3]:
        # weak: no bottleneck bound (z >= S / pp alone), only the least layer sum and $/h
        least = (_least_layer_sum(math.inf, slots, cfg.pp, L, unit), _least_usd_per_hour(math.inf, slots, L, unit))
        cands, z = [], (None if least[0] == math.inf else 0.0)
    else:
        cands, z, least = _memo_shared(coef, ("cheap placement", tuple(slots), cfg.pp, L) if not memory else None,
                                       lambda: _placement_terms(slots, cfg.pp, L, unit))
    if z is None:
        return none
    # each stage recomputes at least one layer where its option recomputes fully
    rho = min(t[o][0].rho if coef.full(o) else 0.0 for o in O)
    if cfg.pp == 1:
        ends = min(t[o][0].c for o in O)
    else:
        ends = min(t[o][0].c for o in O) + min(t[o][1].c for o in O)
    biggest = math.ceil(L / cfg.pp)  # some stage holds at least this many layers
    usable = [o for o in O if rooms[o]]
    # a stage of option o rents at least its GPUs: price_o = $/GPU-hour x group; a free config
    # rents at least one stage of each node type it gives a stage size
    price = {o: gpu_hour[coef.options[o].k] * coef.options[o].group for o in usable}
    forced = [min(price[o] for o in usable if coef.options[o].k == k) for k in sorted(coef.required_types)]
    gpu_usd = sum(forced) + min(price.values()) * (cfg.pp - len(forced))
    if limits.budget_usd_per_hour is not None and gpu_usd > limits.budget_usd_per_hour * (1 + 1e-9):
        return none

    least_work = min(price[o] * t[o][0].a for o in usable)
    # the dp tail is at least stage 0's reduction (nothing hides it) at vpp layers or more; the
    # optimizer max at least the biggest stage's
    dp0 = [coef.dp_time(o, 0) for o in O]
    opt = min(coef.opt_time(o, 0).a for o in O) * biggest + (_p2p_lower_bound(coef) if memory else 0.0)

    def finish(vpps: tuple[int, ...], w_z: float, w_sum: float, placed=(unit, cands, z, least)) -> float | None:
        # the reduction is affine in the layers: its least over a range of vpp is at an end
        u, c, zz, lst = placed
        if zz is None:
            return None
        return _finish_bound(slots, cfg, L, u, c, zz, lst, min(d(v) for d in dp0 for v in vpps) + opt,
                             ends + cfg.pp * rho, gpu_usd, w_z, w_sum, limits, memory, least_work)
    if _family is not None:
        return finish(_family[2], _family[0], _family[1])
    if variants is None:
        return finish((cfg.vpp,), coef.z_weight(), coef.sum_weight())

    def chunks(u: int):
        """Placement terms in whole chunks of u layers (a variant's own, tighter than unit 1)."""
        if u == unit:
            return unit, cands, z, least
        return (u, *_memo_shared(coef, ("cheap placement", tuple(slots), cfg.pp, L, u),
                                 lambda: _placement_terms(slots, cfg.pp, L, u)))
    # the closed form's weights of each variant, from the one definition (schedules.Schedule.z_weight, sum_weight)
    return [finish((v.vpp,), v.sched.z_weight(coef.m), v.sched.sum_weight(), chunks(v.vpp))
            for v in variants]


def family_lower_bound(coef: Coefficients, limits: Limits, variants: list[Config], weak: bool = False) -> float | None:
    """At most the least cheap bound of `variants` (configs that differ from coef.cfg in schedule
    and vpp alone), at the cost of one: the cheap bound T >= w_z X + w_sum S + rest (X, S >= 0;
    and $ >= its work term) only grows with the weights and the reduction, so the least weights
    and reduction of any variant bound them all (None: no variant has a plan). weak: without
    the bottleneck bound (X >= S / pp only), a fraction of the cost; the driver tightens it
    when the family reaches the top of the heap."""
    w_z = min(v.sched.z_weight(coef.m) for v in variants)
    w_sum = min(v.sched.sum_weight() for v in variants)
    vpps = sorted({v.vpp for v in variants})
    return config_lower_bound(coef, limits, memory=False, variants=None,
                              _family=(w_z, w_sum, (vpps[0], vpps[-1]), weak))


def _finish_bound(slots, cfg, L, unit, cands, z, least, rest, extra, gpu_usd, w_z, w_sum, limits, memory,
                  least_work) -> float | None:
    """config_lower_bound's last step: the joint bound (`_pipeline_bound`) and, for $, the work bound."""
    got = _pipeline_bound(slots, cfg.pp, L, unit, cands, z, PipelineTerms(w_z, w_sum, extra, rest, gpu_usd),
                          limits, JOINT_STEPS if memory else 0, least)
    if got is None:
        return None
    bound, S = got
    # $ x s per step >= (sum_s p_s) w_z z + gpu_usd (w_sum S + rest), and (sum_s p_s) z >= L min_o(p_o a_o)
    # because z >= a_s n_s on every stage: the cheapest price per unit of work bounds every plan
    work = (w_z * L * least_work + gpu_usd * (w_sum * S + rest)) / 3600
    if limits.budget_usd_per_step is not None and work > limits.budget_usd_per_step * (1 + 1e-9):
        return None
    return max(bound, work) if limits.objective == "min-cost" else bound


def _require_valid(inst: Instance, plan: Plan, who: str, cfg: Config) -> None:
    """The checker is the source of truth: a plan it rejects for anything but memory (which a
    rounded model relaxes and `Limits.admit` decides) is a model/checker mismatch, a bug."""
    violations = [v for v in check.check_plan(inst, plan) if v.rule != "memory_capacity"]
    if violations:
        raise InternalError(f"{who} returned a plan the checker rejects for {cfg.label()}: "
                            + "; ".join(map(str, violations)))


@dataclass
class Prepared:
    """The configs of an instance with their coefficients, reusable across solves
    (a Pareto sweep solves the same instance under many limits). In free mode `base` holds
    the Megatron-mode configs whose optimum starts the free search. Coefficients are made on
    first use (`coef`): a large space has many configs the search never opens."""

    configs: list[Config | FreeConfig]
    inst: Instance
    mode: str = "megatron"
    base: "Prepared | None" = None
    fix: dict | None = None
    shared: dict = field(default_factory=dict)
    made: dict = field(default_factory=dict)

    def coef(self, i: int) -> Coefficients:
        got = self.made.get(i)
        if got is None:
            got = self.made[i] = Coefficients(self.inst, self.configs[i], self.shared, self.fix)
        return got

    @property
    def coefs(self) -> list[Coefficients]:
        return [self.coef(i) for i in range(len(self.configs))]

    def families(self) -> list[list[int]]:
        """Config indices grouped by everything but the schedule and vpp (Megatron mode; in free
        mode each config alone), in enumeration order: the members share a cheap bound's terms."""
        groups: dict = {}
        for i, c in enumerate(self.configs):
            key = ((c.tp, c.dp, c.mbs, c.pp, c.recompute, c.sequence_parallel, c.distributed_optimizer)
                   if isinstance(c, Config) else i)
            groups.setdefault(key, []).append(i)
        return list(groups.values())
    truncated: bool = False  # the deadline cut the enumeration short: the configs are not all here

    def children(self, coef: Coefficients) -> list[Coefficients]:
        """Free mode: a config with open stage sizes, branched on its first open node type."""
        return [Coefficients(coef.inst, child, self.shared, self.fix)
                for child in free_children(coef.inst, coef.cfg, self.fix)]


def prepare(inst: Instance, fix: dict | None = None, mode: str = "megatron", dl: Deadline | None = None) -> Prepared:
    configs, cut = [], False
    for cfg in enumerate_configs(inst, fix, mode=mode):
        configs.append(cfg)
        if dl is not None and dl.expired():
            cut = True  # the search reports what it could examine, with bound 0 for the rest
            break
    if not configs:
        if fix:
            raise InputError(f"{explain_fix(inst, fix)}; change --fix", field="fix")
        if coverage_gap(inst, {}):
            raise InputError(coverage_gap(inst, {}), field="profiles")
        raise InputError("no tp/dp/pp/micro-batch combination passes the divisibility rules; check "
                         "--global-batch and the cluster", field="global-batch")
    base = None
    if mode == "free":
        try:
            base = prepare(inst, fix, "megatron", dl)
        except InputError:  # no uniform plan passes the rules: the free search starts cold
            base = None
    return Prepared(configs, inst, mode, base, fix, truncated=cut)


def candidate_of(coef: Coefficients, plan: Plan) -> heuristic.Candidate | None:
    """A plan as (option per stage, layers, recomputed layers) of this config, or None
    when it is not a point of the config's space (another pp, micro-batch or schedule)."""
    cfg, gbs = coef.cfg, coef.inst.job.global_batch_size
    if (plan.pp, plan.schedule, plan.vpp, plan.num_microbatches) != (cfg.pp, cfg.schedule, cfg.vpp,
                                                                      cfg.num_microbatches(gbs)):
        return None
    nodes, index = coef.inst.cluster.nodes, {o: i for i, o in enumerate(coef.options)}
    opts = []
    for st in plan.stages:
        k = coef.types.index(nodes[st.devices[0].node].type)
        o = index.get(StageOption(k, st.tp, st.dp, st.micro_batch_size, st.recompute))
        if o is None:
            return None
        opts.append(o)
    if coef.required_types and {coef.options[o].k for o in opts} != coef.required_types:
        return None
    return tuple(opts), tuple(st.num_layers for st in plan.stages), tuple(st.recompute_layers for st in plan.stages)


def _solve_config(coef: Coefficients, limits: Limits, backend: str, cutoff: float | None,
                  hint: heuristic.Candidate | None, time_s: float, seed: int, workers: int, mode: str,
                  lb: float) -> tuple[Plan | None, float | None]:
    """Solve one complete config's per-stage model (objective <= cutoff when given). The model
    is a relaxation of the cost model (pipeline.md, "Rounding"): each plan it returns is
    evaluated exactly, cut off and solved again when it breaks a limit or memory (at most
    MAX_CUTS times), and its objective must agree with the model's within the rounding.
    Returns the admitted plan or None, and the bound the config leaves (None when proven
    empty: "infeasible" under the cutoff means no plan of this config beats the incumbent)."""
    be = make_backend(backend)
    model = PipelineModel(coef, limits, be, cutoff=cutoff)
    model.build()
    if hint is not None:
        model.hint(*hint)
    deadline = time.perf_counter() + time_s
    bound = lb
    for _ in range(MAX_CUTS + 1):
        run = be.solve(deadline - time.perf_counter(), seed, workers)
        if run.status == "infeasible":
            return None, None
        if run.status == "timeout":
            return None, bound
        if run.bound is not None:
            bound = max(bound, model.objective_in_units(run.bound))
        opts, layers, rs = model.extract(run.value)
        plan = build_plan(coef.inst, coef.cfg, [coef.options[o] for o in opts], layers, rs, None, mode)
        _require_valid(coef.inst, plan, backend, coef.cfg)
        value = objective_of(plan, limits)
        err = model.rounding_error(opts, layers, rs, plan.predicted.usd_per_hour, plan.predicted.step_time_s)
        drift = (model.objective_drift(run.objective, value, err, run.status == "optimal")
                 or model.usd_per_hour_drift(run.value(model.v.usd_h), plan.predicted.usd_per_hour, opts))
        if drift is not None:
            raise InternalError(f"{backend} on {coef.cfg.label()}: {drift}")
        if limits.admit(plan):
            return plan, bound
        drift = model.limit_drift(plan, opts, layers, rs)
        if drift is not None:
            raise InternalError(f"{backend} on {coef.cfg.label()}: {drift}")
        model.add_no_good(opts, layers, rs)
        if time.perf_counter() >= deadline or interrupted():
            break
    return None, bound


def solve(inst: Instance, limits: Limits, *, backend: str = "cpsat", fix: dict | None = None,
          time_limit_s: float = 30.0, seed: int = 1, workers: int = 1, mode: str = "megatron",
          progress: Callable[[Progress], None] | None = None, prepared: Prepared | None = None,
          dl: Deadline | None = None) -> SolveResult:
    """The exact search within `time_limit_s` (or the deadline `dl`, which also ends it on an
    interrupt): configs left unexamined when it runs out count with bound 0 (or theirs)."""
    if backend not in BACKENDS:
        raise InputError(f"unknown solver '{backend}'; use {', '.join(BACKENDS)}, auto or brute-force", field="solver")
    dl = dl or Deadline(time_limit_s)
    t0 = dl.start
    prepared = prepared or prepare(inst, fix, mode, dl)
    # heap entries (bound, config, kind, payload): kind 0 a config and its Coefficients; kind 1 a
    # family (configs that differ in schedule and vpp alone, their indices) at a bound of all its
    # members (family_lower_bound), opened into configs when popped; kind 2 the same at the weak
    # family bound (or at 0, cut from the cheap bounding by the time limit), tightened when popped
    bounded: list[tuple[float, Config | FreeConfig, int, object]] = []
    unbounded_left = prepared.truncated  # the deadline cut the enumeration short: bound 0 stays open
    later: list[tuple[float, Config | FreeConfig, int, object]] = []  # bounded when popped (bound 0 till then)
    families = prepared.families()
    for f, members in enumerate(families):
        if f % 16 == 0 and (dl.expired() or dl.elapsed() > BOUNDING_SHARE * dl.seconds):
            later = [(0.0, prepared.configs[ms[0]], 2, ms) for ms in families[f:]]  # the heuristic gets the rest
            break
        head = prepared.coef(members[0])
        if len(members) == 1:
            lb = config_lower_bound(head, limits, memory=False)
            if lb is not None:
                bounded.append((lb, head.cfg, 0, head))
            continue
        lb = family_lower_bound(head, limits, [prepared.configs[i] for i in members], weak=True)
        if lb is not None:
            bounded.append((lb, head.cfg, 2, members))
    bounded.sort(key=lambda x: x[:3])

    def opened(heap: list) -> tuple[float, Config | FreeConfig, Coefficients]:
        """Pop the least entry, opening families into their members (each at the larger of its
        own cheap bound and the family's), until it is a config."""
        while heap[0][2] >= 1:
            flb, cfg, kind, members = heapq.heappop(heap)
            if kind == 2:  # a weakly bounded family: tighten (the bottleneck bound) and push it back
                lb = family_lower_bound(prepared.coef(members[0]), limits, [prepared.configs[i] for i in members])
                if lb is not None:
                    heapq.heappush(heap, (max(lb, flb), cfg, 1, members))
                if not heap:
                    return None
                continue
            lbs = config_lower_bound(prepared.coef(members[0]), limits, memory=False,
                                     variants=[prepared.configs[i] for i in members])
            for lb, i in zip(lbs, members):
                if lb is not None:
                    heapq.heappush(heap, (max(lb, flb), prepared.configs[i], 0, prepared.coef(i)))
            if not heap:
                return None
        lb, cfg, _, coef = heapq.heappop(heap)
        return lb, cfg, coef

    def opened_config(heap: list):
        """`opened`, or None when the heap holds only families without a plan."""
        while heap:
            got = opened(heap)
            if got is not None:
                return got
        return None
    best: Plan | None = None
    best_obj = math.inf
    hints: dict[Config | FreeConfig, heuristic.Candidate] = {}
    start = "heuristic"
    if prepared.base is not None:
        # Free mode starts from the Megatron-mode optimum: a free plan too (uniform options)
        start = "Megatron-mode"
        sub = solve(inst, limits, backend=backend, time_limit_s=FREE_BASE_SHARE * time_limit_s, seed=seed,
                    workers=workers, mode="megatron", prepared=prepared.base,
                    dl=dl.within(FREE_BASE_SHARE * time_limit_s))
        if sub.plan is not None:
            best = sub.plan.with_(mode=mode, solver=None)
            best_obj = objective_of(best, limits)
    else:
        # Heuristic first, from the configs of least bound: HEURISTIC_CONFIGS of them, or on until
        # the first plan (so that a short limit returns one), within a tenth of the limit and the deadline
        h0 = time.perf_counter()
        ahead = list(bounded)  # a copy: the heuristic looks ahead without consuming the search
        for tried in range(HEURISTIC_MAX_CONFIGS):
            got = opened_config(ahead)
            if got is None:
                break
            lb, cfg, coef = got
            if lb >= best_obj * (1 - REL_EPS):
                break
            if best is not None and (tried >= HEURISTIC_CONFIGS
                                     or time.perf_counter() - h0 > HEURISTIC_SHARE * time_limit_s):
                break
            if dl.expired():
                break
            got = heuristic.best_plan(coef, limits, mode, dl)
            if got is None:
                continue
            plan, hints[cfg] = got
            _require_valid(inst, plan, "the heuristic", cfg)
            if objective_of(plan, limits) < best_obj * (1 - REL_EPS):
                best, best_obj = plan, objective_of(plan, limits)
    heuristic_obj = best_obj if best is not None else None
    warm = best if prepared.mode == "free" else None  # the Megatron-mode plan: a hint where it fits
    open_bounds: list[float] = [0.0] if unbounded_left else []
    solved = pruned = 0
    # Best-first over the configs: a free config with open stage sizes is expanded when it is
    # popped (its children inherit its bound), a complete one is solved.
    heap = sorted(later + bounded, key=lambda x: x[:3])  # sorted, hence a heap
    total = len(prepared.configs)  # and, in free mode, every child made

    def count(entries) -> int:
        return sum(len(e[3]) if e[2] >= 1 else 1 for e in entries)
    while heap:
        if heap[0][0] >= best_obj * (1 - REL_EPS):
            pruned += count(heap)
            break
        left = dl.left()
        if left <= 0:
            open_bounds += [e[0] for e in heap]
            break
        got = opened_config(heap)
        if got is None:
            break
        lb, cfg, coef = got
        if lb >= best_obj * (1 - REL_EPS):  # a family's members may bound above the family
            heapq.heappush(heap, (lb, cfg, 0, coef))
            continue
        full_lb = config_lower_bound(coef, limits, memory=True)
        if full_lb is None or full_lb >= best_obj * (1 - REL_EPS):
            continue  # no plan fits in memory, or none can beat the incumbent
        lb = max(lb, full_lb)
        if isinstance(cfg, FreeConfig) and not cfg.complete:
            for kid in prepared.children(coef):
                # a kid with open sizes inherits this bound until it is popped
                kid_lb = config_lower_bound(kid, limits, memory=False) if kid.cfg.complete else lb
                if kid_lb is not None:
                    heapq.heappush(heap, (max(lb, kid_lb), kid.cfg, 0, kid))
                    total += 1
            continue
        hint = hints.get(cfg) or (candidate_of(coef, warm) if warm is not None else None)
        plan, open_lb = _solve_config(coef, limits, backend, best_obj if best is not None else None, hint, left, seed,
                                      workers, mode, lb)
        solved += 1
        if plan is not None and objective_of(plan, limits) < best_obj * (1 - REL_EPS):
            best, best_obj = plan, objective_of(plan, limits)
        if open_lb is not None:
            open_bounds.append(open_lb)
        if progress:
            progress(Progress(time.perf_counter() - t0, None if best is None else best_obj,
                              min([best_obj] + open_bounds + [e[0] for e in heap[:1]]),
                              total - count(heap), total))
    wall = time.perf_counter() - t0
    bound = min([best_obj] + open_bounds) if (best is not None or open_bounds) else None
    if best is None:
        status = "timeout" if open_bounds else "infeasible"
        return SolveResult(status, None, bound, None, wall, seed, backend, None, total, solved, pruned,
                           heuristic_obj, start)
    gap = 0.0 if bound is None else max(0.0, (best_obj - bound) / max(abs(best_obj), 1e-12))
    status = "optimal" if gap <= PROOF_TOL else "feasible"
    record = SolverRecord(backend, status, best_obj, bound, gap, None, seed)
    return SolveResult(status, best_obj, bound, gap, wall, seed, backend, best.with_(solver=record),
                       total, solved, pruned, heuristic_obj, start)
