"""The cost model: the single source of every coefficient.

Formulations, heuristics, the checker and the simulator read these functions; no
formula below may be written a second time anywhere else. Units are in the names:
seconds (`_s`), bytes, GB/s (10^9 bytes/s), US dollars.

Equations (per GPU of a stage, one micro-batch of b samples of s tokens, tp = t):

compute     f_s = sum over the stage's layers of fwd(kind) + tp_comm_fwd(kind)
            b_s = sum of bwd(kind) + tp_comm_bwd(kind) + recompute overhead
recompute   full, r layers:  + r x (fwd(block) + tp_comm_fwd(block))
            selective:       + n x attention-core forward of a block
tp comm     per block: 2 all-reduces (3 in a T5 decoder block) of s*b*h*2 bytes forward
            and as many backward (with sequence parallelism: all-gather + reduce-scatter,
            the same volume); ring all-reduce over intra-node links:
            transfer_s(2 (t-1)/t x bytes, intra_node_gb_per_s); the embedding adds one forward.
            With the job's tp_comm_overlap a block's collectives show only what outlasts
            its GEMMs (tp_overlapped_s: overlap_pieces with end piece 1/t).
transfer    every collective and transfer: transfer_s(volume, GB/s, link kind) = NCCL's
            latency + volume / (bus efficiency x GB/s) (nccl.py: published nccl-tests
            figures by link kind; a "nominal" link, the default: the figure as given).
p2p         bytes = s*b*h*2 / (t if sequence parallel else 1) per GPU per hop and direction;
            same node: transfer_s(bytes, intra_node_gb_per_s); across nodes: the slower
            node's network link is shared by the stage's GPUs sending at once:
            transfer_s(bytes, inter_node_gb_per_s / senders per node)
dp          gradients reduced in the job's grad_reduce_dtype (fp32 by default: Megatron
            accumulates bf16 gradients in fp32 main grads; bf16 with --grad-reduce-in-bf16):
            B = g x params per GPU, g = 4 (fp32) or 2 bytes (job.grad_bytes). Inside one node: ring 2 (d-1)/d x B / intra.
            Across n nodes with k replicas per node, hierarchical: intra reduce-scatter +
            all-gather 2 (k-1)/k x B / intra, plus inter-node ring 2 (n-1)/n x B x t / inter
            (the t tp-groups of the node share its link). The distributed optimizer
            reduce-scatters the gradients and all-gathers bf16 parameters: (g + 2)/(2 g) of
            the all-reduce volume ((4 + 2)/8 with fp32 gradients, 1 with bf16). With the
            job's overlap_grad_reduce / overlap_param_gather only the exposed part counts
            (stage_dp_pieces_s: overlap_pieces under the last backward / first forward).
optimizer   Adam touches OPTIMIZER_BYTES_PER_PARAM bytes per parameter it updates,
            memory-bound: params x 30 / (memory bandwidth x MEMORY_EFFICIENCY); a profile's
            measured seconds per parameter replace it (optimizer_s).
memory      weights 2 bytes, main gradients g (4 in fp32), Adam (fp32 master, m, v) 12 bytes
            per parameter on the GPU (params / t), plus an fp32 copy of the gradient (4) on
            the optimizer's side when the gradients are 2-byte; with the distributed
            optimizer the optimizer bytes are divided by d (Megatron-LM docs/distrib_optimizer,
            bytes per parameter: bf16 params + fp32 grads 18 -> 6 + 12/d; 2-byte params and
            grads 20 -> 4 + 16/d).
            Activations: in-flight micro-batches x per-micro-batch activations of the
            stage's layers (model.layer_activation_bytes; a profile's measurement at the
            point scales it: layer_activation_bytes), plus, when layers are fully
            recomputed, one layer's full activations while it is recomputed.
in flight   1F1B, ZB-H1: min(pp - s, m); GPipe: m; interleaved with v chunks:
            min(2 (pp - s - 1) + (v - 1) pp + 1, m v) chunks of 1/v of the stage's layers
            (Korthikanti et al.: pp (1 + (pp-1)/(pp v)) on the first stage).
step time   with t_s = f_s + b_s per micro-batch and m micro-batches (Narayanan et al. 2021):
            compute = m x max_s t_s,  bubble = (sum_s t_s - max_s t_s) / v_eff,
            p2p = sum over hops of (forward + backward transfer),
            dp = dp_tail_s of the exposed dp_s (the tied embedding's all-reduce after it on the
            end stages: tied_embedding_sync_s), optimizer = max_s opt_s (a global grad-norm
            barrier precedes the step);  v_eff = vpp for interleaved, 1 otherwise; ZB-H1:
            see pipeline_time_s.
cost        $/h = sum over used nodes of usd_per_hour (billing "node": any used GPU rents the
            node) or usd_per_hour / gpus_per_node per used GPU (billing "gpu");
            $/step = $/h x step time / 3600.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

from milp_plan import nccl
from milp_plan.analytic import ATTENTION_BWD_FACTOR, ESTIMATES
from milp_plan.cluster import MIXED_SEP, MixedNodeType, Node, NodeType, gpu_names
from milp_plan.instance import Instance
from milp_plan.model import Model
from milp_plan.plan import Plan, Stage, StagePrediction
from milp_plan.schedules import schedule_of
from milp_plan.units import GIB, SECONDS_PER_HOUR

# the optimizer step's memory efficiency: the estimate, not the fitted analytic constant, so
# the calibration (which fits that constant on the layers) does not feed on its own last fit
MEMORY_EFFICIENCY = ESTIMATES["MEMORY_EFFICIENCY"][0]
WEIGHT_BYTES = 2.0          # bf16 parameters
GRAD_BYTES = 4.0            # fp32 main gradients (the default grad_reduce_dtype; job.DTYPE_BYTES)
OPTIMIZER_BYTES = 12.0      # fp32 master weights + Adam m and v
FP32_BYTES = 4.0            # the optimizer's fp32 copy of 2-byte gradients
OPTIMIZER_BYTES_PER_PARAM = 30.0  # read grad 4, r/w master 8, m 8, v 8, write bf16 param 2
ACT_BYTES = 2.0             # bf16 activations on the wire


# ---- compute -----------------------------------------------------------------------
@dataclass(frozen=True)
class LayerTimes:
    """One micro-batch through one layer on one GPU, tp collectives included (seconds)."""

    fwd_s: float
    bwd_s: float
    attn_core_fwd_s: float


def transfer_s(volume_bytes: float, gb_per_s: float, link: str = nccl.NOMINAL) -> float:
    """Seconds to move `volume_bytes` of bus volume over a link of `gb_per_s` GB/s of kind
    `link`, the one rule of every collective and transfer (tp, dp, p2p, re-sharding): NCCL's
    latency plus the volume at its bus efficiency (nccl.py: published nccl-tests figures; a
    "nominal" link: the figure as given, no latency),
        t = latency_s + volume / (bus_efficiency x gb_per_s x 1e9);   0 for no volume."""
    if volume_bytes <= 0:
        return 0.0
    ln = nccl.link(link)
    return ln.latency_s + volume_bytes / (ln.bus_efficiency * gb_per_s * 1e9)


def ring_allreduce_s(n_bytes: float, group: int, gb_per_s: float, link: str = nccl.NOMINAL) -> float:
    """Ring all-reduce: bus volume 2 (g-1)/g x bytes (transfer_s)."""
    if group <= 1 or n_bytes <= 0:
        return 0.0
    return transfer_s(2.0 * (group - 1) / group * n_bytes, gb_per_s, link)


def row_tokens(inst: Instance, tokens: int | None) -> int:
    """Tokens per row (sample) of a work item: `tokens`, or the job's sequence length. Every
    cost function below takes the work item's tokens, so a workload of several lengths (or
    token slices) prices each item at its own length."""
    return inst.job.seq_length if tokens is None else tokens


def tp_comm_s(inst: Instance, node_type: NodeType, tp: int, mbs: int, kind: str,
              tokens: int | None = None) -> tuple[float, float]:
    """(forward, backward) tensor-parallel collective time of one layer of `kind`."""
    if tp <= 1:
        return 0.0, 0.0
    msg = row_tokens(inst, tokens) * mbs * inst.model.hidden_size * ACT_BYTES
    one = ring_allreduce_s(msg, tp, node_type.intra_node_gb_per_s, node_type.intra_node_link)
    n = {"block": 2, "encoder_block": 2, "decoder_block": 3, "embedding": 1, "head": 0}[kind]
    return n * one, (0 if kind == "embedding" else n) * one


def _flops_ratio(inst: Instance, kind: str):
    """How a layer's time scales from one sequence length to another (the profile's fill
    rule): by its forward FLOPs per sequence; a layer without FLOPs (the embedding lookup,
    memory-bound) by its tokens."""
    def ratio(seq_from: int, seq_to: int) -> float:
        m = inst.model
        before = m.forward_flops_per_token(kind, seq_from) * seq_from
        if before == 0:
            return seq_to / seq_from
        return (m.forward_flops_per_token(kind, seq_to) * seq_to) / before
    return ratio


def layer_times(inst: Instance, node_type: NodeType, tp: int, mbs: int, kind: str,
                tokens: int | None = None, context: int = 0) -> LayerTimes:
    """Profile times (filled by the profile's rules when not profiled) plus tp collectives
    when the profile does not include them, for rows of `tokens` tokens (row_tokens); with
    `context` > 0, a token slice after that many context tokens (slice_context_s). On a
    mixed-type stage (MixedNodeType) each time is its slowest member's: every operation of the
    stage waits for its slowest replica (an upper bound of the slowest replica's stage time,
    equal to it where one member is slowest in every layer)."""
    if isinstance(node_type, MixedNodeType):
        each = [layer_times(inst, nt, tp, mbs, kind, tokens, context) for nt, _ in node_type.members]
        return LayerTimes(*(max(t) for t in zip(*((x.fwd_s, x.bwd_s, x.attn_core_fwd_s) for x in each))))
    if context:
        base = layer_times(inst, node_type, tp, mbs, kind, tokens)
        ctx_f, ctx_b = slice_context_s(inst, node_type, tp, mbs, kind, row_tokens(inst, tokens), context)
        return LayerTimes(base.fwd_s + ctx_f, base.bwd_s + ctx_b, base.attn_core_fwd_s + ctx_f)
    m, seq = inst.model, row_tokens(inst, tokens)
    c = inst.profile.cost(m.name, node_type.gpu.name, tp, mbs, seq, kind, flops_ratio=_flops_ratio(inst, kind))
    comm_f, comm_b = (0.0, 0.0) if c.tp_comm_included else tp_comm_s(inst, node_type, tp, mbs, kind, seq)
    if c.attn_core_fwd_ms is not None:
        core = c.attn_core_fwd_ms / 1e3
    else:  # estimate by the FLOP share of the attention core
        total = m.forward_flops_per_token(kind, seq)
        core = c.fwd_ms / 1e3 * (m.attention_core_flops_per_token(kind, seq) / total if total else 0)
    fwd, bwd = c.fwd_ms / 1e3, c.bwd_ms / 1e3
    if inst.job.tp_comm_overlap and (comm_f or comm_b) and kind not in ("embedding", "head"):
        comm_f, comm_b = tp_overlapped_s(comm_f, comm_b, fwd, bwd, core, tp)
    return LayerTimes(fwd + comm_f, bwd + comm_b, core)


def tp_overlapped_s(comm_f: float, comm_b: float, fwd_s: float, bwd_s: float, core_s: float,
                    tp: int) -> tuple[float, float]:
    """(forward, backward) exposed tensor-parallel collectives of one block under
    --tp-comm-overlap (the embedding's collective has no GEMM beside it; Transformer Engine splits each all-gather / reduce-scatter into tp
    pieces, each run beside the GEMM chunk it feeds or follows): overlap_pieces with the end
    piece 1/tp of the collective and the window the layer's GEMM time, its forward less the
    attention core (the rest of a Transformer layer is GEMMs and the element-wise kernels fused
    into them), backward at the same GEMM share; never more than without overlap."""
    share = (fwd_s - core_s) / fwd_s if fwd_s > 0 else 0.0
    f = min(comm_f, max(overlap_pieces(comm_f, comm_f / tp, fwd_s - core_s)))
    b = min(comm_b, max(overlap_pieces(comm_b, comm_b / tp, bwd_s * share)))
    return f, b


def context_bwd_factor(inst: Instance) -> float:
    """Backward over forward time of a slice's context cells: the kernel's own ratio, as for a
    row's own keys (the profile holds the core's forward only, so the analytic model's ratio
    stands in): the fused kernel's ATTENTION_BWD_FACTOR (analytic.flash_core_s) with flash
    attention; 2 without (the two batched GEMMs run twice backward, analytic.unfused_core_s)."""
    return ATTENTION_BWD_FACTOR if inst.job.flash_attention else 2.0


def context_weight(inst: Instance) -> float:
    """kappa: what one context key of a token slice costs, in the units the profile prices a
    row's own keys in (the attention kernel's convention, the same for a slice as for a whole
    sequence). A row of s tokens is priced core_f(s) ~ s^2 (model.forward_flops_per_token: the
    full s x s block) whatever the kernel computes of it:
      * flash attention (job.flash_attention, the default: a causal fused kernel) computes the
        s^2 / 2 cells on and below the diagonal, so one computed cell costs 2 core_f(s) / s^2.
        A slice of l queries after c context keys computes l c context cells (none masked) and
        l^2 / 2 of its own: kappa = 2, and the slices of a sequence compute
        sum_k (l_k c_k + l_k^2 / 2) = L^2 / 2 cells, the unsliced sequence's;
      * without it (Megatron's unfused core: QK^T and AV as batched GEMMs over the full block,
        the mask applied to the scores) a row computes all s^2 cells and a slice the l x (c + l)
        rectangle: kappa = 1, and the slices compute (L^2 + sum_k l_k^2) / 2 <= L^2 cells (the
        masked cells above the diagonal blocks are never computed: a saving such a runtime has).
    Either way one slice of L tokens is the unsliced sequence exactly."""
    return 2.0 if inst.job.flash_attention else 1.0


def slice_context_s(inst: Instance, node_type: NodeType, tp: int, mbs: int, kind: str, tokens: int,
                    context: int) -> tuple[float, float]:
    """(forward, backward) seconds a token slice's attention spends on its context: a slice of
    l = `tokens` tokens after c = `context` tokens attends over c + l keys; the profile's time of
    an l-token row (layer_times at l tokens) holds its own l keys, and the l c context cells are
    priced at the attention core's rate at the job's length L, in the kernel's convention
    (context_weight, kappa = 2 with the causal flash kernel, 1 with the unfused full block):
        ctx_f = kappa core_f(L) l c / L^2,   ctx_b = context_bwd_factor x ctx_f,
    core_f(L) = the attention-core forward of an L-token row (LayerTimes.attn_core_fwd_s:
    profiled, or the FLOP share of the forward). So t(L, 0) = t(L): the unsliced sequence costs
    what it costs without slicing, and where core_f(l) = core_f(L) l^2 / L^2 the slices of a
    sequence spend on attention core_f(L) (flash) or core_f(L) (L^2 + sum l^2) / (2 L^2)
    (unfused) in all: slicing saves attention work only where the kernel would compute masked
    cells. With a fitted profile (latency.LatencyFit, t = b0 + c T + d T s) this is TeraPipe's
    form t = T0[b, l] + beta3 b l c with T0 = the fit at (b l, l) and beta3 = kappa d (beta2 = 0:
    the reads of the cached K/V are not priced)."""
    if context <= 0 or tokens <= 0:
        return 0.0, 0.0
    seq = inst.job.seq_length
    core = layer_times(inst, node_type, tp, mbs, kind, seq).attn_core_fwd_s
    f = context_weight(inst) * core * tokens * context / (seq * seq)
    return f, context_bwd_factor(inst) * f


def recompute_overhead_s(inst: Instance, node_type: NodeType, tp: int, mbs: int, kinds: Sequence[str],
                         recompute: str, recompute_layers: int, tokens: int | None = None,
                         context: int = 0) -> float:
    """Extra backward time: full = forward of the first `recompute_layers` blocks again
    (Megatron's block method recomputes the first r layers of a stage); selective =
    the attention core of every block."""
    if recompute == "full":
        return sum(layer_times(inst, node_type, tp, mbs, k, tokens, context).fwd_s for k in kinds[:recompute_layers])
    if recompute == "selective":
        return sum(layer_times(inst, node_type, tp, mbs, k, tokens, context).attn_core_fwd_s for k in kinds)
    return 0.0


def stage_kinds(inst: Instance, first_layer: int, num_layers: int) -> list[str]:
    return [inst.model.block_kind(i) for i in range(first_layer, first_layer + num_layers)]


def stage_compute_s(inst: Instance, node_type: NodeType, tp: int, mbs: int, kinds: Sequence[str],
                    has_embedding: bool, has_head: bool, recompute: str = "none",
                    recompute_layers: int = 0, tokens: int | None = None, context: int = 0) -> tuple[float, float]:
    """(f_s, b_s): forward and backward seconds of one micro-batch through a stage (of a token
    slice of `tokens` tokens after `context` tokens, when given: slice_context_s)."""
    parts = list(kinds) + (["embedding"] if has_embedding else []) + (["head"] if has_head else [])
    once = {k: layer_times(inst, node_type, tp, mbs, k, tokens, context) for k in dict.fromkeys(parts)}
    times = [once[k] for k in parts]      # each kind priced once, summed layer by layer
    fwd = sum(t.fwd_s for t in times)
    bwd = sum(t.bwd_s for t in times)
    bwd += recompute_overhead_s(inst, node_type, tp, mbs, kinds, recompute, recompute_layers, tokens, context)
    return fwd, bwd


# ---- communication --------------------------------------------------------------------
def p2p_bytes(inst: Instance, mbs: int, tp: int, sequence_parallel: bool, tokens: int | None = None) -> float:
    """Bytes one GPU sends per micro-batch per hop and direction."""
    full = row_tokens(inst, tokens) * mbs * inst.model.hidden_size * ACT_BYTES
    return full / tp if (sequence_parallel and tp > 1) else full


def p2p_s(inst: Instance, n_bytes: float, src: NodeType, dst: NodeType, same_node: bool,
          senders_per_node: int) -> float:
    """One transfer between consecutive stages (one direction)."""
    if same_node:
        slow = min((src, dst), key=lambda nt: nt.intra_node_gb_per_s)
        return transfer_s(n_bytes, slow.intra_node_gb_per_s, slow.intra_node_link)
    slow = min((src, dst), key=lambda nt: nt.inter_node_gb_per_s)
    # the slower node's link, shared by the stage's senders (at that link kind's figures)
    return transfer_s(n_bytes, slow.inter_node_gb_per_s / max(1, senders_per_node), slow.inter_node_link)


def embedding_grad_bytes(inst: Instance, tp: int) -> float:
    """Bytes of the tied word-embedding gradient one GPU of a tp group holds: its vocabulary
    shard, V h / tp elements of the job's gradient dtype (job.grad_bytes); 0 when the model
    unties embedding and output layer."""
    m = inst.model
    return inst.job.grad_bytes * m.vocab_size * m.hidden_size / tp if m.tied_embeddings else 0.0


def dp_allreduce_s(grad_bytes: float, dp: int, tp: int, replicas_per_node: int, num_nodes: int,
                   intra_gb_per_s: float, inter_gb_per_s: float, distributed_optimizer: bool,
                   grad_dtype_bytes: float = GRAD_BYTES, links: tuple[str, str] = (nccl.NOMINAL, nccl.NOMINAL)) -> float:
    """Data-parallel gradient reduction of one stage (hierarchical when it spans nodes);
    grad_bytes = grad_dtype_bytes x parameters per GPU; links: the (intra, inter) link kinds."""
    if dp <= 1:
        return 0.0
    volume = grad_bytes * ((grad_dtype_bytes + WEIGHT_BYTES) / (2 * grad_dtype_bytes) if distributed_optimizer
                           else 1.0)
    if num_nodes <= 1:
        return ring_allreduce_s(volume, dp, intra_gb_per_s, links[0])
    k = replicas_per_node
    intra = ring_allreduce_s(volume, k, intra_gb_per_s, links[0])
    inter = transfer_s(2.0 * (num_nodes - 1) / num_nodes * volume * tp, inter_gb_per_s, links[1])
    return intra + inter


def overlap_pieces(total_s: float, end_s: float, window_s: float) -> tuple[float, float]:
    """Communication overlapped with the compute that produces (or consumes) it, the one rule
    of every overlap the job asks for (Job.overlap_*): `total_s` seconds of transfers in pieces,
    each sent once the compute of its part is done, over a window of `window_s` seconds of that
    compute; `end_s` is the piece that no compute hides (the last gradient bucket, ready when
    the backward ends). The exposed time, past the window's end, is the max of the two pieces:

        exposed = max(end_s, total_s - window_s + end_s) = end_s + max(0, total_s - window_s)

    It bounds the pieces' schedule from above: pieces of r_j seconds, each ready after its share
    of the window, served one at a time, end at max_k (ready_k + sum_{j>=k} r_j); with the work
    per piece proportional to its transfer, that is at most max_j r_j + max(0, total - window),
    and with equal pieces of r = end_s exactly max(r, total - window + window / n) (at most the
    rule, equal to it when total <= window: only the end piece shows). A max of two terms affine
    in the stage's layers, so the per-config model writes it as two constraints. Limit: when the
    end piece outlasts the window (one bucket's reduction longer than a micro-batch's backward:
    very slow links, thin stages) the rule exceeds `total`, though overlap never makes the real
    step slower; min(total, rule) is not convex and would need a binary per stage."""
    return end_s, total_s - window_s + end_s


def bucket_params(model: Model, tp: int) -> int:
    """Parameters per GPU of one gradient bucket under overlap: one block of the model's largest
    kind. Launch passes it to Megatron (--ddp-bucket-size), whose default, max(4e7, 1e6 dp)
    parameters, would hold several small blocks or a fraction of a large one."""
    return max(model.layer_params(k) for k in {model.block_kind(i) for i in range(model.num_layers)}) // tp


def dp_end_params(inst: Instance, tp: int, has_embedding: bool) -> float:
    """Parameters per GPU of a stage's end gradient bucket (overlap_pieces' end piece): one
    bucket (a stage holds at least one block), plus the input embedding on the stage that
    holds it, whose gradient is ready last and whose backward takes no time."""
    m = inst.model
    return bucket_params(m, tp) + (m.layer_params("embedding") / tp if has_embedding else 0.0)


def stage_dp_pieces_s(inst: Instance, params_per_gpu: float, dp: int, tp: int, replicas_per_node: int,
                      num_nodes: int, intra_gb_per_s: float, inter_gb_per_s: float, distributed_optimizer: bool,
                      end_params_per_gpu: float = 0.0, fwd_s: float = 0.0, bwd_s: float = 0.0,
                      links: tuple[str, str] = (nccl.NOMINAL, nccl.NOMINAL)) -> tuple[float, ...]:
    """A stage's exposed data-parallel reduction as a max of pieces (stage_dp_s is their max).

    Without overlap: (dp_allreduce_s,) after the last backward. With the distributed optimizer
    the time splits into the gradients' reduce-scatter, g/(g+2) of it, and the parameters'
    all-gather, 2/(g+2) (dp_allreduce_s's volume). overlap_grad_reduce: the reduce-scatter (the
    all-reduce without the distributed optimizer) overlaps the last micro-batch's backward of
    `bwd_s` seconds, its end piece the end bucket (dp_end_params); overlap_param_gather: the
    all-gather overlaps the next step's first forward of `fwd_s` seconds, its end piece the
    first bucket (the same params), and its exposed part is counted here, with the reduction
    (at most once per step: on stage 0 it delays the step's first forward, later stages hide it
    in the fill). The pieces are every sum of one reduction piece and one all-gather piece."""
    g = inst.job.grad_bytes
    total = dp_allreduce_s(g * params_per_gpu, dp, tp, replicas_per_node, num_nodes, intra_gb_per_s,
                           inter_gb_per_s, distributed_optimizer, grad_dtype_bytes=g, links=links)
    job = inst.job
    if dp <= 1 or not (job.overlap_grad_reduce or job.overlap_param_gather):
        return (total,)
    end = dp_allreduce_s(g * end_params_per_gpu, dp, tp, replicas_per_node, num_nodes, intra_gb_per_s,
                         inter_gb_per_s, distributed_optimizer, grad_dtype_bytes=g, links=links)
    ag = WEIGHT_BYTES / (g + WEIGHT_BYTES) if distributed_optimizer else 0.0
    red = overlap_pieces(total * (1 - ag), end * (1 - ag), bwd_s) if job.overlap_grad_reduce else (total * (1 - ag),)
    gather = (overlap_pieces(total * ag, end * ag, fwd_s) if (job.overlap_param_gather and ag)
              else (total * ag,))
    return tuple(x + y for x in red for y in gather)


def stage_dp_s(inst: Instance, params_per_gpu: float, dp: int, tp: int, replicas_per_node: int, num_nodes: int,
                intra_gb_per_s: float, inter_gb_per_s: float, distributed_optimizer: bool,
                end_params_per_gpu: float = 0.0, fwd_s: float = 0.0, bwd_s: float = 0.0,
                links: tuple[str, str] = (nccl.NOMINAL, nccl.NOMINAL)) -> float:
    """The exposed reduction of a stage holding `params_per_gpu` parameters, in the job's
    gradient dtype: the max of stage_dp_pieces_s (dp_allreduce_s without overlap)."""
    return max(stage_dp_pieces_s(inst, params_per_gpu, dp, tp, replicas_per_node, num_nodes, intra_gb_per_s,
                                 inter_gb_per_s, distributed_optimizer, end_params_per_gpu, fwd_s, bwd_s, links))


# ---- parameters and memory ----------------------------------------------------------
def stage_params(inst: Instance, kinds: Sequence[str], has_embedding: bool, has_head: bool,
                 single_stage: bool = False) -> float:
    """Parameters a stage holds (before tp sharding). A tied output projection is counted
    on both the first and the last stage unless one stage holds both."""
    m = inst.model
    if kinds and kinds.count(kinds[0]) == len(kinds):   # one kind (every block of all but T5): exact, whole numbers
        p = float(m.layer_params(kinds[0]) * len(kinds))
    else:
        p = float(sum(m.layer_params(k) for k in kinds))
    if has_embedding:
        p += m.layer_params("embedding")
    if has_head:
        p += m.layer_params("head")
        if single_stage and m.tied_embeddings:
            p -= m.vocab_size * m.hidden_size
    return p


def model_state_bytes(params_per_gpu: float, dp: int, distributed_optimizer: bool,
                      grad_bytes: float = GRAD_BYTES) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes per GPU; grad_bytes per gradient element (job.grad_bytes)."""
    per_param = OPTIMIZER_BYTES + (FP32_BYTES if grad_bytes < FP32_BYTES else 0.0)
    opt = per_param * params_per_gpu / (dp if distributed_optimizer else 1)
    return WEIGHT_BYTES * params_per_gpu, grad_bytes * params_per_gpu, opt


