"""`milp-plan import-plan`: FASOP and Metis result rows as milp-plan plans.

The tests write small result files in the peers' formats themselves (the column names and
the line layout of FASOP's main_logs/*.csv and of Metis' cost_het_cluster.py output); every
expected stage, device and micro-batch count is derived by hand in a comment.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from clitools import run_cli
from milp_plan import costmodel, predict
from milp_plan.errors import InputError
from milp_plan.importers import fasop_plan, metis_plan
from milp_plan.importers.peer_plan import import_plan
from milp_plan.instance import InstanceSpec, build_instance
from milp_plan.plan import Device, read_plan

FASOP_HEADER = ["mbs", "tp", "dp", "pp", "node placement", "partition", "estimated time (s/step)", "pipeline time",
                "DP all-reduce time", "embedding layer all-reduce time", "price_per_step", "is_oom"]

# one A100 node and three A10 nodes of 4 GPUs, as FASOP's heterogeneous GPT-2 runs (--gpu_per_node 4);
# node indices: 0 = the p4d node, 1..3 = the g5 nodes
FASOP_CLUSTER = """name: fasop-like
node_types:
  - {name: p4d.24xlarge, gpu: A100-40GB, gpus_per_node: 4, count: 1, intra_node_gb_per_s: 300,
     inter_node_gb_per_s: 50, usd_per_hour: 32.7726}
  - {name: g5.24xlarge, gpu: A10, gpus_per_node: 4, count: 3, intra_node_gb_per_s: 16,
     inter_node_gb_per_s: 12.5, usd_per_hour: 8.144}
