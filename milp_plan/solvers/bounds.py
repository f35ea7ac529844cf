"""Valid lower bounds on the objective of every plan of a config, from the cost model alone
(formulations/pipeline.md, "Lower bound of a config"): pure functions of the config's
coefficients and the limits. The exact search (driver.py) orders and prunes configs by them.
"""
from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass, replace
from typing import Callable, NamedTuple

import numpy as np

from milp_plan import costmodel as cm
from milp_plan.formulations.coefficients import (Affine, Coefficients, OptionTermsKey, PlacementKey,
                                                  TiedSyncKey)
from milp_plan.deadline import WORK
from milp_plan.predict import SIMULATED
from milp_plan.formulations.space import Config, StageOption
from milp_plan.job import Limits
from milp_plan.schedules import PathTerms
from milp_plan.units import SECONDS_PER_HOUR


@dataclass(frozen=True)
class SlotType:
    """What one node type offers the bottleneck bound: at most `gpus` GPUs, split into
    stages of the given pools, each (GPUs per stage, most stages, alternatives (a, room) as a
    front, `_front`: a and room rising together);
    `required`: it hosts at least one stage (free mode: the type has a stage size);
    `usd_per_gpu_hour`: the least a GPU of it costs (a stage of g GPUs at least g times that).
    With mixed-type bundles (--mixed-stages) a slot holds the node types that bundles join and
    the bundles themselves (`_slots`); `shares` then gives each node type's GPUs and the pools
    (indices into `pools`) that use them."""

    gpus: int
    pools: tuple[tuple[int, int, tuple[tuple[float, int], ...]], ...]
    required: bool = False
    usd_per_gpu_hour: float = 0.0
    shares: tuple[tuple[int, tuple[int, ...]], ...] = ()


def _stage_layers(z: float, alts: tuple[tuple[float, int], ...], unit: int) -> int:
    """Most layers one stage holds with a n <= z: max over its (a, room) of min(floor(z / a),
    room), a multiple of `unit` (0 when below `unit`). `alts`: a front (`_front`)."""
    # z / a + eps: z is itself a multiple of some a, and floor(5a / a) must not round to 4
    if z == math.inf:  # every alternative holds its room
        v = alts[-1][1] // unit * unit
    else:
        # a front (`_front`): a and room rise together, so floor(z / a) falls; the first below its
        # room is the last candidate (every later one holds at most its floor)
        v = 0
        for a, room in alts:
            most = int(z / a + 1e-9) if a > 0 else room
            if most < room:
                if most > v:
                    v = most
                break
            v = room
        v = v // unit * unit
    return v if v >= unit else 0


def _stage_runs(z: float, slot: SlotType, unit: int) -> list[tuple[int, int]]:
    """What a node type's successive stages add at most, with every a n <= z: runs of
    (layers, stages), non-increasing, so that the most layers j of its stages hold is the sum
    of its first j increments; it forms no more stages than the runs count. One pool: v_q for each
    of its stages. Several (a free parent, stage size open): with v_max the most one stage
    holds and d the best layers per GPU, j stages hold at most min(j v_max, GPUs x d) (a
    concave relaxation of packing whole stages), and they are at most GPUs / smallest size
    and at most the pools' stages together. A slot with `shares` (mixed-type bundles) has d per
    node type: its stages hold at most sum_k GPUs_k x (the best v / g of the pools using k),
    since a stage of g_k GPUs of each type k holds v = sum_k g_k (v / g) layers."""
    if len(slot.pools) == 1:   # the common case (every slot of a cheap bound): 0.75 us a call, not 1.2
        _, most, alts = slot.pools[0]
        v = _stage_layers(z, alts, unit)
        return [(v, most)] if v and most > 0 else []
    vals = [(g, most, v) for g, most, alts in slot.pools if (v := _stage_layers(z, alts, unit))]
    if len(vals) <= 1:
        return [(v, most) for _, most, v in vals if most > 0]
    vmax = max(v for _, _, v in vals)
    if slot.shares:
        density = {i: v / g for i, (g, _, alts) in enumerate(slot.pools) if (v := _stage_layers(z, alts, unit))}
        cap = int(sum(gpus * max((density[i] for i in used if i in density), default=0.0)
                      for gpus, used in slot.shares))
    else:
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

    required = [slot.required for slot in slots]

    def fits(z: float) -> bool:
        most = _stages_hold([_stage_runs(z, slot, unit) for slot in slots], required, pp)
        return most is not None and most >= L
    if not cands or not fits(cands[-1]):
        return None
    return cands[bisect.bisect_left(range(len(cands)), True, key=lambda i: fits(cands[i]))]  # least z that fits


def _breakpoints(slots: list[SlotType], L: int, unit: int) -> list[float]:
    """The z at which some stage's layer count floor(z / a) changes: a j for every per-layer
    time a and layer count j (multiples of `unit`)."""
    per_layer = sorted({a for slot in slots for _, _, alts in slot.pools for a, _ in alts})
    # every product a j, once, in order: the same floats as Python's a * j (IEEE multiplication)
    return np.unique(np.multiply.outer(np.array(per_layer, dtype=float),
                                       np.arange(unit, L + 1, unit, dtype=float)).ravel()).tolist()


def _most_layers(z: float, slot: SlotType, pp: int, unit: int) -> int:
    """At least the most layers a node type's stages hold with every a n <= z: its pp largest
    increments (`_stage_runs`)."""
    return _top_stages(_stage_runs(z, slot, unit), pp)[0]


def _least_layer_sum(z: float, slots: list[SlotType], pp: int, L: int, unit: int, coupled: bool = True) -> float:
    """Least sum over stages of a_s n_s when every stage's a_s n_s <= z: node type k holds at
    most the layers its stages hold at z (`_most_layers`), each at k's least per-layer time,
    and at least `unit` layers on each stage it must host: one where the type is required,
    and (coupled) pp less the stages the other types form at z (`_stage_runs`: a type forms
    no more stages than its runs count), since every stage holds at least `unit` layers.
    Greedy over the per-layer times (a relaxation: stage counts are not coupled further);
    inf when the types cannot host pp stages of L layers."""
    rows = []
    for slot in slots:
        a = min(a for _, _, alts in slot.pools for a, _ in alts)
        cap, stages = _top_stages(_stage_runs(z, slot, unit), pp)
        rows.append((a, cap, stages))
    formed = sum(stages for _, _, stages in rows)
    total, left, room = 0.0, L, []
    for (a, cap, stages), slot in zip(rows, slots):
        need = max(1 if slot.required else 0, pp - (formed - stages) if coupled else 0)
        least = need * unit
        if need > stages or least > cap:
            return math.inf
        total, left = total + a * least, left - least
        room.append((a, cap - least))
    if left < 0:
        return math.inf
    for a, cap in sorted(room):
        take = min(cap, left)
        total, left = total + take * a, left - take
    return total if left <= 0 else math.inf


JOINT_STEPS = 64  # _pipeline_bound: breakpoints evaluated at most (the full bound; the cheap one: none)
END_STEPS = 16    # ... of which the first this many lifted by the end stages' terms (`_EndStages`);
# measured (free mode, work-limited): 8 -> 16 solves default 36 -> 34 configs and
# two-type-32 44 -> 37 at the same or less CPU; 64 solves 33 / 36 but costs more CPU at
# scale-1024 (33-34 s -> 38 s); scale-8192 about even (49 s, 50 s at 16)


