"""The global choices the planner enumerates around the per-stage models, and --fix.

A `Config` fixes what every stage of a pipeline shares: the samples per micro-batch B (so
the micro-batch count m = global batch / B), the pipeline depth pp, the schedule with its
virtual-stage count, sequence parallelism, the distributed optimizer, and the stage size
(GPUs per stage) of each node type, which may still be open. Each stage then picks one of
the config's `StageOption`s: node type, tp, dp (B / dp samples per replica) and recompute
granularity, with its own number of recomputed layers. Megatron-compatible mode is a
restriction of it (`Uniform`): one tp, dp, micro-batch size and recompute for all stages,
so one option per node type. `stage_options` lists the options of every config, so the
models, the heuristics and the brute force read one definition of the space.

The space (formulations/pipeline.md, "Decision spaces"): tp over the sizes that divide a
node's GPU count (a tp group stays in one node) and pass the heads rule; every micro-batch
size that divides the batch; pp up to the layers; the schedules 1f1b, GPipe and
interleaved with every vpp >= 2 that gives each stage a whole number of chunks
(pp x vpp <= L) when m % pp == 0. ZB-H1 is out (it needs the zero-bubble fork).

Profile coverage: a (GPU, tp, micro-batch) point is *covered* when the profile measured it
for every layer kind the model has at the job's sequence length, or when the profile is
analytic (it generates every point). Unless the fix dict holds `extrapolate`, a stage
option runs only on covered points, so a plan never rests on a filled (extrapolated)
time. `tp<=`, `mbs<=` (from --fix, --max-tp, --max-micro-batch) cap the space.

Dominance, used to keep the space small unless --fix says otherwise: in the cost model
sequence parallelism never costs time and saves memory and p2p bytes, so it is on
whenever tp > 1; the distributed optimizer never costs time and saves memory and
communication, so it is on whenever dp > 1.
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, replace
from typing import Iterator

from milp_plan import schedules
from milp_plan.schedules import OneFOneB
from milp_plan.analytic import valid_tps
from milp_plan.cluster import MixedNodeType, NodeType, gpu_names
from milp_plan.errors import InputError
from milp_plan.instance import Instance

SCHEDULES = schedules.MODELLED  # what `solve` searches by default (ZB-H1 needs a fork)


def tp_sizes(inst: Instance, fix: dict[str, object] | None = None) -> list[int]:
    """tp sizes a stage may use: a divisor of some node type's GPU count (a tp group stays in
    one node, and a stage packs into whole nodes or divides one), the heads rule, --fix tp
    or tp<= (--max-tp)."""
    fix = fix or {}
    if "tp" in fix:
        cands = [int(fix["tp"])]
    else:
        gpns = {nt.gpus_per_node for nt in inst.cluster.node_types}
        cands = [t for t in range(1, max(gpns) + 1) if any(g % t == 0 for g in gpns)]
    cap = fix.get("tp<=")
    return valid_tps(inst.model, [t for t in cands if cap is None or t <= cap])


def micro_batch_sizes(limit: int, fix: dict[str, object] | None = None) -> list[int]:
    """Micro-batch sizes 1..limit (the caller keeps those dividing its batch), or --fix mbs,
    capped by mbs<= (--max-micro-batch)."""
    fix = fix or {}
    cands = [int(fix["mbs"])] if "mbs" in fix else range(1, limit + 1)
    cap = fix.get("mbs<=")
    return [b for b in cands if b <= limit and (cap is None or b <= cap)]


def covered(inst: Instance, gpu: str, tp: int, mbs: int, fix: dict[str, object] | None = None) -> bool:
    """The profile measured (gpu, tp, mbs) for every layer kind at the job's sequence length,
    or generates it (analytic), or --extrapolate lets the profile's fill rules supply it."""
    if fix and fix.get("extrapolate"):
        return True
    return all(inst.profile.provides(inst.model.name, g, tp, mbs, inst.job.seq_length, _kinds(inst.model))
               for g in gpu_names(gpu))


@functools.lru_cache(maxsize=64)
def _kinds(model) -> tuple[str, ...]:
    """model.kinds(), memoised (it scans every layer; `covered` asks per stage option)."""
    return tuple(model.kinds())


OPEN = -1  # Config.sizes: this node type's stage size is still open (a node of the free search tree)


@dataclass(frozen=True)
class Uniform:
    """Megatron mode's restriction of a config: every stage runs tp x dp GPUs, the same
    micro-batch size per dp replica and recompute granularity (and, under full recompute,
    the same recomputed-layer count)."""

    tp: int
    dp: int
    mbs: int
    recompute: str        # none | selective | full

    @property
    def group(self) -> int:
        """GPUs per stage."""
        return self.tp * self.dp


