"""`milp-plan launch`: Megatron flags, torchrun/Slurm scripts, rank table (issue 5).

What is checked against whom:
* the flags, as the node scripts really pass them (run with a stub torchrun), build a
  megatron-core 0.16.1 TransformerConfig whose per-stage layer counts and offsets are the
  plan's, and whose batch numbers give the plan's micro-batch count;
* the global rank of every process is derived the way torchrun derives it (cumulative
  nproc-per-node over node ranks + local rank, local rank -> CUDA_VISIBLE_DEVICES), and
  megatron-core's RankGenerator tp/dp/pp groups mapped through it are the plan's groups;
* torchrun's own parser (and config_from_args) accepts every emitted torchrun command line;
* every emitted script passes `bash -n` and ShellCheck 0.11 (`shellcheck -x`) with no finding;
* a real torchrun (static rendezvous, CPU) started by the emitted scripts on loopback
  "hosts" gives every process the rank and GPU the rank table says;
* hostile hosts, a plan whose layers do not add up, clobbering: exit 2, nothing written.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from milp_plan import check, predict
from milp_plan.cluster import Cluster, load_cluster
from milp_plan.errors import InputError
from milp_plan.instance import InstanceSpec, build_instance
from milp_plan.launch import LaunchOptions, megatron, render_launch, write_launch
from milp_plan.launch.ranks import assign_ranks, plan_ranks
from milp_plan.plan import Device, Plan, Stage, write_plan
from clitools import run_cli

REPO = Path(__file__).resolve().parents[1]
RUNNER = REPO / "launch" / "run_launch_dir.sh"
A100, A10 = "A100-80GB", "A10"


# ---- hand-made plans (until `milp-plan solve` exists) -------------------------------------
# The hand-made plans here are written for GPT-3 6.7B at global batch 256 on the default
# cluster (the default job until issue 13 changed it): pinned, not taken from the default.
JOB_6_7B = InstanceSpec(model="gpt3-6.7b", global_batch_size=256)


def devs(node: int, gpus) -> tuple[Device, ...]:
    return tuple(Device(node, g) for g in gpus)


def make_plan(inst, stages, m: int, **kw) -> Plan:
    """stages: (gpu, devices, num_layers, tp, dp, mbs[, recompute, recompute_layers]); layers in order."""
    out, first = [], 0
    for gpu, ds, n, tp, dp, mbs, *rc in stages:
        out.append(Stage(gpu, ds, first, n, tp, dp, mbs, *rc))
        first += n
    plan = Plan(tuple(out), inst.job.global_batch_size, m, inputs=inst.inputs_record(), **kw)
    plan = plan.with_(predicted=predict.evaluate(inst, plan))
    assert check.check_plan(inst, plan) == [], "the hand-made test plan itself must pass the checker"
    return plan


def plans() -> dict[str, tuple[object, Plan]]:
    default = build_instance(JOB_6_7B)
    llama = build_instance(InstanceSpec(model="llama3-8b", seq_length=2048, global_batch_size=256))
    n0, n1 = devs(0, range(8)), devs(1, range(8))
    a, b, c, d = devs(0, range(4)), devs(0, range(4, 8)), devs(1, range(4)), devs(1, range(4, 8))
    out = {
        # 32 layers, 16/16: even, nothing to say about the split
        "even": (default, make_plan(default, [(A100, n0, 16, 4, 2, 2), (A100, n1, 16, 4, 2, 2)], 64)),
        # 7/9/9/7: the middle is even, first and last differ -> both first/last flags
        "first_last": (default, make_plan(default, [(A100, a, 7, 2, 2, 1), (A100, b, 9, 2, 2, 1),
                                                    (A100, c, 9, 2, 2, 1), (A100, d, 7, 2, 2, 1)], 128)),
        # 12/10/10: only the first stage differs -> only the first flag
        "first_only": (default, make_plan(default, [(A100, a, 12, 2, 2, 1), (A100, b, 10, 2, 2, 1),
                                                    (A100, c, 10, 2, 2, 1)], 128)),
        # 18/14 on two stages: no middle -> both flags; selective recompute
        "two_stage": (default, make_plan(default, [(A100, n0, 18, 4, 2, 1, "selective"),
                                                   (A100, n1, 14, 4, 2, 1, "selective")], 128)),
        # 6/9/8/9: the middle is uneven -> layout string; distributed optimizer, sequence parallel
        "layout": (default, make_plan(default, [(A100, a, 6, 2, 2, 2), (A100, b, 9, 2, 2, 2),
                                                (A100, c, 8, 2, 2, 2), (A100, d, 9, 2, 2, 2)], 64,
                                      distributed_optimizer=True, sequence_parallel=True)),
        # interleaved, even: 4 stages x 2 chunks of 4 layers
        "interleaved": (default, make_plan(default, [(A100, x, 8, 2, 2, 1) for x in (a, b, c, d)], 128,
                                           schedule="interleaved", vpp=2)),
        # interleaved, uneven 6/10/10/6 -> layout with 8 virtual stages; full recompute 2 per stage
        "interleaved_uneven": (default, make_plan(
            default, [(A100, x, n, 2, 2, 1, "full", 2) for x, n in ((a, 6), (b, 10), (c, 10), (d, 6))], 128,
            schedule="interleaved", vpp=2)),
        # two GPU types on the default cluster: A100 10 | A10 6 | A10 6 | A100 10, full recompute of 3
        "two_type": (default, make_plan(default, [(A100, n0, 10, 4, 2, 1, "full", 3),
                                                  (A10, devs(2, range(8)), 6, 4, 2, 1, "full", 3),
                                                  (A10, devs(3, range(8)), 6, 4, 2, 1, "full", 3),
                                                  (A100, n1, 10, 4, 2, 1, "full", 3)], 128)),
        # stage 2 back on node 0: node 0 holds ranks 0-3 and 8-11 -> two torchrun agents there
        "split_node": (default, make_plan(default, [(A100, a, 11, 2, 2, 1), (A100, c, 11, 2, 2, 1),
                                                    (A100, tuple(reversed(b)), 10, 2, 2, 1)], 128)),
        # Llama 3 8B (GQA 8 groups, SwiGLU, RMSNorm, RoPE, untied, no bias, no dropout) at seq 2048
        "llama_gqa": (llama, make_plan(llama, [(A100, n0, 16, 4, 2, 1, "selective"),
                                               (A100, n1, 16, 4, 2, 1, "selective")], 128)),
    }
    return out


@pytest.fixture(scope="session")
def all_plans():
    return plans()


COMPATIBLE = ["even", "first_last", "first_only", "two_stage", "layout", "interleaved", "interleaved_uneven",
              "two_type", "split_node", "llama_gqa"]


@pytest.fixture(scope="session")
def free_plan():
    inst = build_instance(JOB_6_7B)
    return inst, make_plan(inst, [(A100, devs(0, range(8)), 16, 4, 2, 2), (A100, devs(1, range(8)), 16, 2, 4, 1)],
                           64, mode="free")


# ---- running the CLI and the emitted scripts ---------------------------------------------
@pytest.fixture(scope="session")
def stub_torchrun(tmp_path_factory) -> Path:
    """A `torchrun` that records CUDA_VISIBLE_DEVICES, CUDA_DEVICE_MAX_CONNECTIONS and its argv."""
    p = tmp_path_factory.mktemp("stub") / "torchrun"
    p.write_text('#!/usr/bin/env bash\nf="$(mktemp "${STUB_OUT}/call.XXXXXX")"\n'
                 'printf \'%s\\0\' "${CUDA_VISIBLE_DEVICES}" "${CUDA_DEVICE_MAX_CONNECTIONS:-}" "$@" > "$f"\n')
    p.chmod(0o755)
    return p


@dataclasses.dataclass
class Call:
    host: str
    cuda_visible_devices: str
    max_connections: str
    argv: list[str]


def run_node_scripts(out: Path, stub: Path, hosts, tmp: Path) -> list[Call]:
    """Run run_node.sh as each host with the stub torchrun; return every torchrun call."""
    calls = []
    for host in hosts:
        rec = tmp / f"calls-{host}"
        rec.mkdir()
        env = dict(os.environ, STUB_OUT=str(rec), TORCHRUN=str(stub), MILP_PLAN_HOST=host,
                   MEGATRON_PATH="/opt/Megatron-LM")
        subprocess.run(["bash", str(out / "run_node.sh"), "--train-iters", "10"], env=env, check=True,
                       capture_output=True, timeout=30)
        for f in sorted(rec.iterdir()):
            cvd, conn, *argv = f.read_bytes().decode().split("\0")[:-1]
            calls.append(Call(host, cvd, conn, argv))
    return calls


def torchrun_ranks(calls: list[Call], cluster: Cluster) -> dict[int, Device]:
    """Global rank -> device, the way torchrun and CUDA_VISIBLE_DEVICES decide it."""
    from torch.distributed.run import get_args_parser
    node_of = {n.host: n.index for n in cluster.nodes}
    parsed = sorted(((get_args_parser().parse_args(c.argv), c) for c in calls), key=lambda t: t[0].node_rank)
    out, base = {}, 0
    for args, c in parsed:
        gpus = [int(g) for g in c.cuda_visible_devices.split(",")]
        assert len(gpus) == int(args.nproc_per_node)
        for local, g in enumerate(gpus):
            out[base + local] = Device(node_of[c.host], g)
        base += int(args.nproc_per_node)
    return out


@pytest.fixture(scope="session")
def emitted(all_plans, stub_torchrun, tmp_path_factory):
    """Each compatible plan launched (slurm scheduler, so every file is written) and its node scripts run."""
    out = {}
    for name in COMPATIBLE:
        inst, plan = all_plans[name]
        tmp = tmp_path_factory.mktemp(name)
        write_plan(tmp / "plan.json", plan)
        d = tmp / "launch"
        write_launch(tmp / "plan.json", LaunchOptions(d, scheduler="slurm"))
        hosts = sorted({row["host"] for row in csv.DictReader((d / "rank_table.csv").open())})
        out[name] = (inst, plan, d, run_node_scripts(d, stub_torchrun, hosts, tmp))
    return out


# ---- megatron-core (imported once per session) ---------------------------------------------
@pytest.fixture(scope="session")
def mcore():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
        import torch.nn.functional as F
        from megatron.core import parallel_state
        from megatron.core.num_microbatches_calculator import (destroy_num_microbatches_calculator,
                                                               get_num_microbatches,
                                                               init_num_microbatches_calculator)
        from megatron.core.transformer import TransformerConfig
        from megatron.core.transformer.transformer_block import get_num_layers_to_build
        from megatron.core.transformer.transformer_layer import get_transformer_layer_offset
    return dict(torch=torch, F=F, ps=parallel_state, TransformerConfig=TransformerConfig,
                layers=get_num_layers_to_build, offset=get_transformer_layer_offset,
                init_mb=init_num_microbatches_calculator, num_mb=get_num_microbatches,
                destroy_mb=destroy_num_microbatches_calculator)


# Megatron-LM core_v0.16.1 flag -> TransformerConfig field (renames from reference/ecosystem.md 1.1)
INT_FIELDS = {"--tensor-model-parallel-size": "tensor_model_parallel_size",
              "--pipeline-model-parallel-size": "pipeline_model_parallel_size",
              "--decoder-first-pipeline-num-layers": "num_layers_in_first_pipeline_stage",
              "--decoder-last-pipeline-num-layers": "num_layers_in_last_pipeline_stage",
              "--num-virtual-stages-per-pipeline-rank": "virtual_pipeline_model_parallel_size",
              "--recompute-num-layers": "recompute_num_layers", "--num-layers": "num_layers",
              "--hidden-size": "hidden_size", "--ffn-hidden-size": "ffn_hidden_size",
              "--num-attention-heads": "num_attention_heads", "--num-query-groups": "num_query_groups"}
STR_FIELDS = {"--pipeline-model-parallel-layout": "pipeline_model_parallel_layout",
              "--recompute-granularity": "recompute_granularity", "--recompute-method": "recompute_method",
              "--normalization": "normalization"}
FLOAT_FIELDS = {"--attention-dropout": "attention_dropout", "--hidden-dropout": "hidden_dropout"}
BOOL_FIELDS = {"--sequence-parallel": ("sequence_parallel", True), "--disable-bias-linear": ("add_bias_linear", False),
               "--swiglu": ("gated_linear_unit", True), "--bf16": ("bf16", True), "--fp16": ("fp16", True)}
LIST_FIELDS = {"--recompute-modules": "recompute_modules"}
TRAINING_INT = {"--micro-batch-size", "--global-batch-size", "--seq-length", "--max-position-embeddings"}
TRAINING_STR = {"--position-embedding-type"}
TRAINING_FLAGS = {"--use-distributed-optimizer", "--untie-embeddings-and-output-weights", "--group-query-attention"}


def parse_megatron(argv: list[str]) -> tuple[dict, dict]:
    """(TransformerConfig kwargs, training-side values) from Megatron flags; unknown flag -> fail."""
    cfg, train, i = {}, {}, 0
    while i < len(argv):
        flag = argv[i]
        values = []
        i += 1
        while i < len(argv) and not argv[i].startswith("--"):
            values.append(argv[i])
            i += 1
        if flag in INT_FIELDS:
            cfg[INT_FIELDS[flag]] = int(*values)
        elif flag in STR_FIELDS:
            cfg[STR_FIELDS[flag]] = values[0]
        elif flag in FLOAT_FIELDS:
            cfg[FLOAT_FIELDS[flag]] = float(*values)
        elif flag in BOOL_FIELDS and not values:
            cfg[BOOL_FIELDS[flag][0]] = BOOL_FIELDS[flag][1]
        elif flag in LIST_FIELDS:
            cfg[LIST_FIELDS[flag]] = values
        elif flag in TRAINING_INT:
            train[flag] = int(*values)
        elif flag in TRAINING_STR:
            train[flag] = values[0]
        elif flag in TRAINING_FLAGS and not values:
            train[flag] = True
        else:
            raise AssertionError(f"flag {flag} {values} is not in the core_v0.16.1 contract")
    return cfg, train


def megatron_argv(call: Call) -> list[str]:
    """The Megatron part of a torchrun call: after the training script, minus the user's extra flags."""
    argv = call.argv
    i = next(k for k, a in enumerate(argv) if a.endswith("/pretrain_gpt.py"))
    assert argv[i] == "/opt/Megatron-LM/pretrain_gpt.py"
    assert argv[-2:] == ["--train-iters", "10"], "extra arguments are passed through, last"
    return argv[i + 1:-2]


