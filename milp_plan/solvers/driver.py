"""The exact planner: enumerate the global choices, bound them, solve the per-stage model.

Decomposition (exact): every plan belongs to exactly one config (space.py). For each
config a valid lower bound on the objective is computed from the cost model alone;
configs are solved in increasing bound order and the search stops when the next bound
is no better than the incumbent. A config is popped at a cheap bound and then given its full
bound (bounds.full_bound); where that passes the next entry of the heap, it goes back in at it
(so the bounds configs are solved from never fall: tests/test_solve.py). The overall best bound is the minimum of the
incumbent and the bounds of every config not solved to optimality, so the reported gap
is honest even when the time limit cuts the search short.

Free mode: the configs (samples per micro-batch, pp, schedule, no uniform rule) whose
node types' stage sizes are open. The Megatron-mode optimum comes first (megatron_mode_start,
on the same coefficient cache: `prepare`), then their bounding (with --workers, in worker
processes beside it: parallel.BoundWorkers). Configs are kept in one heap by bound: a config with an open
size goes in at its GPU-budget bound (parent_bounds.gpu_budget_bound: the stages share the
cluster's GPUs; one the bounding did not reach is lifted by it when popped, back into the heap
where that is higher), then full-bounded and
opened into its complete configs where they are at most FREE_COMPLETIONS, else branched on one
node type (space.free_children); the children keep the larger of their bound and the parent's.
A complete one is solved. Open configs left
when the time runs out keep their bounds, valid for everything below them.

Warm start. Megatron mode: before the exact search, heuristics/warmstart.py builds a
plan for each of the HEURISTIC_CONFIGS configs of least bound, or more until one has a
plan (greedy device grouping, bottleneck-optimal layer partition). The best is the first
incumbent, and each such config's model gets its plan as a hint. A short
--max-solve-time still returns that plan, with its gap. Free mode: the Megatron-mode
solve (FREE_BASE_SHARE of the time limit) gives the first incumbent, a free plan too; and a
complete free config of MANY_POOLS node types or more gets heuristics/free_start.py's plan
(a local search over the pool of each stage position) before its model: checked, within the
limits, it is the model's cutoff and hint where it beats the incumbent (many_pools).

Deadline (milp_plan/deadline.py): one Deadline bounds the whole search, enumeration,
bounding, warm start and each backend run, and ends it at once on SIGINT/SIGTERM. Its budget
is wall-clock seconds, work units (--work-limit: each bound, model, plan and CP-SAT run is
charged, so a search cut short ends at the same point on any machine), or both. The cheap
bounding stops at BOUNDING_SHARE of the budget; configs it did not reach go on the heap with
bound 0 and are bounded when popped, so the search stays exact.

Several solves on one Prepared (a Pareto sweep, pareto.py) share what they proved: the plans
found (a first incumbent where the limits admit one) and each solved config's lower bound,
reused under limits within those it was proven under (`within`); a min-time bound above a
later solve's time limit proves the config empty there (`Prepared.too_slow`).

Lower bound of a config: formulations/pipeline.md, "Lower bound of a config"
(solvers/bounds.py).
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import heapq
import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

from milp_plan import check, predict
from milp_plan.deadline import WORK, Deadline
from milp_plan.errors import InputError, InternalError
from milp_plan.formulations.placement import build_plan
from milp_plan.formulations.coefficients import Coefficients, SharedCoefficients
from milp_plan.formulations.pipeline import PipelineModel
from milp_plan.job import OVERLAP_FIELDS, Limits
from milp_plan.formulations.space import (Config, StageOption, coverage_gap, enumerate_configs,
                                          explain_fix, free_children, free_completions, matches_pins)
from milp_plan.instance import Instance
from milp_plan.plan import Plan, SolverRecord
from milp_plan.result import PROOF_TOL, Progress, SolveResult, objective_of, relative_gap
from milp_plan.heuristics import free_start, warmstart as heuristic
from milp_plan.solvers.backends import BACKENDS, DETERMINISTIC_BACKENDS, make_backend
from milp_plan.solvers.bounds import (WeakFamilyBounds, config_lower_bound, family_lower_bound, full_bound,
                                      least_stage_time)
from milp_plan.solvers.parallel import Ahead, BoundWorkers, Trace, paths_of
from milp_plan.solvers.parent_bounds import gpu_budget_bound

REL_EPS = 1e-9
MAX_CUTS = 32     # plans a config's model may return over a limit (by rounding) before it is left open
MAX_PATHS = 200   # critical paths a config's model may add (simulated step) before it is left open
HEURISTIC_CONFIGS = 16      # Configs of least bound given a heuristic plan before the exact search,
HEURISTIC_MAX_CONFIGS = 256  # ... or more, up to this many, until one has a plan,
HEURISTIC_SHARE = 0.1        # ... within this share of the time limit
BOUNDING_SHARE = 0.5         # the cheap bounding of every config stops at this share of the time limit
NO_FULL_COLLECTIONS = 10 ** 9  # _young_collections_only: gc's third threshold while a search runs
FREE_BASE_SHARE = 0.8        # free mode: the Megatron-mode solve that starts it gets at most this share
CLOSE_GAP = PROOF_TOL / 5    # a config's solve stops at a plan this close to its proven bound (_solve_model)
FREE_COMPLETIONS = 64        # free mode: a parent with at most this many complete configs below it opens into them
FLOOR_AFTER = 0.02           # _solve_model: work units of CP-SAT's first run, before the bottleneck floor
MANY_POOLS = 3               # free_start runs on free configs of this many pools or more (many_pools)
PROGRESS_EVERY_S = 0.1       # the search reports its progress at most this often (wall clock)


def _require_valid(inst: Instance, plan: Plan, who: str, cfg: Config, pins: dict | None = None) -> None:
    """The checker is the source of truth: a plan it rejects for anything but memory (which a
    rounded model relaxes and `Limits.admit` decides) is a model/checker mismatch, a bug."""
    violations = [v for v in check.check_plan(inst, plan) if v.rule != "memory_capacity"]
    if violations:
        raise InternalError(f"{who} returned a plan the checker rejects for {cfg.label()}: "
                            + "; ".join(map(str, violations)))
    if not matches_pins(inst, pins, plan):
        raise InternalError(f"{who} returned a plan that breaks the --fix layers=/order= pins for {cfg.label()}")


@dataclass
class Prepared:
    """The configs of an instance with their coefficients, reusable across solves
    (a Pareto sweep solves the same instance under many limits). In free mode `base` holds
    the Megatron-mode configs whose optimum starts the free search. Coefficients are made on
    first use (`coef`): a large space has many configs the search never opens."""

    configs: list[Config]
    inst: Instance
    mode: str = "megatron"
    base: "Prepared | None" = None
    fix: dict | None = None
    shared: SharedCoefficients | None = None
    made: dict = field(default_factory=dict)
    # what solves on these configs proved, for later solves (a Pareto sweep's): every plan they
    # found, and each solved config's lower bound under the limits it was solved with
    found: list[Plan] = field(default_factory=list)
    proven: dict = field(default_factory=dict)   # Config -> [(Limits, lower bound)]
    _families: list | None = field(default=None, repr=False)
    _twins: dict = field(default_factory=dict)   # Config -> its dominating twin or None (twin)
    _index: dict = field(default_factory=dict)   # Config -> its index in configs (filled on first use)
    kids: dict = field(default_factory=dict)     # Config -> the Coefficients of a child a worker opened (`kid`)
    # later solves read what each proves (a Pareto sweep): the search records every popped config's
    # exact full bound, not one cut short at the incumbent (bounds.full_bound's `enough`)
    sweep: bool = False

    def __post_init__(self) -> None:
        if self.shared is None:
            self.shared = SharedCoefficients(self.inst)

    def coef(self, i: int) -> Coefficients:
        got = self.made.get(i)
        if got is None:
            got = self.made[i] = Coefficients(self.inst, self.configs[i], self.shared, self.fix)
        return got

    @property
    def coefs(self) -> list[Coefficients]:
        return [self.coef(i) for i in range(len(self.configs))]

    def carried(self, cfg: Config, limits: Limits) -> float:
        """The best lower bound a solve proved for `cfg` (an earlier one, or this one so far)
        under limits no tighter than these, of the same objective (its plans include this
        problem's: within), or for its dominating twin (`twin`: its optimum is at most cfg's)."""
        return max((lb for c in self._and_twin(cfg) for old, lb in self.proven.get(c, ()) if within(limits, old)),
                   default=0.0)

    def too_slow(self, cfg: Config, limits: Limits) -> bool:
        """An earlier min-time solve, under limits that admit every plan these admit, proved
        that no plan of `cfg` (or of its dominating twin, `twin`: no slower) is faster than a
        bound above this solve's time limit: `cfg` has no plan here (the sweep's min-cost solve
        after a min-time one). Strictly above: a plan exactly at the bound may exist."""
        t = limits.time_limit_s
        return t is not None and any(old.objective == "min-time" and admits_fewer(limits, old) and lb > t
                                     for c in self._and_twin(cfg) for old, lb in self.proven.get(c, ()))

    def _and_twin(self, cfg: Config) -> tuple[Config, ...]:
        twin = self.twin(cfg)
        return (cfg,) if twin is None else (cfg, twin)

    def twin(self, cfg: Config) -> Config | None:
        """Megatron mode, a config that recomputes: the config that differs from it in
        recompute "none" alone, where it dominates it (None elsewhere). Every plan of `cfg`
        with its recompute dropped is then a plan of the twin: the same GPUs (so the same
        $/h), transfers, reduction and optimizer step, never a longer forward or backward
        (the argument of Coefficients._undominated, free mode's rule for one option; no
        overlap, which lets a reduction hide in a backward), and it fits in memory: each of
        the twin's options holds the most layers a stage of cfg holds, L - (pp - 1) vpp, at
        every position (memory falls with the position among the middle stages, so the
        first, the second and the last are the tightest). So the twin's optimum under any
        limits is at most cfg's, and a bound proved for the twin holds for cfg."""
        if cfg in self._twins:
            return self._twins[cfg]
        got = self._twins[cfg] = self._dominating_twin(cfg)
        return got

    def _dominating_twin(self, cfg: Config) -> Config | None:
        job = self.inst.job
        if cfg.uniform is None or cfg.uniform.recompute == "none" or any(getattr(job, f) for f in OVERLAP_FIELDS):
            return None
        if not self._index:
            self._index.update({c: i for i, c in enumerate(self.configs)})
        twin = dataclasses.replace(cfg, uniform=dataclasses.replace(cfg.uniform, recompute="none"))
        if twin not in self._index or cfg not in self._index:
            return None
        mine, theirs = self.coef(self._index[cfg]), self.coef(self._index[twin])
        most = self.inst.model.num_layers - (cfg.pp - 1) * cfg.vpp
        worst = sorted({0, min(1, cfg.pp - 1), cfg.pp - 1})
        index = {(o.k, o.tp, o.dp, o.mbs): j for j, o in enumerate(theirs.options)}
        for o in mine.options:
            j = index.get((o.k, o.tp, o.dp, o.mbs))
            if j is None or min(theirs.layer_room(j, s) for s in worst) < most:
                return None
        return twin

    def families(self) -> list[list[int]]:
        """Config indices grouped by everything but the schedule and vpp (Megatron mode; in free
        mode each config alone), in enumeration order: the members share a cheap bound's terms.
        Made once (a Pareto sweep bounds them in every solve)."""
        if self._families is None:
            groups: dict = {}
            for i, c in enumerate(self.configs):
                key = (c.uniform, c.pp, c.sequence_parallel, c.distributed_optimizer) if c.uniform else i
                groups.setdefault(key, []).append(i)
            self._families = list(groups.values())
        return self._families
    truncated: bool = False  # the deadline cut the enumeration short: the configs are not all here

    def children(self, coef: Coefficients) -> list[Coefficients]:
        """Free mode: a config with open stage sizes, branched at once into its complete configs
        where they are at most FREE_COMPLETIONS (each then bounded on its own, no open config
        between), else on its first open node type."""
        # a parent's options are its stage_options (no dominated one dropped: Coefficients)
        kids = list(itertools.islice(free_completions(coef.inst, coef.cfg, self.fix, coef.options),
                                     FREE_COMPLETIONS + 1))
        if len(kids) > FREE_COMPLETIONS:
            kids = list(free_children(coef.inst, coef.cfg, self.fix, coef.options))
        return [Coefficients(coef.inst, child, self.shared, self.fix) for child in kids]

    def open(self, coef: Coefficients, limits: Limits, enough: float) -> list[tuple[Coefficients, float | None]]:
        """Free mode: the children of the parent `coef` (`children`), each with the bound it goes
        into the heap at (before the parent's): a complete one its cheap bound, one with open
        sizes its GPU-budget bound (exact below `enough`: its sizes settled so far change its
        capacity, so siblings no longer tie at the parent's bound); None: no plan of it meets
        the limits. --workers' processes open the parents they full-bound
        (parallel.BoundWorkers.ahead, parallel._guess) by this same function: under a later
        (smaller) incumbent a GPU-budget bound differs only at or above it, never popped, and is
        None under both or neither (gpu_budget_bound cuts it only where no limit makes it None)."""
        return [(kid, config_lower_bound(kid, limits, memory=False) if kid.cfg.complete
                 else gpu_budget_bound(kid, limits, enough)) for kid in self.children(coef)]

    def kid(self, cfg: Config) -> Coefficients:
        """The coefficients of a child a worker opened (parallel.Opened: it goes into the heap
        without them, and most are never popped), made on first use."""
        got = self.kids.get(cfg)
        if got is None:
            got = self.kids[cfg] = Coefficients(self.inst, cfg, self.shared, self.fix)
        return got


