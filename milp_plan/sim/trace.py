"""Chrome / Perfetto trace-event export of a simulated step (opens in ui.perfetto.dev).

Layout: process 1 "pipeline stages" has one track (thread) per pipeline stage with its
F/B/I/W operations and its optimizer step; process 2 "p2p links" one track per link
direction; process 3 "data-parallel reduction" one track per stage. Times are in
microseconds ("ts", "dur"), rounded to nanoseconds so the file is byte-identical run to
run. Zero-length transfers and reductions (no communication) are left out.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from milp_plan.fileio import write_atomic
from milp_plan.sim.pipeline import (KIND_BARRIER, KIND_DP, KIND_OPT, KIND_TRANSFER_BWD, KIND_TRANSFER_FWD, OpRecord,
                                    SimResult)

PID_STAGES, PID_LINKS, PID_DP = 1, 2, 3


def _place(rec: OpRecord) -> tuple[int, int]:
    """(pid, tid) of an operation's track."""
    if rec.kind == KIND_TRANSFER_FWD:
        return PID_LINKS, 2 * rec.stage
    if rec.kind == KIND_TRANSFER_BWD:
        return PID_LINKS, 2 * rec.stage + 1
    if rec.kind == KIND_DP:
        return PID_DP, rec.stage
    return PID_STAGES, rec.stage


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def _metadata(tracks: dict[tuple[int, int], str]) -> list[dict[str, Any]]:
    names = {PID_STAGES: "pipeline stages", PID_LINKS: "p2p links", PID_DP: "data-parallel reduction"}
    out = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": names[pid]}}
           for pid in sorted({p for p, _ in tracks})]
    out += [{"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}}
            for pid in sorted({p for p, _ in tracks})]
    for (pid, tid), name in sorted(tracks.items()):
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    return out


def chrome_trace(result: SimResult) -> dict[str, Any]:
    """The trace-event JSON object ({"traceEvents": [...], ...}) of a simulated step."""
    tracks: dict[tuple[int, int], str] = {(PID_STAGES, r): f"stage {r}" for r in range(result.spec.pp)}
    events = []
    for rec in result.records():
        compute = rec.kind not in (KIND_TRANSFER_FWD, KIND_TRANSFER_BWD, KIND_DP, KIND_BARRIER)
        if rec.kind == KIND_BARRIER or (not compute and rec.end_s <= rec.start_s):
            continue
        pid, tid = _place(rec)
        tracks.setdefault((pid, tid), rec.track)
        args = {"stage": rec.stage}
        if rec.microbatch >= 0:
            args.update(microbatch=rec.microbatch, chunk=rec.chunk)
        events.append({"name": rec.name, "cat": rec.kind if rec.kind != KIND_OPT else "optimizer", "ph": "X",
                       "ts": _us(rec.start_s), "dur": _us(rec.end_s - rec.start_s), "pid": pid, "tid": tid,
                       "args": args})
    events.sort(key=lambda e: (e["pid"], e["tid"], e["ts"], e["name"]))
    spec = result.spec
    return {"traceEvents": _metadata(tracks) + events, "displayTimeUnit": "ms",
            "otherData": {"schedule": spec.schedule, "pp": spec.pp, "vpp": spec.vpp,
                          "num_microbatches": spec.num_microbatches, "step_time_s": result.step_time_s}}


def write_trace(path: str | Path, result: SimResult) -> None:
    """Write the trace atomically (same result -> byte-identical file)."""
    write_atomic(path, json.dumps(chrome_trace(result), sort_keys=True, separators=(",", ":")) + "\n")
