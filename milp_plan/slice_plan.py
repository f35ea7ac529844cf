"""`milp-plan solve --slices auto|N|off`: token slicing (TeraPipe) as a planner decision.

off (the default)  nothing changes: the plan is the exact search's, byte for byte; the CLI
                   prints the decision (default_line): a quick proven bound on every sliced
                   plan (slice_bounds.quick_bound) against the plan says that slicing cannot
                   beat it or is not worth it; else the plan's own stages, sliced, show it is
                   worth it, or it stays undecided with the most slicing could save, and
                   --slices auto finds out.
N (>= 2)           the space is every GPipe plan with each sequence cut into exactly N slices.
auto               the space is every unsliced plan (the exact search as asked, plan A) and
                   every GPipe plan cut into 2..U slices.
The sliced search starts from a plan: with N the best GPipe plan (a solve), with auto the
unsliced plan A's own stages under GPipe (no solve), each cut by every slicing (`_best_sliced`).
The command's budget (--max-solve-time, --work-limit) is one for its parts: the first solve (A,
or the GPipe plan) gets FIRST_SHARE of it, the sliced search the rest; the result reports the
whole command's wall time and work.

The sliced part is a best-first search over the GPipe configs (`sliced_search`), like the
unsliced driver's: each config gets a lower bound on every sliced plan of it, over every layer
split, stage option and slicing (slice_bounds.ConfigBounds: a cheap one, raised by dearer ones,
RAISES, one each time the config reaches the top); configs are examined in increasing bound
order until the next bound cannot beat the incumbent (at first A's objective and the best
unsliced GPipe plan, sliced). Examining a config (`_examine`) runs the exact search over its
stage options and layer counts (slice_split.SplitSearch: branch and bound, every slicing row
at once), which bounds every plan of it and slices the plans whose bound beats the incumbent
(`_best_sliced`: the DP's slicing of each count, slicing.best_slices, then the slicings in
increasing path bound, each evaluated by predict.evaluate), so the config's bound becomes the
least plan bound; a search cut short by its share of the budget goes on later from where it
stopped, and meanwhile the config's heuristic plans are sliced. Sliced and unsliced plans are
compared on one step basis (predict.step_basis: simulated, or the closed forms).

What is proven: the bound written is min(the plan's objective, every bound the sliced search
left open, A's bound), so `optimal` means proven best over every unsliced plan and every
sliced plan of the allowed counts (at U = slicing.units_for(L) token units) under the
plan's step basis; otherwise `feasible` with that gap. With a heuristic planner (no bound on
A) no bound is written. The proofs of the bounds: slice_bounds.py and formulations/pipeline.md,
"Token slices".

Memory: a sliced plan holds what unsliced GPipe holds (every slice of every sequence in
flight is live until its backward, with the K/V of the earlier slices): slicing relieves the
bubble, not activation memory; the plan is charged GPipe's activation memory.
"""
from __future__ import annotations

import functools
import heapq
import math
import time
from dataclasses import dataclass, field, replace
from typing import Iterable

import numpy as np

from milp_plan import costmodel, predict, slice_bounds
from milp_plan.deadline import WORK, Deadline
from milp_plan.errors import InputError
from milp_plan.formulations.space import plan_fills
from milp_plan.instance import Instance
from milp_plan.job import Limits
from milp_plan.plan import Plan, SolverRecord
from milp_plan.result import PROOF_TOL, SolveResult, Status, objective_of, relative_gap
from milp_plan.schedules import TOKEN_SLICED, schedule_of
from milp_plan.slicing import best_slices, units_for
from milp_plan.solvers.driver import REL_EPS

OFF, AUTO = "off", "auto"
MEMORY_NOTE = ("slicing relieves the bubble, not activation memory: every slice of every sequence in flight stays "
               "live until its backward (GPipe-like order), so the plan is charged unsliced GPipe's activations")


def parse_slices(text: str | None) -> str | int:
    """'auto' | 'off' | N >= 2 (InputError naming --slices otherwise)."""
    t = (text or OFF).strip().lower()
    if t in (OFF, AUTO):
        return t
    if t.isascii() and t.isdigit() and int(t) >= 2:
        return int(t)
    raise InputError(f"must be auto, off or a whole number of slices >= 2, got '{text}'", field="slices")


@dataclass(frozen=True)
class Candidate:
    count: int
    slices: tuple[int, ...]      # tokens per slice; () for one slice (unsliced)
    plan: Plan
    objective: float


def _slice_time_table(inst: Instance, plan: Plan, unit: int):
    """t(i, j): the slowest stage's forward + backward on the slice of units i..j-1 (seconds)."""
    nts = [costmodel.stage_node_type(inst, st) for st in plan.stages]

    @functools.lru_cache(maxsize=None)
    def t(i: int, j: int) -> float:
        best = 0.0
        for s, st in enumerate(plan.stages):
            f, b = costmodel.stage_slice_time(inst, nts[s], st, plan.pp, s, (j - i) * unit, i * unit)
            best = max(best, f + b)
        return best
    return t


