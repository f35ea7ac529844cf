"""Plan: solver-free data describing one way to train, and its plan.json format.

A stage is one pipeline rank: tp x dp GPUs of one GPU type, ordered tp fastest then
dp (Megatron's rank order inside a stage), holding blocks
[first_layer, first_layer + num_layers). With an interleaved schedule (vpp > 1) the
stage's layers are split into vpp equal chunks; chunk j of stage s is virtual stage
j*pp + s in model order (see `layer_chunks`). Embedding goes with stage 0, head with the
last stage. A stage's dp replicas may sit on different GPU types (a mixed-type stage, whole
nodes of each; `gpu` then names them all): the slowest replica paces it (costmodel).
"""
from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from milp_plan import schedules
from milp_plan.schedules import OneFOneB
from milp_plan.cluster import MIXED_SEP
from milp_plan.errors import InputError
from milp_plan.fileio import parse_json, read_text, write_atomic

SCHEMA_VERSION = "2"   # 2 adds `phases` (a strategy per length bucket); "1" files still read
READ_VERSIONS = ("1", "2")
TOKEN_SLICES_RUNTIME = ("token slices (TeraPipe) need a runtime that pipelines slices of a sequence with a "
                        "key/value cache across slices; stock Megatron-LM cannot run them")
STATUSES = ("optimal", "feasible", "infeasible", "timeout", "evaluated")


@dataclass(frozen=True)
class Device:
    node: int        # global node index (cluster order)
    local_gpu: int   # GPU index inside the node


@dataclass(frozen=True)
class Stage:
    gpu: str                       # GPU type name; a mixed-type stage joins its types' names by "+" (A100-80GB+A10),
    #                                in the order of its devices (its dp replicas on several GPU types)
    devices: tuple[Device, ...]    # tp x dp devices, tp fastest
    first_layer: int
    num_layers: int
    tp: int
    dp: int
    micro_batch_size: int          # samples per dp replica per micro-batch
    recompute: str = "none"        # none | selective | full
    recompute_layers: int = 0      # full: layers of this stage recomputed (0..num_layers)

    @property
    def mixed_type(self) -> bool:
        """Its dp replicas sit on several GPU types (`gpu` joins their names)."""
        return MIXED_SEP in self.gpu


@dataclass(frozen=True)
class StagePrediction:
    fwd_ms: float                  # per micro-batch, whole stage (incl. tp collectives)
    bwd_ms: float                  # incl. recompute
    weights_gib: float
    gradients_gib: float
    optimizer_gib: float
    activations_gib: float
    peak_memory_gib: float
    capacity_gib: float            # usable: GPU memory x (1 - memory headroom)
    inflight_microbatches: float


@dataclass(frozen=True)
class Prediction:
    step_time_s: float
    compute_s: float               # m x bottleneck stage (fwd + bwd) per micro-batch
    bubble_s: float                # pipeline fill and drain
    p2p_s: float                   # point-to-point transfers on the critical path
    dp_allreduce_s: float          # data-parallel gradient reduction, not overlapped
    optimizer_s: float
    usd_per_hour: float
    usd_per_step: float
    tokens_per_s: float
    stages: tuple[StagePrediction, ...]
    step_basis: str = "closed-form"  # simulated (the simulator's longest path) | closed-form (predict.py)


@dataclass(frozen=True)
class SolverRecord:
    backend: str
    status: str                    # optimal | feasible | infeasible | timeout | evaluated
    objective: float | None
    best_bound: float | None
    gap: float | None
    wall_time_s: float | None = None
    seed: int | None = None


@dataclass(frozen=True)
class ProfileFill:
    """A profile point the plan's times rest on that no profile measured or generated: the
    fill rule of profile.py that supplied it (only with --extrapolate)."""

    gpu: str
    tp: int
    micro_batch_size: int
    seq_length: int
    kind: str
    how: str


