"""`milp-plan verify`: re-check a plan, simulate it, compare prediction with simulation.

For plan.json: rebuild the instance it records, run every checker rule, simulate the
step event by event (milp_plan.sim) and compare the predicted step time and the
predicted peak memory per GPU of every stage with the simulated ones:

    relative difference = (simulated - predicted) / predicted

The plan passes when no rule is violated and every |difference| <= tolerance. The
prediction compared is the one the plan records; with `schedule` (another schedule than
the plan's) it is the cost model's prediction for that schedule (predict.py: the simulated
step where the plan is small enough, else the closed form; verify then differs only by the
overlapped reduction of `--dp-overlap`). A hand-edited plan whose
recorded prediction no longer matches the cost model is reported as stale (rule
"prediction") and is still simulated: the simulation always describes the plan as it is.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from milp_plan import check, predict, schedules
from milp_plan.errors import InputError
from milp_plan.instance import Instance, instance_from_inputs
from milp_plan.plan import Plan, Prediction, fewest_micro_batches, one_run_each, read_plan
from milp_plan.report import table
from milp_plan.sim import SimResult, simulate_plan, too_large_to_simulate

DEFAULT_TOLERANCE = 0.02
DEFAULT_SAMPLES = 20      # sampled batches of a plan with phases


def parse_tolerance(text: str | float) -> float:
    """'2%' -> 0.02; a fraction '0.02' is accepted as is."""
    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100.0 if raw.endswith("%") else float(raw)
    except ValueError:
        raise InputError(f"'{text}' is not a tolerance; write a percentage like 2% or a fraction like 0.02",
                         field="tolerance") from None
    if not raw.endswith("%") and value >= 1.0:
        raise InputError(f"'{text}' is ambiguous; write a percentage like 2% or a fraction like 0.02",
                         field="tolerance")
    if not 0.0 <= value < 1.0:
        raise InputError(f"must lie in [0%, 100%), got {text}", field="tolerance")
    return value


@dataclass(frozen=True)
class Comparison:
    what: str                  # "step time" or "stage s peak memory"
    unit: str                  # "s" or "GiB"
    predicted: float
    simulated: float
    tolerance: float

    @property
    def rel_diff(self) -> float:
        return (self.simulated - self.predicted) / self.predicted if self.predicted else 0.0

    @property
    def ok(self) -> bool:
        return abs(self.rel_diff) <= self.tolerance + 1e-12


@dataclass
class VerifyReport:
    plan_path: str
    schedule: str
    vpp: int
    schedule_changed: bool
    tolerance: float
    violations: list[check.Violation]
    notes: list[str] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    fresh_step_time_s: float | None = None     # cost model now, when it differs from the recorded one
    result: SimResult | None = None
    phases: "PhasesCheck | None" = None        # a plan with phases: its step and sampled batches, simulated

    @property
    def simulated(self) -> bool:
        return self.result is not None or self.phases is not None

    @property
    def ok(self) -> bool:
        """The plan passes its checks and simulates within tolerance. Under --schedule/--vpp
        (a what-if: the plan as written is not what is simulated) the comparison is
        reported, not judged."""
        within = self.schedule_changed or all(c.ok for c in self.comparisons)
        return not self.violations and self.simulated and within

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1


# ---- building the report ------------------------------------------------------------------
def check_input_hashes(inputs: Any, inst: Instance) -> list[check.Violation]:
    """Rule "inputs": the sha256 the plan records for its cluster and model must be the hash of
    the definitions it records (a hand edit of either shows here)."""
    out = []
    for what, obj in (("cluster", inst.cluster), ("model", inst.model)):
        rec = inputs.get(what) if isinstance(inputs, dict) else None
        recorded = rec.get("sha256") if isinstance(rec, dict) else None
        if recorded is None:
            out.append(check.Violation("inputs", f"inputs.{what} records no sha256"))
        elif recorded != obj.content_hash():
            out.append(check.Violation("inputs", f"inputs.{what}.sha256 {str(recorded)[:23]}... is not the hash of "
                                                 f"the recorded definition ({obj.content_hash()[:23]}...); the "
                                                 "plan was edited after solving: re-solve"))
    return out


def target_plan(plan: Plan, schedule: str | None, vpp: int | None) -> Plan:
    """The plan to simulate: the plan itself, or the same stages under another schedule."""
    if schedule is None and vpp is None:
        return plan
    schedule = schedule or plan.schedule
    if not schedules.has_chunks(schedules.schedule_of(schedule).name):
        if vpp not in (None, 1):
            raise InputError(f"--vpp {vpp} needs --schedule {schedules.INTERLEAVED}", field="vpp")
        vpp = 1
    else:
        vpp = vpp or (plan.vpp if plan.vpp > 1 else 2)
        schedules.schedule_of(schedule, vpp).check_runtime(plan.pp, plan.num_microbatches)  # Megatron's rules
        bad = [i for i, s in enumerate(plan.stages) if s.num_layers % vpp]
        if bad:
            raise InputError(f"stage {bad[0]} holds {plan.stages[bad[0]].num_layers} layers, not divisible by "
                             f"vpp {vpp}; choose a vpp that divides every stage's layer count", field="vpp")
    target = plan.with_schedule(schedule, vpp)
    if plan.slices and not schedules.schedule_of(schedule, vpp).slices_ok:
        target = target.with_(slices=())  # a what-if: token slices run under gpipe only; the sequences whole
    if schedules.schedule_of(schedule, vpp).needs_fork and plan.mode == "megatron":
        target = target.with_(mode="free")  # a what-if: the schedule runs on a fork, not stock Megatron
    return target


def _compare(report: VerifyReport, inst: Instance, plan: Plan, predicted: Prediction, result: SimResult) -> None:
    tol = report.tolerance
    report.comparisons.append(Comparison("step time", "s", predicted.step_time_s, result.step_time_s, tol))
    stages = predicted.stages
    if len(stages) != plan.pp:
        report.notes.append(f"the recorded prediction has {len(stages)} stages, the plan {plan.pp}: memory is "
                            "compared with the cost model's prediction")
        stages = predict.evaluate(inst, plan).stages
    for s, (sp, sim) in enumerate(zip(stages, result.peak_memory_gib)):
        report.comparisons.append(Comparison(f"stage {s} peak memory", "GiB", sp.peak_memory_gib, sim, tol))


def verify_plan(path: str | Path, tolerance: float = DEFAULT_TOLERANCE, schedule: str | None = None,
                vpp: int | None = None, dp_overlap: bool = False, samples: int = DEFAULT_SAMPLES,
                seed: int = 0) -> VerifyReport:
    """Check, simulate and compare one plan file (see the module docstring)."""
    plan = read_plan(path)
    if plan.phases is not None:
        if schedule is not None or vpp is not None or dp_overlap:
            raise InputError("a plan with phases is verified as it is written; drop --schedule, --vpp and "
                             "--dp-overlap", source=str(path), field="phases")
        return verify_phases(str(path), plan, tolerance, samples, seed)
    if not plan.inputs:
        raise InputError("the plan records no inputs (cluster, model, job); it must come from `milp-plan solve` "
                         "or carry an 'inputs' record", source=str(path), field="inputs")
    inst = instance_from_inputs(plan.inputs, str(path))
    if plan.slices and dp_overlap:
        raise InputError("a plan with token slices is simulated with the reductions after the last backward; "
                         "drop --dp-overlap", source=str(path), field="dp-overlap")
    target = target_plan(plan, schedule, vpp)
    changed = target is not plan
    report = VerifyReport(str(path), target.schedule, target.vpp, changed, tolerance,
                          check_input_hashes(plan.inputs, inst) + check.check_plan(inst, target))
    report.notes += [f"instance: {n}" for n in inst.notices]
    if check.check_structure(inst, target):
        report.notes.append("not simulated: the plan's structure is invalid (see the violations)")
        return report
    fresh = predict.evaluate(inst, target)
    if changed:
        predicted = fresh
        report.notes.append(f"schedule changed to {target.schedule}" + (f" (vpp {target.vpp})" if target.vpp > 1
                            else "") + (" without the token slices (they run under gpipe only)"
                                        if plan.slices and not target.slices else "") + ": compared with the cost model's prediction for it"
                            + (f"; {fork}" if (fork := schedules.schedule_of(target.schedule, target.vpp).needs_fork)
                               else ""))
    elif plan.predicted is None:
        predicted = fresh
        report.notes.append("the plan records no prediction: compared with the cost model's")
    else:
        predicted = plan.predicted
        if any(v.rule == "prediction" for v in report.violations):
            report.fresh_step_time_s = fresh.step_time_s
            report.notes.append(f"stale prediction: the plan records {predicted.step_time_s:.6g} s/step but now "
                                f"evaluates to {fresh.step_time_s:.6g} s/step (edited by hand?); compared with the "
                                "recorded prediction, simulated as the plan is now")
    why = too_large_to_simulate(target)
    if why:
        report.notes.append(why)
        return report
    if dp_overlap:
        report.notes.append("gradient reduction overlapped with the last backward (the cost model does not "
                            "overlap it)")
    report.result = simulate_plan(inst, target, dp_overlap=dp_overlap)
    _compare(report, inst, target, predicted, report.result)
    return report


# ---- a plan with phases ---------------------------------------------------------------------
@dataclass(frozen=True)
class PhasesCheck:
    step: Any                          # sim.phases.PhaseStep: the plan's own batch, simulated
    sampled_s: tuple[float, ...]       # the simulated step of each sampled batch
    seed: int

    def spread(self) -> dict[str, float]:
        xs = sorted(self.sampled_s)
        if not xs:
            return {}
        pick = lambda q: xs[min(len(xs) - 1, int(q * len(xs)))]  # noqa: E731
        mean = sum(xs) / len(xs)
        return {"mean": mean, "stdev": (sum((x - mean) ** 2 for x in xs) / len(xs)) ** 0.5, "min": xs[0],
                "p50": pick(0.5), "p95": pick(0.95), "max": xs[-1]}


def check_phases(plan: Plan, insts: list[Instance]) -> list[check.Violation]:
    """Rule "phases": the phases hold the distribution's sequences in their buckets, each with
    the fewest micro-batches its plan needs at its row length; one strategy index is one layout;
    a strategy runs one run around the cycle; every layout leaves room for the home's optimizer
    state; each phase's time and fill are its plan's prediction."""
    from milp_plan import hotswitch, workload
    ph, out = plan.phases, []

    def bad(msg: str) -> None:
        out.append(check.Violation("phases", msg))
    edges = [x.edge for x in ph.phases]
    if edges != sorted(set(edges)):
        bad(f"bucket edges {edges} must ascend")
        return out
    lengths = [l for l, c in ph.lengths["counts"] for _ in range(c)]
    try:
        counts = workload.bucket_counts(lengths, edges)
    except InputError as exc:
        bad(str(exc))
        return out
    keys: dict[int, tuple] = {}
    for i, (x, inst, n) in enumerate(zip(ph.phases, insts, counts)):
        where = f"phase {i} ({x.edge} tokens)"
        if x.sequences != n:
            bad(f"{where} holds {x.sequences} sequences; the distribution puts {n} in it")
        if inst.job.seq_length != x.edge:
            bad(f"{where}: its plan is for {inst.job.seq_length}-token rows")
        if not 0 <= x.strategy < len(ph.strategies):
            bad(f"{where}: strategy {x.strategy} is not one of the {len(ph.strategies)}")
            continue
        if keys.setdefault(x.strategy, hotswitch.layout_key(x.plan)) != hotswitch.layout_key(x.plan):
            bad(f"{where}: strategy {x.strategy}'s layout differs from its other phases'")
        m = fewest_micro_batches(x.plan, x.sequences)
        if m != x.plan.num_microbatches:
            bad(f"{where}: {x.plan.num_microbatches} micro-batches where {m} hold its {x.sequences} sequences")
        p = x.plan.predicted
        if p is None:
            bad(f"{where}: its plan records no prediction; solve again")
        elif (abs(x.fill_s - p.bubble_s) > 1e-9 * max(1.0, p.step_time_s) or abs(
                x.time_s - (p.step_time_s - p.bubble_s - p.dp_allreduce_s - p.optimizer_s)) > 1e-9 * p.step_time_s):
            bad(f"{where}: time_s and fill_s are not its plan's prediction (edited by hand?)")
    order = [x.strategy for x in ph.phases]
    if not one_run_each(order):
        bad(f"a strategy runs more than one run of buckets around the cycle ({order})")
    homes = [x for x in ph.phases if x.strategy == ph.home]
    if plan.predicted is None:
        bad("the plan records no prediction of the whole step; solve again")
    if not homes:
        bad(f"the home layout {ph.home} runs no phase")
    elif hotswitch.layout_key(plan) != hotswitch.layout_key(homes[0].plan):
        bad(f"the top level is not the home layout's (strategy {ph.home}) stages and schedule")
    else:
        for i, x in enumerate(ph.phases):
            if not hotswitch.room_for(x.plan, homes[-1].plan):
                bad(f"phase {i} ({x.edge} tokens) leaves no room for the home layout's optimizer state")
    return out


def verify_phases(path: str, plan: Plan, tolerance: float, samples: int, seed: int) -> VerifyReport:
    """Check every phase's plan and the phases' rules, simulate the step (sim/phases.py) against
    the prediction, each phase's memory against its plan's, and `samples` batches drawn from the
    distribution for the spread of step times."""
    from milp_plan import workload
    from milp_plan.sim.phases import phase_costs, simulate_step
    ph = plan.phases
    insts = [instance_from_inputs(x.plan.inputs, f"{path} (phase {i})") for i, x in enumerate(ph.phases)]
    violations = []
    for i, (inst, x) in enumerate(zip(insts, ph.phases)):
        violations += [check.Violation(v.rule, f"phase {i} ({x.edge} tokens): {v.message}")
                       for v in check_input_hashes(x.plan.inputs, inst) + check.check_plan(inst, x.plan)]
    violations += check_phases(plan, insts)
    report = VerifyReport(path, plan.schedule, plan.vpp, False, tolerance, violations)
    report.notes.append(f"{len(ph.phases)} phases, {len(ph.strategies)} layouts, {len(ph.switches())} switches a "
                        "step; switch costs are the cost model's estimate, not simulated")
    if any(check.check_structure(inst, x.plan) for inst, x in zip(insts, ph.phases)) or \
            any(v.rule == "phases" for v in violations):
        report.notes.append("not simulated: a phase is invalid (see the violations)")
        return report
    costs = phase_costs(ph, insts)
    step = simulate_step(ph, costs)
    report.comparisons.append(Comparison("step time", "s", plan.predicted.step_time_s, step.step_time_s, tolerance))
    for i, (inst, x) in enumerate(zip(insts, ph.phases)):
        if too_large_to_simulate(x.plan) is None:
            sim = simulate_plan(inst, x.plan)
            for s, (sp, peak) in enumerate(zip(x.plan.predicted.stages, sim.peak_memory_gib)):
                report.comparisons.append(Comparison(f"phase {i} stage {s} peak memory", "GiB", sp.peak_memory_gib,
                                                     peak, tolerance))
    hist = workload.Histogram(tuple(tuple(c) for c in ph.lengths["counts"]), ph.lengths["source"])
    edges = [x.edge for x in ph.phases]
    sampled = []
    for batch in workload.sample_batches(hist, samples, seed):
        counts = [fewest_micro_batches(x.plan, n) for x, n in zip(ph.phases, workload.bucket_counts(batch, edges))]
        sampled.append(simulate_step(ph, costs, counts).step_time_s)
    report.phases = PhasesCheck(step, tuple(sampled), seed)
    return report


# ---- rendering ------------------------------------------------------------------------------
def report_dict(r: VerifyReport) -> dict[str, Any]:
    res = r.result
    out: dict[str, Any] = {
        "plan": r.plan_path, "schedule": r.schedule, "vpp": r.vpp, "schedule_changed": r.schedule_changed,
        "tolerance": r.tolerance, "ok": r.ok, "exit_code": r.exit_code,
        "violations": [{"rule": v.rule, "message": v.message} for v in r.violations],
        "notes": list(r.notes),
        "comparisons": [{"what": c.what, "unit": c.unit, "predicted": c.predicted, "simulated": c.simulated,
                         "rel_diff": c.rel_diff, "ok": c.ok} for c in r.comparisons],
        "fresh_step_time_s": r.fresh_step_time_s,
        "simulation": None,
    }
    if r.phases is not None:
        st = r.phases.step
        out["phases"] = {"step_time_s": st.step_time_s, "segments": [
            {"phases": list(seg), "pipeline_s": t} for seg, t in zip(st.segments, st.segment_s)],
            "switches_s": st.switches_s, "home_s": st.home_s,
            "sampled": {"batches": len(r.phases.sampled_s), "seed": r.phases.seed,
                        "step_time_s": list(r.phases.sampled_s), **r.phases.spread()}}
    if res is not None:
        out["simulation"] = {
            "step_time_s": res.step_time_s, "pipeline_time_s": res.pipeline_time_s,
            "stages": [{"stage": s, "busy_s": res.busy_s[s], "span_s": res.span_s[s],
                        "bubble_fraction": res.bubble_fraction[s], "dp_end_s": res.dp_end_s[s],
                        "peak_inflight_microbatches": res.peak_inflight[s],
                        "peak_activation_gib": res.peak_activation_bytes[s] / 2**30,
                        "peak_memory_gib": res.peak_memory_gib[s]} for s in range(res.spec.pp)],
        }
    return out


def _pct(x: float) -> str:
    return f"{100 * x:+.2f}%"


def render_report(r: VerifyReport) -> str:
    sched = r.schedule + (f" (vpp {r.vpp})" if r.vpp > 1 else "")
    lines = [f"Plan {r.plan_path}: schedule {sched}" + (" [changed by --schedule]" if r.schedule_changed else "")]
    if r.violations:
        lines.append(f"Checks: {len(r.violations)} violation(s)")
        lines += [f"  {v}" for v in r.violations]
    else:
        lines.append("Checks: all rules pass")
    lines += [f"note: {n}" for n in r.notes]
    if r.comparisons:
        rows = [[c.what, f"{c.predicted:.6g} {c.unit}", f"{c.simulated:.6g} {c.unit}", _pct(c.rel_diff),
                 "ok" if c.ok else f"OFF by {_pct(c.rel_diff)}"] for c in r.comparisons]
        lines += ["", table(["quantity", "predicted", "simulated", "difference", f"within {100 * r.tolerance:g}%"],
                            rows, right=[False, True, True, True, False])]
    if r.phases is not None:
        st, sp = r.phases.step, r.phases.spread()
        rows = [[f"phases {a}-{z}" if a != z else f"phase {a}", f"{t:.6g}"] for (a, z), t in zip(st.segments,
                                                                                               st.segment_s)]
        lines += ["", f"Simulated step {st.step_time_s:.6g} s: segments (one pipeline each) "
                  f"{sum(st.segment_s):.6g} + switches {st.switches_s:.4g} + reduction and optimizer {st.home_s:.4g}",
                  table(["segment", "pipeline s"], rows, right=[False, True])]
        if sp:
            lines.append(f"{len(r.phases.sampled_s)} batches sampled from the distribution (seed {r.phases.seed}): "
                         f"mean {sp['mean']:.6g} s, stdev {sp['stdev']:.3g}, min {sp['min']:.6g}, p50 {sp['p50']:.6g}, "
                         f"p95 {sp['p95']:.6g}, max {sp['max']:.6g} (mean {_pct(sp['mean'] / st.step_time_s - 1)} "
                         "against the planned batch)")
    if r.result is not None:
        res = r.result
        rows = [[f"stage {s}", res.busy_s[s], f"{100 * res.bubble_fraction[s]:.1f}%", res.peak_inflight[s]]
                for s in range(res.spec.pp)]
        lines += ["", f"Simulated step {res.step_time_s:.6g} s (pipeline {res.pipeline_time_s:.6g} s, then gradient "
                  "reduction and optimizer step)",
                  table(["stage", "busy s", "bubble", "peak in-flight micro-batches"], rows)]
    if r.ok and r.schedule_changed:
        off = [c for c in r.comparisons if not c.ok]
        lines += ["", "WHAT-IF (not judged: the plan runs its own schedule)"
                  + (": " + "; ".join(f"{c.what} {_pct(c.rel_diff)}" for c in off) + f" beyond {100 * r.tolerance:g}%"
                     if off else "")]
    else:
        lines += ["", "PASS" if r.ok else "FAIL: " + _failures(r)]
    return "\n".join(lines)


def _failures(r: VerifyReport) -> str:
    bits = []
    if r.violations:
        bits.append(f"{len(r.violations)} rule violation(s) ({', '.join(sorted({v.rule for v in r.violations}))})")
    if not r.simulated:
        bits.append("not simulated")
    off = [c for c in r.comparisons if not c.ok]
    if off:
        bits.append("; ".join(f"{c.what} {_pct(c.rel_diff)}" for c in off) + f" beyond {100 * r.tolerance:g}%")
    return "; ".join(bits)


@dataclass(frozen=True)
class SimulationCheck:
    """A plan's prediction beside its event-by-event simulation (what `solve` prints)."""
    step_time_s: float          # simulated
    prediction_error: float     # predicted / simulated - 1 (0 where the prediction is the simulated step)
    basis: str                  # the prediction's step_basis
    memory_error_gib: float     # largest |predicted - simulated| peak memory of a stage


def simulation_check(inst: Instance, plan: Plan) -> SimulationCheck | str:
    """The simulation of a solved plan against its prediction, or why it is not simulated."""
    why = too_large_to_simulate(plan)
    if why:
        return why
    sim = simulate_plan(inst, plan)
    pred = plan.predicted.step_time_s
    return SimulationCheck(sim.step_time_s, (pred - sim.step_time_s) / sim.step_time_s, plan.predicted.step_basis,
                           max(abs(a.peak_memory_gib - b) for a, b in zip(plan.predicted.stages, sim.peak_memory_gib)))
