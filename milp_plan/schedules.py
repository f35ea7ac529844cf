"""Pipeline schedules: every rule that depends on the schedule, in one place per schedule.

A plan names its schedule by a string (plan.json's `schedule`, with `vpp`); `schedule_of`
turns the name into an object, which gives
  * memory      the micro-batches a stage holds at its peak (`in_flight`, `end_in_flight`);
  * time        the closed form of the pipeline (`pipeline_time`), the transfers on its
                critical path (`p2p_time`), the chunks that shorten the reduction tail
                (`chunks`); costmodel.py composes them into the step time;
  * model       how the exact formulation models the steady period (`period`) and the
                weights of the closed form (`z_weight`, `sum_weight`);
  * simulator   the order each rank runs its operations (`device_orders`, `op_kinds`);
  * rules       what Megatron-LM (or the zero-bubble fork) accepts (`violations`,
                `check_runtime`) and whether the exact formulations cover it (`modelled`).

An action is (kind, chunk, micro-batch): kind F (forward), B (full backward), I (backward
for the input gradient) or W (backward for the weight gradient); chunk j of rank r is
virtual stage j * pp + r (chunk 0 unless interleaved).

gpipe        all m forwards, then all m backwards (micro-batch 0 first, as PyTorch's
             ScheduleGPipe).
1f1b         PipeDream-flush as Megatron-LM runs it: w_r = min(pp - r - 1, m) warm-up
             forwards, then one forward and one backward alternately, then the remaining
             backwards.
interleaved  Megatron-LM's interleaved 1F1B with v chunks per rank and micro-batch
             groups of `group` (default pp): the k-th forward of a rank is chunk
             (k // group) mod v of micro-batch (k // (group v)) group + k mod group; the
             k-th backward walks the same table with the chunk reversed (v - 1 - chunk).
             Warm-up: min(2 (pp - r - 1) + (v - 1) group, m v) forwards. Megatron refuses
             m mod pp != 0 (default group); so do we. With v = 1 it is 1F1B.
zb-h1        Zero-bubble H1 (Qi et al. 2024) in PyTorch's order: w_r = min(pp - r - 1, m)
             warm-up forwards, then F, I pairs; from the (r+1)-th pair on, each pair is
             followed by the oldest pending W; the cool-down issues I (+ W from index r on),
             then every remaining W.
"""
from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Sequence

from milp_plan.errors import InputError

W_FRACTION_OF_BWD = 0.5     # ZB-H1: weight-gradient share of the backward pass


class Action(NamedTuple):
    kind: str    # F | B | I | W
    chunk: int   # local chunk index (virtual stage = chunk * pp + rank)
    mb: int      # micro-batch index

    def __str__(self) -> str:
        return f"{self.chunk}{self.kind}{self.mb}"


_tuple_new = tuple.__new__


def _act(kind: str, chunk: int, mb: int) -> Action:
    return _tuple_new(Action, (kind, chunk, mb))   # Action(...) without the keyword-argument layer


@dataclass(frozen=True)
class PathTerms:
    """A path of the step's operation graph as a linear function of the spec: its length is
        sum_r fwd[r] fwd_s[r] + bwd[r] bwd_s[r] + dp[r] dp_s[r] + opt[r] opt_s[r]
          + sum_h hop[h] hop_s[h] + wrap wrap_hop_s.
    The graph (the device orders, and each link serving its transfers in the sender's order)
    depends only on the schedule, pp, m and vpp, so a path of one plan is a path of every plan
    with the same four: its length there is a lower bound of that plan's makespan, and the
    makespan is the largest such length (the critical path's)."""

    fwd: tuple[float, ...]
    bwd: tuple[float, ...]
    hop: tuple[float, ...]
    wrap: float
    dp: tuple[float, ...]
    opt: tuple[float, ...]

    def covers(self, other: "PathTerms") -> bool:
        """At least as long as `other` on every spec (every coefficient at least as large; the
        optimizer steps count as the largest, as the model reads them)."""
        pairs = [*zip(self.fwd, other.fwd), *zip(self.bwd, other.bwd), *zip(self.hop, other.hop),
                 *zip(self.dp, other.dp), (self.wrap, other.wrap), (min(sum(self.opt), 1), min(sum(other.opt), 1))]
        return all(a >= b for a, b in pairs)

    def length_s(self, spec: Any) -> float:
        """The path's length on a sim.PipelineSpec."""
        hops = spec.hop_s or (0.0,) * (spec.pp - 1)
        return (sum(c * x for c, x in zip(self.fwd, spec.fwd_s)) + sum(c * x for c, x in zip(self.bwd, spec.bwd_s))
                + sum(c * x for c, x in zip(self.hop, hops)) + self.wrap * spec.wrap_hop_s
                + sum(c * x for c, x in zip(self.dp, spec.per_rank(spec.dp_s, 0.0)))
                + sum(c * x for c, x in zip(self.opt, spec.per_rank(spec.opt_s, 0.0))))