def admits_fewer(new: Limits, old: Limits) -> bool:
    """Every plan `new` admits, `old` admits too (each limit of `new` at least as tight)."""
    def tighter(a: float | None, b: float | None) -> bool:
        return b is None or (a is not None and a <= b)
    return (tighter(new.time_limit_s, old.time_limit_s) and tighter(new.budget_usd_per_hour, old.budget_usd_per_hour)
            and tighter(new.budget_usd_per_step, old.budget_usd_per_step))


def within(new: Limits, old: Limits) -> bool:
    """Every plan `new` admits, `old` admits too, and both minimise the same: a config's optimum
    under `new` is at least its optimum under `old`."""
    return new.objective == old.objective and admits_fewer(new, old)


def prepare(inst: Instance, fix: dict | None = None, mode: str = "megatron", dl: Deadline | None = None,
            sweep: bool = False) -> Prepared:
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
            base = prepare(inst, fix, "megatron", dl, sweep)
        except InputError:  # no uniform plan passes the rules: the free search starts cold
            base = None
    # one cache for both spaces (its keys name all a value reads: tests/test_bound_memo.py): the free
    # search reads the option terms and the critical paths the Megatron-mode start made (the
    # default's free proof 5.23 -> 5.16 work units, the shipped default's 10.02 -> 9.83, bounds the same)
    return Prepared(configs, inst, mode, base, fix, shared=None if base is None else base.shared, truncated=cut,
                    sweep=sweep)


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
                  hint: heuristic.Candidate | None, dl: Deadline, seed: int,
                  lb: float, trace: Trace | None = None) -> tuple[Plan | None, float | None]:
    """Solve one complete config's per-stage model (objective <= cutoff when given). The model
    is a relaxation of the cost model (pipeline.md, "Rounding"): each plan it returns is
    evaluated exactly; on a simulated instance a plan whose critical path the model misses
    adds that path and the model is solved again (at most MAX_PATHS times, pipeline.md,
    "add_paths"); a plan over a limit or memory is cut off and solved again (at most MAX_CUTS
    times); and its objective must agree with the model's within the rounding.
    A free config of MANY_POOLS pools or more first gets free_start's heuristic plan: where it
    beats the cutoff, the checker passes it and it becomes the cutoff and the hint, and the
    config's plan unless the model finds a better one.
    Returns the admitted plan or None, and the bound the config leaves (None when proven
    empty: "infeasible" under the cutoff means no plan of this config beats the incumbent;
    never None with a plan: a search that records it, Prepared.proven, reads it as the
    config's bound).
    Every backend run gets what the deadline `dl` has left, in seconds and in work. `trace`
    (parallel.Trace) records each run's status and each path learned (a worker's solve ahead)."""
    start = free_start.best_plan(coef, limits, dl) if many_pools(coef) else None
    if start is not None and (cutoff is None or objective_of(start[0], limits) < cutoff * (1 - REL_EPS)):
        _require_valid(coef.inst, start[0], "the free-mode heuristic", coef.cfg, coef.pins)
        if not limits.admit(start[0]):   # its plan becomes the cutoff: it must meet memory and the limits
            raise InternalError(f"the free-mode heuristic returned a plan over memory or a limit for {coef.cfg.label()}")
        cutoff, hint = objective_of(start[0], limits), start[1]
    else:
        start = None
    plan, bound = _solve_model(coef, limits, backend, cutoff, hint, dl, seed, lb, trace)
    if start is not None and plan is None:
        # the model admits the heuristic's plan (a relaxation), so it returns none only when
        # cut short (out of time, rounds or cuts): the heuristic's plan is the config's, with
        # the bound the model left (never None with a plan: Prepared.proven reads it)
        return start[0], cutoff if bound is None else bound
    return plan, bound


