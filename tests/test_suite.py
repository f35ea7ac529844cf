"""Planners compared over suites (milp_plan/suite.py, suite_report.py, `compare --suite`):
suite files and generated suites, streaming and resuming, the summary's statistics, Ray,
interrupts, and the HTML report opened in a real headless browser."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from milp_plan import deadline, suite, suite_report
from milp_plan.errors import InputError
from clitools import run_cli
from instances import write_instance

EXACT_AND_HEURISTIC = ("cpsat", "brute-force", "warm-start")


def tiny_suite(tmp: Path, objectives=("min-time", "min-time@7$/h", "min-cost@9s/step")) -> Path:
    """Three cases on the tests' 4-layer, two-type instance (instances.write_instance), one per
    objective; the paths are written relative to the suite file."""
    write_instance(tmp, layers=4, counts=(2, 1))
    (tmp / "suite.yaml").write_text(f"""
name: tiny
planners: [cpsat, warm-start]
max_solve_time: 30s
cases:
  - cluster: cluster.yaml
    model: model.yaml
    profiles: profiles
    global_batch: 4
    objective: [{', '.join(objectives)}]
""")
    return tmp / "suite.yaml"


def test_suite_file_expands_lists_and_reads_paths_beside_it(tmp_path):
    s = suite.load_suite(str(tiny_suite(tmp_path)))
    assert [c.objective for c in s.cases] == ["min-time", "min-time@7$/h", "min-cost@9s/step"]
    assert s.planners == ("cpsat", "warm-start") and s.max_solve_time == "30s"
    assert all(Path(c.cluster).is_absolute() and Path(c.profiles).is_dir() for c in s.cases)
    assert len({c.name for c in s.cases}) == 3


def test_a_case_takes_its_job_settings_from_a_job_file(tmp_path):
    tiny_suite(tmp_path)
    (tmp_path / "job.yaml").write_text("global_batch: 2\nflash_attention: false\ngrad_reduce_dtype: bf16\n")
    text = (tmp_path / "suite.yaml").read_text().replace("    global_batch: 4\n", "    global_batch: 4\n    job: job.yaml\n")
    (tmp_path / "suite.yaml").write_text(text)
    case = suite.load_suite(str(tmp_path / "suite.yaml")).cases[0]
    job = suite.build_case(case).job
    assert (job.global_batch_size, job.flash_attention, job.grad_reduce_dtype) == (4, False, "bf16")  # batch: the case's


def test_the_shipped_suite_reads_and_every_case_builds():
    s = suite.load_suite(suite.SHIPPED)
    # default x {1.3b, 2.7b} x {min-time, min-cost}, default 2.7b under a $/h budget, two-type-32
    assert len(s.cases) == 6
    for case in s.cases:
        inst = suite.build_case(case)
        assert inst.model.name == case.model and inst.job.global_batch_size == case.global_batch


@pytest.mark.parametrize("text, fix", [
    ("cases: []", "cases"),
    ("cases: [{model: gpt3-1.3b, global_batch: 8}]", "missing field 'cluster'"),
    ("cases: [{cluster: default, model: gpt3-1.3b, global_batch: 8, objective: fastest}]", "not one of"),
    ("cases: [{cluster: default, model: gpt3-1.3b, global_batch: 0}]", "global_batch"),
    ("cases: [{cluster: default, model: gpt3-1.3b, global_batch: 8, gpus: 4}]", "unknown field 'gpus'"),
    ("planners: cpsat\ncases: [{cluster: default, model: gpt3-1.3b, global_batch: 8}]", "planners"),
    ("cases: [{cluster: default, model: gpt3-1.3b, global_batch: 8, name: a},\n"
     "        {cluster: default, model: gpt3-2.7b, global_batch: 8, name: a}]", "two cases are named 'a'"),
])
def test_bad_suite_files_are_one_line_input_errors(tmp_path, text, fix):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(InputError, match=fix) as err:
        suite.load_suite(str(f))
    assert str(f) in str(err.value) and "\n" not in str(err.value)


def test_random_suites_are_reproducible_prefixes_within_the_gpu_cap():
    a, b = suite.random_suite(200, 5, max_gpus=24), suite.random_suite(100, 5, max_gpus=24)
    assert a.cases[:100] == b.cases
    assert suite.random_suite(30, 6).cases != suite.random_suite(30, 5).cases
    for case in a.cases:
        gpus = sum(t["gpus_per_node"] * t["count"] for t in case.cluster["node_types"])
        assert 4 <= gpus <= 24
        suite.parse_objective(case.objective)
    objectives = [c.objective for c in a.cases]
    assert 0.2 < sum(o != "min-time" for o in objectives) / len(objectives) < 0.6  # 40% budgets drawn
    for case in a.cases[:5]:  # the clusters are valid instances
        assert suite.build_case(case).cluster.num_gpus <= 24


def run_tiny(tmp_path, **kw):
    s = suite.load_suite(str(tiny_suite(tmp_path)))
    return s, suite.run_suite(s, EXACT_AND_HEURISTIC, 60.0, **kw)


def test_summary_counts_what_each_planner_found(tmp_path):
    s, run = run_tiny(tmp_path)
    assert [r["case"] for r in run.records] == [c.name for c in s.cases] and run.ran == 3
    summary = suite_report.summarise(run.records)
    by = {p["planner"]: p for p in summary["planners"]}
    assert summary["reference"] == "cpsat" and not summary["violations"] and not summary["errors"]
    for name in ("cpsat", "brute-force"):  # both prove every case: gap 0, optimal on all three
        assert by[name]["optimal"] == by[name]["proven"] == 3 and by[name]["worst_gap"] <= 1e-6
    ws = by["warm-start"]
    assert ws["valid"] + ws["invalid"] == ws["plans"] <= 3
    # the summary's optimal count is the rows' own: gap within OPTIMAL_GAP of the proven bound
    rows = [r for r in suite_report.flat_rows(run.records) if r["planner"] == "warm-start"]
    assert ws["optimal"] == sum(1 for r in rows if r["valid"] and r["gap"] <= suite_report.OPTIMAL_GAP)
    for r in suite_report.flat_rows(run.records):  # no plan beats the case's proven optimum
        if r["valid"]:
            bound = next(rec["best_bound"] for rec in run.records if rec["case"] == r["case"])
            assert r["objective"] >= bound * (1 - 1e-6)
    csv_text = suite_report.rows_csv(run.records)
    assert csv_text.count("\n") == 1 + 3 * len(EXACT_AND_HEURISTIC)


def test_summary_statistics_by_hand():
    """Two proven cases; heuristic h: gap 0 on one, 10% on the other; search 1 s and 4 s
    against the reference's 2 s and 1 s; a third case left open."""
    def row(planner, proves, status, obj, gap, s, valid=True):
        return {"planner": planner, "proves": proves, "status": status, "objective": obj, "gap": gap,
                "valid": valid, "search_s": s}
    recs = [{"case": "a", "rows": [row("x", True, "optimal", 1.0, 0.0, 2.0), row("h", False, "feasible", 1.0, 0.0, 1.0)]},
            {"case": "b", "rows": [row("x", True, "optimal", 9.0, 0.0, 1.0), row("h", False, "feasible", 10.0, 0.1, 4.0),
                                   row("bad", False, "feasible", 5.0, None, 1.0, valid=False)]},
            # case c left open: x's plan 6 at a weak bound; h finds 4 (it beats x); its gap is not averaged
            {"case": "c", "rows": [row("x", True, "feasible", 6.0, 0.5, 2.0), row("h", False, "feasible", 4.0, 0.25, 2.0)]}]
    by = {p["planner"]: p for p in suite_report.summarise(recs)["planners"]}
    h = by["h"]
    assert (h["optimal"], h["proven"], h["mean_gap"], h["worst_gap"], h["beats_ref"]) == (1, 2, 0.05, 0.1, 1)
    # time ratios 0.5, 4 and 1: geometric mean 2^(1/3)
    assert h["time_ratio_geomean"] == pytest.approx(2 ** (1 / 3)) and h["time_ratio_max"] == 4.0
    assert (by["bad"]["plans"], by["bad"]["valid"], by["bad"]["invalid"]) == (1, 0, 1)
    assert by["x"]["beats_ref"] == 0 and by["x"]["mean_gap"] == 0.0


