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

import functools
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

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


@dataclass(frozen=True)
class Rows:
    """A profile table without pandas: column names and one tuple a row, None where a cell is
    empty. `Profile.table` gives the same table as a pandas DataFrame, built when asked for."""

    columns: tuple[str, ...]
    data: tuple[tuple, ...]

    def __len__(self) -> int:
        return len(self.data)

    def column(self, name: str) -> list:
        i = self.columns.index(name)
        return [r[i] for r in self.data]

    def where(self, name: str, keep: Callable[[Any], bool]) -> "Rows":
        i = self.columns.index(name)
        return Rows(self.columns, tuple(r for r in self.data if keep(r[i])))

    def mapped(self, name: str, fn: Callable[[Any], Any]) -> "Rows":
        i = self.columns.index(name)
        return Rows(self.columns, tuple(r[:i] + (fn(r[i]),) + r[i + 1:] for r in self.data))

    def then(self, other: "Rows") -> "Rows":
        """Both tables, the columns of both (pd.concat's order), and a row of `other` only where
        its KEY is not already here (drop_duplicates(keep="first"))."""
        cols = self.columns + tuple(c for c in other.columns if c not in self.columns)
        out, seen = [], set()
        for part in (self, other):
            at = [part.columns.index(c) if c in part.columns else None for c in cols]
            for r in part.data:
                row = tuple(None if i is None else r[i] for i in at)
                key = row[:len(KEY)]
                if key not in seen:
                    seen.add(key)
                    out.append(row)
        return Rows(cols, tuple(out))


def _rows_of_frame(t: Any) -> Rows:
    """A DataFrame's rows as they are, with a missing (NaN) optional cell as None."""
    import pandas as pd
    cols = tuple(str(c) for c in t.columns)
    opt = [c in OPTIONAL for c in cols]
    return Rows(cols, tuple(tuple(None if o and pd.isna(v) else v for o, v in zip(opt, row))
                            for row in t.itertuples(index=False, name=None)))


def _cell(row: tuple, i: int | None) -> float | None:
    """An optional column's value as a float; None where the column or the value is missing."""
    return None if i is None or row[i] is None else float(row[i])