def inflight_microbatches(schedule: str, pp: int, stage: int, m: int, vpp: int = 1) -> float:
    """Micro-batches whose activations a stage holds at its peak (schedules.Schedule.in_flight)."""
    return schedule_of(schedule, vpp).in_flight(pp, stage, m)


def end_inflight(schedule: str, pp: int, m: int, vpp: int, inflight: float) -> tuple[float, float]:
    """(embedding, head) in-flight micro-batches (schedules.Schedule.end_in_flight)."""
    return schedule_of(schedule, vpp).end_in_flight(pp, m, inflight)


def measured_activation_bytes(inst: Instance, gpu: str, kind: str, tp: int, mbs: int,
                              tokens: int | None = None) -> float | None:
    """Bytes one micro-batch keeps for the backward of one layer of `kind` as the profile
    measured them at exactly (gpu, tp, mbs, tokens) with no recompute and no sequence
    parallelism, else None: its `act_bytes`, or its `mem_total_bytes` (the layer's whole
    footprint, Metis) less the layer's model states, model_state_bytes of
    model.layer_params(kind) / tp without the distributed optimizer (never below 0)."""
    c = inst.profile.exact(inst.model.name, gpu, tp, mbs, row_tokens(inst, tokens), kind)
    if c is None:
        return None
    if c.act_bytes is not None:
        return c.act_bytes
    if c.mem_total_bytes is not None:
        states = model_state_bytes(inst.model.layer_params(kind) / tp, 1, False, inst.job.grad_bytes)
        return max(0.0, c.mem_total_bytes - sum(states))
    return None