def test_an_interrupted_results_file_resumes_and_gives_the_same_answers(tmp_path):
    results = tmp_path / "res.jsonl"
    s, full = run_tiny(tmp_path, results=results)
    lines = results.read_text().splitlines()
    assert len(lines) == 4 and json.loads(lines[0])["fingerprint"]
    results.write_text("\n".join(lines[:2]) + "\n" + lines[2][:40])   # case 2 cut short, case 3 never written
    _, again = run_tiny(tmp_path, results=results)
    assert (again.resumed, again.ran) == (1, 2)

    def answers(run):
        return [[(r["planner"], r["status"], r["objective"]) for r in rec["rows"]] for rec in run.records]
    assert answers(again) == answers(full)
    assert len(results.read_text().splitlines()) == 4
    with pytest.raises(InputError, match="another planner list"):
        suite.run_suite(s, ("cpsat",), 60.0, results=results)


def test_an_interrupt_keeps_the_finished_cases_only(tmp_path):
    results = tmp_path / "res.jsonl"
    s = suite.load_suite(str(tiny_suite(tmp_path)))

    def stop_after_first(done, total, rec):
        deadline.request_stop()
    try:
        run = suite.run_suite(s, ("cpsat",), 60.0, results=results, progress=stop_after_first)
    finally:
        deadline.reset()
    assert run.ran == 1 and [r["case"] for r in run.records] == [s.cases[0].name]
    assert len(results.read_text().splitlines()) == 2


