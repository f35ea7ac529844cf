"""A FASOP-style planner: exhaustive search over uniform configurations and node orders with
a min-max layer partition, on milp-plan's cost model.

Reimplemented from the paper (Hwang et al., "FASOP: Fast yet Accurate Automated Search for
Optimal Parallelization of Transformers on Heterogeneous GPU Clusters", HPDC'24) and from
reading its public repository's search loop (its code is not copied; the paper's section
numbers were not at hand, so the parts are named by what they do). What it follows:

- The search space: uniform (tp, dp, pp, mbs) configurations, as Megatron-LM runs them
  (one tp and dp for every stage), with pp = GPUs used / (tp x dp): every GPU of the
  chosen nodes is used, as in FASOP; mbs over the sizes dividing the batch per replica.
- Node placement: the order of the node types along the pipeline (FASOP permutes its A100
  and A10 nodes), here every ordering of every non-empty subset of the cluster's node
  types with how many nodes of each are used (`node_sequences`; all nodes of all types
  first, FASOP's own cluster, then the smaller selections, so that budgets and min-cost
  can pick fewer GPUs). Stage s runs on the node type that holds its GPUs in rank order.
- The layer partition (`minmax_partition`): FASOP's min-max heuristic. Start from the
  even split (the remainder to the last stage, then to the first ones), then repeatedly
  move one layer from the stage with the largest per-micro-batch time to the one with
  the smallest, given each stage's GPU type; stop when the largest time would grow, when
  a partition repeats, or when the slowest stage holds one layer; keep the partition with
  the least maximum seen.
- Ranking: every candidate's step time or $/step (`objective_of`) among the plans the
  limits admit (min-cost under the step-time limit, budgets), the best kept.

Where it departs from FASOP:

- The cost model is milp-plan's: every candidate is built into a Plan
  (placement.build_plan -> predict.evaluate, through heuristics/aceso.realise), scored,
  checked by `Limits.admit`; FASOP's own estimator (its pipeline simulation, all-reduce
  and embedding-sync terms) is not used. The stage time the partition balances is the
  cost model's f + b per micro-batch (costmodel.stage_compute_s); FASOP also adds the
  stage's p2p receive, which does not depend on the split and is left out of the balance.
- Recompute: FASOP has none (it estimates peak memory and discards out-of-memory plans).
  Here the cheapest recompute that fits memory is used (aceso.set_recompute: none, else
  selective, else full with the fewest recomputed layers, one setting for all stages).
- Plans milp-plan cannot represent are skipped and counted in the result's notes: a stage
  whose tp x dp GPUs would span two node types (or part of two nodes). FASOP's cyclic
  node rotations that split one type into two runs along the pipeline are not generated
  (the exact planners search such orders where stages take whole nodes).
- Schedule: 1F1B without interleaving (FASOP's space); other schedules are refused.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from milp_plan import costmodel
from milp_plan.deadline import WORK, Deadline
from milp_plan.errors import InputError
from milp_plan.formulations.space import LIST_KEYS, micro_batch_sizes, placement, tp_sizes
from milp_plan.heuristics import aceso
from milp_plan.heuristics.aceso import Search, StageState, State
from milp_plan.instance import Instance
from milp_plan.job import Limits
from milp_plan.plan import Plan
from milp_plan.schedules import OneFOneB

NodeSequence = tuple[tuple[int, int], ...]   # (node type index, nodes used) along the pipeline


@dataclass
class Outcome:
    """What one search found and how far it got."""

    best: Plan | None
    evaluated: int           # plans built and scored
    skipped: int             # layouts outside milp-plan's plan format (a stage over two GPU types or nodes)
    sequences_done: int
    sequences_total: int


def check_fix(fix: dict, planner: str) -> None:
    """The planner partitions layers and orders nodes itself, and plans 1F1B only."""
    if LIST_KEYS & set(fix):
        raise InputError(f"{planner} partitions layers and orders the node types itself: it takes no layers= or "
                         "order= pins; use an exact solver (--solver cpsat) to score a pinned layout", field="fix")
    if fix.get("schedule", OneFOneB.name) != OneFOneB.name or fix.get("vpp", 1) != 1:
        raise InputError(f"the {planner} planner plans the 1F1B schedule only (as {planner.upper()} does); drop "
                         "schedule= and vpp= from --fix or use --solver cpsat", field="fix")


# ---- node orders ------------------------------------------------------------------------
def node_sequences(inst: Instance) -> Iterator[NodeSequence]:
    """Every ordering of the node types with all their nodes first (the whole cluster, as
    FASOP and Metis plan it), then every ordering of every subset with 1..count nodes of
    each type, most nodes first; deterministic."""
    types = inst.cluster.node_types
    full = tuple(range(len(types)))
    for perm in itertools.permutations(full):
        yield tuple((k, types[k].count) for k in perm)
    for r in range(len(types), 0, -1):
        for perm in itertools.permutations(full, r):
            for counts in itertools.product(*(range(types[k].count, 0, -1) for k in perm)):
                seq = tuple(zip(perm, counts))
                if r < len(types) or any(c < types[k].count for k, c in seq):
                    yield seq


def count_sequences(inst: Instance) -> int:
    types = inst.cluster.node_types
    total = 0
    for r in range(1, len(types) + 1):
        for perm in itertools.permutations(range(len(types)), r):
            n = 1
            for k in perm:
                n *= types[k].count
            total += n
    return total


def gpus_of(inst: Instance, seq: NodeSequence) -> int:
    return sum(n * inst.cluster.node_types[k].gpus_per_node for k, n in seq)


def stage_types(inst: Instance, seq: NodeSequence, group: int) -> tuple[int, ...] | None:
    """The node type of each stage when stages of `group` GPUs take the sequence's GPUs in
    rank order, or None when a stage would span two node types or part of two nodes
    (outside milp-plan's plan format)."""
    out: list[int] = []
    for k, nodes in seq:
        nt = inst.cluster.node_types[k]
        gpus = nodes * nt.gpus_per_node
        pl = placement(nt, group)
        if gpus % group or pl is None or pl.nodes_used(gpus // group) > nodes:
            return None
        out += [k] * (gpus // group)
    return tuple(out)


# ---- the min-max partition ----------------------------------------------------------------
def minmax_partition(num_layers: int, pp: int,
                     stage_times: Callable[[tuple[int, ...]], Sequence[float]]) -> tuple[int, ...] | None:
    """FASOP's min-max layer partition: from the even split, move one layer at a time from
    the slowest stage to the fastest while the largest stage time does not grow (and no
    partition repeats); the partition with the least largest time seen, or None when there
    are fewer layers than stages. stage_times(partition) gives each stage's time."""
    if num_layers < pp:
        return None
    base, extra = divmod(num_layers, pp)
    parts = [base] * pp
    for i in range(extra):          # the remainder: the last stage first, then the first ones
        parts[(i - 1) % pp] += 1
    cur = tuple(parts)
    times = list(stage_times(cur))
    best, best_max, seen = cur, max(times), {cur}
    while True:
        hi = max(range(pp), key=lambda s: (times[s], -s))   # the slowest (the first on a tie)
        lo = min(range(pp), key=lambda s: (times[s], s))    # the fastest (the first on a tie)
        if hi == lo or cur[hi] <= 1:
            break
        nxt = list(cur)
        nxt[hi] -= 1
        nxt[lo] += 1
        nxt = tuple(nxt)
        if nxt in seen:
            break
        new_times = list(stage_times(nxt))
        if max(new_times) > max(times):
            break
        seen.add(nxt)
        cur, times = nxt, new_times
        if max(times) < best_max:
            best, best_max = cur, max(times)
    return best


def stage_time_fn(inst: Instance, types: Sequence[int], tp: int, mbs: int):
    """stage_times(partition) for stages on `types` at (tp, mbs): the cost model's f + b per
    micro-batch without recompute (costmodel.stage_compute_s), memoised per stage."""
    memo: dict = {}
    node_types = inst.cluster.node_types
    pp = len(types)

    def one(s: int, first_layer: int, n: int) -> float:
        key = (s, first_layer, n)
        if key not in memo:
            f, b = costmodel.stage_compute_s(inst, node_types[types[s]], tp, mbs,
                                             costmodel.stage_kinds(inst, first_layer, n), s == 0, s == pp - 1)
            memo[key] = f + b
        return memo[key]

    def stage_times(parts: tuple[int, ...]) -> list[float]:
        firsts = itertools.accumulate((0,) + parts[:-1])
        return [one(s, a, n) for s, (a, n) in enumerate(zip(firsts, parts))]
    return stage_times


# ---- the search ----------------------------------------------------------------------------
def search(inst: Instance, limits: Limits, deadline: Deadline, fix: dict | None = None) -> Outcome:
    """Every node sequence x (tp, dp) whose stages fill the sequence's GPUs x mbs, each with
    its min-max partition and the cheapest recompute that fits; the best admitted plan."""
    fix = {k: v for k, v in (fix or {}).items() if k != "mixed"}  # its own space: no mixed-type stages
    check_fix(fix, "fasop")
    sx = Search(inst, limits, fix, "megatron", deadline, frozenset(tp_sizes(inst, fix)))
    gbs, L = inst.job.global_batch_size, inst.model.num_layers
    skipped, done, total = 0, 0, count_sequences(inst)
    for seq in node_sequences(inst):
        if deadline.expired():
            break
        gpus = gpus_of(inst, seq)
        for tp in sorted(sx.tps):
            for dp in ([fix["dp"]] if "dp" in fix else range(1, gpus // tp + 1)):
                if gpus % (tp * dp) or gbs % dp:
                    continue
                pp = gpus // (tp * dp)
                if pp > L or fix.get("pp", pp) != pp:
                    continue
                types = stage_types(inst, seq, tp * dp)
                if types is None:
                    skipped += 1
                    continue
                for mbs in micro_batch_sizes(gbs // dp, fix):
                    if gbs % (mbs * dp):
                        continue
                    if deadline.expired():
                        return Outcome(sx.best, sx.evaluated, skipped, done, total)
                    layers = minmax_partition(L, pp, stage_time_fn(inst, types, tp, mbs))
                    deadline.charge(WORK.step)
                    if layers is not None:
                        aceso.realise(sx, State(mbs * dp, tuple(StageState(k, tp, dp, n)
                                                                for k, n in zip(types, layers))))
        done += 1
    return Outcome(sx.best, sx.evaluated, skipped, done, total)