def many_pools(coef: Coefficients) -> bool:
    """A free config whose stages run on MANY_POOLS pools (node types) or more: free_start
    runs on its solve, on no other. Measured with tests/benchmarks/bench_solve.py (work units
    to the proof, free mode): on the two-type instances (default, two-type-32, scale-1024: two
    pools at most) its plan never beat the incumbent in any of the 60 configs solved, and it
    cost 0.45 units on the default (6.02 -> 6.47), 0.4 on two-type-32 and 1.0 on scale-1024
    (0.15-0.37 a config at pp 8-16); on mixed-128 (four node types) its plan is the free
    optimum (3.5942 s, pp 8, stage sizes 8, 32, 16, 32; the Megatron-mode start is 3.8767 s),
    found in 0.33 units (the search without it had not found it in 30), and three-pool
    configs' plans never beat the incumbent."""
    return coef.cfg.uniform is None and len(coef.pools) >= MANY_POOLS


def _solve_model(coef: Coefficients, limits: Limits, backend: str, cutoff: float | None,
                 hint: heuristic.Candidate | None, dl: Deadline, seed: int,
                 lb: float, trace: Trace | None = None) -> tuple[Plan | None, float | None]:
    """_solve_config's model rounds (no heuristic): the admitted plan or None, and the bound."""
    be = make_backend(backend)
    model = PipelineModel(coef, limits, be, cutoff=cutoff)
    model.build()
    # CP-SAT on the closed form: the bottleneck floor once a run of FLOOR_AFTER units has not
    # settled the config (pipeline.md, "The bottleneck floor": it speeds the hard proofs, but
    # slowed an easy one 1,000-fold)
    floor = least_stage_time(coef, limits) if backend == "cpsat" and model.period_weight else 0.0
    if floor and FLOOR_AFTER <= 0:   # no probe: the floor from the first run
        model.add_bottleneck_floor(floor)
        floor = 0.0
    dl.charge(WORK.model)
    if hint is not None:
        model.hint(*hint)
    bound, cuts, paths = lb, 0, 0
    # a solution within CLOSE_GAP of the config's proven bound closes it (pipeline.md, "Closing a
    # config at its bound"): at most PROOF_TOL / 2 off once exactly priced, else solved on
    stop = model.units_of(lb * (1 + CLOSE_GAP)) if lb > 0 else None
    # CP-SAT where the step alone is priced (no $/step term, whose W rows' big-M the cuts pay
    # against): no cutting planes (pipeline.md, "CP-SAT's search"). On these small models the cut
    # loop (MIR, clique, zero-half: 869 cuts from 5,281 calls on one 205-variable path-round model
    # of the shipped default's job) took 1.5-1.9 s a solve that proves in 0.4-0.7 s without it,
    # time CP-SAT's deterministic measure barely counts: free mode to the proof, CPU, the shipped
    # default's job 23.3 -> 12.9 s, the default 5.9 -> 4.5 s, mixed-128 21.8 -> 17.6 s; the
    # Pareto benchmark 32.4 work units with cuts off on every solve, 26.1 on every one, 24.0 so.
    # And on the simulated basis a run stops at its first solution whose plan misses its critical
    # path, rather than proving a model that lacks that path optimal (under a $/step term each
    # round's floor spares that proof instead: pipeline.md, "add_paths").
    step_only = backend == "cpsat" and not model.prices_step()
    if step_only:
        be.parameters["cut_level"] = 0
    built: dict = {}     # plans by (options, layers, recomputed layers): the callback's, read again below
    checked = [0]

    def plan_of(opts, layers, rs) -> Plan:
        key = (tuple(opts), tuple(layers), tuple(rs))
        if key not in built:
            built[key] = build_plan(coef.inst, coef.cfg, [coef.options[o] for o in opts], layers, rs, None)
        return built[key]

    def missed(value) -> bool:
        checked[0] += 1
        opts, layers, rs = model.extract(value)
        try:
            plan = plan_of(opts, layers, rs)
        except ValueError:   # not a plan to judge here: the loop below builds it again and raises
            return False
        return model.step_short(value(model.v.step), plan, opts, layers, rs)
    lazy = {"stop_if": missed} if step_only and model.simulated else {}
    while True:
        probe = floor > 0   # a first run without the floor
        left = dl.work_left()
        run = be.solve(dl.left(), seed, 1, work=min(FLOOR_AFTER, math.inf if left is None else left) if probe else left,
                       stop_at=stop, **lazy)
        dl.charge(WORK.plan * checked[0])
        checked[0] = 0
        dl.charge(run.work)
        if trace is not None:
            trace.statuses.append(run.status)
        if probe and run.status in ("feasible", "timeout") and not dl.expired():
            # not settled: again with the floor, from the probe's best solution (a worker's answer
            # still counts: FLOOR_AFTER, not its deadline, stopped the probe)
            if trace is not None:
                trace.statuses[-1] = "probed"
            if run.status == "feasible":
                be.clear_hints()
                model.hint(*model.extract(run.value))
                bound = max(bound, model.objective_in_units(run.bound))
            model.add_bottleneck_floor(floor)
            floor = 0.0
            continue
        floor = 0.0
        if run.status == "infeasible":
            return None, None
        if run.status == "timeout":
            return None, bound
        if run.bound is not None:
            bound = max(bound, model.objective_in_units(run.bound))
        opts, layers, rs = model.extract(run.value)
        plan = plan_of(opts, layers, rs)
        dl.charge(WORK.plan)
        _require_valid(coef.inst, plan, backend, coef.cfg, coef.pins)
        if model.simulated and model.step_short(run.value(model.v.step), plan, opts, layers, rs):
            # the model's paths miss this plan's critical path: add it (for every config like this one)
            path = predict.critical_path(coef.inst, plan)
            if not model.add_path(path):
                raise InternalError(f"{backend} on {coef.cfg.label()}: the model's step lies below the simulated "
                                    f"{plan.predicted.step_time_s:.9g} s though it holds the plan's critical path")
            predict.learn_path(coef.paths(), path)
            if trace is not None:
                trace.paths.append(path)
            paths += 1
            if paths > MAX_PATHS or dl.expired():
                # out of rounds: the plan is still a plan (its objective is the cost model's),
                # and the config stays open at its proven bound
                return (plan if limits.admit(plan) else None), bound
            if backend == "cpsat" and run.bound is not None and limits.budget_usd_per_step is not None:
                model.add_objective_floor(run.bound)  # what this run proved holds for the next
            continue
        value = objective_of(plan, limits)
        far = run.status == "closed" and value > lb * (1 + PROOF_TOL / 2)   # the rounding took it further
        err = model.rounding_error(opts, layers, rs, plan.predicted.usd_per_hour, plan.predicted.step_time_s)
        drift = (model.objective_drift(run.objective, value, err, run.status == "optimal")
                 or model.usd_per_hour_drift(run.value(model.v.usd_h), plan.predicted.usd_per_hour, opts))
        if drift is not None:
            raise InternalError(f"{backend} on {coef.cfg.label()}: {drift}")
        if limits.admit(plan) and not far:
            return plan, bound
        if far:   # closed too far from lb: the model again, to its optimum
            stop = None
            if limits.admit(plan):
                continue
        drift = model.limit_drift(plan, opts, layers, rs)
        if drift is not None:
            raise InternalError(f"{backend} on {coef.cfg.label()}: {drift}")
        model.add_no_good(opts, layers, rs)
        cuts += 1
        if cuts > MAX_CUTS or dl.expired():
            break
    return None, bound


