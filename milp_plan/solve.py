"""`milp-plan solve`: objective and limits -> backend run -> plan, or a diagnosis.

Planners (planners.py): cpsat | highs | cbc (the exact search on one shared per-stage model,
solvers/driver.py), brute-force (solvers/bruteforce.py, an independent enumerator), warm-start
(the exact search's heuristic alone, no bound), aceso (Aceso-style bottleneck alleviation,
no bound), auto (= cpsat).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from milp_plan import planners
from milp_plan.deadline import WORK, Deadline
from milp_plan.errors import Infeasible, InputError
from milp_plan.job import Limits
from milp_plan.formulations.space import Config, parse_fix, plan_fills
from milp_plan.instance import Instance
from milp_plan.result import SolveResult
from milp_plan.units import format_duration, format_duration_up

SOLVERS = planners.NAMES


@dataclass(frozen=True)
class SolveRequest:
    solver: str = "auto"
    fix: str | None = None
    max_solve_time_s: float = 30.0
    seed: int = 1
    workers: int = 1                  # processes solving configs side by side (solvers/parallel.py)
    work_limit: float | None = None   # deterministic work units (deadline.py); None: wall clock only

    def deadline(self) -> Deadline:
        return Deadline(self.max_solve_time_s, work=self.work_limit)


MAX_SEED = 2**31 - 1          # CP-SAT's and HiGHS's seeds are non-negative 32-bit integers
MAX_WORKERS = 64
MAX_SOLVE_TIME_S = 7 * 86400.0
MAX_WORK = 7 * 86400.0        # work units (about seconds)


def check_request(req: SolveRequest) -> None:
    """Every field of a request in range, before any work (InputError naming the option)."""
    if req.solver not in SOLVERS:
        raise InputError(f"unknown solver '{req.solver}'; use {', '.join(SOLVERS)}", field="solver")
    if not 0 < req.max_solve_time_s <= MAX_SOLVE_TIME_S:
        raise InputError(f"must be > 0 and at most {MAX_SOLVE_TIME_S / 86400:g} days, e.g. 30s",
                         field="max-solve-time")
    if req.work_limit is not None:
        if not 0 < req.work_limit <= MAX_WORK:
            raise InputError(f"must be > 0 and at most {MAX_WORK:g} work units (about seconds), e.g. 30",
                             field="work-limit")
        if not planners.get(req.solver).deterministic:
            raise InputError(f"{req.solver} has no deterministic work measure; use --solver cpsat (or a heuristic) "
                             "with --work-limit, or --max-solve-time alone", field="work-limit")
    if not 1 <= req.workers <= MAX_WORKERS:
        raise InputError(f"must be between 1 and {MAX_WORKERS}, got {req.workers}",
                         field="workers")
    if isinstance(req.seed, bool) or not isinstance(req.seed, int) or not 0 <= req.seed <= MAX_SEED:
        raise InputError(f"must be a whole number between 0 and {MAX_SEED} (the solvers' seed range), "
                         f"got {req.seed}", field="seed")
    parse_fix(req.fix)


def job_fix(inst: Instance, fix: dict[str, object]) -> dict[str, object]:
    """The --fix pins with the job's settings that narrow the search space: a job that does not
    allow the distributed optimizer pins distopt=off (the space reads fix["distopt"])."""
    if inst.job.distributed_optimizer:
        return fix
    if fix.get("distopt") is True:
        raise InputError("distopt=on contradicts the job's distributed_optimizer: false; drop one of them",
                         field="fix")
    return {**fix, "distopt": False}


def run(inst: Instance, req: SolveRequest, limits: Limits | None = None, progress=None,
        prepared=None, dl: Deadline | None = None) -> SolveResult:
    """One exact solve; `prepared` (driver.prepare) reuses configs and coefficients across solves.
    `dl`: its budget where the command's is shared (a part of it: Deadline.part), else the request's."""
    check_request(req)
    limits = limits or inst.objective.limits()
    fix = job_fix(inst, parse_fix(req.fix))
    dl = dl or req.deadline()
    result = planners.get(req.solver).plan(inst, limits, dl, fix=fix, seed=req.seed,
                                           workers=req.workers, progress=progress, prepared=prepared)
    result.work = dl.work_used()
    if result.plan is not None:  # the filled profile points it rests on (only with extrapolate=on)
        result.plan = result.plan.with_(profile_fills=plan_fills(inst, result.plan))
    return result


def diagnose(inst: Instance, req: SolveRequest, limits: Limits, result: SolveResult) -> str:
    """Plain words, with numbers: which constraint makes the instance infeasible. The diagnosis
    shares the command's --max-solve-time (and --work-limit): it gets what the solve left (at
    least MIN_DIAGNOSIS_S), so the whole command stays within the limit plus that floor."""
    work = None if req.work_limit is None else max(req.work_limit - result.work, MIN_DIAGNOSIS_S)
    dl = Deadline(max(req.max_solve_time_s - result.wall_time_s, MIN_DIAGNOSIS_S), work=work)
    if result.status == "timeout":
        memory = _memory_diagnosis(inst, _memory_deadline(dl), only_if_short=True)
        if memory:
            return memory  # no time would help
        limit, more = ((f"--max-solve-time {req.max_solve_time_s:g}s", "time") if req.work_limit is None
                       else (f"--work-limit {req.work_limit:g}", "work"))
        return (f"no plan found within {limit} ({result.configs_examined} of {result.configs_total} configurations "
                f"examined); allow more {more}")
    relaxed = Limits("min-time")
    if limits != relaxed:
        free = _run_within(inst, req, dl, relaxed)
        if free.plan is not None:
            p = free.plan.predicted
            parts = []
            if limits.time_limit_s is not None and p.step_time_s > limits.time_limit_s:
                parts.append(_too_slow(inst, limits.time_limit_s, free))
            # the cheapest plan, only where a budget reads it (a min-cost solve: 5 s of the shipped
            # default's 7 s diagnosis of a time limit alone)
            budgets = limits.budget_usd_per_hour is not None or limits.budget_usd_per_step is not None
            cheapest = _run_within(inst, req, dl, Limits("min-cost")) if budgets else free
            cp = cheapest.plan.predicted if cheapest.plan else p
            if limits.budget_usd_per_hour is not None:
                rent = _least_rent(inst, req, limits, min(p.usd_per_hour, cp.usd_per_hour), dl)
                parts.append(f"the cheapest plan rents {rent} against a budget of "
                             f"{limits.budget_usd_per_hour:.2f} $/h" if rent
                             else "no plan meets the time limit and the hourly budget together")
            if limits.budget_usd_per_step is not None:
                parts.append(f"the cheapest plan costs {cp.usd_per_step:.4f} $/step against a budget of "
                             f"{limits.budget_usd_per_step:.4f} $/step" if cp.usd_per_step > limits.budget_usd_per_step
                             else "no plan meets the time limit and the per-step budget together")
            if limits.time_limit_s is not None and not parts:
                parts.append("no plan meets all limits together")
            return "; ".join(parts) if parts else "no plan meets the limits"
    return _memory_diagnosis(inst, _memory_deadline(dl))


def _too_slow(inst: Instance, limit_s: float, fastest: SolveResult) -> str:
    """The time limit below every plan: the fastest plan's step (proven, or the fastest found and
    its bound), and the fix: the --time-limit to give (rounded up, so that the plan meets it), or
    free mode's larger space where the search was Megatron mode's."""
    step = fastest.plan.predicted.step_time_s
    if fastest.status == "optimal":
        said = f"the fastest plan takes {format_duration(step)}/step (proven)"
    else:
        said = (f"the fastest plan found takes {format_duration(step)}/step (none is faster than "
                f"{format_duration(fastest.best_bound)}/step, proven)" if fastest.best_bound is not None
                else f"the fastest plan found takes {format_duration(step)}/step")
    fix = f"raise --time-limit to {format_duration_up(step)}/step or more"
    if inst.objective.mode == "megatron":
        fix += ", or try --mode free (tp, dp and recompute per stage; it may be faster)"
    return f"{said}, more than the --time-limit {format_duration(limit_s)}/step; {fix}"


def _run_within(inst: Instance, req: SolveRequest, dl: Deadline, limits: Limits) -> SolveResult:
    """A solve of the diagnosis, within what its deadline `dl` has left (seconds and work), its
    work charged to `dl`."""
    work = None if dl.work is None else max(dl.work_left(), MIN_DIAGNOSIS_S / 10)
    got = run(inst, SolveRequest(req.solver, req.fix, max(dl.left(), MIN_DIAGNOSIS_S / 10), req.seed, req.workers,
                                 work), limits)
    dl.charge(got.work)
    return got


def _memory_deadline(dl: Deadline) -> Deadline:
    """The memory scan's: at most MEMORY_DIAGNOSIS_S (seconds, and work units under a work limit)."""
    return Deadline(min(MEMORY_DIAGNOSIS_S, dl.left()), work=None if dl.work is None else MEMORY_DIAGNOSIS_S,
                    meter=dl.meter)


