"""Build the operation DAG of one training step and simulate it.

`PipelineSpec` holds everything the simulator needs, in seconds and bytes; for a plan
it comes from the cost model alone (`spec_from_plan`), for closed-form tests it can be
written by hand. The step it simulates, with G = pp x vpp virtual stages:

* compute  F(g, i), B(g, i) on rank g mod pp, each chunk taking f_s / vpp and b_s / vpp
           (ZB-H1: B split into I = (1 - W_FRACTION_OF_BWD) b and W = W_FRACTION_OF_BWD b);
           each rank runs its actions in the schedule's order (milp_plan/schedules.py).
* p2p      F(g, i) -> transfer -> F(g+1, i) and B(g+1, i) -> transfer -> B(g, i) (I for ZB),
           each transfer hop_s[h] on link h in its direction (a serial, first-come
           first-served resource); with interleaving, the hop from the last rank to rank 0
           (wrap_hop_s) joins chunk j to chunk j + 1.
* dp       the gradient reduction of rank r, dp_s[r] on r's data-parallel channel:
           not overlapped, after the rank's last backward; overlapped, per bucket (one per
           layer of a chunk) as soon as that part of the chunk's last backward is done.
* optimizer opt_s[r] on rank r, after a barrier that waits for every rank's reduction
           (the global gradient-norm clip), so the step ends at
           max_r end(reduction_r) + max_r opt_s[r].
* memory   per rank, activations of one micro-batch through chunk c (act_bytes[r][c]) are
           allocated at F and freed at the backward that consumes them (B; W for ZB-H1,
           since the weight gradient still reads them); full recompute adds
           working_bytes[r][c] while the chunk's backward (I for ZB-H1) runs. Peak per GPU
           = static_bytes[r] + peak activations.
"""
from __future__ import annotations

import functools
import gc
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Sequence

from milp_plan.errors import InputError
from milp_plan.sim.engine import OpGraph, Timing, run_graph
from milp_plan.schedules import W_FRACTION_OF_BWD, Action, PathTerms, device_orders, schedule_of
from milp_plan.units import GIB

COMPUTE_KINDS = ("F", "B", "I", "W")
KIND_TRANSFER_FWD, KIND_TRANSFER_BWD, KIND_DP, KIND_BARRIER, KIND_OPT = "send-fwd", "send-bwd", "dp", "barrier", "optimizer"


