"""The search space: every schedule and size the product launches, within the profiled points.

Issue 21 §3: GPipe, interleaving with vpp outside {2, 4} and micro-batches past 16 were only
reachable under --fix, so an `optimal` plan could be beaten by a plan --fix accepts.
Issue 12 §4: tp 8 and micro-batch 8 were planned on a profile measured up to tp 4 and
micro-batch 4, extrapolated, and nothing said so. Each test below fails on the code before
the fix (noted per test).
"""
from __future__ import annotations

import json
import math
import os
import pickle
import subprocess
import sys

import jsonschema
import pytest

from milp_plan import analytic, check
from milp_plan.errors import InputError
from milp_plan.job import Limits
from milp_plan.formulations.space import StageOption, enumerate_configs, parse_fix, plan_fills, with_space_options
from milp_plan.instance import InstanceSpec, build_instance
from milp_plan.model import load_model
from milp_plan.plan import plan_from_dict, read_plan, schema
from milp_plan.solvers import bruteforce
from milp_plan.solvers.driver import solve
from clitools import run_cli
from instances import BACKENDS, write_instance
from tiny_instance import tiny_instance, write_inputs

MS = 1e-3
OLD_SPACE = [{"schedule": "1f1b", "mbs<=": 16}, {"schedule": "interleaved", "vpp": 2, "mbs<=": 16},
             {"schedule": "interleaved", "vpp": 4, "mbs<=": 16}]


def old_space_optimum(inst) -> float:
    """The best plan of the space searched before issue 21: 1F1B, or interleaved with vpp 2 or
    4, micro-batch <= 16 (each solved exactly; a fix no config passes holds no plan)."""
    best = math.inf
    for fix in OLD_SPACE:
        try:
            r = solve(inst, Limits(), fix=fix)
        except InputError:
            continue
        if r.plan is not None:
            best = min(best, r.objective)
    return best


@pytest.mark.parametrize("backend", BACKENDS)
def test_interleaving_with_vpp_3_beats_the_old_space(tmp_path, backend):
    """6 layers; 2 A100 nodes of 1 GPU (block f 1 + b 2 = 3 ms) + 1 A10; links ~free; 4 GiB/1000
    of memory holds at most 3 layers a GPU, so the plan is pp 2 on the A100s with 3 + 3 layers,
    t = 9 ms a stage, m = 4 micro-batches of 1.
      interleaved vpp 3 (one layer a chunk): T = m z + (sum t - z) / 3 = 36 + 3 = 39 ms
      1F1B:                               T = (m - 1) z + sum t       = 27 + 18 = 45 ms
      interleaved vpp 2 (stages 2 + 4):   T = 4 x 12 + 6 / 2          = 51 ms; vpp 4 needs 8 layers.
    (+ ~3 us of optimizer and transfers; equal stages, so the simulation agrees.) The old
    space's best in simulation is 1F1B over all three GPUs, [3, 2, 1] on A100, A100, A10
    (t = 9, 6, 6 ms; f0 = 3): the path F0 down, B0 back to stage 0, the rest of stage 0 is
    S + (m - 1) t0 - (w0 - 1) f0 = 21 + 27 - 2 x 3 = 42 ms (the closed form says 48, so
    before the simulated step it picked [3, 3] at 45)."""
    spec = write_instance(tmp_path, layers=6, gpn=1, counts=(2, 1), memory_gib=(0.004, 0.004, None))
    inst = build_instance(spec)
    got = solve(inst, Limits(), backend=backend)
    assert got.status == "optimal"
    p = got.plan
    assert (p.schedule, p.vpp, [s.num_layers for s in p.stages]) == ("interleaved", 3, [3, 3])
    assert got.objective == pytest.approx(39.003 * MS, abs=0.002 * MS)
    assert not check.check_plan(inst, p)
    assert bruteforce.solve(inst, Limits()).objective == pytest.approx(got.objective, rel=1e-6)
    assert old_space_optimum(inst) == pytest.approx(42.004 * MS, abs=0.002 * MS)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gpipe_beats_the_old_space_on_slow_links(tmp_path, backend):
    """4 layers on 2 single-A100 nodes (the memory holds 2 layers a GPU: pp 2, 2 + 2 layers,
    f = 2, b = 4, t = 6 ms a stage), m = 4, links of 0.004 GB/s: a hop sends 1 x 32 x 64 x 2 B
    = 4096 B in h = 1.024 ms.
      GPipe: (m - 1)(max(f, h) + max(b, h)) + sum t + 2 h = 18 + 12 + 2.048 = 32.048 ms
      1F1B: z >= (t0 + 2h + t1) / 2 = 7.024, T = 3 z + 12 + 2h = 35.12 ms
      interleaved vpp 2: m z + (sum t - z) / 2 + 2 (2 h + h_wrap) = 24 + 3 + 6.144 = 33.144 ms
    (+ ~2 us of optimizer) by the closed forms. Simulated (the step proven), GPipe's 32.048
    stands; 1F1B's is 34.096 and interleaved's 33.192 ms (its hops queue on the links), so the
    old space's best is 33.194 ms with the optimizer. hand-gpt ties its embeddings: every pp 2 plan
    then all-reduces the embedding gradient between its two nodes after the reduction, V h x 4 B =
    128 x 64 x 4 = 32,768 B at 0.004 GB/s, 8.192 ms, so 40.242 and 41.386 ms. Before issue 21
    GPipe was only reachable with --fix schedule=gpipe."""
    spec = write_instance(tmp_path, layers=4, gpn=1, counts=(2, 1), memory_gib=(0.004, 0.004, None),
                          bw=(0.004, 0.004))
    inst = build_instance(spec)
    got = solve(inst, Limits(), backend=backend)
    assert got.status == "optimal"
    assert (got.plan.schedule, [s.num_layers for s in got.plan.stages]) == ("gpipe", [2, 2])
    assert got.objective == pytest.approx((32.050 + 8.192) * MS, abs=0.002 * MS)
    assert bruteforce.solve(inst, Limits()).objective == pytest.approx(got.objective, rel=1e-6)
    assert old_space_optimum(inst) == pytest.approx((33.194 + 8.192) * MS, abs=0.002 * MS)


