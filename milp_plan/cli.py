"""The `milp-plan` command line: one thin command per verb.

Exit codes: 0 plan found / check passed, 1 infeasible / no plan / check failed,
2 bad input (one line naming file, field and fix; never a traceback).
"""
from __future__ import annotations

import json
import sys
from typing import Annotated, Optional

import typer

from milp_plan.errors import EXIT_BAD_INPUT, InputError, MilpPlanError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="Plan parallel Transformer training on heterogeneous, rented GPU clusters.")

# ---- options shared by the commands that build an instance ------------------------------
ClusterOpt = Annotated[Optional[str], typer.Option(
    "--cluster", help="Cluster YAML, a shipped cluster name, or metis:CLUSTER.json,HOSTFILE. Default: default.")]
ModelOpt = Annotated[Optional[str], typer.Option("--model", help="Catalog model name or model YAML. Default: gpt3-6.7b.")]
ProfilesOpt = Annotated[Optional[str], typer.Option(
    "--profiles", help="Profile directory (native CSV, Metis or FASOP). Default: shipped analytic profiles.")]
ProfileFormatOpt = Annotated[str, typer.Option("--profile-format", help="auto | native | metis | fasop.")]
GpuMapOpt = Annotated[Optional[str], typer.Option(
    "--profile-gpu-map", help="Map profile GPU names to cluster GPUs: A100=A100-40GB,A10=A10.")]
GlobalBatchOpt = Annotated[Optional[int], typer.Option("--global-batch", help="Global batch size (samples). Default: 256.")]
SeqLenOpt = Annotated[Optional[int], typer.Option("--seq-len", help="Sequence length. Default: the model's.")]
HeadroomOpt = Annotated[Optional[float], typer.Option(
    "--memory-headroom", help="Fraction of GPU memory kept free. Default: 0.10.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON on stdout instead of tables.")]


@app.callback()
def _root() -> None:
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


def instance_spec(cluster, model, profiles, profile_format, gpu_map, global_batch, seq_len, headroom):
    from milp_plan.instance import InstanceSpec
    for name, v in (("global-batch", global_batch), ("seq-len", seq_len)):
        if v is not None and v <= 0:
            raise InputError(f"must be > 0, got {v}", field=name)
    return InstanceSpec(cluster=cluster, model=model, profiles=profiles, profile_format=profile_format,
                        profile_gpu_map=parse_gpu_map(gpu_map), global_batch_size=global_batch, seq_length=seq_len,
                        memory_headroom=headroom)


def echo_notices(inst) -> None:
    for n in inst.notices:
        typer.echo(f"note: {n}", err=True)


@app.command()
def inspect(cluster: ClusterOpt = None, model: ModelOpt = None, profiles: ProfilesOpt = None,
            profile_format: ProfileFormatOpt = "auto", profile_gpu_map: GpuMapOpt = None,
            global_batch: GlobalBatchOpt = None, seq_len: SeqLenOpt = None, memory_headroom: HeadroomOpt = None,
            json_out: JsonOpt = False) -> None:
    """Show the instance: cluster, model, job and profile coverage. No arguments: the default."""
    from milp_plan.instance import build_instance
    from milp_plan.report import instance_report, render_instance
    inst = build_instance(instance_spec(cluster, model, profiles, profile_format, profile_gpu_map, global_batch,
                                        seq_len, memory_headroom))
    report = instance_report(inst)
    if json_out:
        typer.echo(json.dumps(report, indent=2))
    else:
        echo_notices(inst)
        typer.echo(render_instance(report))


