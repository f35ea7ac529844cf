"""Metis (ATC'24) search results: the ranked list `cost_het_cluster.py` prints.

After its search Metis prints a header and one line per plan, best (lowest cost) first:

    rank, cost, node_sequence, device_groups, strategies(dp_deg, tp_deg), batches(number of batch), layer_partition
    1, 2396.73, (<DeviceType.T4: 't4'>, <DeviceType.A100: 'a100'>), [8, 8], [(4, 2), (4, 2)], 8, [0, 4, 10]

Read here (the rest of the log is skipped; give the whole log or only these lines):

* rank: Metis' 1-based rank; `--rank N` picks the line whose rank is N.
* cost: Metis' estimated iteration time in **ms** (its profiles are in ms), kept for comparison.
* node_sequence: the order of the GPU *types*. Metis numbers the GPUs type after type in
  this order (model/device_group.py `_get_device_placement`); inside a type, here, in
  cluster node order (hostfile order for a Metis cluster whose hosts of a type form one
  node type). `DeviceType.X` or a plain name `'X'` are both read; X maps to the cluster's
  GPU named X or X-<suffix> (A100 -> A100-80GB).
* device_groups: GPUs per stage; stage s takes the next device_groups[s] ranks.
* strategies: (dp, tp) per stage; dp x tp must equal the stage's GPUs. Inside a stage
  the GPUs are taken tp fastest (Megatron's order).
* batches: the number of micro-batches per step; a stage's micro-batch per replica is
  global_batch / batches / dp (Metis' `gbs // batches // dp_deg`).
* layer_partition: stage boundaries over Metis' layer slots (embedding, the blocks, the
  head; profile `num_layers` counts all of them): stage s holds slots
  [p[s], p[s+1]).
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from milp_plan.cluster import Cluster
from milp_plan.errors import InputError
from milp_plan.fileio import read_text
from milp_plan.importers import peer_rows
from milp_plan.importers.peer_rows import PeerLayout, PeerStage
from milp_plan.instance import Instance
from milp_plan.plan import Device

NAME = "Metis"
_ROW = re.compile(r"^\s*\d+\s*,\s*[-+0-9.eE]+\s*,\s*[(\[]")
_ENUM = re.compile(r"<DeviceType\.(\w+):\s*'[^']*'>|DeviceType\.(\w+)")
MAX_ROWS = 1_000_000


@dataclass(frozen=True)
class MetisRow:
    line: int
    rank: int
    cost_ms: float
    node_sequence: tuple[str, ...]
    device_groups: tuple[int, ...]
    strategies: tuple[tuple[int, int], ...]   # (dp, tp) per stage
    batches: int
    layer_partition: tuple[int, ...]


def _whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _parse(text: str, line: int, source: str) -> MetisRow:
    form = ("write 'rank, cost, (node types), [GPUs per stage], [(dp, tp) per stage], batches, "
            "[layer boundaries]' as Metis prints it")
    try:
        value = ast.literal_eval("(" + _ENUM.sub(lambda m: repr(m.group(1) or m.group(2)), text) + ")")
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise InputError(f"line {line}: not a Metis result row; {form}", source=source) from None
    ok = isinstance(value, tuple) and len(value) == 7
    if ok:
        rank, cost, seq, groups, strategies, batches, partition = value
        ok = (_whole(rank) and isinstance(cost, (int, float)) and not isinstance(cost, bool)
              and isinstance(seq, (tuple, list)) and seq and all(isinstance(s, str) for s in seq)
              and isinstance(groups, list) and groups and all(_whole(g) and g > 0 for g in groups)
              and isinstance(strategies, list) and all(isinstance(s, (tuple, list)) and len(s) == 2
                                                        and all(_whole(x) and x > 0 for x in s) for s in strategies)
              and _whole(batches) and batches > 0
              and isinstance(partition, list) and all(_whole(p) for p in partition))
    if not ok:
        raise InputError(f"line {line}: not a Metis result row; {form}", source=source)
    return MetisRow(line, rank, float(cost), tuple(seq), tuple(groups), tuple(tuple(s) for s in strategies),
                    batches, tuple(partition))


def read_rows(path: str) -> list[MetisRow]:
    """Every result row of a Metis log, in file order."""
    rows = []
    for i, text in enumerate(read_text(path, "Metis result log").splitlines(), 1):
        if _ROW.match(text):
            if len(rows) >= MAX_ROWS:
                raise InputError(f"more than {MAX_ROWS:,} result rows; keep the rows you want", source=path)
            rows.append(_parse(text.strip(), i, path))
    return rows


def _pick(rows: list[MetisRow], rank: int, path: str) -> MetisRow:
    mine = [r for r in rows if r.rank == rank]
    if len(mine) > 1:
        raise InputError(f"rank {rank} appears on lines {', '.join(str(r.line) for r in mine)}; keep one",
                         source=path)
    return mine[0] if mine else peer_rows.pick_row(rows, rank, path, "Metis")


def devices_in_rank_order(row: MetisRow, cluster: Cluster, source: str, where: str) -> list[Device]:
    out: list[Device] = []
    for name in row.node_sequence:
        types = peer_rows.node_types_for_gpu(cluster, name)
        if not types:
            raise InputError(f"{where}: node_sequence names {name}, but cluster '{cluster.name}' has no such GPU "
                             f"(it has {', '.join(cluster.gpu_types())}); give the cluster Metis planned for",
                             source=source)
        out += [Device(n.index, g) for n in cluster.nodes if n.type in types for g in range(n.type.gpus_per_node)]
    return out


def read_layout(path: str, inst: Instance, rank: int) -> PeerLayout:
    row = _pick(read_rows(path), rank, path)
    where = f"Metis rank {row.rank} (line {row.line})"
    pp = len(row.device_groups)
    if len(row.strategies) != pp or len(row.layer_partition) != pp + 1:
        raise InputError(f"{where}: {pp} device groups but {len(row.strategies)} strategies and "
                         f"{len(row.layer_partition)} partition boundaries (need {pp} and {pp + 1})", source=path)
    bounds = row.layer_partition
    if bounds[0] != 0 or any(b <= a for a, b in zip(bounds, bounds[1:])):
        raise InputError(f"{where}: layer_partition {list(bounds)} must start at 0 and rise strictly", source=path)
    for s, ((dp, tp), g) in enumerate(zip(row.strategies, row.device_groups)):
        if dp * tp != g:
            raise InputError(f"{where}: stage {s} has {g} GPUs but strategy (dp {dp}, tp {tp}) uses {dp * tp}",
                             source=path)
    devices = devices_in_rank_order(row, inst.cluster, path, where)
    if len(devices) != sum(row.device_groups):
        raise InputError(f"{where}: the device groups use {sum(row.device_groups)} GPUs, but the GPU types "
                         f"{', '.join(row.node_sequence)} of cluster '{inst.cluster.name}' number {len(devices)}; "
                         "give the cluster Metis planned for", source=path)
    blocks = peer_rows.split_slots([b - a for a, b in zip(bounds, bounds[1:])],
                                   [False] + [True] * inst.model.num_layers + [False], path, where)
    stages, start = [], 0
    for s, ((dp, tp), g) in enumerate(zip(row.strategies, row.device_groups)):
        mbs, _ = peer_rows.micro_batches(inst.job.global_batch_size, dp, None, row.batches, path,
                                         f"{where}: stage {s}")
        stages.append(PeerStage(tuple(devices[start:start + g]), tp, dp, mbs, blocks[s]))
        start += g
    return PeerLayout("metis", row.rank, tuple(stages), row.batches, row.cost_ms / 1000.0,
                      f"node sequence {', '.join(row.node_sequence)}, device groups {list(row.device_groups)}, "
                      f"(dp, tp) {[tuple(s) for s in row.strategies]}, {row.batches} micro-batches, layer partition "
                      f"{list(bounds)}")