@pytest.mark.parametrize("mode", ["megatron", "free"])
def test_gpipe_is_searched_at_one_stage_only_when_pinned(mode):
    """At pp 1 (no pipeline) GPipe is 1F1B's dominated twin (schedules.searched): the search
    enumerates GPipe there only under --fix schedule=gpipe, and every other (pp, schedule) stays."""
    inst = build_instance(InstanceSpec())
    got = {(c.pp, c.schedule) for c in enumerate_configs(inst, {}, mode=mode)}
    assert (1, "gpipe") not in got and (1, "1f1b") in got and (2, "gpipe") in got and (2, "1f1b") in got
    pinned = {(c.pp, c.schedule) for c in enumerate_configs(inst, {"schedule": "gpipe", "pp": 1}, mode=mode)}
    assert pinned == {(1, "gpipe")}


def test_at_one_stage_gpipe_runs_1f1b_s_step_with_at_least_its_memory():
    """Why GPipe is left out at pp 1: the shipped default's job pinned to one stage, GPipe, 5
    micro-batches of 1 sample per replica (80 / 16 GPUs), and the same plan under 1F1B. Both
    run the 5 micro-batches one after another: the same step (simulated, the job's basis; the
    closed forms agree by algebra, formulations/pipeline.md); GPipe holds all 5 in flight, 1F1B
    one, so its activations are 5x (the rest of memory equal)."""
    from milp_plan import predict
    inst = build_instance(InstanceSpec())
    gp = solve(inst, Limits(), fix=parse_fix("pp=1,tp=1,dp=16,mbs=1,schedule=gpipe,recompute=none")).plan
    assert gp.num_microbatches == 5 and gp.schedule == "gpipe"
    ob = gp.with_schedule("1f1b", 1)
    ob = ob.with_(predicted=predict.evaluate(inst, ob))
    assert ob.predicted.step_time_s == pytest.approx(gp.predicted.step_time_s, rel=1e-12)
    g0, o0 = gp.predicted.stages[0], ob.predicted.stages[0]
    assert (g0.inflight_microbatches, o0.inflight_microbatches) == (5.0, 1.0)
    assert g0.activations_gib == pytest.approx(5 * o0.activations_gib, rel=1e-12)
    assert g0.peak_memory_gib - g0.activations_gib == pytest.approx(o0.peak_memory_gib - o0.activations_gib)


