"""Analytic layer profiles: FLOPs over achieved TFLOP/s, with a roofline efficiency model.

For one micro-batch of T = b*s tokens through one layer on one GPU of a tp group:

* every GEMM (m x k) @ (k x n) takes
      max( 2mnk / (peak * GEMM_EFFICIENCY * phi),  bf16 bytes moved / (bandwidth * MEMORY_EFFICIENCY) )
  with phi = d / (d + GEMM_DIM_HALF), d = min(m, n, k): small matrices (a thin tp shard, a
  small hidden size) run further from peak; the backward runs each GEMM twice (data
  gradient and weight gradient);
* the attention core (QK^T, softmax, AV) with flash attention (one fused kernel) takes
  4 b s^2 h/t / (peak * ATTENTION_EFFICIENCY) forward and ATTENTION_BWD_FACTOR times that backward;
  without it (job flash_attention false: Megatron's unfused DotProductAttention) it is two
  batched GEMMs (b a/t batches of s x s x d, d = h/a: QK^T and AV, each 2 b s^2 h/t FLOPs at the
  GEMM rule above with phi of d, and their bf16 inputs and outputs, the s x s scores among them)
  plus memory-bound passes over the a s^2 b/t scores: scale-mask-softmax reads and writes them
  (2 + 2 bytes), dropout reads them and writes them and a 1-byte mask (2 + 2 + 1); backward runs
  both GEMMs twice and the element-wise bytes twice;
* element-wise work (norms, residuals, activation, dropout, bias) is memory-bound:
  bytes / (bandwidth * MEMORY_EFFICIENCY), twice the bytes backward;
* every kernel costs KERNEL_LAUNCH_S.

The constants (CONSTANTS) are those milp_plan/calibration.py fitted on published end-to-end
measurements (profiles/calibration/fit.json), starting from engineering estimates
(ESTIMATES); `Constants` carries them through every formula, so the calibration can try
others. The times exclude tensor-parallel collectives, which the cost model adds.
"""
from __future__ import annotations

import datetime as _dt
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable

from milp_plan.cluster import GPU
from milp_plan.model import Model
from milp_plan.profile import Profile, Rows

# The engineering estimates: where the calibration starts (calibration.DEFAULTS)
ESTIMATES = {
    "GEMM_EFFICIENCY": (0.70, "large bf16 GEMMs reach ~70-80% of dense peak in cuBLAS on A100/H100 "
                              "(Megatron-LM reports 52% end-to-end MFU for GPT-3 175B on A100, which "
                              "includes communication and bubbles)"),
    "GEMM_DIM_HALF": (128.0, "matrix dimension at which a GEMM reaches half its large-size efficiency; "
                             "tensor-core tiles are 64-256 wide"),
    "ATTENTION_EFFICIENCY": (0.45, "FlashAttention-2 forward reaches ~50-70% of peak on A100, less on H100 "
                                   "(FlashAttention-2 paper, Dao 2023); causal masking wastes about half"),
    "ATTENTION_BWD_FACTOR": (2.5, "FlashAttention backward recomputes the scores: ~2.5x the forward time"),
    "MEMORY_EFFICIENCY": (0.80, "element-wise kernels reach ~80% of peak memory bandwidth"),
    "KERNEL_LAUNCH_S": (4e-6, "per-kernel launch and tail overhead, a few microseconds"),
}


def _fitted() -> dict[str, float]:
    """The constants milp_plan/calibration.py fitted on published measurements (shipped as
    profiles/calibration/fit.json: its source rows, per-row errors and leave-one-out)."""
    import json
    from milp_plan.resources import shipped_dir
    doc = json.loads((shipped_dir("profiles") / "calibration" / "fit.json").read_text())
    return {k: float(doc["constants"][k]) for k in ESTIMATES}


