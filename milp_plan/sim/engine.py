"""A deterministic discrete-event engine over a DAG of operations on serial resources.

Every operation runs on one resource (a GPU, a link direction, a data-parallel channel)
for a fixed duration. A resource serves one operation at a time, first come first
served; an operation becomes ready when all its predecessors have finished. A device's
fixed schedule order is expressed as a chain of edges, so on a GPU an operation starts
exactly when its predecessors are done:

    start(o) = max(ready(o), time its resource becomes free)
    ready(o) = max over predecessors p of end(p)
    end(o)   = start(o) + duration(o)

Events are operation completions, processed in the order (time, priority, sequence
number): no wall clock, no global state, so the same graph gives the same times and the
same tie-breaks every run. Operations that never become ready mean the orders deadlock;
`run_graph` raises `Deadlock` naming them.
"""
from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field


class Deadlock(RuntimeError):
    """The device orders wait on each other: some operations can never start."""


@dataclass
class OpGraph:
    """Operations 0..n-1 as parallel lists (fast to build for 10^5-10^6 operations).

    duration_s[o] seconds on resource[o]; priority[o] breaks ties between completions at
    the same time (lower first); succ[o] lists the operations that wait for o."""

    num_resources: int
    duration_s: list[float] = field(default_factory=list)
    resource: list[int] = field(default_factory=list)
    priority: list[int] = field(default_factory=list)
    succ: list[list[int]] = field(default_factory=list)

    def add_op(self, duration_s: float, resource: int, priority: int = 0) -> int:
        """Append one operation; return its id."""
        if not 0 <= resource < self.num_resources:
            raise ValueError(f"resource {resource} outside 0..{self.num_resources - 1}")
        if duration_s < 0:
            raise ValueError(f"negative duration {duration_s}")
        self.duration_s.append(float(duration_s))
        self.resource.append(resource)
        self.priority.append(priority)
        self.succ.append([])
        return len(self.duration_s) - 1

    def add_ops(self, count: int, duration_s: float, resource: int, priority: int = 0) -> int:
        """Append `count` identical operations; return the id of the first."""
        first = len(self.duration_s)
        self.add_op(duration_s, resource, priority)
        rest = count - 1
        self.duration_s.extend([float(duration_s)] * rest)
        self.resource.extend([resource] * rest)
        self.priority.extend([priority] * rest)
        self.succ.extend([[] for _ in range(rest)])
        return first

    def add_edge(self, before: int, after: int) -> None:
        """`after` cannot start before `before` has finished."""
        self.succ[before].append(after)

    def __len__(self) -> int:
        return len(self.duration_s)


@dataclass(frozen=True)
class Timing:
    """Start and end time (seconds) of every operation of a graph."""

    start_s: list[float]
    end_s: list[float]

    @property
    def makespan_s(self) -> float:
        return max(self.end_s, default=0.0)


def run_graph(g: OpGraph) -> Timing:
    """Execute `g` event by event; return every operation's start and end time."""
    n = len(g)
    dur, res, prio, succ = g.duration_s, g.resource, g.priority, g.succ
    npred = [0] * n
    for outs in succ:
        for v in outs:
            npred[v] += 1
    start, end = [0.0] * n, [-1.0] * n
    busy = [False] * g.num_resources
    waiting: list[deque[int]] = [deque() for _ in range(g.num_resources)]
    heap: list[tuple[float, int, int, int]] = []
    push, pop, seq = heapq.heappush, heapq.heappop, 0
    for op in range(n):
        if npred[op] == 0:
            if busy[res[op]]:
                waiting[res[op]].append(op)
            else:
                busy[res[op]] = True
                start[op] = 0.0
                push(heap, (dur[op], prio[op], seq, op))
                seq += 1
    done = 0
    while heap:
        now, _, _, op = pop(heap)
        end[op] = now
        done += 1
        r = res[op]
        if waiting[r]:
            nxt = waiting[r].popleft()
            start[nxt] = now
            push(heap, (now + dur[nxt], prio[nxt], seq, nxt))
            seq += 1
        else:
            busy[r] = False
        for v in succ[op]:
            npred[v] -= 1
            if npred[v] == 0:
                rv = res[v]
                if busy[rv]:
                    waiting[rv].append(v)
                else:
                    busy[rv] = True
                    start[v] = now
                    push(heap, (now + dur[v], prio[v], seq, v))
                    seq += 1
    if done < n:
        stuck = [o for o in range(n) if end[o] < 0][:8]
        raise Deadlock(f"{n - done} of {n} operations never started (first: {stuck}); the device orders "
                       "wait on each other")
    return Timing(start, end)
