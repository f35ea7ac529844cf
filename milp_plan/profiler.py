"""Measured layer profiles: `milp-plan profile` times a model's layer kinds with PyTorch.

For every requested (tp, micro-batch b, sequence length s, kind) one layer of the kind,
built in plain torch.nn at the shapes one rank of a tp group holds
(milp_plan.torch_layers), runs `warmup` untimed forward+backward passes and then
`repeats` timed ones; the profile records per point

* fwd_ms, bwd_ms: the median over the repeats (or the minimum, `statistic="min"`, steadier
  on a CPU shared with other jobs, whose slices can double a median for seconds);
  fwd_ms_spread, bwd_ms_spread: max - min over the repeats;
* attn_core_fwd_ms: the forward of the attention core(s) alone (what selective
  recompute recomputes; 0 for embedding and head);
* bwd_full_recompute_ms: the backward of the layer under torch.utils.checkpoint, i.e. the
  recomputed forward plus the backward (full recompute; blocks only);
* act_bytes: activation bytes one micro-batch keeps for the backward. On a GPU from the
  allocator: memory_allocated after the forward minus before it (the layer's output is
  in, its input is not); elsewhere from the autograd graph: the bytes of the distinct
  storages the forward saves for the backward (torch.autograd.graph.saved_tensors_hooks),
  parameters excluded (the input is in when saved, the output is not);
* param_bytes: the bytes of the rank's parameters.

Times on a GPU come from CUDA events (the calls are synchronised on the end event);
on the CPU, where torch's calls are synchronous, from time.perf_counter (`clock="wall"`)
or from the process's CPU time, time.process_time, with one torch thread (`clock="cpu"`:
immune to the time slices other jobs take on a shared machine). The tp collectives are
not run (`tp_comm_included: false`): the cost model adds them. After every finished point
the whole table is rewritten atomically, so an interrupted run loses at most one point
and `--resume` skips the points already there.

torch is an optional extra: this module imports it inside functions only.
"""
from __future__ import annotations

import datetime as _dt
import re
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd

from milp_plan.analytic import valid_tps
from milp_plan.errors import InputError
from milp_plan.model import Model
from milp_plan.profile import Profile, read_native, write_native

INSTALL_HINT = 'torch is not installed; install the profiler extra: pip install "milp-plan[profile]"'
DTYPES = ("bf16", "fp32")
DEVICES = ("cuda", "cpu")
ACT_METHOD = {
    "cuda": "cuda allocator: memory_allocated after the forward minus before it (output in, input out)",
    "cpu": "autograd saved tensors: bytes of the distinct storages saved for the backward "
           "(torch.autograd.graph.saved_tensors_hooks), parameters excluded",
}


def import_torch():
    """torch, or an InputError (exit 2) that says how to install it."""
    try:
        import torch
    except ImportError:
        raise InputError(INSTALL_HINT) from None
    return torch