def slice_candidates(inst: Instance, plan: Plan, limits: Limits, count: int | None = None,
                     counts: Iterable[int] | None = None) -> list[Candidate]:
    """The best slicing of `plan` (a GPipe plan) for each count 1..U (or `count` alone, or each
    of `counts`), each evaluated; sorted by objective, then fewer slices."""
    if not schedule_of(plan.schedule, plan.vpp).slices_ok:
        raise InputError(f"token slices run under the {TOKEN_SLICED} schedule, not {plan.schedule}", field="slices")
    L = inst.job.seq_length
    units = units_for(L)
    unit = L // units
    if count is not None and count > units:
        raise InputError(f"at most {units} slices of {unit} tokens fit a sequence of {L} tokens, got {count}",
                         field="slices")
    t = _slice_time_table(inst, plan, unit)
    out = []
    for c in ([count] if count is not None else (counts if counts is not None else range(1, units + 1))):
        s = best_slices(units, t, plan.pp, plan.num_microbatches, count=c)
        out.append(_candidate(inst, plan, limits, tuple(n * unit for n in s.lengths) if c > 1 else ()))
    out.sort(key=lambda k: (k.objective, k.count))
    return out


def _candidate(inst: Instance, plan: Plan, limits: Limits, tokens: tuple[int, ...]) -> Candidate:
    """`plan` cut into slices of `tokens` (() : unsliced), evaluated (predict.evaluate)."""
    cand = plan.with_(slices=tokens, mode="free" if tokens else plan.mode, predicted=None, solver=None)
    cand = cand.with_(predicted=predict.evaluate(inst, cand))
    return Candidate(max(1, len(tokens)), tokens, cand, objective_of(cand, limits))


FIRST_SHARE = 0.5      # solve_with_slices: its first solve's share of the command's budget, the rest the
#                        sliced search's
EXACT_EVALS = 32       # _best_sliced: slicings of one plan evaluated in increasing bound order, at most
EXACT_SHARE = 0.25     # _examine: the exact search's share of what the deadline has left, each time


@dataclass
class SlicedSearch:
    """What the sliced search found and proved: the best sliced plan (or None) and its
    objective, and the bound left by every GPipe config not proven unable to beat it."""

    best: Candidate | None = None
    objective: float = math.inf
    open_bounds: list[float] = field(default_factory=list)
    configs: int = 0
    examined: int = 0
    pruned: int = 0
    cut_short: dict = field(default_factory=dict)   # config -> its exact search, stopped by the deadline
    made: dict = field(default_factory=dict)   # the last config bounded by a search made for it (_raised): that search

    def offer(self, cand: Candidate | None) -> None:
        if cand is not None and cand.objective < self.objective * (1 - REL_EPS):
            self.best, self.objective = cand, cand.objective


def _fits_memory(plan: Plan) -> bool:
    return all(sp.peak_memory_gib <= sp.capacity_gib * (1 + 1e-9) for sp in plan.predicted.stages)


def _best_sliced(inst: Instance, plan: Plan, limits: Limits, counts: list[int], cutoff: float,
                 dl: Deadline) -> tuple[Candidate | None, float]:
    """The best sliced version of `plan` found, and the plan's bound over every slicing of
    `counts`. Each slicing row has a path bound (slice_bounds.plan_row_bounds); evaluated
    (predict.evaluate), in this order while its bound beats the incumbent (`cutoff`, then the
    best found): the DP's slicing (slicing.best_slices) of each count, the count of least bound
    first, then the rows in increasing bound, at most EXACT_EVALS of them. The bound is the
    least over the rows of the value where evaluated, else the path bound: the plan's exact best
    when every row below it was evaluated. A plan that does not fit memory has no sliced
    version (None, inf): slicing keeps the plan's memory."""
    if not _fits_memory(plan):
        return None, math.inf
    vals, arcs, rows = slice_bounds.plan_row_bounds(inst, plan, limits, counts)
    dl.charge(WORK.bound + slice_bounds.plan_bounds_work(inst, plan.pp, counts))
    exact = vals.copy()        # the value where evaluated, else the path bound
    units = units_for(inst.job.seq_length)
    index = slice_bounds.row_index(units, counts)
    unit = inst.job.seq_length // units
    best: Candidate | None = None

    def beats(r: int) -> bool:
        limit = cutoff if best is None else min(cutoff, best.objective)
        return bool(vals[r] < limit * (1 - REL_EPS))

    def evaluate(r: int) -> None:
        nonlocal best
        lengths = slice_bounds.lengths_of(rows[r], arcs)
        cand = _candidate(inst, plan, limits, tuple(n * unit for n in lengths))
        dl.charge(WORK.plan)
        admitted = limits.admit(cand.plan)
        exact[r] = cand.objective if admitted else math.inf
        if admitted and (best is None or cand.objective < best.objective * (1 - REL_EPS)):
            best = cand
    done: set[int] = set()
    n = (rows < len(arcs)).sum(axis=1)
    least = {int(c): float(vals[n == c].min()) for c in np.unique(n)}
    t = _slice_time_table(inst, plan, unit)     # one table for every count
    for c in sorted(least, key=lambda c: (least[c], c)):
        limit = cutoff if best is None else min(cutoff, best.objective)
        if dl.expired() or least[c] >= limit * (1 - REL_EPS):
            break
        r = index[best_slices(units, t, plan.pp, plan.num_microbatches, count=c).lengths]
        if r not in done:
            done.add(r)
            evaluate(r)
    for r in np.argsort(vals, kind="stable").tolist():
        if not beats(r) or len(done) >= EXACT_EVALS or dl.expired():
            break
        if r not in done:
            done.add(r)
            evaluate(r)
    return best, float(exact.min())