def layer_activation_bytes(inst: Instance, kind: str, tp: int, mbs: int, sequence_parallel: bool,
                           recompute: str, tokens: int | None = None, gpu: str | None = None) -> float:
    """Bytes one micro-batch keeps alive in one layer of `kind` until its backward: Korthikanti
    et al.'s formula (model.layer_activation_bytes) at the job's flash-attention setting; where
    the profile measured the layer on `gpu` (measured_activation_bytes), measured beats formula:
        bytes = formula(sp, recompute) x measured / formula(no sp, no recompute),
    the formula's ratio carrying the measurement to the plan's settings (a layer the formula
    gives 0 bytes keeps what was measured). On a mixed-type stage (`gpu` joins several names)
    the most of its GPU types'."""
    if gpu is not None and MIXED_SEP in gpu:
        return max(layer_activation_bytes(inst, kind, tp, mbs, sequence_parallel, recompute, tokens, g)
                   for g in gpu_names(gpu))
    m = inst.model
    kw = dict(micro_batch=mbs, tp=tp, seq_length=row_tokens(inst, tokens), flash_attention=inst.job.flash_attention)
    formula = m.layer_activation_bytes(kind, sequence_parallel=sequence_parallel, recompute=recompute, **kw)
    measured = None if gpu is None else measured_activation_bytes(inst, gpu, kind, tp, mbs, tokens)
    if measured is None:
        return formula
    base = m.layer_activation_bytes(kind, **kw)
    return measured if base <= 0 else formula * measured / base