@dataclass(frozen=True)
class PipelineSpec:
    """Per-rank costs of one step; lists are indexed by rank (pipeline stage) 0..pp-1.

    fwd_s, bwd_s: one micro-batch through the whole stage (all its chunks), seconds.
    hop_s[h]: one transfer between rank h and h + 1 (one direction); wrap_hop_s: rank pp-1
    to rank 0 (interleaved only). act_bytes[r][c], working_bytes[r][c]: per chunk c."""

    schedule: str
    num_microbatches: int
    fwd_s: tuple[float, ...]
    bwd_s: tuple[float, ...]
    hop_s: tuple[float, ...] = ()
    vpp: int = 1
    wrap_hop_s: float = 0.0
    dp_s: tuple[float, ...] = ()
    opt_s: tuple[float, ...] = ()
    w_fraction: float = W_FRACTION_OF_BWD
    dp_overlap: bool = False
    static_bytes: tuple[float, ...] = ()
    act_bytes: tuple[tuple[float, ...], ...] = ()
    working_bytes: tuple[tuple[float, ...], ...] = ()
    buckets: tuple[tuple[int, ...], ...] = ()    # gradient buckets per chunk (overlapped dp)
    # token slices (TeraPipe; GPipe only): each of the m sequences is cut into n slices, item
    # q n + k = slice k of sequence q, run in schedules.GPipe.sliced_rank_order; slice_fwd_s[r][k],
    # slice_bwd_s[r][k]: rank r on slice k (these replace fwd_s, bwd_s, which then hold one
    # sequence's sum); slice_hop_s[h][k]: one transfer of slice k on hop h; slice_share[k]: the
    # slice's share of one sequence's activations (allocated at its F, freed at its B)
    slice_fwd_s: tuple[tuple[float, ...], ...] = ()
    slice_bwd_s: tuple[tuple[float, ...], ...] = ()
    slice_hop_s: tuple[tuple[float, ...], ...] = ()
    slice_share: tuple[float, ...] = ()
    # micro-batches of several row lengths back to back (a segment of a step in phases): rank r
    # runs micro-batch i in item_fwd_s[r][i], item_bwd_s[r][i] (whole stage, all chunks);
    # item_hop_s[h][i] is its transfer on hop h (h = pp - 1: the interleaved wrap-around). These
    # replace fwd_s, bwd_s, hop_s, wrap_hop_s, which still give pp.
    item_fwd_s: tuple[tuple[float, ...], ...] = ()
    item_bwd_s: tuple[tuple[float, ...], ...] = ()
    item_hop_s: tuple[tuple[float, ...], ...] = ()

    @property
    def slices(self) -> int:
        """Token slices per sequence (1: not sliced)."""
        return len(self.slice_fwd_s[0]) if self.slice_fwd_s else 1

    @property
    def items(self) -> int:
        """Work items per rank and kind: sequences x slices."""
        return self.num_microbatches * self.slices

    @property
    def pp(self) -> int:
        return len(self.fwd_s)

    def per_rank(self, values: tuple, default) -> list:
        return list(values) if values else [default] * self.pp

    def per_chunk(self, values: tuple, default) -> list[list]:
        return [list(v) for v in values] if values else [[default] * self.vpp for _ in range(self.pp)]

    def validate(self) -> None:
        pp = self.pp
        if pp < 1 or len(self.bwd_s) != pp:
            raise InputError(f"need as many backward times as forward times (>= 1), got {len(self.fwd_s)} and "
                             f"{len(self.bwd_s)}", field="bwd_s")
        if self.hop_s and len(self.hop_s) != pp - 1:
            raise InputError(f"need pp - 1 = {pp - 1} hop times, got {len(self.hop_s)}", field="hop_s")
        for name in ("dp_s", "opt_s", "static_bytes", "act_bytes", "working_bytes", "buckets"):
            v = getattr(self, name)
            if v and len(v) != pp:
                raise InputError(f"need one value per stage ({pp}), got {len(v)}", field=name)
        for name in ("act_bytes", "working_bytes", "buckets"):
            if any(len(row) != self.vpp for row in getattr(self, name)):
                raise InputError(f"need one value per chunk ({self.vpp}) for every stage", field=name)
        if not 0.0 <= self.w_fraction <= 1.0:
            raise InputError(f"must lie in [0, 1], got {self.w_fraction}", field="w_fraction")
        if self.slice_fwd_s:
            n = self.slices
            if not schedule_of(self.schedule, self.vpp).slices_ok or self.dp_overlap:
                raise InputError("token slices run under the gpipe schedule (TeraPipe's), vpp 1, reductions "
                                 f"after the last backward; got {self.schedule}, vpp {self.vpp}", field="slices")
            rows = {"slice_fwd_s": (self.slice_fwd_s, pp), "slice_bwd_s": (self.slice_bwd_s, pp),
                    "slice_hop_s": (self.slice_hop_s, pp - 1)}
            for name, (v, want) in rows.items():
                if len(v) != want or any(len(r) != n for r in v):
                    raise InputError(f"need {want} rows of {n} slice times", field=name)
            if self.slice_share and len(self.slice_share) != n:
                raise InputError(f"need one share per slice ({n})", field="slice_share")
        if self.item_fwd_s:
            m, hops = self.num_microbatches, pp if self.vpp > 1 else pp - 1
            rows = {"item_fwd_s": (self.item_fwd_s, pp), "item_bwd_s": (self.item_bwd_s, pp),
                    "item_hop_s": (self.item_hop_s, hops)}
            for name, (v, want) in rows.items():
                if len(v) != want or any(len(r) != m for r in v):
                    raise InputError(f"need {want} rows of {m} micro-batch times", field=name)
            if self.slice_fwd_s:
                raise InputError("per-micro-batch times and token slices are not combined", field="item_fwd_s")