def build_config(mcore, cfg: dict):
    kw = dict(cfg)
    if kw.get("gated_linear_unit"):
        kw["activation_func"] = mcore["F"].silu  # what validate_args sets for --swiglu
    dtype = mcore["torch"].bfloat16 if kw.get("bf16") else mcore["torch"].float16
    with warnings.catch_warnings():  # 0.16.1 warns about its own defaults (cuda_graph_scope)
        warnings.simplefilter("ignore")
        return mcore["TransformerConfig"](**kw, params_dtype=dtype, pipeline_dtype=dtype)


def megatron_chunks(mcore, config, pp: int, vpp: int) -> list[list[tuple[int, int]]]:
    """(offset, layers) per pp rank and virtual stage, as megatron-core computes them."""
    ps = mcore["ps"]
    ps.set_virtual_pipeline_model_parallel_world_size(vpp if vpp > 1 else None)
    try:
        layout = config.pipeline_model_parallel_layout
        out = []
        for s in range(pp):
            row = []
            for j in range(vpp):
                vp = j if vpp > 1 else None
                if layout is not None:  # 0.16.1: the block helper ignores pp_rank with a layout
                    row.append((layout.get_layer_offset(vp_stage=vp, pp_rank=s),
                                layout.get_num_layers_to_build(vp_stage=vp, pp_rank=s)))
                else:
                    row.append((mcore["offset"](config, vp_stage=vp, pp_rank=s),
                                mcore["layers"](config, vp_stage=vp, pp_rank=s)))
            out.append(row)
        return out
    finally:
        ps.set_virtual_pipeline_model_parallel_world_size(None)