def _fitting_plan(inst: Instance, coef, opts: tuple[int, ...], layers: tuple[int, ...]) -> Plan | None:
    """The plan of a config with stage options `opts` and `layers`, at the least recompute that
    fits memory (under full recompute one count r for every stage, the least from 1: the time
    only grows with r); None when none fits, the stages do not pack onto the nodes, or the
    config's pins rule it out."""
    from milp_plan.formulations.placement import build_plan
    from milp_plan.formulations.space import matches_pins
    for r in (range(1, min(layers) + 1) if coef.cfg.shared_recompute else (0,)):
        try:
            plan = build_plan(inst, coef.cfg, [coef.options[o] for o in opts], layers, (r,) * len(layers), None)
        except ValueError:   # the stages do not pack onto the cluster's nodes
            return None
        if matches_pins(inst, coef.pins, plan) and _fits_memory(plan):
            return plan
    return None


def _examine(inst: Instance, coef, limits: Limits, counts: list[int], lb: float, found: SlicedSearch,
             dl: Deadline, bounds: slice_bounds.ConfigBounds, again: bool = False
             ) -> tuple[float, bool]:
    """Search one GPipe config's sliced plans: (the bound it leaves open, whether its search
    ended). Its first heuristic plan (heuristics/warmstart.py) is sliced first (`_best_sliced`):
    where that meets the config bound `lb`, the config is settled. Then the exact search
    (slice_split.SplitSearch: branch and bound over the stage options and layer counts, within
    EXACT_SHARE of what the deadline has left, so that a config whose tree is too large leaves
    most of the budget to the others; `again`: a later run, from where the last stopped, when
    the config is the least on the heap again) bounds every plan of it and slices those whose bound beats the
    incumbent (at the least recompute that fits, `_fitting_plan`): the config's bound becomes
    the least plan bound. Where it is cut short, `lb` stays, and (the first time) the config's
    other heuristic plans and the placements that balance the per-type times on the slicings of
    least bound (ConfigBounds.balanced) are sliced for an incumbent, within EXACT_SHARE of what
    is left (unbounded, they took 14.6 of the 20 units of a pp 27 config's first examination on
    GPT-3 175B on mixed-128 at batch 8, and found nothing). Slicing all of those first
    took 5 of the 35 work units that proved the shipped default's `--slices auto`, and found
    nothing the exact search did not; slicing none first took GPT-3 175B on 16 x 8 A100 from 2 s
    to 32 s (its pp 16 tree is too large, its first heuristic plan meets its bound)."""
    from milp_plan.formulations.placement import build_plan
    from milp_plan.formulations.space import matches_pins
    from milp_plan.heuristics import warmstart
    from milp_plan.slice_split import SplitSearch
    r = 1 if coef.cfg.shared_recompute else 0

    def slice_heuristic(plans, within: Deadline) -> None:
        for opts, layers, rs in plans:
            if within.expired():
                break
            try:
                plan = build_plan(inst, coef.cfg, [coef.options[o] for o in opts], layers, rs, None)
            except ValueError:   # the stages do not pack onto the cluster's nodes
                continue
            if matches_pins(inst, coef.pins, plan):
                found.offer(_best_sliced(inst, plan, limits, counts, found.objective, within)[0])
    heuristic = [] if again else warmstart.candidates(coef, dl)
    slice_heuristic(heuristic[:1], dl)
    if lb >= found.objective * (1 - REL_EPS):
        return lb, True
    if coef.cfg.vpp == 1:
        def leaf(opts: tuple[int, ...], layers: tuple[int, ...], bound: float) -> float:
            plan = _fitting_plan(inst, coef, opts, layers)
            dl.charge(WORK.plan)
            if plan is None:
                return math.inf
            cand, b = _best_sliced(inst, plan, limits, counts, found.objective, dl)
            found.offer(cand)
            return max(b, bound)
        search = found.cut_short.pop(coef.cfg, None) or found.made.pop(coef.cfg, None) or SplitSearch(bounds, coef)
        got, done = search.run(lambda: found.objective, leaf, dl.share(EXACT_SHARE))
        if done:
            return max(got, lb), True
        found.cut_short[coef.cfg] = search     # the second run goes on where this one stopped
        if again:
            return lb, False
    balanced = [(opts, layers, (r,) * coef.cfg.pp) for opts, layers in bounds.balanced(coef)]
    slice_heuristic([*heuristic[1:], *balanced], dl.share(EXACT_SHARE))
    return lb, coef.cfg.vpp != 1