class _Heap:
    """The best-first heap of the search. Entries (bound, config, kind, payload): kind 0 a
    config and its Coefficients; kind 1 a family (configs that differ in schedule and vpp alone,
    their indices) at a bound of all its members (family_lower_bound), opened into configs when
    popped; kind 2 the same at the weak family bound (or at 0, cut from the cheap bounding by the
    time limit), tightened when popped; kind 3 the same at its work bound (`weak`.work_bound),
    weakly bounded when popped. A sorted list is a heap."""

    def __init__(self, prepared: Prepared, limits: Limits, entries: list, dl: Deadline, weak: WeakFamilyBounds):
        self.prepared, self.limits, self.entries, self.dl, self.weak = prepared, limits, entries, dl, weak
        self.ruled_out = 0   # configs its families' bounds showed to hold no plan (memory, the limits)

    def copy(self) -> "_Heap":
        return _Heap(self.prepared, self.limits, list(self.entries), self.dl, self.weak)

    def push(self, entry: tuple) -> None:
        heapq.heappush(self.entries, entry)

    def least(self) -> float:
        return self.entries[0][0]

    def record(self, proven: dict) -> None:
        """What the heap's bounds prove, into `proven` (Prepared.proven): each complete config's
        bound, and a family's for each member, under this heap's limits (a later solve of a
        sweep reads them: Prepared.carried, Prepared.too_slow)."""
        configs = self.prepared.configs
        for lb, cfg, kind, payload in self.entries:
            for c in ([cfg] if kind == 0 else [configs[i] for i in payload]):
                if c.complete:
                    proven.setdefault(c, []).append((self.limits, lb))

    def count(self) -> int:
        """Configs in the heap (a family counts its members)."""
        return sum(len(e[3]) if e[2] >= 1 else 1 for e in self.entries)

    def _opened(self):
        """Pop the least entry, opening families into their members (each at the larger of its
        own cheap bound and the family's), until it is a config."""
        prep, heap = self.prepared, self.entries
        while heap[0][2] >= 1:
            if self.dl.expired():
                return None  # the families stay in the heap at their bounds
            flb, cfg, kind, members = heapq.heappop(heap)
            self.dl.charge(WORK.weak_bound if kind == 3 else WORK.bound * (1 if kind == 2 else len(members)))
            if kind >= 2:  # 3: at its work bound, weakly bound it; 2: weakly bounded, tighten (the bottleneck bound)
                variants = [prep.configs[i] for i in members]
                lb = (self.weak.family(cfg, variants, make=lambda _, i=members[0]: prep.coef(i)) if kind == 3
                      else family_lower_bound(prep.coef(members[0]), self.limits, variants))
                if lb is not None:
                    heapq.heappush(heap, (max(lb, flb), cfg, kind - 1, members))   # back in, one kind tighter
                else:
                    self.ruled_out += len(members)
                if not heap:
                    return None
                continue
            lbs = config_lower_bound(prep.coef(members[0]), self.limits, memory=False,
                                     variants=[prep.configs[i] for i in members])
            for lb, i in zip(lbs, members):
                if lb is not None:
                    heapq.heappush(heap, (max(lb, flb), prep.configs[i], 0, prep.coef(i)))
                else:
                    self.ruled_out += 1
            if not heap:
                return None
        lb, cfg, _, coef = heapq.heappop(heap)
        return lb, cfg, coef if coef is not None else prep.kid(cfg)

    def pop_config(self) -> tuple[float, Config, Coefficients] | None:
        """The config of least bound, or None when the heap holds only families without a plan
        or the deadline stops the opening of families (what is left keeps its bounds)."""
        while self.entries and not self.dl.expired():
            got = self._opened()
            if got is not None:
                return got
        return None