class Profile:
    """A layer-cost table (`rows`, or `table` as a pandas DataFrame) with its provenance, the
    fills made so far and an optional analytic generator.

    Built from a DataFrame (importers, the profiler), or from Rows with `frame`, a function
    that returns the same table as a DataFrame (the native reader and the operations below,
    so that reading a profile needs no pandas and `table` is what pandas' reading gave)."""

    def __init__(self, table: Any, provenance: list[dict[str, Any]] | None = None,
                 fills: dict[tuple, str] | None = None, generator: Any = None,
                 frame: Callable[[], Any] | None = None) -> None:
        if isinstance(table, Rows):
            self.rows, self._frame, self._table = table, frame, None
        else:
            self.rows, self._frame, self._table = _rows_of_frame(table), None, table
        self.provenance = provenance if provenance is not None else []
        self.fills = fills if fills is not None else {}
        # analytic profiles: (model, gpu, tp, mbs, seq, kind) -> the generated cost, or None where
        # the generator does not cover that GPU; a generated point is computed, never filled
        self.generator = generator  # analytic.Generator: covers(model, gpu, kind), __call__(model, gpu, tp, mbs, seq, kind)
        self._points: dict[tuple, LayerCost] = {}
        self._optimizer_ns: dict[str, list[float]] = {}
        self._index: dict[tuple, dict[tuple[int, int], dict[int, LayerCost]]] = {}
        cols = self.rows.columns
        at = {c: cols.index(c) for c in KEY + ["fwd_ms", "bwd_ms"]}
        ia, iy, ic, im_total, io = (cols.index(c) if c in cols else None for c in (
            "attn_core_fwd_ms", "act_bytes", "tp_comm_included", "mem_total_bytes", "optimizer_ns_per_param"))
        im, ig, it, ib, iq, ik = (at[c] for c in KEY)
        ifw, ibw = at["fwd_ms"], at["bwd_ms"]
        for row in self.rows.data:
            cost = LayerCost(
                float(row[ifw]), float(row[ibw]), _cell(row, ia), _cell(row, iy),
                bool(row[ic]) if ic is not None else False, _cell(row, im_total),
            )
            tp, mbs, seq = int(row[it]), int(row[ib]), int(row[iq])
            rate = _cell(row, io)
            if rate is not None:
                self._optimizer_ns.setdefault(row[ig], []).append(rate)
            self._points[(row[im], row[ig], tp, mbs, seq, row[ik])] = cost
            self._index.setdefault((row[im], row[ig], row[ik]), {}).setdefault((tp, seq), {})[mbs] = cost
        self._cache: dict[tuple, LayerCost] = {}
        self._provides: dict[tuple, bool] = {}

    @property
    def table(self) -> Any:
        """The table as a pandas DataFrame (imports pandas; built once)."""
        if self._table is None:
            if self._frame is not None:
                self._table = self._frame()
            else:
                import pandas as pd
                self._table = pd.DataFrame(list(self.rows.data), columns=list(self.rows.columns))
        return self._table

    # ---- queries -----------------------------------------------------------------
    def gpus(self, model: str | None = None) -> list[str]:
        rows = self.rows if model is None else self.rows.where("model", lambda m: m == model)
        return sorted(set(rows.column("gpu")))

    def models(self) -> list[str]:
        return sorted(set(self.rows.column("model")))

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
        def frame():
            import pandas as pd
            table = pd.concat([self.table, other.table], ignore_index=True)
            return table.drop_duplicates(subset=KEY, keep="first").reset_index(drop=True)
        return Profile(self.rows.then(other.rows), self.provenance + other.provenance, frame=frame)

    def renamed_gpus(self, mapping: dict[str, str]) -> "Profile":
        def frame():
            t = self.table.copy()
            t["gpu"] = t["gpu"].map(lambda g: mapping.get(g, g))
            return t
        return Profile(self.rows.mapped("gpu", lambda g: mapping.get(g, g)), self.provenance, frame=frame)

    def for_model(self, model: str) -> "Profile":
        def frame():
            t = self.table.copy()
            t["model"] = model
            return t
        return Profile(self.rows.mapped("model", lambda _: model), self.provenance, frame=frame)

    def only(self, model: str | None = None, gpus: Iterable[str] | None = None) -> "Profile":
        """The rows of one model and/or of some GPUs (the same provenance)."""
        keep_gpus = None if gpus is None else set(gpus)
        rows = self.rows
        if model is not None:
            rows = rows.where("model", lambda m: m == model)
        if keep_gpus is not None:
            rows = rows.where("gpu", lambda g: g in keep_gpus)

        def frame():
            t = self.table
            if model is not None:
                t = t[t.model == model]
            if keep_gpus is not None:
                t = t[t.gpu.isin(keep_gpus)]
            return t.reset_index(drop=True)
        return Profile(rows, self.provenance, frame=frame)

    def fill_warnings(self) -> list[str]:
        return [f"profile has no point model={k[0]} gpu={k[1]} tp={k[2]} micro_batch={k[3]} seq={k[4]} "
                f"kind={k[5]}: {how}" for k, how in sorted(self.fills.items(), key=lambda kv: str(kv[0]))]


def _fill_mbs(by_mbs: dict[int, LayerCost], mbs: int, seq: int, kind: str) -> tuple[LayerCost, str]:
    from milp_plan import latency   # numpy: only where a point is filled
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
    from milp_plan import latency
    points = {(b, s): c for (t, s), by in by_tp_seq.items() if t == tp for b, c in by.items()}
    if len({s for (_, s) in points}) < 2 or len(points) < latency.MIN_POINTS:
        return None
    return _fill_fit(points, mbs, seq, kind)


def _fill_fit(points: dict[tuple[int, int], LayerCost], mbs: int, seq: int, kind: str) -> tuple[LayerCost, str]:
    """The latency model fitted to points {(micro_batch, seq): cost}, evaluated at (mbs, seq)."""
    from milp_plan import latency
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
def validate_table(table: Any, source: str) -> Any:
    """The checks on a native table (a pandas DataFrame), which they convert in place."""
    import pandas as pd
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
    tp_comm = bool(prov.get("tp_comm_included", False))
    csv_text, source = "".join(body), str(path)
    rows = _plain_rows(csv_text)
    frame = functools.partial(_read_frame, csv_text, source, tp_comm)
    if rows is None:   # pandas reads it, and names what is wrong with it
        table = frame()
    prov = {**prov, "file": source, "sha256": sha256_file(path), "format": prov.get("format", "native")}
    if rows is None:
        return Profile(table, [prov])
    return Profile(Rows(rows.columns + ("tp_comm_included",), tuple(r + (tp_comm,) for r in rows.data)), [prov],
                   frame=frame)