# The constants every profile is generated with (the shipped analytic-*.csv, and the profiles
# derived on the fly): the fitted ones, with the estimate each started from
CONSTANTS = {k: (v, f"fitted (profiles/calibration/fit.json) from the estimate {ESTIMATES[k][0]:g}: {ESTIMATES[k][1]}")
             for k, v in _fitted().items()}
GEMM_EFFICIENCY = CONSTANTS["GEMM_EFFICIENCY"][0]
GEMM_DIM_HALF = CONSTANTS["GEMM_DIM_HALF"][0]
ATTENTION_EFFICIENCY = CONSTANTS["ATTENTION_EFFICIENCY"][0]
ATTENTION_BWD_FACTOR = CONSTANTS["ATTENTION_BWD_FACTOR"][0]
MEMORY_EFFICIENCY = CONSTANTS["MEMORY_EFFICIENCY"][0]
KERNEL_LAUNCH_S = CONSTANTS["KERNEL_LAUNCH_S"][0]


@dataclass(frozen=True)
class Constants:
    """The efficiency constants every formula below reads (defaults: CONSTANTS); the
    calibration (milp_plan/calibration.py) fits other values and passes them in."""

    gemm_efficiency: float = GEMM_EFFICIENCY
    gemm_dim_half: float = GEMM_DIM_HALF
    attention_efficiency: float = ATTENTION_EFFICIENCY
    attention_bwd_factor: float = ATTENTION_BWD_FACTOR
    memory_efficiency: float = MEMORY_EFFICIENCY
    kernel_launch_s: float = KERNEL_LAUNCH_S

    def as_dict(self) -> dict[str, float]:
        return {k.upper(): v for k, v in asdict(self).items()}


DEFAULT = Constants()   # the fitted constants
ESTIMATE = Constants(**{k.lower(): v for k, (v, _) in ESTIMATES.items()})

TPS = (1, 2, 4, 8)
MICRO_BATCHES = tuple(range(1, 17))


def _gemm_s(gpu: GPU, m: float, n: float, k: float, batch: float = 1.0, c: Constants = DEFAULT) -> float:
    """`batch` independent (m x k) @ (k x n) products in one kernel."""
    d = min(m, n, k)
    phi = d / (d + c.gemm_dim_half)
    compute = batch * 2.0 * m * n * k / (gpu.peak_tflops * 1e12 * c.gemm_efficiency * phi)
    memory = batch * 2.0 * (m * k + k * n + m * n) / (gpu.memory_gb_per_s * 1e9 * c.memory_efficiency)
    return max(compute, memory) + c.kernel_launch_s


def _mem_s(gpu: GPU, n_bytes: float, kernels: int, c: Constants = DEFAULT) -> float:
    return n_bytes / (gpu.memory_gb_per_s * 1e9 * c.memory_efficiency) + kernels * c.kernel_launch_s


def _attention_gemms(model: Model, tokens: float, t: int) -> list[tuple[float, float, float]]:
    h, kv = model.hidden_size, model.kv_size
    return [(tokens, (h + 2 * kv) / t, h), (tokens, h, h / t)]  # QKV projection, output projection


def _mlp_gemms(model: Model, tokens: float, t: int) -> list[tuple[float, float, float]]:
    h, f = model.hidden_size, model.ffn_hidden_size
    up = 2 * f if model.mlp == "swiglu" else f
    return [(tokens, up / t, h), (tokens, h, f / t)]


def flash_core_s(model: Model, gpu: GPU, tp: int, mbs: int, seq: int, c: Constants = DEFAULT) -> tuple[float, float]:
    """(forward, backward) seconds of one fused attention core (FlashAttention-style)."""
    fwd = 4.0 * mbs * seq * seq * model.hidden_size / tp / (gpu.peak_tflops * 1e12 * c.attention_efficiency)
    fwd += c.kernel_launch_s
    return fwd, c.attention_bwd_factor * fwd