def _cheap_bound(coef: Coefficients, limits: Limits, enough: float = math.inf) -> float | None:
    """A config alone's root bound: a free parent's GPU-budget bound (parent_bounds), the bound
    it is lifted by when popped (solve), so that it is not bounded twice (10% of scale-1024's
    CPU), exact below `enough`; a complete config's cheap bound."""
    if not coef.cfg.complete:
        return gpu_budget_bound(coef, limits, enough)
    return config_lower_bound(coef, limits, memory=False)


def _cheap_bounds(prepared: Prepared, limits: Limits, dl: Deadline, weak: WeakFamilyBounds,
                  computed: dict[int, float | None] | None = None, enough: float = math.inf) -> tuple[list, list, int]:
    """(bounded, later, ruled out): every config at its cheap bound (`_cheap_bound`, exact below `enough`,
    the incumbent; `computed`: those workers found, by config index, exact:
    parallel.BoundWorkers.root) and every family at its work bound (`weak`, whose shared terms
    are computed once per group), sorted; the families the bounding did not reach
    (BOUNDING_SHARE of the limit, from its start) at bound 0, bounded when popped; under a
    wall-clock limit alone, which keeps no search deterministic, those the workers bounded go
    in at their bounds (a limit that ends during the Megatron-mode start then still proves
    what the workers found). A bound at or above the incumbent is never popped (the search
    prunes it) and adds nothing to the bound of a search cut short (the least of the
    incumbent and the open bounds), so exact or not, it gives the same answer. Ruled out: the
    configs whose bound shows that no plan of theirs fits memory and the limits."""
    bounded, later, ruled_out = [], [], 0
    families = prepared.families()
    since = dl.mark()
    found = computed if computed and dl.work is None else {}
    for f, members in enumerate(families):
        if f % 16 == 0 and (dl.expired() or dl.spent(since) > BOUNDING_SHARE):
            for ms in families[f:]:   # the heuristic gets the rest
                if ms[0] not in found:
                    later.append((0.0, prepared.configs[ms[0]], 2, ms))
                elif found[ms[0]] is not None:
                    bounded.append((found[ms[0]], prepared.configs[ms[0]], 0, prepared.coef(ms[0])))
                else:
                    ruled_out += 1
            break
        # a free config (free mode's families are one config each): its own bound at once; a Megatron-mode
        # family at its work bound, even of one config (--fix schedule=): scale-1024 under schedule=1f1b
        # proves its optimum in 5 work units, where bounding its 44,592 configs at once used all 5
        if prepared.configs[members[0]].uniform is None:
            dl.charge(WORK.bound)
            head = prepared.coef(members[0])
            lb = computed[members[0]] if computed and members[0] in computed else _cheap_bound(head, limits, enough)
            if lb is not None:
                bounded.append((lb, head.cfg, 0, head))
            else:
                ruled_out += 1
            continue
        dl.charge(WORK.work_bound)
        cfg = prepared.configs[members[0]]
        bounded.append((weak.work_bound(cfg, make=lambda _, i=members[0]: prepared.coef(i)), cfg, 3, members))
    bounded.sort(key=lambda x: x[:3])
    return bounded, later, ruled_out


@dataclass
class Incumbent:
    """The best plan so far, its objective, and the heuristic's plans as hints per config."""
    plan: Plan | None = None
    objective: float = math.inf
    hints: dict = field(default_factory=dict)
    found: list[Plan] = field(default_factory=list)   # the plans this solve found (for Prepared.found)
    watch: Callable[[float], None] | None = None   # told each better objective (solve's `watch`)

    def offer(self, plan: Plan, limits: Limits) -> None:
        self.found.append(plan)
        self._take(plan, limits)

    def offer_known(self, plans: list[Plan], limits: Limits) -> None:
        """Earlier solves' plans (Prepared.found): taken like any, not found again."""
        for plan in plans:
            self._take(plan, limits)

    def _take(self, plan: Plan, limits: Limits) -> None:
        if objective_of(plan, limits) < self.objective * (1 - REL_EPS):
            self.plan, self.objective = plan, objective_of(plan, limits)
            if self.watch is not None:
                self.watch(self.objective)