def int_list(text: str | Sequence[int], field_name: str) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4): whole numbers > 0, sorted, without repeats."""
    items = [str(x).strip() for x in (text.split(",") if isinstance(text, str) else text)]
    try:
        vals = [int(x) for x in items if x]
    except ValueError:
        raise InputError(f"'{text}' is not a comma-separated list of whole numbers, like 1,2,4",
                         field=field_name) from None
    if not vals or min(vals) <= 0:
        raise InputError(f"needs whole numbers > 0, got '{text}'", field=field_name)
    return tuple(sorted(set(vals)))


@dataclass(frozen=True)
class ProfileRequest:
    """What to measure. dtype None: bf16 on cuda, fp32 on cpu. gpu_name: the GPU label the
    profile rows carry (None: the catalog name of the device, 'cpu' on the CPU)."""

    model: Model
    tps: tuple[int, ...] = (1,)
    micro_batches: tuple[int, ...] = (1, 2, 4, 8)
    seq_lengths: tuple[int, ...] = ()
    device: str = "cpu"
    dtype: str | None = None
    repeats: int = 10
    warmup: int = 3
    gpu_name: str | None = None
    cpu_threads: int | None = None
    statistic: str = "median"
    clock: str = "wall"

    def __post_init__(self) -> None:
        if not self.seq_lengths:
            object.__setattr__(self, "seq_lengths", (self.model.seq_length,))
        if self.dtype is None:
            object.__setattr__(self, "dtype", "bf16" if self.device == "cuda" else "fp32")
        self.validate()

    def validate(self) -> None:
        m = self.model
        if self.device not in DEVICES:
            raise InputError(f"must be cuda or cpu, got {self.device!r}", field="device")
        if self.dtype not in DTYPES:
            raise InputError(f"must be bf16 or fp32, got {self.dtype!r}", field="dtype")
        if self.statistic not in STATISTICS:
            raise InputError(f"must be median or min, got {self.statistic!r}", field="statistic")
        one_cpu_thread = self.device == "cpu" and (self.cpu_threads or 1) == 1
        if self.clock not in CLOCKS or (self.clock == "cpu" and not one_cpu_thread):
            raise InputError(f"must be wall, or cpu (on the CPU, with one thread), got {self.clock!r}",
                             field="clock")
        if self.repeats < 1 or self.warmup < 0:
            raise InputError("--repeats must be >= 1 and --warmup >= 0", field="repeats")
        ok = valid_tps(m, self.tps)
        for tp in self.tps:
            if tp not in ok or m.ffn_hidden_size % tp:
                raise InputError(f"tp {tp} does not split {m.name}: needs num_attention_heads "
                                 f"({m.num_attention_heads}) and ffn_hidden_size ({m.ffn_hidden_size}) divisible "
                                 f"by tp and num_query_groups ({m.num_query_groups}) a multiple or divisor of it",
                                 field="tp")

    def points(self) -> list[tuple[int, int, int, str]]:
        """(tp, micro_batch_size, seq_length, kind) in measuring order."""
        return [(tp, b, s, k) for tp in self.tps for k in self.model.kinds()
                for s in self.seq_lengths for b in self.micro_batches]


# ---- device ----------------------------------------------------------------------------
_CATALOG_MATCH = [  # (substring of torch's device name, catalog GPU), first match wins
    ("H200", "H200"), ("H100 PCIe", "H100-PCIe"), ("H100", "H100-SXM"), ("A100-SXM4-40GB", "A100-40GB"),
    ("A100-PCIE-40GB", "A100-40GB"), ("A100", "A100-80GB"), ("A10", "A10"), ("L40S", "L40S"), ("L4", "L4"),
    ("T4", "T4"), ("V100", "V100-32GB"), ("MI300X", "MI300X"),
]


def catalog_gpu_name(device_name: str) -> str:
    """The catalog name of a device torch reports ('NVIDIA H100 80GB HBM3' -> 'H100-SXM'),
    else the device name itself."""
    for needle, name in _CATALOG_MATCH:
        if needle.lower() in device_name.lower():
            return name
    return device_name


def _driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().splitlines()[0] if out.strip() else None


def default_device() -> str:
    """cuda when torch sees a GPU, else cpu."""
    return "cuda" if import_torch().cuda.is_available() else "cpu"


def device_info(torch, device: str) -> dict[str, Any]:
    if device == "cuda":
        if not torch.cuda.is_available():
            raise InputError("no CUDA device is visible to torch; use --device cpu", field="device")
        return {"device": "cuda", "device_name": torch.cuda.get_device_name(0), "driver": _driver_version(),
                "cuda": torch.version.cuda}
    import platform
    return {"device": "cpu", "device_name": platform.processor() or platform.machine(), "driver": None,
            "cuda": None, "cpu_threads": torch.get_num_threads()}


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
TIMING = {"wall": "time.perf_counter (wall clock; torch's CPU calls are synchronous)",
          "cpu": "time.process_time (CPU time of the process, one torch thread)"}


class Timer:
    """Milliseconds of a call: CUDA events on a GPU, else the wall clock or the process CPU time."""

    def __init__(self, torch, device: str, clock: str = "wall"):
        self.torch, self.cuda, self.clock = torch, device == "cuda", CLOCKS[clock]

    def __call__(self, fn: Callable[[], Any]) -> tuple[Any, float]:
        if self.cuda:
            start, end = (self.torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            out = fn()
            end.record()
            end.synchronize()
            return out, float(start.elapsed_time(end))
        t0 = self.clock()
        out = fn()
        return out, (self.clock() - t0) * 1e3


STATISTICS = {"median": statistics.median, "min": min}


def _stat_spread(xs: list[float], statistic: str) -> tuple[float, float]:
    """(the statistic of the repeats, max - min) in ms."""
    return float(STATISTICS[statistic](xs)), float(max(xs) - min(xs))


# ---- one point -----------------------------------------------------------------------
@dataclass
class _Ctx:
    torch: Any
    req: ProfileRequest
    timer: Timer
    kw: dict = field(default_factory=dict)   # device and dtype of floating tensors


def _fwd_bwd(ctx: _Ctx, layer, kind: str, tp: int, b: int, s: int, recompute: bool = False):
    """(statistic, spread) of the forward and of the backward times over the repeats, ms."""
    from milp_plan.torch_layers import layer_inputs
    torch, fwd, bwd = ctx.torch, [], []
    ckpt = torch.utils.checkpoint.checkpoint
    for i in range(ctx.req.warmup + ctx.req.repeats):
        inputs = layer_inputs(ctx.req.model, kind, tp, b, s, **ctx.kw)
        run = (lambda: ckpt(layer, *inputs, use_reentrant=False)) if recompute else (lambda: layer(*inputs))
        out, tf = ctx.timer(run)
        grad = None if out.dim() == 0 else torch.randn_like(out)
        _, tb = ctx.timer(lambda: torch.autograd.backward(out, grad))
        if i >= ctx.req.warmup:
            fwd.append(tf)
            bwd.append(tb)
        del out, inputs, grad
    return _stat_spread(fwd, ctx.req.statistic), _stat_spread(bwd, ctx.req.statistic)


def _attn_core_ms(ctx: _Ctx, layer, b: int, s: int) -> float:
    from milp_plan.torch_layers import attention_core
    times = []
    for i in range(ctx.req.warmup + ctx.req.repeats):
        cores = layer.core_inputs(b, s, **ctx.kw)
        total = sum(ctx.timer(lambda c=c: attention_core(*c))[1] for c in cores)
        if i >= ctx.req.warmup:
            times.append(total)
    return _stat_spread(times, ctx.req.statistic)[0]


def _act_bytes(ctx: _Ctx, layer, kind: str, tp: int, b: int, s: int) -> int:
    from milp_plan.torch_layers import layer_inputs
    torch = ctx.torch
    inputs = layer_inputs(ctx.req.model, kind, tp, b, s, **ctx.kw)
    if ctx.req.device == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        out = layer(*inputs)
        torch.cuda.synchronize()
        return int(torch.cuda.memory_allocated() - before)
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            saved[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = layer(*inputs)
    del out
    return int(sum(saved.values()))


def measure_point(ctx: _Ctx, layer, kind: str, tp: int, b: int, s: int) -> dict[str, Any]:
    """One row of the native profile."""
    from milp_plan.torch_layers import BLOCK_KINDS
    (f, fs), (bw, bs) = _fwd_bwd(ctx, layer, kind, tp, b, s)
    block = kind in BLOCK_KINDS
    row = {"tp": tp, "micro_batch_size": b, "seq_length": s, "kind": kind, "fwd_ms": f, "bwd_ms": bw,
           "attn_core_fwd_ms": _attn_core_ms(ctx, layer, b, s) if block else 0.0,
           "act_bytes": _act_bytes(ctx, layer, kind, tp, b, s),
           "fwd_ms_spread": fs, "bwd_ms_spread": bs,
           "param_bytes": int(sum(p.numel() * p.element_size() for p in layer.parameters())),
           "bwd_full_recompute_ms": _fwd_bwd(ctx, layer, kind, tp, b, s, recompute=True)[1][0] if block else None}
    return row


# ---- the run ---------------------------------------------------------------------------
def _setup(req: ProfileRequest) -> tuple[Any, _Ctx, dict[str, Any]]:
    torch = import_torch()
    if req.cpu_threads or req.clock == "cpu":
        torch.set_num_threads(1 if req.clock == "cpu" else req.cpu_threads)
    info = device_info(torch, req.device)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[req.dtype]
    device = torch.device("cuda", 0) if req.device == "cuda" else torch.device("cpu")
    return torch, _Ctx(torch, req, Timer(torch, req.device, req.clock), {"device": device, "dtype": dtype}), info


def gpu_label(req: ProfileRequest, info: dict[str, Any]) -> str:
    if req.gpu_name:
        return req.gpu_name
    return catalog_gpu_name(info["device_name"]) if req.device == "cuda" else "cpu"


def output_path(out_dir: str | Path, model: Model, gpu: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{model.name}-{gpu}").strip("-")
    return Path(out_dir) / f"{safe}.csv"


def provenance(req: ProfileRequest, info: dict[str, Any], gpu: str, torch_version: str, started: str,
               complete: bool) -> dict[str, Any]:
    m = req.model
    return {
        "format": "native", "origin": "measured", "model": m.name, "model_sha256": m.content_hash(),
        "generator": "milp_plan.profiler (plain torch.nn layers at tp-sharded shapes on one device)",
        "gpu": gpu, **info, "torch": torch_version,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "started": started,
        "dtype": req.dtype, "repeats": req.repeats, "warmup": req.warmup,
        "timing": "CUDA events" if req.device == "cuda" else TIMING[req.clock],
        "statistic": f"fwd_ms, bwd_ms: {req.statistic} over the repeats; *_spread: max - min over the repeats (ms)",
        "attn_core_fwd_ms": "forward of the attention core(s) alone (selective recompute)",
        "bwd_full_recompute_ms": "backward under torch.utils.checkpoint: recomputed forward + backward",
        "act_bytes_method": ACT_METHOD[req.device],
        "tp_sharding": "heads/tp, query groups/tp (one replicated group when fewer than tp), ffn/tp, "
                       "ceil(vocab/tp); norms and residuals full size; collectives not run",
        "tp_comm_included": False,
        "requested": {"tp": list(req.tps), "micro_batch_size": list(req.micro_batches),
                      "seq_length": list(req.seq_lengths), "kinds": list(m.kinds())},
        "complete": complete,
    }


_IDENTITY = ("model_sha256", "gpu", "device", "dtype", "statistic", "timing")


def _resume_rows(path: Path, prov_now: dict[str, Any]) -> tuple[list[dict], str | None]:
    """Rows already in `path` and its start date; the file must come from the same setup."""
    old = read_native(path)
    prov = old.provenance[0]
    for key in _IDENTITY:
        if prov.get(key) != prov_now.get(key):
            raise InputError(f"cannot resume: its {key} is {prov.get(key)!r}, this run's is {prov_now.get(key)!r}; "
                             "resume with the same settings or choose another --out", source=str(path))
    table = old.table.drop(columns=["tp_comm_included"], errors="ignore")
    return table.to_dict("records"), prov.get("started")


def _table(rows: list[dict], model: Model, gpu: str) -> pd.DataFrame:
    t = pd.DataFrame(rows)
    t["model"], t["gpu"] = model.name, gpu
    order = {k: i for i, k in enumerate(model.kinds())}
    t["_k"] = t.kind.map(order)
    return t.sort_values(["tp", "seq_length", "micro_batch_size", "_k"]).drop(columns="_k").reset_index(drop=True)


def _progress(show: bool):
    """A rich progress bar on stderr, silent when stderr is not a terminal or show is False."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
    console = Console(stderr=True)
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                    console=console, disable=not (show and console.is_terminal), transient=True,
                    refresh_per_second=2)