def fewest_micro_batches(plan: "Plan", sequences: int) -> int | None:
    """The fewest micro-batches of `plan`'s samples that hold `sequences` (the last padded) and
    that its schedule runs (interleaving may want a multiple of pp: up to pp - 1 more); 0 for
    no sequence; None when no count up to that runs."""
    if sequences == 0:
        return 0
    samples = plan.global_batch_size // plan.num_microbatches
    least = -(-sequences // samples)
    sched = schedules.schedule_of(plan.schedule, plan.vpp)
    for m in range(least, least + plan.pp):
        try:
            sched.check_runtime(plan.pp, m)
        except InputError:
            continue
        return m
    return None


def transitions(strategies) -> list[tuple[int, int, int]]:
    """(after index i, from, to) of every change of strategy around the step's cycle: after
    the last comes the next step's first."""
    n = len(strategies)
    return [(i, strategies[i], strategies[(i + 1) % n]) for i in range(n)
            if n > 1 and strategies[i] != strategies[(i + 1) % n]]


def one_run_each(strategies) -> bool:
    """Each strategy is entered at most once around the cycle: its items are one run."""
    entered = [b for _, _, b in transitions(strategies)]
    return len(entered) == len(set(entered))


def segments(strategies) -> list[tuple[int, int]]:
    """(first, last) index of each maximal run of one strategy in step order: a segment of a
    step in phases, which pays one pipeline fill (the step's optimizer barrier cuts a run
    through the wrap to the next step in two)."""
    out, start = [], 0
    for i in range(1, len(strategies) + 1):
        if i == len(strategies) or strategies[i] != strategies[start]:
            out.append((start, i - 1))
            start = i
    return out


@dataclass(frozen=True)
class Phase:
    """One length bucket of a step whose sequence lengths vary (hot switching, HotSPa): its
    sequences, each padded to `edge` tokens, run under strategy `strategy`, whose layout on
    this bucket is `plan` (its rows as the global batch, its micro-batches, its inputs)."""
    edge: int
    sequences: int
    tokens: int                    # before padding
    strategy: int                  # index into Phases.strategies
    plan: "Plan"
    time_s: float                  # steady work: fill, reduction and optimizer excluded
    fill_s: float                  # the pipeline fill and drain at this bucket's rows


@dataclass(frozen=True)
class Phases:
    """A step in phases (formulations/switching.md): the buckets in step order (shortest
    first), the strategies' labels, the home layout that holds the optimizer state and runs
    the once-a-step reduction and optimizer step, and the switch costs between layouts."""
    phases: tuple[Phase, ...]
    strategies: tuple[str, ...]
    home: int
    home_time_s: float
    switch_s: tuple[tuple[float, ...], ...]     # [from strategy][to strategy], seconds
    lengths: Mapping[str, Any]                  # source, sequences, tokens, longest, counts [[length, n], ...]
    edges: str                                  # "chosen" by the model | "given" (--buckets) | "default"
    scope: str                                  # what `optimal` covers
    static: Mapping[str, Any] | None = None     # the best single strategy: {"strategy": label, "step_time_s": s}
    gain: float | None = None                   # 1 - step / static step
    break_even_factor: float | str | None = None  # the switch-cost factor at which switching stops paying
    #                                               (None: it never pays; "never": it pays at any factor)

    def segments(self) -> list[tuple[int, int]]:
        """(first, last) phase of each segment (`segments`)."""
        return segments([ph.strategy for ph in self.phases])

    def switches(self) -> list[tuple[int, int, float]]:
        """(after phase i, to strategy, seconds) of every change of layout around the step's
        cycle, the wrap to the next step's first phase included."""
        return [(i, b, self.switch_s[a][b]) for i, a, b in transitions([ph.strategy for ph in self.phases])]

    def to_dict(self) -> dict[str, Any]:
        return {"edges": self.edges, "scope": self.scope, "lengths": copy.deepcopy(dict(self.lengths)),
                "rows": "each sequence padded to its bucket's edge",
                "strategies": list(self.strategies), "home": self.home, "home_time_s": self.home_time_s,
                "switch_s": [list(r) for r in self.switch_s],
                "switches": [{"after_phase": i, "to_strategy": k, "seconds": t} for i, k, t in self.switches()],
                "static": None if self.static is None else dict(self.static), "gain": self.gain,
                "break_even_factor": self.break_even_factor,
                "phases": [{"edge": ph.edge, "sequences": ph.sequences, "tokens": ph.tokens,
                            "strategy": ph.strategy, "time_s": ph.time_s, "fill_s": ph.fill_s,
                            "plan": ph.plan.to_dict()} for ph in self.phases]}


@dataclass(frozen=True)
class Plan:
    stages: tuple[Stage, ...]
    global_batch_size: int
    num_microbatches: int
    schedule: str = OneFOneB.name
    vpp: int = 1                   # virtual stages per rank (interleaved only)
    distributed_optimizer: bool = False
    sequence_parallel: bool = False
    mode: str = "megatron"
    predicted: Prediction | None = None
    solver: SolverRecord | None = None
    inputs: Mapping[str, Any] = field(default_factory=dict)
    profile_fills: tuple[ProfileFill, ...] = ()   # filled profile points the plan uses (--extrapolate)
    slices: tuple[int, ...] = ()   # token slices (TeraPipe): tokens per slice of each sequence; () = not sliced
    phases: Phases | None = None   # a strategy per length bucket (hot switching); the top level is then the
    #                                home layout at its own bucket, `predicted` the whole step

    @property
    def pp(self) -> int:
        return len(self.stages)

    @property
    def num_gpus(self) -> int:
        return sum(len(s.devices) for s in self.stages)

    @property
    def micro_batch_size(self) -> int:
        """Megatron's --micro-batch-size (per dp replica) when uniform, else the first stage's."""
        return self.stages[0].micro_batch_size

    def uniform(self, attr: str) -> bool:
        return len({getattr(s, attr) for s in self.stages}) == 1

    def with_schedule(self, schedule: str, vpp: int) -> "Plan":
        """The same stages and layer counts under another schedule: first_layer laid out
        again (contiguous for vpp 1; stage s's first chunk after chunk 0 of stages < s when
        interleaved). The prediction is dropped."""
        starts, acc = [], 0
        for st in self.stages:
            starts.append(acc)
            acc += st.num_layers // vpp
        stages = tuple(replace(st, first_layer=a) for st, a in zip(self.stages, starts))
        return self.with_(schedule=schedule, vpp=vpp, stages=stages, predicted=None)

    def layer_chunks(self, stage: int) -> list[tuple[int, int]]:
        """(first_layer, num_layers) of each model chunk of `stage`, in model order."""
        if self.vpp <= 1:
            s = self.stages[stage]
            return [(s.first_layer, s.num_layers)]
        sizes = [s.num_layers // self.vpp for s in self.stages]
        out, start = {}, 0
        for j in range(self.vpp):
            for i in range(self.pp):
                out[(i, j)] = (start, sizes[i])
                start += sizes[i]
        return [out[(stage, j)] for j in range(self.vpp)]

    def megatron_incompatibilities(self) -> list[str]:
        reasons = []
        attrs = [("tp", "tensor-parallel size"), ("dp", "data-parallel size"),
                 ("micro_batch_size", "micro-batch size"), ("recompute", "recompute granularity")]
        if not all(s.recompute == "full" and s.recompute_layers == s.num_layers for s in self.stages):
            attrs.append(("recompute_layers", "number of recomputed layers"))  # else: uniform method, all layers
        for attr, what in attrs:
            if not self.uniform(attr):
                reasons.append(f"{what} differs between stages ({', '.join(str(getattr(s, attr)) for s in self.stages)})")
        fork = schedules.schedule_of(self.schedule, self.vpp).needs_fork if schedules.known(self.schedule) else None
        if fork:
            reasons.append(fork)
        if self.slices:
            reasons.append(TOKEN_SLICES_RUNTIME)
        return reasons

    # ---- JSON ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = {
            "schema_version": SCHEMA_VERSION,
            "mode": self.mode,
            "global_batch_size": self.global_batch_size,
            "micro_batch_size": self.micro_batch_size,
            "num_microbatches": self.num_microbatches,
            "schedule": self.schedule,
            "vpp": self.vpp,
            **({"slices": list(self.slices)} if self.slices else {}),
            "distributed_optimizer": self.distributed_optimizer,
            "sequence_parallel": self.sequence_parallel,
            "stages": [dict(asdict(s), devices=[asdict(d) for d in s.devices]) for s in self.stages],
            "megatron_compatible": not self.megatron_incompatibilities(),
            "needs_per_stage_runtime": self.megatron_incompatibilities(),
            "predicted": None if self.predicted is None else asdict(self.predicted),
            "solver": None if self.solver is None else asdict(self.solver),
            "inputs": copy.deepcopy(dict(self.inputs)),
            "profile_fills": [asdict(f) for f in self.profile_fills],
            **({"phases": self.phases.to_dict()} if self.phases is not None else {}),
        }
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False, allow_nan=False) + "\n"

    def with_(self, **changes: Any) -> "Plan":
        return replace(self, **changes)