def check_config(mcore, inst, plan, d, calls) -> None:
    """The flags the agents pass build a TransformerConfig that says what the plan says."""
    argvs = {tuple(megatron_argv(c)) for c in calls}
    assert len(argvs) == 1, "every agent passes the same Megatron flags"
    assert {c.max_connections for c in calls} == {"1"}, "CUDA_DEVICE_MAX_CONNECTIONS=1 reaches torchrun"
    cfg, train = parse_megatron(list(argvs.pop()))
    config = build_config(mcore, cfg)  # TransformerConfig.__post_init__ validates
    st, m = plan.stages[0], inst.model
    # per-stage layer counts and offsets: megatron-core's view == plan.layer_chunks
    got = megatron_chunks(mcore, config, plan.pp, plan.vpp)
    assert got == [list(plan.layer_chunks(s)) for s in range(plan.pp)]
    assert config.tensor_model_parallel_size == st.tp and config.pipeline_model_parallel_size == plan.pp
    assert (config.virtual_pipeline_model_parallel_size or 1) == plan.vpp
    # batches: Megatron's calculator gives the plan's micro-batch count, DP = world / (TP x PP)
    world = plan.num_gpus
    assert world // (st.tp * plan.pp) == st.dp
    mcore["init_mb"](0, None, train["--global-batch-size"], train["--micro-batch-size"], st.dp)
    try:
        assert mcore["num_mb"]() == plan.num_microbatches
    finally:
        mcore["destroy_mb"]()
    # model shape from the recorded model; sequence from the job
    assert (config.num_layers, config.hidden_size, config.ffn_hidden_size, config.num_attention_heads) == \
        (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_attention_heads)
    assert config.num_query_groups in (None, m.num_attention_heads) if m.num_query_groups == m.num_attention_heads \
        else (config.num_query_groups == m.num_query_groups and train["--group-query-attention"])
    assert train["--seq-length"] == inst.job.seq_length <= train["--max-position-embeddings"]
    assert config.gated_linear_unit == (m.mlp == "swiglu")
    assert config.normalization == ("RMSNorm" if m.norm == "rmsnorm" else "LayerNorm")
    assert config.add_bias_linear == m.bias
    assert (config.hidden_dropout == 0.0) == (not m.dropout)
    assert train.get("--untie-embeddings-and-output-weights", False) == (not m.tied_embeddings)
    assert train["--position-embedding-type"] == ("rope" if m.position == "rope" else "learned_absolute")
    assert train.get("--use-distributed-optimizer", False) == plan.distributed_optimizer
    assert config.sequence_parallel == (plan.sequence_parallel and st.tp > 1)
    # recompute: Megatron's block method recomputes min(N, chunk layers) layers of each chunk
    assert (config.recompute_granularity or "none") == st.recompute
    if st.recompute == "full":
        assert config.recompute_method == "block"
        per_stage = [sum(min(config.recompute_num_layers, n) for _, n in plan.layer_chunks(s)) for s in range(plan.pp)]
        assert per_stage == [s.recompute_layers for s in plan.stages]
    if st.recompute == "selective":
        assert config.recompute_modules == ["core_attn"]