"""
P4D, G5 = "p4d.24xlarge", "g5.24xlarge"


def fasop_row(mbs, tp, dp, pp, nodes, partition, est=1.5, oom=False):
    return [mbs, tp, dp, f"{float(pp)}", str(list(nodes)), str(list(partition)), est, est * 0.9, 0.01, 0.02, 0.01,
            oom]


def write_fasop(tmp_path: Path, rows, header=FASOP_HEADER) -> Path:
    path = tmp_path / "gpt2_heterogeneous.csv"
    with path.open("w", newline="") as f:
        csv.writer(f).writerows([header, *rows])
    return path


def cluster_file(tmp_path: Path, text: str = FASOP_CLUSTER) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return path


ROWS = [
    # 1: A100 node first; tp 1 x dp 2 = 2 GPUs per stage, 8 stages on 16 GPUs.
    #    Slots (embedding + 48 blocks + head = 50): 10, 8, 6, 6, 5, 5, 5, 5 -> blocks 9 (minus embedding),
    #    8, 6, 6, 5, 5, 5, 4 (minus head) = 48. Micro-batches: 64 / (dp 2 x mbs 1) = 32.
    fasop_row(1, 1, 2, 8, [P4D, G5, G5, G5], [10, 8, 6, 6, 5, 5, 5, 5], est=1.25),
    # 2: an A10 node first: stage 0 = the first g5 node (cluster node 1), stage 1 = the p4d node (node 0);
    #    slots 13, 13, 12, 12 -> blocks 12, 13, 12, 11; micro-batches 64 / (4 x 2) = 8
    fasop_row(2, 1, 4, 4, [G5, P4D, G5, G5], [13, 13, 12, 12], est=1.5),
    # 3: dp 8 -> stage 0 takes the p4d node and the first g5 node: a stage of two GPU types
    fasop_row(1, 1, 8, 2, [P4D, G5, G5, G5], [25, 25], est=1.7),
    # 4: stage 0 holds only the embedding slot
    fasop_row(1, 1, 8, 2, [G5, G5, P4D, G5], [1, 49], est=1.8),
    # 5: tp 2: GPT-2 XL's 25 heads do not split in two (the catalog's head count; FASOP assumes 16)
    fasop_row(1, 2, 2, 4, [P4D, G5, G5, G5], [14, 12, 12, 12], est=1.9),
]


@pytest.fixture
def fasop_case(tmp_path):
    return write_fasop(tmp_path, ROWS), cluster_file(tmp_path)


def fasop_args(csv_path: Path, cluster: Path, *extra: str) -> list[str]:
    return ["import-plan", f"fasop:{csv_path}", "--cluster", str(cluster), "--model", "gpt2-xl",
            "--global-batch", "64", *extra]


def instance(cluster: Path, model: str = "gpt2-xl", gbs: int = 64):
    return build_instance(InstanceSpec(cluster=str(cluster), model=model, global_batch_size=gbs))


# ---- FASOP ----------------------------------------------------------------------------------
def test_fasop_best_row_becomes_a_checked_megatron_plan(fasop_case):
    csv_path, cluster = fasop_case
    inst = instance(cluster)
    got = import_plan(f"fasop:{csv_path}", inst)
    plan = got.plan
    assert [s.num_layers for s in plan.stages] == [9, 8, 6, 6, 5, 5, 5, 4]
    assert [s.first_layer for s in plan.stages] == [0, 9, 17, 23, 29, 34, 39, 44]
    assert [s.gpu for s in plan.stages] == ["A100-40GB"] * 2 + ["A10"] * 6
    # ranks node after node, 2 per stage: stage 0 = node 0 GPUs 0-1, stage 3 = node 1 GPUs 2-3
    assert plan.stages[0].devices == (Device(0, 0), Device(0, 1))
    assert plan.stages[3].devices == (Device(1, 2), Device(1, 3))
    assert (plan.num_microbatches, plan.micro_batch_size, plan.mode) == (32, 1, "megatron")
    assert got.violations == ()
    assert plan.predicted == predict.evaluate(got.instance, plan)
    assert (plan.solver.backend, plan.solver.status) == ("fasop-import", "evaluated")
    assert plan.solver.objective == plan.predicted.step_time_s
    assert got.layout.peer_step_time_s == 1.25


def test_fasop_rank_and_node_order(fasop_case):
    csv_path, cluster = fasop_case
    plan = import_plan(f"fasop:{csv_path}", instance(cluster), rank=2).plan
    assert [s.devices[0].node for s in plan.stages] == [1, 0, 2, 3]
    assert [s.gpu for s in plan.stages] == ["A10", "A100-40GB", "A10", "A10"]
    assert [s.num_layers for s in plan.stages] == [12, 13, 12, 11]
    assert (plan.num_microbatches, plan.micro_batch_size) == (8, 2)


def test_fasop_old_log_columns(tmp_path):
    # FASOP's committed logs call the time column 'estimated time (step/s)' (it holds s/step)
    header = [h if not h.startswith("estimated") else "estimated time (step/s)" for h in FASOP_HEADER]
    path = write_fasop(tmp_path, ROWS[:1], header)
    got = import_plan(f"fasop:{path}", instance(cluster_file(tmp_path)))
    assert got.layout.peer_step_time_s == 1.25


@pytest.mark.parametrize("rank, expect", [
    (4, "stage 0 holds only the embedding or the head"),
    (9, "--rank 9 is out of range: the file has 5 row(s)"),
])
def test_fasop_rows_milp_plan_cannot_represent(fasop_case, rank, expect):
    csv_path, cluster = fasop_case
    with pytest.raises(InputError) as err:
        import_plan(f"fasop:{csv_path}", instance(cluster), rank=rank)
    assert expect in str(err.value)


def test_fasop_stage_of_two_gpu_types_is_a_mixed_stage(fasop_case):
    """Row 3 (dp 8): stage 0 takes the p4d node and the first g5 node, a mixed-type stage
    paced by its A10 replicas: its times are the A10 node's for the same layers."""
    csv_path, cluster = fasop_case
    got = import_plan(f"fasop:{csv_path}", instance(cluster), rank=3)
    plan, inst = got.plan, got.instance
    assert [s.gpu for s in plan.stages] == ["A100-40GB+A10", "A10"]
    assert sorted({d.node for d in plan.stages[0].devices}) == [0, 1]
    assert plan.predicted == predict.evaluate(inst, plan)
    a10 = inst.cluster.node_types[1]
    st = plan.stages[0]
    kinds = costmodel.stage_kinds(inst, st.first_layer, st.num_layers)
    f, b = costmodel.stage_compute_s(inst, a10, st.tp, st.micro_batch_size, kinds, True, False, "none", 0)
    costs = costmodel.plan_costs(inst, plan)
    assert (costs.fwd_s[0], costs.bwd_s[0]) == pytest.approx((f, b), rel=1e-12)


def test_fasop_gpus_per_node_must_match(tmp_path):
    csv_path = write_fasop(tmp_path, ROWS[:1])
    eight = cluster_file(tmp_path, FASOP_CLUSTER.replace("gpus_per_node: 4", "gpus_per_node: 8"))
    with pytest.raises(InputError, match="= 16 GPUs, but its 4 nodes hold 32 GPUs .* 4 GPUs per node"):
        import_plan(f"fasop:{csv_path}", instance(eight))


def test_fasop_global_batch_must_split(fasop_case):
    csv_path, cluster = fasop_case
    with pytest.raises(InputError, match="global batch 63 does not split into dp 2 x micro-batch 1"):
        import_plan(f"fasop:{csv_path}", instance(cluster, gbs=63))