def _path(pp: int, fwd, bwd, hop, wrap: float = 0.0) -> PathTerms:
    """A path that ends in stage 0's reduction and an optimizer step."""
    return PathTerms(tuple(fwd), tuple(bwd), tuple(hop), wrap, (1.0,) + (0.0,) * (pp - 1), (1.0,) + (0.0,) * (pp - 1))


class Period(enum.Enum):
    """How the exact formulation models the steady-state term of the closed form."""
    WINDOWS = "windows"          # 1F1B: (m-1) z, z over every window of stages with its hops
    BOTTLENECK = "bottleneck"    # interleaved: (m vpp - 1) z, z = max_s t_s
    FLOW_SHOP = "flow-shop"      # GPipe: (m-1) (zf + zb), two flow shops


def steady_period_s(t: Sequence[float], hop: Sequence[float]) -> float:
    """z: time per micro-batch in the steady state of 1F1B-like schedules.

    A stage holds at most pp - s micro-batches, so a run of consecutive stages a..b
    (with the 2 transfers on each inner hop) is a cycle:
        z = max over a <= b of (sum_{a..b} t_s + 2 sum_{a..b-1} h_s) / (b - a + 1).
    Window a = b gives max_s t_s; with no communication z = max_s t_s exactly."""
    best, pp = 0.0, len(t)
    for a in range(pp):
        acc = 0.0
        for b in range(a, pp):
            acc += t[b] + (2.0 * hop[b - 1] if b > a else 0.0)
            best = max(best, acc / (b - a + 1))
    return best


class ForwardShare(NamedTuple):
    """How a stage's forward time f_s relates to its time t_s = f_s + b_s on every stage of a
    config's plans: lo t_s <= f_s <= hi t_s + excess (Coefficients.forward_share: hi the
    per-layer parts' largest forward share, excess what the stage's constant part, the
    embedding or the head, adds beyond it)."""

    lo: float
    hi: float
    excess: float = 0.0