def stage_activation_bytes(inst: Instance, kinds: Sequence[str], has_embedding: bool, has_head: bool, tp: int,
                           mbs: int, sequence_parallel: bool, recompute: str, recompute_layers: int,
                           inflight: float, emb_inflight: float | None = None,
                           head_inflight: float | None = None, tokens: int | None = None,
                           gpu: str | None = None) -> float:
    """Activation bytes per GPU: `inflight` micro-batches of the stage's layers
    (layer_activation_bytes on `gpu`), the ends' own in-flight counts, and under full
    recompute one recomputed layer's full activations."""
    seen: dict[tuple[str, str], float] = {}   # the stage's layers share a kind: one evaluation per (kind, mode)

    def act(kind: str, mode: str = "none") -> float:
        got = seen.get((kind, mode))
        if got is None:
            got = seen[kind, mode] = layer_activation_bytes(inst, kind, tp, mbs, sequence_parallel, mode, tokens, gpu)
        return got
    per_mb = 0.0
    for i, k in enumerate(kinds):
        mode = "full" if (recompute == "full" and i < recompute_layers) else ("selective" if recompute == "selective" else "none")
        per_mb += act(k, mode)
    ends = 0.0
    if has_embedding:
        ends += (inflight if emb_inflight is None else emb_inflight) * act("embedding")
    if has_head:
        ends += (inflight if head_inflight is None else head_inflight) * act("head")
    working = 0.0
    if recompute == "full" and recompute_layers > 0:
        working = max(act(k) for k in kinds[:recompute_layers])
    return inflight * per_mb + ends + working


