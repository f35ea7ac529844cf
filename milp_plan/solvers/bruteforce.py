"""An independent enumerator over the same decision space as the formulations.

It shares with them only the definition of the space (space.enumerate_configs,
space.stage_options and the canonical placement of build.place_stages) and scores every
candidate plan with costmodel.evaluate, the checker's arithmetic; it never reads the
model's coefficients. Candidates per config:

- every sequence of blocks (a block is a node type and a stage size; each block one
  contiguous run of stages on nodes of its own, the blocks of one node type together on
  at most its nodes). In Megatron mode a node type has one block;
- every choice of stage option per stage among its block's options (free mode: tp, dp and
  recompute per stage; Megatron mode: one option per block);
- every split of the L layers into pp positive parts (multiples of vpp when interleaved);
- the recomputed layers: Megatron mode one r in 1..min_s n_s for every stage, free mode
  each fully recomputing stage its own r_s in 1..n_s (multiples of vpp when interleaved:
  Megatron recomputes r / vpp per chunk).

It refuses instances with more than MAX_PLANS candidates (counted in closed form, an
upper bound where recompute counts are involved): it exists to prove the formulations
right on small instances, not to plan real clusters.
"""
from __future__ import annotations

import itertools
import math
import time
from typing import Iterator

from milp_plan.errors import InputError
from milp_plan.formulations.build import build_plan
from milp_plan.formulations.coefficients import placement
from milp_plan.formulations.pipeline import Limits
from milp_plan.formulations.space import Config, FreeConfig, StageOption, enumerate_configs, stage_options
from milp_plan.instance import Instance
from milp_plan.plan import Plan, SolverRecord

MAX_PLANS = 200_000

BlockKey = tuple[int, int]  # (node type, GPUs per stage)


def _blocks(options: list[StageOption]) -> dict[BlockKey, list[StageOption]]:
    out: dict[BlockKey, list[StageOption]] = {}
    for o in options:
        out.setdefault((o.k, o.group), []).append(o)
    return out


def _nodes(inst: Instance, block: BlockKey, stages: int) -> int:
    return placement(inst.cluster.node_types[block[0]], block[1]).nodes_used(stages)


def _cap(inst: Instance, cfg, block: BlockKey) -> int:
    return min(cfg.pp, placement(inst.cluster.node_types[block[0]], block[1]).max_stages)


def block_sequences(inst: Instance, cfg, options: list[StageOption]) -> Iterator[tuple[BlockKey, ...]]:
    """Stage blocks: an ordered choice of distinct blocks, one run each, sizes summing to pp,
    the blocks of a node type within its node count."""
    blocks = sorted(_blocks(options))
    for r in range(1, min(len(blocks), cfg.pp) + 1):
        for order in itertools.permutations(blocks, r):
            for sizes in compositions(cfg.pp, r, 1):
                if any(sz > _cap(inst, cfg, b) for b, sz in zip(order, sizes)):
                    continue
                used: dict[int, int] = {}
                for b, sz in zip(order, sizes):
                    used[b[0]] = used.get(b[0], 0) + _nodes(inst, b, sz)
                if all(n <= inst.cluster.node_types[k].count for k, n in used.items()):
                    yield tuple(b for b, sz in zip(order, sizes) for _ in range(sz))


def option_sequences(inst: Instance, cfg, options: list[StageOption]) -> Iterator[tuple[StageOption, ...]]:
    by_block = _blocks(options)
    for seq in block_sequences(inst, cfg, options):
        yield from itertools.product(*(by_block[b] for b in seq))


def compositions(total: int, parts: int, unit: int) -> Iterator[tuple[int, ...]]:
    """Ordered splits of `total` into `parts` positive multiples of `unit`."""
    if total % unit:
        return
    q = total // unit
    for cuts in itertools.combinations(range(1, q), parts - 1):
        bounds = (0, *cuts, q)
        yield tuple(unit * (b - a) for a, b in zip(bounds, bounds[1:]))