class Schedule:
    """The rules of one schedule at a given vpp (see the module docstring)."""
    name: ClassVar[str]
    modelled: ClassVar[bool] = True          # the exact formulations cover it (so `solve` searches it)
    period: ClassVar[Period] = Period.WINDOWS
    op_kinds: ClassVar[tuple[str, ...]] = ("F", "B")
    send_kind: ClassVar[str] = "B"           # the backward operation that sends the input gradient
    grad_kind: ClassVar[str] = "B"           # the backward operation that produces the weight gradient
    needs_fork: ClassVar[str | None] = None  # why stock Megatron-LM cannot run it, or None
    megatron_note: ClassVar[str | None] = None  # how Megatron-LM runs it, where that differs from its name
    runs_slices: ClassVar[bool] = False      # token slices (TeraPipe) run under it (sliced_rank_order)
    # at pp 1 (no pipeline) the schedule that dominates it, or None: the same step, no more memory
    one_stage_twin: ClassVar[str | None] = None

    def __init__(self, vpp: int = 1):
        self.vpp = vpp

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vpp={self.vpp})"

    @property
    def chunks(self) -> int:
        """Model chunks per rank that the step's terms divide by (vpp where it applies, else 1)."""
        return 1

    @property
    def slices_ok(self) -> bool:
        """Token slices run under this schedule at this vpp."""
        return self.runs_slices and self.vpp == 1

    # ---- memory -------------------------------------------------------------------------
    def in_flight(self, pp: int, stage: int, m: int) -> float:
        """Micro-batches whose activations a stage holds at its peak (in whole-stage units)."""
        return float(min(pp - stage, m))

    def end_in_flight(self, pp: int, m: int, inflight: float) -> tuple[float, float]:
        """(embedding, head) in-flight micro-batches."""
        return inflight, inflight

    # ---- time ---------------------------------------------------------------------------
    def pipeline_time(self, fwd_s: Sequence[float], bwd_s: Sequence[float], m: int,
                      hops: Sequence[float]) -> tuple[float, float]:
        """(compute, bubble) of the closed form, given per-stage f_s, b_s per micro-batch.
        1F1B, with t_s = f_s + b_s and z the steady period (steady_period_s):
            T = m z + (sum_s t_s - z)          [= (m-1) z + sum_s t_s]"""
        t = [f + b for f, b in zip(fwd_s, bwd_s)]
        z = steady_period_s(t, hops)
        return m * z, sum(t) - z

    def p2p_time(self, hop_s: Sequence[float], wrap_hop_s: float) -> float:
        """Transfers on the critical path: 2 sum h (one down, one up per hop)."""
        return 2.0 * sum(hop_s)

    def z_weight(self, m: int) -> float:
        """Coefficient of z = max_s t_s in T (the exact formulation's closed form)."""
        return m - 1.0

    def sum_weight(self) -> float:
        """Coefficient of sum_s t_s in T."""
        return 1.0

    def path_weights(self, m: int, pp: int, phi: ForwardShare) -> list[tuple[float, float, bool, float]]:
        """Quadruples (w_z, w_sum, p2p, offset): every plan's simulated step is at least, for each,
            w_z z + w_sum S + [path_p2p(hops) if p2p] + offset + dp_0 + max_s opt_s,
        z = max_s t_s, S = sum_s t_s, phi (ForwardShare) with lo t_s <= f_s <= hi t_s + excess
        on every stage (formulations/pipeline.md, "Bounds on the simulated step"). Every
        schedule has the path that runs micro-batch 0's first forward down to stage s, all of
        s's operations, and the last backward back to stage 0: m t_s + (fill and drain) >= m z
        ((m, 0), and its transfers need not cross every hop: none counted).
        1F1B: the path F0 through every stage, B0 back to stage s, the rest of s's order
        (m - w_s forwards, m - 1 backwards, w_s = min(pp - s, m)), then B_{m-1} back to stage 0
        and its reduction, is
            S + (m - 1) t_s - (w_s - 1) f_s + 2 sum h + dp_0 + opt,
        at the slowest stage >= S + (m - 1 - (w_0 - 1) hi) z - (w_0 - 1) excess + ...,
        w_0 = min(pp, m) (the weight is >= 0: hi <= 1)."""
        w0 = self.path_window(pp, 0, m)
        return [(float(m), 0.0, False, 0.0), (m - 1.0 - (w0 - 1) * phi.hi, 1.0, True, -(w0 - 1) * phi.excess)]

    def position_weights(self, m: int, pp: int, phi: ForwardShare) -> list[float] | None:
        """Per stage s, the weight of t_s in path_weights()[1]'s path through s, where it
        grows with s (OneFOneB); None: no such weights (the bound reads w_z alone)."""
        return None

    def path_window(self, pp: int, s: int, m: int) -> int:
        """w_s of the path through stage s (path_weights, stage_paths, position_weights): 1F1B's
        forwards of stage s up to its first backward, min(pp - s, m)."""
        return min(pp - s, m)

    def path_p2p(self, hop_s: Sequence[float], wrap_hop_s: float) -> float:
        """Transfers on the paths of `path_weights`: each hop down once and up once."""
        return 2.0 * sum(hop_s)

    def chain_path(self, pp: int, m: int, s: int) -> PathTerms:
        """Micro-batch 0's first forward chunk down to stage s, all of stage s's operations (its
        first is that forward, its last the last micro-batch's chunk-0 backward), that backward
        back to stage 0, stage 0's reduction: sum_{j<s} (t_j / v + 2 h_j) + m t_s + dp_0 + opt."""
        v = self.chunks
        fwd = [1.0 / v if j < s else 0.0 for j in range(pp)]
        fwd[s] = float(m)
        bwd = list(fwd)
        return _path(pp, fwd, bwd, [2.0 if j < s else 0.0 for j in range(pp - 1)])

    def tail_path(self, pp: int, m: int) -> PathTerms:
        """Micro-batch 0's first forward chunk down to the last stage, all of the last stage's
        operations (its first is that forward), its own reduction after them, the optimizer:
        sum_{j<pp-1} (f_j / v + h_j) + m t_{pp-1} + dp_{pp-1} + opt. Where the last stage's
        reduction outlasts the drain back to stage 0 (a slow type's data-parallel links at the
        end), it is longer than every chain path."""
        v, last = self.chunks, pp - 1
        fwd = [1.0 / v if j < last else 0.0 for j in range(pp)]
        fwd[last] = float(m)
        bwd = [0.0] * last + [float(m)]
        dp = [0.0] * last + [1.0]
        return PathTerms(tuple(fwd), tuple(bwd), (1.0,) * last, 0.0, tuple(dp), (1.0,) + (0.0,) * last)

    def drain_path(self, pp: int, m: int) -> PathTerms | None:
        """Rank 0's order up to its last forward (chunk c of micro-batch q), that forward on down
        through ranks 1..pp-1 (chunk c's hops), the rest of the last rank's order from it, the
        last rank's reduction, the optimizer: every op after its predecessor on its rank or the
        transfer it waits for, so a path of every plan of (schedule, vpp, pp, m). Where the
        first stage is the slow one and the last stage's reduction is long, it outlasts both
        the chain paths (ending in stage 0's reduction) and the tail path (the fill's first
        chunks only). None at pp 1 or where a rank's order has other operations than F and B
        (ZB-H1's split backward)."""
        if pp < 2:
            return None
        first, last = self.rank_order(pp, 0, m), self.rank_order(pp, pp - 1, m)
        if any(a.kind not in "FB" for a in first + last):
            return None
        i = max(j for j, a in enumerate(first) if a.kind == "F")
        end = first[i]
        k = last.index(end)
        v = self.chunks
        fwd, bwd = [1.0 / v] * pp, [0.0] * pp
        fwd[0] = sum(a.kind == "F" for a in first[:i + 1]) / v
        bwd[0] = sum(a.kind == "B" for a in first[:i + 1]) / v
        fwd[-1] = sum(a.kind == "F" for a in last[k:]) / v
        bwd[-1] = sum(a.kind == "B" for a in last[k:]) / v
        dp = [0.0] * (pp - 1) + [1.0]
        return PathTerms(tuple(fwd), tuple(bwd), (1.0,) * (pp - 1), 0.0, tuple(dp), (1.0,) + (0.0,) * (pp - 1))

    def stage_paths(self, pp: int, m: int) -> list[PathTerms]:
        """Paths of the step graph through each stage, which every plan of (pp, m) has: the
        ones `path_weights` bounds (formulations/pipeline.md, "Bounds on the simulated step").
        The model starts from them (predict.seed_paths). 1F1B: the chain paths, and F0 through
        every stage, B0 back to stage s, the rest of s's order, B_{m-1} back to stage 0."""
        out = [self.chain_path(pp, m, s) for s in range(pp)]
        for s in range(pp):
            w = self.path_window(pp, s, m)
            fwd, bwd = [1.0] * pp, [1.0] * pp
            fwd[s], bwd[s] = 1.0 + m - w, float(m)
            out.append(_path(pp, fwd, bwd, [2.0] * (pp - 1)))
        return out

    # ---- simulator ----------------------------------------------------------------------
    def rank_order(self, pp: int, rank: int, m: int) -> list[Action]:
        warmup = min(pp - rank - 1, m)
        out = [_act("F", 0, i) for i in range(warmup)]
        for i in range(m - warmup):
            out += [_act("F", 0, warmup + i), _act("B", 0, i)]
        out += [_act("B", 0, i) for i in range(m - warmup, m)]
        return out

    def device_orders(self, pp: int, m: int) -> list[list[Action]]:
        """The order of every rank 0..pp-1 with m micro-batches."""
        if pp < 1 or m < 1:
            raise InputError(f"need pp >= 1 and at least one micro-batch, got pp={pp}, m={m}",
                             field="num_microbatches")
        self.check_runtime(pp, m)
        return [self.rank_order(pp, r, m) for r in range(pp)]

    def operations(self, pp: int, m: int) -> int:
        """Forward and backward operations of one step (what the simulator runs)."""
        return len(self.op_kinds) * m * pp * max(1, self.vpp)

    # ---- rules --------------------------------------------------------------------------
    def check_runtime(self, pp: int, m: int) -> None:
        """InputError where the runtime refuses this schedule at pp and m."""
        if self.vpp != 1:
            raise InputError(f"vpp {self.vpp} needs the interleaved schedule, not {self.name!r}", field="vpp")

    def violations(self, pp: int, m: int, layers: Sequence[int], first_layer: int) -> list[str]:
        """The checker's rules for a plan under this schedule (stage layer counts given)."""
        return [] if self.vpp == 1 else [f"vpp {self.vpp} needs the interleaved schedule"]