def test_caps_parse_and_bound_the_space(tmp_path):
    assert parse_fix("tp<=4,mbs<=8,mbs<=2") == {"tp<=": 4, "mbs<=": 2}
    assert parse_fix(with_space_options("pp=2", True, 2, 4)) == {"pp": 2, "tp<=": 2, "mbs<=": 4, "extrapolate": True}
    for bad in ("pp<=2", "tp<=0", "tp=4,tp<=2", "tp<4"):
        with pytest.raises(InputError):
            parse_fix(bad)
    inst = build_instance(InstanceSpec())
    configs = list(enumerate_configs(inst, parse_fix("tp<=2,mbs<=4")))
    assert configs and {c.uniform.tp for c in configs} == {1, 2} and max(c.uniform.mbs for c in configs) == 4


def test_an_analytic_profile_generates_every_point():
    """The shipped analytic table stops at micro-batch 16; past it the analytic formula itself
    (not a fill rule) gives the time, so the default space (global batch 80) holds micro-batch
    20 (dp 4: 20 samples per replica) and a plan on it lists no filled point."""
    inst = build_instance(InstanceSpec())
    model, gpu = inst.model, inst.cluster.node_types[0].gpu
    cost = inst.profile.cost(model.name, gpu.name, 2, 20, inst.job.seq_length, "block")
    fwd, bwd, _ = analytic.layer_cost_s(model, gpu, "block", 2, 20, inst.job.seq_length)
    assert (cost.fwd_ms, cost.bwd_ms) == pytest.approx((fwd * 1e3, bwd * 1e3), rel=1e-12)
    assert not inst.profile.fills
    assert any(c.uniform.mbs == 20 for c in enumerate_configs(inst, {"tp": 1, "dp": 4}))


def solve_cli(capsys, d, *extra):
    return run_cli(capsys, "solve", "--cluster", str(d / "tiny-cluster.yaml"), "--model", str(d / "tiny-model.yaml"),
               "--profiles", str(d / "tiny-profile.csv"), "--global-batch", "8", *extra)


def test_the_default_stays_inside_the_profile_and_extrapolate_lists_what_it_fills(tmp_path):
    """The tiny profile measures tp 1, 2 and micro-batch 1, 2 only (nodes of 4 G GPUs allow tp 4).
    Filled by the rules, tp 4 halves tp 2's times: the unrestricted optimum is tp 4 / dp 1 on
    both big nodes, 33.09 ms simulated (33.40 by the closed form). Inside the profile the best
    is tp 2 / dp 2, 34.63 ms simulated (35.25). Before issue 12 the default planned the tp 4
    plan and recorded nothing."""
    inst = tiny_instance(tmp_path)
    inside = solve(inst, Limits())
    assert inside.status == "optimal"
    assert all(s.tp <= 2 and s.micro_batch_size <= 2 for s in inside.plan.stages)
    assert inside.objective == pytest.approx(34.63 * MS, abs=0.01 * MS)
    assert plan_fills(inst, inside.plan) == ()
    wide = solve(inst, Limits(), fix={"extrapolate": True})
    assert [s.tp for s in wide.plan.stages] == [4, 4]
    assert wide.objective == pytest.approx(33.09 * MS, abs=0.01 * MS) and wide.objective < inside.objective
    fills = plan_fills(inst, wide.plan)
    assert {(f.gpu, f.tp, f.micro_batch_size, f.kind) for f in fills} == {("G", 4, 1, k) for k in
                                                                        ("embedding", "block", "head")}
    assert all("scaled from tp=2" in f.how for f in fills)
    assert bruteforce.solve(inst, Limits(), fix={"extrapolate": True}).objective == pytest.approx(wide.objective,
                                                                                                  rel=1e-6)
    with pytest.raises(InputError, match="--extrapolate"):
        solve(inst, Limits(), fix={"tp": 4})