def test_split_flags_choose_the_simplest_mechanism(all_plans):
    """Hand-derived: which uneven mechanism each plan needs (ecosystem.md 1.3)."""
    def split(name):
        _, plan = all_plans[name]
        return megatron.layer_split_flags([s.num_layers for s in plan.stages], plan.vpp)
    assert split("even") == []
    assert split("first_last") == ["--decoder-first-pipeline-num-layers", "7", "--decoder-last-pipeline-num-layers", "7"]
    assert split("first_only") == ["--decoder-first-pipeline-num-layers", "12"]
    assert split("two_stage") == ["--decoder-first-pipeline-num-layers", "18", "--decoder-last-pipeline-num-layers", "14"]
    assert split("split_node") == ["--decoder-last-pipeline-num-layers", "10"]
    assert split("layout") == ["--pipeline-model-parallel-layout", "Et*6|t*9|t*8|t*9L"]
    assert split("interleaved") == ["--num-virtual-stages-per-pipeline-rank", "2"]
    # 6/10/10/6 in 2 chunks each: 3/5/5/3 then 3/5/5/3 again, in model order
    assert split("interleaved_uneven") == ["--pipeline-model-parallel-layout", "Et*3|t*5|t*5|t*3|t*3|t*5|t*5|t*3L"]


def check_groups(mcore, inst, plan, d, calls) -> None:
    """RankGenerator's groups, through the ranks torchrun assigns, are the plan's devices."""
    ranks = torchrun_ranks(calls, inst.cluster)
    st = plan.stages[0]
    assert sorted(ranks) == list(range(plan.num_gpus))
    gen = mcore["ps"].RankGenerator(tp=st.tp, ep=1, dp=st.dp, pp=plan.pp, cp=1, order="tp-cp-ep-dp-pp")
    key = lambda ds: [(d.node, d.local_gpu) for d in ds]  # noqa: E731
    to_dev = lambda groups: sorted((tuple(ranks[r] for r in g) for g in groups), key=key)  # noqa: E731
    # tp groups: the plan's tp-consecutive device runs, in order
    want_tp = sorted((s.devices[r * s.tp:(r + 1) * s.tp] for s in plan.stages for r in range(s.dp)), key=key)
    assert to_dev(gen.get_ranks("tp")) == want_tp
    # dp groups: device k, k + tp, ... of one stage
    want_dp = sorted((s.devices[t::s.tp] for s in plan.stages for t in range(s.tp)), key=key)
    assert to_dev(gen.get_ranks("dp")) == want_dp
    # pp groups: device k of every stage, in stage order
    want_pp = sorted((tuple(s.devices[k] for s in plan.stages) for k in range(st.tp * st.dp)), key=key)
    assert to_dev(gen.get_ranks("pp")) == want_pp
    # stage s (pp rank s) is exactly the plan's devices of stage s, on the plan's GPU type
    for s, group in enumerate(gen.get_ranks("tp-dp")):
        assert {ranks[r] for r in group} == set(plan.stages[s].devices)
        assert {inst.cluster.nodes[ranks[r].node].type.gpu.name for r in group} == {plan.stages[s].gpu}
    # the emitted rank table says the same
    rows = list(csv.DictReader((d / "rank_table.csv").open()))
    assert [(int(r["global_rank"]), Device(int(r["node"]), int(r["cuda_device"]))) for r in rows] == sorted(ranks.items())
    for r in rows:
        s = plan.stages[int(r["stage"])]
        k = int(r["tp_rank"]) + s.tp * int(r["dp_rank"])
        assert s.devices[k] == ranks[int(r["global_rank"])]
        assert r["host"] == inst.cluster.nodes[int(r["node"])].host
    assert json.loads((d / "rank_table.json").read_text()) == \
        [{k: (int(v) if k not in ("host", "gpu") else v) for k, v in r.items()} for r in rows]


