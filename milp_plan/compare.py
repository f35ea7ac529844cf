"""Planners side by side on one instance, scored by one cost model, checker and simulator.

Every planner of the registry (planners.py) runs on the same instance and limits with the
same time limit (wall clock, or deterministic work: deadline.py); its plan, if any, is then judged by what judges every plan: the checker
(structure and memory), `Limits.admit` (the limits, by the cost model's numbers) and the
event-by-event simulator. The gap of a planner is measured against the best proven bound
of the instance, the largest `best_bound` any proving planner returned (each is a lower
bound on the optimum of the same model; brute force's is its optimum):

    gap = (objective - best bound) / objective          (result.relative_gap)

so an exact planner that proved its optimum shows gap 0 and a heuristic shows how far its
plan is from the optimum, or at most how far when no planner proved it. A heuristic plan
better than a proven optimum would expose a bug in one of them: `Comparison.violations`
lists such rows.
"""
from __future__ import annotations

import csv
import io
import math
import time
from dataclasses import asdict, dataclass
from typing import Sequence

from milp_plan import check, planners, predict
from milp_plan.deadline import Deadline
from milp_plan.errors import InputError
from milp_plan.instance import Instance
from milp_plan.job import Job, Limits
from milp_plan.plan import Plan
from milp_plan.result import Status, objective_of, relative_gap

DEFAULT_PLANNERS = ("cpsat", "warm-start")
REL_EPS = 1e-9


@dataclass(frozen=True)
class Row:
    planner: str
    proves: bool                 # the planner's `optimal` is a proof over the whole space
    status: str                  # its own status: optimal | feasible | infeasible | timeout
    objective: float | None      # s/step (min-time) or $/step (min-cost), from the cost model
    step_time_s: float | None
    usd_per_step: float | None
    usd_per_hour: float | None
    gpus: int | None
    simulated_step_s: float | None   # None: no plan, or too large to simulate event by event
    valid: bool | None           # the checker accepts the plan and the limits admit it (None: no plan)
    best_bound: float | None     # the planner's own proven bound (None: it proves nothing)
    gap: float | None            # to the instance's best proven bound
    search_s: float              # wall time of its run
    work: float = 0.0            # work units its run charged (deadline.py)


@dataclass(frozen=True)
class Comparison:
    objective: str
    time_limit_s: float
    best_bound: float | None     # the largest proven bound of any planner (math.inf: proven no plan)
    rows: tuple[Row, ...]
    work_limit: float | None = None   # the same work budget for every planner (None: wall clock only)

    @property
    def violations(self) -> list[str]:
        """Rows that contradict a proof: a valid plan better than the best proven bound, or a
        plan where a planner proved there is none."""
        out = []
        for r in self.rows:
            if r.objective is None or not r.valid or self.best_bound is None:
                continue
            if r.objective < self.best_bound * (1 - 1e-6):
                out.append(f"{r.planner}: objective {r.objective:.6g} below the proven bound {self.best_bound:.6g}")
        return out

    def to_dict(self) -> dict:
        bound = None if self.best_bound is None else (None if math.isinf(self.best_bound) else self.best_bound)
        return {"objective": self.objective, "time_limit_s": self.time_limit_s, "work_limit": self.work_limit,
                "best_bound": bound,
                "proven_infeasible": self.best_bound is not None and math.isinf(self.best_bound),
                "rows": [asdict(r) for r in self.rows]}

    def to_csv(self) -> str:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(Row.__dataclass_fields__), lineterminator="\n")
        writer.writeheader()
        writer.writerows(asdict(r) for r in self.rows)
        return buf.getvalue()


def _gap(objective: float | None, bound: float | None) -> float | None:
    if objective is None or bound is None or math.isinf(bound):
        return None
    return relative_gap(objective, bound)


