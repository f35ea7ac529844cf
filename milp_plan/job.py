"""The training job and the objective: what to plan for."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

from milp_plan.errors import InputError
from milp_plan.units import Money

OBJECTIVES = ("min-time", "min-cost", "pareto")
MODES = ("megatron", "free")

# The shipped default job: GPT-3 2.7B, 80 sequences of 2048 tokens per step, on clusters/default.yaml.
# Chosen so that the first-contact command `milp-plan solve --objective min-cost --time-limit 1.2s/step`
# has an interesting answer: the fastest plan (all 32 GPUs) takes 1.074 s/step, the cheapest plan
# within 1.2 s/step (1.183 s) rents the two A100 nodes only, and without the limit one A100 node
# (2.114 s/step, 0.0241 against 0.0269 $/step) would be cheaper still.
DEFAULT_MODEL = "gpt3-2.7b"
DEFAULT_GLOBAL_BATCH = 80
MAX_GLOBAL_BATCH = 2**24   # samples per step; more is refused (micro-batch counts and the simulation grow with it)
MAX_SEQ_LENGTH = 2**20


@dataclass(frozen=True)
class Job:
    """Training settings that are inputs, not decisions.

    memory_headroom: fraction of each GPU's memory kept free for the CUDA context,
    NCCL buffers and allocator fragmentation (0.1 = plan against 90% of capacity).
    flash_attention: the s^2 attention activations are never stored (Megatron-Core with
    Transformer Engine or FlashAttention); False gives Korthikanti et al.'s formulas.
    """

    global_batch_size: int
    seq_length: int
    precision: str = "bf16"
    optimizer: str = "adam"
    flash_attention: bool = True
    memory_headroom: float = 0.10

    def __post_init__(self) -> None:
        from milp_plan.fileio import check_number
        check_number(self.global_batch_size, "global_batch_size", source=None, where="job", integer=True,
                     maximum=MAX_GLOBAL_BATCH)
        check_number(self.seq_length, "seq_length", source=None, where="job", integer=True, maximum=MAX_SEQ_LENGTH)
        for name in ("flash_attention",):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"must be true or false, got {getattr(self, name)!r}", field=name)
        if isinstance(self.memory_headroom, bool) or not isinstance(self.memory_headroom, (int, float)):
            raise InputError(f"must be a number, got {self.memory_headroom!r}", field="memory_headroom")
        if self.precision not in ("bf16", "fp16"):
            raise InputError(f"precision must be bf16 or fp16, got {self.precision!r}", field="precision")
        if self.optimizer != "adam":
            raise InputError(f"only the adam optimizer is modelled, got {self.optimizer!r}", field="optimizer")
        if not 0.0 <= self.memory_headroom < 1.0:
            raise InputError(f"memory headroom must be a fraction in [0, 1), got {self.memory_headroom}",
                             field="memory_headroom")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Job":
        return cls(**dict(data))


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
