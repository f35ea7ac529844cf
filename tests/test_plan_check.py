"""plan.json (round trip, schema, errors, atomic writes) and the plan checker, one rule family
at a time, on the tiny instance of tests/tiny_instance.py (nodes 0, 1: 4 x G; nodes 2, 3: 2 x S)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema
import pytest

from milp_plan import predict
from milp_plan.check import check_device_count, check_plan
from milp_plan.errors import InputError
from milp_plan.plan import (Device, Plan, SolverRecord, Stage, plan_from_dict, read_plan, schema,
                            write_plan)
from tiny_instance import devs, tiny_instance, two_stage_plan


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="module")
def inst(tiny_dir):
    return tiny_instance(tiny_dir)


def full_plan(inst) -> Plan:
    """The two-stage plan with a prediction, a solver record and inputs, as `solve` writes it."""
    plan = two_stage_plan()
    return plan.with_(predicted=predict.evaluate(inst, plan),
                      solver=SolverRecord("cpsat", "optimal", 0.0383, 0.0383, 0.0, None, 1),
                      inputs=json.loads(json.dumps(inst.inputs_record())))


# ---- plan.json --------------------------------------------------------------------------
def test_round_trip(inst, tmp_path):
    plan = full_plan(inst)
    path = tmp_path / "plan.json"
    write_plan(path, plan)
    back = read_plan(path)
    assert back == plan
    assert back.to_json() == path.read_text()          # and byte-identical when written again
    assert plan_from_dict(json.loads(plan.to_json())) == plan


def test_json_validates_against_shipped_schema(inst):
    schema_doc = schema()
    jsonschema.Draft202012Validator.check_schema(schema_doc)
    jsonschema.validate(json.loads(full_plan(inst).to_json()), schema_doc)
    jsonschema.validate(json.loads(two_stage_plan().to_json()), schema_doc)   # no prediction, no solver
    doc = two_stage_plan().to_dict()
    assert doc["schema_version"] == "2" and doc["megatron_compatible"] is True
    doc["stages"][0]["tp"] = 0
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, schema_doc)


def test_a_version_1_plan_still_reads(tmp_path, inst):
    """Schema 2 only added `phases`: a file written by the version before reads as the same plan."""
    plan = full_plan(inst)
    doc = plan.to_dict()
    doc["schema_version"] = "1"
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(doc))
    assert read_plan(p) == plan and "phases" not in doc


def test_read_plan_not_json(tmp_path):
    p = tmp_path / "plan.json"
    p.write_text('{"schema_version": "1",\n  oops}')
    with pytest.raises(InputError, match=r"not valid JSON \(line 2") as err:
        read_plan(p)
    assert str(p) in str(err.value)


@pytest.mark.parametrize("doc", [[1, 2], {"stages": []}, "plan"])
def test_read_plan_not_a_plan(tmp_path, doc):
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="not a milp-plan plan") as err:
        read_plan(p)
    assert str(p) in str(err.value)


def test_read_plan_unknown_version(tmp_path):
    doc = two_stage_plan().to_dict()
    doc["schema_version"] = "7"
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(InputError) as err:
        read_plan(p)
    msg = str(err.value)
    assert str(p) in msg and "field 'schema_version'" in msg and "'7'" in msg


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["stages"][1].update(tp=0), "stages.1.tp"),
    (lambda d: d["stages"][0]["devices"][2].pop("local_gpu"), "stages.0.devices.2"),
    (lambda d: d.update(schedule="pipedream"), "schedule"),
    (lambda d: d.update(colour="red"), "(top level)"),
    (lambda d: d["stages"][0].update(recompute="some"), "stages.0.recompute"),
])
def test_read_plan_schema_violation_names_field(tmp_path, edit, field):
    doc = two_stage_plan().to_dict()
    edit(doc)
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(InputError) as err:
        read_plan(p)
    assert f"field '{field}'" in str(err.value) and str(p) in str(err.value)


def test_read_plan_missing_file(tmp_path):
    with pytest.raises(InputError, match="not found"):
        read_plan(tmp_path / "nope.json")


def test_write_is_atomic(inst, tmp_path, monkeypatch):
    path = tmp_path / "plan.json"
    write_plan(path, two_stage_plan())
    before = path.read_bytes()

    def boom(src, dst):
        raise OSError("disk full")
    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(InputError, match="cannot write here: disk full"):  # exit 2 naming the path, not a bug
        write_plan(path, full_plan(inst))
    monkeypatch.undo()
    assert path.read_bytes() == before                  # the old plan is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]   # no temporary file left


# ---- check_plan: one rule family at a time ----------------------------------------------
def rules(violations) -> set[str]:
    return {v.rule for v in violations}


def messages(violations, rule: str) -> str:
    return " | ".join(v.message for v in violations if v.rule == rule)


def one_stage(stage: Stage, m: int, **kw) -> Plan:
    return Plan((stage,), 8, m, **kw)


def test_valid_plans_pass(inst):
    assert check_plan(inst, two_stage_plan()) == []
    assert check_plan(inst, full_plan(inst)) == []
    # interleaved: 2 stages of 2 layers, vpp 2, m = 4 (divisible by pp 2)
    assert check_plan(inst, two_stage_plan(schedule="interleaved", vpp=2)) == []
    # heterogeneous free-mode plan: tp 2 on G and tp 1 (dp 2) on... G of node 1; mbs 1
    s0 = Stage("G", devs(0, range(4)), 0, 2, 2, 2, 1)
    s1 = Stage("G", devs(1, (0, 1)), 2, 2, 1, 2, 1, "full", 2)
    assert check_plan(inst, Plan((s0, s1), 8, 4, mode="free")) == []


def test_device_exists(inst):
    # node 0 has GPUs 0..3; node 9 does not exist; node 2 holds S, not G
    bad_gpu = one_stage(Stage("G", (Device(0, 0), Device(0, 4)), 0, 4, 2, 1, 1), 8)
    v = check_plan(inst, bad_gpu)
    assert rules(v) == {"device_exists"} and "node 0 has GPUs 0...3, not 4" in messages(v, "device_exists")
    bad_node = one_stage(Stage("G", (Device(9, 0), Device(9, 1)), 0, 4, 2, 1, 1), 8)
    v = check_plan(inst, bad_node)
    assert rules(v) == {"device_exists"} and "node 9 does not exist (cluster has 4 nodes)" in messages(v, "device_exists")
    wrong_type = one_stage(Stage("G", devs(2, (0, 1)), 0, 4, 2, 1, 1), 8)
    v = check_plan(inst, wrong_type)
    assert rules(v) == {"device_exists"} and "declared G but node 2 holds S" in messages(v, "device_exists")


def test_device_count(inst):
    # 9 G devices (the cluster has 8): only possible with a repeated device, so device_unique fires too
    nine = devs(0, range(4)) + devs(1, range(4)) + (Device(0, 0),)
    v = check_plan(inst, one_stage(Stage("G", nine, 0, 4, 1, 9, 1), 1, mode="free"))
    assert rules(v) >= {"device_count", "device_unique"}
    assert "G: plan uses 9 GPUs, cluster has 8" in messages(v, "device_count")
    assert rules(v) - {"device_count", "device_unique", "batch_split"} == set()
    # the rule alone: 5 S devices declared, 4 in the cluster
    five = one_stage(Stage("S", devs(2, (0, 1)) + devs(3, (0, 1)) + (Device(2, 0),), 0, 4, 1, 5, 1), 1)
    assert [v.message for v in check_device_count(inst, five)] == ["S: plan uses 5 GPUs, cluster has 4"]


def test_device_unique(inst):
    v = check_plan(inst, one_stage(Stage("G", (Device(0, 1), Device(0, 1)), 0, 4, 2, 1, 1), 8))
    assert rules(v) == {"device_unique"}
    assert "device node 0 GPU 1 is used 2 times" in messages(v, "device_unique")
    # across stages
    s0 = Stage("G", devs(0, (0, 1)), 0, 2, 2, 1, 1)
    s1 = Stage("G", devs(0, (1, 2)), 2, 2, 2, 1, 1)
    v = check_plan(inst, Plan((s0, s1), 8, 8))
    assert rules(v) == {"device_unique"} and "node 0 GPU 1 is used 2 times" in messages(v, "device_unique")


def test_stage_shape(inst):
    v = check_plan(inst, one_stage(Stage("G", devs(0, range(3)), 0, 4, 2, 2, 1), 4))
    assert rules(v) == {"stage_shape"}
    assert "stage 0: tp 2 x dp 2 = 4 but 3 devices are listed" in messages(v, "stage_shape")


def test_layer_cover(inst):
    # a gap: stage 1 starts at 3 instead of 2
    s0 = Stage("G", devs(0, (0, 1)), 0, 2, 2, 1, 1)
    s1 = Stage("G", devs(0, (2, 3)), 3, 2, 2, 1, 1)
    v = check_plan(inst, Plan((s0, s1), 8, 8))
    assert rules(v) == {"layer_cover"}
    assert "stage 1 starts at layer 3, expected 2" in messages(v, "layer_cover")
    # too few layers: 2 + 1 of 4
    s1 = Stage("G", devs(0, (2, 3)), 2, 1, 2, 1, 1)
    v = check_plan(inst, Plan((s0, s1), 8, 8))
    assert rules(v) == {"layer_cover"} and "stages hold 3 layers, the model has 4" in messages(v, "layer_cover")
    # an empty stage
    s0 = Stage("G", devs(0, (0, 1)), 0, 4, 2, 1, 1)
    s1 = Stage("G", devs(0, (2, 3)), 4, 0, 2, 1, 1)
    v = check_plan(inst, Plan((s0, s1), 8, 8))
    assert rules(v) == {"layer_cover"} and "stage 1 holds no layer" in messages(v, "layer_cover")


def test_batch_split(inst):
    # micro-batch 1 x dp 2 x 3 micro-batches = 6 != 8
    v = check_plan(inst, one_stage(Stage("G", devs(0, range(4)), 0, 4, 2, 2, 1), 3))
    assert rules(v) == {"batch_split"}
    assert "micro-batch 1 x dp 2 x 3 micro-batches != global batch 8" in messages(v, "batch_split")
    # 8 not divisible by micro-batch 3 x dp 1
    v = check_plan(inst, one_stage(Stage("G", devs(0, (0, 1)), 0, 4, 2, 1, 3), 2))
    assert rules(v) == {"batch_split"}
    assert "global batch 8 is not divisible by micro-batch 3 x dp 1" in messages(v, "batch_split")
    # a plan for another global batch
    v = check_plan(inst, Plan((Stage("G", devs(0, (0, 1)), 0, 4, 2, 1, 1),), 16, 16))
    assert "plan global batch 16 != job's 8" in messages(v, "batch_split")


def test_tp_divisibility(inst):
    # 8 heads (8 query groups) and tp 3
    v = check_plan(inst, one_stage(Stage("G", devs(0, range(3)), 0, 4, 3, 1, 1), 8))
    assert rules(v) == {"tp_divisibility"}
    msg = messages(v, "tp_divisibility")
    assert "8 attention heads are not divisible by tp 3" in msg
    assert "8 query groups are neither a multiple nor a divisor of tp 3" in msg


def test_tp_within_node(inst):
    v = check_plan(inst, one_stage(Stage("G", (Device(0, 3), Device(1, 0)), 0, 4, 2, 1, 1), 8))
    assert rules(v) == {"tp_within_node"}
    assert "stage 0: tp group 0 spans nodes [0, 1]" in messages(v, "tp_within_node")
    # dp across nodes with each tp group inside one node is fine
    assert check_plan(inst, one_stage(Stage("G", devs(0, (2, 3)) + devs(1, (0, 1)), 0, 4, 2, 2, 1), 4)) == []


def test_recompute(inst):
    v = check_plan(inst, one_stage(Stage("G", devs(0, (0, 1)), 0, 4, 2, 1, 1, "full", 0), 8))
    assert rules(v) == {"recompute"} and "full recompute of 0 layers, must be 1..4" in messages(v, "recompute")
    v = check_plan(inst, one_stage(Stage("G", devs(0, (0, 1)), 0, 4, 2, 1, 1, "full", 5), 8))
    assert rules(v) == {"recompute"} and "full recompute of 5 layers, must be 1..4" in messages(v, "recompute")
    v = check_plan(inst, one_stage(Stage("G", devs(0, (0, 1)), 0, 4, 2, 1, 1, "selective", 2), 8))
    assert rules(v) == {"recompute"} and "recompute_layers=2 needs recompute 'full'" in messages(v, "recompute")


def test_schedule(tmp_path, inst):
    # interleaved with m % pp != 0: a job of global batch 6, micro-batch 2, dp 1 -> m = 3, pp = 2
    inst6 = tiny_instance(tmp_path, global_batch=6)
    s0 = Stage("G", devs(0, (0, 1)), 0, 2, 2, 1, 2)
    s1 = Stage("G", devs(1, (0, 1)), 2, 2, 2, 1, 2)
    v = check_plan(inst6, Plan((s0, s1), 6, 3, schedule="interleaved", vpp=2))
    assert rules(v) == {"schedule"}
    assert "interleaved needs micro-batches 3 divisible by pp 2" in messages(v, "schedule")
    assert check_plan(inst6, Plan((s0, s1), 6, 3)) == []                 # the same under 1F1B is fine
    # vpp without interleaving; interleaving without vpp; layers per stage not divisible by vpp
    v = check_plan(inst, two_stage_plan(vpp=2))
    assert rules(v) == {"schedule"} and "vpp 2 needs the interleaved schedule" in messages(v, "schedule")
    v = check_plan(inst, two_stage_plan(schedule="interleaved"))
    assert rules(v) == {"schedule"} and "interleaved needs vpp >= 2" in messages(v, "schedule")
    v = check_plan(inst, two_stage_plan(schedule="interleaved", vpp=4))
    assert rules(v) == {"schedule"} and "stage 0: 2 layers not divisible by vpp 4" in messages(v, "schedule")
    one = one_stage(Stage("G", devs(0, range(4)), 0, 4, 2, 2, 1), 4, schedule="interleaved", vpp=2)
    v = check_plan(inst, one)
    assert rules(v) == {"schedule"} and "interleaved needs at least 2 pipeline stages" in messages(v, "schedule")


def test_megatron_rules(inst):
    # tp 2 on stage 0 and tp 1 on stage 1 (dp 2 both): stock Megatron-LM needs one tp
    s0 = Stage("G", devs(0, range(4)), 0, 2, 2, 2, 1)
    s1 = Stage("G", devs(1, (0, 1)), 2, 2, 1, 2, 1)
    v = check_plan(inst, Plan((s0, s1), 8, 4))
    assert rules(v) == {"megatron"}
    assert "tensor-parallel size differs between stages (2, 1)" in messages(v, "megatron")
    assert check_plan(inst, Plan((s0, s1), 8, 4, mode="free")) == []
    # recompute granularity and count per stage
    s1 = Stage("G", devs(1, range(4)), 2, 2, 2, 2, 1, "full", 1)
    v = check_plan(inst, Plan((s0, s1), 8, 4))
    assert rules(v) == {"megatron"}
    msg = messages(v, "megatron")
    assert "recompute granularity differs between stages (none, full)" in msg
    assert "number of recomputed layers differs between stages (0, 1)" in msg
    # uniform full recompute of every layer is stock Megatron (--recompute-method uniform)
    s0f = Stage("G", devs(0, range(4)), 0, 2, 2, 2, 1, "full", 2)
    s1f = Stage("G", devs(1, range(4)), 2, 2, 2, 2, 1, "full", 2)
    assert check_plan(inst, Plan((s0f, s1f), 8, 4)) == []
    # ZB-H1 needs the zero-bubble fork
    v = check_plan(inst, two_stage_plan(schedule="zb-h1"))
    assert rules(v) == {"megatron"} and "ZB-H1 needs the zero-bubble fork" in messages(v, "megatron")
    assert check_plan(inst, two_stage_plan(schedule="zb-h1", mode="free")) == []


def test_memory_capacity(inst):
    # one stage on node 2 (2 x S, 0.2 GiB each, usable 0.9 x 0.2 = 0.18 GiB), tp 2, dp 1, all layers:
    #   params per GPU (4 x 12,002,000 + 1,000,000 + 1,001,000) / 2 = 25,004,500
    #   weights 2 x = 50,009,000 B (0.05 GiB), grads 4 x (0.09 GiB), Adam 12 x (0.28 GiB)
    #   activations: 1 micro-batch in flight: 4 blocks x 1e7 + head 2.5e6 = 4.25e7 B (0.04 GiB)
    #   total 18 x 25,004,500 + 4.25e7 = 492,581,000 B = 0.4588 GiB > 0.18 GiB
    v = check_plan(inst, one_stage(Stage("S", devs(2, (0, 1)), 0, 4, 2, 1, 1), 8))
    assert rules(v) == {"memory_capacity"}
    assert messages(v, "memory_capacity") == ("stage 0 (S): 0.46 GiB per GPU > usable 0.18 GiB (weights 0.05, "
                                              "grads 0.09, optimizer 0.28, activations 0.04)")


def test_prediction(inst):
    plan = full_plan(inst)
    wrong = plan.predicted.__class__(**{**plan.predicted.__dict__, "step_time_s": 0.05})
    v = check_plan(inst, plan.with_(predicted=wrong))
    assert rules(v) == {"prediction"}
    # the hand-computed step time of test_costmodel: 38.32894375 ms
    assert messages(v, "prediction") == "recorded step_time_s 0.05 but the plan evaluates to 0.0383289"


def test_all_violations_are_reported(inst):
    # three independent faults in one plan: each rule reports its own
    s0 = Stage("G", devs(0, range(3)), 0, 2, 2, 2, 1)        # 3 devices for tp 2 x dp 2
    s1 = Stage("G", (Device(0, 3), Device(1, 0)), 2, 2, 2, 1, 1, "selective", 1)
    v = check_plan(inst, Plan((s0, s1), 8, 4, mode="free"))
    assert {"stage_shape", "tp_within_node", "recompute", "batch_split"} <= rules(v)
    assert all(str(x).startswith(f"[{x.rule}] ") for x in v)
