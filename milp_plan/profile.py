"""Layer cost profiles: measured or derived forward/backward times per layer kind.

Native format: a CSV whose first lines are `# key: value` provenance (YAML), then a
table with the columns

    model, gpu, tp, micro_batch_size, seq_length, kind, fwd_ms, bwd_ms
    [, attn_core_fwd_ms, act_bytes, fwd_ms_spread, bwd_ms_spread, param_bytes, bwd_full_recompute_ms,
       mem_total_bytes, optimizer_ns_per_param]

`kind` is embedding, block, encoder_block, decoder_block or head; times are one
micro-batch through one layer on one GPU of a tp group, in milliseconds. Provenance
`tp_comm_included: false` says the tensor-parallel collectives are not in the times
(the cost model adds them).

Measured memory and optimizer time, where a profile has them, replace the cost model's
formulas (costmodel.measured_activation_bytes, costmodel.optimizer_s): `act_bytes` is what
one micro-batch keeps for the backward of one layer (milp-plan's profiler, no recompute, no
sequence parallelism); `mem_total_bytes` a layer's whole footprint at the point, model
states included (Metis' layer_memory_total_mb); `optimizer_ns_per_param` one optimizer
step's nanoseconds per parameter a GPU updates (Metis' optimizer_time_ms). Memory is read at
profiled points only, never filled.

Filling missing points (each fill is recorded and reported with the points used):

1. another micro-batch size at the same (gpu, tp, seq, kind): with >= 3 profiled sizes,
   the fitted latency model of milp_plan.latency over all of them,
   t = max(a, b0 + c x tokens) (least squares on the relative error, a roofline floor);
   with 2 sizes, linear interpolation in the micro-batch size between them, outside
   their range linear extrapolation through them, never below proportional scaling of
   the nearest point by b/b0 x 0.5; with one size, proportional scaling t(b) = t(b0) * b / b0;
2. another tp: the nearest profiled tp, scaled by tp0/tp (an ideal split of the work);
3. another sequence length: when that tp has points at >= 2 sequence lengths (>= 3 points
   in all), the fitted latency model over all of them, t = max(a, b0 + c x T + d x T x s)
   with T = b x s tokens (d only for block kinds); otherwise the nearest profiled length,
   scaled by the ratio of per-micro-batch FLOPs (model.forward_flops_per_token x tokens).

An analytic profile (shipped, or derived on the fly by `instance.build_instance`) carries a
`generator`: a point its table lacks is computed by milp_plan.analytic, not filled, so it
provides every point. The planner's space keeps to the points a profile provides unless
--extrapolate (formulations/space.py, `covered`); a plan lists the filled points it uses.
"""
from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import pandas as pd
import yaml

from milp_plan import latency
from milp_plan.errors import InputError
from milp_plan.fileio import parse_yaml, read_text, sha256_file, write_atomic

KEY = ["model", "gpu", "tp", "micro_batch_size", "seq_length", "kind"]
REQUIRED = KEY + ["fwd_ms", "bwd_ms"]
OPTIONAL = ["attn_core_fwd_ms", "act_bytes", "fwd_ms_spread", "bwd_ms_spread", "param_bytes",
            "bwd_full_recompute_ms", "mem_total_bytes", "optimizer_ns_per_param"]
KINDS = ("embedding", "block", "encoder_block", "decoder_block", "head")
MAX_TIME_MS = 1e9       # a layer time above this (11 days) is refused as a unit error
MAX_OPTIONAL = 1e15     # bytes or ms in the optional columns


@dataclass(frozen=True)
class LayerCost:
    """One micro-batch through one layer of one kind, per GPU of the tp group."""

    fwd_ms: float
    bwd_ms: float
    attn_core_fwd_ms: float | None = None
    act_bytes: float | None = None
    tp_comm_included: bool = False
    mem_total_bytes: float | None = None   # the layer's states + one micro-batch's activations (Metis)