def test_fasop_instance_names_by_gpu(tmp_path):
    # a cluster whose node types are named otherwise: p4d -> the A100 type, g5 -> the A10 type
    renamed = FASOP_CLUSTER.replace("name: p4d.24xlarge", "name: big").replace("name: g5.24xlarge", "name: small")
    plan = import_plan(f"fasop:{write_fasop(tmp_path, ROWS[:1])}", instance(cluster_file(tmp_path, renamed))).plan
    assert [s.gpu for s in plan.stages] == ["A100-40GB"] * 2 + ["A10"] * 6


# ---- the command line -------------------------------------------------------------------------
def test_cli_import_then_verify_and_compare(fasop_case, tmp_path, capsys):
    csv_path, cluster = fasop_case
    out = tmp_path / "plan.json"
    code, stdout, err = run_cli(capsys, *fasop_args(csv_path, cluster, "--out", str(out)))
    assert code == 0, err
    assert "Imported fasop row 1" in stdout and "fasop estimated 1.25 s/step" in stdout
    plan = read_plan(out)
    code, stdout, err = run_cli(capsys, "verify", str(out), "--json")
    assert code == 0, stdout + err
    report = json.loads(stdout)
    assert report["ok"] and report["violations"] == []
    assert report["comparisons"][0]["predicted"] == pytest.approx(plan.predicted.step_time_s)
    # compare on the instance the plan records (no instance flags): cpsat proves a bound, and
    # the imported plan is a row of its own, scored afresh, with its gap to that bound
    cmp_out = tmp_path / "cmp.json"
    code, stdout, err = run_cli(capsys, "compare", "--plan", str(out), "--planners", "cpsat",
                                "--max-solve-time", "60s", "--out", str(cmp_out))
    assert code == 0, err
    doc = json.loads(cmp_out.read_text())
    bound = doc["best_bound"]
    given = next(r for r in doc["rows"] if r["planner"] == "plan:plan.json")
    assert bound is not None and given["status"] == "given" and given["valid"] and not given["proves"]
    assert given["objective"] == pytest.approx(plan.predicted.step_time_s)
    assert given["objective"] >= bound * (1 - 1e-6)
    assert given["gap"] == pytest.approx((given["objective"] - bound) / given["objective"])
    assert "plan:plan.json" in stdout
    # the same with the instance flags given: the same rows
    code, _, err = run_cli(capsys, "compare", "--cluster", str(cluster), "--model", "gpt2-xl", "--global-batch",
                           "64", "--plan", str(out), "--planners", "cpsat", "--max-solve-time", "60s",
                           "--out", str(tmp_path / "cmp2.json"))
    assert code == 0, err
    again = json.loads((tmp_path / "cmp2.json").read_text())
    assert [r["objective"] for r in again["rows"]] == [r["objective"] for r in doc["rows"]]
    # a plan made for another job is refused, naming the field
    code, _, err = run_cli(capsys, "compare", "--cluster", str(cluster), "--model", "gpt2-xl", "--global-batch",
                           "32", "--plan", str(out), "--planners", "cpsat", "--out", str(tmp_path / "c3.json"))
    assert code == 2 and "inputs.job.global_batch_size" in err and len(err.splitlines()) == 1


def test_cli_violations_are_written_and_exit_1(fasop_case, tmp_path, capsys):
    csv_path, cluster = fasop_case
    out = tmp_path / "plan.json"
    code, stdout, err = run_cli(capsys, *fasop_args(csv_path, cluster, "--rank", "5", "--out", str(out)))
    assert code == 1
    assert "[tp_divisibility] stage 0: 25 attention heads are not divisible by tp 2" in stdout
    assert out.exists()
    code, stdout, err = run_cli(capsys, "verify", str(out))
    assert code == 1 and "tp_divisibility" in stdout


@pytest.mark.parametrize("args, expect", [
    (["import-plan", "aceso:x.csv"], "'aceso:x.csv' is not a peer plan; write fasop:FILE or metis:FILE"),
    (["import-plan", "fasop:{csv}", "--cluster", "{cluster}", "--model", "gpt2-xl"], "--global-batch" ),
    (["import-plan", "fasop:{csv}", "--cluster", "{cluster}", "--model", "gpt2-xl", "--global-batch", "64",
      "--rank", "0"], "field 'rank': must be >= 1"),
    (["import-plan", "fasop:{cluster}", "--cluster", "{cluster}", "--model", "gpt2-xl", "--global-batch", "64"],
     "not a FASOP result CSV"),
])
def test_cli_bad_input_one_line_exit_2(fasop_case, capsys, args, expect):
    csv_path, cluster = fasop_case
    args = [a.format(csv=csv_path, cluster=cluster) for a in args]
    code, stdout, err = run_cli(capsys, *args)
    assert code == 2
    assert expect.replace("--global-batch", "global-batch") in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