def check_torchrun(mcore, inst, plan, d, calls) -> None:
    """torchrun's parser and config_from_args accept every emitted command line."""
    from torch.distributed.run import config_from_args, get_args_parser
    manifest = json.loads((d / "launch.json").read_text())
    parsed = [get_args_parser().parse_args(c.argv) for c in calls]
    for args in parsed:
        cfg, cmd, cmd_args = config_from_args(args)
        assert cfg.min_nodes == cfg.max_nodes == len(manifest["agents"])
        assert cfg.rdzv_backend == "static" and cfg.rdzv_configs["rank"] == args.node_rank
        assert cfg.rdzv_endpoint == f"{manifest['master']['addr']}:29500"
        assert cmd_args[1] == "/opt/Megatron-LM/pretrain_gpt.py"
    assert sorted(a.node_rank for a in parsed) == list(range(len(manifest["agents"])))
    assert {a.master_addr for a in parsed} == {inst.cluster.nodes[plan.stages[0].devices[0].node].host}


@pytest.fixture(scope="session")
def solved(stub_torchrun, tmp_path_factory):
    """A plan from `milp-plan solve` (gpt3-1.3b on the default cluster, tp 2, pp 4, full recompute;
    today: A100 and A10 stages with 10/10/3/1 layers), launched and its node scripts run."""
    tmp = tmp_path_factory.mktemp("solved")
    subprocess.run([sys.executable, "-c", "from milp_plan.cli import main; main()", "solve", "--model", "gpt3-1.3b", "--global-batch", "256",
                    "--fix", "tp=2,pp=4,recompute=full", "--out", str(tmp / "plan.json")], check=True,
                   capture_output=True, timeout=120)
    write_launch(tmp / "plan.json", LaunchOptions(tmp / "launch"))
    from milp_plan.instance import instance_from_inputs
    from milp_plan.plan import read_plan
    plan = read_plan(tmp / "plan.json")
    hosts = sorted({row["host"] for row in csv.DictReader((tmp / "launch" / "rank_table.csv").open())})
    return (instance_from_inputs(plan.inputs, "plan"), plan, tmp / "launch",
            run_node_scripts(tmp / "launch", stub_torchrun, hosts, tmp))