def stage_state_bytes(inst: Instance, kinds: Sequence[str], has_embedding: bool, has_head: bool, single_stage: bool,
                      tp: int, dp: int, distributed_optimizer: bool) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes per GPU of a stage holding `kinds` (and the ends):
    model_state_bytes of its parameters over tp, in the job's gradient dtype."""
    params = stage_params(inst, kinds, has_embedding, has_head, single_stage=single_stage) / tp
    return model_state_bytes(params, dp, distributed_optimizer, inst.job.grad_bytes)


def stage_memory_bytes(inst: Instance, *, schedule: str, pp: int, stage: int, m: int, vpp: int,
                       kinds: Sequence[str], tp: int, dp: int, mbs: int, sequence_parallel: bool,
                       distributed_optimizer: bool, recompute: str, recompute_layers: int,
                       tokens: int | None = None, gpu: str | None = None) -> tuple[float, float, float, float, float]:
    """(weights, gradients, optimizer, activations, in-flight) bytes per GPU of stage `stage` on
    `gpu` (its measured activations, where the profile has them: layer_activation_bytes)."""
    first, last = stage == 0, stage == pp - 1
    w, g, o = stage_state_bytes(inst, kinds, first, last, pp == 1, tp, dp, distributed_optimizer)
    inflight = inflight_microbatches(schedule, pp, stage, m, vpp)
    emb, head = end_inflight(schedule, pp, m, vpp, inflight)
    act = stage_activation_bytes(inst, kinds, first, last, tp, mbs, sequence_parallel, recompute,
                                 recompute_layers, inflight, emb, head, tokens, gpu)
    return w, g, o, act, inflight


