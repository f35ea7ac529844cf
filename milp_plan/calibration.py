"""Calibration of the analytic model's constants on published end-to-end measurements.

Each row of profiles/calibration/measurements.csv is one published training run: the
system (GPU, links), the model's shape, tp, pp, dp, the global batch, the job's settings
and the measured throughput in TFLOP/s per GPU. The measured step time is the source's own
FLOPs per step over that throughput:

    narayanan-recompute (Narayanan et al. 2021, eq. 3, full recompute counted):
        F = 96 B s l h^2 (1 + s / (6 h) + V / (16 l h))
    megatron-core (Megatron-LM training.num_floating_point_operations, GPT, no recompute):
        F = 72 B s l h^2 (1 + s / (6 h) + V / (12 l h))
    step_s = F / (TFLOP/s per GPU x 1e12 x GPUs)

milp-plan predicts each row with its own cost model: an Instance of that cluster (one node
type), model and job, whose analytic profile is generated with the constants under test
(analytic.Constants), and the Megatron plan of the row (stages in rank order, equal layer
counts), predicted by predict.evaluate. What a source does not give is milp-plan's best
choice among the candidates that fit in memory: the micro-batch size (1, 2, 4, 8), the
interleaving (vpp dividing the layers per stage, m % pp == 0) and, where the source does not
say, the recompute (none, selective, full). Link bandwidths are the row's line rates, its
links named (NVLink, InfiniBand), so NCCL's published figures apply (nccl.py); nothing of the
communication is fitted. A row whose run overlapped communication (Megatron-Core's
--overlap-grad-reduce, --overlap-param-gather, --tp-comm-overlap) runs a job that says so.

The fit minimises the sum of squared log errors of the step time (scipy's least_squares,
trust-region reflective, from the engineering estimates analytic.ESTIMATES: deterministic), choosing the free knobs with the
default constants, fitting, choosing them again with the fitted ones and fitting again.
`leave_one_out` refits without each row and predicts it.

    python -m milp_plan.calibration              # fit, print the table, write fit.json
    python -m milp_plan.calibration --loo        # also the leave-one-out errors
"""
from __future__ import annotations

import csv
import functools
import json
import math
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Sequence

from milp_plan import analytic, predict
from milp_plan.cluster import cluster_from_mapping, gpu_catalog
from milp_plan.instance import Instance, InstanceSpec, build_instance
from milp_plan.job import Job
from milp_plan.model import model_from_mapping
from milp_plan.plan import Device, Plan, Stage
from milp_plan.profile import Profile
from milp_plan.resources import shipped_dir

DATA = shipped_dir("profiles") / "calibration" / "measurements.csv"
FIT_FILE = shipped_dir("profiles") / "calibration" / "fit.json"
MICRO_BATCHES = (1, 2, 4, 8)
RECOMPUTES = ("none", "selective", "full")
# fitted: name -> (lower, upper). attention_efficiency and attention_bwd_factor (the fused
# attention core) are fitted on the rows that run flash attention (mcore-*, H100)
PARAMS = {"gemm_efficiency": (0.3, 1.0), "gemm_dim_half": (1.0, 2048.0), "attention_efficiency": (0.1, 1.0),
          "attention_bwd_factor": (1.5, 4.0), "memory_efficiency": (0.3, 1.0),
          "kernel_launch_s": (0.0, 1e-4)}
# the rows' links at their nominal figures: what NCCL reaches on them is the cost model's
# (nccl.py: published nccl-tests figures), not fitted here
DEFAULT_COMM_EFFICIENCY = 1.0