def sliced_search(inst: Instance, req, limits: Limits, counts: list[int], cutoff: float = math.inf,
                  seeds: Iterable[Plan] = (), report=None, dl: Deadline | None = None) -> SlicedSearch:
    """Best-first over the GPipe configs by their sliced bound (slice_bounds.ConfigBounds: the
    cheap bound first, then the work bound (WorkBounds.config, no slicing enumerated) in three
    steps and the full one, a step each time a config reaches the top, RAISES): each config
    whose bound beats the incumbent (at first `cutoff`, the best unsliced plan's objective, and
    the best slicing of each of `seeds`, GPipe plans) is examined (_examine); the search stops when the
    next bound cannot beat it. Every config not examined within the deadline keeps its bound.
    `report(found, least)`, where given, is called at most every PROGRESS_EVERY_S with the search
    so far and the least bound still open (the caller's progress line). `dl`: what the command's
    budget leaves it (else the request's)."""
    from milp_plan.formulations.space import parse_fix
    from milp_plan.solve import job_fix
    from milp_plan.solvers import driver
    dl = dl or req.deadline()
    found = SlicedSearch(objective=cutoff)
    for plan in seeds:
        found.offer(_best_sliced(inst, plan, limits, counts, found.objective, dl)[0])
    try:
        prepared = driver.prepare(inst, job_fix(inst, parse_fix(_gpipe_fix(req.fix))), "megatron", dl)
    except InputError:
        return found     # no GPipe config passes the rules: no sliced plan
    if prepared.truncated:
        found.open_bounds.append(0.0)
    bounds = slice_bounds.ConfigBounds(inst, limits, counts)
    heap = []          # (bound, config index, stage): RAISES[stage] next, or EXAMINE, or CUT_SHORT
    last = -math.inf

    def tell(least: float) -> None:
        nonlocal last
        if report is not None and (now := time.perf_counter()) - last >= driver.PROGRESS_EVERY_S:
            last = now
            report(found, least)
    found.configs = sum(1 for cfg in prepared.configs if cfg.sched.slices_ok)
    for i, cfg in enumerate(prepared.configs):
        if not cfg.sched.slices_ok:
            continue
        tell(0.0)          # configs not bounded yet: no bound beyond 0
        if dl.expired():
            found.open_bounds.append(0.0)
            continue
        lb = bounds.cheap(prepared.coef(i))
        dl.charge(WORK.bound)
        if lb is not None:
            heap.append((lb, i, 0))
    heapq.heapify(heap)
    while heap:
        tell(min([heap[0][0], *found.open_bounds]))
        lb, i, stage = heap[0]
        if lb >= found.objective * (1 - REL_EPS):
            found.pruned += sum(1 for _, _, st in heap if st < CUT_SHORT)   # examined ones counted there
            break
        if dl.expired():
            found.open_bounds += [b for b, _, _ in heap]
            break
        heapq.heappop(heap)
        if stage < EXAMINE:
            got = _raised(RAISES[stage], prepared.coef(i), bounds, found, dl)
            if got is not None:
                heapq.heappush(heap, (max(got, lb), i, stage + 1))
            continue
        if stage == EXAMINE:
            found.examined += 1
        got, done = _examine(inst, prepared.coef(i), limits, counts, lb, found, dl, bounds, stage == CUT_SHORT)
        if done or dl.expired():
            found.open_bounds.append(got)
        else:      # cut short: it goes on when it is the least again
            heapq.heappush(heap, (lb, i, CUT_SHORT))
    return found


# sliced_search's bounds of a config after the cheap one, each dearer than the one before and
# computed only when the config tops the heap at the last (its key: the largest so far, so a
# config pruned early costs the cheap ones alone): WorkBounds.config with the memory rooms and
# no end stages (0.7 ms a call on GPT-3 175B on mixed-128 at batch 8), with the end stages' paths
# (23 ms), with the middle's layers split by the bottleneck's intervals (170 ms), then
# ConfigBounds.full (every slicing enumerated), then (min-cost) SplitSearch.heaviest (0.17 s; the shipped
# default at 1.4 s/step: gap 13.35% -> 9.35%). Without the first two, that instance (batch 8)
# spent its 30 work units on 397 configs' split paths and left its sliced plans at >= 0.40
# (gap 73%), although the rooms alone lift 90% of its 2,680 configs past the unsliced optimum.
RAISES = ("rooms", "paths", "split", "full", "heaviest")
HEAVIEST_WORK = 0.13   # _raised: a SplitSearch made for `heaviest` (GPT-3 175B, mixed-128, batch 8: 0.17 s)
EXAMINE, CUT_SHORT = len(RAISES), len(RAISES) + 1   # the stages after: examined; examined once and cut short