def usable_memory_bytes(inst: Instance, node_type: NodeType) -> float:
    return node_type.memory_gib * GIB * (1.0 - inst.job.memory_headroom)


def optimizer_s(inst: Instance, params_updated: float, node_type: NodeType) -> float:
    """One optimizer step over `params_updated` parameters on one GPU: the profile's measured
    seconds per parameter on that GPU (Profile.optimizer_s_per_param), else memory-bound,
    params x OPTIMIZER_BYTES_PER_PARAM / (memory bandwidth x MEMORY_EFFICIENCY); on a
    mixed-type stage the slowest member's."""
    if isinstance(node_type, MixedNodeType):
        return max(optimizer_s(inst, params_updated, nt) for nt, _ in node_type.members)
    rate = inst.profile.optimizer_s_per_param(node_type.gpu.name)
    if rate is not None:
        return params_updated * rate
    return params_updated * OPTIMIZER_BYTES_PER_PARAM / (node_type.gpu.memory_gb_per_s * 1e9 * MEMORY_EFFICIENCY)


# ---- pipeline time -----------------------------------------------------------------
def pipeline_time_s(fwd_s: Sequence[float], bwd_s: Sequence[float], m: int, schedule: str,
                    vpp: int = 1, hop_s: Sequence[float] | None = None) -> tuple[float, float]:
    """(compute, bubble) of the closed form, given per-stage f_s, b_s per micro-batch; each
    schedule's form is in its class (schedules.py). With t_s = f_s + b_s and z the steady
    period (schedules.steady_period_s; max_s t_s without hops):
      1F1B:          T = m z + (sum_s t_s - z)                      [= (m-1) z + sum_s t_s]
      GPipe:         T = (m-1)(zf + zb) + sum_s t_s,  zf = max(f_s, h_s), zb = max(b_s, h_s)
      interleaved:   T = m z + (sum_s t_s - z) / vpp,   z = max_s t_s
      ZB-H1:         T = m z + (sum_s t'_s + 2 max_s w_s - z),  w_s = schedules.W_FRACTION_OF_BWD b_s
    """
    hops = list(hop_s) if hop_s is not None else [0.0] * (len(fwd_s) - 1)
    return schedule_of(schedule, vpp).pipeline_time(fwd_s, bwd_s, m, hops)


def p2p_time_s(hop_s: Sequence[float], wrap_hop_s: float, schedule: str, vpp: int = 1) -> float:
    """Transfers on the critical path: 2 sum h (1F1B, GPipe); 4 sum h (ZB-H1);
    2 (vpp sum h + (vpp - 1) h_wrap) (interleaved: fill and drain cross every chunk boundary)."""
    return schedule_of(schedule, vpp).p2p_time(hop_s, wrap_hop_s)


