"""What a planner returns (SolveResult, with a Status) and the objective a plan scores."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from milp_plan.job import Limits
from milp_plan.plan import Plan


# `optimal`: no plan is better by more than this (relative), the default relative MIP gap of
# CPLEX, Gurobi and HiGHS; what remains is the integer models' rounding (pipeline.md)
PROOF_TOL = 1e-4


class Status(enum.StrEnum):
    OPTIMAL = "optimal"        # proven within PROOF_TOL of the best plan of the stated model
    FEASIBLE = "feasible"      # a plan, with an honest gap
    INFEASIBLE = "infeasible"  # proven: no plan meets the limits
    TIMEOUT = "timeout"        # no plan found, nothing proven


@dataclass
class Progress:
    elapsed_s: float
    incumbent: float | None
    bound: float | None
    done: int
    total: int


@dataclass
class SolveResult:
    """What a planner returns: the best plan found (or None) and what is proven about it."""
    status: Status
    # objective: the plan's (min-time: s/step; min-cost: $/step); best_bound: proven at most the optimum
    objective: float | None
    best_bound: float | None
    gap: float | None
    wall_time_s: float
    seed: int
    backend: str
    plan: Plan | None
    # what became of the configs searched (driver._solve): solved, pruned by a bound at or above the
    # incumbent, ruled out by a bound (no plan fits memory and the limits), opened into children
    # (free mode's parents); the rest of configs_total were left open by a search cut short
    configs_total: int = 0
    configs_solved: int = 0
    configs_pruned: int = 0
    heuristic_objective: float | None = None   # the starting incumbent, before the exact search
    start: str = "heuristic"                   # where it came from: heuristic | Megatron-mode
    notes: list[str] = field(default_factory=list)
    work: float = 0.0                          # work units spent (deadline.py), set by whoever ran it
    configs_ruled_out: int = 0
    configs_opened: int = 0

    @property
    def configs_examined(self) -> int:
        """The configs the search settled one way or another (the others were left open)."""
        return self.configs_solved + self.configs_pruned + self.configs_ruled_out + self.configs_opened

    def __post_init__(self) -> None:
        self.status = Status(self.status)


def objective_of(plan: Plan, limits: Limits) -> float:
    """The objective recomputed from the plan alone (the checker's numbers, not the solver's)."""
    return plan.predicted.usd_per_step if limits.objective == "min-cost" else plan.predicted.step_time_s


def relative_gap(objective: float, bound: float) -> float:
    """How far a plan's objective may lie above the optimum, given a proven lower bound:
    (objective - bound) / objective, at least 0 (the gap every planner and `compare` report)."""
    return max(0.0, (objective - bound) / max(abs(objective), 1e-12))
