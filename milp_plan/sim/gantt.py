"""Gantt chart (PNG) of a simulated step: one row per pipeline stage.

Needs matplotlib (the optional extra `plot`: pip install 'milp-plan[plot]'). Forward,
backward (input / weight gradient for ZB-H1) and optimizer operations are coloured by
kind; the data-parallel reduction is drawn as a thin bar under its stage's row.
Micro-batch numbers are written into the boxes when there are few enough to read.
"""
from __future__ import annotations

import io
from collections import defaultdict
from pathlib import Path

from milp_plan.errors import InputError
from milp_plan.fileio import write_atomic
from milp_plan.sim.pipeline import KIND_DP, KIND_OPT, SimResult

COLOURS = {"F": "#4c72b0", "B": "#55a868", "I": "#55a868", "W": "#dd8452", KIND_OPT: "#8c8c8c", KIND_DP: "#c44e52"}
LABEL_LIMIT = 200   # at most this many compute boxes get a micro-batch label


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("the Gantt chart needs matplotlib; install it with pip install 'milp-plan[plot]'",
                         field="gantt") from None
    return plt


def gantt_png(result: SimResult) -> bytes:
    """PNG bytes of the chart (x: seconds from the step's start, y: stage 0 at the top)."""
    plt = _pyplot()
    pp = result.spec.pp
    bars: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    labels = []
    for rec in result.records():
        if rec.kind in COLOURS and rec.end_s > rec.start_s:
            bars[(rec.stage, rec.kind)].append((rec.start_s, rec.end_s - rec.start_s))
            if rec.kind in ("F", "B", "I", "W"):
                labels.append(rec)
    fig, ax = plt.subplots(figsize=(12, max(2.0, 0.35 * pp + 1.2)), dpi=100)
    for (stage, kind), spans in sorted(bars.items()):
        y, h = (stage + 0.3, 0.12) if kind == KIND_DP else (stage - 0.4, 0.7)
        ax.broken_barh(spans, (y, h), facecolors=COLOURS[kind], edgecolor="white", linewidth=0.3)
    if len(labels) <= LABEL_LIMIT:
        for rec in labels:
            ax.text((rec.start_s + rec.end_s) / 2, rec.stage - 0.05, str(rec.microbatch), ha="center", va="center",
                    fontsize=6, color="white")
    ax.set_yticks(range(pp), [f"stage {r}" for r in range(pp)])
    ax.set_ylim(pp - 0.4, -0.6)
    ax.set_xlim(0, result.step_time_s)
    ax.set_xlabel("time (s)")
    spec = result.spec
    vpp = f", vpp {spec.vpp}" if spec.vpp > 1 else ""
    ax.set_title(f"{spec.schedule}{vpp}: pp {pp}, {spec.num_microbatches} micro-batch{'es' if spec.num_microbatches != 1 else ''}, "
                 f"step {result.step_time_s:.4g} s", loc="left", fontsize=10)
    kinds = sorted({k for _, k in bars}, key=list(COLOURS).index)
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=COLOURS[k]) for k in kinds], labels=kinds,
              loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=7, ncol=len(kinds), frameon=False)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def write_gantt(path: str | Path, result: SimResult) -> None:
    write_atomic(path, gantt_png(result))