MEMORY_DIAGNOSIS_S = 10.0  # the memory scan gets at most this long (well under a second usually)
MIN_DIAGNOSIS_S = 0.5      # a diagnosis gets at least this long, even when the solve used all the time
RENT_PROBES = 12  # _least_rent: budget bisection steps at most


def _least_rent(inst: Instance, req: SolveRequest, limits: Limits, known: float, dl: Deadline) -> str | None:
    """What the $/h budget limits, minimised: the least $/h of any plan under the other limits,
    by bisection on the budget between the failed one and `known` (the $/h of a plan that
    exists). Each probe is a min-time solve under a trial $/h budget; the search ends when the
    interval is within 1%, after RENT_PROBES probes, or at the deadline `dl`. Returns the
    figure as text ('16.29 $/h', or 'at least 12.10 $/h (a plan at 16.29 $/h exists)'),
    or None when a plan within the budget appears (no plan meets the limits together)."""
    lo, hi = limits.budget_usd_per_hour, known
    if lo is None or hi <= lo:
        return None
    for _ in range(RENT_PROBES):
        if hi - lo <= 0.01 * hi or dl.expired():
            break
        mid = (lo + hi) / 2
        got = _run_within(inst, req, dl, Limits("min-time", limits.time_limit_s, mid, limits.budget_usd_per_step))
        if got.plan is not None:
            hi = got.plan.predicted.usd_per_hour
        elif got.status == "infeasible":
            lo = mid
        else:
            break  # timed out: keep what is proven
    if hi - lo <= 0.01 * hi:
        return f"{hi:.2f} $/h"
    return f"at least {lo:.2f} $/h (a plan at {hi:.2f} $/h exists)"


