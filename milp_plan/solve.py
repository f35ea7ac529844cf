"""`milp-plan solve`: objective and limits -> backend run -> plan, or a diagnosis.

Backends: cpsat | highs | cbc (one shared per-stage model, solvers/driver.py),
brute-force (solvers/bruteforce.py, an independent enumerator), auto (= cpsat).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from milp_plan.errors import Infeasible, InputError
from milp_plan.formulations.pipeline import Limits
from milp_plan.formulations.space import parse_fix, plan_fills
from milp_plan.instance import Instance
from milp_plan.solvers.driver import SolveResult, solve as exact_solve
from milp_plan.units import format_duration

SOLVERS = ("auto", "cpsat", "highs", "cbc", "brute-force")


@dataclass(frozen=True)
class SolveRequest:
    solver: str = "auto"
    fix: str | None = None
    max_solve_time_s: float = 30.0
    seed: int = 1
    workers: int = 1


def limits_for(inst: Instance) -> Limits:
    o = inst.objective
    per_h = o.budget.usd if (o.budget and o.budget.per == "h") else None
    per_step = o.budget.usd if (o.budget and o.budget.per == "step") else None
    if o.kind == "min-cost" and o.budget is not None:
        raise InputError("min-cost minimises the budget itself; drop --budget or use --objective min-time",
                         field="budget")
    return Limits("min-cost" if o.kind == "min-cost" else "min-time", o.time_limit_s, per_h, per_step)


def run(inst: Instance, req: SolveRequest, limits: Limits | None = None, progress=None,
        prepared=None) -> SolveResult:
    """One exact solve; `prepared` (driver.prepare) reuses configs and coefficients across solves."""
    if req.solver not in SOLVERS:
        raise InputError(f"unknown solver '{req.solver}'; use {', '.join(SOLVERS)}", field="solver")
    if req.max_solve_time_s <= 0:
        raise InputError("must be > 0, e.g. 30s", field="max-solve-time")
    if req.workers < 1:
        raise InputError(f"must be >= 1 (1 is deterministic), got {req.workers}", field="workers")
    limits = limits or limits_for(inst)
    fix = parse_fix(req.fix)
    if req.solver == "brute-force":
        from milp_plan.solvers.bruteforce import solve as brute
        result = brute(inst, limits, fix=fix, mode=inst.objective.mode)
    else:
        backend = "cpsat" if req.solver == "auto" else req.solver
        result = exact_solve(inst, limits, backend=backend, fix=fix, time_limit_s=req.max_solve_time_s, seed=req.seed,
                             workers=req.workers, mode=inst.objective.mode, progress=progress, prepared=prepared)
    if result.plan is not None:  # the filled profile points it rests on (only with extrapolate=on)
        result.plan = result.plan.with_(profile_fills=plan_fills(inst, result.plan))
    return result


def diagnose(inst: Instance, req: SolveRequest, limits: Limits, result: SolveResult) -> str:
    """Plain words, with numbers: which constraint makes the instance infeasible."""
    if result.status == "timeout":
        return (f"no plan found within --max-solve-time {req.max_solve_time_s:g}s "
                f"({result.configs_solved} of {result.configs_total} configurations examined); allow more time")
    relaxed = Limits("min-time")
    if limits != relaxed:
        free = run(inst, req, relaxed)
        if free.plan is not None:
            p = free.plan.predicted
            parts = []
            if limits.time_limit_s is not None and p.step_time_s > limits.time_limit_s:
                parts.append(f"the fastest plan takes {format_duration(p.step_time_s)}/step, more than the "
                             f"--time-limit {format_duration(limits.time_limit_s)}/step")
            cheapest = run(inst, req, Limits("min-cost"))
            cp = cheapest.plan.predicted if cheapest.plan else p
            if limits.budget_usd_per_hour is not None:
                parts.append(f"the cheapest plan rents {cp.usd_per_hour:.2f} $/h against a budget of "
                             f"{limits.budget_usd_per_hour:.2f} $/h" if cp.usd_per_hour > limits.budget_usd_per_hour
                             else "no plan meets the time limit and the hourly budget together")
            if limits.budget_usd_per_step is not None:
                parts.append(f"the cheapest plan costs {cp.usd_per_step:.4f} $/step against a budget of "
                             f"{limits.budget_usd_per_step:.4f} $/step" if cp.usd_per_step > limits.budget_usd_per_step
                             else "no plan meets the time limit and the per-step budget together")
            if limits.time_limit_s is not None and not parts:
                parts.append("no plan meets all limits together")
            return "; ".join(parts) if parts else "no plan meets the limits"
    return _memory_diagnosis(inst)


def _memory_diagnosis(inst: Instance) -> str:
    """The smallest per-GPU memory a plan needs (most sharding, full recompute) vs the largest GPU."""
    from milp_plan.formulations.coefficients import Coefficients
    from milp_plan.formulations.space import enumerate_configs
    best = None
    for cfg in enumerate_configs(inst, {"mbs": 1, "recompute": "full", "schedule": "1f1b"}):
        coef = Coefficients(inst, cfg)
        n = math.ceil(inst.model.num_layers / cfg.pp)
        for k in range(len(coef.options)):
            need = max(coef.memory(k, s)(n if s else max(1, n), 1) for s in range(cfg.pp))
            if best is None or need < best[0]:
                best = (need, cfg, k)
    cap = max(nt.memory_gib * (1 - inst.job.memory_headroom) for nt in inst.cluster.node_types)
    if best is None:
        return "no tp/dp/pp combination fits the cluster's GPU counts"
    need, cfg, k = best
    return (f"the smallest per-GPU memory any plan needs is {need / 2**30:.1f} GiB ({cfg.label()}, "
            f"full recompute, micro-batch 1) but the largest GPU offers {cap:.1f} GiB after the "
            f"{inst.job.memory_headroom:.0%} headroom; use more GPUs, a smaller model or a shorter sequence")


def require_plan(inst: Instance, req: SolveRequest, limits: Limits, result: SolveResult):
    if result.plan is None:
        raise Infeasible(diagnose(inst, req, limits, result))
    return result.plan