def dp_tail_s(dp_s: Sequence[float], bwd_s: Sequence[float], hop_s: Sequence[float], schedule: str,
              vpp: int = 1) -> float:
    """Gradient reduction not hidden by the pipeline drain: stage s finishes its last
    backward sum_{k<s} (b_k / v + h_k) before stage 0 does, so
        dp = max_s (dp_s - sum_{k<s} (b_k / v + h_k))   (>= dp_0 >= 0)."""
    v = schedule_of(schedule, vpp).chunks
    best, slack = 0.0, 0.0
    for s, d in enumerate(dp_s):
        if s:
            slack += bwd_s[s - 1] / v + hop_s[s - 1]
        best = max(best, d - slack)
    return best


# ---- cost ---------------------------------------------------------------------------
def usd_per_hour(nodes: Iterable[Node], gpus_used_per_node: dict[int, int]) -> float:
    total = 0.0
    for node in nodes:
        used = gpus_used_per_node.get(node.index, 0)
        if used == 0:
            continue
        total += node.type.rent_usd_per_hour(used, 1)
    return total


def usd_per_step(usd_hour: float, step_time_s: float) -> float:
    return usd_hour * step_time_s / SECONDS_PER_HOUR


# ---- whole plan ---------------------------------------------------------------------
def _stage_nodes(inst: Instance, stage: Stage) -> list[Node]:
    nodes = inst.cluster.nodes
    return [nodes[i] for i in sorted({d.node for d in stage.devices})]


def stage_node_type(inst: Instance, stage: Stage) -> NodeType | MixedNodeType:
    """The node type a stage is priced on: where its devices sit on one GPU type, the
    slowest-linked node type among its nodes; where they span GPU types (a mixed-type stage),
    the MixedNodeType of its nodes, each member with its count of the stage's nodes."""
    nodes = _stage_nodes(inst, stage)
    types = [n.type for n in nodes]
    if len({nt.gpu.name for nt in types}) > 1:
        order = {nt: k for k, nt in enumerate(inst.cluster.node_types)}
        return MixedNodeType(tuple((nt, types.count(nt)) for nt in sorted(set(types), key=order.__getitem__)))
    return min(types, key=lambda nt: (nt.intra_node_gb_per_s, nt.inter_node_gb_per_s))


def link_node_type(inst: Instance, stage: Stage) -> NodeType | MixedNodeType:
    """The node type whose links a stage's transfers use (p2p_s): its first device's node's, or a
    mixed-type stage's MixedNodeType (its slowest member's links)."""
    nt = stage_node_type(inst, stage)
    return nt if isinstance(nt, MixedNodeType) else inst.cluster.nodes[stage.devices[0].node].type


def senders_per_node(nt: NodeType | MixedNodeType, group: int) -> int:
    """GPUs of a stage of `group` GPUs on its busiest node: they share that node's link."""
    return nt.busiest_node if isinstance(nt, MixedNodeType) else min(group, nt.gpus_per_node)


def stage_busiest_node(st: Stage) -> tuple[int, int]:
    """(nodes, GPUs on the busiest node) of a placed stage: senders_per_node from its devices."""
    per_node = Counter(d.node for d in st.devices)
    return len(per_node), max(per_node.values())


@dataclass(frozen=True)
class PlanCosts:
    """Every per-stage coefficient of a plan, in seconds per micro-batch where it applies.

    hop_s[i] is one transfer (one direction) between stage i and i + 1."""

    fwd_s: tuple[float, ...]
    bwd_s: tuple[float, ...]
    hop_s: tuple[float, ...]
    wrap_hop_s: float          # last stage -> stage 0 (interleaved), one direction
    dp_s: tuple[float, ...]
    opt_s: tuple[float, ...]
    stages: tuple[StagePrediction, ...]
    embedding_s: float = 0.0   # tied_embedding_sync_s: after the reduction, on the end stages

    @property
    def tail_s(self) -> tuple[float, ...]:
        """What each stage does after its last backward, before the optimizer's barrier: its
        data-parallel reduction, then on the first and the last stage the tied embedding's
        all-reduce, which waits for both ends' reductions. The step's tail is
        max_s (end of last backward_s + tail_s): with the all-reduce starting at the later of the
        two ends' reductions, max(A_0, A_L) + E = max(A_0 + E, A_L + E), so adding E to the two
        ends' reductions is exact."""
        if not self.embedding_s or len(self.dp_s) < 2:
            return self.dp_s
        last = len(self.dp_s) - 1
        return tuple(d + (self.embedding_s if s in (0, last) else 0.0) for s, d in enumerate(self.dp_s))