@dataclass(frozen=True)
class OpRecord:
    name: str        # e.g. "F3" (chunk 0) or "1B7" (chunk 1)
    kind: str        # F B I W send-fwd send-bwd dp barrier optimizer
    stage: int       # pipeline rank the operation belongs to (sender for transfers)
    chunk: int
    microbatch: int  # -1 where it does not apply
    track: str       # trace track: "stage r", "link r->r+1", "link r+1->r", "dp r", "barrier"
    start_s: float
    end_s: float


@dataclass(frozen=True)
class SimResult:
    spec: PipelineSpec
    step_time_s: float                   # end of the optimizer step (makespan)
    pipeline_time_s: float               # end of the last F/B/I/W
    busy_s: tuple[float, ...]            # per rank: F/B/I/W seconds
    span_s: tuple[float, ...]            # per rank: last compute end - first compute start
    bubble_fraction: tuple[float, ...]   # per rank: 1 - busy / pipeline_time
    dp_end_s: tuple[float, ...]          # per rank: end of its gradient reduction
    peak_activation_bytes: tuple[float, ...]
    peak_inflight: tuple[float, ...]     # micro-batches (whole-stage units: a chunk counts 1/vpp)
    peak_memory_bytes: tuple[float, ...]  # per GPU: static + peak activations
    timing: Timing
    describe: Callable[[int], tuple]     # op id -> (name, kind, stage, chunk, micro-batch, track)

    @property
    def peak_memory_gib(self) -> tuple[float, ...]:
        return tuple(b / GIB for b in self.peak_memory_bytes)

    def records(self) -> list[OpRecord]:
        """Every operation with its times, in operation-id order."""
        st, en = self.timing.start_s, self.timing.end_s
        return [OpRecord(*self.describe(o), st[o], en[o]) for o in range(len(st))]