@dataclass(frozen=True)
class Row:
    id: str
    source: str
    where: str
    system: str
    gpu: str
    gpus_per_node: int
    intra_node_gb_per_s: float
    inter_node_gb_per_s: float
    intra_node_link: str      # nvlink (nccl.py: the published figures of the link kind apply)
    inter_node_link: str      # infiniband
    num_gpus: int
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    vocab_size: int
    seq_length: int
    tied_embeddings: bool
    tp: int
    pp: int
    dp: int
    global_batch: int
    flash_attention: bool
    sequence_parallel: bool
    distributed_optimizer: bool
    recompute: str            # "" = not given by the source
    flops_formula: str
    measured_tflops_per_gpu: float
    overlapped_communication: bool   # the source overlapped dp / tp communication with compute

    @property
    def in_fit(self) -> bool:
        """Every row is fitted: the cost model expresses the overlapped runs' settings
        (Job.overlap_*: the job of `_instance`)."""
        return True

    def flops_per_step(self) -> float:
        B, s, l, h, V = self.global_batch, self.seq_length, self.num_layers, self.hidden_size, self.vocab_size
        if self.flops_formula == "narayanan-recompute":
            return 96.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
        if self.flops_formula == "megatron-core":
            return 72.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))
        raise ValueError(f"{self.id}: unknown flops_formula {self.flops_formula!r}")

    @property
    def measured_step_s(self) -> float:
        return self.flops_per_step() / (self.measured_tflops_per_gpu * 1e12 * self.num_gpus)


def load_rows(path: str | Path = DATA) -> list[Row]:
    if not Path(path).is_file():
        from milp_plan.errors import InputError
        raise InputError("calibration data not found (profiles/calibration/measurements.csv in the source "
                         "repository, milp_plan/shipped/profiles/calibration/ when installed)", source=str(path))
    out = []
    with open(path, newline="") as fh:
        for rec in csv.DictReader(fh):
            kw = {}
            for f in fields(Row):
                v = rec[f.name]
                if f.type in ("int",):
                    kw[f.name] = int(v)
                elif f.type == "float":
                    kw[f.name] = float(v)
                elif f.type == "bool":
                    kw[f.name] = v.strip().lower() == "true"
                else:
                    kw[f.name] = v
            row = Row(**kw)
            assert row.tp * row.pp * row.dp == row.num_gpus, row.id
            out.append(row)
    return out


@dataclass(frozen=True)
class Fitted:
    constants: analytic.Constants
    comm_efficiency: float

    def vector(self) -> list[float]:
        return [getattr(self.constants, k) if k != "comm_efficiency" else self.comm_efficiency for k in PARAMS]

    @staticmethod
    def from_vector(x: Sequence[float]) -> "Fitted":
        kw = dict(zip(PARAMS, (float(v) for v in x)))
        comm = kw.pop("comm_efficiency", DEFAULT_COMM_EFFICIENCY)
        return Fitted(replace(analytic.ESTIMATE, **kw), comm)

    def as_dict(self) -> dict[str, float]:
        return {**self.constants.as_dict(), "COMM_EFFICIENCY": self.comm_efficiency}


DEFAULTS = Fitted(analytic.ESTIMATE, DEFAULT_COMM_EFFICIENCY)   # the estimates: where every fit starts


# ---- one row as milp-plan sees it -------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _instance(row: Row, comm_efficiency: float) -> Instance:
    nodes = row.num_gpus // row.gpus_per_node
    cluster = cluster_from_mapping({"name": row.id, "node_types": [{
        "name": "node", "gpu": row.gpu, "gpus_per_node": row.gpus_per_node, "count": nodes,
        "intra_node_gb_per_s": row.intra_node_gb_per_s * comm_efficiency,
        "inter_node_gb_per_s": row.inter_node_gb_per_s * comm_efficiency, "usd_per_hour": 0,
        "intra_node_link": row.intra_node_link, "inter_node_link": row.inter_node_link}]},
        f"calibration row {row.id}")
    h = row.hidden_size
    model = model_from_mapping(row.id, {"arch": "gpt", "num_layers": row.num_layers, "hidden_size": h,
                                        "ffn_hidden_size": 4 * h, "num_attention_heads": row.num_attention_heads,
                                        "vocab_size": row.vocab_size, "seq_length": row.seq_length,
                                        "tied_embeddings": row.tied_embeddings}, f"calibration row {row.id}")
    ov = row.overlapped_communication   # the README's runs: --overlap-grad-reduce, --overlap-param-gather,
    job = Job(global_batch_size=row.global_batch, seq_length=row.seq_length, flash_attention=row.flash_attention,
              memory_headroom=0.0, distributed_optimizer=row.distributed_optimizer or not ov,
              overlap_grad_reduce=ov, overlap_param_gather=ov and row.distributed_optimizer,
              tp_comm_overlap=ov and row.tp > 1)   # and --tp-comm-overlap
    return build_instance(InstanceSpec(), cluster=cluster, model=model, job=job)