@dataclass
class Profile:
    table: pd.DataFrame
    provenance: list[dict[str, Any]] = field(default_factory=list)
    fills: dict[tuple, str] = field(default_factory=dict)
    # analytic profiles: (model, gpu, tp, mbs, seq, kind) -> the generated cost, or None where
    # the generator does not cover that GPU; a generated point is computed, never filled
    generator: Any = None   # analytic.Generator: covers(model, gpu, kind), __call__(model, gpu, tp, mbs, seq, kind)

    def __post_init__(self) -> None:
        self._points: dict[tuple, LayerCost] = {}
        self._optimizer_ns: dict[str, list[float]] = {}
        self._index: dict[tuple, dict[tuple[int, int], dict[int, LayerCost]]] = {}
        t = self.table
        has = {c: c in t.columns for c in OPTIONAL + ["tp_comm_included"]}
        for row in t.itertuples(index=False):
            cost = LayerCost(
                float(row.fwd_ms), float(row.bwd_ms),
                _opt(row, "attn_core_fwd_ms") if has["attn_core_fwd_ms"] else None,
                _opt(row, "act_bytes") if has["act_bytes"] else None,
                bool(row.tp_comm_included) if has["tp_comm_included"] else False,
                _opt(row, "mem_total_bytes") if has["mem_total_bytes"] else None,
            )
            if has["optimizer_ns_per_param"] and _opt(row, "optimizer_ns_per_param") is not None:
                self._optimizer_ns.setdefault(row.gpu, []).append(float(row.optimizer_ns_per_param))
            key = (row.model, row.gpu, int(row.tp), int(row.micro_batch_size), int(row.seq_length), row.kind)
            self._points[key] = cost
            self._index.setdefault((row.model, row.gpu, row.kind), {}).setdefault(
                (int(row.tp), int(row.seq_length)), {})[int(row.micro_batch_size)] = cost
        self._cache: dict[tuple, LayerCost] = {}
        self._provides: dict[tuple, bool] = {}

    # ---- queries -----------------------------------------------------------------
    def gpus(self, model: str | None = None) -> list[str]:
        t = self.table if model is None else self.table[self.table.model == model]
        return sorted(t.gpu.unique())

    def models(self) -> list[str]:
        return sorted(self.table.model.unique())

    def optimizer_s_per_param(self, gpu: str) -> float | None:
        """Measured seconds of one optimizer step per parameter a GPU updates (the mean of the
        column `optimizer_ns_per_param` over the GPU's rows, / 1e9), or None where unmeasured."""
        rates = self._optimizer_ns.get(gpu)
        return sum(rates) / len(rates) / 1e9 if rates else None

    def measured_notes(self) -> list[str]:
        """One line for each measurement that replaces a formula of the cost model (the module
        docstring), naming where: the notes a plan on this profile prints."""
        mem = sorted({(k[1], k[5]) for k, c in self._points.items()
                      if c.act_bytes is not None or c.mem_total_bytes is not None})
        notes = []
        if mem:
            notes.append(f"the profile measures activation memory ({', '.join(f'{g} {k}' for g, k in mem)}): "
                         "there it replaces Korthikanti et al.'s formula, scaled to the plan's recompute and "
                         "sequence parallelism by the formula's ratio (costmodel.layer_activation_bytes)")
        if self._optimizer_ns:
            rates = ", ".join(f"{g} {self.optimizer_s_per_param(g) * 1e9:.3g} ns" for g in sorted(self._optimizer_ns))
            notes.append(f"the profile measures the optimizer step per parameter ({rates}): it replaces the "
                         "memory-bound formula (costmodel.optimizer_s)")
        return notes

    def covers(self, model: str, gpu: str, kind: str) -> bool:
        return (model, gpu, kind) in self._index

    def exact(self, model: str, gpu: str, tp: int, mbs: int, seq: int, kind: str) -> LayerCost | None:
        return self._points.get((model, gpu, tp, mbs, seq, kind))

    def generated(self, model: str, gpu: str, tp: int, mbs: int, seq: int, kind: str) -> LayerCost | None:
        """The analytic generator's cost at a point it covers, else None."""
        return None if self.generator is None else self.generator(model, gpu, tp, mbs, seq, kind)

    def provides(self, model: str, gpu: str, tp: int, mbs: int, seq: int, kinds: Iterable[str]) -> bool:
        """Every kind at this point is measured (or imported) or generated: no fill rule needed."""
        key = (model, gpu, tp, mbs, seq, tuple(kinds))
        got = self._provides.get(key)
        if got is None:
            gen = self.generator
            got = self._provides[key] = all((model, gpu, tp, mbs, seq, k) in self._points
                                            or (gen is not None and gen.covers(model, gpu, k)) for k in key[5])
        return got

    def filled(self, model: str, gpu: str, tp: int, mbs: int, seq: int, kind: str) -> str | None:
        """How the fill rules supply a point the profile neither holds nor generates, else None."""
        if self.provides(model, gpu, tp, mbs, seq, (kind,)):
            return None
        # the cost model has evaluated the point (it fills with the FLOPs ratio); its note is kept
        return self.fills.get((model, gpu, tp, mbs, seq, kind), "filled by the rules above")

    def cost(self, model: str, gpu: str, tp: int, mbs: int, seq: int, kind: str,
             flops_ratio=None) -> LayerCost:
        """The cost at a point, filled by the documented rules when not profiled.

        flops_ratio(seq_from, seq_to) -> factor, used only for rule 3.
        """
        key = (model, gpu, tp, mbs, seq, kind)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        exact = self._points.get(key)
        if exact is not None:
            self._cache[key] = exact
            return exact
        made = self.generated(model, gpu, tp, mbs, seq, kind)
        if made is not None:
            self._cache[key] = made
            return made
        by_tp_seq = self._index.get((model, gpu, kind))
        if not by_tp_seq:
            raise KeyError(key)
        seqs = sorted({s for (_, s) in by_tp_seq})
        s0 = min(seqs, key=lambda s: (abs(s - seq), s))
        tps = sorted({t for (t, s) in by_tp_seq if s == s0})
        t0 = min(tps, key=lambda t: (abs(t - tp), t))
        by_mbs = by_tp_seq[(t0, s0)]
        fitted = _fill_seq_fit(by_tp_seq, t0, mbs, seq, kind) if s0 != seq else None
        base, how = fitted or _fill_mbs(by_mbs, mbs, s0, kind)
        scale = 1.0
        notes = [how]
        if t0 != tp:
            scale *= t0 / tp
            notes.append(f"scaled from tp={t0} by {t0}/{tp}")
        if s0 != seq and fitted is None:
            factor = flops_ratio(s0, seq) if flops_ratio else seq / s0
            scale *= factor
            notes.append(f"scaled from seq={s0} by FLOPs ratio {factor:.3f}")
        out = LayerCost(base.fwd_ms * scale, base.bwd_ms * scale,
                        None if base.attn_core_fwd_ms is None else base.attn_core_fwd_ms * scale,
                        None, base.tp_comm_included)
        self.fills[key] = "; ".join(n for n in notes if n)
        self._cache[key] = out
        return out

    def merged(self, other: "Profile") -> "Profile":
        table = pd.concat([self.table, other.table], ignore_index=True)
        table = table.drop_duplicates(subset=KEY, keep="first").reset_index(drop=True)
        return Profile(table, self.provenance + other.provenance)

    def renamed_gpus(self, mapping: dict[str, str]) -> "Profile":
        t = self.table.copy()
        t["gpu"] = t["gpu"].map(lambda g: mapping.get(g, g))
        return Profile(t, self.provenance)

    def for_model(self, model: str) -> "Profile":
        t = self.table.copy()
        t["model"] = model
        return Profile(t, self.provenance)

    def fill_warnings(self) -> list[str]:
        return [f"profile has no point model={k[0]} gpu={k[1]} tp={k[2]} micro_batch={k[3]} seq={k[4]} "
                f"kind={k[5]}: {how}" for k, how in sorted(self.fills.items(), key=lambda kv: str(kv[0]))]


