"""Planners behind one protocol: `plan(instance, limits, deadline, ...) -> SolveResult`.

Every planner scores its plans with the same cost model and returns them through the same
checker (`Limits.admit` and `check`); what differs is how it searches and what it proves:

  cpsat, highs, cbc  the exact search (solvers/driver.py) on one backend-neutral per-stage
                     model (formulations/pipeline.py): optimal or an honest gap.
  brute-force        every plan of the space enumerated (solvers/bruteforce.py): small
                     instances only, optimal by enumeration; the exact search's cross-check.
  warm-start         the exact search's starting heuristic on its own (heuristics/warmstart.py):
                     greedy device grouping and a bottleneck-optimal layer partition per
                     config, configs in the order of their cheap bound until a bound reaches
                     the best plan found; no bound (status feasible), Megatron-mode configs only.
  aceso              Aceso-style iterative bottleneck alleviation (heuristics/aceso.py): multi-hop
                     actions on the bottleneck stage from warm-start plans, per pp; no bound
                     (status feasible), in the instance's mode, 1F1B only.
  fasop              FASOP-style exhaustive search (heuristics/fasop.py): uniform (tp, dp, pp, mbs) x
                     node-type orders with node counts, FASOP's min-max layer partition, the cheapest
                     recompute that fits; no bound (status feasible), Megatron-mode plans, 1F1B only.
  metis              Metis-style search (heuristics/metis.py): node sequences x device groups (its
                     scale-variance and permutation-length pruning) x micro-batch counts, its greedy
                     per-stage (dp, tp) search and layer load balancer; no bound (status feasible),
                     in the instance's mode (megatron: uniform tp and dp), 1F1B only.

`PLANNERS` is the registry; `get(name)` resolves `auto` to cpsat. A planner is
`deterministic` when it charges its work to the deadline (deadline.py), so that a work limit
stops it at the same point on any machine: all but highs and cbc.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from milp_plan.deadline import WORK, Deadline
from milp_plan.errors import InputError
from milp_plan.instance import Instance
from milp_plan.job import Limits
from milp_plan.plan import SolverRecord
from milp_plan.result import Progress, SolveResult, Status, objective_of


class Planner(Protocol):
    name: str
    proves: bool          # whether its `optimal` is a proof over the whole space
    deterministic: bool   # whether it honours a work limit (deadline.py): the same answer on any machine

    def plan(self, inst: Instance, limits: Limits, deadline: Deadline, *, fix: dict | None = None,
             seed: int = 1, workers: int = 1, progress: Callable[[Progress], None] | None = None,
             prepared=None) -> SolveResult: ...


def _heuristic_result(name: str, best, limits: Limits, seed: int, deadline: Deadline, total: int, done: int,
                      notes: list[str], pruned: int = 0, ruled_out: int = 0) -> SolveResult:
    """A heuristic's answer: its best plan, feasible and unproven (no bound, no gap), with its
    solver record; timeout when it found none."""
    obj = None if best is None else objective_of(best, limits)
    if best is not None:
        best = best.with_(solver=SolverRecord(name, Status.FEASIBLE.value, obj, None, None, None, seed))
    return SolveResult(Status.FEASIBLE if best is not None else Status.TIMEOUT, obj, None, None, deadline.elapsed(),
                       seed, name, best, configs_total=total, configs_solved=done, configs_pruned=pruned,
                       configs_ruled_out=ruled_out, heuristic_objective=obj, notes=notes)


@dataclass(frozen=True)
class ExactPlanner:
    backend: str
    proves: bool = True

    @property
    def name(self) -> str:
        return self.backend

    @property
    def deterministic(self) -> bool:
        """CP-SAT measures its work (deterministic time); HiGHS and CBC have no such measure."""
        from milp_plan.solvers.backends import DETERMINISTIC_BACKENDS
        return self.backend in DETERMINISTIC_BACKENDS

    def plan(self, inst, limits, deadline, *, fix=None, seed=1, workers=1, progress=None, prepared=None):
        from milp_plan.solvers.driver import solve
        return solve(inst, limits, backend=self.backend, fix=fix, seed=seed, workers=workers,
                     mode=inst.objective.mode, progress=progress, prepared=prepared, dl=deadline)


@dataclass(frozen=True)
class BruteForcePlanner:
    name: str = "brute-force"
    proves: bool = True
    deterministic: bool = True

    def plan(self, inst, limits, deadline, *, fix=None, seed=1, workers=1, progress=None, prepared=None):
        from milp_plan.solvers.bruteforce import solve
        return solve(inst, limits, fix=fix, mode=inst.objective.mode)


@dataclass(frozen=True)
class WarmStartPlanner:
    name: str = "warm-start"
    proves: bool = False
    deterministic: bool = True

    def plan(self, inst, limits, deadline, *, fix=None, seed=1, workers=1, progress=None, prepared=None):
        """Every Megatron-mode config in the order of its cheap lower bound (the exact search's
        order), the heuristic's best plan of each, until the deadline or the last config."""
        from milp_plan.heuristics.warmstart import best_plan
        from milp_plan.solvers.bounds import config_lower_bound
        from milp_plan.solvers.driver import prepare as prepare_configs
        prep = prepared if prepared is not None and prepared.mode == "megatron" else \
            prepare_configs(inst, fix, "megatron", deadline)
        order, ruled_out = [], 0
        for i in range(len(prep.configs)):
            if deadline.expired():
                break
            lb = config_lower_bound(prep.coef(i), limits, memory=False)
            deadline.charge(WORK.bound)
            if lb is not None:
                order.append((lb, i))
            else:
                ruled_out += 1   # no plan fits memory and the limits
        order.sort()
        best, seen, pruned = None, 0, 0
        for k, (lb, i) in enumerate(order):
            if deadline.expired():
                break
            if best is not None and lb >= objective_of(best, limits):
                pruned = len(order) - k   # no plan of the configs left can beat the best found (their bounds say so)
                break
            seen += 1
            got = best_plan(prep.coef(i), limits, deadline)
            if got is not None and (best is None or objective_of(got[0], limits) < objective_of(best, limits)):
                best = got[0]
        notes = [] if not deadline.expired() else [f"the deadline stopped the heuristic after {seen} configurations"]
        return _heuristic_result(self.name, best, limits, seed, deadline, len(prep.configs), seen, notes, pruned,
                                 ruled_out)


