"""An independent enumerator over the same decision space as the formulations.

It shares with them only the definition of the space (space.enumerate_configs,
space.stage_options and the canonical placement of build.place_stages) and scores every
candidate plan with predict.evaluate, the checker's arithmetic; it never reads the
model's coefficients. Candidates per config:

- in free mode, every child config: one stage size (GPUs per stage) per node type;
- every sequence of node types (at most as many stages per type as fit on its nodes at its
  stage size, mixed-type bundles sharing their member types' nodes: place_stages refuses
  what does not fit; a type may appear in several runs, each on nodes of its own, where they
  fit);
- every choice of stage option per stage among its type's options (free mode: tp x dp
  split and recompute per stage; Megatron mode: one option per type);
- every split of the L layers into pp positive parts (multiples of vpp when interleaved);
- the recomputed layers: Megatron mode one r in 1..min_s n_s for every stage, free mode
  each fully recomputing stage its own r_s in 1..n_s (multiples of vpp when interleaved:
  Megatron recomputes r / vpp per chunk).

It refuses instances with more than MAX_PLANS candidates (counted in closed form, an
upper bound where recompute counts are involved): it exists to prove the formulations
right on small instances, not to plan real clusters. The evaluated candidates of the last
instance (at most KEPT_PLANS) are kept for its next solves (`config_plans`): a Pareto sweep
by brute force evaluates each plan once (tests/test_trust.py's front: 57 s -> 4 s).
"""
from __future__ import annotations

import itertools
import math
import time
from typing import Iterator

from milp_plan.errors import InputError
from milp_plan.formulations.placement import build_plan, fits
from milp_plan.job import Limits
from milp_plan.formulations.space import (Config, StageOption, enumerate_configs, free_completions, host_types,
                                          matches_pins, placement, stage_options)
from milp_plan.instance import Instance
from milp_plan.plan import Plan, SolverRecord
from milp_plan.result import SolveResult, objective_of

MAX_PLANS = 200_000
MIXED = {"mixed": True}   # option k indexes node types, then mixed-type bundles (space.host_types)


def _by_type(options: list[StageOption]) -> dict[int, list[StageOption]]:
    """Options per node type (a solved config gives each type one stage size)."""
    out: dict[int, list[StageOption]] = {}
    for o in options:
        out.setdefault(o.k, []).append(o)
    assert all(len({o.group for o in opts}) == 1 for opts in out.values()), "one stage size per node type"
    return out


def _caps(inst: Instance, cfg, options: list[StageOption]) -> dict[int, int]:
    """Most stages each node type holds at its stage size."""
    hosts = host_types(inst, MIXED)
    return {k: min(cfg.pp, placement(hosts[k], opts[0].group).max_stages) for k, opts in _by_type(options).items()}


def _fewest_types(cfg: Config, caps: dict[int, int]) -> int:
    """A config uses every node type it gives a stage size (free mode: each type with
    options); a uniform one (Megatron mode) at least one."""
    assert not cfg.required_types or cfg.required_types == set(caps), "a required node type without options"
    return len(cfg.required_types) or 1


def _one_run_each(seq: tuple[int, ...]) -> bool:
    runs = [k for i, k in enumerate(seq) if i == 0 or seq[i - 1] != k]
    return len(runs) == len(set(runs))


def type_sequences(inst: Instance, cfg, options: list[StageOption]) -> Iterator[tuple[int, ...]]:
    """Stage node types: first every ordered choice of distinct types, one run each, sizes
    summing to pp; then the sequences that put a type in several runs, in lexicographic order.
    At most as many stages per type as fit on its nodes in one run (candidate_plans drops the
    layouts whose runs need more nodes: placement.fits); every required type present."""
    caps = _caps(inst, cfg, options)
    types = sorted(caps)
    for r in range(_fewest_types(cfg, caps), min(len(types), cfg.pp) + 1):
        for order in itertools.permutations(types, r):
            for sizes in compositions(cfg.pp, r, 1):
                if all(sz <= caps[k] for k, sz in zip(order, sizes)):
                    yield tuple(k for k, sz in zip(order, sizes) for _ in range(sz))
    if len(types) < 2:
        return
    for seq in _words(types, caps, cfg.required_types, cfg.pp):
        if not _one_run_each(seq):
            yield seq


def _words(types: list[int], caps: dict[int, int], required, pp: int,
           prefix: tuple[int, ...] = ()) -> Iterator[tuple[int, ...]]:
    """Every type sequence of length pp within the caps in which every required type appears,
    in lexicographic order."""
    if len(prefix) == pp:
        if set(required) <= set(prefix):
            yield prefix
        return
    for k in types:
        if prefix.count(k) >= caps[k]:
            continue
        yield from _words(types, caps, required, pp, prefix + (k,))


def option_sequences(inst: Instance, cfg, options: list[StageOption]) -> Iterator[tuple[StageOption, ...]]:
    by_type = _by_type(options)
    for seq in type_sequences(inst, cfg, options):
        yield from itertools.product(*(by_type[k] for k in seq))


def compositions(total: int, parts: int, unit: int) -> Iterator[tuple[int, ...]]:
    """Ordered splits of `total` into `parts` positive multiples of `unit`."""
    if total % unit:
        return
    q = total // unit
    for cuts in itertools.combinations(range(1, q), parts - 1):
        bounds = (0, *cuts, q)
        yield tuple(unit * (b - a) for a, b in zip(bounds, bounds[1:]))