def _opt(row: Any, name: str) -> float | None:
    v = getattr(row, name)
    return None if pd.isna(v) else float(v)


def _fill_mbs(by_mbs: dict[int, LayerCost], mbs: int, seq: int, kind: str) -> tuple[LayerCost, str]:
    if mbs in by_mbs:
        return by_mbs[mbs], ""
    sizes = sorted(by_mbs)
    if len(sizes) >= latency.MIN_POINTS:
        return _fill_fit({(b, seq): by_mbs[b] for b in sizes}, mbs, seq, kind)
    lo = [b for b in sizes if b < mbs]
    hi = [b for b in sizes if b > mbs]
    if len(sizes) == 1:
        b0 = sizes[0]
        return _lerp(by_mbs[b0], by_mbs[b0], b0, b0, mbs, proportional=True), \
            f"micro_batch scaled proportionally from {b0}"
    if lo and hi:
        a, b = lo[-1], hi[0]
        how = f"interpolated between micro_batch {a} and {b}"
    elif hi:
        a, b = hi[0], hi[1]
        how = f"extrapolated below from micro_batch {a} and {b}"
    else:
        a, b = lo[-2], lo[-1]
        how = f"extrapolated above from micro_batch {a} and {b}"
    return _lerp(by_mbs[a], by_mbs[b], a, b, mbs), how