def run_profile(req: ProfileRequest, out_dir: str | Path, resume: bool = False,
                progress: bool = True) -> tuple[Path, Profile, list[str]]:
    """Measure every requested point not yet in the output; returns the output path, the
    profile written, and warnings (points skipped for lack of GPU memory)."""
    torch, ctx, info = _setup(req)
    gpu = gpu_label(req, info)
    path = output_path(out_dir, req.model, gpu)
    now = provenance(req, info, gpu, str(torch.__version__), "", False)
    rows, started = [], now["date"]
    if path.exists():
        if not resume:
            raise InputError("profile exists; pass --resume to continue it, or choose another --out",
                             source=str(path))
        rows, started = _resume_rows(path, now)
        started = started or now["date"]
    done = {(int(r["tp"]), int(r["micro_batch_size"]), int(r["seq_length"]), r["kind"]) for r in rows}
    todo = [p for p in req.points() if p not in done]
    warnings: list[str] = []
    torch.manual_seed(0)
    with _progress(progress) as bar:
        task = bar.add_task("profiling", total=len(todo))
        for (tp, kind), group in _grouped(todo):
            layer = _build(ctx, kind, tp)
            for (_, b, s, _) in group:
                bar.update(task, description=f"{req.model.name} tp={tp} mbs={b} seq={s} {kind}")
                row = _measure_or_skip(ctx, layer, kind, tp, b, s, warnings)
                if row is not None:
                    rows.append(row)
                    _write(path, rows, req, info, gpu, torch, started, complete=False)
                bar.advance(task)
            del layer
    complete = all(p in {(r["tp"], r["micro_batch_size"], r["seq_length"], r["kind"]) for r in rows}
                   for p in req.points())
    if not rows:
        raise InputError("no point could be measured", field="micro-batch")
    _write(path, rows, req, info, gpu, torch, started, complete, fit_summary=True)
    return path, read_native(path), warnings


