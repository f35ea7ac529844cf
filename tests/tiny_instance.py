"""A tiny instance with round numbers, for hand calculations in test_costmodel and test_plan_check.

Cluster (nodes in file order):
    nodes 0, 1: type "big",   4 x GPU "G" (80 GiB, 1000 GB/s memory), intra 100 GB/s per GPU,
                inter 10 GB/s per node, 8 $/node-hour, billed per node
    nodes 2, 3: type "small", 2 x GPU "S" (0.2 GiB, 500 GB/s memory), intra 50 GB/s,
                inter 5 GB/s, 3 $/node-hour, billed per GPU (1.5 $/GPU-hour)
Model "tiny": GPT-style, 4 blocks, h = 1000, f = 4000, 8 heads (kv = h), V = 1000, s = 500,
    no biases, RMSNorm (h parameters), RoPE (no position table), no dropout, untied head.
    Parameters: block 4h^2 + 2hf + 2h = 4e6 + 8e6 + 2e3 = 12,002,000;
                embedding V h = 1,000,000;  head h + V h = 1,001,000.
Profile (native CSV, seq 500, tp in {1, 2}, micro-batch in {1, 2}; times scale as mbs / tp):
    GPU G: block fwd 2, bwd 4, attention core 0.5; embedding fwd 0.1, bwd 0.2; head fwd 1, bwd 2
    GPU S: twice the times of G.  (ms, for mbs 1 and tp 1)
Job: global batch 8 unless given, seq 500, flash attention on (the default), headroom 10%.
"""
from __future__ import annotations

from pathlib import Path

from milp_plan.instance import InstanceSpec, build_instance
from milp_plan.plan import Device, Plan, Stage

CLUSTER_YAML = """\
name: tiny
description: two node types with round numbers for hand calculations
node_types:
  - name: big
    gpu: {name: G, memory_gib: 80, peak_tflops: 100, memory_gb_per_s: 1000}
    gpus_per_node: 4
    count: 2
    intra_node_gb_per_s: 100
    inter_node_gb_per_s: 10
    usd_per_hour: 8
  - name: small
    gpu: {name: S, memory_gib: 0.2, peak_tflops: 50, memory_gb_per_s: 500}
    gpus_per_node: 2
    count: 2
    intra_node_gb_per_s: 50
    inter_node_gb_per_s: 5
    usd_per_hour: 3
    billing: gpu
"""

MODEL_YAML = """\
name: tiny
arch: gpt
num_layers: 4
hidden_size: 1000
ffn_hidden_size: 4000
num_attention_heads: 8
vocab_size: 1000
seq_length: 500
bias: false
norm: rmsnorm
position: rope
dropout: false
tied_embeddings: false
"""

# (fwd_ms, bwd_ms, attn_core_fwd_ms) at micro-batch 1, tp 1, GPU G
BASE_MS = {"embedding": (0.1, 0.2, 0.0), "block": (2.0, 4.0, 0.5), "head": (1.0, 2.0, 0.0)}
GPU_FACTOR = {"G": 1.0, "S": 2.0}


def profile_csv(with_core: bool = True, kinds: tuple[str, ...] = ("embedding", "block", "head")) -> str:
    cols = "model,gpu,tp,micro_batch_size,seq_length,kind,fwd_ms,bwd_ms" + (",attn_core_fwd_ms" if with_core else "")
    lines = ["# origin: hand-written for tests", "# tp_comm_included: false", cols]
    for gpu, g in GPU_FACTOR.items():
        for tp in (1, 2):
            for mbs in (1, 2):
                for kind in kinds:
                    f, b, c = (x * g * mbs / tp for x in BASE_MS[kind])
                    row = f"tiny,{gpu},{tp},{mbs},500,{kind},{f:g},{b:g}" + (f",{c:g}" if with_core else "")
                    lines.append(row)
    return "\n".join(lines) + "\n"


def write_inputs(d: Path, with_core: bool = True, tied: bool = False) -> tuple[Path, Path, Path]:
    d.mkdir(parents=True, exist_ok=True)
    cluster, model, prof = d / "tiny-cluster.yaml", d / "tiny-model.yaml", d / "tiny-profile.csv"
    cluster.write_text(CLUSTER_YAML)
    model.write_text(MODEL_YAML.replace("tied_embeddings: false", f"tied_embeddings: {str(tied).lower()}"))
    prof.write_text(profile_csv(with_core))
    return cluster, model, prof


def tiny_instance(d: Path, global_batch: int = 8, with_core: bool = True, tied: bool = False, **spec):
    """The instance above; `tied` ties the head to the embedding (tied_embeddings: true)."""
    cluster, model, prof = write_inputs(d, with_core, tied)
    return build_instance(InstanceSpec(cluster=str(cluster), model=str(model), profiles=str(prof),
                                       global_batch_size=global_batch, **spec))


def devs(node: int, gpus) -> tuple[Device, ...]:
    return tuple(Device(node, g) for g in gpus)


def two_stage_plan(**changes) -> Plan:
    """Stage 0: node 0 (all 4 G), blocks 0-1; stage 1: node 1 (all 4 G), blocks 2-3; tp 2, dp 2,
    micro-batch 1 -> 8 / (1 x 2) = 4 micro-batches, 1F1B."""
    s0 = Stage("G", devs(0, range(4)), 0, 2, 2, 2, 1)
    s1 = Stage("G", devs(1, range(4)), 2, 2, 2, 2, 1)
    return Plan((s0, s1), 8, 4, **changes)