def known(prepared: Prepared, limits: Limits) -> list[Plan]:
    """The plans earlier solves on these configs found (a Pareto sweep's) that these limits
    admit: plans of this problem too, so the best of them is a valid first incumbent."""
    return [plan for plan in prepared.found if limits.admit(plan)]


def heuristic_start(inst: Instance, limits: Limits, heap: _Heap, dl: Deadline, known: list[Plan] = (),
                    watch: Callable[[float], None] | None = None) -> Incumbent:
    """Megatron mode's first step: the best of the `known` plans, then the heuristic's plans of
    the configs of least bound, HEURISTIC_CONFIGS of them, or on until the first plan (so that a
    short limit returns one), within HEURISTIC_SHARE of the budget from that plan on and the
    deadline. The share counts from the first plan, not from the start: before it the look-ahead
    spends its work on the full bounds of configs that fit no plan (GPT-3 175B at batch 256 on
    mixed-128: 1,190 full bounds, 1,035 of them of such configs, 2.3 units), so a share from the
    start ended it one config short of the 25.93 s/step plan under free mode's 24-unit start
    (36.47 instead, and 36.27 after the start's 24 units). It looks
    ahead on a copy of the heap. Under a $/step budget the configs of least bound are mostly
    fast and over the budget (a Pareto sweep's min-time solves), so the first plan is often far
    from the optimum: there it counts HEURISTIC_CONFIGS from the first plan. The configs go
    by their full bound (bounds.full_bound, at least what an earlier solve proved): a config
    popped at its cheap bound goes back at its full bound, and is skipped where that admits no
    plan or none below the incumbent (at 1024 GPUs most configs of least cheap bound do not fit
    in memory: the heuristic tried 29 of them before its first plan, 23.9 s against the
    optimum's 10.57 s). Under a min-time solve's $/step budget it builds no candidate whose
    GPUs cost more than the budget allows at the config's bound (warmstart.over_price)."""
    inc, ahead = Incumbent(watch=watch), heap.copy()
    inc.offer_known(known, limits)
    h0 = dl.mark() if inc.plan is not None else None   # when the first plan came: the share counts from it
    budget = limits.budget_usd_per_step is not None
    tried = calls = 0  # configs tried (under a budget: since the first plan), and all tried
    fully: set[Config] = set()   # configs back in the heap at their full bound
    for _ in range(HEURISTIC_MAX_CONFIGS * 8):  # skipped configs cost a full bound each
        if calls >= HEURISTIC_MAX_CONFIGS:
            break
        got = ahead.pop_config()
        if got is None:
            break
        lb, cfg, coef = got
        if lb >= inc.objective * (1 - REL_EPS):
            break
        if h0 is not None and (tried >= HEURISTIC_CONFIGS or dl.spent(since=h0) > HEURISTIC_SHARE):
            break
        if dl.expired():
            break
        if cfg not in fully:
            full = full_bound(coef, limits, max(lb, heap.prepared.carried(cfg, limits)) if cfg.complete else lb)
            dl.charge(full_bound_work(coef, limits))
            if full is None or full >= inc.objective * (1 - REL_EPS):
                continue
            if full > lb:
                fully.add(cfg)
                ahead.push((full, cfg, 0, coef))
                continue
        tried, calls = tried + (1 if inc.plan is not None or not budget else 0), calls + 1
        # lb: at least the config's full bound here (it went back at it, or it was no larger)
        got = heuristic.best_plan(coef, limits, dl, lb if budget and limits.objective == "min-time" else 0.0)
        if got is None:
            continue
        plan, inc.hints[cfg] = got
        _require_valid(inst, plan, "the heuristic", cfg, coef.pins)
        inc.offer(plan, limits)
        h0 = h0 or dl.mark()
    return inc


def megatron_mode_start(inst: Instance, limits: Limits, prepared: Prepared, backend: str, seed: int,
                        workers: int, dl: Deadline, watch: Callable[[float], None] | None = None) -> Incumbent:
    """Free mode's first step: the Megatron-mode optimum (a free plan too: uniform options)
    within FREE_BASE_SHARE of the limit; `watch` is told each better objective on the way."""
    inc = Incumbent()
    sub = solve(inst, limits, backend=backend, seed=seed,
                workers=workers, mode="megatron", prepared=prepared.base,
                dl=dl.part(FREE_BASE_SHARE), watch=watch)
    if sub.plan is not None:
        inc.offer(sub.plan.with_(mode=prepared.mode, solver=None), limits)
    return inc


@contextlib.contextmanager
def _young_collections_only() -> Iterator[None]:
    """Python's cyclic garbage collector without its full collections while the block runs
    (the young ones go on; the thresholds are restored after). A search keeps millions of
    objects alive (configs, coefficients, memoised terms) and makes no long-lived garbage
    cycles: on scale-1024 (free mode, to the proof) its 10 full collections freed nothing and
    took 1.1 s of its 12.8 s, on scale-8192 (Megatron mode) 8 took 0.55 s of 2.7 s."""
    old = gc.get_threshold()
    gc.set_threshold(old[0], old[1], max(old[2], NO_FULL_COLLECTIONS))
    try:
        yield
    finally:
        gc.set_threshold(*old)


def solve(inst: Instance, limits: Limits, *, backend: str = "cpsat", fix: dict | None = None,
          time_limit_s: float = 30.0, seed: int = 1, workers: int = 1, mode: str = "megatron",
          progress: Callable[[Progress], None] | None = None, prepared: Prepared | None = None,
          dl: Deadline | None = None, watch: Callable[[float], None] | None = None) -> SolveResult:
    """The exact search within `time_limit_s` (or the deadline `dl`, which also ends it on an
    interrupt): a first incumbent (heuristic_start, or megatron_mode_start in free mode), then
    best-first over the configs by bound, each solved by _solve_config until the next bound
    cannot beat the incumbent. Configs left unexamined count with bound 0 (or theirs).
    `watch` (Megatron mode) is told each better incumbent objective as it is found."""
    with _young_collections_only():
        return _solve(inst, limits, backend, fix, time_limit_s, seed, workers, mode, progress, prepared, dl, watch)