def _grouped(points: list[tuple[int, int, int, str]]):
    groups: dict[tuple[int, str], list] = {}
    for p in points:
        groups.setdefault((p[0], p[3]), []).append(p)
    return list(groups.items())


def _build(ctx: _Ctx, kind: str, tp: int):
    from milp_plan.torch_layers import build_layer
    max_seq = max(ctx.req.model.seq_length, *ctx.req.seq_lengths)
    return build_layer(ctx.req.model, kind, tp, max_seq).to(**ctx.kw).train()


def _measure_or_skip(ctx: _Ctx, layer, kind: str, tp: int, b: int, s: int, warnings: list[str]):
    torch = ctx.torch
    oom = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", MemoryError)
    try:
        row = measure_point(ctx, layer, kind, tp, b, s)
    except oom:
        layer.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
        warnings.append(f"out of memory at tp={tp} micro_batch={b} seq={s} kind={kind}: not measured")
        return None
    return row


def _write(path: Path, rows: list[dict], req: ProfileRequest, info: dict, gpu: str, torch, started: str,
           complete: bool, fit_summary: bool = False) -> None:
    prov = provenance(req, info, gpu, str(torch.__version__), started, complete)
    table = _table(rows, req.model, gpu)
    if fit_summary:
        prov["latency_fit_loo"] = loo_summary(table)
    write_native(path, table, prov)


