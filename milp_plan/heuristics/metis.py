"""A Metis-style planner: node sequences x device groups x micro-batch counts, a greedy
per-stage (dp, tp) search and a layer load balancer, on milp-plan's cost model.

Reimplemented from the paper (Um et al., "Metis: Fast Automatic Distributed Training on
Heterogeneous GPUs", USENIX ATC'24) and from reading its public planner's search loop
(SamsungLabs/Metis; not copied; the paper's section numbers were not at hand, so the parts
are named by what they do). What it follows:

- Inter-stage plans: a node sequence (the order of the node types along the pipeline; the
  GPUs are ranked in that order), a number of stages S, a device group (the GPUs of each
  stage, powers of two summing to the sequence's GPUs) and a micro-batch count m (every
  divisor of the global batch, largest first). Its two pruning knobs, with the defaults of
  its inter-stage plan generator: `scale_variance` (0.5): a device group is at least
  variance x max(N // S, S // N) GPUs (no tiny stages beside huge ones); `max_permute_len`
  (4): before the orders of a group multiset are permuted, the smallest equal groups are
  merged pairwise until at most that many blocks remain, so only the blocks' orders are
  enumerated (`device_groups`).
- Intra-stage plans (`greedy_strategies`): every stage starts as pure data parallelism
  (dp = its GPUs, tp = 1); each time the load balancer answers, the stage with the least
  spare memory that still has dp > 1 trades a factor 2 of dp for tp (Metis prefers data
  parallelism and adds tensor parallelism only where memory needs it); every strategy the
  balancer partitions is a candidate, and the search of this inter-stage plan ends at the
  first strategy whose partition fits memory without re-partitioning, or when no stage has
  dp > 1 left.
- The layer load balancer (`balance`): layers in proportion to each stage's compute
  performance (1 / time of the model's layers on its GPU type at its tp and micro-batch),
  rounded by largest remainder, then up to three single-layer moves from a more loaded
  stage to its least loaded neighbour while the largest load falls; when a stage runs out
  of memory its performance is scaled by 0.9 x capacity / demand and the difference is
  given to the stages with spare memory (in proportion to their performance, at most up
  to their own memory limit), and the layers are partitioned again, at most 3 attempts;
  no partition when the spare memory cannot take the excess.
- Ranking: the cost estimate of every candidate, here milp-plan's cost model
  (`objective_of`: step time or $/step among the plans the limits admit), the best kept.

Where it departs from Metis:

- The cost model is milp-plan's: each candidate is built into a Plan (through
  heuristics/aceso.realise: placement.build_plan -> predict.evaluate) and admitted by
  `Limits.admit`; Metis's own estimator and its profiled per-layer memory are not used (the
  balancer reads costmodel.stage_compute_s and costmodel.stage_memory_bytes).
- Device groups that mix GPU types (Metis splits their micro-batch between the types with
  its data load balancer) or put a stage over part of two nodes cannot be written as a
  milp-plan plan: they are skipped and counted in the notes. Device groups that give one
  node type stages of different sizes are skipped too and counted apart: milp-plan can
  write such a plan, but the exact planners' space keeps each type's stages one size (one
  run where they share nodes), and (as for aceso) only plans of that space are returned, so that `compare` gaps
  measure every planner on one space.
- Recompute: Metis has none. The balancer's memory test asks whether a stage fits under the
  least-memory recompute the space allows, and the plan then takes the cheapest recompute
  that fits (aceso.set_recompute: none, else selective, else full with the fewest layers).
- Node sequences: Metis permutes all node types and uses every GPU; these come first
  (fasop.node_sequences), then every ordering of every subset with fewer nodes, so that
  budgets and min-cost can use fewer GPUs.
- The fine-grained ("hallucinated") layer assignment of Metis's balancer is replaced by the
  largest-remainder rounding above, its adjustment pass by the three neighbour moves.
- Mode: in --mode megatron every stage has one (tp, dp): only device groups of one size, and
  the greedy step trades dp for tp on every stage at once. In --mode free (Metis's own
  setting) each stage has its own (dp, tp).
- Schedule: 1F1B without interleaving; other schedules are refused.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

from milp_plan import costmodel
from milp_plan.deadline import WORK, Deadline
from milp_plan.errors import InputError
from milp_plan.formulations.space import (FREE_SP_REFUSAL, covered, micro_batch_sizes, placement,
                                          recompute_choices, tp_sizes)
from milp_plan.heuristics import aceso
from milp_plan.heuristics.aceso import Search, StageState, State
from milp_plan.heuristics.fasop import check_fix, count_sequences, gpus_of, node_sequences
from milp_plan.instance import Instance
from milp_plan.job import Limits
from milp_plan.plan import Plan
from milp_plan.schedules import OneFOneB

SCALE_VARIANCE = 0.5      # Metis: smallest device group >= variance x max(N // S, S // N) GPUs
MAX_PERMUTE_LEN = 4       # Metis: blocks whose orders are permuted, after merging the smallest groups
MAX_ATTEMPTS = 3          # Metis: partitions per strategy (the first and two memory-driven repartitions)
OOM_SCALE = 0.9           # Metis: an out-of-memory stage keeps 0.9 x capacity / demand of its performance
ADJUST_MOVES = 3          # neighbour moves after the proportional split

Strategy = tuple[tuple[int, int], ...]   # (dp, tp) per stage


@dataclass
class Outcome:
    best: Plan | None
    evaluated: int
    skipped: int             # device groups milp-plan's plan format cannot hold (mixed GPU types, part of two nodes)
    outside: int             # device groups outside the exact planners' space (a node type's stages of two sizes)
    sequences_done: int
    sequences_total: int


# ---- device groups (inter-stage plans) ---------------------------------------------------
def _multisets(total: int, stages: int, shapes: Sequence[int], least: int = 0) -> Iterator[tuple[int, ...]]:
    """Non-decreasing tuples of `stages` shapes (each >= least) summing to total."""
    if stages == 0:
        if total == 0:
            yield ()
        return
    if shapes[-1] * stages < total:
        return
    for g in shapes:
        if g < least or g * stages > total:
            continue
        for rest in _multisets(total - g, stages - 1, shapes, g):
            yield (g,) + rest


def _blocks(groups: tuple[int, ...], max_permute_len: int) -> list[tuple[int, ...]]:
    """Metis's permutation-length limit: while more than max_permute_len blocks remain, pairs of
    adjacent blocks of the smallest size are merged into one (only as many as needed)."""
    blocks = [(g,) for g in groups]
    while len(blocks) > max_permute_len:
        smallest, need = sum(blocks[0]), len(blocks) - max_permute_len
        merged, i, done = [], 0, 0
        while i < len(blocks):
            if (done < need and i + 1 < len(blocks)
                    and sum(blocks[i]) == smallest == sum(blocks[i + 1])):
                merged.append(blocks[i] + blocks[i + 1])
                i, done = i + 2, done + 1
            else:
                merged.append(blocks[i])
                i += 1
        if done == 0:
            break
        blocks = sorted(merged, key=sum)
    return blocks


def _orders(items: Sequence) -> Iterator[tuple]:
    """Every distinct order of `items`, in lexicographic order (next-permutation), lazily:
    a multiset of n blocks can have n! orders, so they are never listed in advance."""
    a = sorted(items)
    while True:
        yield tuple(a)
        i = len(a) - 2
        while i >= 0 and not a[i] < a[i + 1]:
            i -= 1
        if i < 0:
            return
        j = len(a) - 1
        while not a[i] < a[j]:
            j -= 1
        a[i], a[j] = a[j], a[i]
        a[i + 1:] = reversed(a[i + 1:])


def device_groups(gpus: int, stages: int, variance: float = SCALE_VARIANCE,
                  max_permute_len: int = MAX_PERMUTE_LEN) -> Iterator[tuple[int, ...]]:
    """The device groups (GPUs per stage, in pipeline order) Metis enumerates for `stages`
    stages on `gpus` GPUs: powers of two, each at least variance x max(gpus // stages,
    stages // gpus), every distinct order of the merged blocks; deterministic and lazy (the
    caller checks its deadline between groups)."""
    shapes = [2 ** i for i in range(gpus.bit_length()) if 2 ** i <= gpus]
    least = max(gpus // stages, stages // gpus) * variance
    shapes = [g for g in shapes if g >= least]
    seen = set()
    for ms in _multisets(gpus, stages, shapes) if shapes else ():
        for perm in _orders(_blocks(ms, max_permute_len)):
            flat = tuple(g for block in perm for g in block)
            if flat not in seen:
                seen.add(flat)
                yield flat


def uniform_groups(gpus: int, stages: int, variance: float = SCALE_VARIANCE) -> list[tuple[int, ...]]:
    """The one device group of `device_groups` whose stages all have the same size, if any
    (Megatron mode: every stage has one tp x dp)."""
    g, rest = divmod(gpus, stages)
    if rest or g & (g - 1) or g < max(gpus // stages, stages // gpus) * variance:
        return []
    return [(g,) * stages]


MIXED, SIZES = "mixed", "sizes"   # why group_types refuses a layout


def group_types(inst: Instance, seq, groups: Sequence[int]) -> tuple[int, ...] | str:
    """The node type of each stage when the groups take the sequence's GPUs in rank order, or
    why not: MIXED when milp-plan's plan format cannot hold the layout (a group over two node
    types or over part of two nodes), SIZES when one node type's stages differ in size (a plan
    milp-plan can write down but outside the exact planners' space, formulations/pipeline.md:
    like aceso.in_exact_space, such plans are not returned, so that `compare` measures every
    planner on one space)."""
    ranks = [k for k, nodes in seq for _ in range(nodes * inst.cluster.node_types[k].gpus_per_node)]
    out, start, sizes = [], 0, {}
    for g in groups:
        k = ranks[start]
        nt = inst.cluster.node_types[k]
        offset = start - ranks.index(k)   # rank offset inside the type's GPUs
        if ranks[start + g - 1] != k or placement(nt, g) is None or offset % min(g, nt.gpus_per_node):
            return MIXED
        if sizes.setdefault(k, g) != g:
            return SIZES
        out.append(k)
        start += g
    return tuple(out)


# ---- the layer load balancer -------------------------------------------------------------
def proportional(num_layers: int, perf: Sequence[float]) -> tuple[int, ...] | None:
    """Layers in proportion to each stage's share of the performance, at least one each,
    rounded by largest remainder (ties: the earlier stage)."""
    pp = len(perf)
    if num_layers < pp:
        return None
    ideal = [num_layers * p / sum(perf) for p in perf]
    parts = [max(1, int(x)) for x in ideal]
    while sum(parts) < num_layers:
        s = max(range(pp), key=lambda i: (ideal[i] - parts[i], -i))
        parts[s] += 1
    while sum(parts) > num_layers:
        s = min((i for i in range(pp) if parts[i] > 1), key=lambda i: (ideal[i] - parts[i], i))
        parts[s] -= 1
    return tuple(parts)


def adjust(parts: tuple[int, ...], per_layer: Sequence[float], moves: int = ADJUST_MOVES) -> tuple[int, ...]:
    """Up to `moves` times the least loaded stage (load = layers x time per layer) takes one
    layer from its more loaded neighbour, kept while the largest load falls."""
    parts = list(parts)
    for _ in range(moves):
        loads = [n * a for n, a in zip(parts, per_layer)]
        lo = min(range(len(parts)), key=lambda s: (loads[s], s))
        nbrs = [d for d in (lo - 1, lo + 1) if 0 <= d < len(parts) and parts[d] > 1]
        if not nbrs:
            break
        d = max(nbrs, key=lambda i: (loads[i], -i))
        new = list(parts)
        new[d] -= 1
        new[lo] += 1
        if max(n * a for n, a in zip(new, per_layer)) >= max(loads):
            break
        parts = new
    return tuple(parts)


def reallocate(perf: Sequence[float], capacity: Sequence[float], demand: Sequence[float]) -> list[float] | None:
    """Metis's memory-driven performance adjustment: a stage over its memory keeps
    OOM_SCALE x capacity / demand of its performance; what it loses goes to the stages with
    spare memory, in proportion to their performance and at most perf x (capacity / demand
    - 1) each. None when the spare cannot take it all."""
    adj, room, need = list(perf), [0.0] * len(perf), 0.0
    for s, (p, cap, dem) in enumerate(zip(perf, capacity, demand)):
        if dem > cap:
            adj[s] = p * cap / dem * OOM_SCALE
            need += p - adj[s]
        else:
            room[s] = p * cap / max(dem, 1e-30) - p
    if sum(room) < need:
        return None
    for _ in range(64):
        open_ = [s for s in range(len(perf)) if room[s] > 1e-12 * sum(perf)]
        if need <= 1e-9 * sum(perf) or not open_:
            break
        total = sum(perf[s] for s in open_)
        for s in open_:
            give = min(room[s], need * perf[s] / total)
            adj[s] += give
            room[s] -= give
        need = sum(perf) - sum(adj)
    return adj


@dataclass
class Balance:
    layers: tuple[int, ...] | None
    attempts: int
    spare: list[float] | None      # capacity - demand per stage (bytes), of the last partition tried


def _least_memory(sx: Search) -> tuple[str, bool]:
    grains = [g for g in recompute_choices(sx.inst) if g == sx.fix.get("recompute", g)]
    return ("full", True) if "full" in grains else (grains[-1], False)


def stage_memory(sx: Search, state: State, s: int) -> tuple[float, float]:
    """(demand, capacity) bytes per GPU of stage s under the least-memory recompute the space
    allows (costmodel.stage_memory_bytes, as Limits.admit counts it)."""
    inst, st = sx.inst, state.stages[s]
    grain, full = _least_memory(sx)
    first = sum(x.layers for x in state.stages[:s])
    sp, distopt = aceso._switches(sx, state)
    parts = costmodel.stage_memory_bytes(
        inst, schedule=OneFOneB.name, pp=len(state.stages), stage=s,
        m=inst.job.global_batch_size // state.samples, vpp=1, kinds=costmodel.stage_kinds(inst, first, st.layers),
        tp=st.tp, dp=st.dp, mbs=state.samples // st.dp, sequence_parallel=sp, distributed_optimizer=distopt,
        recompute=grain, recompute_layers=st.layers if full else 0, gpu=inst.cluster.node_types[st.k].gpu.name)
    return sum(parts[:4]), costmodel.usable_memory_bytes(inst, inst.cluster.node_types[st.k])


def per_layer_time(inst: Instance, k: int, tp: int, mbs: int) -> float:
    """Seconds per micro-batch of the model's layers on node type k at (tp, mbs), divided by
    the layer count (Metis's stage performance is its inverse)."""
    f, b = costmodel.stage_compute_s(inst, inst.cluster.node_types[k], tp, mbs,
                                     costmodel.stage_kinds(inst, 0, inst.model.num_layers), False, False)
    return (f + b) / inst.model.num_layers


def balance(sx: Search, samples: int, types: Sequence[int], strategy: Strategy) -> Balance:
    """Metis's layer load balancer for one strategy: proportional split, neighbour moves, and up
    to MAX_ATTEMPTS memory-driven repartitions."""
    L = sx.inst.model.num_layers
    per_layer = [per_layer_time(sx.inst, k, tp, samples // dp) for k, (dp, tp) in zip(types, strategy)]
    perf = [1.0 / a for a in per_layer]
    spare = None
    for attempt in range(1, MAX_ATTEMPTS + 1):
        parts = proportional(L, perf)
        if parts is None:
            return Balance(None, -1, spare)
        parts = adjust(parts, per_layer)
        state = _state(samples, types, strategy, parts)
        mem = [stage_memory(sx, state, s) for s in range(len(types))]
        spare = [cap - dem for dem, cap in mem]
        if min(spare) >= 0:
            return Balance(parts, attempt, spare)
        perf = reallocate(perf, [c for _, c in mem], [d for d, _ in mem])
        if perf is None:
            break
    return Balance(None, -1, spare)


def _state(samples: int, types: Sequence[int], strategy: Strategy, layers: Sequence[int]) -> State:
    return State(samples, tuple(StageState(k, tp, dp, n) for k, (dp, tp), n in zip(types, strategy, layers)))


# ---- the greedy intra-stage search -------------------------------------------------------
def strategy_ok(sx: Search, samples: int, types: Sequence[int], strategy: Strategy) -> bool:
    """Every stage's (dp, tp) runs: dp divides the micro-batch's samples at an allowed size,
    tp is allowed and divides the node, and the profile covers (GPU, tp, micro-batch)."""
    inst, fix = sx.inst, sx.fix
    mbs_ok = set(micro_batch_sizes(samples, fix))
    for k, (dp, tp) in zip(types, strategy):
        nt = inst.cluster.node_types[k]
        if samples % dp or samples // dp not in mbs_ok or tp not in sx.tps or nt.gpus_per_node % tp:
            return False
        if fix.get("dp", dp) != dp or not covered(inst, nt.gpu.name, tp, samples // dp, fix):
            return False
    return True


def next_strategy(strategy: Strategy, spare: Sequence[float] | None, uniform: bool) -> Strategy | None:
    """The stage with the least spare memory (without a memory state: the largest dp first)
    whose dp > 1 trades a factor 2 of dp for tp; uniform (Megatron mode): every stage at once."""
    if uniform:
        if strategy[0][0] % 2:
            return None
        return tuple((dp // 2, tp * 2) for dp, tp in strategy)
    key = list(spare) if spare is not None else [1.0 / dp for dp, _ in strategy]
    for s in sorted(range(len(strategy)), key=lambda i: (key[i], i)):
        dp, tp = strategy[s]
        if dp % 2 == 0:
            return strategy[:s] + ((dp // 2, tp * 2),) + strategy[s + 1:]
    return None


def greedy_strategies(sx: Search, samples: int, types: Sequence[int], groups: Sequence[int]) -> None:
    """From pure data parallelism, trade dp for tp on the stage with the least spare memory;
    realise every strategy the balancer partitions; stop at the first that fits memory at
    the first attempt."""
    strategy: Strategy | None = tuple((g, 1) for g in groups)
    spare = None
    while strategy is not None and not sx.deadline.expired():
        if strategy_ok(sx, samples, types, strategy):
            got = balance(sx, samples, types, strategy)
            sx.deadline.charge(WORK.step)
            if got.layers is not None:
                aceso.realise(sx, _state(samples, types, strategy, got.layers))
                if got.attempts == 1:
                    return
            spare = got.spare
        strategy = next_strategy(strategy, spare, sx.uniform)


# ---- the search --------------------------------------------------------------------------
def search(inst: Instance, limits: Limits, deadline: Deadline, fix: dict | None = None,
           variance: float = SCALE_VARIANCE, max_permute_len: int = MAX_PERMUTE_LEN) -> Outcome:
    """Node sequences x stage counts x device groups x micro-batch counts, each with the greedy
    intra-stage search; the best admitted plan."""
    fix = {k: v for k, v in (fix or {}).items() if k != "mixed"}  # its own space: no mixed-type stages
    mode = inst.objective.mode
    check_fix(fix, "metis")
    if mode == "free" and fix.get("sp") is False:
        raise InputError(FREE_SP_REFUSAL, field="fix")
    sx = Search(inst, limits, fix, mode, deadline, frozenset(tp_sizes(inst, fix)))
    gbs, L = inst.job.global_batch_size, inst.model.num_layers
    batches = [m for m in range(gbs, 0, -1) if gbs % m == 0]
    skipped, outside, done, total = 0, 0, 0, count_sequences(inst)
    for seq in node_sequences(inst):
        gpus = gpus_of(inst, seq)
        for stages in ([fix["pp"]] if "pp" in fix else range(1, min(gpus, L) + 1)):
            for groups in (uniform_groups(gpus, stages, variance) if sx.uniform
                           else device_groups(gpus, stages, variance, max_permute_len)):
                if deadline.expired():
                    return Outcome(sx.best, sx.evaluated, skipped, outside, done, total)
                deadline.charge(WORK.step)
                types = group_types(inst, seq, groups)
                if isinstance(types, str):
                    skipped += types == MIXED
                    outside += types == SIZES
                    continue
                for m in batches:
                    greedy_strategies(sx, gbs // m, types, groups)
        done += 1
    return Outcome(sx.best, sx.evaluated, skipped, outside, done, total)