@dataclass(frozen=True)
class Config:
    """What every stage of a pipeline shares; each stage picks one of `stage_options(inst, cfg)`.

    samples: B, samples per micro-batch (micro-batch size x dp of every stage), so the
    micro-batch count is m = global batch / B; pp, the schedule with its vpp, and the two
    global switches. `sizes` gives each node type (cluster order) its stage size, GPUs per
    stage: every stage on that type has that many GPUs, split per stage into tp x dp; a type
    of size 0 hosts no stage, a type with a size at least one. OPEN leaves a type's size open:
    such a config stands for all its completions (`free_children` branches on one open type);
    the driver bounds it to decide whether to expand it, and never solves it.

    `uniform` (Megatron mode, --mode megatron) restricts every stage to one tp, dp,
    micro-batch size and recompute: each node type then has one stage option, of size tp x dp,
    and hosts any number of stages, none included. Without it (--mode free) each stage
    chooses its own tp, dp and recompute among the options of its node type's size."""

    samples: int
    pp: int
    schedule: str = OneFOneB.name
    vpp: int = 1
    sequence_parallel: bool = True
    distributed_optimizer: bool = True
    sizes: tuple[int, ...] = ()
    uniform: Uniform | None = None

    @classmethod
    def megatron(cls, tp: int, dp: int, mbs: int, pp: int, recompute: str, schedule: str = OneFOneB.name,
                 vpp: int = 1, sequence_parallel: bool = False, distributed_optimizer: bool = False) -> "Config":
        """The Megatron-mode config of these uniform values."""
        return cls(mbs * dp, pp, schedule, vpp, sequence_parallel, distributed_optimizer, (),
                   Uniform(tp, dp, mbs, recompute))

    @property
    def mode(self) -> str:
        """The plan's mode (plan.json `mode`): megatron when the config is uniform, else free."""
        return "free" if self.uniform is None else "megatron"

    @property
    def sched(self) -> schedules.Schedule:
        return schedules.schedule_of(self.schedule, self.vpp)

    @property
    def complete(self) -> bool:
        """Every node type's stage size is settled (by `sizes` or by the uniform rule)."""
        return self.uniform is not None or OPEN not in self.sizes

    @property
    def required_types(self) -> frozenset[int]:
        """Node types that host at least one stage: those given a stage size (free mode)."""
        return frozenset(k for k, g in enumerate(self.sizes) if g > 0)

    @property
    def shared_recompute(self) -> bool:
        """Megatron mode under full recompute: one recomputed-layer count for every stage."""
        return self.uniform is not None and self.uniform.recompute == "full"

    def num_microbatches(self, gbs: int) -> int:
        return gbs // self.samples

    def _order(self) -> tuple:
        """The search's tie order between configs of equal bound (heaps, sorting)."""
        u = self.uniform
        if u is not None:
            return (0, u.tp, u.dp, u.mbs, self.pp, u.recompute, self.schedule, self.vpp, self.sequence_parallel,
                    self.distributed_optimizer)
        return (1, self.samples, self.pp, self.schedule, self.vpp, self.sequence_parallel,
                self.distributed_optimizer, self.sizes)

    def __lt__(self, other: "Config") -> bool:
        return self._order() < other._order()

    def label(self) -> str:
        sched = self.schedule + (f"/v{self.vpp}" if self.vpp > 1 else "")
        switches = f"{' sp' if self.sequence_parallel else ''}{' distopt' if self.distributed_optimizer else ''}"
        u = self.uniform
        if u is not None:
            return f"tp={u.tp} dp={u.dp} pp={self.pp} mbs={u.mbs} recompute={u.recompute} {sched}{switches}"
        sizes = ",".join("*" if g == OPEN else str(g) for g in self.sizes)
        return f"free pp={self.pp} micro-batch={self.samples} samples gpus/stage={sizes} {sched}{switches}"


@dataclass(frozen=True, order=True)
class StageOption:
    """One way to run a stage: node type k (cluster order), tp x dp GPUs, micro-batch size
    per dp replica, recompute granularity. Options that share (k, group) form a pool (coefficients.Pool)."""

    k: int
    tp: int
    dp: int
    mbs: int
    recompute: str

    def __hash__(self) -> int:  # cached: the coefficient cache's keys hold tuples of many options
        return self._hash

    @functools.cached_property
    def _hash(self) -> int:
        return hash((self.k, self.tp, self.dp, self.mbs, self.recompute))

    def __reduce__(self):  # pickled without the cached hash: another process salts str hashes anew
        return StageOption, (self.k, self.tp, self.dp, self.mbs, self.recompute)

    @property
    def group(self) -> int:
        return self.tp * self.dp