# ---- latency-model fit report --------------------------------------------------------------
def loo_summary(table: pd.DataFrame) -> dict[str, Any]:
    """Worst and mean leave-one-out relative error of the latency fits, per field (fractions)."""
    from milp_plan.latency import fit_table
    out: dict[str, Any] = {}
    for field_name in ("fwd_ms", "bwd_ms"):
        errs = [r.error for r in fit_table(table, (field_name,)) if r.error is not None]
        if errs:
            out[field_name] = {"max_rel_err": round(max(e.max_rel for e in errs), 4),
                               "mean_rel_err": round(sum(e.mean_rel for e in errs) / len(errs), 4),
                               "fits": len(errs)}
    return out or {"note": "fewer than 3 points per (tp, kind): no fit"}


def render_fits(profile: Profile) -> str:
    """The latency fits of a profile as a table: t = max(a, b0 + c T + d T s), T tokens."""
    from milp_plan.latency import fit_table
    from milp_plan.report import table
    rows = []
    for r in fit_table(profile.table):
        f, e = r.fit, r.error
        rows.append([r.gpu, r.tp, r.kind, r.field, f.n_points, f"{f.floor_ms:.4g}", f"{f.intercept_ms:.4g}",
                     f"{f.per_token_ms * 1e3:.4g}", f"{f.per_token_seq_ms * 1e6:.4g}",
                     "-" if e is None else f"{100 * e.max_rel:.1f}", "-" if e is None else f"{100 * e.mean_rel:.1f}"])
    return table(["gpu", "tp", "kind", "field", "points", "a ms", "b0 ms", "c us/token", "d ns/token^2",
                  "LOO max %", "LOO mean %"], rows)