def count_type_sequences(inst: Instance, cfg, options: list[StageOption], weight: dict[int, int]) -> int:
    """sum over type_sequences of prod_s weight[type of s], without enumerating them: the words
    of length pp with n_k <= caps[k] stages of type k (>= 1 when required), each counted
    pp! / prod n_k! times (its arrangements), type by type: ways[s + n] += ways[s] C(s + n, n) w^n."""
    caps = _caps(inst, cfg, options)
    ways = [1] + [0] * cfg.pp
    for k in sorted(caps):
        lo = 1 if k in cfg.required_types else 0
        new = [0] * (cfg.pp + 1)
        for placed, w in enumerate(ways):
            if w:
                for n in range(lo, min(caps[k], cfg.pp - placed) + 1):
                    new[placed + n] += w * math.comb(placed + n, n) * weight[k] ** n
        ways = new
    return ways[cfg.pp]


def count_option_sequences(inst: Instance, cfg, options: list[StageOption]) -> int:
    """len(list(option_sequences(...))), in closed form."""
    return count_type_sequences(inst, cfg, options, {k: len(v) for k, v in _by_type(options).items()})


def count_candidates(inst: Instance, cfg, fix: dict | None = None) -> int:
    """Candidates of a config: exact without full recompute, else an upper bound (each full
    stage counted with its most recompute choices, L / vpp - pp + 1)."""
    L, unit = inst.model.num_layers, cfg.vpp
    if L % unit or L // unit < cfg.pp:
        return 0
    options = stage_options(inst, cfg, fix)
    splits = math.comb(L // unit - 1, cfg.pp - 1)
    if cfg.shared_recompute:  # one r for every stage
        seqs = count_type_sequences(inst, cfg, options, {k: 1 for k in _by_type(options)})
        return seqs * splits * (L // cfg.pp)
    most_r = L // unit - cfg.pp + 1
    weight = {k: sum(most_r if o.recompute == "full" else 1 for o in opts) for k, opts in _by_type(options).items()}
    return count_type_sequences(inst, cfg, options, weight) * splits


def solved_configs(inst: Instance, fix: dict | None = None, mode: str = "megatron") -> list[Config]:
    """The configs whose spaces the brute force enumerates: every completion (one stage size
    per node type) of every config of the mode (a Megatron config is complete)."""
    return [child for cfg in enumerate_configs(inst, fix, mode=mode) for child in free_completions(inst, cfg, fix)]


def _recompute_choices(cfg: Config, opts: tuple[StageOption, ...], layers: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
    unit = cfg.vpp
    if cfg.shared_recompute:
        return ((r,) * len(layers) for r in range(unit, min(layers) + 1, unit))
    return itertools.product(*(range(unit, n + 1, unit) if o.recompute == "full" else (0,)
                               for o, n in zip(opts, layers)))


def candidate_plans(inst: Instance, cfg: Config, fix: dict | None = None) -> Iterator[Plan]:
    """Every plan of the config's space, evaluated by the cost model (limits not applied)."""
    for opts in option_sequences(inst, cfg, stage_options(inst, cfg, fix)):
        if not fits(inst, opts):   # mixed-type bundles and their types' own stages want more nodes than there are
            continue
        for layers in compositions(inst.model.num_layers, cfg.pp, cfg.vpp):
            for rs in _recompute_choices(cfg, opts, layers):
                plan = build_plan(inst, cfg, opts, layers, rs, None)
                if matches_pins(inst, fix, plan):
                    yield plan


KEPT_PLANS = 20_000   # candidates kept (config_plans) for one instance's next solves, at most


class _Kept:
    """The evaluated candidates of one instance (held, so that its identity is not reused) by
    (config, pins), KEPT_PLANS in all at most."""
    inst: Instance | None = None
    plans: dict = {}
    count = 0


def config_plans(inst: Instance, cfg: Config, fix: dict | None = None) -> list[Plan]:
    """candidate_plans as a list, kept for the next call on the same instance, config and pins
    while the instance's kept candidates number at most KEPT_PLANS: the solves of one instance
    under other limits (a Pareto sweep's, a reference and its cross-checks) evaluate each plan
    once, the limits being applied after. The list is shared: read it, never change it."""
    if _Kept.inst is not inst:
        _Kept.inst, _Kept.plans, _Kept.count = inst, {}, 0
    key = (cfg, repr(fix))
    got = _Kept.plans.get(key)
    if got is None:
        got = list(candidate_plans(inst, cfg, fix))
        if _Kept.count + len(got) <= KEPT_PLANS:
            _Kept.plans[key] = got
            _Kept.count += len(got)
    return got


def solve(inst: Instance, limits: Limits, fix: dict | None = None, mode: str = "megatron"):
    t0 = time.perf_counter()
    configs = solved_configs(inst, fix, mode)
    total = 0
    for c in configs:  # counting stops at the limit: past it, how far past does not matter
        total += count_candidates(inst, c, fix)
        if total > MAX_PLANS:
            raise InputError(f"brute force would enumerate at least {total:,} plans (limit {MAX_PLANS:,}); use a "
                             "smaller instance, --fix, or an exact solver (--solver cpsat)", field="solver")
    best, best_key = None, None
    for cfg in configs:
        for plan in config_plans(inst, cfg, fix) if total <= KEPT_PLANS else candidate_plans(inst, cfg, fix):
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