def _raised(what: str, coef, bounds: slice_bounds.ConfigBounds, found: SlicedSearch, dl: Deadline) -> float | None:
    """The config's bound `what` (RAISES), below the incumbent's objective (`found`'s) whole, else
    at least it (None: no plan), its work charged to `dl`: per config option, per pair of end
    options and per array cell its paths touched (the constants of slice_bounds, each measured
    on its own call)."""
    objective = found.objective
    if what == "full":
        got = bounds.full(coef, objective)
        dl.charge(WORK.bound + bounds.work)
        return got
    if what == "heaviest":
        if bounds.limits.objective != "min-cost":
            return 0.0     # min-time: the exact search's roots bound the same paths, each last stage fixed
        from milp_plan.slice_split import SplitSearch
        dl.charge(HEAVIEST_WORK)
        search = SplitSearch(bounds, coef)
        found.made = {coef.cfg: search}   # _examine's, where the config is examined next
        return search.heaviest(objective, dl)
    work, cells, options = bounds.work_bounds, bounds.work_bounds.cells, len(coef.options)
    if what == "rooms":
        got, _ = work.config(coef, bounds, objective, ends=False)
        dl.charge(options * slice_bounds.QUICK_WORK_PER_OPTION)   # 0.14-0.68 ms a call at 1-4 options
    elif what == "paths":
        got, _ = work.config(coef, bounds, objective, paths=True, split=False)
        dl.charge(WORK.bound + slice_bounds.paths_work(options, work.cells - cells))
    else:
        got, _ = work.config(coef, bounds, objective, paths=True)
        # per count and option, and the paths' cells (without them GPT-3 175B on mixed-128, batch
        # 8, spent 50 s CPU on 2,104 work bounds charged 27 units)
        dl.charge(WORK.bound + len(work.counts) * options * slice_bounds.WORK_PER_COUNT
                  + (work.cells - cells) * slice_bounds.SPLIT_SECONDS_PER_CELL)
    return got


def _sliced_result(inst: Instance, base: SolveResult | None, cand: Candidate, bound: float | None, backend: str,
                   seed: int, wall: float, notes: list[str]) -> SolveResult:
    """The result that writes a sliced plan: its bound (None: not proven, e.g. a heuristic
    planner's unsliced part) and status."""
    gap = None if bound is None else relative_gap(cand.objective, bound)
    status = Status(_status_of(bound, cand.objective))
    rec = SolverRecord(backend, status.value, cand.objective, bound, gap, None, seed)
    plan = cand.plan.with_(solver=rec, profile_fills=plan_fills(inst, cand.plan))
    kw = {} if base is None else dict(configs_total=base.configs_total, configs_solved=base.configs_solved,
                                      configs_pruned=base.configs_pruned, configs_ruled_out=base.configs_ruled_out,
                                      configs_opened=base.configs_opened, heuristic_objective=base.heuristic_objective,
                                      start=base.start, work=base.work)
    return SolveResult(status, cand.objective, bound, gap, wall, seed, backend, plan,
                       notes=[*(base.notes if base else []), *notes, MEMORY_NOTE], **kw)


def _gpipe_fix(fix: str | None) -> str:
    from milp_plan.formulations.space import parse_fix
    pinned = parse_fix(fix).get("schedule")
    if pinned is not None and not schedule_of(str(pinned)).runs_slices:
        raise InputError(f"--fix schedule={pinned} contradicts token slices (they run under {TOKEN_SLICED}); "
                         "drop one", field="slices")
    pin = f"schedule={TOKEN_SLICED}"
    return fix if pinned else (f"{fix},{pin}" if fix else pin)


def _joint_bound(found: SlicedSearch, best: float, unsliced: SolveResult | None) -> float | None:
    """min(best objective, the bounds the sliced search left open, the unsliced search's bound);
    None when the unsliced part proves none (a heuristic planner)."""
    parts = [best, *found.open_bounds]
    if unsliced is not None:
        if unsliced.plan is None and unsliced.status == Status.INFEASIBLE:
            pass                                   # proven: no unsliced plan
        elif unsliced.best_bound is None:
            return None
        else:
            parts.append(unsliced.best_bound)
    return min(parts)


def _what(counts: list[int], units: int, unit: int, basis: str) -> str:
    sliced = (f"{counts[0]} slices" if len(counts) == 1 else f"{counts[0]}..{counts[-1]} slices") + \
        f" of {unit}-token units (U = {units})"
    return f"{sliced}, {basis} step"