def least_plan_memory(inst: Instance, dl: Deadline | None = None) -> tuple[float, Config, bool] | None:
    """(bytes, config, complete): at most the per-GPU memory of the fullest GPU of any plan, and
    the config that gives it; complete is False where `dl` cut the scan short (the figure then
    holds for the configs scanned only); None where no config passes the rules. Each config of
    micro-batch 1 under 1F1B (the fewest activations: they grow with the micro-batch, and the
    last stage holds one micro-batch in flight, the fewest of any schedule), any recompute: some
    stage holds n = ceil(L / pp) layers or more, and needs at least the least memory of n layers
    at any position, on any of the config's options, with its best recomputed-layer count."""
    from milp_plan.formulations.coefficients import Coefficients, SharedCoefficients
    from milp_plan.formulations.space import enumerate_configs
    from milp_plan.schedules import OneFOneB
    best, complete, shared = None, True, SharedCoefficients(inst)
    for cfg in enumerate_configs(inst, {"mbs": 1, "schedule": OneFOneB.name}):
        if dl is not None and dl.expired():
            complete = False
            break
        if dl is not None:
            dl.charge(WORK.bound)
        coef = Coefficients(inst, cfg, shared)
        n = math.ceil(inst.model.num_layers / cfg.pp)
        for k in range(len(coef.options)):
            rs = (1, n) if coef.full(k) else (0,)   # memory is affine in r: its least at an end
            need = min(coef.memory(k, s)(n, r) for s in range(cfg.pp) for r in rs)
            if best is None or need < best[0]:
                best = (need, cfg)
    return None if best is None else (*best, complete)


def _memory_diagnosis(inst: Instance, dl: Deadline | None = None, only_if_short: bool = False) -> str | None:
    """The smallest per-GPU memory a plan needs (least_plan_memory) vs the largest GPU.
    only_if_short: None unless every configuration was scanned and none fits in memory."""
    got = least_plan_memory(inst, dl)
    cap = max(nt.memory_gib * (1 - inst.job.memory_headroom) for nt in inst.cluster.node_types)
    if got is None:
        return None if only_if_short else "no tp/dp/pp combination fits the cluster's GPU counts"
    need, cfg, complete = got
    if only_if_short and (not complete or need / 2**30 <= cap):
        return None
    if complete and need / 2**30 <= cap:  # the bound does not show that memory alone rules every plan out
        return ("no plan passes the configuration rules and fits in memory under these limits and pins; relax "
                "--fix, the limits, or give the cluster more GPUs")
    if not complete:
        return ("no plan fits the limits; the memory scan ran out of time before it could say whether memory is "
                "the reason: allow more --max-solve-time")
    return (f"the smallest per-GPU memory any plan needs is {need / 2**30:.1f} GiB ({cfg.label()}) "
            f"but the largest GPU offers {cap:.1f} GiB after the "
            f"{inst.job.memory_headroom:.0%} headroom; use more GPUs, a smaller model or a shorter sequence")


def require_plan(inst: Instance, req: SolveRequest, limits: Limits, result: SolveResult):
    if result.plan is None:
        raise Infeasible(diagnose(inst, req, limits, result))
    return result.plan