def _fill_seq_fit(by_tp_seq: dict[tuple[int, int], dict[int, LayerCost]], tp: int, mbs: int, seq: int,
                  kind: str) -> tuple[LayerCost, str] | None:
    """Rule 3 with the fitted model: every point of `tp` when they span >= 2 lengths."""
    points = {(b, s): c for (t, s), by in by_tp_seq.items() if t == tp for b, c in by.items()}
    if len({s for (_, s) in points}) < 2 or len(points) < latency.MIN_POINTS:
        return None
    return _fill_fit(points, mbs, seq, kind)


def _fill_fit(points: dict[tuple[int, int], LayerCost], mbs: int, seq: int, kind: str) -> tuple[LayerCost, str]:
    """The latency model fitted to points {(micro_batch, seq): cost}, evaluated at (mbs, seq)."""
    keys = sorted(points)
    tokens, seqs = [b * s for b, s in keys], [s for _, s in keys]
    attention = kind in latency.ATTENTION_KINDS

    def one(name: str) -> float | None:
        vals = [getattr(points[k], name) for k in keys]
        return None if any(v is None for v in vals) else latency.fit(tokens, seqs, vals, attention).predict(
            mbs * seq, seq)
    cost = LayerCost(one("fwd_ms"), one("bwd_ms"), one("attn_core_fwd_ms"), None, points[keys[0]].tp_comm_included)
    by_seq: dict[int, list[str]] = {}
    for b, s in keys:
        by_seq.setdefault(s, []).append(str(b))
    used = "; ".join(f"micro_batch {','.join(bs)} at seq {s}" for s, bs in by_seq.items())
    return cost, f"fitted latency model (milp_plan.latency) over {used}"


def _lerp(ca: LayerCost, cb: LayerCost, a: int, b: int, x: int, proportional: bool = False) -> LayerCost:
    def one(va: float | None, vb: float | None) -> float | None:
        if va is None or vb is None:
            return None
        if proportional or a == b:
            return va * x / a
        v = va + (vb - va) * (x - a) / (b - a)
        nearest, n0 = (va, a) if abs(x - a) <= abs(x - b) else (vb, b)
        return max(v, 0.5 * nearest * x / n0)
    return LayerCost(one(ca.fwd_ms, cb.fwd_ms), one(ca.bwd_ms, cb.bwd_ms),
                     one(ca.attn_core_fwd_ms, cb.attn_core_fwd_ms), None, ca.tp_comm_included)


# ---- native CSV ------------------------------------------------------------------
def validate_table(table: pd.DataFrame, source: str) -> pd.DataFrame:
    missing = [c for c in REQUIRED if c not in table.columns]
    if missing:
        raise InputError(f"profile table lacks column(s) {', '.join(missing)}; a native profile needs "
                         f"{', '.join(REQUIRED)}", source=source)
    unknown = [c for c in table.columns if c not in REQUIRED + OPTIONAL + ["tp_comm_included"]]
    if unknown:
        raise InputError(f"profile table has unknown column(s) {', '.join(unknown)}", source=source)
    bad_kind = sorted(set(table.kind) - set(KINDS))
    if bad_kind:
        raise InputError(f"column 'kind' has unknown value(s) {bad_kind}; use one of {', '.join(KINDS)}",
                         source=source)
    for col in ("tp", "micro_batch_size", "seq_length"):
        vals = pd.to_numeric(table[col], errors="coerce")
        if vals.isna().any() or (vals <= 0).any() or (vals > 2**20).any() or (vals != vals.round()).any():
            raise InputError(f"column '{col}' must hold whole numbers from 1 to {2**20}", source=source)
        table[col] = vals.astype(int)
    for col in ("fwd_ms", "bwd_ms"):
        vals = pd.to_numeric(table[col], errors="coerce")
        bad = vals.isna() | (vals < 0) | (vals > MAX_TIME_MS) | ((vals > 0) & (vals < 1e-9))
        if bad.any():
            row = int(vals.index[bad][0]) + 1
            raise InputError(f"column '{col}' must hold finite times from 0 to {MAX_TIME_MS:g} ms, 0 or at least "
                             f"1e-9 (data row {row}: {table[col].iloc[row - 1]!r:.30})", source=source)
        table[col] = vals.astype(float)
    if len(table) and not ((table.fwd_ms > 0) | (table.bwd_ms > 0)).any():
        raise InputError("every fwd_ms and bwd_ms is 0; a profile must hold measured times", source=source)
    for col in OPTIONAL:
        if col in table.columns and pd.api.types.is_numeric_dtype(table[col]):
            vals = table[col].astype(float)
            if ((vals.abs() > MAX_OPTIONAL) | (vals.isin([float("inf"), float("-inf")]))).any():
                raise InputError(f"column '{col}' must hold finite values up to {MAX_OPTIONAL:g}", source=source)
    return table