def solve_with_slices(inst: Instance, req, limits: Limits, setting: str | int, progress=None
                      ) -> tuple[SolveResult, str]:
    """The solve under --slices (module docstring): (result to write, one-line decision)."""
    from milp_plan import solve as solving
    if setting == OFF:
        return solving.run(inst, req, limits, progress=progress), ""
    t0 = time.perf_counter()
    L = inst.job.seq_length
    units = units_for(L)
    unit = L // units
    if isinstance(setting, int) and setting > units:
        raise InputError(f"at most {units} slices of {unit} tokens fit a sequence of {L} tokens, got {setting}",
                         field="slices")
    _gpipe_fix(req.fix)   # a pinned schedule other than GPipe: one-line error before any work
    counts = [setting] if isinstance(setting, int) else list(range(2, units + 1))
    basis = predict.step_basis(inst)
    what = "$/step" if limits.objective == "min-cost" else "step"
    # one budget (--max-solve-time, --work-limit) for the command's parts: its first solve gets
    # FIRST_SHARE of it, the sliced search the rest
    dl = req.deadline()
    if isinstance(setting, int):   # the best GPipe plan, cut into N slices, is the first incumbent
        a = None
        g = solving.run(inst, replace(req, fix=_gpipe_fix(req.fix)), limits, dl=dl.part(FIRST_SHARE),
                        progress=None if progress is None else _seed_reporter(progress, t0))
        seeds = [] if g.plan is None else [g.plan]
    else:    # auto: the unsliced plan, and its own stages under GPipe, sliced, the first incumbent
        a = solving.run(inst, req, limits, progress=progress, dl=dl.part(FIRST_SHARE))
        seeds = [] if a.plan is None else [_under_gpipe(inst, a.plan)]
    a_obj = math.inf if a is None or a.plan is None else objective_of(a.plan, limits)
    found = sliced_search(inst, req, limits, counts, a_obj, seeds=seeds,
                          report=None if progress is None else _reporter(progress, t0, a), dl=dl)
    wall = time.perf_counter() - t0
    space = _what(counts, units, unit, basis)
    sliced_lb = min([found.objective, *found.open_bounds])
    parts = [f"sliced plans >= {sliced_lb:.6g}"] if sliced_lb < math.inf else []
    if a is not None and a.best_bound is not None:
        parts.append(f"unsliced >= {a.best_bound:.6g}")
    searched = (f"{found.configs} GPipe configs: {found.examined} searched, {found.pruned} pruned by their sliced "
                f"bound" + (f"; bounds: {', '.join(parts)}" if parts else ""))
    if found.best is None:
        if a is None:
            from milp_plan.errors import Infeasible
            raise Infeasible(f"--slices {setting}: no GPipe plan cut into {setting} slices meets the limits "
                             f"({searched}); try --slices auto")
        bound = _joint_bound(found, a_obj, a) if a.plan is not None else None
        out = replace(a, wall_time_s=wall) if a.plan is None else _restated(a, bound, wall)
        out.work = dl.work_used()
        return out, (f"token slices: off; no sliced plan ({space}) beats the unsliced plan's {what} "
                     f"{a_obj:.6g} ({out.status}{_gap_text(out)}; {searched})")
    bound = _joint_bound(found, found.objective, a)
    unsliced = "" if a is None else (f" against the best unsliced plan's {a_obj:.6g} ({a.status})"
                                     if a.plan is not None else " (no unsliced plan)")
    res = _sliced_result(inst, a, found.best, bound, req.solver if a is None else a.backend, req.seed,
                         wall, [_proof_note(_status_of(bound, found.objective), space)])
    res.work = dl.work_used()
    return res, (f"token slices: {found.best.count} slices {list(found.best.slices)} tokens; {what} "
                 f"{found.objective:.6g}{unsliced}; {res.status}{_gap_text(res)} over {space} ({searched})")


def _reporter(progress, t0: float, a: SolveResult | None):
    """The sliced search's progress line, on the command's clock: the best plan so far (unsliced
    or sliced), the least bound over both parts, and the GPipe configs settled of all."""
    from milp_plan.result import Progress

    def report(found: SlicedSearch, least: float) -> None:
        inc = min(found.objective, math.inf if a is None or a.objective is None else a.objective)
        parts = [least, found.objective]
        if a is not None and a.best_bound is not None:
            parts.append(a.best_bound)
        progress(Progress(time.perf_counter() - t0, None if inc == math.inf else inc, min(parts),
                          found.examined + found.pruned, found.configs))
    return report


def _seed_reporter(progress, t0: float):
    """The progress line of --slices N while the best GPipe plan is solved for (cut into N slices,
    the sliced search's first incumbent), on the command's clock: no plan yet (unsliced, that
    solve's plans are not plans of the answer), no bound yet (the sliced plans have none before
    their search), and that solve's configs settled of all."""
    from milp_plan.result import Progress

    def report(p: Progress) -> None:
        progress(Progress(time.perf_counter() - t0, None, None, p.done, p.total))
    return report


def _under_gpipe(inst: Instance, plan: Plan) -> Plan:
    """`plan`'s own stages and layer counts under GPipe (Plan.with_schedule), evaluated: with
    --slices auto, the sliced search's first plan to slice. A solve for the best GPipe plan
    instead gave no better start and took what the sliced search needed: at mixed-128 (GPT-3
    13B, batch 512, --work-limit 30) half of what the unsliced solve left, 13.4 units, for a
    6.27 s plan against the unsliced 3.88 s, and the sliced search ended without examining a
    config (gap 38%); without it the sliced search examines 2 (gap 6.1%, as with 30 units for
    each part before the parts shared one budget)."""
    if schedule_of(plan.schedule, plan.vpp).slices_ok:
        return plan
    gplan = plan.with_schedule(TOKEN_SLICED, 1)
    return gplan.with_(predicted=predict.evaluate(inst, gplan))


