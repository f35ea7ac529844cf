"""What a suite run says about each planner: summary statistics, tables, plots, an HTML page.

Every renderer reads the same dicts: `summarise(records)` (per planner) and `flat_rows`
(per case and planner), built from the JSON records `suite.run_case` returns.

Per planner:
  cases        cases it ran on (a case whose input was refused counts for none)
  plans        cases where it returned a plan; valid: the checker and the limits accept it
  invalid      plans the shared model rejects (memory, a limit, the checker's rules)
  proven       cases whose optimum some proving planner proved (status optimal)
  optimal      of those, cases where its valid plan is within OPTIMAL_GAP of the optimum
  mean/worst gap   over its valid plans on proven cases: (obj - optimum) / obj (on a case
               left open the bound may be weak, so its gap says little; those rows keep
               their gap in the CSV)
  beats ref    cases where its valid plan is better than the reference's plan, or the
               reference (the first proving planner of the run) has none: on open cases,
               where a heuristic finds what the exact search had not yet
  time ratio   its search time over the reference's on the same case: geometric mean and
               largest
"""
from __future__ import annotations

import csv
import html
import io
import math
from typing import Any, Sequence

from milp_plan.result import PROOF_TOL

OPTIMAL_GAP = PROOF_TOL   # a plan this close to a proven optimum is optimal, as the exact planners say it
CASE_FIELDS = ("case", "gpus", "model", "goal")   # goal: the case's objective as the suite states it


def flat_rows(records: Sequence[dict]) -> list[dict[str, Any]]:
    """One row per (case, planner): the case's fields, then compare.Row's."""
    out = []
    for rec in records:
        for row in rec.get("rows", []):
            out.append({**{k: rec.get(k) for k in CASE_FIELDS}, **row})
    return out


def _reference(records: Sequence[dict]) -> str | None:
    for rec in records:
        for row in rec.get("rows", []):
            if row["proves"]:
                return row["planner"]
    return None


def summarise(records: Sequence[dict]) -> dict[str, Any]:
    """Per-planner statistics (module docstring) and the run's totals."""
    ref = _reference(records)
    planners: dict[str, dict[str, Any]] = {}
    errors = [{"case": r["case"], "error": r["error"]} for r in records if r.get("error")]
    for rec in records:
        rows = rec.get("rows", [])
        proven = any(r["proves"] and r["status"] == "optimal" for r in rows)
        ref_row = next((r for r in rows if r["planner"] == ref), None)
        ref_time = None if ref_row is None else ref_row["search_s"]
        ref_obj = None if ref_row is None or not ref_row["valid"] else ref_row["objective"]
        for r in rows:
            s = planners.setdefault(r["planner"], {"planner": r["planner"], "proves": r["proves"], "cases": 0,
                                                   "plans": 0, "valid": 0, "invalid": 0, "proven": 0, "optimal": 0,
                                                   "beats_ref": 0,
                                                   "_gaps": [], "_ratios": [], "_times": []})
            s["cases"] += 1
            s["_times"].append(r["search_s"])
            s["proven"] += proven
            if r["objective"] is None:
                continue
            s["plans"] += 1
            if not r["valid"]:
                s["invalid"] += 1
                continue
            s["valid"] += 1
            if proven and r["gap"] is not None:
                s["_gaps"].append(r["gap"])
                s["optimal"] += r["gap"] <= OPTIMAL_GAP
            s["beats_ref"] += r["planner"] != ref and (ref_obj is None or r["objective"] < ref_obj * (1 - 1e-9))
            if ref_time and r["planner"] != ref:
                s["_ratios"].append(r["search_s"] / ref_time)
    for s in planners.values():
        gaps, ratios, times = s.pop("_gaps"), s.pop("_ratios"), s.pop("_times")
        s["mean_gap"] = sum(gaps) / len(gaps) if gaps else None
        s["worst_gap"] = max(gaps) if gaps else None
        s["mean_search_s"] = sum(times) / len(times) if times else None
        s["time_ratio_geomean"] = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None
        s["time_ratio_max"] = max(ratios) if ratios else None
    violations = [v for rec in records for v in rec.get("violations", [])]
    return {"cases": len(records), "errors": errors, "reference": ref, "violations": violations,
            "planners": list(planners.values())}


SUMMARY_COLUMNS = (("planner", "planner"), ("cases", "cases"), ("valid", "valid plans"), ("invalid", "invalid"),
                   ("optimal", "optimal"), ("proven", "of proven"), ("mean_gap", "mean gap"),
                   ("worst_gap", "worst gap"), ("beats_ref", "beats ref"), ("mean_search_s", "mean s"),
                   ("time_ratio_geomean", "time x ref"))


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key.endswith("gap"):
        return f"{100 * value:.2f}%"
    if key == "mean_search_s":
        return f"{value:.2f}"
    if key.startswith("time_ratio"):
        return f"{value:.3g}"
    return str(value)


def render_summary(summary: dict[str, Any]) -> str:
    from milp_plan.report import table
    rows = [[_cell(k, s[k]) for k, _ in SUMMARY_COLUMNS] for s in summary["planners"]]
    lines = [table([h for _, h in SUMMARY_COLUMNS], rows)]
    if summary["reference"]:
        lines.append(f"gap: to the proven optimum, on the proven cases; beats ref: a better plan than "
                     f"{summary['reference']}'s (or one where it has none); time x ref: geometric mean of search "
                     f"time over {summary['reference']}'s")
    for e in summary["errors"]:
        lines.append(f"case {e['case']} refused: {e['error']}")
    for v in summary["violations"]:
        lines.append(f"VIOLATION (a plan beats a proven bound): {v}")
    return "\n".join(lines)