def compare(inst: Instance, limits: Limits, names: Sequence[str] = DEFAULT_PLANNERS, *, time_limit_s: float = 30.0,
            seed: int = 1, fix: dict | None = None, plans: Sequence[tuple[str, Plan]] = (),
            work_limit: float | None = None) -> Comparison:
    """Run each named planner (planners.get: an unknown name is an InputError, before any run),
    then score each given plan (`plans`: (label, Plan), e.g. another planner's plan imported
    with `import-plan`) the same way, as a row 'plan:LABEL' that proves nothing. Each run gets
    `time_limit_s` of wall clock and, when given, `work_limit` work units (deadline.py): with a
    work limit and an ample wall clock the comparison is the same on any machine."""
    chosen = [(name, planners.get(name)) for name in names]
    check_work_limit(names, work_limit)
    runs = []
    for name, planner in chosen:
        t0, dl = time.perf_counter(), Deadline(time_limit_s, work=work_limit)
        result = planner.plan(inst, limits, dl, fix=fix, seed=seed)
        result.work = dl.work_used()
        runs.append((name, planner, result, time.perf_counter() - t0))
    bounds = []
    for _, planner, result, _ in runs:
        if planner.proves and result.status is Status.INFEASIBLE:
            bounds.append(math.inf)
        elif planner.proves and result.best_bound is not None:
            bounds.append(result.best_bound)
    best = max(bounds) if bounds else None
    rows = [_row(inst, limits, name, planner.proves, str(result.status), result.plan, result.best_bound, best, wall,
                 result.work) for name, planner, result, wall in runs]
    for label, plan in plans:  # scored afresh; a plan whose structure the checker rejects keeps its record
        fresh = plan if check.check_structure(inst, plan) else plan.with_(predicted=predict.evaluate(inst, plan))
        rows.append(_row(inst, limits, f"plan:{label}", False, "given", fresh, None, best, 0.0))
    return Comparison(limits.objective, time_limit_s, best, tuple(rows), work_limit)


def check_work_limit(names: Sequence[str], work_limit: float | None) -> None:
    """A work limit needs planners that measure their work (planners.Planner.deterministic)."""
    if work_limit is None:
        return
    if not 0 < work_limit < math.inf:
        raise InputError(f"must be a positive number of work units (about seconds), got {work_limit:g}",
                         field="work-limit")
    blind = [n for n in names if not planners.get(n).deterministic]
    if blind:
        raise InputError(f"{', '.join(blind)} cannot measure work (no deterministic time); drop "
                         f"{'it' if len(blind) == 1 else 'them'} from --planners or use --max-solve-time alone",
                         field="work-limit")


def _row(inst: Instance, limits: Limits, name: str, proves: bool, status: str, plan: Plan | None,
         own_bound: float | None, best: float | None, wall: float, work: float = 0.0) -> Row:
    """One planner's (or one given plan's) row: its plan judged by the cost model, the checker,
    the limits and the simulator, its gap to the instance's best proven bound."""
    from milp_plan.verify import SimulationCheck, simulation_check
    if plan is None:
        return Row(name, proves, status, None, None, None, None, None, None, None, own_bound, None, wall, work)
    p = plan.predicted
    sim = simulation_check(inst, plan) if not check.check_structure(inst, plan) else None
    valid = not check.check_plan(inst, plan) and limits.admit(plan)
    objective = objective_of(plan, limits)  # the cost model's number, whatever the planner said
    return Row(name, proves, status, objective, p.step_time_s, p.usd_per_step, p.usd_per_hour, plan.num_gpus,
               sim.step_time_s if isinstance(sim, SimulationCheck) else None, valid, own_bound,
               _gap(objective, best) if valid else None, wall, work)


def same_instance(inst: Instance, plan: Plan, source: str) -> None:
    """A given plan must have been made for this instance: the cluster, model and job it
    records are this instance's (else its devices and times mean something else)."""
    rec = plan.inputs or {}
    for what, obj in (("cluster", inst.cluster), ("model", inst.model)):
        got = (rec.get(what) or {}).get("sha256")
        if got != obj.content_hash():
            name = (rec.get(what) or {}).get("name", "?")
            raise InputError(f"the plan was made for {what} '{name}', not this compare's '{obj.name}' (or an edited "
                             f"copy); give the plan's --{what} (and job flags) or leave them out to use the plan's",
                             source=source, field=f"inputs.{what}")
    job = rec.get("job")
    try:   # a plan written before a job field existed records it by its default
        job = Job.from_dict(job).to_dict()
    except (InputError, TypeError, AttributeError):
        pass
    if job != inst.job.to_dict():
        diff = next((k for k in inst.job.to_dict() if (job or {}).get(k) != inst.job.to_dict()[k]), "job")
        raise InputError(f"the plan was made for {diff} = {(job or {}).get(diff)!r}, this compare has "
                         f"{inst.job.to_dict()[diff]!r}; give the plan's job flags or leave them out",
                         source=source, field=f"inputs.job.{diff}")