def test_every_plan_against_megatron_core_and_torchrun(emitted, solved, mcore, monkeypatch):
    """One test, so that one xdist worker pays for importing megatron-core and torch (~8 s)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # config_from_args would set it
    cases = {**emitted, "solved by milp-plan solve": solved}
    for name, case in cases.items():
        for check_fn in (check_config, check_groups, check_torchrun):
            try:
                check_fn(mcore, *case)
            except AssertionError as exc:
                raise AssertionError(f"plan '{name}', {check_fn.__name__}: {exc}") from exc


def test_split_node_runs_two_agents_on_one_host(emitted):
    inst, plan, d, calls = emitted["split_node"]
    on0 = sorted((c for c in calls if c.host == "a100-0"), key=lambda c: c.argv[c.argv.index("--node-rank") + 1])
    # node 0: stage 0 = ranks 0-3 on GPUs 0-3, stage 2 = ranks 8-11 on GPUs 7,6,5,4 (listed reversed)
    assert [(c.argv[c.argv.index("--node-rank") + 1], c.cuda_visible_devices) for c in on0] == \
        [("0", "0,1,2,3"), ("2", "7,6,5,4")]


def shell_files(d: Path) -> list[Path]:
    return sorted([*d.glob("*.sh"), *d.glob("*.sbatch")])


@pytest.mark.parametrize("name", COMPATIBLE)
def test_scripts_pass_bash_n_and_shellcheck(name, emitted):
    _, _, d, _ = emitted[name]
    files = shell_files(d)
    assert {f.name for f in files} >= {"megatron_args.sh", "run_node.sh", "slurm.sbatch"}
    for f in files:
        assert os.access(f, os.X_OK), f"{f.name} is executable"
        subprocess.run(["bash", "-n", str(f)], check=True)
    shellcheck = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which("shellcheck")
    res = subprocess.run([shellcheck, "-x", "--severity=style", *[f.name for f in files]], cwd=d,
                         capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout == "", res.stdout


def test_runner_passes_shellcheck():
    shellcheck = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which("shellcheck")
    subprocess.run(["bash", "-n", str(RUNNER)], check=True)
    res = subprocess.run([shellcheck, "-x", "--severity=style", str(RUNNER)], capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout == "", res.stdout


def test_slurm_components(emitted, tmp_path, all_plans, capsys):
    hetero = (emitted["two_type"][2] / "slurm.sbatch").read_text()
    assert hetero.count("#SBATCH hetjob") == 1
    assert "#SBATCH --nodelist=a100-0,a100-1" in hetero and "#SBATCH --nodelist=a10-0,a10-1" in hetero
    assert "srun --het-group=0,1 " in hetero
    homo = (emitted["even"][2] / "slurm.sbatch").read_text()
    assert "hetjob" not in homo and "--het-group" not in homo and "#SBATCH --nodes=2" in homo
    # partitions per node type; an unknown node type or a hostile partition is refused
    write_plan(tmp_path / "plan.json", all_plans["two_type"][1])
    code, _, _ = run_cli(capsys, "launch", str(tmp_path / "plan.json"), "--out", str(tmp_path / "o"), "--scheduler",
                         "slurm", "--partition", "a100-node=gpu-a100,a10-node=gpu-a10")
    text = (tmp_path / "o" / "slurm.sbatch").read_text()
    assert code == 0 and "#SBATCH --partition=gpu-a100" in text and "#SBATCH --partition=gpu-a10\n" in text
    for bad in ("h100-node=x", "a100-node=x;id"):
        code, _, err = run_cli(capsys, "launch", str(tmp_path / "plan.json"), "--out", str(tmp_path / "p"),
                               "--scheduler", "slurm", "--partition", bad)
        assert code == 2 and not (tmp_path / "p").exists(), err


def test_contract_readme_lists_every_emitted_flag(emitted):
    readme = (REPO / "launch" / "README.md").read_text()
    flags = {a for _, _, _, calls in emitted.values() for c in calls for a in megatron_argv(c) if a.startswith("--")}
    flags |= {"--nnodes", "--nproc-per-node", "--node-rank", "--master-addr", "--master-port", "--rdzv-backend"}
    assert {f for f in flags if f"`{f}" not in readme} == set()
    assert megatron.MEGATRON_VERSION in readme


# ---- not stock Megatron -> per-stage JSON --------------------------------------------------
def test_free_mode_plan_gets_per_stage_json(free_plan, tmp_path, capsys):
    inst, plan = free_plan
    write_plan(tmp_path / "plan.json", plan)
    code, out, err = run_cli(capsys, "launch", str(tmp_path / "plan.json"), "--out", str(tmp_path / "o"))
    assert code == 0
    names = sorted(p.name for p in (tmp_path / "o").iterdir())
    assert names == ["launch.json", "per_stage.json"], "no Megatron scripts for a plan Megatron cannot run"
    doc = json.loads((tmp_path / "o" / "per_stage.json").read_text())
    assert doc["megatron_compatible"] is False
    assert any("tensor-parallel size differs" in r for r in doc["reasons"]) and "tensor-parallel" in err
    assert [(s["tp"], s["dp"], s["micro_batch_size"]) for s in doc["stages"]] == [(4, 2, 2), (2, 4, 1)]
    # stage 1's device k = tp rank k mod 2, dp rank k div 2, global rank 8 + k
    s1 = doc["stages"][1]["devices"]
    assert [(x["rank"], x["tp_rank"], x["dp_rank"], x["host"], x["local_gpu"]) for x in s1[:3]] == \
        [(8, 0, 0, "a100-1", 0), (9, 1, 0, "a100-1", 1), (10, 0, 1, "a100-1", 2)]
    assert json.loads((tmp_path / "o" / "launch.json").read_text())["megatron"]["compatible"] is False
    res = subprocess.run(["bash", str(RUNNER), "--dry-run", str(tmp_path / "o"), "/nowhere"], capture_output=True,
                         text=True)
    assert res.returncode == 2 and "per_stage.json" in res.stderr, "the runner refuses it too"


def test_arch_without_gpt_flags_is_not_pretended(all_plans):
    _, plan = all_plans["even"]
    model = dict(plan.inputs["model"]["definition"], arch="bert")
    assert any("not a GPT-style decoder" in r for r in megatron.incompatibilities(plan, model))
    assert megatron.incompatibilities(plan, plan.inputs["model"]["definition"]) == []


# ---- refusals: nothing written -------------------------------------------------------------
def test_plan_whose_layers_do_not_add_up_is_refused(all_plans, tmp_path, capsys):
    _, plan = all_plans["even"]
    st = plan.stages
    bad = plan.with_(stages=(st[0], dataclasses.replace(st[1], num_layers=15)))  # 16 + 15 = 31 of 32
    write_plan(tmp_path / "plan.json", bad)
    code, _, err = run_cli(capsys, "launch", str(tmp_path / "plan.json"), "--out", str(tmp_path / "o"))
    assert code == 2 and "layer_cover" in err and "31" in err
    assert not (tmp_path / "o").exists()


HOSTILE = ["a;rm -rf /", "$(id)", "`id`", "a b", "a'b", 'a"b', "a\nb", "-rf", "a..b", ""]


@pytest.mark.parametrize("host", HOSTILE)
def test_hostile_host_in_plan_is_refused(host, all_plans, tmp_path, capsys):
    d = json.loads(all_plans["even"][1].to_json())  # a deep copy: to_dict shares `inputs`
    d["inputs"]["cluster"]["definition"]["node_types"][0]["hosts"][0] = host
    (tmp_path / "plan.json").write_text(json.dumps(d))
    code, _, err = run_cli(capsys, "launch", str(tmp_path / "plan.json"), "--out", str(tmp_path / "o"))
    assert code == 2 and "Traceback" not in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("host", HOSTILE[:4])
def test_hostile_host_in_cluster_file_is_refused(host, all_plans, tmp_path, capsys):
    cl = tmp_path / "hosts.yaml"
    cl.write_text(json.dumps({**load_cluster("default").to_dict(), "node_types": [
        dict(nt, hosts=[host, "x1"]) if i == 0 else nt for i, nt in enumerate(load_cluster("default").to_dict()
                                                                              ["node_types"])]}))
    write_plan(tmp_path / "plan.json", all_plans["even"][1])
    code, _, err = run_cli(capsys, "launch", str(tmp_path / "plan.json"), "--out", str(tmp_path / "o"),
                           "--cluster", str(cl))
    assert code == 2 and not (tmp_path / "o").exists(), err


@pytest.mark.parametrize("host", HOSTILE)
def test_renderer_validates_hosts_itself(host, all_plans, tmp_path):
    """Defence in depth: a Cluster built without its loader's validation is still refused."""
    inst, plan = all_plans["even"]
    nts = list(inst.cluster.node_types)
    nts[0] = dataclasses.replace(nts[0], hosts=(host, "a100-1"))
    with pytest.raises(InputError):
        render_launch(plan, Cluster("bad", tuple(nts)), LaunchOptions(tmp_path / "o"))


