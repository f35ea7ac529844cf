"""An Aceso-style planner: iterative bottleneck alleviation on milp-plan's cost model.

Reimplemented from the paper (Liu et al., "Aceso: Efficient Parallel DNN Training through
Iterative Bottleneck Alleviation", EuroSys'24), not from its code. What it follows:

- §3 (overview) and §4.1 (bottleneck identification): a plan's bottleneck is the stage
  with the largest per-micro-batch time t_s = f_s + b_s (plan.predicted.stages); when a
  stage is out of memory, the stage with the largest overflow (peak - capacity) instead.
- §4.2 (primitives / actions), each one function below, applied to the bottleneck stage s:
    move_layers      one layer from s to the neighbour s - 1 or s + 1;
    scale            tp or dp of s doubled, taking the GPUs from the idle pool or, when
                     none are left, halving tp or dp of another stage on the same node
                     type (the donor); halved, giving GPUs back;
    swap_tp_dp       a factor 2 moved between tp and dp (same GPUs);
    change_micro_batch  the samples per micro-batch B doubled or halved (all stages);
  and after every action the recompute of each stage is set greedily (`set_recompute`):
  none where memory allows, else selective, else full with the fewest recomputed layers
  that fit. A stage's micro-batch is B / dp (a dp replica takes its share of the
  pipeline's micro-batch), so m = global batch / B for every stage.
- §4.3 (multi-hop search): from the current plan, up to `max_hops` actions are chained
  (the `beam` best states of each hop seed the next, Aceso's 7 hops by default); the first
  hop depth that reaches a plan better than the current one moves the search there, and
  the search repeats until no chain of `max_hops` actions improves. "Better" is the
  objective (`objective_of`: step time or $/step) among admitted plans, and the total
  relative overrun (memory, time limit, budget) among plans not admitted.
- §4.4 (search over pipeline depths): several trials per pp, each from its own start.

Where it departs from Aceso:

- The cost model is milp-plan's (costmodel.py), not Aceso's profiled op graph, and every
  state is scored by building its Plan (placement.build_plan -> predict.evaluate);
  nothing here computes a time or a price of its own. Set-recompute reads
  costmodel.stage_memory_bytes, the same function the evaluation uses.
- Granularity: layers (Transformer blocks), not operators. Aceso recomputes and
  tensor-partitions per op; milp-plan recomputes per layer (Megatron's full recompute of
  the first r layers of a stage, or selective recompute of the attention core) and uses one
  tp per stage.
- Start points: the warm-start heuristic's plans (heuristics/warmstart.py: greedy device
  grouping, bottleneck-optimal layer split) of the configs with that pp and 1F1B, largest
  stages first; Aceso starts from an even split. Trials differ by start point; the seed
  shuffles which starts beyond the first are used.
- Mode. In --mode megatron a plan must keep one tp, dp, micro-batch and recompute setting
  for all stages, so scale and swap_tp_dp act on every stage at once and recompute is
  chosen as one setting for all stages; layer moves and micro-batch changes are
  Megatron-valid as they are. In --mode free (Aceso's own setting) they act on the
  bottleneck stage alone and each stage picks its own recompute. plan.mode says which.
- Stages never change node type (Aceso plans for one GPU type); the heterogeneous
  grouping comes from the start points.
- The plan returned lies in the exact planners' space (`in_exact_space`: each node type's
  stages one stage size; its runs may split, as in the exact space); the chain of actions may
  pass outside it.
- Schedule: 1F1B only (Aceso's). A fix that pins another schedule or vpp > 1 is refused.
- For min-cost an extra action halves the fastest stage's dp or tp (its GPUs are given
  back, which is what lowers $/step); Aceso minimises time only.
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Iterator

from milp_plan import costmodel
from milp_plan.deadline import WORK, Deadline
from milp_plan.errors import InputError
from milp_plan.formulations.coefficients import Coefficients, SharedCoefficients
from milp_plan.formulations.placement import build_plan
from milp_plan.formulations.space import (FREE_SP_REFUSAL, Config, StageOption, covered,
                                          enumerate_configs, micro_batch_sizes, placement, recompute_choices,
                                          tp_sizes)
from milp_plan.heuristics import warmstart
from milp_plan.instance import Instance
from milp_plan.job import Limits
from milp_plan.plan import Plan
from milp_plan.result import objective_of
from milp_plan.schedules import OneFOneB
from milp_plan.units import GIB

MAX_HOPS = 7          # Aceso's default chain length
TRIALS = 3            # start points per pipeline depth
BEAM = 3              # states of one hop that seed the next
MAX_STEPS = 200       # improving moves per trial at most (the search ends on its own long before)
_REL = 1e-9           # a score must improve by more than this (relative) to count


@dataclass(frozen=True, order=True)
class StageState:
    """One stage of a search state: node type k (cluster order), tp, dp and layer count."""

    k: int
    tp: int
    dp: int
    layers: int

    @property
    def group(self) -> int:
        return self.tp * self.dp


@dataclass(frozen=True, order=True)
class State:
    """A point of the search: B samples per micro-batch (each stage's micro-batch is B / dp)
    and the stages in pipeline order. Recompute is not part of it: set_recompute decides it."""

    samples: int
    stages: tuple[StageState, ...]


@dataclass
class Search:
    """One run's inputs and memo: every state is realised (built and scored) at most once."""

    inst: Instance
    limits: Limits
    fix: dict
    mode: str
    deadline: Deadline
    tps: frozenset = frozenset()
    plans: dict = field(default_factory=dict)   # State -> Plan | None
    best: Plan | None = None
    evaluated: int = 0
    depths: tuple[int, int] = (0, 0)            # pipeline depths searched, of those to search

    @property
    def uniform(self) -> bool:
        """Megatron mode: tp, dp and recompute are the same on every stage."""
        return self.mode == "megatron"


def check_fix(fix: dict, mode: str) -> None:
    """Aceso plans 1F1B without interleaving; free mode keeps sequence parallelism on."""
    if fix.get("schedule", OneFOneB.name) != OneFOneB.name or fix.get("vpp", 1) != 1:
        raise InputError("the aceso planner plans the 1F1B schedule only (as Aceso does); drop schedule= and vpp= "
                         "from --fix or use --solver cpsat", field="fix")
    if mode == "free" and fix.get("sp") is False:
        raise InputError(FREE_SP_REFUSAL, field="fix")


# ---- validity -----------------------------------------------------------------------
def valid(sx: Search, state: State) -> bool:
    """The state obeys the checker's structural rules and the space's limits (--fix, profile
    coverage, packing) and its stages fit on the cluster's nodes (placement.place_stages)."""
    inst, fix = sx.inst, sx.fix
    if inst.job.global_batch_size % state.samples or sum(s.layers for s in state.stages) != inst.model.num_layers:
        return False
    if "pp" in fix and len(state.stages) != fix["pp"]:
        return False
    if sx.uniform and len({(s.tp, s.dp) for s in state.stages}) > 1:
        return False
    mbs_ok = set(micro_batch_sizes(state.samples, fix))
    for st in state.stages:
        nt = inst.cluster.node_types[st.k]
        mbs = state.samples // st.dp if state.samples % st.dp == 0 else 0
        if st.layers < 1 or mbs not in mbs_ok or st.tp not in sx.tps or nt.gpus_per_node % st.tp:
            return False
        if fix.get("dp", st.dp) != st.dp or placement(nt, st.group) is None:
            return False
        if not covered(inst, nt.gpu.name, st.tp, mbs, fix):
            return False
    return fits_nodes(inst, state.stages)


def in_exact_space(state: State) -> bool:
    """Whether the state lies in the space the exact planners prove optimality over
    (formulations/pipeline.md): each node type's stages have one stage size (a type's stages
    may form several runs, as in the exact space; fits_nodes checks that they fit). The search may pass through other states (two stage sizes on
    a type, on the way to one), but only plans in this space are returned, so that `compare`
    measures every planner on the same space and a heuristic plan below a proven bound always
    means a bug."""
    types = {st.k for st in state.stages}
    return all(len({st.group for st in state.stages if st.k == k}) == 1 for k in types)


def fits_nodes(inst: Instance, stages: tuple[StageState, ...]) -> bool:
    """Each run of consecutive stages with one (node type, stage size) starts on a fresh node
    (placement.place_stages); the nodes the runs use per type are at most the type's count."""
    used: Counter = Counter()
    i = 0
    while i < len(stages):
        j = i
        while j < len(stages) and (stages[j].k, stages[j].group) == (stages[i].k, stages[i].group):
            j += 1
        nt = inst.cluster.node_types[stages[i].k]
        used[stages[i].k] += placement(nt, stages[i].group).nodes_used(j - i)
        i = j
    return all(n <= inst.cluster.node_types[k].count for k, n in used.items())


# ---- recompute (after every action) --------------------------------------------------
def _switches(sx: Search, state: State) -> tuple[bool, bool]:
    """(sequence parallel, distributed optimizer) as build_plan records them."""
    sp = bool(sx.fix.get("sp", True)) and any(s.tp > 1 for s in state.stages)
    distopt = bool(sx.fix.get("distopt", True)) and any(s.dp > 1 for s in state.stages)
    return sp, distopt


def stage_fits(sx: Search, state: State, s: int, recompute: str, r: int) -> bool:
    """Stage s's peak memory per GPU (costmodel.stage_memory_bytes) within its usable memory,
    compared as Limits.admit compares them."""
    inst, st = sx.inst, state.stages[s]
    first = sum(x.layers for x in state.stages[:s])
    sp, distopt = _switches(sx, state)
    parts = costmodel.stage_memory_bytes(
        inst, schedule=OneFOneB.name, pp=len(state.stages), stage=s,
        m=inst.job.global_batch_size // state.samples, vpp=1, kinds=costmodel.stage_kinds(inst, first, st.layers),
        tp=st.tp, dp=st.dp, mbs=state.samples // st.dp, sequence_parallel=sp, distributed_optimizer=distopt,
        recompute=recompute, recompute_layers=r, gpu=inst.cluster.node_types[st.k].gpu.name)
    cap = costmodel.usable_memory_bytes(inst, inst.cluster.node_types[st.k])
    return sum(parts[:4]) / GIB <= cap / GIB * (1 + 1e-9)


def _least_full(fits, most: int) -> int:
    """The fewest recomputed layers r in 1..most with fits(r) (memory falls as r grows), else most."""
    lo, hi = 1, most
    if not fits(hi):
        return most
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid + 1, hi)
    return lo