# ---- graph ------------------------------------------------------------------------------
class _Builder:
    """Lays out operation ids and resources for one spec (see the module docstring).

    Ids: compute (k, g, i) = (k G + g) m + i for kind k of `kinds`; then the forward
    transfers g -> g+1 of micro-batch i at X + g m + i, the backward transfers g+1 -> g at
    X + (G-1) m + g m + i; then bucket pieces, reductions, barrier and optimizer steps,
    whose descriptions are kept in `extra`. Resources: ranks [0, pp), forward links
    [pp, 2pp), backward links [2pp, 3pp) (link pp-1 is the wrap-around hop), data-parallel
    channels [3pp, 4pp), the barrier 4pp."""

    def __init__(self, spec: PipelineSpec):
        self.spec, self.pp, self.v, self.m = spec, spec.pp, spec.vpp, spec.items
        self.n = spec.slices
        self.G = self.pp * self.v
        sched = schedule_of(spec.schedule, spec.vpp)
        self.kinds = sched.op_kinds
        self.bkind = sched.send_kind      # sends the input gradient
        self.gkind = sched.grad_kind      # produces the weight gradient
        self.g = OpGraph(4 * self.pp + 1)
        self.x0 = len(self.kinds) * self.G * self.m
        self.extra: dict[int, tuple] = {}
        self.dp_ops: list[int] = []

    def cid(self, kind: str, vstage: int, mb: int) -> int:
        return (self.kinds.index(kind) * self.G + vstage) * self.m + mb

    def meta(self, o: int) -> tuple:
        """(name, kind, stage, chunk, micro-batch, track) of operation o."""
        if o in self.extra:
            return self.extra[o]
        pp, m, G = self.pp, self.m, self.G
        if o < self.x0:
            k, rest = divmod(o, G * m)
            gs, i = divmod(rest, m)
            r, c, kind = gs % pp, gs // pp, self.kinds[k]
            return (f"{kind}{self.item(i)}" if self.v == 1 else f"{c}{kind}{i}", kind, r, c, i, f"stage {r}")
        back, rest = divmod(o - self.x0, (G - 1) * m)
        gs, i = divmod(rest, m)
        a, b = (gs + 1, gs) if back else (gs, gs + 1)
        return (f"x{a}>{b}:{self.item(i)}", KIND_TRANSFER_BWD if back else KIND_TRANSFER_FWD, a % pp, a // pp, i,
                f"link {a % pp}->{b % pp}")

    def item(self, i: int) -> str:
        """Name of work item i: the micro-batch, or "q/k" for slice k of sequence q."""
        return str(i) if self.n == 1 else f"{i // self.n}/{i % self.n}"

    def op(self, dur: float, res: int, meta: tuple) -> int:
        o = self.g.add_op(max(0.0, dur), res)
        self.extra[o] = meta
        return o

    def compute_ops(self) -> None:
        s, v = self.spec, self.v
        if self.n > 1:   # token slices: item i is slice i mod n
            for kind in self.kinds:
                rows = s.slice_fwd_s if kind == "F" else s.slice_bwd_s
                for r in range(self.pp):
                    for i in range(self.m):
                        self.g.add_op(max(0.0, rows[r][i % self.n]), r)
            return
        share = {"F": 1.0, "B": 1.0, "I": 1 - s.w_fraction, "W": s.w_fraction}
        for kind in self.kinds:
            for gs in range(self.G):
                r = gs % self.pp
                if s.item_fwd_s:   # micro-batches of several row lengths
                    row = s.item_fwd_s[r] if kind == "F" else s.item_bwd_s[r]
                    for i in range(self.m):
                        self.g.add_op(max(0.0, share[kind] * (row[i] / v)), r)
                    continue
                dur = share[kind] * ((s.fwd_s[r] if kind == "F" else s.bwd_s[r]) / v)
                self.g.add_ops(self.m, max(0.0, dur), r)

    def hop(self, gs: int) -> float:
        h = gs % self.pp
        return self.spec.wrap_hop_s if h == self.pp - 1 else (self.spec.hop_s[h] if self.spec.hop_s else 0.0)

    def transfer_ops(self) -> None:
        pp, m, G, succ = self.pp, self.m, self.G, self.g.succ
        for back in (False, True):
            for gs in range(G - 1):
                x = self.g.add_ops(m, max(0.0, self.hop(gs)), (2 if back else 1) * pp + gs % pp)
                if self.n > 1:
                    for i in range(m):
                        self.g.duration_s[x + i] = max(0.0, self.spec.slice_hop_s[gs][i % self.n])
                elif self.spec.item_hop_s:
                    for i in range(m):
                        self.g.duration_s[x + i] = max(0.0, self.spec.item_hop_s[gs % pp][i])
                src = self.cid(self.bkind, gs + 1, 0) if back else self.cid("F", gs, 0)
                dst = self.cid(self.bkind, gs, 0) if back else self.cid("F", gs + 1, 0)
                for i in range(m):
                    succ[src + i].append(x + i)
                    succ[x + i].append(dst + i)
        f_last, b_last = self.cid("F", G - 1, 0), self.cid(self.bkind, G - 1, 0)
        for i in range(m):  # the loss: the last virtual stage's backward follows its own forward
            succ[f_last + i].append(b_last + i)
        if "W" in self.kinds:
            i0, w0 = self.cid("I", 0, 0), self.cid("W", 0, 0)
            for o in range(G * m):
                succ[i0 + o].append(w0 + o)

    def split_op(self, o: int, pieces: int) -> list[int]:
        """Split compute op o into `pieces` equal parts (the caller chains them on the rank):
        o becomes the first part (it keeps what it waits for), the last part inherits what
        waits for o."""
        dur = self.g.duration_s[o] / pieces
        self.g.duration_s[o] = dur
        name, kind, r, c, i, track = self.meta(o)
        parts = [o] + [self.op(dur, r, (f"{name}.{k}", kind, r, c, i, track)) for k in range(1, pieces)]
        succ = self.g.succ
        succ[parts[-1]], succ[o] = succ[o], succ[parts[-1]]
        return parts

    def chains(self, orders: Sequence[Sequence[Action]]) -> list[list[int]]:
        """Device-order edges; with overlapped dp, each chunk's last weight-gradient op is
        split into its buckets, each bucket's reduction following its part."""
        s, out, succ = self.spec, [], self.g.succ
        buckets = s.per_chunk(s.buckets, 1)
        dp = s.per_rank(s.dp_s, 0.0)
        base = {kind: k * self.G * self.m for k, kind in enumerate(self.kinds)}
        for r, order in enumerate(orders):
            ids = [base[a.kind] + (a.chunk * self.pp + r) * self.m + a.mb for a in order]
            if s.dp_overlap:
                ids = self.overlap_buckets(r, order, ids, buckets[r], dp[r])
            for a, b in zip(ids, ids[1:]):
                succ[a].append(b)
            out.append(ids)
        return out

    def overlap_buckets(self, r: int, order: Sequence[Action], ids: list[int], buckets: list[int],
                        dp_s: float) -> list[int]:
        new: list[int] = []
        for a, o in zip(order, ids):
            if a.kind != self.gkind or a.mb != self.m - 1:
                new.append(o)
                continue
            parts = self.split_op(o, max(1, buckets[a.chunk]))
            for k, p in enumerate(parts):
                red = self.op(dp_s / self.v / len(parts), 3 * self.pp + r,
                              (f"dp{a.chunk}.{k}", KIND_DP, r, a.chunk, -1, f"dp {r}"))
                self.g.add_edge(p, red)
                self.dp_ops.append(red)
            new += parts
        return new

    def step_end_ops(self, chains: list[list[int]]) -> None:
        s, pp = self.spec, self.pp
        dp, opt = s.per_rank(s.dp_s, 0.0), s.per_rank(s.opt_s, 0.0)
        if not s.dp_overlap:
            for r in range(pp):
                red = self.op(dp[r], 3 * pp + r, ("dp", KIND_DP, r, 0, -1, f"dp {r}"))
                self.g.add_edge(chains[r][-1], red)
                self.dp_ops.append(red)
        barrier = self.op(0.0, 4 * pp, ("barrier", KIND_BARRIER, -1, 0, -1, "barrier"))
        for red in self.dp_ops:
            self.g.add_edge(red, barrier)
        for r in range(pp):
            o = self.op(opt[r], r, ("opt", KIND_OPT, r, 0, -1, f"stage {r}"))
            self.g.add_edge(barrier, o)
            self.g.add_edge(chains[r][-1], o)

    def build(self, orders: Sequence[Sequence[Action]]) -> list[list[int]]:
        self.compute_ops()
        self.transfer_ops()
        chains = self.chains(orders)
        self.step_end_ops(chains)
        return chains