def read_native(path: str | Path) -> Profile:
    text = read_text(path, "profile CSV")
    header, body = [], []
    for line in text.splitlines(keepends=True):
        (header if line.startswith("#") and not body else body).append(line)
    try:
        prov = parse_yaml("".join(l[1:] for l in header), str(path)) or {}
    except InputError as exc:
        raise InputError(f"profile provenance header is not '# key: value' lines ({exc})", source=str(path)) from None
    if not isinstance(prov, dict):
        raise InputError("profile provenance header must be '# key: value' lines, got "
                         f"{type(prov).__name__}", source=str(path))
    if not isinstance(prov.get("tp_comm_included", False), bool):
        raise InputError(f"header field 'tp_comm_included' must be true or false, got {prov['tp_comm_included']!r}",
                         source=str(path))
    try:
        table = pd.read_csv(io.StringIO("".join(body)))
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise InputError(f"not a readable CSV table: {str(exc).splitlines()[0]}", source=str(path)) from None
    table = validate_table(table, str(path))
    table["tp_comm_included"] = bool(prov.get("tp_comm_included", False))
    prov = {**prov, "file": str(path), "sha256": sha256_file(path), "format": prov.get("format", "native")}
    return Profile(table, [prov])


def write_native(path: str | Path, table: pd.DataFrame, provenance: dict[str, Any]) -> None:
    head = "".join(f"# {line}\n" for line in yaml.safe_dump(provenance, sort_keys=False).splitlines())
    cols = [c for c in REQUIRED + OPTIONAL if c in table.columns]
    write_atomic(path, head + table[cols].to_csv(index=False, float_format="%.6g"))


def read_native_dir(paths: Iterable[Path]) -> Profile:
    profiles = [read_native(p) for p in paths]
    out = profiles[0]
    for p in profiles[1:]:
        out = out.merged(p)
    return out


# ---- GPU name matching -------------------------------------------------------------
def match_gpu_names(profile_gpus: Iterable[str], cluster_gpus: Iterable[str], explicit: dict[str, str],
                    source: str) -> dict[str, str]:
    """Map profile GPU names to cluster GPU names: --profile-gpu-map, else exact
    (case-insensitive), else a unique prefix (`A100` -> `A100-40GB`)."""
    cluster = list(cluster_gpus)
    out: dict[str, str] = {}
    for name in profile_gpus:
        if name in explicit:
            if explicit[name] not in cluster:
                raise InputError(f"--profile-gpu-map {name}={explicit[name]}: '{explicit[name]}' is not a GPU of "
                                 f"the cluster ({', '.join(cluster)})", source=source)
            out[name] = explicit[name]
            continue
        exact = [c for c in cluster if c.lower() == name.lower()]
        if exact:
            out[name] = exact[0]
            continue
        prefix = [c for c in cluster if c.lower().startswith(name.lower())]
        if len(prefix) == 1:
            out[name] = prefix[0]
        elif len(prefix) > 1:
            raise InputError(f"profile GPU '{name}' matches several cluster GPUs ({', '.join(prefix)}); choose one "
                             f"with --profile-gpu-map {name}={prefix[0]}", source=source)
    return out
