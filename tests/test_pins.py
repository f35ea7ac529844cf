"""--fix layers=... and order=...: pin a plan's layer split and GPU-type order (scoring another
planner's plan, or asking what a layout costs), in every planner and the brute force."""
from __future__ import annotations

import pytest

from clitools import run_cli
from milp_plan.errors import InputError
from milp_plan.formulations.space import parse_fix
from milp_plan.instance import InstanceSpec, build_instance
from milp_plan.job import Limits
from milp_plan.solvers import bruteforce
from milp_plan.solvers.driver import solve
from instances import write_instance


def test_parse_pins():
    assert parse_fix("layers=3,5,tp=2") == {"layers": (3, 5), "tp": 2}
    assert parse_fix("tp=2,order=A10,A100-80GB") == {"tp": 2, "order": ("A10", "A100-80GB")}
    assert parse_fix("layers=3,5,order=A10,A10,pp=2")["pp"] == 2
    for bad, what in (("layers=3,x", "whole numbers"), ("layers=0,4", "whole numbers"),
                      ("layers=3,5,order=A10", "different stage counts"), ("layers=4,4,pp=3", "different stage"),
                      ("order=", "a GPU or node type per stage"), ("layers=2,2,layers=4", "given twice")):
        with pytest.raises(InputError, match=what):
            parse_fix(bad)


@pytest.fixture
def six_layers(tmp_path):
    return build_instance(InstanceSpec(**{**write_instance(tmp_path, layers=6).__dict__}))


def test_hand_derived_pinned_layout(six_layers):
    """6 blocks; A10 block f+b = 2+4 ms, A100 1+2 ms (micro-batch 1, tp 1); batch 4 at dp 2,
    micro-batch 1: m = 2 micro-batches. Pinned 2 layers on the A10 stage, then 4 on the A100:
    t_0 = 2 x 6 = 12 ms, t_1 = 4 x 3 = 12 ms, 1F1B T = (m - 1) max t + sum t = 12 + 24 = 36 ms
    (transfers, reduction and optimizer are negligible at these bandwidths)."""
    fix = parse_fix("layers=2,4,order=A10,A100-80GB,tp=1,dp=2,mbs=1,recompute=none,schedule=1f1b")
    res = solve(six_layers, Limits(), fix=fix)
    assert res.status == "optimal"
    plan = res.plan
    assert [s.num_layers for s in plan.stages] == [2, 4] and [s.gpu for s in plan.stages] == ["A10", "A100-80GB"]
    assert plan.predicted.step_time_s == pytest.approx(0.036, rel=1e-3)


@pytest.mark.parametrize("pins", ["layers=1,5", "order=A10,A100-80GB", "layers=4,2,order=A100-80GB,A10",
                                  "layers=2,2,2", "order=A100-80GB,A100-80GB"])
@pytest.mark.parametrize("backend", ["cpsat", "highs"])
def test_pinned_optimum_agrees_with_brute_force(six_layers, pins, backend):
    fix = parse_fix(pins)
    ref = bruteforce.solve(six_layers, Limits(), fix=fix)
    got = solve(six_layers, Limits(), backend=backend, fix=fix)
    if ref.plan is None:
        assert got.plan is None
        return
    assert got.status == "optimal" and got.objective == pytest.approx(ref.objective, rel=1e-4)
    for plan in (ref.plan, got.plan):
        if "layers" in fix:
            assert tuple(s.num_layers for s in plan.stages) == fix["layers"]
        if "order" in fix:
            assert tuple(s.gpu for s in plan.stages) == fix["order"]
    free = bruteforce.solve(six_layers, Limits())
    assert ref.objective >= free.objective * (1 - 1e-12)   # a pin only takes plans away


def test_cli_refuses_pins_that_cannot_hold(tmp_path, capsys):
    spec = write_instance(tmp_path, layers=6)
    base = ["solve", "--cluster", spec.cluster, "--model", spec.model, "--profiles", spec.profiles,
            "--global-batch", "4", "--out", str(tmp_path / "p.json")]
    for fix, what in (("layers=2,2", "sums to 4, but hand-gpt has 6 layers"),
                      ("order=H100,A10", "order=H100: no node type or GPU"),
                      ("order=A10,A100-80GB,A10", "puts A10 stages in 2 runs, but each run starts on a node of "
                                                  "its own and the cluster has 1 A10 node")):
        code, _, err = run_cli(capsys, *base, "--fix", fix)
        assert code == 2 and what in err, err
        assert not (tmp_path / "p.json").exists()