def count_block_sequences(inst: Instance, cfg, options: list[StageOption], weight: dict[BlockKey, int]) -> int:
    """sum over block_sequences of prod_s weight[block of s], without enumerating them: per
    node type, the choices of its blocks with run lengths within its nodes (a small DP over
    blocks, nodes used), combined over types by (blocks chosen, stages) and ordered (r!)."""
    pp = cfg.pp
    by_type: dict[int, list[BlockKey]] = {}
    for b in sorted(_blocks(options)):
        by_type.setdefault(b[0], []).append(b)
    total = {(0, 0): 1}  # (blocks chosen, stages) -> weighted count, over the types seen so far
    for k, blocks in by_type.items():
        mine = {(0, 0, 0): 1}  # (blocks, stages, nodes) -> weighted count, this type only
        for b in blocks:
            nxt = dict(mine)
            for (j, s, n), ways in mine.items():
                for size in range(1, min(_cap(inst, cfg, b), pp - s) + 1):
                    nodes = n + _nodes(inst, b, size)
                    if nodes <= inst.cluster.node_types[k].count:
                        key = (j + 1, s + size, nodes)
                        nxt[key] = nxt.get(key, 0) + ways * weight[b] ** size
            mine = nxt
        merged: dict[tuple[int, int], int] = {}
        for (j, s), ways in total.items():
            for (j2, s2, _), ways2 in mine.items():
                if s + s2 <= pp:
                    merged[j + j2, s + s2] = merged.get((j + j2, s + s2), 0) + ways * ways2
        total = merged
    return sum(math.factorial(j) * ways for (j, s), ways in total.items() if s == pp and j > 0)


def count_option_sequences(inst: Instance, cfg, options: list[StageOption]) -> int:
    """len(list(option_sequences(...))), in closed form."""
    return count_block_sequences(inst, cfg, options, {b: len(v) for b, v in _blocks(options).items()})


def count_candidates(inst: Instance, cfg, fix: dict | None = None) -> int:
    """Candidates of a config: exact without full recompute, else an upper bound (each full
    stage counted with its most recompute choices, L / vpp - pp + 1)."""
    L, unit = inst.model.num_layers, cfg.vpp
    if L % unit or L // unit < cfg.pp:
        return 0
    options = stage_options(inst, cfg, fix)
    splits = math.comb(L // unit - 1, cfg.pp - 1)
    if isinstance(cfg, Config):
        seqs = count_block_sequences(inst, cfg, options, {b: 1 for b in _blocks(options)})
        return seqs * splits * (L // cfg.pp if cfg.recompute == "full" else 1)
    most_r = L // unit - cfg.pp + 1
    weight = {b: sum(most_r if o.recompute == "full" else 1 for o in opts)
              for b, opts in _blocks(options).items()}
    return count_block_sequences(inst, cfg, options, weight) * splits


def _recompute_choices(cfg, opts: tuple[StageOption, ...], layers: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
    unit = cfg.vpp
    if isinstance(cfg, Config):
        rs = range(unit, min(layers) + 1, unit) if cfg.recompute == "full" else (0,)
        return ((r,) * len(layers) for r in rs)
    return itertools.product(*(range(unit, n + 1, unit) if o.recompute == "full" else (0,)
                               for o, n in zip(opts, layers)))


def candidate_plans(inst: Instance, cfg: Config | FreeConfig, fix: dict | None = None,
                    mode: str = "megatron") -> Iterator[Plan]:
    """Every plan of the config's space, evaluated by the cost model (limits not applied)."""
    for opts in option_sequences(inst, cfg, stage_options(inst, cfg, fix)):
        for layers in compositions(inst.model.num_layers, cfg.pp, cfg.vpp):
            for rs in _recompute_choices(cfg, opts, layers):
                yield build_plan(inst, cfg, opts, layers, rs, None, mode)


def solve(inst: Instance, limits: Limits, fix: dict | None = None, mode: str = "megatron"):
    from milp_plan.solvers.driver import SolveResult, objective_of
    t0 = time.perf_counter()
    configs: list[Config | FreeConfig] = list(enumerate_configs(inst, fix, mode=mode))
    total = sum(count_candidates(inst, c, fix) for c in configs)
    if total > MAX_PLANS:
        raise InputError(f"brute force would enumerate up to {total:,} plans (limit {MAX_PLANS:,}); use a smaller "
                         "instance, --fix, or an exact solver (--solver cpsat)", field="solver")
    best, best_key = None, None
    for cfg in configs:
        for plan in candidate_plans(inst, cfg, fix, mode):
            if not limits.admit(plan):
                continue
            key = (objective_of(plan, limits), plan.predicted.step_time_s)
            if best_key is None or key < best_key:
                best, best_key = plan, key
    wall = time.perf_counter() - t0
    if best is None:
        return SolveResult("infeasible", None, None, None, wall, 0, "brute-force", None, len(configs), len(configs), 0)
    obj = best_key[0]
    record = SolverRecord("brute-force", "optimal", obj, obj, 0.0, None, None)
    return SolveResult("optimal", obj, obj, 0.0, wall, 0, "brute-force", best.with_(solver=record),
                       len(configs), len(configs), 0)