def _solve(inst: Instance, limits: Limits, backend: str, fix: dict | None, time_limit_s: float, seed: int,
           workers: int, mode: str, progress: Callable[[Progress], None] | None, prepared: Prepared | None,
           dl: Deadline | None, watch: Callable[[float], None] | None = None) -> SolveResult:
    if backend not in BACKENDS:
        raise InputError(f"unknown solver '{backend}'; use {', '.join(BACKENDS)}, auto or brute-force", field="solver")
    dl = dl or Deadline(time_limit_s)
    if dl.work is not None and backend not in DETERMINISTIC_BACKENDS:
        raise InputError(f"{backend} has no deterministic work measure; use cpsat with a work limit, or a "
                         "wall-clock limit alone", field="work-limit")
    t0 = dl.start
    prepared = prepared or prepare(inst, fix, mode, dl)
    weak = WeakFamilyBounds(limits)
    if prepared.base is not None:
        # the Megatron-mode optimum first (it reads none of the free configs' bounds), while
        # --workers' processes bound them (parallel.BoundWorkers.root); then their bounding
        start = "Megatron-mode"
        bounders = BoundWorkers(prepared, limits, workers, _cheap_bound, REL_EPS) if workers > 1 else None
        try:
            if bounders is not None:
                # the configs _cheap_bounds bounds one by one (free ones), by the same rule
                bounders.root(prepared.configs, [ms[0] for ms in prepared.families()
                                                 if prepared.configs[ms[0]].uniform is None])
            # the start's incumbents bound the root processes' guesses (none in a sweep, which reads
            # every bound whole)
            inc = megatron_mode_start(inst, limits, prepared, backend, seed, workers, dl,
                                      bounders.bar if bounders is not None and not prepared.sweep else None)
            bounded, later, ruled_out = _cheap_bounds(prepared, limits, dl, weak,
                                                      bounders.root_bounds(dl) if bounders is not None else None,
                                                      math.inf if prepared.sweep else inc.objective)
        except BaseException:
            if bounders is not None:
                bounders.close()
            raise
        inc.offer_known(known(prepared, limits), limits)
    else:
        bounded, later, ruled_out = _cheap_bounds(prepared, limits, dl, weak)
        start, bounders = "heuristic", None
        inc = heuristic_start(inst, limits, _Heap(prepared, limits, bounded, dl, weak), dl, known(prepared, limits),
                              watch)
    heuristic_obj = inc.objective if inc.plan is not None else None
    warm = inc.plan if prepared.mode == "free" else None  # the Megatron-mode plan: a hint where it fits
    # the deadline cut the enumeration short: bound 0 stays open
    open_bounds: list[float] = [0.0] if prepared.truncated else []
    # what became of the configs: solved, pruned by a bound at or above the incumbent, ruled out
    # (a bound shows no plan fits memory and the limits), opened into children (free parents)
    solved = pruned = opened = 0
    # Best-first over the configs: a free config with open stage sizes is expanded when it is
    # popped (its children inherit its bound), a complete one is solved.
    heap = _Heap(prepared, limits, sorted(later + bounded, key=lambda x: x[:3]), dl, weak)
    total = len(prepared.configs)  # and, in free mode, every child made
    # free parents given their GPU-budget bound (parent_bounds): those _cheap_bounds bounded by it
    lifted: set[Config] = {cfg for _, cfg, kind, _ in bounded if kind == 0 and not cfg.complete}
    fully: dict[Config, float] = {}   # complete configs back in the heap at their full bound, that bound

    last_report = [-math.inf]

    def report() -> None:
        # at most every PROGRESS_EVERY_S: counting the heap's configs walks the whole heap
        if progress and (now := time.perf_counter()) - last_report[0] >= PROGRESS_EVERY_S:
            last_report[0] = now
            progress(Progress(now - t0, None if inc.plan is None else inc.objective,
                              min([inc.objective] + open_bounds + [e[0] for e in heap.entries[:1]]),
                              total - heap.count(), total))
    ahead = Ahead(prepared, limits, backend, seed, workers, _solve_config) if workers > 1 else None

    def inputs_of(c: Coefficients) -> tuple:
        """What a config's solve reads besides the config: cutoff, hint, known paths."""
        hint = inc.hints.get(c.cfg) or (candidate_of(c, warm) if warm is not None else None)
        return inc.objective if inc.plan is not None else None, hint, paths_of(c)
    try:
        while heap.entries:
            report()  # before each step too: a long config solve or bounding does not leave the user in silence
            if heap.least() >= inc.objective * (1 - REL_EPS):
                pruned += heap.count()
                if prepared.sweep:   # for the sweep's later solves (0.5 s at 1024 GPUs, 0.8-1.0 s at 8192)
                    heap.record(prepared.proven)
                break
            if dl.expired():
                open_bounds += [e[0] for e in heap.entries]
                break
            got = heap.pop_config()
            if got is None:
                open_bounds += [e[0] for e in heap.entries]  # none unless the deadline stopped it
                break
            lb, cfg, coef = got
            if lb >= inc.objective * (1 - REL_EPS):  # a family's members may bound above the family
                heap.push((lb, cfg, 0, coef))
                continue
            # what the bounds below need reach: a parent's GPU-budget bound at or above the incumbent
            # is never popped (as in _cheap_bounds); none in a sweep, whose later solves read them whole
            budget_enough = math.inf if prepared.sweep else inc.objective
            if not cfg.complete and cfg not in lifted:  # a parent: first its GPU-budget bound (cheap)
                lifted.add(cfg)
                dl.charge(WORK.bound)
                budget_lb = gpu_budget_bound(coef, limits, budget_enough)
                if budget_lb is None:
                    ruled_out += 1
                    continue  # no plan below it meets the limits
                if budget_lb > lb:
                    heap.push((budget_lb, cfg, 0, coef))
                    continue
            carried = prepared.carried(cfg, limits)
            # exact below the incumbent (less REL_EPS, as the search prunes), all this search reads
            # of it (bounds.full_bound); a sweep's later solves read it whole (Prepared.proven)
            floor = max(lb, carried) if cfg.complete else lb
            enough = budget_enough * (1 - REL_EPS)
            got = None
            if bounders is not None:   # the next configs' bounds, in the workers (and this one's, taken)
                bounders.ahead(heap, enough, dl, lifted, budget_enough, fully)
                if cfg not in fully:
                    got = bounders.take(cfg, floor, dl)
            # a worker's bounds, asked under an incumbent no smaller (the search's of then, or the
            # Megatron-mode start's: parallel._guess), are read as this search's own where they are
            # not None or were asked under this one: a None could be a bound at or above this
            # incumbent here (pruned, not ruled out) (parallel's docstring, BoundWorkers.ahead)
            if got is not None and got.budget_enough < budget_enough:
                got = None
            same = got is not None and got.budget_enough == budget_enough
            if not cfg.complete:
                # a parent's cheap bound before its full one, at a fifth of the cost: its GPU-budget
                # bound is below the incumbent, and on scale-1024 this one reaches it on 755 of the
                # 1,726 parents the full bound pruned (formulations/pipeline.md, "Decomposition")
                dl.charge(WORK.bound)
                cheap_lb = got.cheap if got is not None and (same or got.cheap is not None) else \
                    config_lower_bound(coef, limits, memory=False, enough=enough)
                if cheap_lb is None or cheap_lb >= inc.objective * (1 - REL_EPS):
                    if cheap_lb is None:
                        ruled_out += 1
                    else:
                        pruned += 1
                    continue
            if cfg in fully:   # back in the heap at its full bound (below): known
                full_lb = fully.pop(cfg)
            else:
                # a complete config's under this incumbent alone: the work it charges reads it too
                if got is not None and (same or (not cfg.complete and got.full is not None)):
                    full_lb, coef.bound_work = got.full, got.work
                else:
                    full_lb = full_bound(coef, limits, floor, enough=enough)
                dl.charge(full_bound_work(coef, limits))
            if full_lb is None or full_lb >= inc.objective * (1 - REL_EPS):
                if cfg.complete:  # what the bound proved, for later solves (a sweep's: too_slow, carried)
                    prepared.proven.setdefault(cfg, []).append((limits, math.inf if full_lb is None else full_lb))
                if full_lb is None:
                    ruled_out += 1
                else:
                    pruned += 1
                continue  # no plan fits in memory, or none can beat the incumbent
            if prepared.too_slow(cfg, limits):
                ruled_out += 1
                continue  # an earlier min-time solve proved it has no plan within the time limit
            if carried > lb and cfg.complete:  # an earlier solve of the sweep proved more: back in the heap
                if carried < inc.objective * (1 - REL_EPS):
                    heap.push((carried, cfg, 0, coef))
                else:
                    pruned += 1
                continue
            lb = max(lb, full_lb)
            if cfg.complete and heap.entries and lb > heap.least() * (1 + REL_EPS):
                # its full bound passes the next entry's: back in the heap at it (best-first order)
                fully[cfg] = full_lb
                heap.push((lb, cfg, 0, coef))
                continue
            if not cfg.complete:
                opened += 1
                # the children at the larger of their own bound and this one; a worker's without
                # their coefficients (Prepared.kid makes them when popped), under any incumbent:
                # only a child at or above this one could differ, never popped
                if got is not None and got.kids is not None:
                    kids = [(kid_cfg, kid_lb, None) for kid_cfg, kid_lb in got.kids]
                else:
                    kids = [(kid.cfg, kid_lb, kid) for kid, kid_lb in prepared.open(coef, limits, budget_enough)]
                for kid_cfg, kid_lb, kid in kids:
                    if not kid_cfg.complete:
                        lifted.add(kid_cfg)
                    dl.charge(WORK.bound)
                    if kid_lb is not None:
                        heap.push((max(lb, kid_lb), kid_cfg, 0, kid))
                        total += 1
                continue
            if ahead is not None:
                ahead.dispatch(heap, inputs_of, inc.objective, dl, REL_EPS)
            cutoff = inc.objective if inc.plan is not None else None
            plan, open_lb = _solve_or_take(ahead, coef, limits, backend, inputs_of(coef), dl, seed, lb)
            # what it proved: its bound, or (no plan under the cutoff) that none beats the incumbent
            prepared.proven.setdefault(cfg, []).append(
                (limits, open_lb if open_lb is not None else math.inf if cutoff is None else cutoff))
            solved += 1
            if plan is not None:
                inc.offer(plan, limits)
                if ahead is not None:
                    ahead.moved(inc.objective)
            if open_lb is not None:
                open_bounds.append(open_lb)
            report()
    finally:
        if ahead is not None:
            ahead.close()
        if bounders is not None:
            bounders.close()
    prepared.found.extend(inc.found)
    counts = dict(configs_total=total, configs_solved=solved, configs_pruned=pruned,
                  configs_ruled_out=ruled_out + heap.ruled_out, configs_opened=opened)
    return _result(inc, open_bounds, time.perf_counter() - t0, seed, backend, counts, heuristic_obj, start)