# ---- memory -----------------------------------------------------------------------------
def memory_walk(spec: PipelineSpec, rank: int, order: Sequence[Action]) -> tuple[float, float]:
    """(peak activation bytes, peak in-flight micro-batches) of one rank along its order.

    A rank runs its actions serially, so the order alone fixes its memory timeline."""
    act = spec.per_chunk(spec.act_bytes, 0.0)[rank]
    work = spec.per_chunk(spec.working_bytes, 0.0)[rank]
    free_kind = schedule_of(spec.schedule, spec.vpp).grad_kind
    n = spec.slices
    share = list(spec.slice_share) if spec.slice_share else [1.0 / n] * n
    cur = peak = inflight = peak_inflight = 0.0
    for a in order:
        k = share[a.mb % n] if n > 1 else 1.0   # a slice holds its share of the sequence's activations
        if a.kind == "F":
            cur += k * act[a.chunk]
            inflight += k / spec.vpp
            peak, peak_inflight = max(peak, cur), max(peak_inflight, inflight)
        if a.kind in ("B", "I"):
            peak = max(peak, cur + work[a.chunk])
        if a.kind == free_kind:
            cur -= k * act[a.chunk]
            inflight -= k / spec.vpp
    return peak, peak_inflight


# ---- simulate ---------------------------------------------------------------------------
@contextmanager
def _no_cyclic_gc():
    """Pause the cyclic garbage collector while 10^5-10^6 small lists are built (the graph
    holds no cycles; a quarter of the run time otherwise); restore its previous state."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def simulate_pipeline(spec: PipelineSpec) -> SimResult:
    """Simulate one training step of `spec` event by event."""
    spec.validate()
    with _no_cyclic_gc():
        if spec.slices > 1:
            sched = schedule_of(spec.schedule, spec.vpp)
            orders = [sched.sliced_rank_order(spec.pp, r, spec.num_microbatches, spec.slices) for r in range(spec.pp)]
        else:
            orders = device_orders(spec.schedule, spec.pp, spec.num_microbatches, spec.vpp)
        b = _Builder(spec)
        chains = b.build(orders)
        t = run_graph(b.g)
    pp = spec.pp
    busy, span = [], []
    dur = b.g.duration_s
    for ids in chains:  # a chain runs serially in order: its first op starts first, its last ends last
        busy.append(sum(map(dur.__getitem__, ids)))
        span.append(t.end_s[ids[-1]] - t.start_s[ids[0]])
    pipe_end = max(t.end_s[ids[-1]] for ids in chains)
    dp_end = [0.0] * pp
    for o in b.dp_ops:
        dp_end[b.extra[o][2]] = max(dp_end[b.extra[o][2]], t.end_s[o])
    mem = [memory_walk(spec, r, orders[r]) for r in range(pp)]
    static = spec.per_rank(spec.static_bytes, 0.0)
    return SimResult(spec, t.makespan_s, pipe_end, tuple(busy), tuple(span),
                     tuple(1.0 - x / pipe_end if pipe_end > 0 else 0.0 for x in busy), tuple(dp_end),
                     tuple(m[0] for m in mem), tuple(m[1] for m in mem),
                     tuple(s + m[0] for s, m in zip(static, mem)), t, b.meta)


# ---- the step as a longest path -------------------------------------------------------------
def _op_term(kind: str, resource: int, spec: PipelineSpec) -> tuple[str, int, float]:
    """What an operation of `kind` on `resource` takes of a spec (the one rule): (field, index,
    share) with field f, b, h (hop_s; index pp - 1: the wrap), dp, opt, or "" (nothing)."""
    pp, v = spec.pp, spec.vpp
    if kind == "F":
        return "f", resource, 1.0 / v
    if kind in ("B", "I", "W"):
        return "b", resource, {"B": 1.0, "I": 1 - spec.w_fraction, "W": spec.w_fraction}[kind] / v
    if kind in (KIND_TRANSFER_FWD, KIND_TRANSFER_BWD):
        return "h", (resource - pp) % pp, 1.0
    if kind == KIND_DP:
        return "dp", resource - 3 * pp, 1.0
    if kind == KIND_OPT:
        return "opt", resource, 1.0
    return "", 0, 0.0


def _path_terms(pp: int, terms) -> PathTerms:
    """Sum the operations' (field, index, share) into a PathTerms."""
    acc = {"f": [0.0] * pp, "b": [0.0] * pp, "h": [0.0] * pp, "dp": [0.0] * pp, "opt": [0.0] * pp, "": [0.0]}
    for f, i, k in terms:
        acc[f][i] += k
    return PathTerms(tuple(acc["f"]), tuple(acc["b"]), tuple(acc["h"][:pp - 1]), acc["h"][pp - 1] if pp > 1 else 0.0,
                     tuple(acc["dp"]), tuple(acc["opt"]))


