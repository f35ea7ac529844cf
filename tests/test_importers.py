"""Metis and FASOP importers, on small files these tests write themselves.

Every expected number is derived by hand in a comment from the values written.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from milp_plan.importers import load_cluster
from milp_plan.errors import InputError
from milp_plan.importers.fasop import load_fasop_profiles, normalise
from milp_plan.importers.metis import load_metis_cluster, load_metis_profiles
from milp_plan.instance import InstanceSpec, build_instance
from milp_plan.model import load_model

GPT = load_model("gpt3-1.3b")    # 24 blocks -> 26 slots
GPT2XL = load_model("gpt2-xl")   # 48 blocks -> 50 slots
BERT = load_model("bert-large")  # 24 encoder blocks -> 26 slots
T5 = load_model("t5-770m")       # 24 encoder + 24 decoder blocks -> 50 slots


# ---- writers ---------------------------------------------------------------------------
def metis_profile(d: Path, gpu: str, tp: int, bs: int, times: list[float], params: list[float] | None = None,
                  num_layers: int | None = None) -> Path:
    model = {"model_name": "GPT", "num_layers": len(times) if num_layers is None else num_layers}
    if params is not None:
        model["parameters"] = {"parameters_per_layer_bytes": params}
    data = {"model": model,
            "execution_time": {"layer_compute_total_ms": times, "forward_backward_time_ms": sum(times) + 5.0,
                               "optimizer_time_ms": 7.0, "batch_generator_time_ms": 1.0},
            "execution_memory": {"layer_memory_total_mb": [100.0] * len(times)}}
    path = d / f"DeviceType.{gpu}_tp{tp}_bs{bs}.json"
    path.write_text(json.dumps(data))
    return path


def gpt_times() -> list[float]:
    # slot 0 = 3 ms; 24 blocks alternating 3 and 9 ms (mean 6 ms); head = 12 ms
    return [3.0] + [3.0, 9.0] * 12 + [12.0]


def metis_dir(tmp_path: Path, gpus=("A100", "A10")) -> Path:
    d = tmp_path / "metis"
    d.mkdir()
    for g in gpus:
        metis_profile(d, g, 1, 4, gpt_times())
    return d


def metis_cluster_files(tmp_path: Path, hosts: dict, hostfile: str, name: str = "hostfile") -> tuple[Path, Path]:
    c = tmp_path / "cluster.json"
    c.write_text(json.dumps(hosts))
    h = tmp_path / name
    h.write_text(hostfile)
    return c, h


HOSTS = {
    # bytes/s: 3e11 B/s = 300 GB/s intra, 1.25e10 B/s = 12.5 GB/s inter
    "10.0.0.1": {"instance_type": "A100", "inter_bandwidth": 1.25e10, "intra_bandwidth": 3e11, "memory": 80},
    "10.0.0.2": {"instance_type": "A100", "inter_bandwidth": 1.25e10, "intra_bandwidth": 3e11, "memory": 80},
    # Metis' unit (<= 1e4): 2^20 bytes per ms = 1.048576 GB/s each
    "a10-node": {"instance_type": "a10", "inter_bandwidth": 6.25, "intra_bandwidth": 16, "memory": 24},
}
HOSTFILE = "# Metis hostfile\n10.0.0.2 slots=8\na10-node 4\n10.0.0.1 slots=8\n"


def fasop(d: Path, name: str, seconds: list[float]) -> Path:
    d.mkdir(exist_ok=True)
    path = d / name
    np.save(path, np.asarray(seconds, dtype=np.float64))
    return path


def gpt2xl_seconds() -> list[float]:
    # embedding 0.5 ms; 48 blocks alternating 2 and 4 ms (mean 3 ms); post-process 1 ms
    return [0.0005] + [0.002, 0.004] * 24 + [0.001]


def yaml_cluster(tmp_path: Path, gpus: tuple[str, ...]) -> Path:
    types = "".join(f"  - {{name: n{i}, gpu: {g}, gpus_per_node: 8, count: 1, intra_node_gb_per_s: 100, "
                    f"inter_node_gb_per_s: 10, usd_per_hour: 10}}\n" for i, g in enumerate(gpus))
    path = tmp_path / "cluster.yaml"
    path.write_text(f"name: test\nnode_types:\n{types}")
    return path


def row(profile, gpu: str, kind: str, tp: int = 1):
    t = profile.table
    sel = t[(t.gpu == gpu) & (t.kind == kind) & (t.tp == tp)]
    assert len(sel) == 1
    return sel.iloc[0]


# ---- Metis profiles ------------------------------------------------------------------------
def test_metis_profile_values_converted(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    # a block of gpt3-1.3b at tp 2 in fp32: 4 x P / 2 = 2 P bytes (P = its block's parameters);
    # the slots alternate 2P - 10 and 2P + 10 bytes, mean 2P
    P = GPT.layer_params("block")
    params = [1000.0] + [2.0 * P - 10, 2.0 * P + 10] * 12 + [2000.0]
    metis_profile(d, "A100", 2, 4, gpt_times(), params)
    prof = load_metis_profiles(d, GPT, seq_length=1024)
    # fwd = t/3, bwd = 2t/3: embedding 3 -> 1, 2, plus the batch generator's 1 ms forward -> 2, 2;
    # blocks mean 6 -> 2, 4; head 12 plus the 5 ms no layer holds (forward_backward_time_ms
    # 164 - the slots' 159) = 17 -> 17/3, 34/3
    for kind, fwd, bwd, pbytes in (("embedding", 2.0, 2.0, 1000.0), ("block", 2.0, 4.0, 2.0 * P),
                                   ("head", 17 / 3, 34 / 3, 2000.0)):
        r = row(prof, "A100", kind, tp=2)
        assert r.fwd_ms == pytest.approx(fwd, rel=1e-12)
        assert r.bwd_ms == pytest.approx(bwd, rel=1e-12)
        assert r.param_bytes == pytest.approx(pbytes, rel=1e-12)   # blocks: the mean, 2 P
        assert (r.micro_batch_size, r.seq_length, r.model) == (4, 1024, "gpt3-1.3b")
        assert r.mem_total_bytes == 100 * 2**20                    # layer_memory_total_mb 100
        # optimizer_time_ms 7 over the num_parameters / tp parameters one GPU of tp 2 updates
        assert r.optimizer_ns_per_param == pytest.approx(7e6 / (GPT.num_parameters / 2), rel=1e-12)
    assert len(prof.table) == 3
    prov = prof.provenance[0]
    assert prov["format"] == "metis" and prov["tp_comm_included"] is True
    # forward_backward_time_ms = sum + 5 = (3 + 24*6 + 12) + 5 = 164
    assert prov["files"][0]["forward_backward_time_ms"] == 164.0
    assert prov["files"][0]["layer_compute_sum_ms"] == 159.0
    # tp collectives are measured: the cost model must not add them again
    assert prof.cost("gpt3-1.3b", "A100", 2, 4, 1024, "block").tp_comm_included


def test_metis_seq_length_defaults_to_model(tmp_path):
    prof = load_metis_profiles(metis_dir(tmp_path, ("A10",)), GPT)
    assert set(prof.table.seq_length) == {GPT.seq_length}   # 2048
    assert "param_bytes" not in prof.table.columns         # the files give none


def test_metis_t5_kinds(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    # encoder slots 3 ms -> fwd 1, bwd 2; decoder slots 6 ms -> 2, 4; embedding 9 -> 3, 6 plus the
    # writer's 1 ms batch generator forward; head 0.3 plus its 5 ms outside the layers -> 5.3/3, 10.6/3
    metis_profile(d, "V100", 1, 1, [9.0] + [3.0] * 24 + [6.0] * 24 + [0.3])
    prof = load_metis_profiles(d, T5)
    assert set(prof.table.kind) == {"embedding", "encoder_block", "decoder_block", "head"}
    for kind, fwd, bwd in (("embedding", 4.0, 6.0), ("encoder_block", 1.0, 2.0), ("decoder_block", 2.0, 4.0),
                           ("head", 5.3 / 3, 10.6 / 3)):
        assert row(prof, "V100", kind).fwd_ms == pytest.approx(fwd, rel=1e-12)
        assert row(prof, "V100", kind).bwd_ms == pytest.approx(bwd, rel=1e-12)


def test_metis_wrong_block_count(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    metis_profile(d, "A100", 1, 1, [1.0] * 10)   # embedding + 8 blocks + head, model has 24
    with pytest.raises(InputError) as err:
        load_metis_profiles(d, GPT)
    msg = str(err.value)
    assert "DeviceType.A100_tp1_bs1.json" in msg and "8 blocks" in msg and "24 blocks" in msg and "--model" in msg


@pytest.mark.parametrize("bad, expect", [
    ({"num_layers": 27}, "27"),                       # list of 26 vs num_layers 27
    ({"name": "DeviceType.A100_tp0_bs1.json"}, "DeviceType.<GPU>_tp<T>_bs<B>.json"),
    ({"name": "DeviceType.A100.json"}, "DeviceType.<GPU>_tp<T>_bs<B>.json"),
    ({"times": [1.0] * 25 + [-1.0]}, "layer_compute_total_ms[25]"),
    ({"text": "{not json"}, "JSON syntax error"),
])
def test_metis_bad_files(tmp_path, bad, expect):
    d = tmp_path / "m"
    d.mkdir()
    path = metis_profile(d, "A100", 1, 1, bad.get("times", gpt_times()), num_layers=bad.get("num_layers"))
    if "name" in bad:
        path.rename(d / bad["name"])
    if "text" in bad:
        path.write_text(bad["text"])
    with pytest.raises(InputError) as err:
        load_metis_profiles(d, GPT)
    assert expect in str(err.value)


# ---- FASOP profiles ------------------------------------------------------------------------
def test_fasop_values_converted(tmp_path):
    d = tmp_path / "f"
    fasop(d, "gpt2XL_A100_2.npy", gpt2xl_seconds())
    prof = load_fasop_profiles(d, GPT2XL)
    # fwd_ms = 1000 s; bwd_ms = 2 fwd_ms: 0.5/1.0, blocks mean(2, 4) = 3/6, head 1/2
    for kind, fwd in (("embedding", 0.5), ("block", 3.0), ("head", 1.0)):
        r = row(prof, "A100", kind, tp=2)
        assert r.fwd_ms == pytest.approx(fwd, rel=1e-12)
        assert r.bwd_ms == pytest.approx(2 * fwd, rel=1e-12)
        assert (r.micro_batch_size, r.seq_length, r.model) == (1, 1024, "gpt2-xl")
    prov = prof.provenance[0]
    assert prov["format"] == "fasop" and prov["files"] == ["gpt2XL_A100_2.npy"]


def test_fasop_hash_changes_with_content(tmp_path):
    d = tmp_path / "f"
    fasop(d, "gpt2XL_A100_1.npy", gpt2xl_seconds())
    h1 = load_fasop_profiles(d, GPT2XL).provenance[0]["sha256"]
    assert load_fasop_profiles(d, GPT2XL).provenance[0]["sha256"] == h1
    fasop(d, "gpt2XL_A100_1.npy", [2 * s for s in gpt2xl_seconds()])
    assert load_fasop_profiles(d, GPT2XL).provenance[0]["sha256"] != h1


def test_fasop_model_picking(tmp_path):
    d = tmp_path / "f"
    fasop(d, "gpt2XL_A100_1.npy", gpt2xl_seconds())
    fasop(d, "bert_A100_1.npy", [0.001] * 26)   # bert-large: 24 blocks + 2
    assert normalise("gpt2XL") == normalise("gpt2-xl") == "gpt2xl"
    assert load_fasop_profiles(d, GPT2XL).provenance[0]["files"] == ["gpt2XL_A100_1.npy"]   # normalised exact
    bert = load_fasop_profiles(d, BERT)                                                    # prefix bert
    assert bert.provenance[0]["files"] == ["bert_A100_1.npy"]
    assert set(bert.table.kind) == {"embedding", "encoder_block", "head"}
    with pytest.raises(InputError) as err:
        load_fasop_profiles(d, GPT)
    assert "gpt2XL" in str(err.value) and "bert" in str(err.value)


def test_fasop_single_model_used_and_t5_prefix(tmp_path):
    d = tmp_path / "f"
    fasop(d, "T5_A10_1.npy", [0.001] * 50)
    assert load_fasop_profiles(d, T5).provenance[0]["origin"].endswith("model 'T5')")
    # a directory holding one model is used for any model with the same slot count
    assert set(load_fasop_profiles(d, GPT2XL).table.model) == {"gpt2-xl"}


@pytest.mark.parametrize("write, expect", [
    (lambda p: np.save(p, np.array([{"a": 1}], dtype=object), allow_pickle=True), "not a readable .npy"),
    (lambda p: np.save(p, np.zeros((2, 25))), "1-D"),
    (lambda p: np.save(p, np.array([0.001] * 49 + [np.nan])), "array[49]"),
    (lambda p: np.save(p, np.array([0.001] * 10)), "10 layer slots"),
    (lambda p: p.write_bytes(b"not numpy"), "not a readable .npy"),
])
def test_fasop_bad_arrays(tmp_path, write, expect):
    d = tmp_path / "f"
    d.mkdir()
    write(d / "gpt2XL_A100_1.npy")
    with pytest.raises(InputError) as err:
        load_fasop_profiles(d, GPT2XL)
    assert expect in str(err.value) and "gpt2XL_A100_1.npy" in str(err.value)


def test_fasop_bad_name(tmp_path):
    d = tmp_path / "f"
    fasop(d, "gpt2XL-A100.npy", gpt2xl_seconds())
    with pytest.raises(InputError, match="<model>_<GPU>_<tp>.npy"):
        load_fasop_profiles(d, GPT2XL)


# ---- GPU name matching through the instance -----------------------------------------------
def test_gpu_matching_exact_and_unique_prefix(tmp_path):
    d = tmp_path / "f"
    fasop(d, "gpt2XL_A100_1.npy", gpt2xl_seconds())
    fasop(d, "gpt2XL_A10_1.npy", [2 * s for s in gpt2xl_seconds()])
    inst = build_instance(InstanceSpec(cluster=str(yaml_cluster(tmp_path, ("A100-40GB", "A10"))), model="gpt2-xl",
                                       profiles=str(d)))
    assert dict(inst.gpu_map) == {"A10": "A10", "A100": "A100-40GB"}   # A10 exact, A100 unique prefix
    # A10 file holds twice the seconds: block fwd = 2 x 3 ms = 6 ms
    assert inst.profile.cost("gpt2-xl", "A10", 1, 1, 1024, "block").fwd_ms == pytest.approx(6.0)
    assert inst.profile.cost("gpt2-xl", "A100-40GB", 1, 1, 1024, "block").fwd_ms == pytest.approx(3.0)


def two_a100_profile(tmp_path: Path) -> Path:
    d = tmp_path / "f"
    fasop(d, "gpt2XL_A100_1.npy", gpt2xl_seconds())                          # loosely named: 40GB data
    fasop(d, "gpt2XL_A100-80GB_1.npy", [s / 2 for s in gpt2xl_seconds()])    # exact name
    return d


def test_gpu_matching_ambiguous_prefix(tmp_path):
    spec = InstanceSpec(cluster=str(yaml_cluster(tmp_path, ("A100-40GB", "A100-80GB"))), model="gpt2-xl",
                        profiles=str(two_a100_profile(tmp_path)))
    with pytest.raises(InputError) as err:
        build_instance(spec)
    assert "A100-40GB, A100-80GB" in str(err.value) and "--profile-gpu-map A100=" in str(err.value)


def test_gpu_matching_explicit_map(tmp_path):
    spec = InstanceSpec(cluster=str(yaml_cluster(tmp_path, ("A100-40GB", "A100-80GB"))), model="gpt2-xl",
                        profiles=str(two_a100_profile(tmp_path)), profile_gpu_map=(("A100", "A100-40GB"),))
    inst = build_instance(spec)
    assert dict(inst.gpu_map) == {"A100": "A100-40GB", "A100-80GB": "A100-80GB"}
    # blocks: 3 ms from the A100 file, half of it from the A100-80GB file
    assert inst.profile.cost("gpt2-xl", "A100-40GB", 1, 1, 1024, "block").fwd_ms == pytest.approx(3.0)
    assert inst.profile.cost("gpt2-xl", "A100-80GB", 1, 1, 1024, "block").fwd_ms == pytest.approx(1.5)


def test_gpu_matching_missing_gpu(tmp_path):
    d = tmp_path / "f"
    fasop(d, "gpt2XL_V100_1.npy", gpt2xl_seconds())
    spec = InstanceSpec(cluster=str(yaml_cluster(tmp_path, ("A10",))), model="gpt2-xl", profiles=str(d))
    with pytest.raises(InputError) as err:
        build_instance(spec)
    msg = str(err.value)
    assert "no data for GPU 'A10'" in msg and "V100" in msg and "--profile-gpu-map NAME=A10" in msg


def test_metis_profile_seq_length_follows_job(tmp_path):
    d = metis_dir(tmp_path, ("A100",))
    spec = InstanceSpec(cluster=str(yaml_cluster(tmp_path, ("A100-80GB",))), model="gpt3-1.3b", profiles=str(d),
                        seq_length=1024)
    inst = build_instance(spec)
    # the rows are recorded at the job's sequence length, so the exact point exists: no fill
    assert inst.profile.exact("gpt3-1.3b", "A100-80GB", 1, 4, 1024, "block").fwd_ms == pytest.approx(2.0)


def test_metis_step_overheads_optimizer_and_memory_reach_the_cost_model(tmp_path):
    """What a Metis file measures beyond its layer times is charged where the cost model has the
    term: the per-micro-batch time no layer holds on the head (last stage), the batch generator
    on the embedding (first stage), the optimizer's measured rate, and the layer memory less
    the model states as measured activations (measured beats formula)."""
    from milp_plan import costmodel as cm
    d = tmp_path / "metis"
    d.mkdir()
    P = GPT.layer_params("block")                       # 50,358,272 (12 h^2 + 13 h, h = 2048)
    states = P * (2 + 4 + 12)                           # bf16 weights, fp32 grads, Adam: 906,448,896 B
    block_mb = states / 2**20 + 300                     # the block's footprint: states + 300 MiB
    path = metis_profile(d, "A100", 1, 4, gpt_times())
    data = json.loads(path.read_text())
    data["execution_time"].update(forward_backward_time_ms=159.0 + 20.0, batch_generator_time_ms=3.0,
                                  optimizer_time_ms=130.0)
    data["execution_memory"]["layer_memory_total_mb"] = [50.0] + [block_mb] * 24 + [10.0]
    path.write_text(json.dumps(data))
    spec = InstanceSpec(cluster=str(yaml_cluster(tmp_path, ("A100-80GB",))), model="gpt3-1.3b", profiles=str(d),
                        seq_length=1024)
    inst = build_instance(spec)
    nt = inst.cluster.node_types[0]
    # head 12 + 20 = 32 ms -> 32/3 + 64/3; embedding 3 ms -> 1 + 2, plus 3 ms forward
    f, b = cm.stage_compute_s(inst, nt, 1, 4, [], False, True)
    assert (f, b) == (pytest.approx(32 / 3 / 1e3), pytest.approx(64 / 3 / 1e3))
    f, b = cm.stage_compute_s(inst, nt, 1, 4, [], True, False)
    assert (f, b) == (pytest.approx(4e-3), pytest.approx(2e-3))
    # 130 ms over num_parameters at tp 1: embedding V h + s h = 50257 x 2048 + 2048^2 = 107,120,640,
    # head 2 h + V h = 102,930,432, 24 blocks 1,208,598,528, less the tied V h 102,926,336:
    # 1,315,723,264 parameters
    assert GPT.num_parameters == 1_315_723_264
    assert cm.optimizer_s(inst, 1e9, nt) == pytest.approx(0.130 * 1e9 / 1_315_723_264, rel=1e-12)
    # activations: 300 MiB measured against the formula's 34 s b h (flash attention, no sp):
    # 34 x 1024 x 4 x 2048 = 285,212,672 B; full recompute keeps the input, 2 s b h, scaled alike
    measured = 300 * 2**20
    assert GPT.layer_activation_bytes("block", micro_batch=4, seq_length=1024, flash_attention=True) == 285_212_672
    gpu = nt.gpu.name
    assert cm.layer_activation_bytes(inst, "block", 1, 4, False, "none", gpu=gpu) == pytest.approx(measured)
    assert cm.layer_activation_bytes(inst, "block", 1, 4, False, "full", gpu=gpu) == pytest.approx(measured * 2 / 34)
    assert cm.layer_activation_bytes(inst, "block", 1, 4, False, "none") == pytest.approx(285_212_672)
    # a footprint below the states (the embedding's 50 MiB against 3.7 GB) measures 0 activations
    assert cm.measured_activation_bytes(inst, gpu, "embedding", 1, 4) == 0.0
    # no measurement at another micro-batch: the formula (memory is never filled)
    assert cm.measured_activation_bytes(inst, gpu, "block", 1, 2) is None
    # a 1F1B stage of 2 blocks holding 3 micro-batches: 3 x 2 x 300 MiB
    w, g, o, act, inflight = cm.stage_memory_bytes(
        inst, schedule="1f1b", pp=4, stage=1, m=8, vpp=1, kinds=["block"] * 2, tp=1, dp=1, mbs=4,
        sequence_parallel=False, distributed_optimizer=False, recompute="none", recompute_layers=0, gpu=gpu)
    assert (inflight, act) == (3, pytest.approx(3 * 2 * measured))


def test_metis_sequence_length_inferred_from_the_directory_name(tmp_path):
    """Metis files record no sequence length; a directory named ...seq1024 states one. Without
    --seq-len the job takes it, loudly (gpt3-1.3b's default is 2048); with another
    --seq-len it is a one-line error naming the directory, the field and the fix."""
    d = tmp_path / "gpt3_seq1024"
    d.mkdir()
    metis_profile(d, "A100", 1, 4, gpt_times())
    cluster = str(yaml_cluster(tmp_path, ("A100-80GB",)))
    inst = build_instance(InstanceSpec(cluster=cluster, model="gpt3-1.3b", profiles=str(d)))
    assert inst.job.seq_length == 1024
    assert set(inst.profile.table.seq_length) == {1024}
    assert any("sequence length 1024 inferred" in n and "--seq-len" in n for n in inst.notices)
    with pytest.raises(InputError) as err:
        build_instance(InstanceSpec(cluster=cluster, model="gpt3-1.3b", profiles=str(d), seq_length=2048))
    msg = str(err.value)
    assert "gpt3_seq1024" in msg and "seq_length" in msg and "--seq-len 1024" in msg
    # the same length given: no inference note, the name confirms it
    inst = build_instance(InstanceSpec(cluster=cluster, model="gpt3-1.3b", profiles=str(d), seq_length=1024))
    assert not any("inferred" in n for n in inst.notices)
    assert any("read from the directory name" in n for n in inst.notices)


def test_metis_profile_of_another_hidden_size_is_an_error(tmp_path):
    # gpt3-1.3b's block has P = 12 h^2 + 13 h = 50,358,272 parameters (h = 2048, f = 4h, biases):
    # a profile of gpt3-6.7b (h = 4096: 201,379,840 parameters, 805,519,360 bytes in fp32 at tp 1)
    # holds 16.0 bytes per gpt3-1.3b parameter, not 2 or 4
    P = GPT.layer_params("block")
    assert P == 12 * 2048**2 + 13 * 2048 == 50_358_272
    d = tmp_path / "m"
    d.mkdir()
    big = 4.0 * load_model("gpt3-6.7b").layer_params("block")
    assert big == 805_519_360
    metis_profile(d, "A100", 1, 4, gpt_times(), [1000.0] + [big] * 24 + [2000.0])
    with pytest.raises(InputError) as err:
        load_metis_profiles(d, GPT)
    msg = str(err.value)
    assert "DeviceType.A100_tp1_bs4.json" in msg and "parameters_per_layer_bytes" in msg
    assert "16 bytes per parameter" in msg and "hidden size 2048" in msg and "--model" in msg
    assert "about 4,097 at 4 bytes" in msg   # sqrt(805,519,360 / 48) = 4096.6
    # gpt3-1.3b's own block in bf16 at tp 1 (2 P = 100,716,544 bytes) passes
    ok = tmp_path / "ok"
    ok.mkdir()
    metis_profile(ok, "A100", 1, 4, gpt_times(), [1000.0] + [2.0 * P] * 24 + [2000.0])
    assert row(load_metis_profiles(ok, GPT), "A100", "block").param_bytes == 100_716_544


def test_metis_without_a_stated_sequence_length_says_what_it_assumes(tmp_path):
    d = metis_dir(tmp_path, ("A100",))
    inst = build_instance(InstanceSpec(cluster=str(yaml_cluster(tmp_path, ("A100-80GB",))), model="gpt3-1.3b",
                                       profiles=str(d)))
    assert inst.job.seq_length == 2048
    assert any("records no sequence length" in n and "2048" in n and "--seq-len" in n for n in inst.notices)


def test_cli_metis_profile_mismatch_is_one_line_exit_2(tmp_path):
    # a 34-slot profile (32 blocks) with gpt3-1.3b (24 blocks): exit 2, one line naming the file,
    # the field and the fix; a directory stating seq 1024 against --seq-len 2048: the same
    d = tmp_path / "m"
    d.mkdir()
    metis_profile(d, "A100", 1, 4, [1.0] * 34)
    cluster = str(yaml_cluster(tmp_path, ("A100-80GB",)))
    out = cli("inspect", "--cluster", cluster, "--profiles", str(d), "--model", "gpt3-1.3b", cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert "DeviceType.A100_tp1_bs4.json" in out.stderr and "model.num_layers" in out.stderr
    assert "32 blocks" in out.stderr and "--model" in out.stderr
    s = tmp_path / "seq1024"
    s.mkdir()
    metis_profile(s, "A100", 1, 4, gpt_times())
    out = cli("inspect", "--cluster", cluster, "--profiles", str(s), "--model", "gpt3-1.3b", "--seq-len", "2048",
              cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "--seq-len 1024" in out.stderr


# ---- Metis cluster -----------------------------------------------------------------------------
def test_metis_cluster_conversion_and_hosts(tmp_path):
    c, h = metis_cluster_files(tmp_path, HOSTS, HOSTFILE)
    cl = load_metis_cluster(f"{c},{h}")
    a100, a10 = cl.node_types
    assert (a100.name, a100.gpu.name, a100.gpus_per_node, a100.count) == ("a100-80gb-x8", "A100-80GB", 8, 2)
    assert a100.hosts == ("10.0.0.2", "10.0.0.1")          # hostfile order
    assert a100.intra_node_gb_per_s == pytest.approx(300.0)  # 3e11 B/s / 1e9
    assert a100.inter_node_gb_per_s == pytest.approx(12.5)   # 1.25e10 B/s / 1e9
    assert (a10.name, a10.gpu.name, a10.gpus_per_node, a10.count, a10.hosts) == ("a10-x4", "A10", 4, 1, ("a10-node",))
    # 16 x 2^20 B/ms = 16 x 1,048,576 x 1000 B/s = 16.777216 GB/s; 6.25 x 1.048576 = 6.5536 GB/s
    assert a10.intra_node_gb_per_s == pytest.approx(16.777216)
    assert a10.inter_node_gb_per_s == pytest.approx(6.5536)
    assert a100.usd_per_hour == a10.usd_per_hour == 0.0
    assert cl.num_gpus == 20                                  # 2 x 8 + 4
    assert [n.host for n in cl.nodes] == ["10.0.0.2", "10.0.0.1", "a10-node"]
    assert "bytes/s (divided by 1e9)" in cl.description and "usd_per_hour 0" in cl.description
    assert "2^20 bytes/ms (x 1.048576 GB/s)" in cl.description


def test_metis_bandwidth_unit_is_mebibytes_per_ms(tmp_path):
    # Metis' results/hetero_cost_model cluster: A100 intra 46, inter 10. Its cost model computes
    # ms = bytes / (value x 1024 x 1024), so 46 means 46 x 1,048,576 bytes per ms
    # = 48,234,496,000 bytes/s = 48.234496 GB/s; 10 -> 10,485,760,000 B/s = 10.48576 GB/s.
    hosts = {"h": {"instance_type": "A100", "inter_bandwidth": 10, "intra_bandwidth": 46, "memory": 80}}
    c, h = metis_cluster_files(tmp_path, hosts, "h slots=4\n")
    nt = load_metis_cluster(f"{c},{h}").node_types[0]
    assert nt.intra_node_gb_per_s == pytest.approx(48.234496, rel=1e-12)
    assert nt.inter_node_gb_per_s == pytest.approx(10.48576, rel=1e-12)
    # a p2p of 1 GiB (2^30 bytes) at intra 46: Metis says 2^30 / (46 x 2^20) ms = 1024 / 46 ms = 22.26 ms;
    # the converted bandwidth gives the same time
    assert 2**30 / (nt.intra_node_gb_per_s * 1e9) * 1e3 == pytest.approx(1024 / 46, rel=1e-12)


def test_metis_cluster_dispatch_and_hostfile_beside(tmp_path):
    c, h = metis_cluster_files(tmp_path, HOSTS, HOSTFILE)
    assert load_cluster(f"metis:{c},{h}").to_dict() == load_cluster(str(c)).to_dict()
    h.rename(tmp_path / "elsewhere")
    with pytest.raises(InputError, match="metis:CLUSTER.json,HOSTFILE"):
        load_cluster(str(c))


def test_metis_cluster_gpu_by_memory_and_prefix(tmp_path):
    hosts = {"h1": {"instance_type": "A100", "inter_bandwidth": 1e10, "intra_bandwidth": 1e11, "memory": 40},
             "h2": {"instance_type": "V100", "inter_bandwidth": 1e10, "intra_bandwidth": 1e11, "memory": 16}}
    c, h = metis_cluster_files(tmp_path, hosts, "h1 slots=8\nh2 slots=8\n")
    cl = load_metis_cluster(f"{c},{h}")
    # A100 + 40 GB -> A100-40GB; V100 prefixes V100-16GB and V100-32GB, memory 16 picks V100-16GB
    assert [(nt.gpu.name, nt.memory_gib) for nt in cl.node_types] == [("A100-40GB", 40.0), ("V100-16GB", 16.0)]


def test_metis_cluster_p100_and_v100_16gb(tmp_path):
    # the GPUs Metis' DeviceType knows (A100, V100, P100, T4), with the memories its README writes
    net = {"inter_bandwidth": 10, "intra_bandwidth": 50}
    hosts = {"v": {"instance_type": "V100", "memory": 16, **net}, "p": {"instance_type": "P100", "memory": 15, **net},
             "t": {"instance_type": "T4", "memory": 15, **net}, "a": {"instance_type": "A100", "memory": 80, **net},
             "w": {"instance_type": "v100", "memory": 32, **net}}
    c, h = metis_cluster_files(tmp_path, hosts, "v 4\np 4\nt 4\na 4\nw 4\n")
    got = [(nt.gpu.name, nt.memory_gib, nt.gpu.peak_tflops, nt.gpu.memory_gb_per_s)
           for nt in load_metis_cluster(f"{c},{h}").node_types]
    assert got == [("V100-16GB", 16.0, 125.0, 900.0),   # by memory: 16 of V100-16GB / V100-32GB
                   ("P100-16GB", 15.0, 21.2, 732.0),    # unique prefix; Metis' memory 15 replaces 16
                   ("T4", 15.0, 65.0, 320.0),
                   ("A100-80GB", 80.0, 312.0, 2039.0),
                   ("V100-32GB", 32.0, 125.0, 900.0)]
    hosts["v"]["memory"] = 24   # neither V100: named, not guessed
    c, h = metis_cluster_files(tmp_path, hosts, "v 4\n")
    with pytest.raises(InputError, match="it matches V100-16GB, V100-32GB and memory 24 picks none"):
        load_metis_cluster(f"{c},{h}")


@pytest.mark.parametrize("hosts, hostfile, expect", [
    (HOSTS, "a;rm -rf / slots=8\n", "'a;rm' is not an IP address"),
    ({**HOSTS, "a;rm -rf /": HOSTS["a10-node"]}, HOSTFILE, "'a;rm -rf /' is not an IP address"),
    (HOSTS, "10.0.0.9 slots=8\n", "host '10.0.0.9' is not in"),
    (HOSTS, "10.0.0.1\n", "no GPU count"),
    (HOSTS, "10.0.0.1 slots=0\n", "no GPU count"),
    (HOSTS, "10.0.0.1 8\n10.0.0.1 8\n", "appears twice"),
    ({"h": {**HOSTS["a10-node"], "inter_bandwidth": 5e5}}, "h 8\n", "ambiguous"),
    ({"h": {**HOSTS["a10-node"], "instance_type": "Z9000"}}, "h 8\n", "instance_type"),
    ({"h": {**HOSTS["a10-node"], "instance_type": "A100", "memory": 48}}, "h 8\n", "A100-40GB, A100-80GB"),
    ({"h": {**HOSTS["a10-node"], "price": 3}}, "h 8\n", "unknown field 'price'"),
    ({"h": {**HOSTS["a10-node"], "memory": -1}}, "h 8\n", "'memory' must be > 0"),
])
def test_metis_cluster_bad_inputs(tmp_path, hosts, hostfile, expect):
    c, h = metis_cluster_files(tmp_path, hosts, hostfile)
    with pytest.raises(InputError) as err:
        load_metis_cluster(f"{c},{h}")
    assert expect in str(err.value)


# ---- CLI -----------------------------------------------------------------------------------
def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "milp_plan.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def test_cli_inspect_metis(tmp_path):
    c, h = metis_cluster_files(tmp_path, HOSTS, HOSTFILE)
    d = metis_dir(tmp_path)
    out = cli("inspect", "--cluster", f"metis:{c},{h}", "--profiles", str(d), "--model", "gpt3-1.3b", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "GPU name mapping (profile -> cluster): A10 -> A10, A100 -> A100-80GB" in out.stdout
    assert "format=metis" in out.stdout and "a100-80gb-x8" in out.stdout


def test_cli_inspect_fasop(tmp_path):
    d = tmp_path / "f"
    fasop(d, "gpt2XL_A100_1.npy", gpt2xl_seconds())
    fasop(d, "gpt2XL_A10_1.npy", gpt2xl_seconds())
    out = cli("inspect", "--profiles", str(d), "--cluster", str(yaml_cluster(tmp_path, ("A100-40GB", "A10"))),
              "--model", "gpt2-xl", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "A10 -> A10, A100 -> A100-40GB" in out.stdout and "format=fasop" in out.stdout


@pytest.mark.parametrize("case", ["ambiguous", "bad-host", "slots", "missing-dir"])
def test_cli_bad_inputs_exit_2(tmp_path, case):
    d = two_a100_profile(tmp_path)
    args = ["--profiles", str(d), "--cluster", str(yaml_cluster(tmp_path, ("A100-40GB", "A100-80GB"))),
            "--model", "gpt2-xl"]
    if case == "bad-host":
        c, h = metis_cluster_files(tmp_path, HOSTS, "a;rm -rf / slots=8\n")
        args = ["--cluster", f"metis:{c},{h}"]
    elif case == "slots":
        args[-1] = "gpt3-1.3b"                      # 50 slots in the files, 26 needed
    elif case == "missing-dir":
        args = ["--profiles", str(tmp_path / "nope"), "--profile-format", "metis"]
    out = cli("inspect", *args, cwd=tmp_path)
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in out.stderr