# ---- the whole-model check ---------------------------------------------------------------
@dataclass(frozen=True)
class WholeModelCheck:
    """Measured forward+backward of embedding + blocks + head chained as one model, against
    the sum of the profiled per-layer times of the same layers (ms)."""

    measured_ms: float
    predicted_ms: float
    kinds: tuple[str, ...]

    @property
    def rel_error(self) -> float:
        """(predicted - measured) / measured."""
        return (self.predicted_ms - self.measured_ms) / self.measured_ms


def measure_whole_model(req: ProfileRequest, tp: int, b: int, s: int,
                        num_blocks: int | None = None) -> tuple[float, list[str]]:
    """Forward+backward ms of the chained model (req.statistic over the repeats), and the
    layer kinds it ran."""
    from milp_plan.torch_layers import WholeModel, layer_inputs
    torch, ctx, _ = _setup(req)
    torch.manual_seed(0)
    net = WholeModel(req.model, tp, max(req.model.seq_length, s), num_blocks).to(**ctx.kw).train()
    times = []
    for i in range(req.warmup + req.repeats):
        ids = layer_inputs(req.model, "embedding", tp, b, s, **ctx.kw)[0]
        targets = torch.randint_like(ids, 0, net.head.proj.out_features)
        loss, tf = ctx.timer(lambda: net(ids, targets))
        _, tb = ctx.timer(loss.backward)
        if i >= req.warmup:
            times.append(tf + tb)
    return _stat_spread(times, req.statistic)[0], net.layer_kinds()


def predict_whole_model(profile: Profile, model: Model, gpu: str, tp: int, b: int, s: int,
                        kinds: Sequence[str]) -> float:
    """Sum over the layers of the profiled fwd_ms + bwd_ms (ms)."""
    total = 0.0
    for k in kinds:
        c = profile.cost(model.name, gpu, tp, b, s, k)
        total += c.fwd_ms + c.bwd_ms
    return total


def whole_model_check(req: ProfileRequest, profile: Profile, gpu: str, tp: int, b: int, s: int,
                      num_blocks: int | None = None) -> WholeModelCheck:
    measured, kinds = measure_whole_model(req, tp, b, s, num_blocks)
    return WholeModelCheck(measured, predict_whole_model(profile, req.model, gpu, tp, b, s, kinds), tuple(kinds))