class OneFOneB(Schedule):
    name = "1f1b"

    def position_weights(self, m: int, pp: int, phi: ForwardShare) -> list[float] | None:
        """Per stage s, the weight c_s of t_s in path_weights' second path taken through s:
        S + (m - 1) t_s - (w_s - 1) f_s + ... >= S + c_s t_s - (w_0 - 1) excess + ..., with
        c_s = m - 1 - (w_s - 1) hi, w_s = min(pp - s, m) (c_0 is that quadruple's w_z; a later
        stage keeps fewer forwards of its warm-up off the path, so c_s grows with s)."""
        return [m - 1.0 - (self.path_window(pp, s, m) - 1) * phi.hi for s in range(pp)]


class GPipe(Schedule):
    name = "gpipe"
    period = Period.FLOW_SHOP
    megatron_note = "schedule gpipe runs as Megatron's 1F1B: the same bubble, fewer micro-batches in flight"
    runs_slices = True
    # one stage runs its m micro-batches one after another under either: the same step, m (f + b);
    # GPipe holds all m in flight, 1F1B one (in_flight)
    one_stage_twin = "1f1b"

    def in_flight(self, pp: int, stage: int, m: int) -> float:
        return float(m)

    def pipeline_time(self, fwd_s, bwd_s, m, hops):
        """GPipe: all forwards, then all backwards: two flow shops of m identical jobs,
            T = (m-1)(zf + zb) + sum_s t_s,  zf = max(f_s, h_s), zb = max(b_s, h_s)
        (a hop is a machine of the flow shop too); reported as compute m (zf + zb)."""
        t = [f + b for f, b in zip(fwd_s, bwd_s)]
        zf, zb = max([*fwd_s, *hops]), max([*bwd_s, *hops])
        return m * (zf + zb), sum(t) - zf - zb

    def path_weights(self, m, pp, phi):
        """GPipe: F0 through stages 0..s, F1..F_{m-1} on s, F_{m-1} on to the last stage, B0
        back to stage s', B1..B_{m-1} on s', B_{m-1} back to stage 0:
        S + (m - 1)(f_s + b_s') + 2 sum h + dp_0 + opt >= S + (m - 1) z + ..."""
        return [(m - 1.0, 1.0, True, 0.0)]

    def stage_paths(self, pp, m):
        """GPipe: the chain paths, and for each stage s the path F0 to s, F1..F_{m-1} on s,
        F_{m-1} to the end, B0 back to s, B1..B_{m-1} on s, B_{m-1} back to stage 0."""
        out = [self.chain_path(pp, m, s) for s in range(pp)]
        for s in range(pp):
            fwd, bwd = [1.0] * pp, [1.0] * pp
            fwd[s] = bwd[s] = float(m)
            out.append(_path(pp, fwd, bwd, [2.0] * (pp - 1)))
        return out

    def rank_order(self, pp, rank, m):
        return [_act("F", 0, i) for i in range(m)] + [_act("B", 0, i) for i in range(m)]

    # ---- token slices (TeraPipe) ---------------------------------------------------------
    def sliced_rank_order(self, pp: int, rank: int, m: int, n: int) -> list[Action]:
        """TeraPipe's order with each of m sequences cut into n token slices, item q n + k =
        slice k of sequence q: every forward in item order (a slice after its context), then
        the backwards sequence by sequence, each sequence's slices in reverse (slice k's
        backward sends gradients into the keys and values of slices < k)."""
        fwd = [_act("F", 0, i) for i in range(m * n)]
        return fwd + [_act("B", 0, q * n + k) for q in range(m) for k in reversed(range(n))]

    @staticmethod
    def _sliced_flow_shop(times: Sequence[Sequence[float]], hops: Sequence[Sequence[float]],
                          m: int) -> tuple[float, float, float]:
        """One flow shop (the forwards, or the backwards) of m n items on the stages and links
        (machines x, times[x][k] for slice k): (W, fill, transfers) with
            B = W + sum_x M_x - tau,  W = m sum_k t_k,  t_k = max_x p_{x,k},
            M_x = max_k p_{x,k},  tau = max_x M_x = max_k t_k,
        fill + transfers = sum_x M_x - tau, transfers = the links' M_x (see sliced_pipeline_time)."""
        machines = [list(r) for r in times] + [list(r) for r in hops]
        n = len(machines[0])
        t = [max(x[k] for x in machines) for k in range(n)]
        big = [max(x) for x in machines]
        links = sum(big[len(times):])
        return m * sum(t), sum(big) - max(big) - links, links

    def sliced_pipeline_time(self, fwd_s: Sequence[Sequence[float]], bwd_s: Sequence[Sequence[float]], m: int,
                             hop_s: Sequence[Sequence[float]]) -> tuple[float, float, float]:
        """(compute, bubble, transfers) of the sliced GPipe form, an upper bound of the
        simulated end of the last backward (sliced_rank_order; fwd_s[s][k], bwd_s[s][k]: stage
        s on slice k; hop_s[h][k]: one transfer of slice k on hop h, each direction).

        The forwards are a permutation flow shop whose machines are the stages and the links
        (a link serves its sender's transfers in order); so are the backwards. A step's path
        runs a monotone path of the forward grid to some stage s, steps to s's first backward
        (after its last forward), and a monotone path of the backward grid back to stage 0. A
        monotone path through machines x_1..x_r covers every item once and the r - 1 items
        where it changes machine twice. Keep each item once, on its own segment, except that
        the segments before the segment j* of the machine with the largest M_x give up their
        last item and those after it their first; what is kept is at most sum_items t_k =
        W = m sum_k t_k, what was given up one item per machine other than j*'s, at most M_x
        each, so a shop's path is at most
            B = W + sum_x M_x - max_x M_x,   t_k = max_x p_{x,k},  M_x = max_k p_{x,k}
        (a path over fewer machines is shorter still), and the step's compute ends by
        B_f + B_b. This is at most the issue's envelope form a_max W + w_max (sum_x a_x - a_max)
        (w_k = t_k, a_x = max_k p_{x,k} / t_k, so w_max a_x >= M_x): the form with
        m_eff = W / w_max. Exact at equal stages without transfers (TeraPipe's case:
        m sum_k t_k + (K - 1) max_k t_k per shop); at n = 1 it is GPipe's form
        m (zf + zb) + (sum_s t_s - zf - zb) plus 2 sum h, exactly. Reported as
        compute = W_f + W_b, transfers = the links' M_x, bubble the rest."""
        wf, fill_f, xf = self._sliced_flow_shop(fwd_s, hop_s, m)
        wb, fill_b, xb = self._sliced_flow_shop(bwd_s, hop_s, m)
        return wf + wb, fill_f + fill_b, xf + xb