@dataclass(frozen=True)
class StepGraph:
    """The operation graph of one step for (schedule, vpp, pp, m), the reductions after the
    last backward, with each link's first-come, first-served order made edges: a link's
    transfers all leave one sender rank, in its fixed order, and take the same time, so they
    are served in that order whatever the durations (formulations/pipeline.md, "Which step
    time is proven"). `order` is topological; `terms[o]` names what operation o takes of a
    spec: (field, index, share) with field f, b, h (hop_s; index pp - 1: the wrap), dp, opt,
    or "" (nothing)."""

    order: tuple[int, ...]
    preds: tuple[tuple[int, ...], ...]
    terms: tuple[tuple[str, int, float], ...]


@functools.lru_cache(maxsize=256)
def step_graph(schedule: str, vpp: int, pp: int, m: int, w_fraction: float = W_FRACTION_OF_BWD) -> StepGraph:
    """The StepGraph of the simulator's own graph (_Builder) for these four (and ZB-H1's split
    of the backward)."""
    one = (1.0,) * pp
    spec = PipelineSpec(schedule=schedule, num_microbatches=m, fwd_s=one, bwd_s=one, hop_s=(1.0,) * (pp - 1),
                        vpp=vpp, wrap_hop_s=1.0 if vpp > 1 else 0.0, dp_s=one, opt_s=one, w_fraction=w_fraction)
    b = _Builder(spec)
    with _no_cyclic_gc():
        chains = b.build(device_orders(schedule, pp, m, vpp))
    n, g = len(b.g), b.g
    preds: list[list[int]] = [[] for _ in range(n)]
    for o, outs in enumerate(g.succ):
        for w in outs:
            preds[w].append(o)
    pos = {o: i for ids in chains for i, o in enumerate(ids)}
    links: dict[int, list[int]] = {}
    terms = []
    for o in range(n):
        kind, res = b.meta(o)[1], g.resource[o]
        terms.append(_op_term(kind, res, spec))
        if kind in (KIND_TRANSFER_FWD, KIND_TRANSFER_BWD):
            links.setdefault(res, []).append(o)
    for ops in links.values():  # a transfer's only predecessor is the operation that sends it
        ops.sort(key=lambda o: pos[preds[o][0]])
        for a, c in zip(ops, ops[1:]):
            preds[c].append(a)
    indeg = [len(p) for p in preds]
    succ: list[list[int]] = [[] for _ in range(n)]
    for o, ps in enumerate(preds):
        for p in ps:
            succ[p].append(o)
    stack = [o for o in range(n) if indeg[o] == 0]
    order = []
    while stack:
        o = stack.pop()
        order.append(o)
        for w in succ[o]:
            indeg[w] -= 1
            if indeg[w] == 0:
                stack.append(w)
    if len(order) < n:
        raise RuntimeError("the step's operation graph has a cycle")
    return StepGraph(tuple(order), tuple(tuple(p) for p in preds), tuple(terms))


