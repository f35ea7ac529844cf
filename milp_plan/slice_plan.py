"""`milp-plan solve --slices auto|N|off`: token slicing (TeraPipe) as a planner decision.

off (the default)  nothing changes: the plan is the exact search's, byte for byte.
N (>= 2)           the exact search runs on the GPipe schedule (TeraPipe's; `schedule=gpipe` is
                   pinned), then every sequence of its best plan is cut into exactly N slices.
auto               the exact search runs as asked (plan A) and on the GPipe schedule alone
                   (plan G); G's sequences are cut into the best slicing of every count
                   1..U; the sliced plan is written only when its objective beats A's,
                   and the reason is given either way.

The slicing of a plan (`slice_candidates`): sequences are cut at U = slicing.units_for(L)
token units; for each count c, slicing.best_slices gives the slicing that minimises
TeraPipe's step J = m sum_k t_k + (pp - 1) max_k t_k exactly (t_k = the slowest stage's
forward + backward on slice k, costmodel.stage_slice_times), and the candidate whose
predicted step (predict.evaluate: the simulated sliced step, or the sliced closed form) is
least wins.

What is proven, and what is not (formulations/pipeline.md, "Token slices"): the slicing DP
is exact for J on the plan's stages; J is the makespan only at equal stages; and the plan's
stages, layers, tp, dp and micro-batch count were proven optimal for the *unsliced* step,
which is not a monotone function of the sliced one (slicing rewards fewer micro-batches and
other stage balances). So a sliced plan is written with status `feasible`, no bound and no
gap, never `optimal`.

Memory: a sliced plan holds what unsliced GPipe holds (every slice of every sequence in
flight is live until its backward, with the K/V of the earlier slices): slicing relieves the
bubble, not activation memory; the plan is charged GPipe's activation memory.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from milp_plan import costmodel, predict
from milp_plan.errors import InputError
from milp_plan.instance import Instance
from milp_plan.job import Limits
from milp_plan.plan import Plan, SolverRecord
from milp_plan.result import SolveResult, Status, objective_of
from milp_plan.schedules import TOKEN_SLICED, schedule_of
from milp_plan.slicing import best_slices, units_for

OFF, AUTO = "off", "auto"
MEMORY_NOTE = ("slicing relieves the bubble, not activation memory: every slice of every sequence in flight stays "
               "live until its backward (GPipe-like order), so the plan is charged unsliced GPipe's activations")
NOT_PROVEN = ("status feasible, not optimal: each slice count's slicing is the exact optimum of TeraPipe's step "
              "(exact at equal stages) on this plan's stages, but the stages, tp, dp and micro-batches were proven "
              "best for the unsliced step only (formulations/pipeline.md, 'Token slices')")


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
            f, b = costmodel.stage_slice_times(inst, nts[s], st, plan.pp, s, [(j - i) * unit] if i == 0 else
                                               [i * unit, (j - i) * unit])
            best = max(best, f[-1] + b[-1])
        return best
    return t


def slice_candidates(inst: Instance, plan: Plan, limits: Limits, count: int | None = None) -> list[Candidate]:
    """The best slicing of `plan` (a GPipe plan) for each count (or for `count` alone), each
    evaluated; sorted by objective, then fewer slices."""
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
    for c in ([count] if count is not None else range(1, units + 1)):
        s = best_slices(units, t, plan.pp, plan.num_microbatches, count=c)
        tokens = tuple(n * unit for n in s.lengths) if c > 1 else ()
        cand = plan.with_(slices=tokens, mode="free" if tokens else plan.mode, predicted=None, solver=None)
        cand = cand.with_(predicted=predict.evaluate(inst, cand))
        out.append(Candidate(c, tokens, cand, objective_of(cand, limits)))
    out.sort(key=lambda k: (k.objective, k.count))
    return out


def _sliced_result(base: SolveResult, cand: Candidate, extra: list[str]) -> SolveResult:
    rec = SolverRecord(base.backend, Status.FEASIBLE.value, cand.objective, None, None, None, base.seed)
    return replace(base, status=Status.FEASIBLE, objective=cand.objective, best_bound=None, gap=None,
                   plan=cand.plan.with_(solver=rec, inputs=base.plan.inputs, profile_fills=base.plan.profile_fills),
                   notes=[*base.notes, *extra, NOT_PROVEN, MEMORY_NOTE])


def _gpipe_fix(fix: str | None) -> str:
    from milp_plan.formulations.space import parse_fix
    pinned = parse_fix(fix).get("schedule")
    if pinned is not None and not schedule_of(str(pinned)).runs_slices:
        raise InputError(f"--fix schedule={pinned} contradicts token slices (they run under {TOKEN_SLICED}); "
                         "drop one", field="slices")
    pin = f"schedule={TOKEN_SLICED}"
    return fix if pinned else (f"{fix},{pin}" if fix else pin)


def solve_with_slices(inst: Instance, req, limits: Limits, setting: str | int, progress=None
                      ) -> tuple[SolveResult, str]:
    """The solve under --slices (module docstring): (result to write, one-line decision)."""
    from milp_plan import solve as solving
    if setting == OFF:
        return solving.run(inst, req, limits, progress=progress), ""
    greq = replace(req, fix=_gpipe_fix(req.fix))
    if isinstance(setting, int):
        g = solving.run(inst, greq, limits, progress=progress)
        if g.plan is None:
            return g, "token slices: no GPipe plan to slice"
        cand = slice_candidates(inst, g.plan, limits, count=setting)[0]
        if not limits.admit(cand.plan):
            from milp_plan.errors import Infeasible
            raise Infeasible(f"--slices {setting}: the best GPipe plan cut into {setting} slices "
                             f"({cand.plan.predicted.step_time_s:.4g} s/step) breaks the limits; try --slices auto")
        return (_sliced_result(g, cand, []),
                f"token slices: {setting} slices {list(cand.slices)} tokens; step "
                f"{cand.plan.predicted.step_time_s:.4g} s against {g.plan.predicted.step_time_s:.4g} s unsliced "
                f"(the best GPipe plan)")
    a = solving.run(inst, req, limits, progress=progress)
    g = a if a.plan is not None and schedule_of(a.plan.schedule, a.plan.vpp).slices_ok else \
        solving.run(inst, greq, limits)
    if g.plan is None:
        return a, "token slices: off (no GPipe plan to slice)"
    best = next((c for c in slice_candidates(inst, g.plan, limits) if limits.admit(c.plan)), None)
    if best is None:
        return a, "token slices: off (no slicing of the GPipe plan meets the limits)"
    what = "$/step" if limits.objective == "min-cost" else "step"
    if a.plan is not None and (not best.slices or best.objective >= objective_of(a.plan, limits)):
        why = ("one slice is best for the GPipe plan" if not best.slices else
               f"the best sliced plan ({best.count} slices {list(best.slices)}) has {what} {best.objective:.6g}")
        return a, (f"token slices: off; {why}, the unsliced plan ({a.plan.schedule}) has {what} "
                   f"{objective_of(a.plan, limits):.6g} ({a.status})")
    unsliced = "none" if a.plan is None else f"{objective_of(a.plan, limits):.6g} ({a.status}, {a.plan.schedule})"
    return (_sliced_result(g, best, []),
            f"token slices: {best.count} slices {list(best.slices)} tokens; {what} {best.objective:.6g} against "
            f"the best unsliced plan's {unsliced}")