def unfused_core_s(model: Model, gpu: GPU, tp: int, mbs: int, seq: int, c: Constants = DEFAULT) -> tuple[float, float]:
    """(forward, backward) seconds of the unfused attention core: QK^T and AV as batched GEMMs,
    softmax and dropout as memory-bound passes over the a s^2 b / t scores (module docstring)."""
    heads = model.num_attention_heads / tp
    d = model.head_dim
    gemms = 2.0 * _gemm_s(gpu, seq, seq, d, batch=mbs * heads, c=c)      # QK^T and AV
    scores = heads * mbs * seq * seq                                     # elements
    softmax_bytes = (2 + 2) * scores
    dropout_bytes = (2 + 2 + 1) * scores if model.dropout else 0.0
    elem = _mem_s(gpu, softmax_bytes + dropout_bytes, 2 if model.dropout else 1, c)
    return gemms + elem, 2.0 * gemms + 2.0 * elem


def layer_cost_s(model: Model, gpu: GPU, kind: str, tp: int, mbs: int, seq: int,
                 flash_attention: bool = True, c: Constants = DEFAULT) -> tuple[float, float, float]:
    """(forward s, backward s, attention-core forward s) for one micro-batch through one layer."""
    tokens = float(mbs * seq)
    h, f, v = model.hidden_size, model.ffn_hidden_size, model.vocab_size
    if kind == "embedding":
        fwd = _mem_s(gpu, tokens * h * 2 * 3, 3, c)         # gather, (+positions), dropout
        return fwd, 2.0 * fwd, 0.0
    if kind == "head":
        gemm = _gemm_s(gpu, tokens, v / tp, h, c=c)
        ce = _mem_s(gpu, tokens * v / tp * 4 * 3, 3, c)      # fp32 softmax cross-entropy passes
        norm = _mem_s(gpu, tokens * h * 2 * 2, 1, c)
        return gemm + ce + norm, 2.0 * gemm + ce + 2.0 * norm, 0.0
    n_attn = 2 if kind == "decoder_block" else 1
    n_norm = 3 if kind == "decoder_block" else 2
    gemms = _attention_gemms(model, tokens, tp) * n_attn + _mlp_gemms(model, tokens, tp)
    gemm_fwd = sum(_gemm_s(gpu, *g, c=c) for g in gemms)
    core_fwd, core_bwd = (flash_core_s if flash_attention else unfused_core_s)(model, gpu, tp, mbs, seq, c)
    core, core_bwd = n_attn * core_fwd, n_attn * core_bwd
    # element-wise bytes: norms (read+write), residual adds (2 reads + write), dropout, activation on f/t
    elem_bytes = 2.0 * tokens * (n_norm * 2 * h + 2 * 3 * h + (3 * h if model.dropout else 0) + 2 * f / tp)
    elem = _mem_s(gpu, elem_bytes, 2 * n_norm + 4, c)
    fwd = gemm_fwd + core + elem
    bwd = 2.0 * gemm_fwd + core_bwd + 2.0 * elem
    return fwd, bwd, core


def valid_tps(model: Model, tps: Iterable[int]) -> list[int]:
    """tp sizes the model admits (Model.tp_violations)."""
    return [t for t in tps if not model.tp_violations(t)]


COLUMNS = ("model", "gpu", "tp", "micro_batch_size", "seq_length", "kind", "fwd_ms", "bwd_ms", "attn_core_fwd_ms")


def generate_table(model: Model, gpus: Iterable[GPU], tps: Iterable[int] = TPS,
                   micro_batches: Iterable[int] = MICRO_BATCHES, seq_lengths: Iterable[int] | None = None,
                   flash_attention: bool = True, c: Constants = DEFAULT) -> Any:
    """generate_rows as a pandas DataFrame."""
    import pandas as pd
    return pd.DataFrame(generate_rows(model, gpus, tps, micro_batches, seq_lengths, flash_attention, c),
                        columns=list(COLUMNS))


