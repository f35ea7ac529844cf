"""An independent enumerator over the same decision space as the formulations.

It shares with them only the definition of the space (space.enumerate_configs and the
canonical placement of build.place_stages) and scores every candidate plan with
costmodel.evaluate, the checker's arithmetic; it never reads the model's coefficients.
Candidates per Config: every sequence of node-type blocks (each type one contiguous
block, at most as many stages as fit on its nodes), every split of the L layers into pp
positive parts (multiples of vpp when interleaved), and every r in 1..min_s n_s for
full recompute (multiples of vpp when interleaved: Megatron recomputes r / vpp per chunk).

It refuses instances with more than MAX_PLANS candidates: it exists to prove the
formulations right on small instances, not to plan real clusters.
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
from milp_plan.formulations.space import Config, enumerate_configs
from milp_plan.instance import Instance
from milp_plan.plan import SolverRecord

MAX_PLANS = 200_000


def type_sequences(inst: Instance, cfg: Config) -> Iterator[tuple[int, ...]]:
    """Stage node types: an ordered choice of distinct types, one block each, sizes summing to pp."""
    caps = {}
    for k, nt in enumerate(inst.cluster.node_types):
        pl = placement(nt, cfg.group)
        if pl is not None and pl.max_stages > 0:
            caps[k] = pl.max_stages
    types = sorted(caps)
    for r in range(1, min(len(types), cfg.pp) + 1):
        for order in itertools.permutations(types, r):
            for sizes in compositions(cfg.pp, r, 1):
                if all(sz <= caps[k] for k, sz in zip(order, sizes)):
                    yield tuple(k for k, sz in zip(order, sizes) for _ in range(sz))


def compositions(total: int, parts: int, unit: int) -> Iterator[tuple[int, ...]]:
    """Ordered splits of `total` into `parts` positive multiples of `unit`."""
    if total % unit:
        return
    q = total // unit
    for cuts in itertools.combinations(range(1, q), parts - 1):
        bounds = (0, *cuts, q)
        yield tuple(unit * (b - a) for a, b in zip(bounds, bounds[1:]))


def count_type_sequences(inst: Instance, cfg: Config) -> int:
    """len(list(type_sequences(...))) without enumerating: choose r types with block sizes
    1..cap summing to pp (a knapsack count), then order them (r!)."""
    caps = []
    for nt in inst.cluster.node_types:
        pl = placement(nt, cfg.group)
        if pl is not None and pl.max_stages > 0:
            caps.append(pl.max_stages)
    # ways[r][s]: unordered choices of r of the types seen so far with sizes summing to s
    ways = [[0] * (cfg.pp + 1) for _ in range(len(caps) + 1)]
    ways[0][0] = 1
    for cap in caps:
        for r in range(len(caps), 0, -1):
            for s in range(cfg.pp, 0, -1):
                ways[r][s] += sum(ways[r - 1][s - size] for size in range(1, min(cap, s) + 1))
    return sum(math.factorial(r) * ways[r][cfg.pp] for r in range(1, len(caps) + 1))


def count_candidates(inst: Instance, cfg: Config) -> int:
    L = inst.model.num_layers
    seqs = count_type_sequences(inst, cfg)
    if L % cfg.vpp:
        return 0
    splits = math.comb(L // cfg.vpp - 1, cfg.pp - 1) if L // cfg.vpp >= cfg.pp else 0
    return seqs * splits * (L // cfg.pp if cfg.recompute == "full" else 1)


def solve(inst: Instance, limits: Limits, fix: dict | None = None, mode: str = "megatron"):
    from milp_plan.solvers.driver import SolveResult, objective_of
    if mode != "megatron":
        raise InputError("brute force covers --mode megatron only", field="mode")
    t0 = time.perf_counter()
    configs = list(enumerate_configs(inst, fix))
    total = sum(count_candidates(inst, c) for c in configs)
    if total > MAX_PLANS:
        raise InputError(f"brute force would enumerate {total:,} plans (limit {MAX_PLANS:,}); use a smaller instance, "
                         "--fix, or an exact solver (--solver cpsat)", field="solver")
    best, best_key = None, None
    L = inst.model.num_layers
    for cfg in configs:
        for types in type_sequences(inst, cfg):
            for layers in compositions(L, cfg.pp, cfg.vpp):
                rs = range(cfg.vpp, min(layers) + 1, cfg.vpp) if cfg.recompute == "full" else (0,)
                for r in rs:
                    plan = build_plan(inst, cfg, types, layers, r, None, mode)
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