def _status_of(bound: float | None, objective: float) -> str:
    """optimal when the bound meets the objective within PROOF_TOL."""
    return "optimal" if bound is not None and relative_gap(objective, bound) <= PROOF_TOL else "feasible"


def _gap_text(r: SolveResult) -> str:
    return "" if r.gap is None or r.status == Status.OPTIMAL else f", gap {r.gap:.2%}"


def _proof_note(status: str, space: str) -> str:
    if status == "optimal":
        return (f"status optimal: proven best over every unsliced plan and every sliced plan ({space}) of every "
                "GPipe config (formulations/pipeline.md, 'Token slices')")
    return (f"status feasible: the bound is the least of the bounds left open over the unsliced plans and the "
            f"sliced plans ({space}); a config's sliced bound rests on paths of the step graph, not on a "
            f"solved model (formulations/pipeline.md, 'Token slices')")


def _restated(a: SolveResult, bound: float | None, wall: float) -> SolveResult:
    """The unsliced result with its bound over the joint space (sliced plans included) and the
    wall time of the whole search (the unsliced solve, the GPipe solve and the sliced search)."""
    gap = None if bound is None else relative_gap(a.objective, bound)
    status = Status(_status_of(bound, a.objective))
    rec = replace(a.plan.solver, status=status.value, best_bound=bound, gap=gap) if a.plan.solver else None
    return replace(a, status=status, best_bound=bound, gap=gap, plan=a.plan.with_(solver=rec), wall_time_s=wall)


QUIET_SAVING = 0.01   # default_line: a possible saving below this share is not worth a slicing runtime
REFINE_SAVING = 0.10  # ... below this share the quick bound is refined (every slicing, within decision_work)
REFINE_WORK = 5.0     # work units (deadline.py; about CPU seconds): the most the decision may spend


def _own_slicing(inst: Instance, plan: Plan, limits: Limits, below: float) -> Candidate | None:
    """The plan's own stages under GPipe, cut by the best slicing of each count (slice_candidates),
    when one is admitted by the limits (memory included: GPipe holds every micro-batch) and its
    objective is below `below`; None otherwise (pp = 1: no bubble to shrink; vpp > 1)."""
    if plan.pp < 2 or plan.vpp != 1:     # interleaved stages hold chunks GPipe does not run
        return None
    gplan = plan if schedule_of(plan.schedule, plan.vpp).slices_ok else \
        plan.with_(schedule=TOKEN_SLICED, predicted=None, solver=None)
    try:
        cands = slice_candidates(inst, gplan, limits)
    except (InputError, ValueError):
        return None
    good = [c for c in cands if c.count > 1 and limits.admit(c.plan) and c.objective < below]
    return min(good, key=lambda c: (c.objective, c.count)) if good else None


def _least_config_slicing(inst: Instance, coef, limits: Limits, below: float) -> Candidate | None:
    """The heuristic plan of the GPipe config of least sliced bound (`coef`, from quick_bound;
    heuristics/warmstart.best_plan within LEAST_CONFIG_WORK work units) cut by the slicing of
    least TeraPipe step J over the counts 1..U (slicing.best_slices on the plan's slowest stage;
    none when one slice is least),
    evaluated (predict.evaluate), when the limits admit it and its objective is below `below`;
    None otherwise. Where slicing pays, the config the bound ranks first is where a sliced plan
    is likeliest (GPT-3 175B on 16 x 8 A100: GPipe pp 16 cut into 4 slices beats the
    interleaved pp 8 plan by 20%); one plan and one evaluation keep it cheap."""
    from milp_plan.heuristics import warmstart
    if coef.cfg.pp < 2:
        return None
    got = warmstart.best_plan(coef, limits, Deadline(math.inf, work=LEAST_CONFIG_WORK))
    if got is None or not _fits_memory(got[0]):
        return None
    plan = got[0]
    units = units_for(inst.job.seq_length)
    unit = inst.job.seq_length // units
    t = _slice_time_table(inst, plan, unit)
    dp = best_slices(units, t, plan.pp, plan.num_microbatches)   # every count: one DP
    if dp.count < 2:
        return None     # by TeraPipe's step, slicing this plan does not pay
    cand = _candidate(inst, plan, limits, tuple(n * unit for n in dp.lengths))
    return cand if limits.admit(cand.plan) and cand.objective < below else None


LEAST_CONFIG_WORK = 0.5   # work units (deadline.py) of the heuristic plan default_line slices
DECISION_WORK = 0.06      # work units the default's decision may spend on its bound at least ...
DECISION_SHARE = 0.03     # ... or this share of the solve's own, when more (at most REFINE_WORK)