@dataclass(frozen=True)
class Placement:
    """How stages of `group` GPUs pack into one node type (canonical, in node order)."""

    stages_per_node: int   # > 0 when a stage fits in a node
    nodes_per_stage: int   # > 0 when a stage spans whole nodes
    max_stages: int

    def nodes_used(self, stages: int) -> int:
        if self.stages_per_node:
            return -(-stages // self.stages_per_node)
        return stages * self.nodes_per_stage


MIXED_MAX_NODES = 4   # a mixed-type stage spans at most this many whole nodes (--mixed-stages)


def mixed_types(inst: Instance) -> tuple[MixedNodeType, ...]:
    """The bundles a mixed-type stage may take (--mixed-stages): n_a whole nodes of node type a
    and n_b of a later type b of another GPU, n_a, n_b >= 1, n_a + n_b <= MIXED_MAX_NODES,
    within the types' counts, in cluster order (a, b, n_a, n_b)."""
    types, out = inst.cluster.node_types, []
    for a, ta in enumerate(types):
        for tb in types[a + 1:]:
            if ta.gpu.name == tb.gpu.name:
                continue
            for na in range(1, min(ta.count, MIXED_MAX_NODES - 1) + 1):
                for nb in range(1, min(tb.count, MIXED_MAX_NODES - na) + 1):
                    out.append(MixedNodeType(((ta, na), (tb, nb))))
    return tuple(out)


def host_types(inst: Instance, fix: dict[str, object] | None = None) -> tuple:
    """What a stage option's k indexes: the cluster's node types, then (with --mixed-stages,
    fix `mixed`) the mixed-type bundles (mixed_types), every bundle whatever the node cap, so
    that an option's k means the same in every space (`hosts` keeps those within the cap)."""
    base = tuple(inst.cluster.node_types)
    return base + mixed_types(inst) if fix and fix.get("mixed") else base


def mixed_cap(fix: dict[str, object] | None) -> int:
    """Most nodes a mixed-type stage spans: --fix mixed=N, MIXED_MAX_NODES for mixed=on."""
    value = (fix or {}).get("mixed")
    return MIXED_MAX_NODES if value is True else int(value or 0)


def hosts(inst: Instance, fix: dict[str, object] | None = None) -> list[tuple[int, object]]:
    """(k, host type) of host_types that the space offers stages: node types, and the mixed
    bundles within the node cap (mixed_cap)."""
    cap = mixed_cap(fix)
    return [(k, nt) for k, nt in enumerate(host_types(inst, fix))
            if not isinstance(nt, MixedNodeType) or nt.real_nodes <= cap]


def placement(nt: NodeType | MixedNodeType, group: int) -> Placement | None:
    """None unless a stage of `group` GPUs divides a node or is a multiple of one; on a
    mixed-type bundle, unless it is the whole bundle (one stage per bundle)."""
    if isinstance(nt, MixedNodeType):
        return Placement(1, 0, nt.count) if group == nt.gpus_per_node else None
    g = nt.gpus_per_node
    if group <= g and g % group == 0:
        return Placement(g // group, 0, nt.count * (g // group))
    if group > g and group % g == 0:
        return Placement(0, group // g, nt.count // (group // g))
    return None


def _packs(nt: NodeType, group: int, tp: int) -> bool:
    """A stage of `group` GPUs packs into node type nt, and its tp groups (tp consecutive
    local GPUs) stay inside one node: tp divides the GPUs per node."""
    pl = placement(nt, group)
    if isinstance(nt, MixedNodeType):
        return pl is not None and pl.max_stages > 0 and all(m.gpus_per_node % tp == 0 for m, _ in nt.members)
    return pl is not None and pl.max_stages > 0 and nt.gpus_per_node % tp == 0


def stage_options(inst: Instance, cfg: Config, fix: dict[str, object] | None = None) -> list[StageOption]:
    """The stage options of a config, sorted by node type and stage size (so a pool's options
    are consecutive); only those that pack into their node type.

    Every node type x tp (`tp_sizes`, within the node) x dp dividing B (micro-batch B / dp,
    `micro_batch_sizes`) x recompute granularity, tp x dp = the type's stage size unless it is
    open, restricted by --fix tp, dp, mbs, recompute and the caps; a uniform config (Megatron
    mode) pins tp, dp and recompute, so each node type has at most one option. Only on points
    the profile covers (`covered`) unless `extrapolate`."""
    fix = fix or {}
    u = cfg.uniform
    out = []
    mbs_ok = set(micro_batch_sizes(cfg.samples, fix))
    for k, nt in hosts(inst, fix):
        for tp in ([u.tp] if u else tp_sizes(inst, fix)):
            if nt.gpus_per_node % tp:
                continue  # a tp group stays inside one node (_packs, check_tp_within_node)
            for dp in ([u.dp] if u else [fix["dp"]] if "dp" in fix else range(1, cfg.samples + 1)):
                mbs = cfg.samples // dp
                if cfg.samples % dp or mbs not in mbs_ok:
                    continue
                if not _packs(nt, tp * dp, tp) or not covered(inst, nt.gpu.name, tp, mbs, fix):
                    continue
                for rec in ([u.recompute] if u else [fix["recompute"]] if "recompute" in fix
                            else recompute_choices(inst)):
                    out.append(StageOption(k, tp, dp, mbs, rec))
    out.sort(key=lambda o: (o.k, o.group, o.tp, o.recompute))
    return within_sizes(out, cfg.sizes) if cfg.sizes else out


def within_sizes(options: list[StageOption], sizes: tuple) -> list[StageOption]:
    """The options a config of stage sizes `sizes` keeps of `options` (the same config's with
    other sizes, or open ones): on each node type those of its size (tp x dp), every one where
    its size is open, none where it is 0. `stage_options` reads the sizes here alone, so a
    child's options are its parent's, filtered (Coefficients)."""
    return [o for o in options if sizes[o.k] in (OPEN, o.group)]


def free_children(inst: Instance, cfg: Config, fix: dict[str, object] | None = None,
                  options: list[StageOption] | None = None) -> Iterator[Config]:
    """Branch on the first node type whose stage size is open: each size its options offer,
    and 0 (the type hosts no stage). A type with a size hosts at least one stage, so every
    plan belongs to exactly one completion. `options`: cfg's stage_options where known."""
    k = cfg.sizes.index(OPEN)
    sizes = sorted({o.group for o in (stage_options(inst, cfg, fix) if options is None else options) if o.k == k})
    for g in [0] + sizes:
        settled = cfg.sizes[:k] + (g,) + cfg.sizes[k + 1:]
        if any(settled) and sum(1 for x in settled if x > 0) <= cfg.pp:
            yield replace(cfg, sizes=settled)


def free_completions(inst: Instance, cfg: Config, fix: dict[str, object] | None = None,
                     options: list[StageOption] | None = None) -> Iterator[Config]:
    """Every complete config below `cfg` (the brute force's space), in the order of the tree
    `free_children` branches: each open node type takes 0 or a size its options offer (settling
    one type leaves every other type's options as they were), node types in order, and a
    completion keeps at least one and at most pp types with a stage (the children's test, which
    only tightens down the tree). `options`: cfg's stage_options where known."""
    if cfg.complete:
        yield cfg
        return
    options = stage_options(inst, cfg, fix) if options is None else options
    choices = [[size] if size != OPEN else [0] + sorted({o.group for o in options if o.k == k})
               for k, size in enumerate(cfg.sizes)]
    for settled in itertools.product(*choices):
        if any(settled) and sum(1 for x in settled if x > 0) <= cfg.pp:
            yield replace(cfg, sizes=settled)


def recompute_choices(inst: Instance) -> tuple[str, ...]:
    # With flash attention the s^2 attention terms are never stored, so selective recompute
    # saves no memory and costs time: every such plan is dominated by its 'none' twin.
    return ("none", "full") if inst.job.flash_attention else ("none", "selective", "full")


def with_space_options(fix: str | None, extrapolate: bool = False, max_tp: int | None = None,
                       max_micro_batch: int | None = None, mixed: bool = False) -> str | None:
    """The --fix text with --extrapolate, --max-tp, --max-micro-batch and --mixed-stages added
    (extrapolate=on, tp<=N, mbs<=N, mixed=on), so every path that parses --fix (solve, pareto)
    sees one space."""
    parts = [fix] if fix else []
    for flag, name in ((max_tp, "--max-tp"), (max_micro_batch, "--max-micro-batch")):
        if flag is not None and flag < 1:
            raise InputError(f"must be a whole number >= 1, got {flag}", field=name.lstrip("-"))
    parts += [f"tp<={max_tp}"] if max_tp is not None else []
    parts += [f"mbs<={max_micro_batch}"] if max_micro_batch is not None else []
    parts += ["extrapolate=on"] if extrapolate else []
    parts += ["mixed=on"] if mixed and "mixed=" not in (fix or "") else []
    return ",".join(parts) or None


def plan_fills(inst: Instance, plan) -> tuple:
    """The profile points a plan's times rest on that no profile measured or generates, each
    with the fill rule that supplied it (plan.ProfileFill), in a stable order."""
    from milp_plan.plan import ProfileFill
    m, seq, out = inst.model, inst.job.seq_length, set()
    for st in plan.stages:
        for gpu in gpu_names(st.gpu):
            for kind in m.kinds():
                how = inst.profile.filled(m.name, gpu, st.tp, st.micro_batch_size, seq, kind)
                if how is not None:
                    out.add(ProfileFill(gpu, st.tp, st.micro_batch_size, seq, kind, how))
    return tuple(sorted(out, key=lambda f: (f.gpu, f.tp, f.micro_batch_size, f.seq_length, f.kind)))


FIX_KEYS = {"tp", "pp", "dp", "mbs", "vpp", "recompute", "sp", "schedule", "distopt", "extrapolate", "layers", "order",
            "mixed"}
LIST_KEYS = {"layers", "order"}   # per-stage pins: layers=3,5 (layer counts), order=A10,A100 (GPU or node type)
CAP_KEYS = {"tp", "mbs"}   # KEY<=N caps the range (--max-tp, --max-micro-batch write them too)


def parse_fix(text: str | None) -> dict[str, object]:
    """'tp=8,pp=8,dp=1,mbs=1,vpp=3,recompute=full,sp=off,schedule=interleaved' -> dict;
    'tp<=4,mbs<=8' -> {'tp<=': 4, 'mbs<=': 8} (the least cap wins); 'extrapolate=on' opens
    the points the profile does not cover."""
    if not text:
        return {}
    out: dict[str, object] = {}
    listing = None   # a per-stage pin takes the comma-separated items after it that hold no '='
    for item in text.split(","):
        if listing is not None and "=" not in item:
            out[listing] += (_pin_value(listing, item),)
            continue
        listing = None
        if "<=" in item:
            k, v = (x.strip() for x in item.split("<=", 1))
            if k not in CAP_KEYS:
                raise InputError(f"'{item}': only {' and '.join(sorted(CAP_KEYS))} take a cap (KEY<=N)", field="fix")
            if not v.isdigit() or int(v) < 1:
                raise InputError(f"{k}<= needs a whole number >= 1, got '{v}'", field="fix")
            out[k + "<="] = min(int(v), int(out.get(k + "<=", int(v))))
            continue
        if "=" not in item:
            raise InputError(f"'{item}' is not KEY=VALUE or KEY<=N; write e.g. tp=8,pp=4 or tp<=4", field="fix")
        k, v = (x.strip() for x in item.split("=", 1))
        if k not in FIX_KEYS:
            raise InputError(f"unknown key '{k}'; use {', '.join(sorted(FIX_KEYS))}", field="fix")
        if k in out:
            raise InputError(f"{k} is given twice; give each key once", field="fix")
        if k in ("tp", "pp", "dp", "mbs", "vpp"):
            if not (v.isascii() and v.isdigit()) or not 1 <= int(v) <= 2**20:
                raise InputError(f"{k} must be a whole number from 1 to {2**20}, got '{v}'", field="fix")
            out[k] = int(v)
        elif k == "mixed" and v.isascii() and v.isdigit() and v not in ("0", "1"):
            if not 2 <= int(v) <= MIXED_MAX_NODES:
                raise InputError(f"mixed= caps the nodes of a mixed-type stage from 2 to {MIXED_MAX_NODES}, got {v}; "
                                 "or give on or off", field="fix")
            out[k] = int(v)
        elif k in ("sp", "distopt", "extrapolate", "mixed"):
            if v not in ("on", "off", "true", "false", "1", "0"):
                raise InputError(f"{k} must be on or off{' (or a node cap N: mixed=2)' if k == 'mixed' else ''}, "
                                 f"got '{v}'", field="fix")
            out[k] = v in ("on", "true", "1")
        elif k == "recompute":
            if v not in ("none", "selective", "full"):
                raise InputError(f"recompute must be none, selective or full, got '{v}'", field="fix")
            out[k] = v
        elif k in LIST_KEYS:
            out[k], listing = (_pin_value(k, v),), k
        elif k == "schedule":
            if not schedules.known(v):
                raise InputError(f"schedule must be {', '.join(schedules.NAMES[:-1])} or {schedules.NAMES[-1]}, "
                                 f"got '{v}'", field="fix")
            out[k] = v
    for k in CAP_KEYS:
        if k in out and k + "<=" in out and out[k] > out[k + "<="]:
            raise InputError(f"{k}={out[k]} contradicts {k}<={out[k + '<=']}", field="fix")
    if out.get("vpp", 1) > 1 and not schedules.has_chunks(out.setdefault("schedule", schedules.INTERLEAVED)):
        raise InputError(f"vpp > 1 needs schedule={schedules.INTERLEAVED}", field="fix")
    sizes = {len(out[k]) for k in LIST_KEYS if k in out} | ({out["pp"]} if "pp" in out else set())
    if len(sizes) > 1:
        raise InputError("layers=, order= and pp= give different stage counts; give one per stage", field="fix")
    return out


def _pin_value(key: str, text: str) -> int | str:
    text = text.strip()
    if key == "order":
        if not text:
            raise InputError("order= lists a GPU or node type per stage, e.g. order=A10,A100-80GB", field="fix")
        return text
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 2**20:
        raise InputError(f"layers= lists whole numbers >= 1 per stage (e.g. layers=3,5), got '{text}'", field="fix")
    return int(text)


def check_pins(inst: Instance, fix: dict[str, object]) -> None:
    """The per-stage pins against the instance: layer counts sum to the model's layers, and
    every name in order= is a node type or a GPU of the cluster."""
    L = inst.model.num_layers
    if "layers" in fix and sum(fix["layers"]) != L:
        raise InputError(f"layers={','.join(map(str, fix['layers']))} sums to {sum(fix['layers'])}, but "
                         f"{inst.model.name} has {L} layers", field="fix")
    known = {n for nt in inst.cluster.node_types for n in (nt.name, nt.gpu.name)}
    order = fix.get("order", ())
    for name in order:
        if name not in known:
            raise InputError(f"order={name}: no node type or GPU of cluster '{inst.cluster.name}' is called so; use "
                             f"{', '.join(sorted(known))}", field="fix")
    runs = [name for i, name in enumerate(order) if i == 0 or order[i - 1] != name]
    for name in set(runs):  # each run of a type starts on a node of its own (placement.place_stages)
        nodes = sum(nt.count for nt in inst.cluster.node_types if name in (nt.name, nt.gpu.name))
        if runs.count(name) > nodes:
            raise InputError(f"order={','.join(order)} puts {name} stages in {runs.count(name)} runs, but each run "
                             f"starts on a node of its own and the cluster has {nodes} {name} node"
                             f"{'s' if nodes > 1 else ''}: group them, e.g. "
                             f"order={','.join(sorted(order, key=runs.index))}", field="fix")


def pinned_types(inst: Instance, fix: dict[str, object], s: int) -> set[int] | None:
    """Node type indices stage s may use under order= (None: any)."""
    if "order" not in fix:
        return None
    name = fix["order"][s]
    return {k for k, nt in enumerate(inst.cluster.node_types) if name in (nt.name, nt.gpu.name)}


def matches_pins(inst: Instance, fix: dict[str, object] | None, plan) -> bool:
    """Whether a plan keeps the per-stage pins (layer counts, GPU or node type order)."""
    if not fix:
        return True
    if "layers" in fix and tuple(st.num_layers for st in plan.stages) != tuple(fix["layers"]):
        return False
    if "order" in fix:
        nodes = inst.cluster.nodes
        for s, st in enumerate(plan.stages):
            if nodes[st.devices[0].node].type not in [inst.cluster.node_types[k] for k in pinned_types(inst, fix, s)]:
                return False
    return True


ZB_H1_REFUSAL = ("schedule=zb-h1 runs only on the zero-bubble fork of Megatron-LM, outside the exact "
                 "formulations (--mode megatron); fix 1f1b, interleaved or gpipe, and simulate a plan under "
                 "ZB-H1 with `milp-plan verify PLAN --schedule zb-h1`")


def _stage_fits_nodes(inst: Instance, group: int, fix: dict[str, object] | None = None) -> bool:
    """A stage of `group` GPUs packs into some node type (group divides the node or is a
    multiple of it) or, with --mixed-stages, is a mixed-type bundle."""
    return any(placement(nt, group) is not None for _, nt in hosts(inst, fix))


FREE_SP_REFUSAL = ("--mode free plans with sequence parallelism on (in the cost model it never costs time, and it "
                   "makes a stage's transfer depend only on its GPU count); drop sp=off, or use --mode megatron")


def enumerate_configs(inst: Instance, fix: dict[str, object] | None = None,
                      names: tuple[str, ...] = SCHEDULES,
                      mode: str = "megatron") -> Iterator[Config]:
    """Every global choice that passes the divisibility rules (checker's rules, in advance)."""
    fix = fix or {}
    if "schedule" in fix and not schedules.schedule_of(fix["schedule"]).modelled:
        raise InputError(ZB_H1_REFUSAL, field="fix")
    pins = [k for k in LIST_KEYS if k in fix]
    if pins:
        check_pins(inst, fix)
        fix = {**fix, "pp": len(fix[pins[0]])}
    if mode == "free":
        yield from _free_configs(inst, fix, names)
        return
    m, job = inst.model, inst.job
    gbs, L, total = job.global_batch_size, m.num_layers, inst.cluster.num_gpus
    max_gpn = max(nt.gpus_per_node for nt in inst.cluster.node_types)
    recomputes = recompute_choices(inst)
    for tp in tp_sizes(inst, fix):
        if tp > max_gpn:
            continue
        for dp in ([fix["dp"]] if "dp" in fix else range(1, total // tp + 1)):
            if gbs % dp or not _stage_fits_nodes(inst, tp * dp, fix):
                continue
            for mbs in micro_batch_sizes(gbs // dp, fix):
                if gbs % (mbs * dp):
                    continue
                if not any(_packs(nt, tp * dp, tp) and covered(inst, nt.gpu.name, tp, mbs, fix)
                           for _, nt in hosts(inst, fix)):
                    continue  # no node type runs this (tp, mbs) on profiled data
                n_mb = gbs // (mbs * dp)
                sp = bool(fix.get("sp", True)) and tp > 1
                fitting = [rec for rec in ([fix["recompute"]] if "recompute" in fix else recomputes)
                           if _activations_fit(inst, tp, mbs, rec, sp)]
                distopt = bool(fix.get("distopt", True)) and dp > 1
                for pp in ([fix["pp"]] if "pp" in fix else range(1, min(L, total // (tp * dp)) + 1)):
                    if pp * tp * dp > total or pp > L:
                        continue
                    scheds = list(_schedules(fix, names, pp, n_mb, L))  # the same for every recompute
                    for rec in fitting:
                        for sched, vpp in scheds:
                            yield Config.megatron(tp, dp, mbs, pp, rec, sched, vpp, sp, distopt)


def least_activation_bytes(inst: Instance, tp: int, mbs: int, recompute: str, sequence_parallel: bool,
                           gpu: str | None = None) -> float:
    """At most the activation bytes per GPU of any stage with this tp, micro-batch size and
    recompute granularity, under any schedule: costmodel.stage_activation_bytes of one Transformer block
    (a stage holds >= 1), one micro-batch in flight (1F1B min(pp - s, m) >= 1, GPipe m >= 1,
    interleaved >= 1 stage-unit), no embedding or head, and under full recompute that block
    recomputed (input only, plus its working activations), the least over block kinds; on
    `gpu` (its measured activations, costmodel.layer_activation_bytes)."""
    from milp_plan import costmodel
    block_kinds = [k for k in _kinds(inst.model) if k not in ("embedding", "head")]
    return min(costmodel.stage_activation_bytes(inst, [k], False, False, tp, mbs, sequence_parallel, recompute,
                                                1 if recompute == "full" else 0, 1.0, gpu=gpu) for k in block_kinds)


def _activations_fit(inst: Instance, tp: int, mbs: int, recompute: str, sequence_parallel: bool) -> bool:
    """Some node type that can host a tp group has room for `least_activation_bytes`: otherwise
    no stage of such a config fits in memory (check_memory_capacity), so it holds no plan."""
    from milp_plan import costmodel
    return any(least_activation_bytes(inst, tp, mbs, recompute, sequence_parallel, nt.gpu.name)
               <= costmodel.usable_memory_bytes(inst, nt) * (1 + 1e-6)
               for nt in inst.cluster.node_types if nt.gpus_per_node % tp == 0)


def _free_configs(inst: Instance, fix: dict[str, object], names: tuple[str, ...]) -> Iterator[Config]:
    """B (samples per micro-batch) dividing the global batch, pp up to the layers and to the
    stages the cluster holds at the smallest stage size, and the schedules."""
    if fix.get("sp") is False:
        raise InputError(FREE_SP_REFUSAL, field="fix")
    gbs, L = inst.job.global_batch_size, inst.model.num_layers
    distopt = bool(fix.get("distopt", True))
    for samples in range(1, gbs + 1):
        if gbs % samples:
            continue
        hosts = len(host_types(inst, fix))
        opts = stage_options(inst, Config(samples, 1, sizes=(OPEN,) * hosts), fix)
        if not opts:
            continue
        most = sum(nt.count * nt.gpus_per_node for nt in inst.cluster.node_types) // min(o.group for o in opts)
        m = gbs // samples
        for pp in ([fix["pp"]] if "pp" in fix else range(1, min(L, most) + 1)):
            if pp > L or pp > most:
                continue
            for sched, vpp in _schedules(fix, names, pp, m, L):
                yield Config(samples, pp, sched, vpp, True, distopt, (OPEN,) * hosts)


def explain_fix(inst: Instance, fix: dict[str, object]) -> str:
    """Why no Config passes with these pinned values: the first pinned value that breaks
    a rule on its own, or the combination."""
    m, job, total = inst.model, inst.job, inst.cluster.num_gpus
    max_gpn = max(nt.gpus_per_node for nt in inst.cluster.node_types)
    tp, pp, dp, mbs = (fix.get(k) for k in ("tp", "pp", "dp", "mbs"))
    if tp is not None and not valid_tps(m, [tp]):
        return (f"tp={tp} must divide the {m.num_attention_heads} attention heads, and the {m.num_query_groups} "
                "query groups must divide or be a multiple of it")
    if tp is not None and tp > max_gpn:
        return f"tp={tp} exceeds the largest node ({max_gpn} GPUs); a tp group stays inside one node"
    if pp is not None and pp > m.num_layers:
        return f"pp={pp} exceeds the model's {m.num_layers} layers"
    if dp is not None and job.global_batch_size % dp:
        return f"dp={dp} does not divide the global batch {job.global_batch_size}"
    if mbs is not None and job.global_batch_size % (mbs * (dp or 1)):
        return f"mbs={mbs} x dp={dp or 1} does not divide the global batch {job.global_batch_size}"
    used = (tp or 1) * (pp or 1) * (dp or 1)
    if used > total:
        return f"tp x pp x dp = {used} GPUs but the cluster has {total}"
    uncovered = coverage_gap(inst, fix)
    if uncovered:
        return uncovered
    return ("no combination of the free choices with the pinned ones passes the divisibility rules "
            "(heads by tp, global batch by micro-batch x dp, a stage packing into a node type, m % pp == 0 "
            "and vpp dividing the layers for interleaving)")


def virtual_stages(fix: dict[str, object], pp: int, n_mb: int, L: int) -> list[int]:
    """vpp values Megatron runs interleaved with: pp >= 2, m % pp == 0 (its default
    micro-batch group of pp), and every stage a whole number (>= 1) of layers per chunk:
    2 <= vpp <= L / pp (the layout string lets stages differ in size, each a multiple of vpp,
    so their sum L is one too: vpp divides L, or no plan has it)."""
    if pp < 2 or n_mb % pp:
        return []
    return [v for v in ([fix["vpp"]] if "vpp" in fix else range(2, L // pp + 1)) if v >= 2 and L >= pp * v
            and L % v == 0]


def coverage_gap(inst: Instance, fix: dict[str, object]) -> str | None:
    """Why profile coverage and the caps leave no (tp, micro-batch) point, or None."""
    gbs = inst.job.global_batch_size
    for nt in inst.cluster.node_types:
        for tp in tp_sizes(inst, fix):
            if any(gbs % b == 0 and covered(inst, nt.gpu.name, tp, b, fix) for b in micro_batch_sizes(gbs, fix)):
                return None
    limits = ", ".join(f"{k}{v}" if k.endswith("<=") else f"{k}={v}" for k, v in sorted(fix.items())
                       if k in ("tp", "mbs", "tp<=", "mbs<=")) or "none pinned or capped"
    return (f"the profiles measure no allowed tp and micro-batch size ({limits}) for every layer kind of "
            f"{inst.model.name} at sequence length {inst.job.seq_length} on any GPU of the cluster; profile "
            "those points, change the pins or caps, or allow filled points with --extrapolate")


def _schedules(fix, names, pp, n_mb, L):
    """(schedule, vpp) of the configs at pp: the pinned schedule, else each of `names` the search
    enumerates there (schedules.searched: not GPipe at pp 1, where 1F1B dominates it)."""
    for s in ([fix["schedule"]] if "schedule" in fix else [s for s in names if schedules.searched(s, pp, names)]):
        if schedules.has_chunks(s):
            for v in virtual_stages(fix, pp, n_mb, L):
                if all(n % v == 0 for n in fix.get("layers", ())):  # each pinned stage whole chunks
                    yield s, v
        else:
            yield s, 1