def test_hostile_names_reach_comments_sanitised(tmp_path, capsys, stub_torchrun):
    """Node type and GPU names are free text in a cluster file: in scripts they only appear in
    comments, reduced to token characters, so a newline cannot start a command."""
    (tmp_path / "c.yaml").write_text(json.dumps({"name": "evil", "node_types": [
        {"name": "box\ntouch /tmp/pwned", "gpu": {"name": "G$(id)\nrm -rf /", "memory_gib": 80, "peak_tflops": 300,
                                                  "memory_gb_per_s": 2000},
         "gpus_per_node": 4, "count": 2, "intra_node_gb_per_s": 300, "inter_node_gb_per_s": 50, "usd_per_hour": 10,
         "hosts": ["h0", "h1"]}]}))
    inst = build_instance(InstanceSpec(cluster=str(tmp_path / "c.yaml"), model="gpt3-1.3b", global_batch_size=256))
    gpu = inst.cluster.node_types[0].gpu.name
    plan = make_plan(inst, [(gpu, devs(0, range(4)), 12, 2, 2, 1), (gpu, devs(1, range(4)), 12, 2, 2, 1)], 128)
    write_plan(tmp_path / "plan.json", plan)
    code, _, err = run_cli(capsys, "launch", str(tmp_path / "plan.json"), "--out", str(tmp_path / "o"),
                           "--scheduler", "slurm")
    assert code == 0, err
    for f in shell_files(tmp_path / "o"):
        text = f.read_text()
        assert "rm -rf" not in text and "touch /tmp" not in text and "$(id)" not in text
    assert "G__id__rm_-rf__" in (tmp_path / "o" / "node_h0.sh").read_text()
    calls = run_node_scripts(tmp_path / "o", stub_torchrun, ["h0", "h1"], tmp_path)
    assert len(calls) == 2


def test_hostile_megatron_path_and_port(all_plans, tmp_path, capsys):
    write_plan(tmp_path / "plan.json", all_plans["even"][1])
    code, _, _ = run_cli(capsys, "launch", str(tmp_path / "plan.json"), "--out", str(tmp_path / "o"),
                         "--megatron-path", "/x\nid")
    assert code == 2 and not (tmp_path / "o").exists()
    code, _, _ = run_cli(capsys, "launch", str(tmp_path / "plan.json"), "--out", str(tmp_path / "o"),
                         "--master-port", "70000")
    assert code == 2 and not (tmp_path / "o").exists()
    # a path with spaces and quotes is data, not code: it arrives at torchrun as one word
    code, _, err = run_cli(capsys, "launch", str(tmp_path / "plan.json"), "--out", str(tmp_path / "o"),
                           "--megatron-path", "/my dir/it's $(id)")
    assert code == 0, err
    env = {k: v for k, v in os.environ.items() if k != "MEGATRON_PATH"}
    res = subprocess.run(["bash", str(tmp_path / "o" / "node_a100-0.sh")], capture_output=True, text=True,
                         env=dict(env, MILP_PLAN_DRY_RUN="1"), check=True)
    assert "/my\\ dir/it\\'s\\ \\$\\(id\\)/pretrain_gpt.py" in res.stdout
    # the same through slurm.sbatch: a stub srun sees MEGATRON_PATH verbatim
    code, _, err = run_cli(capsys, "launch", str(tmp_path / "plan.json"), "--out", str(tmp_path / "o"), "--force",
                           "--scheduler", "slurm", "--megatron-path", "/my dir/it's $(id)")
    assert code == 0, err
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "srun").write_text('#!/usr/bin/env bash\nprintf "%s" "$MEGATRON_PATH"\n')
    (tmp_path / "bin" / "srun").chmod(0o755)
    res = subprocess.run(["bash", str(tmp_path / "o" / "slurm.sbatch")], capture_output=True, text=True, check=True,
                         env=dict(env, PATH=f"{tmp_path / 'bin'}:{env['PATH']}"))
    assert res.stdout == "/my dir/it's $(id)"


def test_no_clobber_without_force_and_deterministic(all_plans, tmp_path, capsys):
    write_plan(tmp_path / "plan.json", all_plans["two_type"][1])
    args = ["launch", str(tmp_path / "plan.json"), "--out", str(tmp_path / "o"), "--scheduler", "slurm"]
    assert run_cli(capsys, *args)[0] == 0
    first = {p.name: p.read_bytes() for p in (tmp_path / "o").iterdir()}
    (tmp_path / "o" / "megatron_args.sh").write_text("mine\n")
    code, _, err = run_cli(capsys, *args)
    assert code == 2 and "--force" in err
    assert (tmp_path / "o" / "megatron_args.sh").read_text() == "mine\n"
    assert run_cli(capsys, *args, "--force")[0] == 0
    assert {p.name: p.read_bytes() for p in (tmp_path / "o").iterdir()} == first, "same plan, same bytes"
    assert not [p for p in (tmp_path / "o").iterdir() if p.name.startswith(".")], "no temporary files left"