def _least_usd_per_hour(z: float, slots: list[SlotType], L: int, unit: int) -> float:
    """At least the $/h of any plan whose stages all have a n <= z: each stage s holds at most
    v_s(z) layers, so sum_s p_s >= sum_s (p_s / v_s) n_s >= L min over pools q of p_q / v_q(z)."""
    per_layer = [slot.usd_per_gpu_hour * g / v for slot in slots for g, _, alts in slot.pools
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
    floor: float = 0.0   # at least what the w_z term is in every plan (`_position_floor`)


def _pipeline_bound(slots: list[SlotType], pp: int, L: int, unit: int, cands: list[float], z_min: float,
                    terms: PipelineTerms, limits: Limits, steps: int = JOINT_STEPS,
                    least: tuple[float, float] | None = None, sweep: "_Sweep | None" = None,
                    ends: "Callable[[float, float | None], EndTerms | None] | None" = None,
                    enough: float = math.inf) -> tuple[float, float] | None:
    """Lower bound on the objective over every plan whose steady period z >= max_s a_s n_s and
    z >= S / pp, S = sum_s t_s >= extra + sum_s a_s n_s. A plan with Z = max_s a_s n_s
    (>= z_min, the bottleneck bound) has S >= S(Z) = extra + _least_layer_sum(Z), so
    T >= T(Z) = w_z max(Z, S(Z) / pp) + w_sum S(Z) + rest, and $/h >= P(Z) = max(gpu_usd,
    _least_usd_per_hour(Z)). A Z where T(Z) or P(Z) T(Z) / 3600 breaks a limit holds no plan.
    S(Z) and P(Z) only fall at breakpoints, between which T(Z) rises, so the minimum is at
    z_min or a breakpoint; past the evaluated ones, T >= w_z max(Z, S_inf / pp) + w_sum S_inf
    + rest and P >= P_inf, with S_inf, P_inf at unbounded Z (every stage holds as many layers
    as memory lets it). `sweep` (`_Sweep`): the points of this placement, shared. `ends(Z, next)`
    (`_EndStages`): in every plan whose largest a n lies in [Z, next), the end stages' terms
    (`EndTerms.step`: stage 0's time and tail per option, the last stage's time, the chain path
    through it), or None (no such plan); read at the evaluated points only (past them `rest`
    alone, a bound for every Z). A point at `enough` or above is not lifted (the caller asks no
    more of a bound: the bound is then exact below `enough`, and at least `enough` where the
    true one is). Returns (the bound: T or $/step, S_inf), or None when no Z meets the limits."""
    w_z, w_sum, rest = terms.w_z, terms.w_sum, terms.rest
    layers_inf, usd_inf = least or (_least_layer_sum(math.inf, slots, pp, L, unit),
                                    _least_usd_per_hour(math.inf, slots, L, unit))
    s_inf = terms.extra + layers_inf
    p_inf = max(terms.gpu_usd, usd_inf)
    cost = limits.objective == "min-cost"

    def value(T: float, P: float) -> float | None:
        return bounded_objective(T, P, limits)

    priced = cost or limits.budget_usd_per_hour is not None or limits.budget_usd_per_step is not None
    sweep = sweep or _Sweep(slots, pp, L, unit, cands, z_min)
    best = math.inf
    for i in range(steps + 1):
        z = sweep.z(i)
        if z is None:
            break
        tail = value(max(w_z * max(z, s_inf / pp), terms.floor) + w_sum * s_inf + rest, p_inf)
        if tail is None or tail >= best:
            break  # no Z from here on meets the limits, or beats the best
        if i == steps:
            best = tail
            break
        S = terms.extra + sweep.layer_sum(i)
        T, P = max(w_z * max(z, S / pp), terms.floor) + w_sum * S + rest, max(terms.gpu_usd, sweep.usd(i)) if priced else p_inf
        got = value(T, P)  # P matters only where priced
        if got is not None and got < min(best, enough) and ends is not None and i < END_STEPS:  # lift a point below the best
            at = ends(z, sweep.z(i + 1))   # None: no plan has its largest a n at this Z
            got = None if at is None else value(max(at.step(w_z, w_sum, max(z, S / pp), S, rest), T), P)
        if got is not None:
            best = min(best, got)
    return None if best == math.inf else (best, s_inf)


def bounded_objective(T: float, P: float, limits: Limits) -> float | None:
    """The objective of a step-time bound T and a $/h bound P (min-cost: P T / 3600), or None
    where a limit rules out every plan: T over the time limit, P over the $/h budget, or their
    $/step over its budget."""
    usd = P * T / SECONDS_PER_HOUR
    if (limits.time_limit_s is not None and T > limits.time_limit_s * (1 + 1e-6)) or \
            (limits.budget_usd_per_hour is not None and P > limits.budget_usd_per_hour * (1 + 1e-9)) or \
            (limits.budget_usd_per_step is not None and usd > limits.budget_usd_per_step * (1 + 1e-9)):
        return None
    return usd if limits.objective == "min-cost" else T


class _Sweep:
    """The joint bound's evaluation points of one placement (`_pipeline_bound`): z_min, then
    the breakpoints above it, with the least layer sum and the least $/h at each, computed on
    first use and shared by every weight pair and every config of that placement (they read
    the slots, pp, L and the unit alone)."""

    def __init__(self, slots: list[SlotType], pp: int, L: int, unit: int, cands: list[float], z_min: float):
        self.slots, self.pp, self.L, self.unit = slots, pp, L, unit
        self.zs = [z_min] + cands[bisect.bisect_right(cands, z_min):]
        self._sums: list[float] = []
        self._usd: dict[int, float] = {}

    def z(self, i: int) -> float | None:
        return self.zs[i] if i < len(self.zs) else None

    def layer_sum(self, i: int) -> float:
        while len(self._sums) <= i:
            self._sums.append(_least_layer_sum(self.zs[len(self._sums)], self.slots, self.pp, self.L, self.unit))
        return self._sums[i]

    def usd(self, i: int) -> float:
        if i not in self._usd:
            self._usd[i] = _least_usd_per_hour(self.zs[i], self.slots, self.L, self.unit)
        return self._usd[i]


class _EndStages:
    """What the end stages add to the full bound at a steady-period point Z (`_pipeline_bound`'s
    `ends`), joint terms per option (formulations/pipeline.md, "The end stages at Z"). In a plan
    whose stages all have a n <= Z, the other pp - 1 stages hold at most M_i(Z) layers when
    stage 0 (or the last stage) is on node type i: the greedy merge of the types' increments at
    Z (`_stage_runs`), after the first of each other required type, with one stage fewer of
    type i (the end's own). So the end holds n >= n_i(Z) = max(unit, L - M_i(Z)) layers (whole
    chunks of `unit`, `_StageZeroLayers`), within what one stage of type i holds at Z, and its
    option o has a_o n < next (the next point; a_o: o's least per-layer time at the ends, at
    most what the bottleneck bound reads of a stage of o) and holds n layers in memory at the
    end's position. Then, with t_o(n) the end's least time at its position within memory
    (`_least_time`: a n + c plus the fewest recomputes memory forces there, non-decreasing in n)
    and stage 0's tail (reduction, then the tied all-reduce) at least d_o(n) + E_o (d_o the
    reduction's piece 0 at stage 0, non-decreasing in n; E_o the least tied all-reduce with o
    at stage 0, `_sync_by_end`), for each weight pair (w_z, w_sum) and the rest of its terms,
          T >= w_sum S + rest' + min over i, o of  w_z max(z, t_o,first(n_i(Z))) + d_o(n_i(Z)) + E_o
    (per stage-0 option, jointly: a fast option with a slow reduction no longer takes both
    minima; rest' is the bound's rest less its stage-0 tail `base`, min_o d_o(unit) + min E),
    z >= max(Z, S / pp, min over i, o of t_o,last(n_i(Z))) (`EndTerms.step`), and on the
    simulated basis the chain path through the last stage (Schedule.chain_path, s = pp - 1:
    every earlier stage's first chunk down, all m of the last stage's micro-batches, the last
    backward back to stage 0 and its tail):
          T >= (S - t_last) / v + m t_last + 2 sum_j h_j + tail + opt
            >= S / v + (m - 1/v) t_last(n_i(Z)) + 2 sum of the least hops + least tail + opt
    (v the chunks per rank), which the pairs' m z leaves out; and the last stage's own tail path
    (`_tail_path_bound`: Schedule.tail_path, ending in the last stage's own reduction and tied
    all-reduce, per last-stage option at n_i(Z)). The closed form's pairs take z >= the ends'
    times alone.
    The runs only change at the breakpoints, so all of it holds for every plan whose largest a n
    lies in [Z, next). Node types only (no mixed-type bundles, whose slots join types)."""

    def __init__(self, coef: Coefficients, setup: Callable[[], tuple], base: float,
                 chain: tuple[float, float] | None = None):
        self.coef, self.base, self._setup = coef, base, setup
        self.chain = chain   # simulated basis: (2 sum of the least hops, the optimizer term) of the chain path
        self.layers: _StageZeroLayers | None = None   # made on first use, with by_slot and sync
        self._terms: dict | None = None   # o -> (a_o, d_o, E_o), on first use
        self._times: dict[tuple[int, int, int], float | None] = {}
        self._at: dict[tuple, EndTerms | None] = {}

    @classmethod
    def of(cls, coef: Coefficients, slots: list[SlotType], caps: dict[int, int], usable: list[int], unit: int,
           base: float, opt: float = 0.0, hops: float = 0.0) -> "_EndStages | None":
        """The end stages' terms of a config's full bound (`base`: the bound's stage-0 tail, `opt`:
        its optimizer term, `hops`: twice the sum of its least hops), or None where its slots
        join node types. Everything else is made on first use."""
        types = sorted({coef.pools[coef.pool_of[o]].k for o in usable})
        if any(k >= len(coef.inst.cluster.node_types) for k in types) or len(types) != len(slots):
            return None

        def setup() -> tuple:
            L = coef.inst.model.num_layers
            layers = coef.shared.get(("stage 0 layers", PlacementKey(tuple(slots), coef.cfg.pp, L, unit)),
                                     lambda: _StageZeroLayers(slots, coef.cfg.pp, L, unit))
            hosts = [sum(c for q, c in caps.items() if coef.pools[q].k == k) for k in types]   # stages per type
            return (layers, [[o for o in usable if coef.options[o].k == k] for k in types], _sync_by_end(coef, caps, usable),
                    hosts)
        chain = (hops, opt) if coef.basis() == SIMULATED and coef.cfg.pp >= 2 else None
        return cls(coef, setup, base, chain)

    def __call__(self, z: float, below: float | None) -> "EndTerms | None":
        """The terms for plans whose largest a n lies in [z, below), or None (there are none)."""
        got = self._at.get((z, below), False)
        if got is False:
            got = self._at[z, below] = self._terms_at(z, math.inf if below is None else below)
        return got

    def _terms_at(self, z: float, below: float) -> "EndTerms | None":
        coef, pp = self.coef, self.coef.cfg.pp
        if self.layers is None:
            self.layers, self.by_slot, sync, self.hosts = self._setup()
            self._terms = {o: (min(coef.time(o, s)[0].a for s in {0, pp - 1}), coef.dp_time(o, 0)[0], sync[o],
                               coef.dp_time(o, pp - 1)[0]) for os in self.by_slot for o in os}
        ends = []   # per node type: stage 0's (least time, tail less `base`), the last's (least time, tail)
        for n, os in zip(self.layers.at(z), self.by_slot):
            firsts, lasts = [], []
            for o in os if n else ():
                a, d, e, d_last = self._terms[o]
                if a * n >= below * (1 + 1e-9):
                    continue
                t0, t1 = self._time(o, 0, n), self._time(o, pp - 1, n)
                if t0 is not None:
                    firsts.append((t0, max(0.0, d(n) + e - self.base)))
                if t1 is not None:
                    lasts.append((t1, d_last(n) + e))
            ends.append((_pairs_front(firsts) if firsts else None, lasts))
        v, m = coef.cfg.sched.chunks, coef.m
        w_chain = w_own = 0.0
        if self.chain is not None:
            w_chain, path = 1.0 / v, coef.cfg.sched.tail_path(pp, m)
            hops, opt = self.chain
        cases = []
        for i0, (front, _) in enumerate(ends):
            for i1, (_, lasts) in enumerate(ends):
                # the ends' node types: one stage at pp 1; two stages of one type where it hosts two
                if front is None or not lasts or (i0 == i1) != (pp == 1) and not (i0 == i1 and self.hosts[i0] >= 2):
                    continue
                last = min(t for t, _ in lasts)
                if self.chain is None:
                    cases.append(EndCase(front, last, 0.0, 0.0))
                    continue
                w_own, c_own = _tail_path_bound(path, coef.forward_share().lo, lasts, hops, opt)
                cases.append(EndCase(front, last, (m - w_chain) * last + hops + self.base + front[-1][1] + opt, c_own))
        return EndTerms(tuple(cases), w_chain, w_own) if cases else None

    def _time(self, o: int, s: int, n: int) -> float | None:
        """`_least_time`, memoised per config and, in the instance's cache, per what it reads:
        the option's memory fit's key at s (which fixes its time fit too: the option and the
        ends) and n."""
        key = (o, s, n)
        got = self._times.get(key, False)
        if got is False:
            coef = self.coef
            got = self._times[key] = coef.shared.get(("least time", coef.memory_key(coef.options[o], s), n),
                                                     lambda: (_least_time(coef, o, s, n),))[0]
        return got


def _tail_path_bound(path: PathTerms, lo: float, lasts: list[tuple[float, float]], hops: float,
                     opt: float) -> tuple[float, float]:
    """(w, c) with T >= w S + c on the last stage's own tail path (Schedule.tail_path: the
    earlier stages' first forward chunks, all of the last stage's m micro-batches, each hop
    once, the last stage's reduction and tied all-reduce, the optimizer), given lo (f_s >= lo
    t_s on every stage), the last stage's (least time, least tail) per option `lasts`, twice
    the least sum of the hops `hops` and the optimizer term `opt`:
        T >= (lo / v) (S - t_last) + m t_last + tail + sum h + opt
          >= w S + min over lasts of (m - w) t + tail + hops / 2 + opt,   w = lo / v
    (increasing in S and t_last, so their least values give a bound)."""
    w, own = lo * path.fwd[0], path.fwd[-1]
    return w, min((own - w) * t + tail for t, tail in lasts) + path.hop[0] * hops / 2 + opt


class EndCase(NamedTuple):
    """`_EndStages` at a point Z for one pair of the ends' node types: stage 0's (least time,
    tail less the bound's) per option, the non-dominated ones by time; the last stage's least
    time; the constants of the chain path through the last stage and of its own tail path
    (0 off the simulated basis)."""
    first: tuple[tuple[float, float], ...]
    last: float
    c_chain: float
    c_own: float


class EndTerms(NamedTuple):
    """`_EndStages` at a point Z: a case per pair of node types the two ends may run on (a
    plan's ends are one of them), and the weights of S in the chain path and the tail path."""
    cases: tuple[EndCase, ...]
    w_chain: float = 0.0
    w_own: float = 0.0

    def step(self, w_z: float, w_sum: float, z: float, S: float, rest: float) -> float:
        """At least the step T of a pair (w_z, w_sum, rest) at z = max(Z, S / pp): over the
        ends' type pairs, the least of the joint per stage-0 option of z >= its time and its
        tail, z >= the last stage's time, the chain and the last stage's own tail path."""
        return min(self._case(c, w_z, w_sum, z, S, rest) for c in self.cases)

    def _case(self, c: EndCase, w_z: float, w_sum: float, z: float, S: float, rest: float) -> float:
        z = max(z, c.last)
        pair = w_sum * S + rest + min(w_z * max(z, t0) + up for t0, up in c.first)
        return max(pair, self.w_chain * S + c.c_chain, self.w_own * S + c.c_own)


def _pairs_front(pairs: list[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """The (time, tail) pairs no other beats in both, by time (tails falling)."""
    out: list[tuple[float, float]] = []
    for t, up in sorted(pairs):
        if not out or up < out[-1][1]:
            out.append((t, up))
    return tuple(out)


def _least_time(coef: Coefficients, o: int, s: int, n: int) -> float | None:
    """The least time t = a n + rho r + c of a stage at position s running option o with n
    layers within memory (`_least_stage_time` of its fits)."""
    return _least_stage_time(coef.time(o, s)[0], coef.memory(o, s), coef.capacity(o), coef.full(o), n)


def _least_stage_time(t: Affine, m: Affine, capacity: float, full: bool, n: int) -> float | None:
    """The least time t(n, r) of a stage of n layers whose memory m(n, r) fits `capacity` (with
    a slack of 1e-6 of it), r the recomputed layers (`_least_recompute`); None when no r fits."""
    lo = float(_least_recompute(m, capacity, full, n))
    if lo > n:
        return None
    return min(t(n, lo), t(n, n)) if full else t(n)


def _least_recompute(m: Affine, capacity: float, full: bool, n):
    """The fewest recomputed layers r of a stage of n layers (a number or a numpy array of them)
    whose memory m(n, r) fits `capacity` (with a slack of 1e-6 of it): 0 without full recompute,
    else 1 <= r <= n and at least what memory forces where recomputing saves memory (rho_m < 0),
    and every r up to n fits too. Where no r fits: n + 1."""
    cap = capacity * (1 + 1e-6)
    if not full:
        return np.where(m.a * n + m.c <= cap, 0.0, n + 1.0)
    if m.rho < 0:
        return np.maximum(1.0, np.ceil((m.a * n + m.c - cap) / -m.rho - 1e-9))
    return np.where(m.a * n + m.rho + m.c <= cap, 1.0, n + 1.0)


class _StageZeroLayers:
    """`_EndStages`' n_i(Z) per slot of one placement (slots, pp, L, unit), at each Z on
    first use, shared by every config of that placement: 0 where stage 0 cannot be of slot i
    (the others cannot form pp - 1 stages, or one stage of i holds fewer than n_i(Z))."""

    def __init__(self, slots: list[SlotType], pp: int, L: int, unit: int):
        self.slots, self.pp, self.L, self.unit = slots, pp, L, unit
        self._at: dict[float, tuple[int, ...]] = {}

    def at(self, z: float) -> tuple[int, ...]:
        got = self._at.get(z)
        if got is None:
            got = self._at[z] = self._layers(z)
        return got

    def _layers(self, z: float) -> tuple[int, ...]:
        unit, runs = self.unit, [sorted(_stage_runs(z, slot, self.unit), reverse=True) for slot in self.slots]
        out = []
        for i in range(len(self.slots)):
            own = max((v for v, _ in runs[i]), default=0)   # the most one stage of slot i holds at z
            most = _others_most(runs, self.slots, i, self.pp - 1)
            n = 0 if most is None else max(unit, -(-(self.L - most) // unit) * unit)
            out.append(n if own and n <= own else 0)
        return tuple(out)


def _others_most(runs: list[list[tuple[int, int]]], slots: list[SlotType], i: int, rest: int) -> int | None:
    """At least the most layers `rest` stages hold besides one stage of slot i (each type's
    non-increasing increments `runs`, slot i's with one stage fewer), after the first increment
    of each other required slot; None when they cannot form `rest` stages."""
    if runs[i]:
        v, count = runs[i][-1]
        runs = runs[:i] + [runs[i][:-1] + [(v, count - 1)]] + runs[i + 1:]
    return _stages_hold(runs, [slot.required and j != i for j, slot in enumerate(slots)], rest)


def _stages_hold(runs: list[list[tuple[int, int]]], required: list[bool], rest: int) -> int | None:
    """The most layers `rest` stages hold over the node types' increments `runs` (each type's
    non-increasing), every required type hosting one stage (its first, largest increment) and
    the others taking the largest increments left; None when they cannot form `rest` stages."""
    total, pool = 0, []
    for req, rs in zip(required, runs):
        rs = [(v, c) for v, c in rs if c > 0]
        if req:
            if not rs:
                return None
            (v, count), *more = rs
            total, rest, rs = total + v, rest - 1, [(v, count - 1)] + more
        pool += rs
    if rest < 0:
        return None
    got, taken = _top_stages(pool, rest)
    return total + got if taken == rest else None


def _sync_by_end(coef: Coefficients, caps: dict[int, int], usable: list[int]) -> dict[int, float]:
    """Option o0 -> at least the tied all-reduce E of any plan with o0 at stage 0: the least over
    the last stage's options of `_tied_sync_lower_bound`'s slower direction (its least over
    o0 is that bound)."""
    cfg = coef.cfg
    if cfg.pp < 2 or not coef.inst.model.tied_embeddings:
        return dict.fromkeys(usable, 0.0)
    ends = {(coef.pool_of[o], coef.options[o].tp): o for o in usable}   # E reads an end's pool and tp
    spec = {(q, tp): (coef.pools[q].k, coef.pools[q].group, tp, caps[q] >= 2,
                      coef.pools[q].place.stages_per_node >= cfg.pp) for q, tp in ends}
    # ... and what of the pool E reads: configs that agree on these share the table (as TiedSyncKey)

    def table() -> dict:
        to = {(e, k1, same): coef.embedding_sync(o, k1, same) for e, o in ends.items()
              for k1 in {coef.pools[q].k for q, _ in ends} for same in (False, True)}
        least = {}
        for (q0, tp0) in ends:
            best = math.inf
            for (q1, tp1) in ends:
                if q0 == q1 and caps[q0] < 2:
                    continue
                same = q0 == q1 and coef.pools[q0].place.stages_per_node >= cfg.pp
                best = min(best, max(to[(q0, tp0), coef.pools[q1].k, same], to[(q1, tp1), coef.pools[q0].k, same]))
            least[spec[q0, tp0][:3]] = 0.0 if best == math.inf else best
        return least
    least = coef.shared.get(("sync by end", TiedSyncKey(tuple(sorted(set(spec.values()))))), table)
    return {o: least[spec[coef.pool_of[o], coef.options[o].tp][:3]] for o in usable}


def _type_gpus(coef: Coefficients, k: int, limits: Limits) -> int:
    """GPUs of node type k a plan may use: its count, and what a $/h budget rents of it alone."""
    nt = coef.types[k]
    gpus = nt.count * nt.gpus_per_node
    if limits.budget_usd_per_hour is not None:
        gpus = min(gpus, nt.gpus_affordable(limits.budget_usd_per_hour * (1 + 1e-9)))
    return gpus


def _affordable_stages(coef: Coefficients, q: int, limits: Limits, pp: int | None = None) -> int:
    """Most stages pool q can hold in this config (or in one like it of `pp` stages), and
    within a $/h budget on its own (a relaxation: other pools' stages only add to the bill)."""
    most = coef.max_stages(q, pp)
    if limits.budget_usd_per_hour is None:
        return most
    cap = limits.budget_usd_per_hour * (1 + 1e-9)
    return max([j for j in range(most + 1) if coef.usd_per_hour(q, j) <= cap])


def _p2p_lower_bound(coef: Coefficients) -> float:
    """The transfers of the step's lower bound (Coefficients.step_p2p) at their least: pp - 1 hops, at least R - 1 of them between the R node
    types the config must use (and the interleaved wrap between two of them when R >= 2),
    each at least the cheapest transfer of its kind any pool sends."""
    return coef.step_p2p(*_least_hops(coef)) if coef.cfg.pp >= 2 else 0.0


def _hop_floors(coef: Coefficients) -> tuple[float, float | None]:
    """(the least hop of any kind, the least hop between two node types, None where the config
    has one type): every pool's hop to a stage of another node type, and to one of its own type
    (within a node where a node holds two stages, else between nodes)."""
    types = {pool.k for pool in coef.pools}
    inter = [coef.hop_inter(q, j) for q, pool in enumerate(coef.pools) for j in types if j != pool.k]
    same = [coef.hop_intra(q) if pool.place.stages_per_node >= 2 else coef.hop_inter(q, pool.k)
            for q, pool in enumerate(coef.pools)]
    return min(same + inter), (min(inter) if inter else None)


def _least_hops(coef: Coefficients) -> tuple[list[float], float]:
    """(_p2p_lower_bound's pp - 1 hops at their least, the wrap at its least); pp >= 2."""
    cfg, R = coef.cfg, len(coef.required_types)
    least, inter = _hop_floors(coef)
    crossing = max(R - 1, 0)
    hops = [least] * (cfg.pp - 1 - crossing) + [inter] * crossing if inter is not None else [least] * (cfg.pp - 1)
    wrap = inter if (R >= 2 and inter is not None) else least
    return hops, wrap


def _tied_sync_lower_bound(coef: Coefficients, caps: dict[int, int], usable: list[int]) -> float:
    """At least the tied embedding's all-reduce E of any plan of the config (stage 0's and the
    last stage's tails hold it, PlanCosts.tail_s; costmodel.tied_embedding_sync_s): the ends
    run options o0 and o1 with a layer of room, from pools with a stage to offer (two stages
    where they share a pool), and E is the slower direction, max(E(o0 -> k1), E(o1 -> k0)),
    within one node only where one pool's node holds all pp stages (a second run of a pool
    starts on a fresh node). 0 without tied embeddings or at pp = 1. On the default cluster a
    32-GPU pp 2 config must put one end on the A10 nodes: E >= 165 ms over their links."""
    cfg = coef.cfg
    if cfg.pp < 2 or not coef.inst.model.tied_embeddings:
        return 0.0
    ends = {(coef.pool_of[o], coef.options[o].tp): o for o in usable}   # E reads an end's pool and tp
    # ... the pool's node type and stage size, whether it holds two stages and whether one node
    # holds all pp: configs that agree on these share the bound
    key = TiedSyncKey(tuple(sorted({(coef.pools[q].k, coef.pools[q].group, tp, caps[q] >= 2,
                                     coef.pools[q].place.stages_per_node >= cfg.pp) for q, tp in ends})))

    def least() -> float:
        # each end's direction to every node type, once (a parent has ~100 ends: 2 |ends|^2 links
        # were 27 ms); across pools (never one node) the two directions are independent, so the
        # least max is between each type pair's best few ends (_least_pair); within a pool, pairwise
        types = sorted({coef.pools[q].k for q, _ in ends})
        to = {(e, k1): coef.embedding_sync(o, k1, False) for e, o in ends.items() for k1 in types}
        best = _least_pair(ends, to, types, lambda e: coef.pools[e[0]].k)
        for (q0, tp0), o0 in ends.items():
            if caps[q0] < 2:
                continue
            same = coef.pools[q0].place.stages_per_node >= cfg.pp
            k0 = coef.pools[q0].k
            for (q1, tp1), o1 in ends.items():
                if q1 == q0:
                    best = min(best, max(coef.embedding_sync(o0, k0, same), coef.embedding_sync(o1, k0, same)))
        return 0.0 if best == math.inf else best
    return coef.shared.get(key, least)


def _least_pair(ends: dict, to: dict, types: list[int], type_of) -> float:
    """min over ends e0, e1 of different pools (e[0]) of max(to[e0, type e1], to[e1, type e0]).
    For a pair of node types the two terms are independent but for the pool: the least max is
    among each side's two least ends of distinct pools (where both least share a pool, one of
    them gives way to its side's runner-up)."""
    by_type: dict[int, list] = {}
    for e in ends:
        by_type.setdefault(type_of(e), []).append(e)
    best = math.inf
    for k0 in types:
        for k1 in types:
            side0 = _two_least(by_type[k0], lambda e: to[e, k1])
            side1 = _two_least(by_type[k1], lambda e: to[e, k0])
            for v0, e0 in side0:
                for v1, e1 in side1:
                    if e0[0] != e1[0]:
                        best = min(best, max(v0, v1))
    return best


def _two_least(es: list, value) -> list:
    """The least (value, end) and the least of another pool than its (at most two)."""
    first = min(((value(e), e) for e in es), default=None)
    if first is None:
        return []
    other = min(((value(e), e) for e in es if e[0] != first[1][0]), default=None)
    return [first] if other is None else [first, other]


def _placement_terms(slots: list[SlotType], pp: int, L: int, unit: int):
    """(breakpoints, bottleneck bound, (least layer sum, least $/h) at unbounded z, the joint
    bound's points `_Sweep`)."""
    cands = _breakpoints(slots, L, unit)
    z = _bottleneck_bound(slots, pp, L, unit, cands)
    if z is None:
        return cands, None, None, None
    return cands, z, _least_at_inf(slots, pp, L, unit), _Sweep(slots, pp, L, unit, cands, z)


def _slots(coef: Coefficients, by_type: dict[int, list], limits: Limits, gpu_hour: dict) -> list[SlotType]:
    """One slot per node type of the config's pools (`by_type`: host type -> its pools). With
    mixed-type bundles, the node types a bundle joins and the bundle form one slot, over the
    types' GPUs (`SlotType.shares`): a bundle's GPUs are its members' (add_shared_nodes), so
    counting them apart would count them twice."""
    K = len(coef.inst.cluster.node_types)
    index = {nt: k for k, nt in enumerate(coef.inst.cluster.node_types)}
    members = {k: [index[nt] for nt, _ in coef.types[k].members] for k in by_type if k >= K}
    group = {k: k for k in set(by_type) | {r for rs in members.values() for r in rs}}

    def root(k: int) -> int:
        while group[k] != k:
            k = group[k]
        return k
    for k, rs in members.items():
        for r in rs:
            group[root(r)] = root(k)
    out: dict[int, list[int]] = {}
    for k in sorted(group):
        out.setdefault(root(k), []).append(k)
    slots = []
    for ks in sorted(out.values()):
        hosts = [k for k in ks if k in by_type]
        required = any(k in coef.required_types for k in hosts)
        if len(ks) == 1:
            slots.append(SlotType(_type_gpus(coef, ks[0], limits), tuple(by_type[ks[0]]), required, gpu_hour[ks[0]]))
            continue
        pools, owner = [], []
        for k in hosts:
            pools += by_type[k]
            owner += [k] * len(by_type[k])
        shares = tuple((_type_gpus(coef, r, limits),
                        tuple(i for i, k in enumerate(owner) if k == r or r in members.get(k, ())))
                       for r in ks if r < K)
        slots.append(SlotType(sum(g for g, _ in shares), tuple(pools), required, min(gpu_hour[k] for k in hosts),
                              shares))
    return slots


class _OptionTerms(NamedTuple):
    """What the bound reads of a config's stage options O (those with a stage to offer) and the
    usable ones (a layer of room): stage 0's and the last stage's time fits, the least
    recompute, ends and per-layer work, the prices, the reduction fits and the least optimizer
    time per layer. They depend on the options, pp == 1 (the ends a stage holds) and the
    distributed optimizer alone (`OptionTermsKey`), so configs of every other pp, schedule and
    switch share them."""

    t: dict          # option -> [t at stage 0, t at the last stage]
    rho: float
    ends: float
    price: dict      # usable option -> least $/h of a stage
    forced: list
    least_work: float
    dp0: list
    opt_a: float

    def extra(self, pp: int) -> float:
        """The stage sum's fixed part: the ends' time and pp stages' least recompute."""
        return self.ends + pp * self.rho

    def gpu_usd(self, pp: int) -> float:
        """The least $/h of pp stages: the forced ones, the rest at the least price."""
        return sum(self.forced) + min(self.price.values()) * (pp - len(self.forced))

    def opt(self, L: int, pp: int) -> float:
        """The least optimizer step: some stage holds at least ceil(L / pp) layers."""
        return self.opt_a * math.ceil(L / pp)


def shared_option_terms(coef: Coefficients, O: list[int], usable: list[int]) -> _OptionTerms:
    """`_option_terms`, memoised in the instance's cache per the options they read."""
    key = OptionTermsKey(tuple(coef.options[o] for o in O), tuple(coef.options[o] for o in usable),
                         coef.cfg.pp == 1, coef.cfg.distributed_optimizer, coef.required_types)
    return coef.shared.get(key, lambda: _option_terms(coef, O, usable))


def _option_terms(coef: Coefficients, O: list[int], usable: list[int]) -> _OptionTerms:
    cfg, opts = coef.cfg, coef.options
    t = {opts[o]: [coef.time(o, s)[0] for s in (0, cfg.pp - 1)] for o in O}
    # each stage recomputes at least one layer where its option recomputes fully
    rho = min(t[opts[o]][0].rho if coef.full(o) else 0.0 for o in O)
    if cfg.pp == 1:
        ends = min(t[opts[o]][0].c for o in O)
    else:
        ends = min(t[opts[o]][0].c for o in O) + min(t[opts[o]][1].c for o in O)
    # a stage of option o rents at least its GPUs (Coefficients.stage_usd_per_hour); a free
    # config rents at least one stage of each node type it gives a stage size
    price = {opts[o]: coef.stage_usd_per_hour(opts[o].k, opts[o].group) for o in usable}
    forced = [min(price[opts[o]] for o in usable if opts[o].k == k) for k in sorted(coef.required_types)]
    least_work = min(price[opts[o]] * t[opts[o]][0].a for o in usable)
    # the dp tail is at least stage 0's reduction (nothing hides it) at vpp layers or more; the
    # optimizer max at least the biggest stage's
    dp0 = [coef.dp_time(o, 0)[0] for o in O]   # piece 0: at most the exposed reduction, non-decreasing in n
    opt_a = min(coef.opt_time(o, 0).a for o in O)
    return _OptionTerms(t, rho, ends, price, forced, least_work, dp0, opt_a)


def _least_at_inf(slots: list[SlotType], pp: int, L: int, unit: int, coupled: bool = True) -> tuple[float, float]:
    """(least layer sum, least $/h) at unbounded z."""
    return _least_layer_sum(math.inf, slots, pp, L, unit, coupled), _least_usd_per_hour(math.inf, slots, L, unit)


class LayerCeiling(NamedTuple):
    """At most the layers the stages of a config hold within memory, whatever the schedule, the
    micro-batches in flight and the layer split (`layer_ceiling`): by its positions' ends
    (pp = 1: the one stage; pp = 2: the first and the last; pp >= 3: those and each middle
    stage), and by the node types' GPUs."""
    ends: int       # the end stages together (pp = 1: its one stage)
    middle: int     # one middle stage (0 where pp < 3)
    by_gpus: int    # every stage, within the node types' GPUs


def layer_ceiling(coef: Coefficients) -> LayerCeiling:
    """`LayerCeiling` of the config, from each option's state room
    (`state_room`: its most layers by its model states alone, at a position with given ends;
    activations only add): a stage at the first (last, a middle) position holds at most the
    largest state room of any option there, and a stage of g GPUs of node type k at most g x
    d_k layers, d_k the most layers per GPU of any option of k at any of the positions, so the
    stages on k hold at most floor(G_k d_k) (G_k its GPUs; a mixed-type bundle's stages share
    their members' GPUs, counted again: only larger). Memoised per options, the distributed
    optimizer and the kinds of position pp has (1, 2, more)."""
    kinds = min(coef.cfg.pp, 3)
    key = ("layer ceiling", coef.options_key, coef.cfg.distributed_optimizer, kinds)
    return coef.shared.get(key, lambda: _layer_ceiling(coef, kinds))


def _layer_ceiling(coef: Coefficients, kinds: int) -> LayerCeiling:
    ends = [(True, True, True)] if kinds == 1 else [(True, False, False), (False, True, False)]
    middle = [(False, False, False)] if kinds == 3 else []
    rooms = {pos: [state_room(coef, opt, *pos) for opt in coef.options] for pos in ends + middle}
    density: dict[int, float] = {}
    for o, opt in enumerate(coef.options):
        density[opt.k] = max(density.get(opt.k, 0.0), max(r[o] for r in rooms.values()) / opt.group)
    by_gpus = sum(math.floor(coef.types[k].count * coef.types[k].gpus_per_node * d * (1 + 1e-12))
                  for k, d in density.items())
    return LayerCeiling(sum(max(rooms[pos], default=0) for pos in ends),
                        max(rooms[middle[0]], default=0) if middle else 0, by_gpus)


def state_room(coef: Coefficients, opt: StageOption, first: bool, last: bool, single: bool) -> int:
    """The most layers (0 to L) a stage of option `opt` at a position with these ends holds
    within its GPUs' usable memory by its model states alone (costmodel.stage_state_bytes:
    weights, gradients, optimizer; they grow with the layers), found by bisection on the cost
    model itself; memoised per what the states read: the option's node type, tp and dp (not its
    micro-batch or recompute), the ends and the distributed optimizer."""
    distopt = coef.cfg.distributed_optimizer

    def room() -> tuple[int]:
        inst, L = coef.inst, coef.inst.model.num_layers
        cap = cm.usable_memory_bytes(inst, coef.types[opt.k])

        def fits(n: int) -> bool:
            return sum(cm.stage_state_bytes(inst, [coef.kind] * n, first, last, single, opt.tp, opt.dp,
                                            distopt)) <= cap
        if not fits(1):
            return (0,)
        lo, hi = 1, L + 1   # fits(lo), not fits(hi) (L + 1: beyond every stage)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return (lo,)
    return coef.shared.get(("state room", opt.k, opt.tp, opt.dp, first, last, single, distopt), room)[0]


def may_hold_layers(coef: Coefficients) -> bool:
    """False when the config's pp stages cannot hold the model's L layers within memory
    (`layer_ceiling`): a proof that the config has no plan. GPT-3 175B on the default 32 GPUs:
    every config, which the full bounds ruled out one by one (formulations/pipeline.md, "The
    layer ceiling")."""
    pp, L, c = coef.cfg.pp, coef.inst.model.num_layers, layer_ceiling(coef)
    return c.ends + max(pp - 2, 0) * c.middle >= L and (pp == 1 or c.by_gpus >= L)


def usable_options(coef: Coefficients, limits: Limits, memory: bool = True, type_caps: dict[int, int] | None = None
                   ) -> tuple[dict[int, int], list[int], dict[int, int], list[int]] | None:
    """(most stages per pool within the limits, the options with a stage to offer, the most
    layers each holds within memory (any position: memory falls with the position among middle
    stages, so the first, the last or the last middle stage offers the most; memory=False: L),
    the options with room for a layer); None when no plan of the config can place its stages.
    `type_caps` (node type -> most stages): the plans considered host at most that many stages
    on the type (each of its pools at most that many: a relaxation where it has several)."""
    cfg, L = coef.cfg, coef.inst.model.num_layers
    caps = {q: _affordable_stages(coef, q, limits) for q in range(len(coef.pools))}
    if type_caps:
        caps = {q: min(c, type_caps.get(coef.pools[q].k, c)) for q, c in caps.items()}
    O = [o for o in range(len(coef.options)) if caps[coef.pool_of[o]] > 0]
    if not O or sum(caps.values()) < cfg.pp:
        return None
    if memory:
        positions = tuple(sorted({0, max(cfg.pp - 2, 0), cfg.pp - 1}))
        every = coef.rooms(positions)
        rooms = {o: every[o] for o in O}
    else:
        rooms = dict.fromkeys(O, L)
    usable = [o for o in O if rooms[o]]
    if not usable or coef.required_types - {coef.options[o].k for o in usable}:
        # no stage holds a layer within memory, or a node type the config must use holds none
        return None
    return caps, O, rooms, usable


def stage_slots(coef: Coefficients, limits: Limits, memory: bool, caps: dict[int, int], rooms: dict[int, int],
                usable: list[int], per_layer: Callable[[int], float],
                pieces: Callable[[int], tuple[tuple[float, int], ...]] | None = None) -> list[SlotType]:
    """The node types' slots of the bottleneck bound (`SlotType`), each usable option o offering
    (per_layer(o), rooms[o]) in its pool, or the alternatives pieces(o) where given (a full-
    recompute option's `_every_recompute_pieces`); memory=False: each pool offers its stages on its
    own (no GPU sharing where a type's stage size is open)."""
    gpu_hour = {k: nt.usd_per_gpu_hour for k, nt in enumerate(coef.types)}
    alts: dict[int, list[tuple[float, int]]] = {}
    for o in usable:
        alts.setdefault(coef.pool_of[o], []).extend(pieces(o) if pieces else [(per_layer(o), rooms[o])])
    by_type: dict[int, list] = {}
    for q in sorted(alts):
        by_type.setdefault(coef.pools[q].k, []).append((coef.pools[q].group, caps[q], _front(alts[q])))
    if memory:
        return _slots(coef, by_type, limits, gpu_hour)
    return [SlotType(_type_gpus(coef, k, limits), (pool,), k in coef.required_types, gpu_hour[k])
            for k, pools in sorted(by_type.items()) for pool in pools]


RECOMPUTE_PIECES = 4   # _every_recompute_pieces: at most this many (per-layer time, room) alternatives per option
PIECE_STEP = 0.02      # ... a new one where the least per-layer time has grown by this share


def shared_recompute_pieces(coef: Coefficients, positions: tuple[int, ...], rooms: dict[int, int],
                            options: list[int], times: dict | None = None) -> dict[int, tuple[tuple[float, int], ...]]:
    """`_every_recompute_pieces` of `options`, memoised in the instance's cache per what an
    option's pieces read: its memory at the positions (FitsKey) and its room; the missing ones
    made at once."""
    return coef.shared.get_many({o: ("pieces", coef.fits_key(o, positions), rooms[o]) for o in options},
                                lambda todo: _every_recompute_pieces(coef, todo, positions, rooms, times))


def _every_recompute_pieces(coef: Coefficients, options: list[int], positions: tuple[int, ...],
                            rooms: dict[int, int], times: dict | None = None) -> dict[int, tuple[tuple[float, int], ...]]:
    """Each option o's (per-layer time, room) alternatives as a stage (`rooms[o]`: its most
    layers at any of `positions`, `usable_options`), at once (numpy over the options and the
    layer counts). Without full recompute: (a, room). Under full recompute a stage of n layers
    recomputes r >= 1 of them, and where it holds more than memory allows without: memory
    a_m n + rho_m r + c_m <= cap (rho_m < 0) needs r >= r_min(n) =
    max(1, ceil((a_m n + c_m - cap) / -rho_m)) at its position, at least the least r_min of
    `positions` (memory falls with the position among middle stages: the least is at the
    first, the last or the last middle stage). Its time a n + rho r + c is then at least
    e(n) n + rho + c, e(n) = a + rho (r_min(n) - 1) / n (the one recompute every such stage
    makes, rho, stays with the stage's fixed part: the bound's `extra` counts it where every
    option recomputes), and e(n) >= ē(n) = min of e over n..room, nondecreasing: a stage of n
    in [n_j, n_{j+1}) layers has ē(n_j) n <= a n + rho (r - 1), so the pieces (ē(n_j),
    n_{j+1} - 1) replace (a, room) wherever the bound reads a stage's a n. A new piece starts
    where ē has grown by PIECE_STEP, at most RECOMPUTE_PIECES of them. `times`: each option's
    time fits at the first and the last stage where known (`_OptionTerms.t`)."""
    pp, out, todo = coef.cfg.pp, {}, []
    rows = [coef.memory_rows(s) for s in positions]   # (a, rho, c, cap, full) of every option
    for o in options:
        ts = times[coef.options[o]] if times else [coef.time(o, s)[0] for s in (0, pp - 1)]
        a, rho = min(t.a for t in ts), min(t.rho for t in ts)
        if not coef.full(o) or rho <= 0 or rooms[o] < 2 or any(m[1][o] >= 0 for m in rows):
            out[o] = ((a, rooms[o]),)
        else:
            todo.append((o, a, rho, rooms[o]))
    if not todo:
        return out
    idx = np.array([o for o, *_ in todo])
    a, rho, room = (np.array([x[i] for x in todo], dtype=float)[:, None] for i in (1, 2, 3))
    n = np.arange(1, int(room.max()) + 1, dtype=float)[None, :]
    r_min = np.full((len(todo), n.shape[1]), np.inf)
    for ma, mrho, mc, cap, _ in rows:
        ma, mrho, mc, cap = ma[idx, None], mrho[idx, None], mc[idx, None], cap[idx, None]
        holds = (ma + mrho) * n + mc <= cap * (1 + 1e-12)   # positions that hold n layers at all
        need = _fewest_recomputes(ma, mrho, mc, cap, n)
        r_min = np.where(holds, np.minimum(r_min, need), r_min)
    r_min = np.where(np.isinf(r_min), 1.0, r_min)
    e = np.where(n <= room, a + rho * (r_min - 1) / n, np.inf)
    e = np.minimum.accumulate(e[:, ::-1], axis=1)[:, ::-1]   # suffix minimum: ē, nondecreasing in n
    for (o, _, _, top), row in zip(todo, e.tolist()):
        pieces, start = [], 1   # the piece from `start` layers on
        while len(pieces) < RECOMPUTE_PIECES - 1:
            nxt = bisect.bisect_right(row, row[start - 1] * (1 + PIECE_STEP), start, top) + 1   # first n above
            if nxt > top:
                break
            pieces.append((row[start - 1], nxt - 1))
            start = nxt
        out[o] = (*pieces, (row[start - 1], top))
    return out


def _fewest_recomputes(ma, mrho, mc, cap, n):
    """Under full recompute, the fewest recomputed layers r >= 1 with which n layers fit the
    memory a_m n + rho_m r + c_m <= cap (rho_m < 0: recomputing saves memory), elementwise."""
    return np.maximum(1.0, np.ceil((ma * n + mc - cap) / -mrho - 1e-9))


def _two_stage_paths(sched, m: int) -> "np.ndarray":
    """The rows (f_0, f_1, b_0, b_1, hop, wrap, dp_0, dp_1, opt) of the paths every plan of a
    two-stage pipeline of (schedule, vpp, m) has: Schedule.stage_paths, the tail path and the
    drain path (the optimizer steps counted as the largest, as the model reads them)."""
    return np.array([[*p.fwd, *p.bwd, p.hop[0], p.wrap, *p.dp, 1.0 if sum(p.opt) else 0.0]
                     for p in _split_paths(sched, 2, m)])


def _split_paths(sched, pp: int, m: int) -> list[PathTerms]:
    """The paths the split bounds read: Schedule.stage_paths, the tail path and the drain path."""
    return sched.stage_paths(pp, m) + [sched.tail_path(pp, m)] + [p for p in (sched.drain_path(pp, m),) if p]


def _two_stage_rows(coef: Coefficients, o: int, s: int, unit: int) -> "np.ndarray":
    """(f, b, d, opt) of stage position s (0 or 1) of a two-stage plan run as option o, for each
    split n = unit, 2 unit, .. < L (stage 0 holds n layers, stage 1 L - n): rows of 4, inf where
    memory holds no r. Each is the least over the recomputes that fit (`_least_recompute`,
    vectorised: r in [r_lo, n], affine in r, so the least is at an end), d the reduction's
    piece 0 (Coefficients.dp_time). Memoised per what it reads: the option's memory fit's key
    at s (the option, the ends, the micro-batches in flight, the switches), which fixes its
    time, reduction and optimizer fits too, and the unit."""
    return coef.shared.get(("two-stage rows", coef.memory_key(coef.options[o], s), unit),
                           lambda: _two_stage_rows_of(coef, o, s, unit))


def _two_stage_rows_of(coef: Coefficients, o: int, s: int, unit: int) -> "np.ndarray":
    L = coef.inst.model.num_layers
    ns = np.arange(unit, L, unit, dtype=float)
    return _rows_at(coef, o, s, ns if s == 0 else L - ns)


def _stage_rows(coef: Coefficients, o: int, s: int, unit: int) -> "np.ndarray":
    """`_two_stage_rows`' (f, b, d, opt) of option o at stage position s of any pp, for n =
    unit, 2 unit, .. L layers (row j: n = (j + 1) unit), memoised per the same key."""
    L = coef.inst.model.num_layers
    return coef.shared.get(("stage rows", coef.memory_key(coef.options[o], s), unit),
                           lambda: _rows_at(coef, o, s, np.arange(unit, L + 1, unit, dtype=float)))


def _rows_at(coef: Coefficients, o: int, s: int, n: "np.ndarray") -> "np.ndarray":
    """(f, b, d, opt) of option o at stage position s holding n layers (an array), inf where
    memory holds no recompute (`_two_stage_rows`)."""
    t, b = coef.time(o, s)
    d, q = coef.dp_time(o, s)[0], coef.opt_time(o, s)
    full = coef.full(o)
    lo = _least_recompute(coef.memory(o, s), coef.capacity(o), full, n)
    fits = lo <= n
    lo = np.minimum(lo, n)
    rs = (lo, n) if full else (lo * 0.0,)

    def least(fit: Affine) -> "np.ndarray":
        return np.min([fit.a * n + fit.rho * r + fit.c for r in rs], axis=0)
    f = np.min([(t.a - b.a) * n + (t.rho - b.rho) * r + (t.c - b.c) for r in rs], axis=0)
    out = np.stack([f, least(b), least(d), q.a * n + q.c], axis=1)
    out[~fits] = np.inf
    return out


def _two_stage_bound(coef: Coefficients, limits: Limits, caps: dict[int, int], usable: list[int], unit: int,
                     gpu_usd: float) -> float | None:
    """A two-stage config on the simulated basis (formulations/pipeline.md, "Two stages:
    every split"): the plan is stage 0 of option o_0 with n layers and stage 1 of o_1 with L - n
    (n a multiple of `unit`), and its step is at least every path's length
    (`_two_stage_paths`), each increasing in the stages' f, b, reductions, the hop, the wrap and
    the optimizer step. So T >= min over (o_0, o_1, n) of max over the paths of their lengths
    at each stage's least f, b and reduction within memory (`_two_stage_rows`), the least hop
    and wrap (`_least_hops`), the least tied all-reduce E of the pair (`_sync_by_end`, both
    tails hold it) and the larger optimizer step. Pairs: the config's required node types
    both hosted, a pool with two stages only where it may hold two, and one node type's two
    stages within its GPUs. None: no pair and split fits (no plan)."""
    L, K = coef.inst.model.num_layers, len(coef.inst.cluster.node_types)
    ns = np.arange(unit, L, unit)
    if not len(ns):
        return None   # two stages of a chunk each hold more than L layers
    if any(coef.options[o].k >= K for o in usable) or not coef.cfg.sched.modelled:
        return 0.0    # mixed-type bundles (stages across types), or a schedule the paths do not cover: no bound
    W = coef.shared.get(("two-stage paths", coef.cfg.schedule, coef.cfg.vpp, coef.m),
                        lambda: (_two_stage_paths(coef.cfg.sched, coef.m),))[0]
    (hop,), wrap = _least_hops(coef)
    sync = _sync_by_end(coef, caps, usable)
    first = np.array([_two_stage_rows(coef, o, 0, unit) for o in usable])            # (O, N, 4)
    last = np.array([_two_stage_rows(coef, o, 1, unit) for o in usable])             # n_1 = L - n
    opts, pools = [coef.options[o] for o in usable], [coef.pool_of[o] for o in usable]
    least_e = np.array([sync[o] for o in usable])
    E = np.maximum.outer(least_e, least_e)
    k, g, pool = np.array([x.k for x in opts]), np.array([x.group for x in opts]), np.array(pools)
    gpus = np.array([_type_gpus(coef, x, limits) for x in k])
    same = k[:, None] == k[None, :]
    ok = (~same | (g[:, None] + g[None, :] <= gpus[:, None])) & \
        ((pool[:, None] != pool[None, :]) | (np.array([caps[q] for q in pools]) >= 2)[:, None])
    for r in coef.required_types:   # each required node type hosts one of the two stages
        ok &= (k[:, None] == r) | (k[None, :] == r)
    if not ok.any():
        return None
    fits = np.isfinite(first[:, None, :, 0]) & np.isfinite(last[None, :, :, 0]) & ok[:, :, None]
    first, last = np.where(np.isfinite(first), first, 0.0), np.where(np.isfinite(last), last, 0.0)
    f0, b0, d0, q0 = (first[:, None, :, j] for j in range(4))                        # (O, 1, N)
    f1, b1, d1, q1 = (last[None, :, :, j] for j in range(4))                         # (1, O, N)
    e, q = E[:, :, None], np.maximum(q0, q1)
    lengths = np.max([w[0] * f0 + w[1] * f1 + w[2] * b0 + w[3] * b1 + w[4] * hop + w[5] * wrap
                      + w[6] * (d0 + e) + w[7] * (d1 + e) + w[8] * q for w in W], axis=0)
    lengths = np.where(fits, lengths, np.inf)
    T = float(lengths.min())
    return None if T == math.inf else bounded_objective(T * (1 - 1e-9), gpu_usd, limits)


FEW_STAGES = 3   # _few_stage_bound: complete configs of 3..FEW_STAGES stages


def _few_stage_paths(sched, pp: int, m: int) -> tuple["np.ndarray", ...]:
    """`_two_stage_paths` at any pp, as weight arrays (fwd (P, pp), bwd (P, pp), hop (P, pp - 1),
    wrap (P,), dp (P, pp), opt (P,))."""
    paths = _split_paths(sched, pp, m)
    return (np.array([p.fwd for p in paths]), np.array([p.bwd for p in paths]),
            np.array([p.hop for p in paths]).reshape(len(paths), pp - 1), np.array([p.wrap for p in paths]),
            np.array([p.dp for p in paths]), np.array([1.0 if sum(p.opt) else 0.0 for p in paths]))


def _compositions(units: int, pp: int) -> "np.ndarray":
    """Every way of cutting `units` into pp positive parts: an int array (C, pp)."""
    cuts = np.array(list(itertools.combinations(range(1, units), pp - 1)), dtype=int).reshape(-1, pp - 1)
    edges = np.hstack([np.zeros((len(cuts), 1), int), cuts, np.full((len(cuts), 1), units)])
    return np.diff(edges, axis=1)


def _few_stage_bound(coef: Coefficients, limits: Limits, caps: dict[int, int], usable: list[int], unit: int,
                     gpu_usd: float, enough: float = math.inf) -> tuple[float | None, int]:
    """`_two_stage_bound` for a complete config of 3..FEW_STAGES stages on the simulated basis
    (formulations/pipeline.md, "A few stages: every split"): T >= min over the stages' options
    o_0..o_{pp-1} (their pools' stage caps, the required node types hosted, each node type's
    stages within its GPUs) and every split of L into pp whole chunks of `unit` layers of the
    longest path (`_few_stage_paths`) at each stage's least f, b, reduction and optimizer step
    within memory at its position and layer count (`_stage_rows`). Hops: the least hop between
    two node types where the neighbours' types differ, else the least of any hop
    (`_hop_floors`); E: the larger of the two ends' least (`_sync_by_end`). An option no
    better than another of its pool in every term at every layer count is dropped (every
    path's length grows with every term). Branch and bound per pool tuple
    (`_least_longest_path`): within FEW_STAGE_BUDGET cells exact below `enough` (in objective
    units) and at least it where the exact bound is; always valid. None: no split fits (no
    plan). With the cells it evaluated (its work)."""
    cfg, L = coef.cfg, coef.inst.model.num_layers
    pp = cfg.pp
    if L % unit or any(coef.options[o].k >= len(coef.inst.cluster.node_types) for o in usable) \
            or not cfg.sched.modelled:
        return 0.0, 0    # no whole split in chunks, mixed-type bundles, or unmodelled paths: no bound
    W = coef.shared.get(("few-stage paths", cfg.schedule, cfg.vpp, pp, coef.m),
                        lambda: _few_stage_paths(cfg.sched, pp, coef.m))
    comps = coef.shared.get(("compositions", L // unit, pp), lambda: _compositions(L // unit, pp) - 1)   # row indices
    least, inter = _hop_floors(coef)
    inter = least if inter is None else inter
    sync = _sync_by_end(coef, caps, usable)
    pools = sorted({coef.pool_of[o] for o in usable})
    kind = {q: coef.pools[q].k for q in pools}
    group = {q: min(coef.options[o].group for o in usable if coef.pool_of[o] == q) for q in pools}
    gpus = {k: _type_gpus(coef, k, limits) for k in set(kind.values())}
    # per position and pool: the options no other of the pool beats in every term, their rows and E
    cand = {}
    for s in range(pp):
        for q in pools:
            rows = {o: _stage_rows(coef, o, s, unit) for o in usable if coef.pool_of[o] == q}

            def beats(p: int, o: int) -> bool:   # no worse in any term (of two equal ones, the first stays)
                return sync[p] <= sync[o] and bool((rows[p] <= rows[o]).all())
            kept = [o for o in rows if not any(p != o and beats(p, o) and (p < o or not beats(o, p)) for p in rows)]
            cand[s, q] = (np.array([rows[o] for o in kept]), np.array([sync[o] for o in kept]))
    # the step bound below which the objective stays below `enough` (min-cost: $/step = P T / 3600)
    cutoff = enough if limits.objective != "min-cost" or not gpu_usd else enough * SECONDS_PER_HOUR / gpu_usd
    best, cells = math.inf, 0
    for qs in itertools.product(pools, repeat=pp):
        if any(qs.count(q) > caps[q] for q in set(qs)) or \
                any(r not in {kind[q] for q in qs} for r in coef.required_types) or \
                any(sum(group[q] for q in qs if kind[q] == k) > gpus[k] for k in gpus):
            continue
        hops = np.array([inter if kind[a] != kind[b] else least for a, b in zip(qs, qs[1:])])
        wrap = inter if kind[qs[-1]] != kind[qs[0]] else least
        least_here, spent = _least_longest_path([cand[s, q] for s, q in enumerate(qs)], comps, W, hops, wrap,
                                                min(best, cutoff), FEW_STAGE_BUDGET - cells)
        best, cells = min(best, least_here), cells + spent
    return None if best == math.inf else bounded_objective(best * (1 - 1e-9), gpu_usd, limits), cells


FEW_STAGE_CELLS = 250_000   # _least_longest_path: option tuples x splits x paths evaluated at once ...
FEW_STAGE_BUDGET = 4_000_000   # ... and in all, per config (about 0.16 s)


def _least_longest_path(stages: list[tuple["np.ndarray", "np.ndarray"]], comps: "np.ndarray",
                        W: tuple["np.ndarray", ...], hops: "np.ndarray", wrap: float,
                        cutoff: float, budget: float = FEW_STAGE_BUDGET) -> tuple[float, int]:
    """The least over every option tuple (per stage, the candidates' rows (k, N, 4) and E (k,))
    and split (`comps`: layer chunks less one per stage) of the longest path `W`, inf where
    none fits; exact below `cutoff`, else at least it. Branch and bound: each split's longest
    path at every term's least over its stage's candidates (f, b and the reduction perhaps of
    different options: below every tuple's) orders the splits and cuts them; the splits are
    then evaluated over every option tuple, FEW_STAGE_CELLS cells at a time, until the next
    split's relaxed length reaches the least found or `cutoff`, or `budget` cells are spent
    (then the least found and the next relaxed length, whichever is less). With the cells
    evaluated, the relaxed ones included."""
    relaxed = _longest_paths([(r.min(axis=0, keepdims=True), e.min(keepdims=True)) for r, e in stages],
                             comps, W, hops, wrap)[0]                                          # (C,)
    order = np.argsort(relaxed, kind="stable")
    order = order[np.isfinite(relaxed[order])]
    tuples = math.prod(len(r) for r, _ in stages)
    chunk = max(1, FEW_STAGE_CELLS // (tuples * len(W[0])))
    best, spent = math.inf, len(comps) * len(W[0])
    for i in range(0, len(order), chunk):
        if relaxed[order[i]] >= min(best, cutoff) or spent >= budget:
            return min(best, float(relaxed[order[i]])), spent
        part = order[i:i + chunk]
        best = min(best, float(_longest_paths(stages, comps[part], W, hops, wrap).min()))
        spent += tuples * len(part) * len(W[0])
    return best, spent


def _longest_paths(stages: list[tuple["np.ndarray", "np.ndarray"]], comps: "np.ndarray",
                   W: tuple["np.ndarray", ...], hops: "np.ndarray", wrap: float) -> "np.ndarray":
    """(T, C): the longest path `W` of every option tuple (T: every choice of one candidate a
    stage, in itertools.product order) and split in `comps`; inf where a stage does not fit."""
    Wf, Wb, Wh, Ww, Wd, Wq = W
    pp = len(stages)
    tuples = np.array(list(itertools.product(*(range(len(r)) for r, _ in stages))), dtype=int)   # (T, pp)
    at = np.stack([stages[s][0][tuples[:, s]][:, comps[:, s]] for s in range(pp)], axis=2)       # (T, C, pp, 4)
    ends = np.maximum(stages[0][1][tuples[:, 0]], stages[-1][1][tuples[:, -1]])                   # (T,)
    fits = np.isfinite(at).all(axis=(2, 3))
    at = np.where(np.isfinite(at), at, 0.0)
    d = at[..., 2].copy()
    d[..., 0] += ends[:, None]      # both ends' tails hold the tied all-reduce
    d[..., -1] += ends[:, None]
    lengths = (at[..., 0] @ Wf.T + at[..., 1] @ Wb.T + d @ Wd.T
               + at[..., 3].max(axis=2)[..., None] * Wq + Wh @ hops + Ww * wrap)              # (T, C, P)
    return np.where(fits, lengths.max(axis=2), np.inf)


def _front(alts: list[tuple[float, int]]) -> tuple[tuple[float, int], ...]:
    """The alternatives (a, room) no other beats in both (a no larger and room no smaller), by
    a: a stage's most layers at z, max over them of min(floor(z / a), room), reads no other, so
    every term of the bound is the same over the front (and the bottleneck bound's breakpoints
    a j of a dropped alternative are no thresholds)."""
    out: list[tuple[float, int]] = []
    for a, room in sorted(alts, key=lambda x: (x[0], -x[1])):
        if not out or room > out[-1][1]:
            out.append((a, room))
    return tuple(out)


def _placed(coef: Coefficients, limits: Limits, memory: bool, type_caps: dict[int, int] | None = None):
    """config_lower_bound's layer placement: (usable_options' four, the option terms, the slots,
    the unit of layers, the placement terms (breakpoints, bottleneck bound, least at unbounded z,
    sweep)), or None (usable_options: no plan)."""
    cfg, L = coef.cfg, coef.inst.model.num_layers
    found = usable_options(coef, limits, memory, type_caps)
    if found is None:
        return None
    caps, O, rooms, usable = found
    terms = shared_option_terms(coef, O, usable)
    t = terms.t
    positions = tuple(sorted({0, max(cfg.pp - 2, 0), cfg.pp - 1}))
    pieces = shared_recompute_pieces(coef, positions, rooms, usable, t).get if memory else None
    slots = stage_slots(coef, limits, memory, caps, rooms, usable, lambda o: t[coef.options[o]][0].a, pieces)
    # the cheap bound relaxes chunks to layers (unit 1: every split in multiples of vpp is a split),
    # so its placement terms depend on the slots and pp only, shared by every schedule and vpp
    unit = cfg.vpp if memory else 1
    placement = coef.shared.get(PlacementKey(tuple(slots), cfg.pp, L, unit),
                                lambda: _placement_terms(slots, cfg.pp, L, unit))
    if memory and cfg.complete and cfg.pp >= 2 and placement[1] is not None:
        placement = _by_position(coef, caps, usable, unit, slots, placement)
    return found, terms, slots, unit, placement


def _by_position(coef: Coefficients, caps: dict[int, int], usable: list[int], unit: int, slots: list[SlotType],
                 placement: tuple) -> tuple:
    """The placement terms (breakpoints, bottleneck bound z, least at unbounded z, sweep) with z
    raised by each stage position's own memory (`_position_bottleneck`; None: no plan)."""
    cands, z, least, sweep = placement
    key = ("position bottleneck", unit, tuple(sorted(caps.items())), tuple(usable), z)   # all it reads
    got = coef._memo(coef._local, key, lambda: _position_bottleneck(coef, caps, usable, unit, z))
    if got is None:
        return cands, None, None, None
    if got <= z:
        return placement
    cfg, L = coef.cfg, coef.inst.model.num_layers
    return cands, got, least, coef.shared.get(("sweep", PlacementKey(tuple(slots), cfg.pp, L, unit), got),
                                              lambda: _Sweep(slots, cfg.pp, L, unit, cands, got))


def _position_times(coef: Coefficients, usable: list[int], unit: int) -> dict[int, list[list[float]]]:
    """Option o -> per stage position s, the least layer time of a stage of n = unit, 2 unit,
    ... layers up to o's room at s: a n, and under full recompute a n + rho (r_min(n, s) - 1),
    r_min the fewest recomputes with which n layers fit s's memory (`_fewest_recomputes`; a, rho
    the least of o's end fits, as `_every_recompute_pieces` reads them). Non-decreasing in n.
    Memoised per config (the bottleneck by position and the position floor read the same)."""
    return coef._memo(coef._local, ("position times", tuple(usable), unit),
                      lambda: _times_by_position(coef, usable, unit))


def _times_by_position(coef: Coefficients, usable: list[int], unit: int) -> dict[int, list[list[float]]]:
    pp = coef.cfg.pp
    rows = [coef.memory_rows(s) for s in range(pp)]
    out = {}
    for o in usable:
        ts = [coef.time(o, s)[0] for s in (0, pp - 1)]
        a, rho = min(t.a for t in ts), min(t.rho for t in ts)
        out[o] = []
        for s, (ma, mrho, mc, cap, _) in enumerate(rows):
            n = np.arange(unit, coef.layer_room(o, s) // unit * unit + 1, unit, dtype=float)
            t = a * n
            if coef.full(o) and rho < 0:   # then the most recomputes, r = n, take the least time
                t = t + rho * (n - 1)
            elif coef.full(o) and mrho[o] < 0:
                t = t + rho * (_fewest_recomputes(ma[o], mrho[o], mc[o], cap[o], n) - 1)
            out[o].append(np.maximum.accumulate(t).tolist() if len(t) else [])
    return out


def _position_bottleneck(coef: Coefficients, caps: dict[int, int], usable: list[int], unit: int,
                         z: float) -> float | None:
    """The least z' >= z at which the pp stage positions, each
    given a pool (pool q at most caps[q] of them), hold L layers, a stage of option o at position
    s holding at most the most layers (whole chunks of `unit`) whose least time there
    (`_position_times`: within s's memory, with the recomputes it forces) is at most z'; None
    when no z' does (no plan fits memory). Every plan has each stage within its position's
    memory, so its largest a n (a n + rho (r - 1) under full recompute: the bottleneck bound's
    measure, at least its e-bar n) is at least z'. The bottleneck bound reads each option's
    largest room over the positions; under 1F1B stage s holds pp - s micro-batches in flight, so
    at large pp the first stages hold far fewer layers than the last (GPT-3 175B on mixed-128,
    tp 2, pp 48: 79.7 ms -> 116.6 ms). The best assignment is a min-cost flow (source -> pool,
    capacity caps[q]; pool -> position, value its most layers; position -> sink)
    (formulations/pipeline.md, "The bottleneck by position")."""
    pp = coef.cfg.pp
    times = _position_times(coef, usable, unit)
    hold = _PositionsHold(coef, caps, usable, unit, times)

    def holds(zz: float) -> bool:
        return hold([zz] * pp)
    if holds(z):
        return z
    # the values where a stage's most layers change: its least times (not the breakpoints of the
    # slots, whose e-bar takes the fewest recomputes of any position)
    steps = sorted({t for o in usable for at in times[o] for t in at if t > z})
    if not steps or not holds(steps[-1]):
        return None
    return steps[bisect.bisect_left(range(len(steps)), True, key=lambda j: holds(steps[j]))]


class _PositionsHold:
    """Whether the pp stage positions, each given a pool (pool q at most caps[q] of them),
    hold L layers when a stage of option o at position s holds at most the most layers (whole
    chunks of `unit`) whose least time there (`_position_times`) is at most tops[s]: a min-cost
    flow (source -> pool, capacity caps[q]; pool -> position, value its most layers; position
    -> sink)."""

    def __init__(self, coef: Coefficients, caps: dict[int, int], usable: list[int], unit: int,
                 times: dict[int, list[list[float]]]):
        from ortools.graph.python import min_cost_flow
        self.flows = min_cost_flow
        pp = coef.cfg.pp
        self.pp, self.L, self.unit, self.times = pp, coef.inst.model.num_layers, unit, times
        pools = sorted({coef.pool_of[o] for o in usable})
        self.of_pool = [[o for o in usable if coef.pool_of[o] == q] for q in pools]
        # nodes: 0 the source, 1..P the pools, P+1..P+pp the positions, P+pp+1 the sink
        P = self.P = len(pools)
        self.tails = [0] * P + [1 + i for i in range(P) for _ in range(pp)] + [1 + P + s for s in range(pp)]
        self.heads = [1 + i for i in range(P)] + [1 + P + s for _ in range(P) for s in range(pp)] + [1 + P + pp] * pp
        self.capacity = [min(caps[q], pp) for q in pools] + [1] * (P * pp + pp)

    def __call__(self, tops: list[float]) -> bool:
        pp, P, unit, times = self.pp, self.P, self.unit, self.times
        # a breakpoint is itself some a n: that n fits at it
        value = [unit * max(bisect.bisect_right(times[o][s], tops[s] * (1 + 1e-12)) for o in opts)
                 for opts in self.of_pool for s in range(pp)]
        if sum(max(value[i * pp + s] for i in range(P)) for s in range(pp)) < self.L:
            return False    # even every position at its best pool holds fewer than L layers
        flow = self.flows.SimpleMinCostFlow()
        flow.add_arcs_with_capacity_and_unit_cost(self.tails, self.heads, self.capacity,
                                                  [0] * P + [-v for v in value] + [0] * pp)
        flow.set_node_supply(0, pp)
        flow.set_node_supply(1 + P + pp, -pp)
        return flow.solve() == flow.OPTIMAL and -flow.optimal_cost() >= self.L   # not OPTIMAL: pp positions unfilled


def _position_floor(coef: Coefficients, caps: dict[int, int], usable: list[int], unit: int,
                    weights: list[float], z: float) -> float:
    """At least max_s c_s t_s in every plan of the config within memory (c_s = `weights`,
    Coefficients.position_weights, non-negative; z its position bottleneck bound): with x_s the
    stage's least time at its position for its layers (`_position_times`, the bottleneck
    bound's measure), every plan has max_s c_s x_s >= Y*, the least Y at which the positions,
    each holding the most layers with x_s <= Y / c_s, hold L (`_PositionsHold`), and
    t_s >= x_s + e (e: the least c, and rho L where rho < 0, of the usable options at the
    ends and a middle stage, as `least_stage_time` reads them). So max_s c_s t_s >= Y* +
    max_s c_s min(0, e). Y* >= c_0 z where c_0 = min_s c_s, and a Y that holds is at most
    max_s c_s z' for the least z' that holds alike: the bisection runs over the c_s x values in
    between (formulations/pipeline.md, "The position floor")."""
    pp = coef.cfg.pp
    times = _position_times(coef, usable, unit)
    hold = _PositionsHold(coef, caps, usable, unit, times)
    lo = min(weights) * z
    steps = sorted({weights[s] * t for o in usable for s in range(pp) for t in times[o][s] if weights[s] * t > lo})
    steps = [y for y in steps if y <= max(weights) * z * (1 + 1e-12)] or [lo]

    def holds(y: float) -> bool:
        return hold([y / c if c > 0 else math.inf for c in weights])
    if holds(lo):
        y = lo
    elif not holds(steps[-1]):
        y = lo   # z' above z: the floor keeps its least (a valid bound, as at lo)
    else:
        y = steps[bisect.bisect_left(range(len(steps)), True, key=lambda j: holds(steps[j]))]
    ends = sorted({0, min(1, pp - 1), pp - 1})
    e = min(min(0.0, t.c) + (min(0.0, t.rho) * coef.inst.model.num_layers if coef.full(o) else 0.0)
            for o in usable for s in ends for t in [coef.time(o, s)[0]])
    return y + max(weights) * e


def least_stage_time(coef: Coefficients, limits: Limits) -> float:
    """At least the largest stage time t_s (f + b of one micro-batch, seconds) of every plan of
    the config within memory and the limits: every such plan has a stage with a n >= z (under
    full recompute a n + rho (r - 1) >= z), z the bottleneck bound of the full bound's
    placement (`_bottleneck_bound`, raised by `_position_bottleneck`; a the least per-layer
    time of the stage's option), and t_s = a n + rho r + c adds at least c (+ rho under full
    recompute) to it, so t_s >= z + the least of those where negative. 0.0 where the
    bound finds no plan. The per-stage model's floor under its steady-period term
    (PipelineModel.add_steady_period): the LP relaxation spreads the layers evenly, whole layers
    cannot (formulations/pipeline.md, "The bottleneck floor")."""
    placed = _placed(coef, limits, True)
    if placed is None:
        return 0.0
    (_, _, _, usable), _, _, _, (_, z, _, _) = placed
    if z is None:
        return 0.0
    ends = sorted({0, min(1, coef.cfg.pp - 1), coef.cfg.pp - 1})   # first, a middle stage, last
    L = coef.inst.model.num_layers

    def beyond(t: Affine, full: bool) -> float:   # the least of t_s - a n: c, + rho r with 1 <= r <= L
        return t.c + ((t.rho if t.rho >= 0 else t.rho * L) if full else 0.0)
    extra = min(beyond(coef.time(o, s)[0], coef.full(o)) for o in usable for s in ends)
    return max(0.0, z + min(0.0, extra))


def config_lower_bound(coef: Coefficients, limits: Limits, memory: bool = True,
                       variants: list[Config] | None = None,
                       _family: tuple | None = None,
                       type_caps: dict[int, int] | None = None,
                       enough: float = math.inf) -> float | None | list[float | None]:
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
    of their bounds, computed once. A two-stage config on the simulated basis is also bounded
    over every split and pair of options (`_two_stage_bound`; memory=True only). The terms that
    configs share (`_option_terms`, the
    placement terms) are memoised in the instance's coefficient cache. `type_caps`: the bound
    of the plans with at most so many stages on each node type named (`usable_options`).
    `enough`: the caller asks no more than whether the bound reaches it (the search's incumbent):
    the bound is exact below it and at least it where the exact one is (`_pipeline_bound`)."""
    assert (variants is None and _family is None) or not memory
    none = None if variants is None else [None] * len(variants)
    cfg, L = coef.cfg, coef.inst.model.num_layers
    placed = _placed(coef, limits, memory, type_caps)
    if placed is None:
        return none
    (caps, O, rooms, usable), terms, slots, unit, (cands, z, least, sweep) = placed
    if z is None:
        return none
    gpu_usd = terms.gpu_usd(cfg.pp)
    if limits.budget_usd_per_hour is not None and gpu_usd > limits.budget_usd_per_hour * (1 + 1e-9):
        return none
    least_work, dp0 = terms.least_work, terms.dp0
    opt = terms.opt(L, cfg.pp)
    hops = _least_hops(coef) if memory and cfg.pp >= 2 else None
    p2p = coef.step_p2p(*hops) if hops else 0.0   # _p2p_lower_bound
    sync = _tied_sync_lower_bound(coef, caps, usable) if memory else 0.0
    extra = terms.extra(cfg.pp)

    def finish(vpps: tuple[int, ...], pairs: list[tuple[float, float, bool, float]],
               placed=(unit, cands, z, least, sweep), floor: float = 0.0) -> float | None:
        # the reduction is affine in the layers: its least over a range of vpp is at an end;
        # each weight quadruple gives a valid bound (the largest counts; None: no plan meets the limits)
        u, c, zz, lst, swp = placed
        if zz is None:
            return None
        dp = min(d(v) for d in dp0 for v in vpps) + sync   # stage 0's tail: its reduction, then the tied all-reduce
        ends = _EndStages.of(coef, slots, caps, usable, u, dp, opt, 2.0 * sum(hops[0]) if hops else 0.0) if memory \
            else None
        best = -math.inf
        for w_z, w_sum, hops_, offset in pairs:   # each a valid bound: the largest counts
            got = _finish_bound(slots, cfg, L, u, c, zz, lst, dp + opt + (p2p if hops_ else 0.0) + offset,
                                extra, gpu_usd, w_z, w_sum, limits, memory, least_work, swp, ends, enough, floor)
            if got is None:
                return None
            best = max(best, got)
            if best >= enough:
                break   # enough: the rest could only raise it
        return best
    if _family is not None:
        return finish(_family[1], _family[0])
    if variants is None:
        pairs = coef.step_weights()
        got = finish((cfg.vpp,), pairs)
        weights = coef.position_weights() if memory and cfg.complete and cfg.pp >= 2 else None
        if got is not None and got < enough and weights is not None:
            # the second pair's path through each stage, at its own weight (`_position_floor`)
            key = ("position floor", unit, tuple(sorted(caps.items())), tuple(usable), z, tuple(weights))
            floor = coef._memo(coef._local, key, lambda: _position_floor(coef, caps, usable, unit, weights, z))
            if floor > pairs[1][0] * z:
                lifted = finish((cfg.vpp,), pairs[1:], floor=floor)
                got = None if lifted is None else max(got, lifted)
        if got is None or got >= enough or not memory or coef.basis() != SIMULATED:
            return got
        if cfg.pp == 2:
            split = _two_stage_bound(coef, limits, caps, usable, unit, gpu_usd)   # every split of two stages
        elif 3 <= cfg.pp <= FEW_STAGES and cfg.complete:
            key = ("few stages", unit, tuple(sorted(caps.items())), tuple(usable), limits, enough)
            split, cells = coef._memo(coef._local, key,
                                      lambda: _few_stage_bound(coef, limits, caps, usable, unit, gpu_usd, enough))
            coef.bound_work = cells * WORK.split_cell   # what full_bound_work charges, memoised or not
        else:
            return got
        return None if split is None else max(got, split)

    def chunks(u: int):
        """Placement terms in whole chunks of u layers (a variant's own, tighter than unit 1)."""
        if u == unit:
            return unit, cands, z, least, sweep
        return (u, *coef.shared.get(PlacementKey(tuple(slots), cfg.pp, L, u),
                                    lambda: _placement_terms(slots, cfg.pp, L, u)))
    # each variant's weights, from the one definition (Coefficients.step_weights)
    return [finish((v.vpp,), coef.step_weights(v.sched), chunks(v.vpp)) for v in variants]


def family_lower_bound(coef: Coefficients, limits: Limits, variants: list[Config], weak: bool = False) -> float | None:
    """At most the least cheap bound of `variants` (configs that differ from coef.cfg in schedule
    and vpp alone), at the cost of one: the cheap bound T >= w_z X + w_sum S + rest (X, S >= 0;
    and $ >= its work term) only grows with the weights and the reduction, so the least weights
    and reduction of any variant bound them all (None: no variant has a plan). weak: without
    the bottleneck bound (X >= S / pp only), a fraction of the cost; the driver tightens it
    when the family reaches the top of the heap. Each variant has a list of weight pairs
    (Coefficients.step_weights), each a bound: the least first pair and the least last pair
    are each below one pair of every variant (transfers counted only where all count them)."""
    if weak:
        return WeakFamilyBounds(limits).bound(coef.cfg, variants, coef)
    if not may_hold_layers(coef):   # the family's options and pp: its memory rules out every variant
        return None
    pairs, vpps = _family_terms(coef, variants)
    return config_lower_bound(coef, limits, memory=False, variants=None, _family=(pairs, vpps))


def _family_terms(coef: Coefficients, variants: list[Config]) -> tuple[list[tuple[float, float, bool, float]],
                                                                         tuple[int, int]]:
    """(the least weight pairs, the least and largest vpp) of a family's variants."""
    weights = [coef.step_weights(v.sched) for v in variants]
    pairs = sorted({(min(w[i][0] for w in weights), min(w[i][1] for w in weights), all(w[i][2] for w in weights),
                     min(w[i][3] for w in weights))
                    for i in (0, -1)})
    vpps = sorted({v.vpp for v in variants})
    return pairs, (vpps[0], vpps[-1])


class _WeakGroup(NamedTuple):
    """What every family of one WeakFamilyBounds group shares: a config of the group (its
    Coefficients), the options with a stage to offer, their terms, the slots' least layer sum
    and $/h at unbounded z, and the least reduction per vpp range."""

    rep: Coefficients
    O: list[int]
    terms: _OptionTerms
    slots: list[SlotType]
    least: tuple[float, float]
    dp: dict          # (least vpp, largest vpp) -> least reduction
    closed: bool      # the closed form's weights (they read the schedule, vpp and m alone), not the paths'
    pairs: dict       # closed form: the variants' (schedule, vpp) -> _family_terms


class WeakFamilyBounds:
    """The weak family bound (family_lower_bound with weak=True: without the bottleneck bound,
    z >= S / pp alone) of many Megatron-mode families, computed once per group of families.

    A group: the configs of one uniform tp/dp/mbs/recompute (so one set of stage options and
    pools), one distributed-optimizer setting, pp == 1 or not, and the same options with a
    stage to offer (caps > 0). The group shares `_option_terms` (they read nothing else), and
    the least layer sum and $/h at unbounded z: every slot of the cheap bound holds one pool of
    one option, which holds all L layers in one stage (room L, caps >= 1), so at z = inf each
    slot takes up to min(caps, pp) L >= L layers and the greedy fill puts all L layers on the
    least per-layer time whatever pp and the caps are; the least $/h reads no caps or pp. A
    family adds its pp (caps, the stage count's terms), its weights and its vpp range, and the
    bound's last step is the one every cheap bound takes (`_finish_bound`)."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._reps: dict[tuple, Coefficients] = {}
        self._groups: dict[tuple, _WeakGroup | None] = {}
        self._work: dict[tuple, tuple[float, bool]] = {}
        self._family: dict[Config, float | None] = {}

    @staticmethod
    def _key(cfg: Config) -> tuple:
        return cfg.uniform, cfg.samples, cfg.sizes, cfg.pp == 1, cfg.distributed_optimizer

    def work_bound(self, cfg: Config, make: Callable[[Config], Coefficients]) -> float:
        """At most `bound` of any family headed by `cfg` (and so of its configs), at the cost of a
        division: the driver bounds every family by it first and computes the weak bound only
        for those that reach the top of the heap. Every schedule runs each of the m micro-
        batches' forward and backward of a stage on that stage's ranks, so T >= m z (z: the
        slowest stage's f + b per micro-batch), and some of the pp stages holds L / pp layers
        or more, each at no less than the least per-layer time a_min of any option at any
        position: T >= m L a_min / pp. Per step, $ = (sum_s p_s) T / 3600 >= m L min_o(p_o a_o)
        / 3600 (p_o: the $/h of option o's GPUs; _finish_bound's work term at w_z = m)."""
        wkey = (cfg.uniform, cfg.samples, cfg.sizes, cfg.pp == 1)   # what the options and positions read
        got = self._work.get(wkey)
        if got is None:
            key = self._key(cfg)
            rep = self._reps.get(key)
            if rep is None:
                rep = self._reps[key] = make(cfg)
            # m L x the least work of a layer for one micro-batch: s ($ x s / h where min-cost)
            cost = self.limits.objective == "min-cost"
            got = self._work[wkey] = (rep.m * rep.inst.model.num_layers * (
                rep.least_layer_work() / SECONDS_PER_HOUR if cost else rep.least_layer_time()), cost)
        work, cost = got
        return work if cost else work / cfg.pp

    def family(self, cfg: Config, variants: list[Config], make: Callable[[Config], Coefficients]) -> float | None:
        """`bound` of the family headed by `cfg`, memoised by its head (the heuristic start's
        look-ahead and the search open the same families)."""
        got = self._family.get(cfg, False)
        if got is False:
            got = self._family[cfg] = self.bound(cfg, variants, make=make)
        return got

    def bound(self, cfg: Config, variants: list[Config], coef: Coefficients | None = None,
              make: Callable[[Config], Coefficients] | None = None) -> float | None:
        """The weak bound of the family of `variants` (cfg: its head); `coef`: cfg's own
        coefficients, or `make(cfg)` makes a group's first (the others reuse it)."""
        if cfg.uniform is None:
            raise ValueError("the weak family bound is for Megatron-mode families (configs of one uniform choice)")
        limits, pp = self.limits, cfg.pp
        key = self._key(cfg)
        rep = self._reps.get(key)
        if rep is None:
            rep = self._reps[key] = coef if coef is not None else make(cfg)
        caps = [_affordable_stages(rep, q, limits, pp) for q in range(len(rep.pools))]
        O = tuple(o for o in range(len(rep.options)) if caps[rep.pool_of[o]] > 0)
        if not O or sum(caps) < pp:
            return None
        group = self._groups.get((key, O), False)
        if group is False:
            group = self._groups[(key, O)] = self._group(rep, list(O), caps, pp)
        if group is None:
            return None
        L, terms = rep.inst.model.num_layers, group.terms
        gpu_usd = terms.gpu_usd(pp)
        if limits.budget_usd_per_hour is not None and gpu_usd > limits.budget_usd_per_hour * (1 + 1e-9):
            return None
        # the closed form's weights read the schedule, vpp and m alone (the simulated step's read pp
        # and the options: the family's own coefficients)
        if group.closed:
            vkey = tuple((v.schedule, v.vpp) for v in variants)
            fam = group.pairs.get(vkey)
            if fam is None:
                fam = group.pairs[vkey] = _family_terms(rep, variants)
        else:
            fam = _family_terms(coef or make(cfg), variants)
        pairs, vpps = fam
        dp = group.dp.get(vpps)
        if dp is None:
            dp = group.dp[vpps] = min(d(v) for d in terms.dp0 for v in vpps)
        got = [_finish_bound(group.slots, cfg, L, 1, [], 0.0, group.least, dp + terms.opt(L, pp) + offset,
                             terms.extra(pp), gpu_usd, w_z,
                             w_sum, limits, False, terms.least_work)
               for w_z, w_sum, _, offset in pairs]
        return None if None in got else max(got)

    def _group(self, rep: Coefficients, O: list[int], caps: list[int], pp: int) -> _WeakGroup | None:
        """A group's shared terms (None: no family of it has a plan)."""
        L, limits = rep.inst.model.num_layers, self.limits
        if rep.required_types:
            raise ValueError("the weak family bound is for Megatron-mode families (no node type required)")
        gpu_hour = {k: nt.usd_per_gpu_hour for k, nt in enumerate(rep.types)}
        terms = rep.shared.get(OptionTermsKey(tuple(rep.options[o] for o in O), tuple(rep.options[o] for o in O),
                                              rep.cfg.pp == 1, rep.cfg.distributed_optimizer, rep.required_types),
                               lambda: _option_terms(rep, O, O))
        alts: dict[int, list[tuple[float, int]]] = {}
        for o in O:
            alts.setdefault(rep.pool_of[o], []).append((terms.t[rep.options[o]][0].a, L))
        slots = [SlotType(_type_gpus(rep, rep.pools[q].k, limits), ((rep.pools[q].group, caps[q], _front(alts[q])),),
                          False, gpu_hour[rep.pools[q].k])
                 for q in sorted(alts, key=lambda q: (rep.pools[q].k, q))]
        least = _least_at_inf(slots, pp, L, 1, coupled=False)  # shared by every pp: the stage counts uncoupled
        if least[0] == math.inf:
            return None
        return _WeakGroup(rep, O, terms, slots, least, {}, rep.basis() != SIMULATED, {})


def _finish_bound(slots, cfg, L, unit, cands, z, least, rest, extra, gpu_usd, w_z, w_sum, limits, memory,
                  least_work, sweep=None, ends=None, enough: float = math.inf, floor: float = 0.0) -> float | None:
    """config_lower_bound's last step: the joint bound (`_pipeline_bound`, exact below `enough`;
    `floor`: at least the w_z term) and, for $, the work bound."""
    got = _pipeline_bound(slots, cfg.pp, L, unit, cands, z, PipelineTerms(w_z, w_sum, extra, rest, gpu_usd, floor),
                          limits, JOINT_STEPS if memory else 0, least, sweep, ends, enough)
    if got is None:
        return None
    bound, S = got
    # $ x s per step >= (sum_s p_s) w_z z + gpu_usd (w_sum S + rest), and (sum_s p_s) z >= L min_o(p_o a_o)
    # because z >= a_s n_s on every stage: the cheapest price per unit of work bounds every plan
    work = (w_z * L * least_work + gpu_usd * (w_sum * S + rest)) / SECONDS_PER_HOUR
    if limits.budget_usd_per_step is not None and work > limits.budget_usd_per_step * (1 + 1e-9):
        return None
    return max(bound, work) if limits.objective == "min-cost" else bound


BUDGET_ROUNDS = 4  # budget_bound: tightenings of the step-time bound by the $/h a $/step budget leaves


def least_usd_per_hour(coef: Coefficients) -> float:
    """At least the $/h of any plan of the config: its pp stages use at least pp g GPUs (g the
    fewest GPUs of a stage option, tp dp), each GPU of node type t pays at least t's
    usd_per_gpu_hour (node billing rents whole nodes, a mixed bundle its members' nodes), and
    no type gives more than its count x gpus_per_node: the cheapest pp g GPUs of the node types
    the options use (a fractional knapsack; inf when they hold fewer)."""
    need = coef.cfg.pp * min(o.tp * o.dp for o in coef.options)
    physical = {nt for k in {o.k for o in coef.options}
                for nt in ([m for m, _ in coef.types[k].members] if hasattr(coef.types[k], "members")
                           else [coef.types[k]])}
    usd = 0.0
    for nt in sorted(physical, key=lambda nt: (nt.usd_per_gpu_hour, nt.name)):
        take = min(need, nt.count * nt.gpus_per_node)
        usd, need = usd + take * nt.usd_per_gpu_hour, need - take
        if need == 0:
            return usd
    return math.inf


def budget_bound(coef: Coefficients, limits: Limits, lb: float) -> float | None:
    """The config's full bound `lb` (config_lower_bound, memory=True) tightened by the least $/h
    of its GPUs, P_min = least_usd_per_hour, where a $/step budget B binds (None: no plan):

    - min-time: a plan of step time T >= lb pays P T / 3600 <= B with P >= P_min, so none
      exists when P_min lb / 3600 > B; else each pays P <= 3600 B / lb, a $/h budget under
      which config_lower_bound may prove a larger lb (repeated, BUDGET_ROUNDS times at most);
    - min-cost: $/step = P T / 3600 >= P_min T_lb / 3600, T_lb the min-time bound under the
      same limits."""
    budget = limits.budget_usd_per_step
    if budget is None or lb is None:
        return lb
    p_min = least_usd_per_hour(coef)
    if limits.objective == "min-cost":
        t_lb = config_lower_bound(coef, replace(limits, objective="min-time"), memory=True)
        if t_lb is None:
            return None
        usd = p_min * t_lb / SECONDS_PER_HOUR
        return None if usd > budget * (1 + 1e-9) else max(lb, usd)
    for _ in range(BUDGET_ROUNDS):
        if p_min * lb / SECONDS_PER_HOUR > budget * (1 + 1e-9):
            return None
        if lb <= 0:
            return lb
        cap = SECONDS_PER_HOUR * budget * (1 + 1e-9) / lb
        if limits.budget_usd_per_hour is not None and limits.budget_usd_per_hour <= cap:
            return lb
        got = config_lower_bound(coef, replace(limits, budget_usd_per_hour=cap), memory=True)
        if got is None:
            return None
        if got <= lb * (1 + 1e-6):
            return max(lb, got)
        lb = got
    return lb


COUPLED_ROUNDS = 8  # coupled_budget_bound: tightenings at most (each a config_lower_bound)


def dear_type(coef: Coefficients) -> int | None:
    """The node type of the config's pools with the dearest GPU (usd_per_gpu_hour; ties: the
    last), or None where there is no other type to trade it against or a pool is a mixed-type
    bundle (whose GPUs are its members')."""
    K = len(coef.inst.cluster.node_types)
    types = {pool.k for pool in coef.pools}
    if len(types) < 2 or max(types) >= K:
        return None
    return max(types, key=lambda k: (coef.types[k].usd_per_gpu_hour, k))


def least_usd_per_hour_with(coef: Coefficients, dear: int, d: int) -> float:
    """At least the $/h of a plan of the config with exactly d stages on node type `dear`
    (inf where no plan has): a stage of pool q pays at least c_q = usd_per_gpu_hour x its GPUs
    (least_usd_per_hour), so P >= d min_{q of dear} c_q + the sum of the pp - d least c_q of
    the other pools' stages, each pool q giving at most max_stages(q) (a relaxation: the pools
    of one type share its GPUs)."""
    pp, pools = coef.cfg.pp, coef.pools
    price = [coef.stage_usd_per_hour(pool.k, pool.group) for pool in pools]
    mine = [q for q, pool in enumerate(pools) if pool.k == dear]
    if d > sum(coef.max_stages(q) for q in mine) or (d > 0 and not mine):
        return math.inf
    usd, need = (d * min(price[q] for q in mine) if d else 0.0), pp - d
    for q in sorted((q for q, pool in enumerate(pools) if pool.k != dear), key=lambda q: (price[q], q)):
        take = min(need, coef.max_stages(q))
        usd, need = usd + take * price[q], need - take
    return usd if need == 0 else math.inf


def coupled_budget_bound(coef: Coefficients, limits: Limits, lb: float | None) -> float | None:
    """A min-time bound `lb` (valid for every plan of the config under `limits`) tightened by
    coupling the stage count on the dearest node type k (dear_type) with the price under a
    $/step budget B (None: no plan; formulations/pipeline.md, "Stage counts against the budget").

    A plan with d stages on k pays P >= P(d) = least_usd_per_hour_with(d) and, at step time
    T >= lb, P T / 3600 <= B needs P(d) lb <= 3600 B: every plan has d <= d_max, the largest d
    that passes. The bound of the plans with at most d_max stages on k (config_lower_bound with
    type_caps, and the $/h budget 3600 B / lb that budget_bound reads) is then a bound of them
    all; repeated while it grows (d_max only falls), COUPLED_ROUNDS times at most. Where the
    fast GPUs are the dear ones, the plans that could meet the budget must put stages on slow
    GPUs, which raises the step-time bound."""
    budget = limits.budget_usd_per_step
    if budget is None or lb is None or limits.objective != "min-time" or lb <= 0:
        return lb
    dear = dear_type(coef)
    if dear is None:
        return lb
    cap = SECONDS_PER_HOUR * budget * (1 + 1e-9)
    most = sum(coef.max_stages(q) for q, pool in enumerate(coef.pools) if pool.k == dear)
    for _ in range(COUPLED_ROUNDS):
        allowed = [d for d in range(min(most, coef.cfg.pp) + 1) if least_usd_per_hour_with(coef, dear, d) * lb <= cap]
        if not allowed:
            return None
        d_max = allowed[-1]
        if d_max >= most:
            return lb   # the budget caps no stage count
        hourly = cap / lb
        if limits.budget_usd_per_hour is not None:
            hourly = min(hourly, limits.budget_usd_per_hour)
        got = config_lower_bound(coef, replace(limits, budget_usd_per_hour=hourly), memory=True,
                                 type_caps={dear: d_max})
        if got is None:
            return None
        if got <= lb * (1 + 1e-6):
            return lb
        lb = got
    return lb


def coupled_cost_bound(coef: Coefficients, limits: Limits, lb: float | None) -> float | None:
    """A min-cost bound `lb` ($/step) under a time limit T_max, tightened by the stage count on
    the dearest node type k (dear_type), as coupled_budget_bound does for min-time (None: no
    plan). T_lb(j), the min-time bound of the plans with at most j stages on k
    (config_lower_bound with type_caps), falls as j grows, so a bisection finds d_min with
    T_lb(d_min - 1) > T_max (or d_min = 0): a plan with d < d_min stages on k has at most
    d_min - 1 there, so it is slower than T_max (this reads T_lb at d_min - 1 alone: valid
    even where T_lb would not fall). One with d >= d_min pays at least P(d) T_lb / 3600
    $/step, with P(d) = least_usd_per_hour_with(d) and T_lb the min-time bound of all plans;
    so every admitted plan pays at least min_{d >= d_min} P(d) T_lb / 3600."""
    t_max = limits.time_limit_s
    if lb is None or limits.objective != "min-cost" or t_max is None:
        return lb
    dear = dear_type(coef)
    if dear is None:
        return lb
    timing = replace(limits, objective="min-time")

    def fast_enough(j: int) -> bool:
        t = config_lower_bound(coef, timing, memory=True, type_caps={dear: j})
        return t is not None and t <= t_max * (1 + 1e-6)
    most = min(sum(coef.max_stages(q) for q, pool in enumerate(coef.pools) if pool.k == dear), coef.cfg.pp)
    if not fast_enough(most):
        return None
    lo, hi = 0, most   # fast_enough(hi); the least such j lies in [lo, hi]
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fast_enough(mid) else (mid + 1, hi)
    t_lb = config_lower_bound(coef, timing, memory=True)
    least = min(least_usd_per_hour_with(coef, dear, d) for d in range(lo, most + 1))
    if t_lb is None or least == math.inf:
        return None
    return max(lb, least * t_lb / SECONDS_PER_HOUR)


def full_bound(coef: Coefficients, limits: Limits, floor: float = 0.0, enough: float = math.inf) -> float | None:
    """The bound the search prunes a popped config by: config_lower_bound with the memory rooms,
    at least `floor` (a bound already proven for the config under these limits: its place in
    the heap, what an earlier solve proved), tightened under a $/step budget by budget_bound
    and by the dear type's stage count: coupled_budget_bound (min-time), coupled_cost_bound
    (min-cost under a time limit). None: no plan. `enough` (the search's incumbent): exact
    below it, at least it where the exact bound is (config_lower_bound)."""
    coef.bound_work = 0.0
    lb = config_lower_bound(coef, limits, memory=True, enough=enough)
    if limits.budget_usd_per_step is None or lb is None:
        return lb
    lb = budget_bound(coef, limits, max(lb, floor))
    return coupled_budget_bound(coef, limits, lb) if limits.objective == "min-time" else coupled_cost_bound(coef, limits, lb)