class Interleaved(OneFOneB):
    """Megatron-LM's interleaved 1F1B; with vpp = 1 every formula is 1F1B's."""
    name = "interleaved"

    @property
    def chunks(self) -> int:
        return self.vpp if self.vpp > 1 else 1

    @property
    def period(self) -> Period:  # type: ignore[override]
        return Period.BOTTLENECK if self.vpp > 1 else Period.WINDOWS

    def in_flight(self, pp, stage, m):
        if self.vpp == 1:
            return super().in_flight(pp, stage, m)
        chunks = min(2 * (pp - stage - 1) + (self.vpp - 1) * pp + 1, m * self.vpp)
        return chunks / self.vpp

    def end_in_flight(self, pp, m, inflight):
        """The embedding lives only in chunk 0 of stage 0, held min(2 pp - 1, m) times; the
        head only in the last chunk of the last stage, whose backward follows its forward at
        once (held once)."""
        if self.vpp == 1:
            return super().end_in_flight(pp, m, inflight)
        return float(min(2 * pp - 1, m)), 1.0

    def pipeline_time(self, fwd_s, bwd_s, m, hops):
        """interleaved: T = m z + (sum_s t_s - z) / vpp,  z = max_s t_s."""
        if self.vpp == 1:
            return super().pipeline_time(fwd_s, bwd_s, m, hops)
        t = [f + b for f, b in zip(fwd_s, bwd_s)]
        z = max(t)
        return m * z, (sum(t) - z) / self.vpp

    def p2p_time(self, hop_s, wrap_hop_s):
        """2 (vpp sum h + (vpp - 1) h_wrap): fill and drain cross every chunk boundary."""
        if self.vpp == 1:
            return super().p2p_time(hop_s, wrap_hop_s)
        return 2.0 * (self.vpp * sum(hop_s) + (self.vpp - 1) * wrap_hop_s)

    def z_weight(self, m):
        return m - 1.0 / self.vpp if self.vpp > 1 else m - 1.0

    def position_weights(self, m, pp, phi):
        """interleaved: c_s = m - 1/v - w_s hi / v with rank s's warm-up w_s = min(2 (pp - s
        - 1) + (v - 1) pp, m v) (path_weights' path through s; w_0 gives its w_z)."""
        if self.vpp == 1:
            return super().position_weights(m, pp, phi)
        v = self.vpp
        return [m - 1.0 / v - self.path_window(pp, s, m) * phi.hi / v for s in range(pp)]

    def path_window(self, pp, s, m):
        """interleaved: rank s's warm-up, min(2 (pp - s - 1) + (v - 1) pp, m v) chunks."""
        if self.vpp == 1:
            return super().path_window(pp, s, m)
        return min(2 * (pp - s - 1) + (self.vpp - 1) * pp, m * self.vpp)

    def path_weights(self, m, pp, phi):
        """interleaved (v chunks): micro-batch 0 forward through all pp v virtual stages, chunk
        v-1's backward back to rank s, the rest of s's order (every backward, and the forwards
        after its warm-up w_s <= w_0 = min(2 (pp - 1) + (v - 1) pp, m v) and one more), then
        chunk 0's backward of the last micro-batch back to rank 0:
            S_f + (S_b - b_s) / v + m b_s + (m - (w_s + 1) / v) f_s + transfers + dp_0 + opt
            = S / v + (1 - 1/v) S_f + (m - 1/v) t_s - (w_s / v) f_s + ...
            >= (1/v + (1 - 1/v) lo) S + (m - 1/v - w_0 hi / v) z - (w_0 / v) excess + ..."""
        if self.vpp == 1:
            return super().path_weights(m, pp, phi)
        v = self.vpp
        w0 = self.path_window(pp, 0, m)
        return [(float(m), 0.0, False, 0.0),
                (m - 1.0 / v - w0 * phi.hi / v, 1.0 / v + (1 - 1.0 / v) * phi.lo, True, -w0 * phi.excess / v)]

    def stage_paths(self, pp, m):
        """interleaved: the chain paths, and for each rank s micro-batch 0's forward through
        every virtual stage, chunk v-1's backward back to s, the rest of s's order (every
        backward, the forwards after the warm-up w_s and one more), chunk 0's backward of the
        last micro-batch back to rank 0."""
        if self.vpp == 1:
            return super().stage_paths(pp, m)
        v, out = self.vpp, [self.chain_path(pp, m, s) for s in range(pp)]
        for s in range(pp):
            w = self.path_window(pp, s, m)
            fwd, bwd = [1.0] * pp, [1.0 / v] * pp
            fwd[s], bwd[s] = 1.0 + max(m * v - w - 1, 0) / v, float(m)
            out.append(_path(pp, fwd, bwd, [v + 1.0] * (pp - 1), v - 1.0))
        return out

    def path_p2p(self, hop_s, wrap_hop_s):
        """(v + 1) sum h + (v - 1) h_wrap: the forward crosses every chunk boundary, each
        backward leg the hops between its rank and the ends once."""
        if self.vpp == 1:
            return super().path_p2p(hop_s, wrap_hop_s)
        return (self.vpp + 1) * sum(hop_s) + (self.vpp - 1) * wrap_hop_s

    def sum_weight(self):
        return 1.0 / self.vpp if self.vpp > 1 else 1.0

    def group(self, pp: int, m: int, group: int | None = None) -> int:
        """Megatron's run-time rules for the interleaved schedule; returns the group size."""
        group = pp if group is None else group
        if self.vpp < 2:
            raise InputError(f"the interleaved schedule needs vpp >= 2, got {self.vpp}", field="vpp")
        if pp < 2:
            raise InputError("the interleaved schedule needs at least 2 pipeline stages", field="stages")
        if not pp <= group <= m:
            raise InputError(f"micro-batch group {group} must lie in [pp={pp}, m={m}] (Megatron-LM refuses it); "
                             f"use at least {pp} micro-batches", field="num_microbatches")
        if m % group:
            raise InputError(f"interleaved needs the number of micro-batches {m} divisible by pp {pp} "
                             f"(Megatron-LM refuses m % pp != 0); use a multiple of {pp}", field="num_microbatches")
        return group

    def check_runtime(self, pp, m):
        self.group(pp, m)

    def rank_order(self, pp, rank, m, group: int | None = None):
        vpp = self.vpp
        group = self.group(pp, m, group)
        total = m * vpp
        warmup = min(2 * (pp - rank - 1) + (vpp - 1) * group, total)

        def entry(k: int) -> tuple[int, int]:
            """(chunk, micro-batch) of the k-th forward of a rank in Megatron's schedule table."""
            return (k // group) % vpp, (k // (group * vpp)) * group + k % group

        def fwd(k: int) -> Action:
            c, i = entry(k)
            return _act("F", c, i)

        def bwd(k: int) -> Action:
            c, i = entry(k)
            return _act("B", vpp - 1 - c, i)

        out = [fwd(k) for k in range(warmup)]
        for k in range(total - warmup):
            out += [fwd(warmup + k), bwd(k)]
        out += [bwd(k) for k in range(total - warmup, total)]
        return out

    def violations(self, pp, m, layers, first_layer):
        out = []
        if self.vpp < 2:
            out.append("interleaved needs vpp >= 2")
        if pp < 2:
            out.append("interleaved needs at least 2 pipeline stages")
        if m % pp:
            out.append(f"interleaved needs micro-batches {m} divisible by pp {pp} (Megatron refuses it otherwise)")
        for i, n in enumerate(layers):
            if self.vpp >= 2 and n % self.vpp:
                out.append(f"stage {i}: {n} layers not divisible by vpp {self.vpp}")
        if self.vpp >= 2 and not out and first_layer != 0:
            out.append("stage 0 must start at layer 0")
        return out


class ZeroBubbleH1(Schedule):
    name = "zb-h1"
    modelled = False
    op_kinds = ("F", "I", "W")
    send_kind, grad_kind = "I", "W"
    needs_fork = "ZB-H1 needs the zero-bubble fork of Megatron-LM"

    def in_flight(self, pp, stage, m):
        """min(pp, m) on every stage: a micro-batch's activations stay until its deferred
        weight-gradient pass (PyTorch's ZB1P order, checked by the simulator)."""
        return float(min(pp, m))

    def pipeline_time(self, fwd_s, bwd_s, m, hops):
        """ZB-H1: T = m z + (sum_s t'_s + 2 max_s w_s - z),  w_s = W_FRACTION_OF_BWD b_s,
        t'_s = t_s - 2 w_s; at equal stages this is m t + (p-1)(F + I - W) with I = b - w the
        input-gradient pass, the published ZB-H1 time (the paper's (p-1)(T_F + T_B - T_W)) (used by `verify --schedule zb-h1`; the exact formulations cover 1F1B,
        interleaved and GPipe only)."""
        t = [f + b for f, b in zip(fwd_s, bwd_s)]
        z = steady_period_s(t, hops)
        w = [W_FRACTION_OF_BWD * b for b in bwd_s]
        return m * z, sum(ti - 2 * wi for ti, wi in zip(t, w)) + 2 * max(w) - z

    def p2p_time(self, hop_s, wrap_hop_s):
        """4 sum h."""
        return 4.0 * sum(hop_s)

    def rank_order(self, pp, rank, m):
        warmup = min(pp - rank - 1, m)
        out = [_act("F", 0, i) for i in range(warmup)]
        next_w = 0
        for k in range(m):
            if k < m - warmup:
                out.append(_act("F", 0, warmup + k))
            out.append(_act("I", 0, k))
            if k >= rank:
                out.append(_act("W", 0, next_w))
                next_w += 1
        out += [_act("W", 0, i) for i in range(next_w, m)]
        return out


_CLASSES: dict[str, type[Schedule]] = {c.name: c for c in (OneFOneB, Interleaved, GPipe, ZeroBubbleH1)}
NAMES: tuple[str, ...] = tuple(_CLASSES)                                  # every schedule a plan may name
MODELLED: tuple[str, ...] = tuple(n for n, c in _CLASSES.items() if c.modelled)  # solve's default space
INTERLEAVED = Interleaved.name
TOKEN_SLICED = GPipe.name     # the schedule token slices run under (TeraPipe's)


def known(name: str) -> bool:
    return name in _CLASSES


@functools.lru_cache(maxsize=256)
def schedule_of(name: str, vpp: int = 1) -> Schedule:
    """The schedule object of plan.json's (schedule, vpp); InputError for an unknown name."""
    cls = _CLASSES.get(name)
    if cls is None:
        raise InputError(f"unknown schedule {name!r}; use {', '.join(NAMES)}", field="schedule")
    return cls(vpp)


def searched(name: str, pp: int, names: tuple[str, ...]) -> bool:
    """Whether the search enumerates schedule `name` at pp among `names`: not at pp 1 where the
    schedule that dominates it there (Schedule.one_stage_twin) is among them (a plan of it is a
    plan of the twin with the same step and no more memory, so no optimum is lost)."""
    return not (pp == 1 and _CLASSES[name].one_stage_twin in names)


def has_chunks(name: str) -> bool:
    """Whether the schedule takes a vpp (virtual stages per rank) other than 1."""
    return _CLASSES[name] is Interleaved


def device_orders(schedule: str, pp: int, m: int, vpp: int = 1) -> list[list[Action]]:
    """The order of every rank 0..pp-1 for `schedule` with m micro-batches."""
    if pp < 1 or m < 1:
        raise InputError(f"need pp >= 1 and at least one micro-batch, got pp={pp}, m={m}", field="num_microbatches")
    return schedule_of(schedule, vpp).device_orders(pp, m)