def test_missing_hosts_error_and_cluster_override(tmp_path, capsys):
    inst = build_instance(InstanceSpec(cluster="two-type-32", model="gpt3-1.3b", global_batch_size=256))
    plan = make_plan(inst, [("H100-SXM", devs(0, range(8)), 12, 2, 4, 1), ("H100-SXM", devs(1, range(8)), 12, 2, 4, 1)],
                     64)
    write_plan(tmp_path / "plan.json", plan)
    code, _, err = run_cli(capsys, "launch", str(tmp_path / "plan.json"), "--out", str(tmp_path / "o"))
    assert code == 2 and "--cluster" in err and "h100-node" in err and not (tmp_path / "o").exists()
    spec = inst.cluster.to_dict()
    spec["node_types"][0]["hosts"] = ["gpu-a", "gpu-b"]
    spec["node_types"][1]["hosts"] = ["l40s-a", "l40s-b"]
    (tmp_path / "hosts.yaml").write_text(json.dumps(spec))
    code, out, err = run_cli(capsys, "launch", str(tmp_path / "plan.json"), "--out", str(tmp_path / "o"),
                             "--cluster", str(tmp_path / "hosts.yaml"))
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "o").glob("node_*.sh")) == ["node_gpu-a.sh", "node_gpu-b.sh"]
    spec["node_types"][0]["count"] = 3
    spec["node_types"][0]["hosts"] = ["gpu-a", "gpu-b", "gpu-c"]
    (tmp_path / "other.yaml").write_text(json.dumps(spec))
    code, _, err = run_cli(capsys, "launch", str(tmp_path / "plan.json"), "--out", str(tmp_path / "p"),
                           "--cluster", str(tmp_path / "other.yaml"))
    assert code == 2 and "node types differ" in err


# ---- rank assignment, brute force ------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(hs.data())
def test_agents_reproduce_plan_ranks_for_any_placement(data):
    """Random stages on random GPUs of 3 nodes x 4: simulating torchrun over the agents gives
    every global rank the plan's device."""
    cluster = load_cluster("default")
    pp = data.draw(hs.integers(1, 4))
    tp, dp = data.draw(hs.sampled_from([(1, 1), (1, 2), (2, 1), (1, 3)]))
    pool = data.draw(hs.permutations([Device(n, g) for n in range(3) for g in range(4)]))
    stages = tuple(Stage(A100, tuple(pool[s * tp * dp:(s + 1) * tp * dp]), s, 1, tp, dp, 1) for s in range(pp))
    plan = Plan(stages, 1, 1)
    layout = assign_ranks(plan, cluster)
    simulated, base = {}, 0
    for a in sorted(layout.agents, key=lambda a: a.node_rank):
        for local, g in enumerate(a.gpus):
            simulated[base + local] = Device(a.node, g)
        base += len(a.gpus)
    devices = [d for st in stages for d in st.devices]
    assert simulated == {r: devices[i] for i, (r, *_) in enumerate(plan_ranks(plan))}
    # agents on one node never exceed its number of rank runs; a node with one run has one agent
    for node in {d.node for d in devices}:
        ranks = sorted(r for r, d in simulated.items() if d.node == node)
        runs = 1 + sum(1 for x, y in zip(ranks, ranks[1:]) if y != x + 1)
        assert len(layout.agents_on(node)) == runs


# ---- a real torchrun on loopback "hosts" ------------------------------------------------------
FAKE_PRETRAIN = """import json, os, sys
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_MAX_CONNECTIONS")
rec = {k: os.environ.get(k) for k in keys}
rec["argv"] = sys.argv[1:]
with open(os.path.join(os.environ["MILP_TEST_OUT"], "rank_%s.json" % os.environ["RANK"]), "w") as fh:
    json.dump(rec, fh)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_real_torchrun_gives_every_process_its_planned_gpu(tmp_path, capsys):
    """Two loopback hosts x 4 GPUs, 3 stages, stage 2 back on host 1: three static-rendezvous
    agents (two on 127.0.0.1), started by launch/run_launch_dir.sh on each host."""
    (tmp_path / "c.yaml").write_text(
        "name: loop\nnode_types:\n  - {name: box, gpu: A100-80GB, gpus_per_node: 4, count: 2, "
        "intra_node_gb_per_s: 300, inter_node_gb_per_s: 50, usd_per_hour: 10, hosts: [127.0.0.1, 127.0.0.2]}\n")
    inst = build_instance(InstanceSpec(cluster=str(tmp_path / "c.yaml"), model="gpt3-1.3b", global_batch_size=256))
    plan = make_plan(inst, [(A100, devs(0, (2, 0)), 8, 1, 2, 1), (A100, devs(1, (0, 1)), 8, 1, 2, 1),
                            (A100, devs(0, (1, 3)), 8, 1, 2, 1)], 128)
    write_plan(tmp_path / "plan.json", plan)
    code, _, err = run_cli(capsys, "launch", str(tmp_path / "plan.json"), "--out", str(tmp_path / "o"),
                           "--master-port", str(free_port()))
    assert code == 0, err
    meg, res = tmp_path / "meg", tmp_path / "res"
    meg.mkdir()
    res.mkdir()
    (meg / "pretrain_gpt.py").write_text(FAKE_PRETRAIN)
    torchrun = Path(sys.executable).parent / "torchrun"
    env = dict(os.environ, MILP_TEST_OUT=str(res), TORCHRUN=str(torchrun if torchrun.exists() else "torchrun"),
               PYTHONPATH=os.pathsep.join(sys.path))
    procs = [subprocess.Popen(["bash", str(RUNNER), "--host", h, str(tmp_path / "o"), str(meg), "--", "--lr", "1"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for h in ("127.0.0.1", "127.0.0.2")]
    logs = [p.communicate(timeout=120)[0].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs
    got = {int(f.stem.split("_")[1]): json.loads(f.read_text()) for f in res.iterdir()}
    table = list(csv.DictReader((tmp_path / "o" / "rank_table.csv").open()))
    assert sorted(got) == list(range(6))
    devices = [d for st in plan.stages for d in st.devices]
    for row in table:
        r = int(row["global_rank"])
        rec = got[r]
        physical = int(rec["CUDA_VISIBLE_DEVICES"].split(",")[int(rec["LOCAL_RANK"])])
        assert Device(int(row["node"]), physical) == devices[r], "rank r runs on the plan's device r"
        assert (rec["WORLD_SIZE"], rec["CUDA_DEVICE_MAX_CONNECTIONS"]) == ("6", "1")
        assert rec["argv"][-2:] == ["--lr", "1"] and "--pipeline-model-parallel-size" in rec["argv"]