# ---- Metis ------------------------------------------------------------------------------------
METIS_HOSTS = {"10.0.0.1": {"instance_type": "A100", "inter_bandwidth": 10, "intra_bandwidth": 46, "memory": 80},
               "10.0.0.2": {"instance_type": "T4", "inter_bandwidth": 10, "intra_bandwidth": 50, "memory": 16}}
# cluster nodes: 0 = 10.0.0.1 (4 x A100-80GB), 1 = 10.0.0.2 (4 x T4)
METIS_LOG = """\
inter_stage_plan: InterStagePlan(ns_idx=0, ...)
cost: 2400.5
len(costs): 3
rank, cost, node_sequence, device_groups, strategies(dp_deg, tp_deg), batches(number of batch), layer_partition
1, 2396.5, (<DeviceType.T4: 't4'>, <DeviceType.A100: 'a100'>), [4, 4], [(4, 1), (2, 2)], 8, [0, 10, 26]
2, 2728.0, (<DeviceType.A100: 'a100'>, <DeviceType.T4: 't4'>), [8], [(4, 2)], 4, [0, 26]
3, 2931.7, (<DeviceType.A100: 'a100'>, <DeviceType.T4: 't4'>), [2, 6], [(2, 1), (2, 3)], 4, [0, 13, 26]
"""


def metis_case(tmp_path: Path, log: str = METIS_LOG) -> tuple[Path, str]:
    (tmp_path / "cluster.json").write_text(json.dumps(METIS_HOSTS))
    (tmp_path / "hostfile").write_text("10.0.0.1 slots=4\n10.0.0.2 slots=4\n")
    path = tmp_path / "metis.log"
    path.write_text(log)
    return path, f"metis:{tmp_path / 'cluster.json'},{tmp_path / 'hostfile'}"


def test_metis_best_row_per_stage_strategies(tmp_path):
    log, cluster = metis_case(tmp_path)
    got = import_plan(f"metis:{log}", build_instance(InstanceSpec(cluster=cluster, model="gpt3-1.3b",
                                                                  global_batch_size=64)))
    plan = got.plan
    # node_sequence T4 first: ranks 0-3 = node 1 (T4), 4-7 = node 0 (A100)
    assert [s.gpu for s in plan.stages] == ["T4", "A100-80GB"]
    assert plan.stages[0].devices == tuple(Device(1, g) for g in range(4))
    assert plan.stages[1].devices == tuple(Device(0, g) for g in range(4))
    # slots [0, 10) and [10, 26) of embedding + 24 blocks + head: blocks 9 and 15
    assert [s.num_layers for s in plan.stages] == [9, 15]
    # (dp, tp) = (4, 1) and (2, 2); micro-batch per replica = 64 / 8 batches / dp = 2 and 4
    assert [(s.dp, s.tp, s.micro_batch_size) for s in plan.stages] == [(4, 1, 2), (2, 2, 4)]
    assert (plan.num_microbatches, plan.mode) == (8, "free")
    assert got.layout.peer_step_time_s == pytest.approx(2.3965)   # 2396.5 ms
    assert got.instance.objective.mode == "free"


def test_metis_rank_is_the_printed_rank_and_hetero_groups_are_mixed_stages(tmp_path):
    log, cluster = metis_case(tmp_path, METIS_LOG.replace("\n3, ", "\n7, "))
    inst = build_instance(InstanceSpec(cluster=cluster, model="gpt3-1.3b", global_batch_size=64))
    # rank 7: stage 0 = 2 A100s, stage 1 = 2 A100s + 4 T4s (a mixed-type stage on part of a node)
    got = import_plan(f"metis:{log}", inst, rank=7)
    assert [s.gpu for s in got.plan.stages] == ["A100-80GB", "A100-80GB+T4"]
    assert got.plan.predicted == predict.evaluate(got.instance, got.plan)
    # rank 2: one stage over both types, tp 2 x dp 4
    got = import_plan(f"metis:{log}", inst, rank=2)
    assert [(s.gpu, s.tp, s.dp) for s in got.plan.stages] == [("A100-80GB+T4", 2, 4)]
    assert "tp_within_node" not in {v.rule for v in got.violations}


