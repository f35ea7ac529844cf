"""The training job and the objective: what to plan for."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

from milp_plan.errors import InputError
from milp_plan.units import Money

OBJECTIVES = ("min-time", "min-cost", "pareto")
MODES = ("megatron", "free")

# The shipped default job: GPT-3 2.7B, 80 sequences of 2048 tokens per step, on clusters/default.yaml.
# Chosen so that the first-contact command `milp-plan solve --objective min-cost --time-limit 1.4s/step`
# has an interesting answer: the fastest plan (all 32 GPUs) takes 1.231 s/step, the cheapest plan
# within 1.4 s/step (1.306 s) rents the two A100 nodes only, and without the limit one A100 node
# (2.247 s/step, 0.0256 against 0.0297 $/step) would be cheaper still.
DEFAULT_MODEL = "gpt3-2.7b"
DEFAULT_GLOBAL_BATCH = 80
MAX_GLOBAL_BATCH = 2**24   # samples per step; more is refused (micro-batch counts and the simulation grow with it)
MAX_SEQ_LENGTH = 2**20


PRECISIONS = ("bf16", "fp16")
REFUSED_PRECISIONS = {"fp8": "fp8 is not modelled (its GEMM speed, the bf16 GEMMs it leaves, and Transformer "
                             "Engine's scaling state are not calibrated); use bf16 or fp16"}
GRAD_REDUCE_DTYPES = ("fp32", "bf16", "fp16")
# bytes per element of a gradient kept and reduced in each dtype
DTYPE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0}
# communication overlapped with compute (Megatron-LM flags of the same names); off by default
OVERLAP_FIELDS = ("overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap")


@dataclass(frozen=True)
class Job:
    """Training settings that are inputs, not decisions.

    global_batch_size: sequences per step; seq_length: tokens per sequence.
    precision: bf16 | fp16 weights and activations (fp8 is refused: not modelled).
    flash_attention: the s^2 attention activations are never stored and the attention core
    is one fused kernel (Megatron-Core with Transformer Engine or FlashAttention); False gives
    Korthikanti et al.'s formulas (the 5as/h term) and the unfused attention's time.
    grad_reduce_dtype: the dtype of the gradient buffer that data parallelism reduces: fp32
    (Megatron's default with bf16, `--accumulate-allreduce-grads-in-fp32`) or the 2-byte
    training dtype (`--grad-reduce-in-bf16`, or fp16 gradients with --fp16): half the bytes.
    distributed_optimizer: whether the planner may shard the optimizer state over data
    parallelism (`--use-distributed-optimizer`); False removes it from the search space.
    memory_headroom: fraction of each GPU's memory kept free for the CUDA context,
    NCCL buffers and allocator fragmentation (0.1 = plan against 90% of capacity).
    overlap_grad_reduce: data parallelism reduces each gradient bucket during the last
    micro-batch's backward (`--overlap-grad-reduce`); overlap_param_gather: the distributed
    optimizer's parameter all-gather runs under the next step's forward
    (`--overlap-param-gather`); tp_comm_overlap: the tensor-parallel collectives run under the
    GEMMs they feed or follow (`--tp-comm-overlap`, Transformer Engine, with sequence
    parallelism). All three off by default, as in Megatron; costmodel.overlapped_s is the rule.
    """

    global_batch_size: int
    seq_length: int
    precision: str = "bf16"
    optimizer: str = "adam"
    flash_attention: bool = True
    memory_headroom: float = 0.10
    grad_reduce_dtype: str = "fp32"
    distributed_optimizer: bool = True
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    tp_comm_overlap: bool = False

    def __post_init__(self) -> None:
        from milp_plan.fileio import check_number
        check_number(self.global_batch_size, "global_batch_size", source=None, where="job", integer=True,
                     maximum=MAX_GLOBAL_BATCH)
        check_number(self.seq_length, "seq_length", source=None, where="job", integer=True, maximum=MAX_SEQ_LENGTH)
        for name in ("flash_attention", "distributed_optimizer") + OVERLAP_FIELDS:
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"must be true or false, got {getattr(self, name)!r}", field=name)
        if isinstance(self.memory_headroom, bool) or not isinstance(self.memory_headroom, (int, float)):
            raise InputError(f"must be a number, got {self.memory_headroom!r}", field="memory_headroom")
        if self.precision in REFUSED_PRECISIONS:
            raise InputError(REFUSED_PRECISIONS[self.precision], field="precision")
        if self.precision not in PRECISIONS:
            raise InputError(f"precision must be bf16 or fp16, got {self.precision!r}", field="precision")
        if self.optimizer != "adam":
            raise InputError(f"only the adam optimizer is modelled, got {self.optimizer!r}", field="optimizer")
        if not 0.0 <= self.memory_headroom < 1.0:
            raise InputError(f"memory headroom must be a fraction in [0, 1), got {self.memory_headroom}",
                             field="memory_headroom")
        if self.overlap_param_gather and not (self.overlap_grad_reduce and self.distributed_optimizer):
            raise InputError("overlap_param_gather overlaps the distributed optimizer's all-gather, and Megatron "
                             "needs overlap_grad_reduce with it: set overlap_grad_reduce and distributed_optimizer "
                             "true, or overlap_param_gather false", field="overlap_param_gather")
        if self.grad_reduce_dtype not in ("fp32", self.precision):
            raise InputError(f"with precision {self.precision} gradients are reduced in fp32 or "
                             f"{self.precision}, got {self.grad_reduce_dtype!r}", field="grad_reduce_dtype")

    @property
    def grad_bytes(self) -> float:
        """Bytes per gradient element in the buffer data parallelism reduces."""
        return DTYPE_BYTES[self.grad_reduce_dtype]

    @property
    def global_batch_tokens(self) -> int:
        return self.global_batch_size * self.seq_length

    def to_dict(self) -> dict[str, Any]:
        """The record of plan.json's inputs.job; an overlap setting is written only when on, so
        plans of jobs without overlap read as they did before these settings existed."""
        return {k: v for k, v in asdict(self).items() if k not in OVERLAP_FIELDS or v}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Job":
        """A recorded job (plan.json inputs.job); plans written before a field existed get its default."""
        return cls(**dict(data))


JOB_FILE_FIELDS = ("global_batch", "global_batch_tokens", "seq_length", "precision", "optimizer", "flash_attention",
                   "grad_reduce_dtype", "distributed_optimizer", "memory_headroom") + OVERLAP_FIELDS
LENGTH_FIELDS = ("lengths", "buckets")   # variable lengths (solve --lengths, --buckets): load_job_lengths


@dataclass(frozen=True)
class JobSettings:
    """What a job file and the command-line flags say; None = not said (the flag overrides the
    file, the file overrides the default). `resolve` turns it into a Job once the model (the
    default sequence length) is known."""

    global_batch: int | None = None
    global_batch_tokens: int | None = None
    seq_length: int | None = None
    precision: str | None = None
    optimizer: str | None = None
    flash_attention: bool | None = None
    grad_reduce_dtype: str | None = None
    distributed_optimizer: bool | None = None
    memory_headroom: float | None = None
    overlap_grad_reduce: bool | None = None
    overlap_param_gather: bool | None = None
    tp_comm_overlap: bool | None = None
    source: str | None = None      # the job file, for error messages
    from_file: frozenset = frozenset()   # the fields the job file set (and no flag overrode)

    def over(self, base: "JobSettings") -> "JobSettings":
        """These settings, with `base` filling what these leave unsaid; a batch in sequences
        and one in tokens are one setting (the later one wins)."""
        meta = ("source", "from_file")
        mine = {k: v for k, v in asdict(self).items() if v is not None and k not in meta}
        if "global_batch" in mine or "global_batch_tokens" in mine:
            mine.setdefault("global_batch", None)
            mine.setdefault("global_batch_tokens", None)
        kept = frozenset(k for k, v in asdict(base).items() if v is not None and k not in meta and k not in mine)
        return JobSettings(**{**asdict(base), **mine, "source": base.source or self.source,
                              "from_file": kept if base.source else frozenset()})

    def resolve(self, default_seq_length: int) -> Job:
        seq = self.seq_length if self.seq_length is not None else default_seq_length
        where = {"source": self.source} if self.source and self.from_file & {"global_batch",
                                                                              "global_batch_tokens"} else {}
        if self.global_batch is not None and self.global_batch_tokens is not None:
            raise InputError("give the global batch in sequences (global_batch) or in tokens "
                             "(global_batch_tokens), not both", field="global_batch_tokens", **where)
        gbs = self.global_batch if self.global_batch is not None else DEFAULT_GLOBAL_BATCH
        if self.global_batch_tokens is not None:
            if isinstance(self.global_batch_tokens, bool) or not isinstance(self.global_batch_tokens, int) \
                    or self.global_batch_tokens <= 0 or self.global_batch_tokens % seq:
                raise InputError(f"must be a positive multiple of the sequence length {seq} (whole sequences), "
                                 f"got {self.global_batch_tokens!r}", field="global_batch_tokens", **where)
            gbs = self.global_batch_tokens // seq
        kw = {k: getattr(self, k) for k in ("precision", "optimizer", "flash_attention", "grad_reduce_dtype",
                                            "distributed_optimizer", "memory_headroom") + OVERLAP_FIELDS
              if getattr(self, k) is not None}
        try:
            return Job(global_batch_size=gbs, seq_length=seq, **kw)
        except InputError as exc:   # name the job file when the field came from it
            field = {"global_batch_size": "global_batch"}.get(exc.field or "", exc.field)
            if self.source and not exc.source and (field in self.from_file or (
                    field == "global_batch" and "global_batch_tokens" in self.from_file)):
                raise InputError(str(exc), source=self.source) from None
            raise


OVERLAP_NAMES = {"grad-reduce": "overlap_grad_reduce", "param-gather": "overlap_param_gather",
                 "tp-comm": "tp_comm_overlap"}


def parse_overlap(text: str | None) -> dict[str, bool]:
    """--overlap grad-reduce,param-gather,tp-comm (or none) as job settings: each named one on,
    the others off; None (not given): nothing said (the job file or the defaults decide)."""
    if text is None:
        return {}
    names = [t.strip() for t in text.split(",") if t.strip()]
    if names == ["none"]:
        names = []
    bad = [n for n in names if n not in OVERLAP_NAMES]
    if bad or not text.strip():
        raise InputError(f"'{bad[0] if bad else text}' is not an overlap; give a comma-separated list of "
                         f"{', '.join(OVERLAP_NAMES)}, or none", field="overlap")
    return {field: key in names for key, field in OVERLAP_NAMES.items()}


def load_job_file(path: str) -> JobSettings:
    """A job YAML: a mapping of JOB_FILE_FIELDS (each optional), e.g.

        global_batch_tokens: 4194304    # or global_batch: 2048 (sequences)
        seq_length: 2048
        precision: bf16
        flash_attention: false
        grad_reduce_dtype: bf16
        distributed_optimizer: true     # allowed (the planner uses it wherever dp > 1)
        memory_headroom: 0.1
        overlap_grad_reduce: true       # Megatron's --overlap-grad-reduce (and the two below)
        overlap_param_gather: true
        tp_comm_overlap: true
    """
    from milp_plan.fileio import check_fields, check_number, load_yaml
    data = load_yaml(path, "job file")
    if data is None:
        data = {}
    check_fields(data, source=str(path), where="job", required=(), optional=JOB_FILE_FIELDS + LENGTH_FIELDS)
    out: dict[str, Any] = {}
    for key in ("global_batch", "global_batch_tokens", "seq_length"):
        if data.get(key) is not None:
            out[key] = check_number(data[key], key, source=str(path), where="job", integer=True)
    if data.get("memory_headroom") is not None:
        out["memory_headroom"] = check_number(data["memory_headroom"], "memory_headroom", source=str(path),
                                              where="job", allow_zero=True)
    for key, choices in (("precision", PRECISIONS), ("optimizer", ("adam",)), ("grad_reduce_dtype", GRAD_REDUCE_DTYPES)):
        v = data.get(key)
        if v is None:
            continue
        if key == "precision" and v in REFUSED_PRECISIONS:
            raise InputError(f"job: field '{key}': {REFUSED_PRECISIONS[v]}", source=str(path))
        if v not in choices:
            raise InputError(f"job: field '{key}' must be {' or '.join(choices)}, got {v!r}", source=str(path))
        out[key] = v
    for key in ("flash_attention", "distributed_optimizer") + OVERLAP_FIELDS:
        v = data.get(key)
        if v is not None and not isinstance(v, bool):
            raise InputError(f"job: field '{key}' must be true or false, got {v!r}", source=str(path))
        if v is not None:
            out[key] = v
    return JobSettings(**out, source=str(path), from_file=frozenset(out))


@dataclass(frozen=True)
class Objective:
    """What to optimise and under which limits.

    min-time: minimise seconds per step, optionally under a budget ($/h or $/step).
    min-cost: minimise dollars per step under a step-time limit.
    pareto:   the exact front of step time against dollars per step.
    """

    kind: str = "min-time"
    time_limit_s: float | None = None
    budget: Money | None = None
    mode: str = "megatron"

    def __post_init__(self) -> None:
        if self.kind not in OBJECTIVES:
            raise InputError(f"objective must be one of {', '.join(OBJECTIVES)}, got {self.kind!r}", field="objective")
        if self.mode not in MODES:
            raise InputError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}", field="mode")
        if self.kind == "min-cost" and self.time_limit_s is None:
            raise InputError("min-cost needs a step-time limit; add --time-limit 1.2s/step", field="time-limit")
        if self.time_limit_s is not None:
            from milp_plan.units import check_duration_s
            check_duration_s(self.time_limit_s, field="time-limit")
        if self.budget is not None:
            from milp_plan.units import check_money
            check_money(self.budget, field="budget")

    def limits(self) -> "Limits":
        """The limits of one solve of this objective (a Pareto sweep sets its own per point)."""
        per_h = self.budget.usd if (self.budget and self.budget.per == "h") else None
        per_step = self.budget.usd if (self.budget and self.budget.per == "step") else None
        if self.kind == "min-cost" and self.budget is not None:
            raise InputError("min-cost minimises the budget itself; drop --budget or use --objective min-time",
                             field="budget")
        return Limits("min-cost" if self.kind == "min-cost" else "min-time", self.time_limit_s, per_h, per_step)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "time_limit_s": self.time_limit_s, "mode": self.mode,
                "budget": None if self.budget is None else {"usd": self.budget.usd, "per": self.budget.per}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Objective":
        b = data.get("budget")
        return cls(kind=data.get("kind", "min-time"), time_limit_s=data.get("time_limit_s"),
                   budget=None if b is None else Money(float(b["usd"]), str(b["per"])),
                   mode=data.get("mode", "megatron"))


@dataclass(frozen=True)
class Limits:
    """One solve's objective and limits, in the cost model's units (s, $/h, $/step): what
    `Objective` (what the user asked, with a pareto kind and a budget in either unit) becomes
    for each solve (`Objective.limits`; a Pareto sweep makes one per point)."""

    objective: str = "min-time"          # min-time | min-cost
    time_limit_s: float | None = None
    budget_usd_per_hour: float | None = None
    budget_usd_per_step: float | None = None

    def admit(self, plan) -> bool:
        """The plan fits in memory and meets every limit, by the cost model's numbers
        (plan.predicted), never a model's."""
        p = plan.predicted
        if any(sp.peak_memory_gib > sp.capacity_gib * (1 + 1e-9) for sp in p.stages):
            return False
        if self.time_limit_s is not None and p.step_time_s > self.time_limit_s:
            return False
        if self.budget_usd_per_hour is not None and p.usd_per_hour > self.budget_usd_per_hour:
            return False
        return self.budget_usd_per_step is None or p.usd_per_step <= self.budget_usd_per_step


def load_job_lengths(path: str) -> tuple[str | None, str | None]:
    """A job file's `lengths` (a CSV path, relative to the job file, or lognormal:...) and
    `buckets` (a list of edges) as `--lengths` and `--buckets` would give them; (None, None)
    when it has none. A job with lengths takes its sequence lengths from them, so it may not
    also set seq_length; a global batch rescales the distribution (workload.scaled)."""
    from pathlib import Path
    from milp_plan.fileio import load_yaml
    data = load_yaml(path, "job file") or {}
    lengths, buckets = data.get("lengths"), data.get("buckets")
    if lengths is None:
        if buckets is not None:
            raise InputError("job: field 'buckets' splits a length distribution; add 'lengths'", source=str(path))
        return None, None
    if not isinstance(lengths, str) or not lengths:
        raise InputError(f"job: field 'lengths' must be a CSV path or lognormal:MEAN:CAP:SEQUENCES, got {lengths!r}",
                         source=str(path))
    if data.get("seq_length") is not None:
        raise InputError("job: field 'seq_length' conflicts with 'lengths': the distribution gives the sequence "
                         "lengths; drop it", source=str(path))
    if buckets is not None and (not isinstance(buckets, list) or not buckets
                                or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in buckets)):
        raise InputError(f"job: field 'buckets' must be a list of bucket edges in tokens, e.g. [2048, 8192], "
                         f"got {buckets!r}", source=str(path))
    if not lengths.startswith("lognormal:") and not Path(lengths).is_absolute():
        lengths = str(Path(path).parent / lengths)
    return lengths, None if buckets is None else ",".join(map(str, buckets))
