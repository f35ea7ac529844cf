"""The `milp-plan` command line: one thin command per verb.

Exit codes: 0 plan found / check passed, 1 infeasible / no plan / check failed,
2 bad input (one line naming file, field and fix; never a traceback), 3 internal error
(a bug: one line asking for a report), 130 / 143 interrupted by SIGINT / SIGTERM (the
search stops within a second; no output is written unless --save-on-interrupt), 141 when
the reader of stdout went away (`milp-plan ... | head`), as a shell reports SIGPIPE.
With --json an error is also a JSON object on stdout: {"error": ..., "exit_code": ...}.
"""
from __future__ import annotations

import json
import sys
from typing import Annotated, Optional

import typer
import typer.core

from milp_plan.errors import (EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_SIGINT, EXIT_SIGPIPE, InputError, Interrupted,
                              MilpPlanError)


def _usage_name(self) -> str:
    """Usage lines show `PLAN`, not typer 0.29's `{PLAN}` for a required argument."""
    name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
    return name + ("..." if self.nargs != 1 else "")


typer.core.TyperArgument._usage_display_name = _usage_name  # type: ignore[method-assign]

DEFAULT_MAX_SOLVE_TIME = "30s"   # the search limit (wall clock) unless a flag or a suite file says otherwise
DEFAULT_WORK_LIMIT = 30.0        # the search limit (work units) when no limit is given and the planners measure work

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="Plan parallel Transformer training on heterogeneous, rented GPU clusters.")

# ---- options shared by the commands that build an instance ------------------------------
ClusterOpt = Annotated[Optional[str], typer.Option(
    "--cluster", help="Cluster YAML, a shipped cluster name, or metis:CLUSTER.json,HOSTFILE. Default: default.")]
ModelOpt = Annotated[Optional[str], typer.Option("--model", help="Catalog model name or model YAML. Default: gpt3-2.7b.")]
ProfilesOpt = Annotated[Optional[str], typer.Option(
    "--profiles", help="Profile directory (native CSV, Metis or FASOP). Default: shipped analytic profiles.")]
ProfileFormatOpt = Annotated[str, typer.Option("--profile-format", help="auto | native | metis | fasop.")]
GpuMapOpt = Annotated[Optional[str], typer.Option(
    "--profile-gpu-map", help="Map profile GPU names to cluster GPUs: A100=A100-40GB,A10=A10.")]
GlobalBatchOpt = Annotated[Optional[int], typer.Option("--global-batch", help="Global batch size (samples). Default: 80.")]
SeqLenOpt = Annotated[Optional[int], typer.Option("--seq-len", help="Sequence length. Default: the model's.")]
HeadroomOpt = Annotated[Optional[float], typer.Option(
    "--memory-headroom", help="Fraction of GPU memory kept free. Default: 0.10.")]
JobOpt = Annotated[Optional[str], typer.Option(
    "--job", help="Job YAML: global_batch or global_batch_tokens, seq_length, precision, flash_attention, "
                  "grad_reduce_dtype, distributed_optimizer, memory_headroom, overlap_grad_reduce, overlap_param_gather, "
                  "tp_comm_overlap (README: Job file). Flags override it.")]
BatchTokensOpt = Annotated[Optional[int], typer.Option(
    "--global-batch-tokens", help="Global batch in tokens (a multiple of the sequence length).")]
PrecisionOpt = Annotated[Optional[str], typer.Option("--precision", help="bf16 | fp16. Default: bf16.")]
FlashOpt = Annotated[Optional[bool], typer.Option(
    "--flash-attention/--no-flash-attention", help="Fused attention (no s^2 activations). Default: on.")]
GradDtypeOpt = Annotated[Optional[str], typer.Option(
    "--grad-reduce-dtype", help="Gradient buffer and dp reduction dtype: fp32 | bf16 (fp16 with --precision "
                                "fp16). Default: fp32.")]
DistOptOpt = Annotated[Optional[bool], typer.Option(
    "--distributed-optimizer/--no-distributed-optimizer",
    help="Whether the planner may shard optimizer state over dp. Default: allowed.")]
OverlapOpt = Annotated[Optional[str], typer.Option(
    "--overlap", help="Communication overlapped with compute, comma-separated: grad-reduce, param-gather, tp-comm "
                      "(Megatron's --overlap-grad-reduce, --overlap-param-gather, --tp-comm-overlap), or none. "
                      "Default: none.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON on stdout instead of tables.")]
# ... and by the commands that plan (solve, compare)
TimeLimitOpt = Annotated[Optional[str], typer.Option(
    "--time-limit", help="Step-time limit, e.g. 1.2s/step (needed by min-cost).")]