def test_local_processes_give_the_answers_of_one_process(tmp_path):
    _, one = run_tiny(tmp_path)
    _, two = run_tiny(tmp_path, workers=2)
    strip = [[{k: v for k, v in r.items() if k != "search_s"} for r in rec["rows"]] for rec in one.records]
    assert strip == [[{k: v for k, v in r.items() if k != "search_s"} for r in rec["rows"]] for rec in two.records]


def test_ray_runs_the_suite_on_a_local_cluster(tmp_path):
    pytest.importorskip("ray")
    s = suite.load_suite(str(tiny_suite(tmp_path, objectives=("min-time", "min-time@7$/h"))))
    local = suite.run_suite(s, ("cpsat", "warm-start"), 60.0)
    remote = suite.run_suite(s, ("cpsat", "warm-start"), 60.0, executor="ray", workers=1)

    def answers(run):
        return [[(r["planner"], r["status"], r["objective"], r["valid"]) for r in rec["rows"]] for rec in run.records]
    assert answers(remote) == answers(local) and remote.ran == 2


def test_cli_refuses_instance_flags_and_suite_flags_out_of_place(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, "compare", "--suite", "shipped", "--model", "gpt3-1.3b")
    assert code == 2 and "--model describes one instance" in err and len(err.splitlines()) == 1
    code, _, err = run_cli(capsys, "compare", "--report", "r.html")
    assert code == 2 and "--report is for suite runs" in err
    code, _, err = run_cli(capsys, "compare", "--random", "2", "--suite", "shipped")
    assert code == 2 and "not both" in err
    assert not list(tmp_path.iterdir())  # nothing written


def _browser() -> str | None:
    return next((p for p in (os.environ.get("MILP_PLAN_CHROMIUM"), shutil.which("chromium"),
                             shutil.which("chromium-browser")) if p), None)


def test_the_html_report_shows_its_tables_and_plots_in_a_headless_browser(tmp_path, capsys, monkeypatch):
    """The page `compare --suite ... --report` writes, opened in Chromium: the summary table
    has a row per planner with the CLI's numbers, both plots render as SVG, every row is
    listed. Skipped without Chromium or playwright unless MILP_PLAN_REQUIRE_BROWSER=1 (CI)."""
    need = os.environ.get("MILP_PLAN_REQUIRE_BROWSER") == "1"
    browser = _browser()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if browser is None or sync_playwright is None:
        if need:
            pytest.fail("MILP_PLAN_REQUIRE_BROWSER=1 but Chromium or playwright is missing")
        pytest.skip("needs Chromium (Debian: apt install chromium) and playwright")
    tiny_suite(tmp_path)
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "compare", "--suite", "suite.yaml", "--planners", "cpsat,warm-start",
                             "--out", "cmp.json", "--report", "report.html")
    assert code == 0, err
    assert "cpsat" in out and "Wrote cmp.json, cmp.csv, report.html" in out
    doc = json.loads((tmp_path / "cmp.json").read_text())
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=browser, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        page = b.new_page()
        page.goto((tmp_path / "report.html").as_uri())
        assert page.title() == "milp-plan compare: tiny"
        summary = page.locator("#summary tbody tr")
        assert summary.count() == 2
        cells = summary.nth(0).locator("td").all_inner_texts()
        cp = next(p for p in doc["summary"]["planners"] if p["planner"] == "cpsat")
        assert cells[0] == "cpsat" and cells[1] == str(cp["cases"]) and cells[4] == str(cp["optimal"])
        for fig in ("#quality_vs_time svg", "#gap_distribution svg"):
            box = page.locator(fig).bounding_box()
            assert box is not None and box["width"] > 200 and box["height"] > 100
        assert page.locator("#rows tbody tr").count() == 6
        assert "min-cost@9s/step" in page.locator("#rows").inner_text()
        b.close()