def schema() -> dict[str, Any]:
    return json.loads((Path(__file__).parent / "plan.schema.json").read_text())


def plan_from_dict(d: Mapping[str, Any], source: str = "plan") -> Plan:
    import jsonschema
    if not isinstance(d, Mapping) or "schema_version" not in d:
        raise InputError("not a milp-plan plan (no schema_version); make one with `milp-plan solve`", source=source)
    if str(d["schema_version"]) not in READ_VERSIONS:
        raise InputError(f"plan schema_version {d['schema_version']!r} is not supported (this milp-plan reads "
                         f"{', '.join(READ_VERSIONS)}); re-solve with this version", source=source,
                         field="schema_version")
    try:
        jsonschema.validate(d, schema())
    except jsonschema.ValidationError as exc:
        path = ".".join(str(p) for p in exc.absolute_path) or "(top level)"
        raise InputError(f"{exc.message}", source=source, field=path) from None
    return _plan(d)


def _phases(d: Mapping[str, Any]) -> Phases:
    return Phases(phases=tuple(Phase(edge=ph["edge"], sequences=ph["sequences"], tokens=ph["tokens"],
                                     strategy=ph["strategy"], plan=_plan(ph["plan"]), time_s=ph["time_s"],
                                     fill_s=ph["fill_s"]) for ph in d["phases"]),
                  strategies=tuple(d["strategies"]), home=d["home"], home_time_s=d["home_time_s"],
                  switch_s=tuple(tuple(r) for r in d["switch_s"]), lengths=d["lengths"], edges=d["edges"],
                  scope=d["scope"], static=d.get("static"), gain=d.get("gain"),
                  break_even_factor=d.get("break_even_factor"))


