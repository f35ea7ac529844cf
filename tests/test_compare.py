"""`milp-plan compare`: planners side by side, scored by one cost model, checker and simulator."""
from __future__ import annotations

import csv
import io
import json
import math

import pytest

from clitools import run_cli
from milp_plan.compare import Comparison, Row, compare
from milp_plan.errors import InputError
from milp_plan.job import Limits
from milp_plan.solvers import bruteforce
from tiny_instance import tiny_instance, write_inputs

EVERY = ("brute-force", "cpsat", "highs", "cbc", "warm-start", "aceso")


def test_every_planner_on_the_tiny_instance_against_brute_force(tmp_path):
    """Brute force enumerates the tiny instance: its optimum is the best proven bound, every
    exact backend proves it (gap within PROOF_TOL), the heuristic's plan is valid and not
    better, and every row carries the cost model's and the simulator's figures."""
    inst = tiny_instance(tmp_path)
    ref = bruteforce.solve(inst, Limits())
    c = compare(inst, Limits(), EVERY, time_limit_s=60.0)
    assert c.best_bound == pytest.approx(ref.objective, rel=1e-4)
    assert [r.planner for r in c.rows] == list(EVERY)
    for r in c.rows:
        assert r.valid is True and r.objective is not None and r.simulated_step_s > 0
        assert r.objective == r.step_time_s          # min-time: the objective is the cost model's step
        if r.proves:
            assert r.status == "optimal" and r.gap <= 1e-4
        else:
            assert r.status == "feasible" and r.best_bound is None and r.gap >= 0
    assert c.violations == []
    doc = json.loads(json.dumps(c.to_dict()))
    assert doc["best_bound"] == c.best_bound and not doc["proven_infeasible"] and len(doc["rows"]) == len(EVERY)
    rows = list(csv.DictReader(io.StringIO(c.to_csv())))
    assert [r["planner"] for r in rows] == list(EVERY)


def test_min_cost_gap_is_against_the_proven_optimum(tmp_path):
    inst = tiny_instance(tmp_path)
    fastest = bruteforce.solve(inst, Limits()).plan.predicted.step_time_s
    limits = Limits("min-cost", time_limit_s=1.5 * fastest)
    ref = bruteforce.solve(inst, limits)
    c = compare(inst, limits, ("brute-force", "cpsat", "warm-start"), time_limit_s=60.0)
    assert c.best_bound == pytest.approx(ref.objective, rel=1e-9)
    by = {r.planner: r for r in c.rows}
    assert by["cpsat"].objective == pytest.approx(ref.objective, rel=1e-4)
    assert by["warm-start"].objective >= ref.objective * (1 - 1e-9)
    assert by["warm-start"].step_time_s <= 1.5 * fastest


def test_a_proven_infeasible_instance(tmp_path):
    inst = tiny_instance(tmp_path)
    c = compare(inst, Limits(time_limit_s=1e-6), ("cpsat", "warm-start"), time_limit_s=60.0)
    assert math.isinf(c.best_bound) and c.to_dict()["proven_infeasible"]
    assert all(r.objective is None and r.gap is None for r in c.rows)


def test_a_plan_below_a_proven_bound_is_a_violation():
    """The guard that catches a heuristic (or a backend) beating a proof: a row 1% below the
    best proven bound is listed; one at the bound is not."""
    row = dict(proves=False, status="feasible", step_time_s=1.0, usd_per_step=0.1, usd_per_hour=1.0, gpus=8,
               simulated_step_s=1.0, valid=True, best_bound=None, gap=0.0, search_s=0.1)
    c = Comparison("min-time", 1.0, 2.0, (Row("a", objective=1.98, **row), Row("b", objective=2.0, **row)))
    assert c.violations == ["a: objective 1.98 below the proven bound 2"]


def test_an_unknown_planner_is_refused_before_any_run(tmp_path):
    with pytest.raises(InputError, match="unknown solver 'aceso2'"):
        compare(tiny_instance(tmp_path), Limits(), ("cpsat", "aceso2"))


def test_cli_writes_json_and_csv_and_refuses_bad_planner_lists(tmp_path, capsys):
    cluster, model, prof = write_inputs(tmp_path)
    base = ["compare", "--cluster", str(cluster), "--model", str(model), "--profiles", str(prof),
            "--global-batch", "8"]
    out = tmp_path / "cmp.json"
    code, stdout, err = run_cli(capsys, *base, "--planners", "cpsat,warm-start", "--out", str(out))
    assert code == 0, err
    assert "cpsat" in stdout and "warm-start" in stdout and "best proven bound" in stdout
    doc = json.loads(out.read_text())
    assert [r["planner"] for r in doc["rows"]] == ["cpsat", "warm-start"]
    assert (tmp_path / "cmp.csv").read_text().startswith("planner,")
    for bad, what in (("cpsat,cpsat", "each planner once"), ("cpsat,nope", "unknown solver 'nope'")):
        code, _, err = run_cli(capsys, *base, "--planners", bad, "--out", str(tmp_path / "x.json"))
        assert code == 2 and what in err, err
        assert not (tmp_path / "x.json").exists()