def set_recompute(sx: Search, state: State) -> list[tuple[str, int]]:
    """(granularity, recomputed layers) per stage: none where memory allows, else selective,
    else full with the fewest layers that fit (all layers when nothing fits). Megatron mode:
    one setting for every stage (full: one r, at most the smallest stage's layers)."""
    pp = len(state.stages)
    if sx.uniform:
        return [_recompute_of(sx, state, range(pp))] * pp
    return [_recompute_of(sx, state, [s]) for s in range(pp)]


def _recompute_of(sx: Search, state: State, group) -> tuple[str, int]:
    """The least costly recompute setting under which every stage of `group` fits (--fix recompute pins it)."""
    grains = [g for g in recompute_choices(sx.inst) if g == sx.fix.get("recompute", g)]
    for g in grains:
        if g != "full" and all(stage_fits(sx, state, s, g, 0) for s in group):
            return g, 0
    if "full" not in grains:
        return grains[-1], 0
    most = min(state.stages[s].layers for s in group)
    return "full", _least_full(lambda r: all(stage_fits(sx, state, s, "full", r) for s in group), most)


# ---- realising a state: a Plan scored by the cost model -----------------------------
def realise(sx: Search, state: State) -> Plan | None:
    """The state's Plan (build_plan, predict.evaluate), or None when it is not valid; memoised.
    Every admitted plan competes for the best."""
    if state in sx.plans:
        return sx.plans[state]
    plan = None
    if valid(sx, state):
        plan = _build(sx, state)
        sx.deadline.charge(WORK.plan)
        sx.evaluated += 1
        if (sx.limits.admit(plan) and in_exact_space(state)
                and (sx.best is None or objective_of(plan, sx.limits) < objective_of(sx.best, sx.limits))):
            sx.best = plan
    else:
        sx.deadline.charge(WORK.step)
    sx.plans[state] = plan
    return plan


