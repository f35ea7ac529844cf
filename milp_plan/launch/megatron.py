"""A plan as stock Megatron-LM flags (contract: launch/README.md, Megatron-LM core_v0.16.1).

Flags come in groups (parallelism, layer split, batches, recompute, model, precision);
each group is one function of the plan and the model the plan recorded. Values are
strings, ready to be shell-quoted. `incompatibilities` says why a plan cannot be run by
stock Megatron; the flag functions assume it returned nothing.
"""
from __future__ import annotations

from typing import Any, Mapping

from milp_plan.plan import Plan

MEGATRON_VERSION = "core_v0.16.1"      # Megatron-LM tag; megatron-core 0.16.1 on PyPI
TRAINING_SCRIPT = "pretrain_gpt.py"     # GPT-style decoders (arch gpt, llama)
GPT_STYLE = ("gpt", "llama")
ENV = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}  # asserted by validate_args with TP > 1 before Blackwell
SELECTIVE_MODULES = ("core_attn",)       # what the cost model's selective recompute recomputes


def incompatibilities(plan: Plan, model: Mapping[str, Any]) -> list[str]:
    """Why stock Megatron-LM cannot run `plan` as planned (empty: it can)."""
    reasons = list(plan.megatron_incompatibilities())
    arch = model.get("arch", "gpt")
    if arch not in GPT_STYLE:
        reasons.append(f"model arch '{arch}' is not a GPT-style decoder; this launcher emits {TRAINING_SCRIPT} "
                       "flags only (arch gpt or llama)")
    if model.get("mlp", "gelu") not in ("gelu", "swiglu"):
        reasons.append(f"mlp '{model.get('mlp')}' has no {TRAINING_SCRIPT} flag (gelu or swiglu)")
    if model.get("position", "learned") not in ("learned", "rope"):
        reasons.append(f"position embedding '{model.get('position')}' has no {TRAINING_SCRIPT} flag "
                       "(learned or rope)")
    if not reasons and plan.stages[0].recompute == "full" and plan.stages[0].recompute_layers % plan.vpp:
        reasons.append(f"full recompute of {plan.stages[0].recompute_layers} layers per stage is not a whole "
                       f"number per virtual chunk (vpp {plan.vpp}); Megatron's block method recomputes the same "
                       "number of layers in every chunk")
    return reasons


def parallel_flags(plan: Plan) -> list[str]:
    """Degrees: tensor and pipeline parallel sizes; DP = world size / (TP x PP) is implied."""
    st = plan.stages[0]
    out = ["--tensor-model-parallel-size", str(st.tp), "--pipeline-model-parallel-size", str(plan.pp)]
    if plan.sequence_parallel and st.tp > 1:
        out.append("--sequence-parallel")
    if plan.distributed_optimizer:
        out.append("--use-distributed-optimizer")
    return out


def layout_string(counts: list[int], vpp: int) -> str:
    """--pipeline-model-parallel-layout for stage layer counts: P x vpp virtual stages in
    model order, virtual stage j*P + s holds counts[s] / vpp layers of stage s; E first, L last."""
    parts = [f"t*{counts[s] // vpp}" for j in range(vpp) for s in range(len(counts))]
    parts[0] = "E" + parts[0]
    parts[-1] = parts[-1] + "L"
    return "|".join(parts)


def layer_split_flags(counts: list[int], vpp: int) -> list[str]:
    """Stage layer counts -> nothing (even), first/last flags (only they differ), else a layout.

    With vpp > 1: `--num-virtual-stages-per-pipeline-rank` when even, else the layout string
    with P x vpp stages (it sets VPP itself and excludes the other VPP flags)."""
    p = len(counts)
    even = len(set(counts)) == 1
    if vpp > 1:
        return ["--num-virtual-stages-per-pipeline-rank", str(vpp)] if even else \
            ["--pipeline-model-parallel-layout", layout_string(counts, vpp)]
    if p == 1 or even:
        return []
    if p == 2:
        return ["--decoder-first-pipeline-num-layers", str(counts[0]),
                "--decoder-last-pipeline-num-layers", str(counts[1])]
    middle = set(counts[1:-1])
    if len(middle) > 1:
        return ["--pipeline-model-parallel-layout", layout_string(counts, 1)]
    m = middle.pop()
    out = []
    if counts[0] != m:
        out += ["--decoder-first-pipeline-num-layers", str(counts[0])]
    if counts[-1] != m:
        out += ["--decoder-last-pipeline-num-layers", str(counts[-1])]
    return out


def batch_flags(plan: Plan) -> list[str]:
    """Per-replica micro-batch and global batch; Megatron derives m = GBS / (MBS x DP)."""
    return ["--micro-batch-size", str(plan.micro_batch_size), "--global-batch-size", str(plan.global_batch_size)]