def instance_for(row: Row, fit: Fitted) -> Instance:
    """The row's instance with its analytic profile generated from `fit`'s constants."""
    base = _instance(row, fit.comm_efficiency)
    gpu = gpu_catalog()[row.gpu]
    prof = analytic.generate_profile(base.model, [gpu], row.flash_attention, fit.constants, tps=[row.tp],
                                     micro_batches=[1], seq_lengths=[row.seq_length])
    prof = Profile(prof.table, prof.provenance)
    prof.generator = analytic.Generator(base.model, {gpu.name: gpu}, row.flash_attention, fit.constants)
    return replace(base, profile=prof)


@dataclass(frozen=True)
class Knobs:
    """What the source leaves open: micro-batch size, interleaving, recompute."""

    micro_batch: int
    vpp: int
    recompute: str


@functools.lru_cache(maxsize=None)
def plan_for(row: Row, k: Knobs) -> Plan:
    """Megatron's layout: ranks in tp-dp-pp order (stage s holds ranks s tp dp ...), equal stages."""
    per_stage = row.num_layers // row.pp
    width = row.tp * row.dp
    stages = []
    for s in range(row.pp):
        devs = tuple(Device(r // row.gpus_per_node, r % row.gpus_per_node) for r in range(s * width, (s + 1) * width))
        stages.append(Stage(row.gpu, devs, s * per_stage, per_stage, row.tp, row.dp, k.micro_batch, k.recompute,
                            per_stage if k.recompute == "full" else 0))
    m = row.global_batch // (row.dp * k.micro_batch)
    return Plan(tuple(stages), row.global_batch, m, schedule="interleaved" if k.vpp > 1 else "1f1b", vpp=k.vpp,
                distributed_optimizer=row.distributed_optimizer and row.dp > 1,
                sequence_parallel=row.sequence_parallel and row.tp > 1)


def candidates(row: Row) -> list[Knobs]:
    per_stage = row.num_layers // row.pp
    out = []
    for mbs in MICRO_BATCHES:
        if row.global_batch % (row.dp * mbs):
            continue
        m = row.global_batch // (row.dp * mbs)
        vpps = [1] + [v for v in range(2, per_stage + 1) if row.pp > 1 and per_stage % v == 0 and m % row.pp == 0]
        for v in vpps:
            for rc in ((row.recompute,) if row.recompute else RECOMPUTES):
                out.append(Knobs(mbs, v, rc))
    return out


def predict_row(row: Row, fit: Fitted, knobs: Knobs) -> tuple[float, bool]:
    """(predicted step seconds, fits in memory) of the row's plan with these knobs."""
    inst = instance_for(row, fit)
    p = predict.evaluate(inst, plan_for(row, knobs))
    fits = all(sp.peak_memory_gib <= sp.capacity_gib for sp in p.stages)
    return p.step_time_s, fits


def choose_knobs(row: Row, fit: Fitted) -> Knobs:
    """The fastest candidate that fits in memory (else the one with the least memory... the
    fastest of all, said by `fits` False in the report)."""
    inst = instance_for(row, fit)
    best, best_any = None, None
    for k in candidates(row):
        p = predict.evaluate(inst, plan_for(row, k))
        fits = all(sp.peak_memory_gib <= sp.capacity_gib for sp in p.stages)
        key = (p.step_time_s, k.micro_batch, k.vpp, RECOMPUTES.index(k.recompute))
        if fits and (best is None or key < best[0]):
            best = (key, k)
        if best_any is None or key < best_any[0]:
            best_any = (key, k)
    return (best or best_any)[1]


# ---- the fit ------------------------------------------------------------------------------
def residuals(x: Sequence[float], rows: Sequence[Row], knobs: Sequence[Knobs]) -> list[float]:
    fit = Fitted.from_vector(x)
    return [math.log(predict_row(r, fit, k)[0] / r.measured_step_s) for r, k in zip(rows, knobs)]


def fit_constants(rows: Sequence[Row], start: Fitted = DEFAULTS, max_nfev: int = 60) -> tuple[Fitted, list[Knobs]]:
    """Least squares on the log step-time errors of `rows` (those `in_fit`), twice: knobs chosen
    with `start`, fit, knobs chosen again with the fit, fit again. Deterministic."""
    from scipy.optimize import least_squares
    rows = [r for r in rows if r.in_fit]
    lo = [b[0] for b in PARAMS.values()]
    hi = [b[1] for b in PARAMS.values()]
    fit = start
    knobs = [choose_knobs(r, fit) for r in rows]
    for _ in range(2):
        x0 = [min(max(v, a), b) for v, a, b in zip(fit.vector(), lo, hi)]
        res = least_squares(residuals, x0, bounds=(lo, hi), args=(rows, knobs), x_scale="jac", method="trf",
                            diff_step=1e-3, ftol=1e-4, xtol=1e-4, gtol=1e-8, max_nfev=max_nfev)
        fit = Fitted.from_vector(res.x)
        knobs = [choose_knobs(r, fit) for r in rows]
    return fit, knobs


@dataclass(frozen=True)
class RowResult:
    row: Row
    measured_step_s: float
    before_s: float
    after_s: float
    knobs: Knobs
    loo_s: float | None = None

    @staticmethod
    def err(pred: float, meas: float) -> float:
        return pred / meas - 1.0


def evaluate(rows: Sequence[Row], fit: Fitted, loo: bool = False) -> list[RowResult]:
    out = []
    for i, r in enumerate(rows):
        before = predict_row(r, DEFAULTS, choose_knobs(r, DEFAULTS))[0]
        k = choose_knobs(r, fit)
        after = predict_row(r, fit, k)[0]
        loo_s = None
        if loo and r.in_fit:
            rest = [x for j, x in enumerate(rows) if j != i]
            f_i, _ = fit_constants(rest)   # from the defaults, as the full fit: nothing of row i leaks in
            loo_s = predict_row(r, f_i, choose_knobs(r, f_i))[0]
        out.append(RowResult(r, r.measured_step_s, before, after, k, loo_s))
    return out


def summary(results: Sequence[RowResult]) -> dict[str, float]:
    def stats(vals):
        a = [abs(v) for v in vals]
        return sum(a) / len(a), max(a)
    out = {}
    for part, keep in (("fit", True), ("held_out", False)):
        for name, get in (("before", lambda x: x.before_s), ("after", lambda x: x.after_s),
                          ("loo", lambda x: x.loo_s)):
            vals = [RowResult.err(get(x), x.measured_step_s) for x in results
                    if get(x) is not None and x.row.in_fit == keep]
            if vals:
                out[f"{part}_{name}_mean_abs_error"], out[f"{part}_{name}_worst_abs_error"] = stats(vals)
    return out


def render(results: Sequence[RowResult]) -> str:
    head = (f"{'row':<12} {'tp':>2} {'pp':>3} {'dp':>3} {'mbs':>3} {'vpp':>3} {'recompute':<9} "
            f"{'measured':>9} {'before':>9} {'err':>7} {'after':>9} {'err':>7} {'LOO':>9} {'err':>7}  (TFLOP/s/GPU)")
    lines = [head]
    for x in results:
        r = x.row

        def tf(step: float | None) -> str:
            return "-" if step is None else f"{r.flops_per_step() / (step * 1e12 * r.num_gpus):9.1f}"

        def e(step: float | None) -> str:
            return "-" if step is None else f"{100 * RowResult.err(step, x.measured_step_s):+6.1f}%"
        lines.append(f"{r.id + ('' if r.in_fit else '*'):<12} {r.tp:>2} {r.pp:>3} {r.dp:>3} {x.knobs.micro_batch:>3} {x.knobs.vpp:>3} "
                     f"{x.knobs.recompute:<9} {r.measured_tflops_per_gpu:9.1f} {tf(x.before_s)} {e(x.before_s)} "
                     f"{tf(x.after_s)} {e(x.after_s)} {tf(x.loo_s):>9} {e(x.loo_s):>7}")
    s = summary(results)
    for part, what in (("fit", "rows fitted"), ("held_out", "* rows not fitted")):
        if f"{part}_before_mean_abs_error" not in s:
            continue
        lines.append(f"{what}: step-time error, mean |e| / worst |e|: " + ", ".join(
            f"{k}: {100 * s[f'{part}_{k}_mean_abs_error']:.1f}% / {100 * s[f'{part}_{k}_worst_abs_error']:.1f}%"
            for k in ("before", "after", "loo") if f"{part}_{k}_mean_abs_error" in s))
    return "\n".join(lines)


def fit_document(fit: Fitted, results: Sequence[RowResult]) -> dict:
    """What fit.json holds: the constants, the summary and each row (rounded for stable bytes)."""
    def rnd(v):
        return None if v is None else float(f"{v:.6g}")
    return {
        "constants": {k: rnd(v) for k, v in fit.as_dict().items()},
        "defaults": {k: rnd(v) for k, v in DEFAULTS.as_dict().items()},
        "summary": {k: rnd(v) for k, v in summary(results).items()},
        "rows": [{"id": x.row.id, "in_fit": x.row.in_fit, "measured_step_s": rnd(x.measured_step_s), "before_step_s": rnd(x.before_s),
                  "after_step_s": rnd(x.after_s), "loo_step_s": rnd(x.loo_s), "micro_batch": x.knobs.micro_batch,
                  "vpp": x.knobs.vpp, "recompute": x.knobs.recompute} for x in results],
    }


def load_fit(path: str | Path = FIT_FILE) -> Fitted:
    c = json.loads(Path(path).read_text())["constants"]
    return Fitted(analytic.Constants(**{k.lower(): v for k, v in c.items() if k != "COMM_EFFICIENCY"}),
                  c["COMM_EFFICIENCY"])


def write_profiles(out_dir: str | Path, fit: Fitted) -> list[Path]:
    """analytic-calibrated-<model>.csv for every catalog model on every catalog GPU, generated
    with `fit`'s constants (flash attention, as the shipped profiles); the provenance records them."""
    from milp_plan.model import model_catalog
    from milp_plan.profile import write_native
    out = []
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    for model in model_catalog().values():
        path = d / f"analytic-calibrated-{model.name}.csv"
        prov = analytic.provenance(model, True, fit.constants)
        prov["note"] = "derived with constants fitted by milp_plan.calibration (profiles/calibration/fit.json)"
        write_native(path, analytic.generate_table(model, gpu_catalog().values(), c=fit.constants), prov)
        out.append(path)
    return out


def main(argv: Sequence[str] | None = None) -> None:  # pragma: no cover - maintenance entry point
    import argparse
    ap = argparse.ArgumentParser(description="Refit the analytic constants on published measurements.")
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--loo", action="store_true", help="also refit without each row and predict it")
    ap.add_argument("--write", default=None, help=f"write the fit as JSON (e.g. {FIT_FILE})")
    ap.add_argument("--write-profiles", default=None, metavar="DIR",
                    help="write analytic profiles with the constants of --from-fit (every catalog model on "
                         "every catalog GPU) to DIR, for `milp-plan solve --profiles DIR`; no refit")
    ap.add_argument("--from-fit", default=str(FIT_FILE), help="fit.json whose constants --write-profiles uses")
    a = ap.parse_args(argv)
    if a.write_profiles:
        for path in write_profiles(a.write_profiles, load_fit(a.from_fit)):
            print(path)
        return
    rows = load_rows(a.data)
    fit, _ = fit_constants(rows)
    results = evaluate(rows, fit, loo=a.loo)
    print("fitted:", json.dumps({k: float(f"{v:.6g}") for k, v in fit.as_dict().items()}))
    print(render(results))
    if a.write:
        Path(a.write).write_text(json.dumps(fit_document(fit, results), indent=2) + "\n")


if __name__ == "__main__":  # pragma: no cover
    main()