def full_bound_work(coef: Coefficients, limits: Limits) -> float:
    """Work units of bounds.full_bound on `coef`: WORK.bound (three under a $/step budget, whose
    bound adds the budget's), what its last full bound did beyond that (Coefficients.bound_work:
    a few-stage bound's enumeration, the same whether its memo held it, so the same work
    whatever bounded the config before, --workers' look-ahead included), and for a free parent
    WORK.option_fit per stage option, whose memory fits at three positions dominate (5-11 ms
    CPU at 40-80 options, 1024 GPUs)."""
    work = WORK.bound * (1 if limits.budget_usd_per_step is None else 3) + coef.bound_work
    return work if coef.cfg.complete else work + WORK.option_fit * len(coef.options)


def _solve_or_take(ahead: Ahead | None, coef: Coefficients, limits: Limits, backend: str, inputs: tuple,
                   dl: Deadline, seed: int, lb: float) -> tuple[Plan | None, float | None]:
    """_solve_config's answer for `coef` under `inputs` (cutoff, hint, paths): a worker's
    when it is the one this solve would give (parallel.Ahead.take), else this solve's."""
    cutoff, hint, _ = inputs
    got = ahead.take(coef.cfg, inputs, dl, lb) if ahead is not None else None
    if got is None:
        return _solve_config(coef, limits, backend, cutoff, hint, dl, seed, lb)
    plan, bound, paths = got
    for path in paths:   # what the worker's solve learned, as this one would have
        predict.learn_path(coef.paths(), path)
    return plan, None if bound is None else max(lb, bound)


def _result(inc: Incumbent, open_bounds: list[float], wall: float, seed: int, backend: str, counts: dict,
            heuristic_obj: float | None, start: str) -> SolveResult:
    """The honest bound (the least of the incumbent and every bound left open) and status.
    `counts`: what became of the configs (SolveResult's configs_* fields)."""
    best, best_obj = inc.plan, inc.objective
    bound = min([best_obj] + open_bounds) if (best is not None or open_bounds) else None
    counts = dict(counts, heuristic_objective=heuristic_obj, start=start)
    if best is None:
        status = "timeout" if open_bounds else "infeasible"
        return SolveResult(status, None, bound, None, wall, seed, backend, None, **counts)
    gap = 0.0 if bound is None else relative_gap(best_obj, bound)
    status = "optimal" if gap <= PROOF_TOL else "feasible"
    record = SolverRecord(backend, status, best_obj, bound, gap, None, seed)
    return SolveResult(status, best_obj, bound, gap, wall, seed, backend, best.with_(solver=record), **counts)