def recompute_flags(plan: Plan) -> list[str]:
    """none -> nothing; selective -> core attention only; full, r layers per stage ->
    block method with r / vpp layers per model chunk (block counts per chunk)."""
    st = plan.stages[0]
    if st.recompute == "selective":
        return ["--recompute-granularity", "selective", "--recompute-modules", *SELECTIVE_MODULES]
    if st.recompute == "full":
        return ["--recompute-granularity", "full", "--recompute-method", "block",
                "--recompute-num-layers", str(st.recompute_layers // plan.vpp)]
    return []


def model_flags(model: Mapping[str, Any], seq_length: int) -> list[str]:
    """Shape and architecture of the recorded model; defaults of Megatron (GeLU, LayerNorm,
    biases, dropout 0.1, tied embeddings) are left implicit."""
    out = ["--num-layers", str(model["num_layers"]), "--hidden-size", str(model["hidden_size"]),
           "--ffn-hidden-size", str(model["ffn_hidden_size"]),
           "--num-attention-heads", str(model["num_attention_heads"])]
    groups = model.get("num_query_groups", model["num_attention_heads"])
    if groups != model["num_attention_heads"]:
        out += ["--group-query-attention", "--num-query-groups", str(groups)]
    out += ["--seq-length", str(seq_length),
            "--max-position-embeddings", str(max(seq_length, int(model["seq_length"])))]
    position = model.get("position", "learned")
    out += ["--position-embedding-type", "rope" if position == "rope" else "learned_absolute"]
    if model.get("mlp") == "swiglu":
        out.append("--swiglu")
    if model.get("norm") == "rmsnorm":
        out += ["--normalization", "RMSNorm"]
    if model.get("bias") is False:
        out.append("--disable-bias-linear")
    if model.get("dropout") is False:
        out += ["--attention-dropout", "0.0", "--hidden-dropout", "0.0"]
    if model.get("tied_embeddings") is False:
        out.append("--untie-embeddings-and-output-weights")
    return out


def precision_flags(precision: str, grad_reduce_dtype: str = "fp32") -> list[str]:
    """--bf16 reduces gradients in fp32 by default (--grad-reduce-in-bf16 halves them); --fp16
    reduces them in fp16 unless --accumulate-allreduce-grads-in-fp32."""
    if precision == "bf16":
        return ["--bf16"] + (["--grad-reduce-in-bf16"] if grad_reduce_dtype == "bf16" else [])
    return ["--fp16"] + (["--accumulate-allreduce-grads-in-fp32"] if grad_reduce_dtype == "fp32" else [])


def attention_flags(flash_attention: bool) -> list[str]:
    """Unfused attention (softmax and dropout stored, Korthikanti et al.) when the job says so;
    Megatron's default backend (auto) picks a fused one."""
    return [] if flash_attention else ["--attention-backend", "unfused"]


def overlap_flags(plan: Plan, model: Mapping[str, Any], job: Mapping[str, Any]) -> list[str]:
    """The job's overlaps (Job.overlap_*), where the plan can run them: the gradient reduction
    with dp > 1, in buckets of one block (costmodel.bucket_params, the cost model's rule); the
    parameter all-gather with the distributed optimizer; the tp collectives with sequence
    parallelism (Transformer Engine's userbuffers need it)."""
    from milp_plan.costmodel import bucket_params
    from milp_plan.model import model_from_mapping
    st, out = plan.stages[0], []
    if job.get("overlap_grad_reduce") and st.dp > 1:
        m = model_from_mapping(str(model.get("name", "model")), dict(model), "plan.json inputs.model")
        out += ["--overlap-grad-reduce", "--ddp-bucket-size", str(bucket_params(m, st.tp))]
        if job.get("overlap_param_gather") and plan.distributed_optimizer:
            out.append("--overlap-param-gather")
    if job.get("tp_comm_overlap") and st.tp > 1 and plan.sequence_parallel:
        out.append("--tp-comm-overlap")
    return out


def flag_groups(plan: Plan, model: Mapping[str, Any], job: Mapping[str, Any]) -> list[tuple[str, list[str]]]:
    """Every flag for a Megatron-compatible plan, as (comment, flags) groups in a fixed order."""
    counts = [st.num_layers for st in plan.stages]
    groups = [("parallelism", parallel_flags(plan)),
              ("layer split over pipeline stages", layer_split_flags(counts, plan.vpp)),
              ("batches", batch_flags(plan)),
              ("activation recompute", recompute_flags(plan)),
              ("model", model_flags(model, int(job["seq_length"]))),
              ("precision", precision_flags(job.get("precision", "bf16"), job.get("grad_reduce_dtype", "fp32"))),
              ("attention", attention_flags(job.get("flash_attention", True))),
              ("communication overlap", overlap_flags(plan, model, job))]
    return [(name, flags) for name, flags in groups if flags]


def megatron_args(plan: Plan, model: Mapping[str, Any], job: Mapping[str, Any]) -> list[str]:
    return [f for _, flags in flag_groups(plan, model, job) for f in flags]