@dataclass(frozen=True)
class AcesoPlanner:
    name: str = "aceso"
    proves: bool = False
    deterministic: bool = True
    max_hops: int = 7
    trials: int = 3

    def plan(self, inst, limits, deadline, *, fix=None, seed=1, workers=1, progress=None, prepared=None):
        from milp_plan.formulations.space import LIST_KEYS
        from milp_plan.heuristics.aceso import search
        if fix and LIST_KEYS & set(fix):
            raise InputError("aceso moves layers and GPUs itself: it takes no layers= or order= pins; use an "
                             "exact solver (--solver cpsat) to score a pinned layout", field="fix")
        sx = search(inst, limits, deadline, fix, seed, self.max_hops, self.trials)
        done, total = sx.depths
        notes = [f"aceso: {sx.evaluated} plans evaluated over {done} of {total} pipeline depths"]
        if done < total:
            notes.append("the deadline stopped the search before every pipeline depth was tried")
        return _heuristic_result(self.name, sx.best, limits, seed, deadline, total, done, notes)


def _node_sequence_result(name: str, out, limits: Limits, seed: int, deadline: Deadline,
                          notes: list[str]) -> SolveResult:
    """The answer of a search over node sequences (fasop, metis): its best plan, and a note
    when the deadline stopped it before the last sequence."""
    if out.sequences_done < out.sequences_total:
        notes = notes + ["the deadline stopped the search before every node sequence was tried"]
    return _heuristic_result(name, out.best, limits, seed, deadline, out.sequences_total, out.sequences_done, notes)


@dataclass(frozen=True)
class FasopPlanner:
    name: str = "fasop"
    proves: bool = False
    deterministic: bool = True

    def plan(self, inst, limits, deadline, *, fix=None, seed=1, workers=1, progress=None, prepared=None):
        """FASOP's exhaustive search (heuristics/fasop.py); deterministic, so the seed is only recorded."""
        from milp_plan.heuristics.fasop import search
        out = search(inst, limits, deadline, fix)
        notes = [f"fasop: {out.evaluated} plans evaluated over {out.sequences_done} of {out.sequences_total} node "
                 f"sequences; {out.skipped} (node sequence, tp, dp) layouts skipped: a stage would span two GPU "
                 "types or part of two nodes, outside milp-plan's plan format"]
        return _node_sequence_result(self.name, out, limits, seed, deadline, notes)


@dataclass(frozen=True)
class MetisPlanner:
    name: str = "metis"
    proves: bool = False
    deterministic: bool = True
    scale_variance: float = 0.5   # Metis's defaults (heuristics/metis.py)
    max_permute_len: int = 4

    def plan(self, inst, limits, deadline, *, fix=None, seed=1, workers=1, progress=None, prepared=None):
        """Metis's search (heuristics/metis.py); deterministic, so the seed is only recorded."""
        from milp_plan.heuristics.metis import search
        out = search(inst, limits, deadline, fix, self.scale_variance, self.max_permute_len)
        notes = [f"metis: {out.evaluated} plans evaluated over {out.sequences_done} of {out.sequences_total} node "
                 f"sequences; {out.skipped} device groups skipped: a stage would mix GPU types or span part of two "
                 f"nodes, outside milp-plan's plan format; {out.outside} skipped as outside the exact planners' "
                 "space: a node type's stages of two sizes"]
        return _node_sequence_result(self.name, out, limits, seed, deadline, notes)


PLANNERS: dict[str, Planner] = {p.name: p for p in (ExactPlanner("cpsat"), ExactPlanner("highs"),
                                                     ExactPlanner("cbc"), BruteForcePlanner(), WarmStartPlanner(),
                                                     AcesoPlanner(), FasopPlanner(), MetisPlanner())}
NAMES = ("auto", *PLANNERS)


def get(name: str) -> Planner:
    """The planner of `--solver NAME` (auto: cpsat)."""
    planner = PLANNERS.get("cpsat" if name == "auto" else name)
    if planner is None:
        raise InputError(f"unknown solver '{name}'; use {', '.join(NAMES)}", field="solver")
    return planner
