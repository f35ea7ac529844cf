"""Per-device operation orders of the pipeline schedules.

An order is the list of actions one pipeline rank executes, in sequence. An action is
(kind, chunk, micro-batch): kind F (forward), B (full backward), I (backward for the
input gradient) or W (backward for the weight gradient); chunk j of rank r is virtual
stage j * pp + r (chunk 0 unless interleaved).

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
             m mod pp != 0 (default group); so do we.
zb-h1        Zero-bubble H1 (Qi et al. 2024) in PyTorch's order: w_r = min(pp - r - 1, m)
             warm-up forwards, then F, I pairs; from the (r+1)-th pair on, each pair is
             followed by the oldest pending W; the cool-down issues I (+ W from index r on),
             then every remaining W.
"""
from __future__ import annotations

from typing import NamedTuple

from milp_plan.errors import InputError

SIM_SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")


class Action(NamedTuple):
    kind: str    # F | B | I | W
    chunk: int   # local chunk index (virtual stage = chunk * pp + rank)
    mb: int      # micro-batch index

    def __str__(self) -> str:
        return f"{self.chunk}{self.kind}{self.mb}"


def _act(kind: str, chunk: int, mb: int) -> Action:
    return _tuple_new(Action, (kind, chunk, mb))   # Action(...) without the keyword-argument layer


_tuple_new = tuple.__new__


def gpipe_order(pp: int, rank: int, m: int) -> list[Action]:
    return [_act("F", 0, i) for i in range(m)] + [_act("B", 0, i) for i in range(m)]


def one_f_one_b_order(pp: int, rank: int, m: int) -> list[Action]:
    warmup = min(pp - rank - 1, m)
    out = [_act("F", 0, i) for i in range(warmup)]
    for i in range(m - warmup):
        out += [_act("F", 0, warmup + i), _act("B", 0, i)]
    out += [_act("B", 0, i) for i in range(m - warmup, m)]
    return out


def check_interleaved(pp: int, m: int, vpp: int, group: int | None = None) -> int:
    """Megatron's run-time rules for the interleaved schedule; returns the group size."""
    group = pp if group is None else group
    if vpp < 2:
        raise InputError(f"the interleaved schedule needs vpp >= 2, got {vpp}", field="vpp")
    if pp < 2:
        raise InputError("the interleaved schedule needs at least 2 pipeline stages", field="stages")
    if not pp <= group <= m:
        raise InputError(f"micro-batch group {group} must lie in [pp={pp}, m={m}] (Megatron-LM refuses it); "
                         f"use at least {pp} micro-batches", field="num_microbatches")
    if m % group:
        raise InputError(f"interleaved needs the number of micro-batches {m} divisible by pp {pp} "
                         f"(Megatron-LM refuses m % pp != 0); use a multiple of {pp}", field="num_microbatches")
    return group


def _interleaved_entry(k: int, vpp: int, group: int) -> tuple[int, int]:
    """(chunk, micro-batch) of the k-th forward of a rank in Megatron's schedule table."""
    return (k // group) % vpp, (k // (group * vpp)) * group + k % group


def interleaved_order(pp: int, rank: int, m: int, vpp: int, group: int | None = None) -> list[Action]:
    group = check_interleaved(pp, m, vpp, group)
    total = m * vpp
    warmup = min(2 * (pp - rank - 1) + (vpp - 1) * group, total)

    def fwd(k: int) -> Action:
        c, i = _interleaved_entry(k, vpp, group)
        return _act("F", c, i)

    def bwd(k: int) -> Action:
        c, i = _interleaved_entry(k, vpp, group)
        return _act("B", vpp - 1 - c, i)

    out = [fwd(k) for k in range(warmup)]
    for k in range(total - warmup):
        out += [fwd(warmup + k), bwd(k)]
    out += [bwd(k) for k in range(total - warmup, total)]
    return out


def zb_h1_order(pp: int, rank: int, m: int) -> list[Action]:
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


def device_orders(schedule: str, pp: int, m: int, vpp: int = 1) -> list[list[Action]]:
    """The order of every rank 0..pp-1 for `schedule` with m micro-batches."""
    if pp < 1 or m < 1:
        raise InputError(f"need pp >= 1 and at least one micro-batch, got pp={pp}, m={m}", field="num_microbatches")
    if schedule == "interleaved":
        check_interleaved(pp, m, vpp)
        return [interleaved_order(pp, r, m, vpp) for r in range(pp)]
    if vpp != 1:
        raise InputError(f"vpp {vpp} needs the interleaved schedule, not {schedule!r}", field="vpp")
    makers = {"gpipe": gpipe_order, "1f1b": one_f_one_b_order, "zb-h1": zb_h1_order}
    if schedule not in makers:
        raise InputError(f"unknown schedule {schedule!r}; use {', '.join(SIM_SCHEDULES)}", field="schedule")
    return [makers[schedule](pp, r, m) for r in range(pp)]