@app.command()
def solve(cluster: ClusterOpt = None, model: ModelOpt = None, profiles: ProfilesOpt = None,
          profile_format: ProfileFormatOpt = "auto", profile_gpu_map: GpuMapOpt = None,
          global_batch: GlobalBatchOpt = None, seq_len: SeqLenOpt = None, memory_headroom: HeadroomOpt = None,
          objective: Annotated[str, typer.Option(help="min-time | min-cost | pareto.")] = "min-time",
          time_limit: Annotated[Optional[str], typer.Option(
              "--time-limit", help="Step-time limit, e.g. 1.2s/step (needed by min-cost).")] = None,
          budget: Annotated[Optional[str], typer.Option(help="Budget, e.g. 40$/h or 0.02$/step.")] = None,
          mode: Annotated[str, typer.Option(
              help="megatron (uniform tp/dp/recompute; stock Megatron-LM) | free (tp, dp and recompute per "
                   "stage; needs a per-stage runtime).")] = "megatron",
          solver: Annotated[str, typer.Option(help="auto | cpsat | highs | cbc | brute-force.")] = "auto",
          max_solve_time: Annotated[str, typer.Option("--max-solve-time", help="Bound on the search, e.g. 30s.")] = "30s",
          seed: Annotated[int, typer.Option(help="Solver seed.")] = 1,
          workers: Annotated[int, typer.Option(help="Solver threads (1 is deterministic).")] = 1,
          fix: Annotated[Optional[str], typer.Option(
              help="Pin global choices: tp=8,pp=8,dp=1,mbs=1,vpp=3,recompute=full,sp=off,schedule=interleaved; "
                   "cap with tp<=4,mbs<=8.")] = None,
          extrapolate: Annotated[bool, typer.Option(
              "--extrapolate", help="Also plan on tp and micro-batch sizes the profiles did not measure (filled "
                                    "by the profile's rules; the plan lists every filled point).")] = False,
          max_tp: Annotated[Optional[int], typer.Option("--max-tp", help="Largest tensor-parallel size.")] = None,
          max_micro_batch: Annotated[Optional[int], typer.Option(
              "--max-micro-batch", help="Largest micro-batch size (per data-parallel replica).")] = None,
          out: Annotated[str, typer.Option("--out", help="Where to write the plan.")] = "plan.json",
          plot: Annotated[Optional[str], typer.Option(help="Pareto: write the front as a PNG.")] = None,
          record_wall_time: Annotated[bool, typer.Option(
              "--record-wall-time", help="Store the solve's wall time in plan.json (breaks byte-identity).")] = False,
          json_out: JsonOpt = False) -> None:
    """Find the best plan (default: fastest step on the shipped default cluster) and write plan.json."""
    from milp_plan import solve as solving
    from milp_plan.instance import build_instance
    from milp_plan.job import Objective
    from milp_plan.plan import write_plan
    from milp_plan.report import render_plan
    from milp_plan.units import parse_duration_s, parse_money
    obj = Objective(kind=objective, time_limit_s=None if time_limit is None else parse_duration_s(time_limit,
                    field="time-limit"), budget=None if budget is None else parse_money(budget), mode=mode)
    from milp_plan.formulations.space import with_space_options
    fix = with_space_options(fix, extrapolate, max_tp, max_micro_batch)
    req = solving.SolveRequest(solver, fix, parse_duration_s(max_solve_time, field="max-solve-time"), seed, workers)
    inst = build_instance(instance_spec(cluster, model, profiles, profile_format, profile_gpu_map, global_batch,
                                        seq_len, memory_headroom), obj)
    if objective == "pareto":
        from milp_plan.pareto import run_pareto
        run_pareto(inst, req, out="pareto.json" if out == "plan.json" else out, plot=plot, json_out=json_out)
        return
    if not json_out:
        echo_notices(inst)
    limits = solving.limits_for(inst)
    progress = None if json_out else _progress_printer()
    result = solving.run(inst, req, limits, progress=progress)
    if progress is not None:
        progress.close()
    plan = solving.require_plan(inst, req, limits, result)
    if record_wall_time:
        plan = plan.with_(solver=plan.solver.__class__(**{**plan.solver.__dict__, "wall_time_s": result.wall_time_s}))
    write_plan(out, plan)
    if json_out:
        doc = plan.to_dict()
        doc["solver"] = {**doc["solver"], "wall_time_s": result.wall_time_s}
        typer.echo(json.dumps(doc, indent=2))
    else:
        from milp_plan.sim import simulate_plan
        sim = simulate_plan(inst, plan)
        pred = plan.predicted.step_time_s
        typer.echo(render_plan(plan, inst, result))
        typer.echo(f"Simulated event by event: step {sim.step_time_s:.4g} s (closed form "
                   f"{(pred - sim.step_time_s) / sim.step_time_s:+.2%}); peak memory within "
                   f"{max(abs(a.peak_memory_gib - b) for a, b in zip(plan.predicted.stages, sim.peak_memory_gib)):.2g} "
                   "GiB of the prediction")
        typer.echo(f"Wrote {out}")


class _progress_printer:
    """Incumbent, bound and elapsed time on stderr for solves longer than a second (TTY only)."""

    def __init__(self) -> None:
        self.active = sys.stderr.isatty()
        self.shown = False
        self.last = 0.0

    def __call__(self, p) -> None:
        if not self.active or p.elapsed_s < 1.0 or p.elapsed_s - self.last < 0.2:
            return
        self.last = p.elapsed_s
        inc = "-" if p.incumbent is None else f"{p.incumbent:.6g}"
        bnd = "-" if p.bound is None else f"{p.bound:.6g}"
        sys.stderr.write(f"\r  solving: incumbent {inc}  bound {bnd}  configs {p.done}/{p.total}  "
                         f"{p.elapsed_s:.1f}s ")
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\n")


@app.command()
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


@app.command()
def launch(
    plan: Annotated[str, typer.Argument(help="plan.json written by `milp-plan solve`.")],
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
    if not res.compatible:
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


@app.command()
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
    json_out: JsonOpt = False,
) -> None:
    """Re-check a plan, simulate it event by event, compare prediction and simulation (exit 0 / 1 / 2)."""
    from milp_plan.verify import parse_tolerance, render_report, report_dict, verify_plan
    report = verify_plan(plan_file, parse_tolerance(tolerance), schedule, vpp, dp_overlap)
    if report.result is not None and trace:
        from milp_plan.sim.trace import write_trace
        write_trace(trace, report.result)
    if report.result is not None and gantt:
        from milp_plan.sim.gantt import write_gantt
        write_gantt(gantt, report.result)
    typer.echo(json.dumps(report_dict(report), indent=2) if json_out else render_report(report))
    if report.exit_code:
        sys.exit(report.exit_code)


def main() -> None:
    """Console entry point: user mistakes become one line and exit 2, never a traceback."""
    try:
        app(standalone_mode=False)
    except MilpPlanError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
    except typer.Abort:
        sys.exit(130)
    except Exception as exc:  # usage errors of the command-line parser: one line too
        if hasattr(exc, "show") and hasattr(exc, "exit_code"):
            if hasattr(exc, "format_message") and type(exc).__name__ != "NoArgsIsHelpError":
                ctx = getattr(exc, "ctx", None)
                hint = f"; see '{ctx.command_path} --help'" if ctx is not None else ""
                typer.echo("error: " + " ".join(exc.format_message().split()).rstrip(".") + hint, err=True)
            else:
                exc.show()  # no arguments: the help text
            sys.exit(EXIT_BAD_INPUT)
        raise


if __name__ == "__main__":  # pragma: no cover
    main()