def test_plan_json_lists_the_filled_points_and_stays_byte_identical(tmp_path, capsys):
    d = tmp_path / "in"
    write_inputs(d)
    code, _, err = solve_cli(capsys, d, "--out", str(tmp_path / "plain.json"))
    assert code == 0, err
    assert json.loads((tmp_path / "plain.json").read_text())["profile_fills"] == []
    outs = []
    for name in ("a.json", "b.json"):
        code, out, err = solve_cli(capsys, d, "--extrapolate", "--out", str(tmp_path / name))
        assert code == 0, err
        outs.append((tmp_path / name).read_bytes())
    assert outs[0] == outs[1]
    assert "Extrapolated: 3 profile point(s)" in out
    doc = json.loads(outs[0])
    jsonschema.validate(doc, schema())
    assert {(f["tp"], f["kind"]) for f in doc["profile_fills"]} == {(4, k) for k in ("embedding", "block", "head")}
    assert read_plan(tmp_path / "a.json").profile_fills == plan_from_dict(doc).profile_fills
    code, _, err = solve_cli(capsys, d, "--extrapolate", "--max-tp", "2", "--max-micro-batch", "1", "--out",
                             str(tmp_path / "c.json"))
    assert code == 0, err
    stages = json.loads((tmp_path / "c.json").read_text())["stages"]
    assert all(s["tp"] <= 2 and s["micro_batch_size"] == 1 for s in stages)


def test_a_profile_that_covers_nothing_says_how_to_go_on(tmp_path):
    """The tiny profile is measured at sequence length 500; at 1000 no point is measured."""
    inst = tiny_instance(tmp_path, seq_length=1000)
    with pytest.raises(InputError, match="sequence length 1000.*--extrapolate"):
        solve(inst, Limits())


@pytest.mark.parametrize("cluster, model, gbs, fix", [("default", "gpt3-6.7b", 256, None),
                                                      ("mixed-128", "gpt3-13b", 512, {"pp": 4})])
def test_free_children_from_the_parents_options_are_those_from_scratch(cluster, model, gbs, fix):
    """free_children and free_completions given a parent's options (the search's Prepared.children
    passes its Coefficients'; each child gets the parent's of the size it settles) list the same
    configs, in order, as from stage_options: two node types (children complete) and four
    (children that are parents again); free_completions lists the leaves of free_children's tree."""
    from milp_plan.formulations.space import free_children, free_completions, stage_options
    inst = build_instance(InstanceSpec(cluster=cluster, model=model, global_batch_size=gbs))
    parents = [c for c in enumerate_configs(inst, fix, mode="free") if not c.complete][::5]
    assert parents
    def leaves(c):   # the tree free_children branches, walked depth first: free_completions' definition
        return [c] if c.complete else [leaf for child in free_children(inst, c, fix) for leaf in leaves(child)]
    for cfg in parents:
        options = stage_options(inst, cfg, fix)
        assert list(free_children(inst, cfg, fix, options)) == list(free_children(inst, cfg, fix))
        assert list(free_completions(inst, cfg, fix, options)) == list(free_completions(inst, cfg, fix)) == leaves(cfg)


@pytest.mark.parametrize("make, expr", [(lambda: StageOption(1, 2, 4, 1, "full"), "StageOption(1, 2, 4, 1, 'full')"),
                                        (lambda: load_model("gpt3-1.3b"), "load_model('gpt3-1.3b')")])
def test_an_object_of_cached_hash_pickled_by_one_process_is_found_by_another(tmp_path, make, expr):
    """StageOption and Model cache their hash (the coefficient cache's keys hold tuples of many
    options; the per-layer functions are memoised on the model); a process with another
    string-hash salt (a spawned Ray or multiprocessing worker) must not read the cached one:
    unpickled, the object is found among its own equals."""
    obj = make()
    hash(obj)   # cached here
    path = tmp_path / "obj.pkl"
    path.write_bytes(pickle.dumps(obj))
    code = ("import pickle, sys; from milp_plan.formulations.space import StageOption; "
            "from milp_plan.model import load_model; "
            f"o, fresh = pickle.load(open({str(path)!r}, 'rb')), {expr}; "
            "sys.exit(0 if o in {fresh: 0} and hash(o) == hash(fresh) else 1)")
    for seed in ("1", "2", "3"):
        got = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": seed})
        assert got.returncode == 0, seed