def generate_rows(model: Model, gpus: Iterable[GPU], tps: Iterable[int] = TPS,
                  micro_batches: Iterable[int] = MICRO_BATCHES, seq_lengths: Iterable[int] | None = None,
                  flash_attention: bool = True, c: Constants = DEFAULT) -> list[tuple]:
    """One row in COLUMNS order per GPU, valid tp, sequence length, micro-batch size and layer kind."""
    rows = []
    seqs = list(seq_lengths) if seq_lengths is not None else [model.seq_length]
    for gpu in gpus:
        for tp in valid_tps(model, tps):
            for seq in seqs:
                for mbs in micro_batches:
                    for kind in model.kinds():
                        fwd, bwd, core = layer_cost_s(model, gpu, kind, tp, mbs, seq, flash_attention, c)
                        rows.append((model.name, gpu.name, tp, mbs, seq, kind, fwd * 1e3, bwd * 1e3, core * 1e3))
    return rows


def provenance(model: Model, flash_attention: bool = True, c: Constants = DEFAULT) -> dict:
    out = {
        "format": "native",
        "origin": "analytic",
        "model": model.name,
        "generator": "milp_plan.analytic (FLOPs over achieved TFLOP/s, roofline efficiency model)",
        "constants": c.as_dict(),
        "tp_comm_included": False,
        "note": "derived, not measured; regenerate with `python -m milp_plan.analytic`",
    }
    if not flash_attention:   # the shipped files assume flash attention and do not say so
        out["flash_attention"] = False
    return out


def generate_profile(model: Model, gpus: Iterable[GPU], flash_attention: bool = True, c: Constants = DEFAULT,
                     **kw) -> Profile:
    rows = generate_rows(model, gpus, flash_attention=flash_attention, c=c, **kw)

    def frame():   # generate_table's frame
        import pandas as pd
        table = pd.DataFrame(rows, columns=list(COLUMNS))
        table["tp_comm_included"] = False
        return table
    return Profile(Rows(COLUMNS + ("tp_comm_included",), tuple(r + (False,) for r in rows)),
                   [provenance(model, flash_attention, c)], frame=frame)


class Generator:
    """The analytic profile's own formula as a Profile.generator: the cost of any (tp,
    micro-batch, sequence length) point of `model` on the GPUs it was built for."""

    def __init__(self, model: Model, gpus: dict[str, GPU], flash_attention: bool = True,
                 c: Constants = DEFAULT) -> None:
        self.model, self.gpus, self.flash_attention, self.c = model, dict(gpus), flash_attention, c

        self._kinds = frozenset(model.kinds())

    def covers(self, model: str, gpu: str, kind: str) -> bool:
        return gpu in self.gpus and model == self.model.name and kind in self._kinds

    def __call__(self, model: str, gpu: str, tp: int, mbs: int, seq: int, kind: str):
        from milp_plan.profile import LayerCost
        if not self.covers(model, gpu, kind):
            return None
        g = self.gpus[gpu]
        fwd, bwd, core = layer_cost_s(self.model, g, kind, tp, mbs, seq, self.flash_attention, self.c)
        return LayerCost(fwd * 1e3, bwd * 1e3, core * 1e3, None, False)


def shipped_profile_path(model_name: str) -> Path:
    from milp_plan.resources import shipped_dir
    return shipped_dir("profiles") / f"analytic-{model_name}.csv"


def write_shipped_profiles() -> list[Path]:
    """Regenerate profiles/analytic-<model>.csv for every catalog model on every catalog GPU."""
    from milp_plan.cluster import gpu_catalog
    from milp_plan.model import model_catalog
    from milp_plan.profile import write_native
    out = []
    for model in model_catalog().values():
        path = shipped_profile_path(model.name)
        write_native(path, generate_table(model, gpu_catalog().values()), provenance(model))
        out.append(path)
    return out


if __name__ == "__main__":  # pragma: no cover - maintenance entry point
    for p in write_shipped_profiles():
        print(p)
    _ = _dt  # date deliberately not written: regenerated files must be byte-identical