def _plan(d: Mapping[str, Any]) -> Plan:
    """A schema-valid plan dict as a Plan."""
    stages = tuple(Stage(**{**s, "devices": tuple(Device(**dv) for dv in s["devices"])}) for s in d["stages"])
    pred = d.get("predicted")
    if pred is not None:
        pred = Prediction(**{**pred, "stages": tuple(StagePrediction(**sp) for sp in pred["stages"])})
    solver = d.get("solver")
    return Plan(stages=stages, global_batch_size=d["global_batch_size"], num_microbatches=d["num_microbatches"],
                schedule=d["schedule"], vpp=d["vpp"], distributed_optimizer=d["distributed_optimizer"],
                sequence_parallel=d["sequence_parallel"], mode=d["mode"], predicted=pred,
                solver=None if solver is None else SolverRecord(**solver), inputs=d.get("inputs") or {},
                profile_fills=tuple(ProfileFill(**f) for f in d.get("profile_fills") or ()),
                slices=tuple(d.get("slices") or ()),
                phases=None if d.get("phases") is None else _phases(d["phases"]))


def read_plan(path: str | Path) -> Plan:
    return plan_from_dict(parse_json(read_text(path, "plan file"), str(path)), str(path))


def write_plan(path: str | Path, plan: Plan) -> None:
    write_atomic(path, plan.to_json())