def plan_costs(inst: Instance, plan: Plan) -> PlanCosts:
    """The cost model applied to each stage and hop of a plan.

    Assumes the plan is structurally valid (run `check.check_structure` first)."""
    pp, m = plan.pp, plan.num_microbatches
    fwd, bwd, preds, dp_times, opt_times = [], [], [], [], []
    for i, st in enumerate(plan.stages):
        nt = stage_node_type(inst, st)
        kinds = stage_kinds(inst, st.first_layer, st.num_layers)
        first, last = i == 0, i == pp - 1
        f, b = stage_compute_s(inst, nt, st.tp, st.micro_batch_size, kinds, first, last, st.recompute,
                               st.recompute_layers)
        fwd.append(f)
        bwd.append(b)
        params = stage_params(inst, kinds, first, last, single_stage=pp == 1) / st.tp
        w, g, o, act, inflight = stage_memory_bytes(
            inst, schedule=plan.schedule, pp=pp, stage=i, m=m, vpp=plan.vpp, kinds=kinds, tp=st.tp, dp=st.dp,
            mbs=st.micro_batch_size, sequence_parallel=plan.sequence_parallel,
            distributed_optimizer=plan.distributed_optimizer, recompute=st.recompute,
            recompute_layers=st.recompute_layers, gpu=nt.gpu.name)
        cap = usable_memory_bytes(inst, nt)
        preds.append(StagePrediction(f * 1e3, b * 1e3, w / GIB, g / GIB, o / GIB, act / GIB,
                                     (w + g + o + act) / GIB, cap / GIB, inflight))
        n_nodes, per_node = stage_busiest_node(st)
        net = min((n.type for n in _stage_nodes(inst, st)), key=lambda t: t.inter_node_gb_per_s)
        dp_times.append(stage_dp_s(inst, params, st.dp, st.tp, max(1, per_node // st.tp),
                                   n_nodes, nt.intra_node_gb_per_s, net.inter_node_gb_per_s,
                                   plan.distributed_optimizer, dp_end_params(inst, st.tp, first), f, b,
                                   (nt.intra_node_link, net.inter_node_link)))
        opt_times.append(optimizer_s(inst, params / (st.dp if plan.distributed_optimizer else 1), nt))
    hops = [hop_between(inst, plan, plan.stages[i], plan.stages[i + 1]) for i in range(pp - 1)]
    wrap = hop_between(inst, plan, plan.stages[-1], plan.stages[0]) if pp > 1 else 0.0
    return PlanCosts(tuple(fwd), tuple(bwd), tuple(hops), wrap, tuple(dp_times), tuple(opt_times), tuple(preds),
                     tied_embedding_sync_s(inst, plan))


def link_s(inst: Instance, n_bytes: float, a: Stage, b: Stage) -> float:
    """`n_bytes` from each GPU of stage a to its peer in stage b (p2p_s): same node or not,
    senders = a's GPUs on its busiest node."""
    same = len({d.node for d in a.devices} | {d.node for d in b.devices}) == 1
    senders = stage_busiest_node(a)[1]
    return p2p_s(inst, n_bytes, link_node_type(inst, a), link_node_type(inst, b), same, senders)


def hop_between(inst: Instance, plan: Plan, a: Stage, b: Stage, tokens: int | None = None) -> float:
    """One transfer from stage a to stage b (link_s) of rows of `tokens` tokens (row_tokens: a
    token slice's, or the job's length)."""
    return link_s(inst, p2p_bytes(inst, a.micro_batch_size, a.tp, plan.sequence_parallel, tokens), a, b)


def tied_embedding_sync_s(inst: Instance, plan: Plan) -> float:
    """Megatron's all-reduce of the tied word-embedding gradient between the first and the last
    stage (pp > 1, tied embeddings; finalize_model_grads runs it after the data-parallel
    reduction): each GPU of one end and its peer of the other reduce their shard,
    embedding_grad_bytes, a two-rank ring (2 (2-1)/2 B / bandwidth = B / bandwidth), over the
    link between the two stages (link_s); the slower direction sets it:
        E = max(B_0 / bw(0 -> L), B_L / bw(L -> 0)).
    PlanCosts.tail_s charges it to both ends after their reductions."""
    if plan.pp < 2 or not inst.model.tied_embeddings:
        return 0.0
    first, last = plan.stages[0], plan.stages[-1]
    return max(link_s(inst, embedding_grad_bytes(inst, a.tp), a, b) for a, b in ((first, last), (last, first)))


def plan_usd_per_hour(inst: Instance, plan: Plan) -> float:
    used: dict[int, int] = {}
    for st in plan.stages:
        for d in st.devices:
            used[d.node] = used.get(d.node, 0) + 1
    return usd_per_hour(inst.cluster.nodes, used)


# ---- token slices (TeraPipe) ------------------------------------------------------------
@dataclass(frozen=True)
class SliceCosts:
    """Per-slice coefficients of a plan whose sequences are cut into token slices (plan.slices,
    tokens per slice, in order): fwd_s[s][k], bwd_s[s][k] stage s on slice k (its tokens after
    the slices before it as context: slice_context_s); hop_s[h][k] one transfer of slice k on
    hop h, each direction (its tokens' activations)."""

    fwd_s: tuple[tuple[float, ...], ...]
    bwd_s: tuple[tuple[float, ...], ...]
    hop_s: tuple[tuple[float, ...], ...]


def stage_slice_times(inst: Instance, node_type: NodeType, stage: Stage, pp: int, index: int,
                      lengths: Sequence[int]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(f, b) of one stage on each slice of `lengths` tokens (stage_slice_time: each slice after
    the slices before it as context)."""
    fwd, bwd, c = [], [], 0
    for n in lengths:
        f, b = stage_slice_time(inst, node_type, stage, pp, index, n, c)
        fwd.append(f)
        bwd.append(b)
        c += n
    return tuple(fwd), tuple(bwd)


def stage_slice_time(inst: Instance, node_type: NodeType, stage: Stage, pp: int, index: int, tokens: int,
                     context: int) -> tuple[float, float]:
    """(f, b) of stage `index` of a pp-stage plan on one slice of `tokens` tokens after `context`
    tokens (stage_compute_s with context)."""
    return stage_compute_s(inst, node_type, stage.tp, stage.micro_batch_size,
                           stage_kinds(inst, stage.first_layer, stage.num_layers), index == 0, index == pp - 1,
                           stage.recompute, stage.recompute_layers, tokens=tokens, context=context)


def slice_costs(inst: Instance, plan: Plan, lengths: Sequence[int] | None = None) -> SliceCosts:
    """The cost model on each stage, hop and slice of `plan` cut into `lengths` (default
    plan.slices). Memory is not sliced: every slice of every sequence in flight stays live
    until its backward (GPipe-like order), so a stage holds what unsliced GPipe holds
    (plan_costs); slicing shortens the bubble, not the activations."""
    lengths = tuple(lengths if lengths is not None else plan.slices)
    pp = plan.pp
    fwd, bwd = [], []
    for i, st in enumerate(plan.stages):
        f, b = stage_slice_times(inst, stage_node_type(inst, st), st, pp, i, lengths)
        fwd.append(f)
        bwd.append(b)
    hops = []
    for i in range(pp - 1):
        a, b = plan.stages[i], plan.stages[i + 1]
        hops.append(tuple(hop_between(inst, plan, a, b, n) for n in lengths))
    return SliceCosts(tuple(fwd), tuple(bwd), tuple(hops))