def decision_work(result: SolveResult) -> float:
    """Work units (deadline.py) of the default's bound on sliced plans (quick_bound, its
    refinement included): DECISION_WORK, or DECISION_SHARE of the solve's work when more, at most
    REFINE_WORK, so that the decision costs little beside the solve (`solve`'s time outside the
    search: issue 19's < 0.5 s on the default). Measured, CPU (its line's saving at most):
    before it had a budget, 6.5 s after a 3 s solve at scale-1024 (1.7%); with the end stages'
    paths (slice_bounds, quick_bound's stage 3), on the default 1.7 s at 1 unit (8%), 0.32 s at
    0.19 (20%), 0.22 s at 0.06 (24%, as without the paths: 0.18 s); scale-1024 1.1 s at 0.41
    units (15%), 0.67 s at 0.13 (25%). `--slices auto` searches with the full bounds."""
    return min(REFINE_WORK, max(DECISION_WORK, DECISION_SHARE * result.work))


def default_line(inst: Instance, req, limits: Limits, result: SolveResult) -> str:
    """The default's decision on token slices (no --slices; the plan and plan.json are the exact
    search's, unsliced), from a quick proven bound on every sliced plan (slice_bounds.quick_bound:
    the work bound of every GPipe config, no slicing enumerated; where it leaves a saving of
    QUIET_SAVING..REFINE_SAVING, refined in the same search by the full bound of the configs of
    least bound; all within `decision_work` units, after which the least bound reached stands)
    against the plan's objective:
      * at or above it: slicing cannot beat the plan (proven);
      * below it by less than QUIET_SAVING: not worth a runtime that can slice (proven);
      * else, when the plan's own stages cut into token slices (GPipe), or the heuristic plan of the
        GPipe config of least bound so cut (_least_config_slicing), beat it by QUIET_SAVING or
        more: worth it, with that plan's figure (simulated), and --slices auto to search them all;
      * else undecided: at most how much a sliced plan could save, and --slices auto settles it."""
    if result.plan is None or limits.objective not in ("min-time", "min-cost"):
        return DEFAULT_LINE
    obj = objective_of(result.plan, limits)
    try:
        fix = _gpipe_fix(req.fix)
    except InputError:     # the pins rule out GPipe: no sliced plan
        fix = None
    where: list = []
    quick: list[float] = []   # the bound before the refinement, when the search reached it

    def close(lb: float) -> bool:   # then refined: every slicing of the configs of least bound
        return QUIET_SAVING <= 1 - lb / obj < REFINE_SAVING
    budget = decision_work(result)
    lb = None if fix is None else slice_bounds.quick_bound(
        inst, limits, fix, where, refine=REFINE_WORK, work_limit=budget,
        refine_if=lambda q: quick.append(q) or close(q))[0]
    unit = "$/step" if limits.objective == "min-cost" else "s/step"
    units = units_for(inst.job.seq_length)
    space = f"every GPipe plan cut into 2..{units} token slices"
    why = "the heaviest stage's sliced work on every micro-batch, and the bubble that slices leave"
    if lb is None:
        return f"token slices: off; no plan can be sliced here ({space} is empty or breaks the limits)"
    if not quick:
        why += f"; its search stopped at {budget:.2g} work units"
    elif close(quick[0]):
        why += f"; every slicing enumerated on the configs of least bound, within {budget:.2g} work units"
    if lb >= obj * (1 - REL_EPS):
        return (f"token slices: off; slicing cannot beat this plan (proven): {space} takes at least {lb:.4g} "
                f"{unit} ({why})")
    saving = 1 - lb / obj
    if saving < QUIET_SAVING:
        return (f"token slices: off; not worth it: slicing could save at most {saving:.2%} here (proven: {space} "
                f"takes at least {lb:.4g} {unit}), too little for a runtime that pipelines slices")
    own = _own_slicing(inst, result.plan, limits, obj * (1 - QUIET_SAVING))
    if own is not None:
        return (f"token slices: off (stock Megatron-LM cannot pipeline token slices); worth it: this plan's stages "
                f"under GPipe cut into {own.count} slices {list(own.slices)} take {own.objective:.4g} {unit} "
                f"({own.objective / obj - 1:+.1%}); --slices auto searches every sliced plan, with a proven gap")
    other = _least_config_slicing(inst, where[0], limits, obj * (1 - QUIET_SAVING)) if where else None
    if other is not None:
        p = other.plan
        return (f"token slices: off (stock Megatron-LM cannot pipeline token slices); worth it: a GPipe plan of pp "
                f"{p.pp} (tp {p.stages[0].tp}, dp {p.stages[0].dp}, {p.num_microbatches} micro-batches) cut into "
                f"{other.count} slices {list(other.slices)} takes {other.objective:.4g} {unit} "
                f"({other.objective / obj - 1:+.1%}); --slices auto searches every sliced plan, with a proven gap")
    return (f"token slices: off (the plan runs on stock Megatron-LM, which cannot pipeline token slices); "
            f"undecided: {space} takes at least {lb:.4g} {unit} ({why}), so slicing could save at most "
            f"{saving:.0%} here; --slices auto searches them, with a proven gap")


DEFAULT_LINE = ("token slices: off (the default: the plan runs on stock Megatron-LM, which cannot pipeline token "
                "slices); --slices auto decides whether slicing pays, with a bound over every sliced plan")