def _build(sx: Search, state: State) -> Plan:
    rec = set_recompute(sx, state)
    sp, distopt = _switches(sx, state)
    B, pp = state.samples, len(state.stages)
    options = [StageOption(st.k, st.tp, st.dp, B // st.dp, g) for st, (g, _) in zip(state.stages, rec)]
    if sx.uniform:
        s0 = state.stages[0]
        cfg = Config.megatron(s0.tp, s0.dp, B // s0.dp, pp, rec[0][0], OneFOneB.name, 1, sp, distopt)
    else:
        cfg = Config(B, pp, OneFOneB.name, 1, True, bool(sx.fix.get("distopt", True)))
    return build_plan(sx.inst, cfg, options, [st.layers for st in state.stages], [r for _, r in rec], None)


def score(sx: Search, plan: Plan) -> tuple[int, float]:
    """(0, objective) for an admitted plan; (1, total relative overrun) otherwise: memory of
    every stage over its capacity, step time over the limit, $/h and $/step over the budget."""
    if sx.limits.admit(plan):
        return 0, objective_of(plan, sx.limits)
    p, lim = plan.predicted, sx.limits
    over = sum(max(0.0, sp.peak_memory_gib / sp.capacity_gib - 1) for sp in p.stages)
    for value, limit in ((p.step_time_s, lim.time_limit_s), (p.usd_per_hour, lim.budget_usd_per_hour),
                         (p.usd_per_step, lim.budget_usd_per_step)):
        if limit is not None:
            over += max(0.0, value / limit - 1)
    return 1, over


def better(a: tuple[int, float], b: tuple[int, float]) -> bool:
    return a[0] < b[0] or (a[0] == b[0] and a[1] < b[1] - _REL * abs(b[1]))


# ---- the bottleneck -----------------------------------------------------------------
def bottleneck(plan: Plan) -> int:
    """The stage with the largest memory overflow when one is out of memory, else the one with
    the largest f + b per micro-batch (the first on a tie)."""
    st = plan.predicted.stages
    over = [sp.peak_memory_gib - sp.capacity_gib * (1 + 1e-9) for sp in st]
    if max(over) > 0:
        return max(range(len(st)), key=lambda s: (over[s], -s))
    return max(range(len(st)), key=lambda s: (st[s].fwd_ms + st[s].bwd_ms, -s))


def fastest(plan: Plan) -> int:
    """The stage with the least f + b per micro-batch (the first on a tie)."""
    st = plan.predicted.stages
    return min(range(len(st)), key=lambda s: (st[s].fwd_ms + st[s].bwd_ms, s))


# ---- actions (paper §4.2), each returning candidate states ---------------------------
def _with_stage(state: State, s: int, **kw) -> State:
    stages = list(state.stages)
    stages[s] = replace(stages[s], **kw)
    return replace(state, stages=tuple(stages))


def move_layers(state: State, s: int) -> Iterator[State]:
    """One layer from stage s to each neighbour."""
    for d in (s - 1, s + 1):
        if 0 <= d < len(state.stages) and state.stages[s].layers > 1:
            moved = _with_stage(state, s, layers=state.stages[s].layers - 1)
            yield _with_stage(moved, d, layers=state.stages[d].layers + 1)


def _scaled(state: State, s: int, dim: str, factor: float) -> State | None:
    v = getattr(state.stages[s], dim) * factor
    return _with_stage(state, s, **{dim: int(v)}) if v >= 1 and v == int(v) else None


def scale(sx: Search, state: State, s: int, up: bool) -> Iterator[State]:
    """tp or dp of stage s doubled (up) or halved. Up without idle GPUs: a donor stage on the
    same node type halves its tp or dp in the same action. Megatron mode: every stage at once."""
    factor = 2 if up else 0.5
    for dim in ("dp", "tp"):
        if sx.uniform:
            new = state
            for j in range(len(state.stages)):
                new = new and _scaled(new, j, dim, factor)
            if new:
                yield new
            continue
        new = _scaled(state, s, dim, factor)
        if new is None:
            continue
        yield new
        if up and not fits_nodes(sx.inst, new.stages):
            for j, other in enumerate(state.stages):
                if j != s and other.k == state.stages[s].k:
                    for ddim in ("dp", "tp"):
                        donor = _scaled(new, j, ddim, 0.5)
                        if donor is not None:
                            yield donor


def swap_tp_dp(sx: Search, state: State, s: int) -> Iterator[State]:
    """A factor 2 moved from dp to tp and from tp to dp on stage s (Megatron mode: every stage)."""
    for to_tp in (True, False):
        new = state
        for j in (range(len(state.stages)) if sx.uniform else [s]):
            a, b = (("tp", "dp") if to_tp else ("dp", "tp"))
            new = new and _scaled(new, j, b, 0.5)
            new = new and _scaled(new, j, a, 2)
        if new:
            yield new


def change_micro_batch(state: State) -> Iterator[State]:
    """B (samples per micro-batch) doubled and halved: fewer, larger micro-batches or more, smaller."""
    yield replace(state, samples=state.samples * 2)
    if state.samples % 2 == 0:
        yield replace(state, samples=state.samples // 2)


def neighbours(sx: Search, state: State, plan: Plan) -> Iterator[State]:
    """Every action on the bottleneck stage (and, for min-cost, giving back the fastest
    stage's GPUs), in a fixed order."""
    s = bottleneck(plan)
    yield from move_layers(state, s)
    yield from scale(sx, state, s, up=True)
    yield from swap_tp_dp(sx, state, s)
    yield from change_micro_batch(state)
    yield from scale(sx, state, s, up=False)
    if sx.limits.objective == "min-cost":
        yield from scale(sx, state, fastest(plan), up=False)


# ---- multi-hop search (paper §4.3) ----------------------------------------------------
def improve(sx: Search, state: State, max_hops: int, beam: int = BEAM) -> State | None:
    """A state better than `state` reached by a chain of at most max_hops actions (the
    shallowest depth that has one, its best), or None: `state` is a local optimum."""
    base = score(sx, realise(sx, state))
    frontier, seen = [state], {state}
    for _ in range(max_hops):
        layer = []
        for cur in frontier:
            for nxt in neighbours(sx, cur, realise(sx, cur)):
                if nxt in seen or sx.deadline.expired():
                    continue
                seen.add(nxt)
                plan = realise(sx, nxt)
                if plan is not None:
                    layer.append((score(sx, plan), nxt))
        if not layer:
            return None
        layer.sort()
        if better(layer[0][0], base):
            return layer[0][1]
        frontier = [st for _, st in layer[:beam]]
    return None


def descend(sx: Search, start: State, max_hops: int = MAX_HOPS, beam: int = BEAM) -> State:
    """From `start`, move to an improving chain's end until none is left (one trial)."""
    state = start
    for _ in range(MAX_STEPS):
        if sx.deadline.expired():
            break
        nxt = improve(sx, state, max_hops, beam)
        if nxt is None:
            break
        state = nxt
    return state


# ---- start points (paper §4.4: trials per pipeline depth) ----------------------------
def starts(sx: Search, pp: int, trials: int, rng: random.Random, shared: SharedCoefficients) -> list[State]:
    """Up to `trials` start states for pipeline depth pp: the warm-start heuristic's
    candidates of the 1F1B configs with this pp, most GPUs per stage first; the first is
    kept, the seed picks the others among the next few."""
    cfgs = [c for c in enumerate_configs(sx.inst, {**sx.fix, "pp": pp, "schedule": OneFOneB.name}, mode="megatron")]
    cfgs.sort(key=lambda c: (-c.uniform.group, c.uniform.mbs, c.uniform.tp,
                             recompute_choices(sx.inst).index(c.uniform.recompute)))
    found: list[State] = []
    for cfg in cfgs:
        if len(found) >= 2 * trials or sx.deadline.expired():
            break
        coef = Coefficients(sx.inst, cfg, shared)
        for opts, layers, _ in warmstart.candidates(coef, sx.deadline):
            st = State(cfg.samples, tuple(StageState(coef.options[o].k, cfg.uniform.tp, cfg.uniform.dp, n)
                                                for o, n in zip(opts, layers)))
            if st not in found:
                found.append(st)
    rest = found[1:]
    rng.shuffle(rest)
    return (found[:1] + rest)[:trials]


def search(inst: Instance, limits: Limits, deadline: Deadline, fix: dict | None = None, seed: int = 1,
           max_hops: int = MAX_HOPS, trials: int = TRIALS, beam: int = BEAM) -> Search:
    """Every pipeline depth from 1 up, `trials` descents each, until done or the deadline;
    the returned Search holds the best admitted plan (`best`)."""
    fix = {k: v for k, v in (fix or {}).items() if k != "mixed"}  # its own space: no mixed-type stages
    mode = inst.objective.mode
    check_fix(fix, mode)
    sx = Search(inst, limits, fix, mode, deadline, frozenset(tp_sizes(inst, fix)))
    rng, shared = random.Random(seed), SharedCoefficients(inst)
    most = min(inst.model.num_layers, inst.cluster.num_gpus)
    depths = [fix["pp"]] if "pp" in fix else list(range(1, most + 1))
    for done, pp in enumerate(depths):
        sx.depths = (done, len(depths))
        for start in starts(sx, pp, trials, rng, shared):
            if deadline.expired():
                return sx
            if realise(sx, start) is not None:
                descend(sx, start, max_hops, beam)
    sx.depths = (len(depths), len(depths))
    return sx