BudgetOpt = Annotated[Optional[str], typer.Option(help="Budget, e.g. 40$/h or 0.02$/step.")]
SeedOpt = Annotated[int, typer.Option(help="Solver seed, 0 to 2147483647.")]
WorkLimitOpt = Annotated[Optional[float], typer.Option(
    "--work-limit", help="Deterministic search limit in work units (about CPU seconds on the reference machine): "
                         "the same answer on any machine and load. cpsat and the heuristics; not highs or cbc. "
                         "Default: 30 when no --max-solve-time is given. With it, --max-solve-time is only a "
                         "wall-clock guard (default: none).")]


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version
        try:
            v = version("milp-plan")
        except PackageNotFoundError:  # pragma: no cover - running from a source tree
            v = "unknown (not installed)"
        typer.echo(f"milp-plan {v}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="Print the version and exit.")] = False) -> None:
    """Plan parallel Transformer training on heterogeneous, rented GPU clusters."""


def parse_gpu_map(text: str | None) -> tuple[tuple[str, str], ...]:
    if not text:
        return ()
    out = []
    for item in text.split(","):
        if "=" not in item or not all(p.strip() for p in item.split("=", 1)):
            raise InputError(f"'{item}' is not NAME=GPU; write it like A100=A100-40GB", field="profile-gpu-map")
        a, b = item.split("=", 1)
        out.append((a.strip(), b.strip()))
    return tuple(sorted(out))


def instance_spec(cluster, model, profiles, profile_format, gpu_map, global_batch, seq_len, headroom, job=None,
                  global_batch_tokens=None, precision=None, flash_attention=None, grad_reduce_dtype=None,
                  distributed_optimizer=None, overlap=None):
    from milp_plan.instance import InstanceSpec
    from milp_plan.job import GRAD_REDUCE_DTYPES, PRECISIONS, REFUSED_PRECISIONS
    for name, v in (("global-batch", global_batch), ("seq-len", seq_len), ("global-batch-tokens", global_batch_tokens)):
        if v is not None and v <= 0:
            raise InputError(f"must be > 0, got {v}", field=name)
    if global_batch is not None and global_batch_tokens is not None:
        raise InputError("give --global-batch (sequences) or --global-batch-tokens, not both",
                         field="global-batch-tokens")
    if precision in REFUSED_PRECISIONS:
        raise InputError(REFUSED_PRECISIONS[precision], field="precision")
    for name, v, choices in (("precision", precision, PRECISIONS), ("grad-reduce-dtype", grad_reduce_dtype,
                                                                     GRAD_REDUCE_DTYPES)):
        if v is not None and v not in choices:
            raise InputError(f"must be {' or '.join(choices)}, got {v!r}", field=name)
    return InstanceSpec(cluster=cluster, model=model, profiles=profiles, profile_format=profile_format,
                        profile_gpu_map=parse_gpu_map(gpu_map), global_batch_size=global_batch, seq_length=seq_len,
                        memory_headroom=headroom, job_file=job, global_batch_tokens=global_batch_tokens,
                        precision=precision, flash_attention=flash_attention, grad_reduce_dtype=grad_reduce_dtype,
                        distributed_optimizer=distributed_optimizer, overlap=overlap)


def echo_notices(inst) -> None:
    for n in inst.notices:
        typer.echo(f"note: {n}", err=True)


@app.command(short_help="Show the instance: cluster, model, job and profile coverage.")
def inspect(cluster: ClusterOpt = None, model: ModelOpt = None, profiles: ProfilesOpt = None,
            profile_format: ProfileFormatOpt = "auto", profile_gpu_map: GpuMapOpt = None,
            global_batch: GlobalBatchOpt = None, seq_len: SeqLenOpt = None, memory_headroom: HeadroomOpt = None,
            job: JobOpt = None, global_batch_tokens: BatchTokensOpt = None, precision: PrecisionOpt = None,
            flash_attention: FlashOpt = None, grad_reduce_dtype: GradDtypeOpt = None,
            distributed_optimizer: DistOptOpt = None, overlap: OverlapOpt = None,
            json_out: JsonOpt = False) -> None:
    """Show the instance: cluster, model, job and profile coverage. No arguments: the default."""
    from milp_plan.instance import build_instance
    from milp_plan.report import instance_report, render_instance
    inst = build_instance(instance_spec(cluster, model, profiles, profile_format, profile_gpu_map, global_batch,
                                        seq_len, memory_headroom, job, global_batch_tokens, precision,
                                        flash_attention, grad_reduce_dtype, distributed_optimizer, overlap))
    report = instance_report(inst)
    if json_out:
        typer.echo(json.dumps(report, indent=2))
    else:
        echo_notices(inst)
        typer.echo(render_instance(report))


@app.command(short_help="Find the best plan and write plan.json.")
def solve(cluster: ClusterOpt = None, model: ModelOpt = None, profiles: ProfilesOpt = None,
          profile_format: ProfileFormatOpt = "auto", profile_gpu_map: GpuMapOpt = None,
          global_batch: GlobalBatchOpt = None, seq_len: SeqLenOpt = None, memory_headroom: HeadroomOpt = None,
            job: JobOpt = None, global_batch_tokens: BatchTokensOpt = None, precision: PrecisionOpt = None,
            flash_attention: FlashOpt = None, grad_reduce_dtype: GradDtypeOpt = None,
            distributed_optimizer: DistOptOpt = None, overlap: OverlapOpt = None,
          objective: Annotated[str, typer.Option(help="min-time | min-cost | pareto.")] = "min-time",
          time_limit: TimeLimitOpt = None, budget: BudgetOpt = None,
          mode: Annotated[str, typer.Option(
              help="megatron (uniform tp/dp/recompute; stock Megatron-LM) | free (tp, dp and recompute per "
                   "stage; needs a per-stage runtime).")] = "megatron",
          solver: Annotated[str, typer.Option(
              help="auto | cpsat | highs | cbc | brute-force | warm-start (the heuristic alone, no bound) | "
                   "aceso (Aceso-style bottleneck alleviation) | fasop (FASOP-style enumeration) | metis "
                   "(Metis-style device groups); the last three prove no bound.")] = "auto",
          max_solve_time: Annotated[Optional[str], typer.Option(
              "--max-solve-time", help="Bound on the search in wall-clock time, e.g. 30s (the answer then "
                                       "depends on the machine's speed and load). Default: none, the "
                                       "--work-limit applies; 30s for highs and cbc.")] = None,
          work_limit: WorkLimitOpt = None,
          seed: SeedOpt = 1,
          workers: Annotated[int, typer.Option(
              help="Processes that solve (and in free mode bound) configurations side by side, 1 to 64 "
                   "(the exact planners; the same plan.json whatever the number, only faster).")] = 1,
          fix: Annotated[Optional[str], typer.Option(
              help="Pin global choices: tp=8,pp=8,dp=1,mbs=1,vpp=3,recompute=full,sp=off,schedule=interleaved; "
                   "cap with tp<=4,mbs<=8; pin per stage with layers=12,20,order=A10,A100-80GB.")] = None,
          extrapolate: Annotated[bool, typer.Option(
              "--extrapolate", help="Also plan on tp and micro-batch sizes the profiles did not measure (filled "
                                    "by the profile's rules; the plan lists every filled point).")] = False,
          max_tp: Annotated[Optional[int], typer.Option("--max-tp", help="Largest tensor-parallel size.")] = None,
          max_micro_batch: Annotated[Optional[int], typer.Option(
              "--max-micro-batch", help="Largest micro-batch size (per data-parallel replica).")] = None,
          mixed_stages: Annotated[bool, typer.Option(
              "--mixed-stages", help="Also search stages whose data-parallel replicas sit on two GPU types "
                                     "(whole nodes of each, at most 4 nodes a stage; the slowest replica paces "
                                     "the stage). Same as --fix mixed=on; --fix mixed=2 keeps stages of 2 "
                                     "nodes, a smaller space searched faster.")] = False,
          out: Annotated[Optional[str], typer.Option(
              "--out", help="Where to write the plan (a regular file, or - for stdout). Default: plan.json; "
                            "pareto.json with --objective pareto.")] = None,
          plot: Annotated[Optional[str], typer.Option(help="Pareto: write the front as a PNG.")] = None,
          record_wall_time: Annotated[bool, typer.Option(
              "--record-wall-time", help="Store the solve's wall time in plan.json (breaks byte-identity).")] = False,
          save_on_interrupt: Annotated[bool, typer.Option(
              "--save-on-interrupt", help="On Ctrl-C / SIGTERM, write the best plan so far to --out "
                                          "(default: leave --out untouched).")] = False,
          progress: Annotated[Optional[bool], typer.Option(
              "--progress/--no-progress", help="Progress on stderr. Default: on when stderr is a terminal "
                                               "(redrawn), else off; --progress when not a terminal prints a "
                                               "line every few seconds.")] = None,
          lengths: Annotated[Optional[str], typer.Option(
              "--lengths", help="Variable sequence lengths: a CSV (length,count), example (the shipped one) or "
                                "lognormal:MEAN:CAP:SEQUENCES[:SEED]; "
                                "plans a strategy per length bucket with hot switching (HotSPa): plan.json "
                                "gains phases.")] = None,
          buckets: Annotated[Optional[str], typer.Option(
              "--buckets", help="--lengths: fix the bucket edges in tokens, e.g. 2048,4096,16384 (default: the "
                                "model chooses them among powers of two from 512).")] = None,
          slices: Annotated[Optional[str], typer.Option(
              "--slices", help="Token slices (TeraPipe): off (the default, which says why) | auto (search every "
                               "GPipe config's sliced plans with the unsliced ones; status optimal only when "
                               "proven over both) | N (the best plan with every sequence cut into N slices). "
                               "Sliced plans need a runtime that pipelines token slices.")] = None,
          json_out: JsonOpt = False) -> None:
    """Find the best plan (default: fastest step on the shipped default cluster) and write plan.json."""
    from milp_plan import deadline
    from milp_plan import solve as solving
    from milp_plan.fileio import check_output
    from milp_plan.instance import build_instance
    from milp_plan.job import Objective
    from milp_plan.units import parse_duration_s, parse_money
    obj = Objective(kind=objective, time_limit_s=None if time_limit is None else parse_duration_s(time_limit,
                    field="time-limit"), budget=None if budget is None else parse_money(budget), mode=mode)
    from milp_plan.formulations.space import with_space_options
    fix = with_space_options(fix, extrapolate, max_tp, max_micro_batch, mixed_stages)
    # deterministic by default (the same plan.json on any machine, whatever --workers)
    wall, work_limit = _search_limits(max_solve_time, work_limit, [solver])
    req = solving.SolveRequest(solver, fix, wall, seed, workers, work_limit)
    solving.check_request(req)
    if lengths is None and job is not None:
        from milp_plan.job import load_job_lengths
        lengths, from_job = load_job_lengths(job)
        buckets = buckets or from_job
    if lengths is not None:
        if slices not in (None, "off"):
            raise InputError("--slices and --lengths are not combined yet; drop one", field="slices")
        spec = instance_spec(cluster, model, profiles, profile_format, profile_gpu_map, global_batch, seq_len,
                             memory_headroom, job, global_batch_tokens, precision, flash_attention,
                             grad_reduce_dtype, distributed_optimizer, overlap)
        _solve_buckets(spec, obj, req, lengths, buckets, out or "plan.json", json_out)
        return
    if buckets is not None:
        raise InputError("--buckets splits a length distribution; give --lengths too", field="buckets")
    from milp_plan.slice_plan import OFF, parse_slices
    slice_setting = parse_slices(slices)
    if slice_setting != OFF and objective == "pareto":
        raise InputError("token slices are decided for min-time and min-cost, not pareto; drop --slices",
                         field="slices")
    out = out or ("pareto.json" if objective == "pareto" else "plan.json")
    if objective == "pareto":
        if out == "-":
            raise InputError("pareto writes a JSON and a CSV file; give a file name", field="out")
        from milp_plan.pareto import output_paths
        for path in output_paths(out):
            check_output(path, allow_stdout=False)
    else:
        check_output(out)
    if plot:
        check_output(plot, "--plot", allow_stdout=False)
    inst = build_instance(instance_spec(cluster, model, profiles, profile_format, profile_gpu_map, global_batch,
                                        seq_len, memory_headroom, job, global_batch_tokens, precision,
                                        flash_attention, grad_reduce_dtype, distributed_optimizer, overlap), obj)
    if objective == "pareto":
        try:
            with deadline.handle_signals():  # after an interrupt fileio writes nothing: the old front stays
                _run_pareto(inst, req, out=out, plot=plot, json_out=json_out)
        except MilpPlanError:
            _raise_if_interrupted("the Pareto sweep", out)  # the interrupt explains it (e.g. an empty front)
            raise
        _raise_if_interrupted("the Pareto sweep", out)
        return
    if not json_out:
        echo_notices(inst)
    limits = inst.objective.limits()
    show = (not json_out and sys.stderr.isatty()) if progress is None else progress
    printer = _progress_printer(show)
    report = printer if show else None   # none: the search skips building its progress reports
    with deadline.handle_signals():
        if slice_setting == OFF:
            result, slice_line = solving.run(inst, req, limits, progress=report), ""
        else:
            from milp_plan.slice_plan import solve_with_slices
            result, slice_line = solve_with_slices(inst, req, limits, slice_setting, progress=report)
    printer.close()
    if deadline.interrupted():
        _interrupted_solve(result, out, save_on_interrupt, record_wall_time)
    plan = solving.require_plan(inst, req, limits, result)
    _write_solved(plan, result, out, record_wall_time)
    if json_out:
        doc = plan.to_dict()
        doc["solver"] = {**doc["solver"], "wall_time_s": result.wall_time_s}
        typer.echo(json.dumps(doc, indent=2), err=out == "-")
    else:
        typer.echo(render_solved(plan, inst, result), err=out == "-")
        if slices is None:
            from milp_plan.slice_plan import default_line
            slice_line = default_line(inst, req, limits, result)
        if slice_line:
            typer.echo(slice_line, err=out == "-")
            for note in result.notes if plan.slices else ():
                typer.echo(f"  {note}", err=out == "-")
        typer.echo(f"Wrote {'the plan to stdout' if out == '-' else out}", err=out == "-")


def _solve_buckets(spec, obj, req, lengths: str, edges: str | None, out: str, json_out: bool) -> None:
    """solve --lengths: a strategy per length bucket, switched inside the step (hotswitch.py)."""
    from milp_plan import hotswitch, workload
    from milp_plan.fileio import check_output
    from milp_plan.plan import write_plan
    from milp_plan.report import render_phases
    if obj.kind == "pareto" or obj.mode != "megatron":
        raise InputError("--lengths plans min-time or min-cost (with budgets) in megatron mode; drop "
                         + ("--objective pareto" if obj.kind == "pareto" else "--mode free"),
                         field="objective" if obj.kind == "pareto" else "mode")
    obj.limits()  # min-cost with a budget: the one-line error of a plain solve
    if spec.seq_length is not None:
        raise InputError("--seq-len conflicts with --lengths: the distribution gives the sequence lengths; drop it",
                         field="seq-len")
    from milp_plan.job import JobSettings, load_job_file
    settings = load_job_file(spec.job_file) if spec.job_file else JobSettings()
    if "seq_length" in settings.from_file:
        raise InputError("job: field 'seq_length' conflicts with --lengths: the distribution gives the sequence "
                         "lengths; drop it", source=spec.job_file)
    # the global batch (flag over file) rescales the distribution: its shape at that many sequences or tokens
    size = (JobSettings(global_batch=spec.global_batch_size, global_batch_tokens=spec.global_batch_tokens)
            .over(settings))
    from dataclasses import replace
    spec = replace(spec, global_batch_size=None, global_batch_tokens=None)   # each bucket sets its own
    check_output(out)
    hist = workload.scaled(workload.parse_lengths(lengths), size.global_batch, size.global_batch_tokens)
    bins = workload.buckets(hist, workload.parse_edges(edges) if edges else None)
    choose = edges is None
    cands = hotswitch.candidates(spec, bins, req, obj, choose_edges=choose)
    result = hotswitch.plan_buckets(spec, bins, cands, obj, choose_edges=choose,
                                    edges="chosen" if choose else "given")
    plan = hotswitch.to_plan(result, hist)
    if out != "-":
        write_plan(out, plan)
    if json_out or out == "-":
        typer.echo(plan.to_json(), nl=False)
    else:
        typer.echo(render_phases(plan) + f"\nWrote {out}")


def _wall_limit(max_solve_time: str | None, work_limit: float | None) -> float:
    """The wall-clock limit: --max-solve-time, else 30 s, or no limit (a week) under --work-limit."""
    from milp_plan.solve import MAX_SOLVE_TIME_S
    from milp_plan.units import parse_duration_s
    if max_solve_time is not None:
        return parse_duration_s(max_solve_time, field="max-solve-time")
    return MAX_SOLVE_TIME_S if work_limit is not None else parse_duration_s(DEFAULT_MAX_SOLVE_TIME)


def _search_limits(max_solve_time: str | None, work_limit: float | None, names,
                   suite=None) -> tuple[float, float | None]:
    """(wall seconds, work units) for each planner named (solve: one; compare: several): the
    flags, else the suite file's, else DEFAULT_WORK_LIMIT when every planner measures work
    (the same results on any machine), else DEFAULT_MAX_SOLVE_TIME of wall clock. An unknown
    planner name is refused here (planners.get)."""
    from milp_plan import planners as registry
    if max_solve_time is None and work_limit is None and suite is not None:
        max_solve_time, work_limit = suite.max_solve_time, suite.work_limit
    if max_solve_time is None and work_limit is None \
            and all(registry.get(n).deterministic for n in names):
        work_limit = DEFAULT_WORK_LIMIT
    return _wall_limit(max_solve_time, work_limit), work_limit


def _run_pareto(inst, req, *, out: str, plot: str | None, json_out: bool) -> None:
    from milp_plan import pareto
    from milp_plan.fileio import write_atomic
    from milp_plan.report import render_front
    pareto.check_request(inst, plot)
    front = pareto.pareto_front(inst, req)
    doc = pareto.front_document(front)
    json_path, csv_path = pareto.output_paths(out)
    write_atomic(json_path, json.dumps(doc, indent=2) + "\n")
    write_atomic(csv_path, pareto.front_csv(doc["points"]))
    if plot:
        write_atomic(plot, pareto.front_png(doc["points"]))
    if json_out:
        typer.echo(json.dumps(doc, indent=2))
        return
    typer.echo(render_front(doc, front.wall_time_s, pareto.MAX_POINTS))
    typer.echo(f"Wrote {json_path}, {csv_path}" + (f", {plot}" if plot else ""))


def _write_solved(plan, result, out: str, record_wall_time: bool, after_interrupt: bool = False) -> None:
    from dataclasses import replace
    from milp_plan.fileio import write_output
    if record_wall_time:
        plan = plan.with_(solver=replace(plan.solver, wall_time_s=result.wall_time_s))
    write_output(out, plan.to_json(), after_interrupt=after_interrupt)


def render_solved(plan, inst, result) -> str:
    """The plan table and its event-by-event simulation (skipped, with the reason, when too large)."""
    from milp_plan.report import render_plan, render_simulation
    from milp_plan.verify import simulation_check
    return render_plan(plan, inst, result) + "\n" + render_simulation(simulation_check(inst, plan))


def _signal_name() -> tuple[str, int]:
    import signal as _signal
    from milp_plan import deadline
    sig = deadline.interrupted() or _signal.SIGINT
    return _signal.Signals(sig).name, 128 + int(sig)


def _interrupted_solve(result, out: str, save: bool, record_wall_time: bool) -> None:
    """Say what the best plan so far was; write it only with --save-on-interrupt; exit 130 / 143."""
    name, code = _signal_name()
    head = f"interrupted by {name} after {result.wall_time_s:.1f} s"
    if result.plan is None:
        raise Interrupted(f"{head}: no plan found yet; {out} left unchanged", code)
    p = result.plan.predicted
    best = (f"best plan so far {p.step_time_s:.4g} s/step, {p.usd_per_step:.4g} $/step, "
            f"{p.usd_per_hour:.2f} $/h (pp {result.plan.pp}, {result.plan.num_microbatches} micro-batch"
            f"{'es' if result.plan.num_microbatches != 1 else ''}"
            + (f", gap {result.gap:.1%}" if result.gap is not None else "") + ")")
    if save:
        _write_solved(result.plan, result, out, record_wall_time, after_interrupt=True)
        raise Interrupted(f"{head}: {best}; wrote it to {'stdout' if out == '-' else out}", code)
    raise Interrupted(f"{head}: {best}; {out} left unchanged (add --save-on-interrupt to write it)", code)


def _raise_if_interrupted(what: str, out: str) -> None:
    from milp_plan import deadline
    if deadline.interrupted():
        name, code = _signal_name()
        raise Interrupted(f"{what} was interrupted by {name}; {out} left unchanged", code)


class _progress_printer:
    """Incumbent, bound and elapsed time on stderr for solves longer than a second: redrawn in
    place on a terminal (every 0.2 s), elsewhere (CI logs) a first line after a second and then
    one every PLAIN_EVERY_S seconds."""

    PLAIN_EVERY_S = 5.0

    def __init__(self, active: bool) -> None:
        self.active = active
        self.tty = sys.stderr.isatty()
        self.shown = False
        self.last = 0.0

    def __call__(self, p) -> None:
        every = 0.2 if self.tty else self.PLAIN_EVERY_S
        if not self.active or p.elapsed_s < 1.0 or (self.last and p.elapsed_s - self.last < every):
            return
        self.last = p.elapsed_s
        inc = "-" if p.incumbent is None else f"{p.incumbent:.6g}"
        bnd = "-" if p.bound is None else f"{p.bound:.6g}"
        text = f"  solving: incumbent {inc}  bound {bnd}  configs {p.done}/{p.total}  {p.elapsed_s:.1f}s"
        sys.stderr.write(f"\r{text} " if self.tty else text + "\n")
        sys.stderr.flush()
        self.shown = self.tty

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\n")


@app.command(short_help="Measure the model's layers with PyTorch; write a native profile.")
def profile(
    model: Annotated[str, typer.Option("--model", help="Catalog model name or model YAML.")],
    out: Annotated[str, typer.Option("--out", help="Output directory; writes DIR/<model>-<gpu>.csv.")],
    tp: Annotated[str, typer.Option("--tp", help="Tensor-parallel sizes to shard for: 1,2,4,8.")] = "1",
    micro_batch: Annotated[str, typer.Option("--micro-batch", help="Micro-batch sizes: 1,2,4,8.")] = "1,2,4,8",
    seq_len: Annotated[Optional[str], typer.Option(
        "--seq-len", help="Sequence length(s): 2048 or 1024,2048. Default: the model's.")] = None,
    device: Annotated[Optional[str], typer.Option(
        "--device", help="cuda | cpu. Default: cuda when torch sees one, else cpu.")] = None,
    repeats: Annotated[int, typer.Option("--repeats", help="Timed repeats per point (median, spread).")] = 10,
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed passes before the repeats.")] = 3,
    dtype: Annotated[Optional[str], typer.Option(
        "--dtype", help="bf16 | fp32. Default: bf16 on cuda, fp32 on cpu.")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the profile in --out, skipping its points.")] = False,
    gpu_name: Annotated[Optional[str], typer.Option(
        "--gpu-name", help="GPU name the rows carry. Default: the device's catalog name ('cpu' on the CPU).")] = None,
    cpu_threads: Annotated[Optional[int], typer.Option("--cpu-threads", help="torch threads on the CPU.")] = None,
    statistic: Annotated[str, typer.Option(
        "--statistic", help="median | min of the repeats (min is steadier on a shared CPU).")] = "median",
    clock: Annotated[str, typer.Option(
        "--clock", help="CPU only: wall | cpu (process CPU time, one thread; immune to other jobs).")] = "wall",
    check_blocks: Annotated[Optional[int], typer.Option(
        "--check-blocks", help="Also time embedding + N blocks + head as one model (first tp, micro-batch, "
                               "seq) and print how well the per-layer sum predicts it.")] = None,
) -> None:
    """Measure the model's layer kinds with PyTorch and write a native profile (needs milp-plan[profile])."""
    from milp_plan import profiler
    from milp_plan.model import load_model
    profiler.import_torch()
    m = load_model(model)
    req = profiler.ProfileRequest(
        m, profiler.int_list(tp, "tp"), profiler.int_list(micro_batch, "micro-batch"),
        profiler.int_list(seq_len, "seq-len") if seq_len else (), device or profiler.default_device(), dtype,
        repeats, warmup, gpu_name, cpu_threads, statistic, clock)
    path, prof, warnings = profiler.run_profile(req, out, resume)
    for w in warnings:
        typer.echo(f"warning: {w}", err=True)
    typer.echo(f"wrote {path}: {len(prof.table)} points")
    typer.echo(profiler.render_fits(prof))
    if check_blocks is not None:
        if check_blocks < 0:
            raise InputError(f"must be >= 0, got {check_blocks}", field="check-blocks")
        gpu = prof.gpus()[0]
        chk = profiler.whole_model_check(req, prof, gpu, req.tps[0], req.micro_batches[0], req.seq_lengths[0],
                                         check_blocks)
        typer.echo(f"whole-model check ({' '.join(chk.kinds)}): measured {chk.measured_ms:.3f} ms, "
                   f"per-layer sum {chk.predicted_ms:.3f} ms, error {100 * chk.rel_error:+.1f}%")


def parse_partitions(text: str | None) -> tuple[tuple[str, str], ...]:
    """--partition a100-node=gpu-a100,a10-node=gpu-a10 -> ((node type, partition), ...)."""
    if not text:
        return ()
    out = []
    for item in text.split(","):
        name, _, part = item.partition("=")
        if not name.strip() or not part.strip():
            raise InputError(f"'{item}' is not NODE_TYPE=PARTITION; write it like a100-node=gpu-a100",
                             field="partition")
        out.append((name.strip(), part.strip()))
    return tuple(out)


@app.command(short_help="Write Megatron-LM flags, launch scripts and a rank table for a plan.")
def launch(
    plan: Annotated[str, typer.Argument(help="plan.json written by `milp-plan solve`.", metavar="PLAN")],
    out: Annotated[str, typer.Option("--out", help="Launch directory to write.")],
    scheduler: Annotated[str, typer.Option("--scheduler", help="torchrun | slurm (adds slurm.sbatch).")] = "torchrun",
    force: Annotated[bool, typer.Option("--force", help="Overwrite files that already exist in --out.")] = False,
    megatron_path: Annotated[Optional[str], typer.Option(
        "--megatron-path", help="Default Megatron-LM checkout for the scripts (MEGATRON_PATH overrides it).")] = None,
    master_port: Annotated[int, typer.Option("--master-port", help="torchrun rendezvous port on the master.")] = 29500,
    cluster: Annotated[Optional[str], typer.Option(
        "--cluster", help="Cluster file that supplies the hosts (same node types as the plan's cluster).")] = None,
    partition: Annotated[Optional[str], typer.Option(
        "--partition", help="Slurm partitions per node type: a100-node=gpu-a100,a10-node=gpu-a10.")] = None,
) -> None:
    """Write Megatron-LM flags, torchrun/Slurm scripts and a rank table for a plan (launch/README.md)."""
    from milp_plan.launch import LaunchOptions, write_launch
    from milp_plan.report import table
    res = write_launch(plan, LaunchOptions(out, scheduler, force, megatron_path, master_port, cluster,
                                           parse_partitions(partition)))
    from milp_plan.launch import SWITCH_REASON
    if res.reasons == (SWITCH_REASON,):
        typer.echo(f"note: {SWITCH_REASON}", err=True)
    elif not res.compatible:
        typer.echo("note: stock Megatron-LM cannot run this plan; wrote per_stage.json for a per-stage runtime:",
                   err=True)
        for r in res.reasons:
            typer.echo(f"  - {r}", err=True)
    for n in res.notes:
        typer.echo(f"note: {n}", err=True)
    if res.compatible:
        rows = [(a.host, a.node, a.node_rank, len(a.gpus), f"{a.ranks.start}-{a.ranks.stop - 1}",
                 a.cuda_visible_devices) for a in res.layout.agents]
        typer.echo(table(["host", "node", "node rank", "nproc", "ranks", "CUDA_VISIBLE_DEVICES"], rows))
    typer.echo(f"wrote {len(res.files)} files to {res.out}: {', '.join(res.files)}")


@app.command(short_help="Re-check a plan, simulate it and compare with its prediction.")
def verify(
    plan_file: Annotated[str, typer.Argument(help="plan.json to verify.", metavar="PLAN")],
    tolerance: Annotated[str, typer.Option("--tolerance", help="Largest accepted relative difference, e.g. 2%.")] = "2%",
    schedule: Annotated[Optional[str], typer.Option(
        "--schedule", help="Simulate under another schedule: 1f1b | interleaved | gpipe | zb-h1.")] = None,
    vpp: Annotated[Optional[int], typer.Option(
        "--vpp", help="Virtual stages per rank with --schedule interleaved (default: the plan's, else 2).")] = None,
    dp_overlap: Annotated[bool, typer.Option(
        "--dp-overlap", help="Overlap the gradient reduction with the last backward (per-layer buckets).")] = False,
    trace: Annotated[Optional[str], typer.Option("--trace", help="Write a Chrome/Perfetto trace JSON here.")] = None,
    gantt: Annotated[Optional[str], typer.Option("--gantt", help="Write a Gantt chart PNG here (needs [plot]).")] = None,
    samples: Annotated[int, typer.Option(
        "--samples", help="A plan with phases (solve --lengths): batches drawn from its length distribution and "
                          "simulated, for the spread of step times.")] = 20,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the sampled batches.")] = 0,
    json_out: JsonOpt = False,
) -> None:
    """Re-check a plan, simulate it event by event, compare prediction and simulation (exit 0 / 1 / 2)."""
    from milp_plan.fileio import check_output
    from milp_plan.verify import parse_tolerance, render_report, report_dict, verify_plan
    if vpp is not None and not 1 <= vpp <= 64:
        raise InputError(f"must be between 1 and 64 virtual stages per rank, got {vpp}", field="vpp")
    for what, path in (("--trace", trace), ("--gantt", gantt)):
        if path:
            check_output(path, what, allow_stdout=False)
    if not 0 <= samples <= 10_000:
        raise InputError(f"must be between 0 and 10000 sampled batches, got {samples}", field="samples")
    report = verify_plan(plan_file, parse_tolerance(tolerance), schedule, vpp, dp_overlap, samples, seed)
    if report.result is not None and trace:
        from milp_plan.sim.trace import write_trace
        write_trace(trace, report.result)
    if report.result is not None and gantt:
        from milp_plan.sim.gantt import write_gantt
        write_gantt(gantt, report.result)
    typer.echo(json.dumps(report_dict(report), indent=2) if json_out else render_report(report))
    if report.exit_code:
        sys.exit(report.exit_code)


@app.command("import-plan", short_help="Turn a FASOP or Metis result row into plan.json, scored by milp-plan.")
def import_plan(
    spec: Annotated[str, typer.Argument(help="fasop:RESULT.csv (FASOP main_logs) or metis:RESULT.log (the ranked "
                                             "list Metis prints).", metavar="SPEC")],
    cluster: ClusterOpt = None, model: ModelOpt = None, profiles: ProfilesOpt = None,
    profile_format: ProfileFormatOpt = "auto", profile_gpu_map: GpuMapOpt = None,
    global_batch: GlobalBatchOpt = None, seq_len: SeqLenOpt = None, memory_headroom: HeadroomOpt = None,
            job: JobOpt = None, global_batch_tokens: BatchTokensOpt = None, precision: PrecisionOpt = None,
            flash_attention: FlashOpt = None, grad_reduce_dtype: GradDtypeOpt = None,
            distributed_optimizer: DistOptOpt = None, overlap: OverlapOpt = None,
    rank: Annotated[int, typer.Option("--rank", help="Which row: 1 is the peer's best.")] = 1,
    out: Annotated[str, typer.Option("--out", help="Where to write the plan (a regular file, or - for stdout).")]
        = "plan.json",
    json_out: JsonOpt = False,
) -> None:
    """Read one ranked row of a peer planner's result, lay it out on the cluster, check it, score it
    with milp-plan's cost model and write plan.json (exit 1 when the checker finds violations: the
    plan is still written, for `milp-plan verify`)."""
    from milp_plan.fileio import check_output, write_output
    from milp_plan.importers.peer_plan import import_plan as importing, parse_spec
    from milp_plan.instance import build_instance
    from milp_plan.report import render_plan, render_simulation
    from milp_plan.verify import simulation_check
    parse_spec(spec)
    if rank < 1:
        raise InputError(f"must be >= 1 (1 is the peer's best row), got {rank}", field="rank")
    check_output(out)
    inst = build_instance(instance_spec(cluster, model, profiles, profile_format, profile_gpu_map, global_batch,
                                        seq_len, memory_headroom, job, global_batch_tokens, precision,
                                        flash_attention, grad_reduce_dtype, distributed_optimizer, overlap))
    got = importing(spec, inst, rank)
    write_output(out, got.plan.to_json())
    err = out == "-"
    lay, p = got.layout, got.plan.predicted
    if json_out:
        typer.echo(json.dumps({"plan": got.plan.to_dict(), "peer": {"tool": lay.tool, "rank": lay.rank,
                   "row": lay.summary, "peer_step_time_s": lay.peer_step_time_s, "notes": list(lay.notes)},
                   "violations": [str(v) for v in got.violations]}, indent=2), err=err)
    else:
        echo_notices(got.instance)
        peer = "" if lay.peer_step_time_s is None else f"; {lay.tool} estimated {lay.peer_step_time_s:.6g} s/step"
        typer.echo(f"Imported {lay.tool} row {lay.rank}: {lay.summary}", err=err)
        for n in lay.notes:
            typer.echo(f"note: {n}", err=True)
        typer.echo(render_plan(got.plan, got.instance) + "\n" + render_simulation(simulation_check(got.instance,
                                                                                                   got.plan)), err=err)
        typer.echo(f"milp-plan predicts {p.step_time_s:.6g} s/step{peer}", err=err)
        if got.violations:
            typer.echo(f"Checks: {len(got.violations)} violation(s)", err=err)
            for v in got.violations:
                typer.echo(f"  {v}", err=err)
        typer.echo(f"Wrote {'the plan to stdout' if err else out}", err=err)
    if got.violations:
        sys.exit(1)


@app.command(short_help="Run several planners on one instance and compare their plans.")
def compare(cluster: ClusterOpt = None, model: ModelOpt = None, profiles: ProfilesOpt = None,
            profile_format: ProfileFormatOpt = "auto", profile_gpu_map: GpuMapOpt = None,
            global_batch: GlobalBatchOpt = None, seq_len: SeqLenOpt = None, memory_headroom: HeadroomOpt = None,
            job: JobOpt = None, global_batch_tokens: BatchTokensOpt = None, precision: PrecisionOpt = None,
            flash_attention: FlashOpt = None, grad_reduce_dtype: GradDtypeOpt = None,
            distributed_optimizer: DistOptOpt = None, overlap: OverlapOpt = None,
            objective: Annotated[str, typer.Option(help="min-time | min-cost.")] = "min-time",
            time_limit: TimeLimitOpt = None, budget: BudgetOpt = None,
            mode: Annotated[str, typer.Option(help="megatron | free.")] = "megatron",
            planners: Annotated[Optional[str], typer.Option(
                help="Comma-separated planners: cpsat, highs, cbc, brute-force, warm-start, aceso, fasop, metis. "
                     "Default: cpsat,warm-start (a suite file may name its own).")] = None,
            max_solve_time: Annotated[Optional[str], typer.Option(
                "--max-solve-time", help="The same wall-clock limit for every planner, e.g. 30s (a suite file may "
                                         "name its own). Default: --work-limit 30 when every planner measures "
                                         "work, else 30s.")] = None,
            work_limit: WorkLimitOpt = None,
            seed: SeedOpt = 1,
            fix: Annotated[Optional[str], typer.Option(help="Pin global choices, as for solve.")] = None,
            out: Annotated[str, typer.Option(
                "--out", help="Where to write the comparison: FILE.json and FILE.csv beside it.")] = "compare.json",
            plan_files: Annotated[Optional[list[str]], typer.Option(
                "--plan", help="Also score this plan.json (e.g. from import-plan) beside the planners; repeatable. "
                               "Without instance flags the instance is the first plan's.")] = None,
            suite: Annotated[Optional[str], typer.Option(
                help="Compare over a suite instead of one instance: 'shipped' or a suite YAML.")] = None,
            random_cases: Annotated[Optional[int], typer.Option(
                "--random", help="Compare over N generated instances (with --seed; sizes up to --max-gpus).")] = None,
            max_gpus: Annotated[int, typer.Option(help="--random: GPUs per generated cluster at most.")] = 32,
            workers: Annotated[int, typer.Option(help="Suite cases run side by side (processes or Ray tasks).")] = 1,
            executor: Annotated[str, typer.Option(help="Suite runs: local (processes) | ray.")] = "local",
            address: Annotated[Optional[str], typer.Option(
                help="--executor ray: a running Ray cluster's address (default: start a local one).")] = None,
            results: Annotated[Optional[str], typer.Option(
                help="Suite runs: stream each finished case to this JSON-lines file and resume from it.")] = None,
            report: Annotated[Optional[str], typer.Option(
                help="Suite runs: also write one self-contained HTML page (tables and plots).")] = None,
            json_out: JsonOpt = False) -> None:
    """Each planner gets the same instance, limits and search time; every plan is scored by the
    cost model, the checker and the simulator; the gap is to the best bound any exact planner
    proved. Exit 3 if a plan beats a proven bound (a bug in one of them). With --suite or
    --random: every case of a suite, a summary per planner (how often it is optimal, its gaps,
    its search time against the exact planner's), JSON, CSV and an optional HTML report."""
    from milp_plan import compare as comparing
    from milp_plan import solve as solving
    from milp_plan.errors import InputError, InternalError
    from milp_plan.fileio import check_output, write_atomic
    from milp_plan.formulations.space import parse_fix
    from dataclasses import replace
    from pathlib import Path

    from milp_plan.instance import build_instance, instance_from_inputs
    from milp_plan.job import Objective
    from milp_plan.plan import read_plan
    from milp_plan.report import render_comparison
    from milp_plan.units import parse_duration_s, parse_money
    if suite is not None or random_cases is not None:
        if plan_files:
            raise InputError("--plan scores plans on their own instance; leave it out of a suite run", field="plan")
        instance_flags = {"--cluster": cluster, "--model": model, "--profiles": profiles, "--global-batch": global_batch,
                          "--seq-len": seq_len, "--memory-headroom": memory_headroom, "--time-limit": time_limit,
                          "--budget": budget, "--fix": fix, "--job": job, "--global-batch-tokens": global_batch_tokens,
                          "--precision": precision, "--flash-attention": flash_attention,
                          "--grad-reduce-dtype": grad_reduce_dtype, "--distributed-optimizer": distributed_optimizer,
                          "--overlap": overlap}
        given = [flag for flag, value in instance_flags.items() if value is not None]
        if given:
            raise InputError(f"{given[0]} describes one instance; a suite's cases carry their own (drop it, or "
                             "write it into the suite YAML)", field=given[0].lstrip("-"))
        _compare_suite(suite, random_cases, max_gpus, seed, planners, max_solve_time, work_limit, workers, executor,
                       address, results, out, report, json_out)
        return
    for flag, value in (("--executor", executor != "local"), ("--address", address), ("--results", results),
                        ("--report", report), ("--workers", workers != 1)):
        if value:
            raise InputError(f"{flag} is for suite runs; add --suite shipped|FILE or --random N",
                             field=flag.lstrip("-"))
    planners = planners or ",".join(comparing.DEFAULT_PLANNERS)
    if objective not in ("min-time", "min-cost"):
        raise InputError(f"compare ranks by min-time or min-cost, got {objective!r}", field="objective")
    obj = Objective(kind=objective, time_limit_s=None if time_limit is None else parse_duration_s(time_limit,
                    field="time-limit"), budget=None if budget is None else parse_money(budget), mode=mode)
    names = [n.strip() for n in planners.split(",") if n.strip()]
    if not names or len(set(names)) != len(names):
        raise InputError("give each planner once, e.g. cpsat,warm-start", field="planners")
    limit_s, work = _search_limits(max_solve_time, work_limit, names)
    for name in names:
        solving.check_request(solving.SolveRequest(name, fix, limit_s, seed))
    comparing.check_work_limit(names, work)
    json_path = out if out.endswith(".json") else out + ".json"
    csv_path = json_path[:-5] + ".csv"
    for path in (json_path, csv_path):
        check_output(path, allow_stdout=False)
    given = [(path, read_plan(path)) for path in plan_files or ()]
    for path, plan in given:
        if plan.phases is not None:
            raise InputError("a plan with phases (a strategy per length bucket) is compared by `solve --lengths`, "
                             "not beside single-length planners; give a plan without phases", source=path,
                             field="phases")
    job_flags = (job, global_batch_tokens, precision, flash_attention, grad_reduce_dtype, distributed_optimizer, overlap)
    if given and all(v is None for v in (cluster, model, profiles, global_batch, seq_len, memory_headroom,
                                         *job_flags)):
        first, plan = given[0]
        if not plan.inputs:
            raise InputError("the plan records no inputs; give the instance flags (--cluster, --model, ...)",
                             source=first, field="inputs")
        inst = replace(instance_from_inputs(plan.inputs, first), objective=obj)
    else:
        inst = build_instance(instance_spec(cluster, model, profiles, profile_format, profile_gpu_map, global_batch,
                                            seq_len, memory_headroom, *job_flags), obj)
    for path, plan in given:
        comparing.same_instance(inst, plan, path)
    result = comparing.compare(inst, obj.limits(), names, time_limit_s=limit_s, seed=seed, work_limit=work,
                               fix=solving.job_fix(inst, parse_fix(fix)),
                               plans=[(Path(path).name, plan) for path, plan in given])
    doc = result.to_dict()
    write_atomic(json_path, json.dumps(doc, indent=2) + "\n")
    write_atomic(csv_path, result.to_csv())
    typer.echo(json.dumps(doc, indent=2) if json_out else
               render_comparison(result) + f"\nWrote {json_path}, {csv_path}")
    if result.violations:
        raise InternalError("a plan beats a proven bound: " + "; ".join(result.violations))


def _compare_suite(suite_spec, random_cases, max_gpus, seed, planner_list, max_solve_time, work_limit, workers,
                   executor, address, results, out, report, json_out) -> None:
    """compare --suite / --random: every case, streamed to --results; summary, JSON, CSV, HTML."""
    from milp_plan import planners as registry
    from milp_plan import suite as suites
    from milp_plan import suite_report
    from milp_plan.errors import InputError, InternalError
    from milp_plan.fileio import check_output, write_atomic
    if suite_spec is not None and random_cases is not None:
        raise InputError("give --suite or --random, not both", field="suite")
    the_suite = suites.load_suite(suite_spec) if suite_spec is not None else \
        suites.random_suite(random_cases, seed, max_gpus)
    from milp_plan.compare import DEFAULT_PLANNERS
    names = [n.strip() for n in planner_list.split(",") if n.strip()] if planner_list is not None else \
        list(the_suite.planners or DEFAULT_PLANNERS)
    if not names or len(set(names)) != len(names):
        raise InputError("give each planner once, e.g. cpsat,warm-start", field="planners")
    for name in names:
        registry.get(name)
    limit_s, work = _search_limits(max_solve_time, work_limit, names, the_suite)
    from milp_plan.compare import check_work_limit
    check_work_limit(names, work)
    json_path = out if out.endswith(".json") else out + ".json"
    csv_path = json_path[:-5] + ".csv"
    for path in (json_path, csv_path) + ((report,) if report else ()):
        check_output(path, allow_stdout=False)
    if report:
        suite_report._pyplot()  # refuse now, not after the run, when matplotlib is missing

    def show(done: int, total: int, rec: dict) -> None:
        if not json_out:
            best = min((r["objective"] for r in rec["rows"] if r["valid"]), default=None)
            typer.echo(f"[{done}/{total}] {rec['case']}: " + (f"refused ({rec['error']})" if rec.get("error") else
                       f"best {best:.6g}" if best is not None else "no valid plan"), err=True)
    from milp_plan import deadline
    with deadline.handle_signals():
        run = suites.run_suite(the_suite, names, limit_s, seed=seed, workers=workers, executor=executor,
                               address=address, results=results, progress=show, work_limit=work)
    if deadline.interrupted():
        name, code = _signal_name()
        kept = f"; {len(run.records)} finished cases are in {results}: rerun to resume" if results else ""
        raise Interrupted(f"interrupted by {name} during the suite; {json_path} left unchanged{kept}", code)
    summary = suite_report.summarise(run.records)
    meta = {"suite": the_suite.name, "cases": len(the_suite.cases), "planners": ", ".join(names),
            "max solve time per planner (s)": limit_s, "work limit per planner": work, "seed": seed,
            "executor": executor, "workers": workers}
    doc = {"meta": meta, "summary": summary, "records": run.records}
    write_atomic(json_path, json.dumps(doc, indent=2) + "\n")
    write_atomic(csv_path, suite_report.rows_csv(run.records))
    if report:
        write_atomic(report, suite_report.render_html(f"milp-plan compare: {the_suite.name}", meta, summary,
                                                      run.records))
    resumed = f" ({run.resumed} read back from {results})" if run.resumed else ""
    typer.echo(json.dumps(doc, indent=2) if json_out else suite_report.render_summary(summary) +
               f"\n{len(run.records)} cases{resumed}. Wrote {json_path}, {csv_path}" + (f", {report}" if report else ""))
    if summary["violations"]:
        raise InternalError("a plan beats a proven bound: " + "; ".join(summary["violations"]))


def _fail(message: str, code: int) -> None:
    """One line on stderr; with --json also {"error", "exit_code"} on stdout; then exit."""
    message = " ".join(str(message).split())
    typer.echo(f"error: {message}", err=True)
    if "--json" in sys.argv[1:]:
        typer.echo(json.dumps({"error": message, "exit_code": code}))
    sys.exit(code)


def _exit_now() -> None:
    """After an interrupt: leave without tearing down the solver's large objects (a second or
    more on 8192 GPUs). Not inside pytest, which calls main() in-process."""
    import os
    exc = sys.exc_info()[1]
    if isinstance(exc, SystemExit) and "pytest" not in sys.modules:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(exc.code or 0))


def one_blas_thread() -> None:
    """Before numpy is imported: one OpenBLAS thread, unless the user set a number. numpy's
    OpenBLAS starts a thread per core when imported, 0.11 s of CPU on 2 cores (`solve` on the
    default: 1.52 -> 1.38 s CPU, 1.42 -> 1.38 s wall; tests/benchmarks/bench_startup.py), and
    its threads run beside CP-SAT's. The planner's numpy work is element-wise or small: no
    BLAS call large enough to share out."""
    import os
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def main() -> None:
    """Console entry point: user mistakes become one line and exit 2, never a traceback;
    anything unexpected is exit 3 with one line asking for a bug report."""
    one_blas_thread()
    try:
        app(standalone_mode=False, prog_name="milp-plan")
    except Interrupted as exc:
        try:
            _fail(str(exc), exc.exit_code)
        finally:
            _exit_now()
    except MilpPlanError as exc:
        _fail(str(exc), exc.exit_code)
    except SystemExit:
        raise
    except (KeyboardInterrupt, typer.Abort):  # a second Ctrl-C, or one outside a search
        _fail("interrupted by SIGINT outside the search; nothing written", EXIT_SIGINT)
    except BrokenPipeError:  # `milp-plan solve | head`: the reader left; not a bug, nothing to report
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(EXIT_SIGPIPE)
    except RecursionError:
        _fail("input nested too deeply to process; simplify it", EXIT_BAD_INPUT)
    except MemoryError:
        _fail("out of memory; the input is too large for this machine", EXIT_BAD_INPUT)
    except Exception as exc:  # usage errors of the command-line parser: one line too
        if hasattr(exc, "show") and hasattr(exc, "exit_code"):
            if hasattr(exc, "format_message") and type(exc).__name__ != "NoArgsIsHelpError":
                ctx = getattr(exc, "ctx", None)
                hint = f"; see '{ctx.command_path} --help'" if ctx is not None else ""
                _fail(" ".join(exc.format_message().split()).rstrip(".") + hint, EXIT_BAD_INPUT)
            else:
                exc.show()  # no arguments: the help text
            sys.exit(EXIT_BAD_INPUT)
        where = ""
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        if tb is not None:
            where = f" at {tb.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno}"
        detail = " ".join(str(exc).split())
        detail = detail if len(detail) <= 200 else detail[:197] + "..."
        _fail(f"internal error ({type(exc).__name__}: {detail}{where}); this is a bug in milp-plan: please report it "
              f"with the command line and the input files", EXIT_INTERNAL)


if __name__ == "__main__":  # pragma: no cover
    main()
