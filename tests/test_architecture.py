"""The package's shape: no import cycles, every schedule rule in schedules.py, every planner
behind one protocol (planners.py) and scored by the same cost model and checker."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import milp_plan
from milp_plan import check, planners, schedules
from milp_plan.deadline import Deadline
from milp_plan.errors import InputError
from milp_plan.job import Limits
from milp_plan.result import Status
from milp_plan.sim import PipelineSpec, simulate_pipeline
from tiny_instance import tiny_instance

PACKAGE = Path(milp_plan.__file__).parent


def _modules() -> dict[str, Path]:
    out = {}
    for f in PACKAGE.rglob("*.py"):
        parts = f.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports, lazy (in-function) imports included."""
    mods = _modules()

    def owner(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        for node in ast.walk(ast.parse(f.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("milp_plan"):
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module
                           for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("milp_plan")]
            graph[m] |= {t for t in map(owner, targets) if t and t != m}
    return graph


def test_no_import_cycle():
    graph, state, stack = _import_graph(), {}, []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(n):] + [n]))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2
    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_the_cycle_detector_sees_a_cycle(tmp_path, monkeypatch):
    """Mutation check of the test above: a lazy import back into the driver is a cycle."""
    graph = _import_graph()
    graph["milp_plan.schedules"].add("milp_plan.costmodel")   # costmodel imports schedules
    with pytest.raises(AssertionError, match="import cycle"):
        monkeypatch.setattr(__import__(__name__), "_import_graph", lambda: graph)
        test_no_import_cycle()


def test_no_schedule_name_compared_outside_the_schedule_module():
    names = set(schedules.NAMES)
    found = []
    for f in PACKAGE.rglob("*.py"):
        if f.name == "schedules.py" and f.parent == PACKAGE:
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Compare):
                consts = [c for c in [node.left, *node.comparators] if isinstance(c, ast.Constant)]
                consts += [e for c in node.comparators if isinstance(c, (ast.Tuple, ast.List, ast.Set))
                           for e in c.elts if isinstance(e, ast.Constant)]
                if any(c.value in names for c in consts):
                    found.append(f"{f.relative_to(PACKAGE)}:{node.lineno}")
    assert not found, f"schedule names compared outside schedules.py: {found}"


# ---- schedules --------------------------------------------------------------------------
def test_schedule_of_knows_every_name_and_refuses_others():
    assert schedules.NAMES == ("1f1b", "interleaved", "gpipe", "zb-h1")
    assert schedules.MODELLED == ("1f1b", "interleaved", "gpipe")
    with pytest.raises(InputError, match="unknown schedule 'pipedream'"):
        schedules.schedule_of("pipedream")


def test_interleaved_with_one_chunk_is_1f1b():
    f, b, h = [1.0, 2.0, 1.5], [2.0, 4.0, 3.0], [0.1, 0.2]
    one, il = schedules.schedule_of("1f1b"), schedules.schedule_of("interleaved", 1)
    assert il.pipeline_time(f, b, 6, h) == one.pipeline_time(f, b, 6, h)
    assert il.p2p_time(h, 0.3) == one.p2p_time(h, 0.3) == pytest.approx(0.6)
    assert [il.in_flight(3, s, 6) for s in range(3)] == [one.in_flight(3, s, 6) for s in range(3)] == [3, 2, 1]
    assert il.chunks == 1 and il.period is schedules.Period.WINDOWS


@pytest.mark.parametrize("name,vpp", [("1f1b", 1), ("gpipe", 1), ("interleaved", 2), ("zb-h1", 1)])
def test_equal_stages_closed_form_is_the_simulation(name, vpp):
    """At equal stages without transfers every closed form is exact: 1F1B (m + p - 1) t,
    interleaved m t + (p - 1) t / v, GPipe (m + p - 1) t, ZB-H1 m t + (p - 1)(F + I - W) (the
    paper's (p - 1)(T_F + T_B - T_W), its B being the input-gradient pass I = b - W)."""
    p, m, f, b = 4, 8, 1.0, 2.0
    sched = schedules.schedule_of(name, vpp)
    closed = sum(sched.pipeline_time([f] * p, [b] * p, m, [0.0] * (p - 1)))
    hand = {"1f1b": (m + p - 1) * 3.0, "gpipe": (m + p - 1) * 3.0, "interleaved": m * 3.0 + (p - 1) * 3.0 / 2,
            "zb-h1": m * 3.0 + (p - 1) * (f + b - 2 * b * schedules.W_FRACTION_OF_BWD)}[name]
    assert closed == pytest.approx(hand)
    sim = simulate_pipeline(PipelineSpec(name, m, (f,) * p, (b,) * p, hop_s=(0.0,) * (p - 1), vpp=vpp))
    assert sim.pipeline_time_s == pytest.approx(hand)


# ---- planners ---------------------------------------------------------------------------
def test_every_planner_returns_a_checked_plan_and_the_exact_ones_agree(tmp_path):
    """The tiny instance: brute force is the reference optimum; every exact backend proves
    the same objective; the warm-start heuristic finds a valid plan no better than it."""
    inst = tiny_instance(tmp_path)
    limits = Limits()
    results = {name: p.plan(inst, limits, Deadline(60.0)) for name, p in planners.PLANNERS.items()}
    ref = results["brute-force"].objective
    for name, r in results.items():
        assert r.plan is not None, name
        assert isinstance(r.status, Status)
        assert check.check_plan(inst, r.plan) == [], name
        assert r.plan.solver.backend == name
        if planners.PLANNERS[name].proves:
            assert r.status is Status.OPTIMAL, name
            assert r.objective == pytest.approx(ref, rel=1e-4), name
        else:
            assert r.status is Status.FEASIBLE and r.best_bound is None
            assert r.objective >= ref * (1 - 1e-9)
    assert planners.get("auto") is planners.PLANNERS["cpsat"]
    with pytest.raises(InputError, match="unknown solver 'gurobi'"):
        planners.get("gurobi")


def test_the_shared_coefficient_cache_serves_one_instance(tmp_path):
    """Keys leave out the instance-level inputs (sequence length, profiles, headroom), so a
    cache made for one instance must refuse another, even one that differs only in those."""
    from milp_plan.formulations.coefficients import Coefficients, SharedCoefficients
    from milp_plan.formulations.space import enumerate_configs
    a, b = tiny_instance(tmp_path / "a"), tiny_instance(tmp_path / "b", memory_headroom=0.3)
    shared = SharedCoefficients(a)
    cfg = next(iter(enumerate_configs(a)))
    Coefficients(a, cfg, shared)
    with pytest.raises(ValueError, match="one instance"):
        Coefficients(b, cfg, shared)
    # and the fits it shares are the ones a fresh cache computes
    fresh, reused = Coefficients(a, cfg), Coefficients(a, cfg, shared)
    assert [fresh.time(o, 0) for o in range(len(fresh.options))] == \
        [reused.time(o, 0) for o in range(len(reused.options))]