def _read_frame(csv_text: str, source: str, tp_comm: bool) -> Any:
    """The table as pandas reads it, validated (validate_table), with `tp_comm_included`."""
    import pandas as pd
    try:
        table = pd.read_csv(io.StringIO(csv_text))
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise InputError(f"not a readable CSV table: {str(exc).splitlines()[0]}", source=source) from None
    table = validate_table(table, source)
    table["tp_comm_included"] = tp_comm
    return table


# a cell that pandas and float() both read to the same double: at most 15 significant digits and a
# power of ten within 1e±22, so both round once, exactly (Clinger's fast path)
_DECIMAL = re.compile(r"(\d*)(?:\.(\d*))?(?:[eE]([-+]?\d{1,3}))?")
_NA_LIKE = {"", "#n/a", "#n/a n/a", "#na", "-1.#ind", "-1.#qnan", "-nan", "1.#ind", "1.#qnan", "<na>", "n/a", "na",
            "null", "nan", "none", "true", "false"}


def _plain_number(cell: str) -> float | None:
    m = _DECIMAL.fullmatch(cell)
    if m is None or not (m.group(1) or m.group(2)):
        return None
    digits = (m.group(1) + (m.group(2) or "")).lstrip("0")
    power = int(m.group(3) or 0) - len(m.group(2) or "")
    return float(cell) if len(digits) <= 15 and -22 <= power <= 22 else None


def _plain_cell(col: str, cell: str) -> Any:
    """The value of a cell of a plain table, or _NOT_PLAIN where pandas must read it."""
    if col in ("model", "gpu", "kind"):
        if cell.lower() in _NA_LIKE or _numeric(cell) or cell.strip() != cell or (col == "kind" and cell not in KINDS):
            return _NOT_PLAIN
        return cell
    if col in ("tp", "micro_batch_size", "seq_length"):
        return int(cell) if cell.isdigit() and cell.isascii() and 1 <= int(cell) <= 2**20 else _NOT_PLAIN
    if cell == "" and col in OPTIONAL:
        return None
    v = _plain_number(cell)
    if v is None:
        return _NOT_PLAIN
    if col in ("fwd_ms", "bwd_ms"):
        return v if v <= MAX_TIME_MS and not 0 < v < 1e-9 else _NOT_PLAIN
    return v if v <= MAX_OPTIONAL else _NOT_PLAIN


_NOT_PLAIN = object()


def _numeric(cell: str) -> bool:
    """pandas might read the cell as a number (float() reads at least as much)."""
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _plain_rows(csv_text: str) -> Rows | None:
    """A native table read without pandas, when it is plain: known columns once each (every
    required one), a cell in every column of every row, names that pandas keeps as text, whole
    sizes, non-negative decimal times and values that pass validate_table. None otherwise: then
    pandas reads the table (read_native), to the same values, and names what is wrong."""
    if "\r" in csv_text or '"' in csv_text:
        return None
    lines = [line for line in csv_text.split("\n") if line]
    if len(lines) < 2:
        return None
    cols = tuple(lines[0].split(","))
    if len(set(cols)) != len(cols) or not set(REQUIRED) <= set(cols) or not set(cols) <= set(REQUIRED + OPTIONAL):
        return None
    data = []
    for line in lines[1:]:
        cells = line.split(",")
        if len(cells) != len(cols):
            return None
        row = tuple(_plain_cell(c, v) for c, v in zip(cols, cells))
        if any(v is _NOT_PLAIN for v in row):
            return None
        data.append(row)
    fwd, bwd = cols.index("fwd_ms"), cols.index("bwd_ms")
    if not any(r[fwd] > 0 or r[bwd] > 0 for r in data):
        return None
    return Rows(cols, tuple(data))


def write_native(path: str | Path, table: Any, provenance: dict[str, Any]) -> None:
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