def rows_csv(records: Sequence[dict]) -> str:
    rows = flat_rows(records)
    buf = io.StringIO()
    if rows:
        # every field of every row, in first-seen order (records from an older version may lack some)
        writer = csv.DictWriter(buf, fieldnames=list(dict.fromkeys(k for r in rows for k in r)), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return buf.getvalue()


# ---- plots (matplotlib, SVG text) -----------------------------------------------------------
def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from milp_plan.errors import InputError
        raise InputError("plots need matplotlib: pip install 'milp-plan[plot]'", field="report") from None
    plt.rcParams["svg.hashsalt"] = "milp-plan"   # the same records give the same SVG
    plt.rcParams["svg.fonttype"] = "none"
    return plt


def _finish(plt, fig, ax, title: str, xlabel: str, ylabel: str, legend: bool) -> str:
    """Label a plot, render it as SVG text (no date: the same records give the same SVG), close it."""
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if legend:
        ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    plt.close(fig)
    return buf.getvalue()[buf.getvalue().index("<svg"):]


def plots(records: Sequence[dict]) -> dict[str, str]:
    """{'quality_vs_time': SVG, 'gap_distribution': SVG}: each planner's valid plans as
    (search time, gap) points; its gaps as a sorted (cumulative) curve."""
    plt = _pyplot()
    rows = [r for r in flat_rows(records) if r["valid"] and r["gap"] is not None]
    names = list(dict.fromkeys(r["planner"] for r in flat_rows(records)))
    out = {}
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for name in names:
        pts = [(r["search_s"], 100 * r["gap"]) for r in rows if r["planner"] == name]
        if pts:
            ax.scatter(*zip(*pts), label=name, s=18, alpha=0.8)
    ax.set_xscale("log")
    out["quality_vs_time"] = _finish(plt, fig, ax, "Plan quality against search time", "search time (s, log)",
                                     "gap to the best proven bound (%)", bool(rows))
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for name in names:
        gaps = sorted(100 * r["gap"] for r in rows if r["planner"] == name)
        if gaps:
            ax.step(gaps, [(i + 1) / len(gaps) for i in range(len(gaps))], where="post", label=name)
    out["gap_distribution"] = _finish(plt, fig, ax, "Gap distribution per planner",
                                      "gap to the best proven bound (%)",
                                      "share of its valid plans with at most this gap", bool(rows))
    return out


# ---- HTML ---------------------------------------------------------------------------------
_STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}th,td{border:1px solid #ccc;padding:3px 8px}
th{background:#f2f2f2}td.n{text-align:right}.violation{color:#b00;font-weight:bold}
figure{display:inline-block;margin:0 1em 1em 0}"""


def _html_table(table_id: str, headers: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[bool]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td{' class=n' if n else ''}>{html.escape(c)}</td>"
                                    for c, n in zip(r, numeric)) + "</tr>" for r in rows)
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def render_html(title: str, meta: dict[str, Any], summary: dict[str, Any], records: Sequence[dict],
                figures: dict[str, str] | None = None) -> str:
    """One self-contained page: the run's settings, the summary, the plots, every row."""
    figures = plots(records) if figures is None else figures
    parts = [f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{html.escape(title)}</title>"
             f"<style>{_STYLE}</style></head><body>", f"<h1>{html.escape(title)}</h1>",
             "<p id=meta>" + "; ".join(f"{html.escape(k)}: {html.escape(str(v))}" for k, v in meta.items()) + "</p>"]
    for v in summary["violations"]:
        parts.append(f"<p class=violation>A plan beats a proven bound: {html.escape(v)}</p>")
    parts.append("<h2>Planners</h2>")
    parts.append(_html_table("summary", [h for _, h in SUMMARY_COLUMNS],
                             [[_cell(k, s[k]) for k, _ in SUMMARY_COLUMNS] for s in summary["planners"]],
                             [False] + [True] * (len(SUMMARY_COLUMNS) - 1)))
    if summary["reference"]:
        ref = html.escape(summary["reference"])
        parts.append(f"<p>Gap: to the proven optimum, on the cases a proving planner proved. Beats ref: a better "
                     f"plan than {ref}'s, or one where {ref} has none. Time x ref: geometric mean of the search "
                     f"time over {ref}'s on the same case.</p>")
    parts.append("<h2>Plots</h2>")
    for key, svg in figures.items():
        parts.append(f'<figure id="{key}">{svg}</figure>')
    parts.append("<h2>Every case</h2>")
    heads = ("case", "GPUs", "objective", "planner", "status", "value", "simulated s", "valid", "gap", "search s")
    body = []
    for r in flat_rows(records):
        body.append([str(r["case"]), str(r["gpus"]), str(r["goal"]), r["planner"], r["status"],
                     "-" if r["objective"] is None else f"{r['objective']:.6g}",
                     "-" if r["simulated_step_s"] is None else f"{r['simulated_step_s']:.6g}",
                     "-" if r["valid"] is None else ("yes" if r["valid"] else "no"), _cell("gap", r["gap"]),
                     f"{r['search_s']:.2f}"])
    parts.append(_html_table("rows", heads, body, [False, True, False, False, False, True, True, False, True, True]))
    for e in summary["errors"]:
        parts.append(f"<p>Case {html.escape(e['case'])} refused: {html.escape(e['error'])}</p>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
