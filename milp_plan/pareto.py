"""`--objective pareto`: the exact front of step time against dollars per step.

Epsilon-constraint sweep with lexicographic solves, each one exact (solvers/driver.py):

1. T_i = min step time subject to $/step <= (1 - NEXT_POINT_REL) C_{i-1} (no limit for i = 1);
2. C_i = min $/step subject to step time <= T_i, so the point is not weakly dominated;
3. repeat with $/step <= (1 - NEXT_POINT_REL) C_i until no plan remains.

Every limit is checked on the cost model's numbers (the integer models are relaxations,
their plans checked and cut off when over a limit). So every point is a proven optimum of
both solves: no plan dominates it, a non-dominated plan between two consecutive points
costs within NEXT_POINT_REL of the dearer one (a tie within a tenth of the solves' proof
tolerance, PROOF_TOL, which `optimal` already allows), each point is strictly faster
or strictly cheaper than its neighbours, and none repeats. The front is `complete` only when
every solve was proven optimal and the last min-time solve proved that no cheaper plan exists.

Why not "<" exactly (the largest float below C_{i-1}): the models round $/step (about 1e-6
relative on FASOP's instance), so a budget one float below C_{i-1} admits, in the model, the
last point and each of its twins (other layer splits of the same time and price); each came
back over the budget and was cut off one at a time, until a config ran out of cuts
(driver.MAX_CUTS) and stayed open: the front of tests/benchmarks/bench_pareto.py was never
complete (its second min-time solve ended `feasible`, 37 cuts in the sweep; with 400 cuts
allowed it was proven after 169, at 2.4 times that solve's CPU). With the margin the front is
proven with no cut at all.

The solves share one driver.Prepared (configs and coefficients) and what each proved:

- every plan a solve found (Prepared.found) is a plan of every later problem whose limits
  admit it, so the best of those is a later solve's first incumbent (the min-cost solve
  starts from the min-time plan just found, at the latest);
- a config's lower bound proven under some limits (Prepared.proven) holds under limits that
  admit no more plans and minimise the same (driver.within): the min-time solves' budgets
  only shrink, so each min-time solve skips the configs an earlier one proved no better
  than its incumbent, without building their models;
- a min-time solve's bound on a config above the next min-cost solve's time limit T_i
  (strictly: a plan at exactly the bound may exist) proves the config has no plan there
  (Prepared.too_slow).

Under a $/step budget each solve also prunes by what a config's GPUs cost at least
(bounds.budget_bound) and by what the budget leaves of its dearest GPUs (a stage count on
them, bounds.coupled_budget_bound), its heuristic start skips configs those refute and
candidates whose GPUs cost more than the budget allows (driver.heuristic_start,
warmstart.over_price); a solve records what its bounds proved of the configs it did not
solve (the heap at the stop, every config a full bound pruned), for the solves after it.

Both only prune or seed; every point is still each solve's proven optimum.
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field

from milp_plan import planners
from milp_plan.errors import Infeasible, InputError
from milp_plan.job import Limits
from milp_plan.instance import Instance
from milp_plan.plan import Plan
from milp_plan.result import PROOF_TOL

MAX_POINTS = 200
NEXT_POINT_REL = PROOF_TOL / 10   # the next point costs at least this much less (relative) than the last


@dataclass
class Front:
    points: list[Plan]
    complete: bool          # every solve proven optimal, and the end proven (no cheaper plan)
    wall_time_s: float
    solves: list = field(default_factory=list)   # each solve's SolveResult, in order (benchmarks print them)


def pareto_front(inst: Instance, req) -> Front:
    from milp_plan import solve as solving
    from milp_plan.formulations.space import parse_fix
    from milp_plan.solvers.driver import prepare
    import time
    t0 = time.perf_counter()
    exact = isinstance(planners.get(req.solver), planners.ExactPlanner)  # reuses configs and coefficients
    prepared = prepare(inst, solving.job_fix(inst, parse_fix(req.fix)), inst.objective.mode, sweep=True) if exact else None
    points: list[Plan] = []
    solves = []
    below: float | None = None  # the next point costs at least NEXT_POINT_REL less than this
    proven = True
    ended = False
    while len(points) < MAX_POINTS:
        budget = None if below is None else below * (1 - NEXT_POINT_REL)
        fastest = solving.run(inst, req, Limits("min-time", budget_usd_per_step=budget), prepared=prepared)
        solves.append(fastest)
        if fastest.plan is None:
            ended = fastest.status == "infeasible"
            break
        t = fastest.plan.predicted.step_time_s
        cheapest = solving.run(inst, req, Limits("min-cost", time_limit_s=t, budget_usd_per_step=budget),
                               prepared=prepared)
        solves.append(cheapest)
        plan = cheapest.plan or fastest.plan
        proven &= fastest.status == "optimal" and cheapest.status == "optimal"
        # each plan costs strictly less than the last point; one that is no slower dominates it
        # (possible within the solves' proof tolerance, driver.PROOF_TOL): the last point goes
        while points and plan.predicted.step_time_s <= points[-1].predicted.step_time_s:
            points.pop()
        points.append(plan)
        below = plan.predicted.usd_per_step
    return Front(points, proven and ended, time.perf_counter() - t0, solves)


def _per_stage(plan: Plan, attr: str):
    """The stages' common value, or (free mode) each stage's, comma-separated."""
    return getattr(plan.stages[0], attr) if plan.uniform(attr) else ",".join(str(getattr(s, attr)) for s in plan.stages)


def front_rows(front: Front) -> list[dict]:
    rows = []
    for p in front.points:
        pr = p.predicted
        rows.append({
            "step_time_s": pr.step_time_s, "usd_per_step": pr.usd_per_step, "usd_per_hour": pr.usd_per_hour,
            "tokens_per_s": pr.tokens_per_s, "gpus": p.num_gpus, "pp": p.pp, "tp": _per_stage(p, "tp"),
            "dp": _per_stage(p, "dp"), "micro_batch_size": _per_stage(p, "micro_batch_size"), "schedule": p.schedule,
            "vpp": p.vpp, "recompute": _per_stage(p, "recompute"),
            "stages": " ".join(f"{s.gpu}:{s.num_layers}" for s in p.stages),
        })
    return rows


def check_request(inst: Instance, plot: str | None) -> None:
    """InputError before any work: pareto sets its own limits; --plot needs matplotlib."""
    if inst.objective.time_limit_s is not None or inst.objective.budget is not None:
        raise InputError("pareto explores every trade-off; drop --time-limit and --budget", field="objective")
    if plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise InputError('--plot needs matplotlib: pip install "milp-plan[plot]"', field="plot") from None


def front_document(front: Front) -> dict:
    """pareto.json: the rows (front_rows) and each point's whole plan."""
    if not front.points:
        raise Infeasible("no plan fits the cluster at all (see `milp-plan solve` for the diagnosis)")
    return {"objective": "pareto", "complete": front.complete, "points": front_rows(front),
            "plans": [p.to_dict() for p in front.points]}


def output_paths(out: str) -> tuple[str, str]:
    """(JSON, CSV) paths of a sweep written to `out`."""
    json_path = out if out.endswith(".json") else out + ".json"
    return json_path, json_path[:-5] + ".csv"


def front_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def front_png(rows: list[dict]) -> bytes:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    xs = [r["step_time_s"] for r in rows]
    ys = [r["usd_per_step"] for r in rows]
    ax.step(xs, ys, where="post", color="0.6", linewidth=1)
    ax.scatter(xs, ys, zorder=3)
    for r in rows:
        ax.annotate(f"{r['gpus']} GPUs", (r["step_time_s"], r["usd_per_step"]), textcoords="offset points",
                    xytext=(4, 4), fontsize=7)
    ax.set_xlabel("step time (s)")
    ax.set_ylabel("cost ($/step)")
    ax.set_title("Pareto front: step time vs cost")
    ax.grid(True, alpha=0.3)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()