@pytest.mark.parametrize("line, expect", [
    ("1, 10.0, (<DeviceType.T4: 't4'>,), [4, 4], [(4, 1)], 8, [0, 10, 26]", "2 device groups but 1 strategies"),
    ("1, 10.0, (<DeviceType.T4: 't4'>,), [4], [(2, 1)], 8, [0, 26]", "stage 0 has 4 GPUs but strategy"),
    ("1, 10.0, (<DeviceType.T4: 't4'>, <DeviceType.A100: 'a100'>), [4, 4], [(4, 1), (4, 1)], 8, [0, 30, 26]",
     "must start at 0 and rise strictly"),
    ("1, 10.0, (<DeviceType.H100: 'h100'>,), [8], [(8, 1)], 8, [0, 26]", "names H100"),
    ("1, 10.0, (<DeviceType.T4: 't4'>, ), [4, 4], oops, 8, [0, 10, 26]", "line 1: not a Metis result row"),
])
def test_metis_bad_rows(tmp_path, line, expect):
    log, cluster = metis_case(tmp_path, line + "\n")
    inst = build_instance(InstanceSpec(cluster=cluster, model="gpt3-1.3b", global_batch_size=64))
    with pytest.raises(InputError) as err:
        import_plan(f"metis:{log}", inst)
    assert expect in str(err.value)


def test_metis_rows_read_from_a_noisy_log(tmp_path):
    log, _ = metis_case(tmp_path)
    rows = metis_plan.read_rows(str(log))
    assert [(r.rank, r.line, r.node_sequence, r.batches) for r in rows] == [
        (1, 5, ("T4", "A100"), 8), (2, 6, ("A100", "T4"), 4), (3, 7, ("A100", "T4"), 4)]


def test_fasop_rows_read(fasop_case):
    rows = fasop_plan.read_rows(str(fasop_case[0]))
    assert [(r.line, r.pp, r.nodes[0], r.is_oom) for r in rows[:2]] == [(2, 8, P4D, False), (3, 4, G5, False)]


# ---- the heads override: FASOP's GPT-2 XL -------------------------------------------------------
FASOP_GPT2XL = "name: gpt2-xl-fasop\nbase: gpt2-xl\nnum_attention_heads: 16\n"


def test_model_yaml_overrides_heads_of_a_catalog_model(tmp_path):
    from milp_plan.model import load_model
    path = tmp_path / "gpt2-xl-fasop.yaml"
    path.write_text(FASOP_GPT2XL)
    m, base = load_model(str(path)), load_model("gpt2-xl")
    # 16 heads of 1600 / 16 = 100 dimensions; one query group per head, as the base has
    assert (m.name, m.num_attention_heads, m.num_query_groups, m.head_dim) == ("gpt2-xl-fasop", 16, 16, 100)
    assert (base.num_attention_heads, base.head_dim) == (25, 64)   # the catalog keeps GPT-2's 25
    same = ("num_layers", "hidden_size", "ffn_hidden_size", "vocab_size", "seq_length", "mlp", "position")
    assert all(getattr(m, f) == getattr(base, f) for f in same)
    assert m.tp_violations(2) == [] and base.tp_violations(2) != []
    # a grouped (GQA) base keeps its groups when only the heads change
    path.write_text("base: llama2-70b\nnum_attention_heads: 32\n")
    assert (load_model(str(path)).num_attention_heads, load_model(str(path)).num_query_groups) == (32, 8)
    path.write_text("base: gpt5\nnum_attention_heads: 16\n")
    with pytest.raises(InputError, match="field 'base' must name a catalog model"):
        load_model(str(path))
    path.write_text("base: gpt2-xl\nnum_attention_heads: 7\n")
    with pytest.raises(InputError, match="hidden_size 1600 must be divisible by num_attention_heads 7"):
        load_model(str(path))


def test_fasop_tp2_row_with_fasop_heads_verifies(fasop_case, tmp_path, capsys):
    # row 5 (tp 2) breaks the catalog's 25 heads (test_cli_violations_are_written_and_exit_1);
    # with FASOP's 16 heads it is a valid plan, and verify passes on it
    csv_path, cluster = fasop_case
    model = tmp_path / "gpt2-xl-fasop.yaml"
    model.write_text(FASOP_GPT2XL)
    out = tmp_path / "plan.json"
    args = fasop_args(csv_path, cluster, "--rank", "5", "--out", str(out))
    args[args.index("gpt2-xl")] = str(model)
    code, stdout, err = run_cli(capsys, *args)
    assert code == 0, stdout + err
    plan = read_plan(out)
    assert {(s.tp, s.dp) for s in plan.stages} == {(2, 2)}
    assert plan.inputs["model"]["definition"]["num_attention_heads"] == 16
    code, stdout, err = run_cli(capsys, "verify", str(out))
    assert code == 0, stdout + err