def longest_path(spec: PipelineSpec) -> tuple[float, PathTerms]:
    """(makespan, critical path) of `spec` as the longest path of its StepGraph: what
    simulate_pipeline computes event by event (tests/test_paths.py checks they agree), without
    the memory, the trace or the engine's queues (3-5x faster: 8 ms against 34 ms for pp 8,
    m 80, vpp 4)."""
    if spec.dp_overlap:
        raise ValueError("longest_path needs the reductions after the last backward (dp_overlap off)")
    if spec.slices > 1:
        raise ValueError("longest_path prices whole micro-batches; simulate token slices with simulate_pipeline")
    spec.validate()
    pp = spec.pp
    sg = step_graph(spec.schedule, spec.vpp, pp, spec.num_microbatches, spec.w_fraction)
    field = {"f": spec.fwd_s, "b": spec.bwd_s, "h": tuple(spec.hop_s or (0.0,) * (pp - 1)) + (spec.wrap_hop_s,),
             "dp": tuple(spec.per_rank(spec.dp_s, 0.0)), "opt": tuple(spec.per_rank(spec.opt_s, 0.0)), "": (0.0,)}
    dur = [max(0.0, field[f][i] * k) for f, i, k in sg.terms]
    n = len(dur)
    start, end = [0.0] * n, [0.0] * n
    preds, get = sg.preds, end.__getitem__
    for o in sg.order:
        ps = preds[o]
        if ps:
            start[o] = t = max(map(get, ps))
            end[o] = t + dur[o]
        else:
            end[o] = dur[o]
    o = max(range(n), key=get)
    step = end[o]
    path = [o]
    while preds[o]:  # back along the operations that ended exactly when the next one started
        o = next(p for p in preds[o] if end[p] == start[o])
        path.append(o)
    return step, _path_terms(pp, (sg.terms[o] for o in path))
