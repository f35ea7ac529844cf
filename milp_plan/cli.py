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

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
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
    except Exception as exc:  # usage errors of the command-line parser
        if hasattr(exc, "show") and hasattr(exc, "exit_code"):
            exc.show()
            sys.exit(EXIT_BAD_INPUT)
        raise


if __name__ == "__main__":  # pragma: no cover
    main()
