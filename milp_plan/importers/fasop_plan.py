"""FASOP (HPDC'24) search results: `main_logs/<exp>.csv`, one row per candidate plan.

FASOP writes the rows sorted by its estimated step time, best first, with the columns

    mbs, tp, dp, pp, node placement, partition, estimated time (s/step), pipeline time,
    DP all-reduce time, embedding layer all-reduce time, price_per_step, is_oom, ...

(older logs name the time column `estimated time (step/s)` although it holds seconds per
step, and lack `num_a100`, `num_a10` and `train_cost`). Read here:

* `mbs`, `tp`, `dp`, `pp`: one setting for every stage; `pp` may be written `16.0`.
* `node placement`: a Python list literal, one entry per node in rank order. An entry is
  an AWS instance (`p4d.24xlarge`/`p4de.24xlarge` -> an A100 node, `g5.*` -> an A10
  node, as FASOP's code treats them), a GPU name (`A100`, `A10`) or a node-type name of
  the cluster. Each entry takes the next unused cluster node of that kind, in cluster
  order.
* `partition`: layer *slots* per stage. FASOP's slots are embedding, the blocks and
  post-process (T5: embedding, the encoder blocks, the decoder embedding, the decoder
  blocks); the embedding slots are not blocks (peer_rows.split_slots).
* `estimated time ...`: FASOP's own step-time estimate (seconds), kept for comparison.

Ranks: FASOP numbers GPUs node after node (node j holds ranks j*M .. j*M+M-1) and
rank = tp_index + tp x dp_index + tp x dp x stage (amp_utils.axis2rank), so stage s is the
block of tp x dp consecutive ranks from s x tp x dp, tp fastest: milp-plan's order. FASOP
assumes the same GPUs per node everywhere (--gpu_per_node); here each node contributes
the GPUs its cluster node type has, and the row must use all of them.
"""
from __future__ import annotations

import ast
import csv
import io
from dataclasses import dataclass

from milp_plan.cluster import Cluster
from milp_plan.errors import InputError
from milp_plan.fileio import read_text
from milp_plan.importers import peer_rows
from milp_plan.importers.peer_rows import PeerLayout, PeerStage
from milp_plan.instance import Instance
from milp_plan.plan import Device

NAME = "FASOP"
REQUIRED = ("mbs", "tp", "dp", "pp", "node placement", "partition")
# AWS instances FASOP names, and the GPU its code assumes for them (device_placement.py)
INSTANCE_GPU = {"p4d.24xlarge": "A100", "p4de.24xlarge": "A100", "g5.12xlarge": "A10", "g5.24xlarge": "A10",
                "g5.48xlarge": "A10"}
MAX_ROWS = 100_000


@dataclass(frozen=True)
class FasopRow:
    line: int                     # line of the CSV (header = 1)
    mbs: int
    tp: int
    dp: int
    pp: int
    nodes: tuple[str, ...]
    partition: tuple[int, ...]
    est_step_s: float | None
    is_oom: bool | None


def _int(value: str, col: str, source: str, line: int) -> int:
    try:
        f = float(value)
    except ValueError:
        f = float("nan")
    if not f == f or f != int(f) or f < 1:
        raise InputError(f"line {line}: column '{col}' must be a whole number >= 1, got {value!r:.30}",
                         source=source)
    return int(f)


def _list(value: str, col: str, source: str, line: int, kind: type) -> tuple:
    try:
        out = ast.literal_eval(value)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        out = None
    if not isinstance(out, (list, tuple)) or not out or not all(isinstance(v, kind) and not isinstance(v, bool)
                                                               for v in out):
        what = "node names like ['p4d.24xlarge', 'g5.24xlarge']" if kind is str else "whole numbers like [7, 6, 6]"
        raise InputError(f"line {line}: column '{col}' must be a list of {what}, got {value!r:.40}", source=source)
    return tuple(out)


def read_rows(path: str) -> list[FasopRow]:
    """Every row of a FASOP CSV, in file order (FASOP's ranking)."""
    text = read_text(path, "FASOP result CSV")
    reader = csv.DictReader(io.StringIO(text))
    header = [h.strip() for h in reader.fieldnames or []]
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise InputError(f"not a FASOP result CSV: no column {', '.join(repr(c) for c in missing)} (FASOP writes "
                         f"{', '.join(REQUIRED)}, ...)", source=path)
    time_col = next((h for h in reader.fieldnames or [] if h.strip().startswith("estimated time")), None)
    rows = []
    for i, raw in enumerate(reader):
        line = i + 2
        if i >= MAX_ROWS:
            raise InputError(f"more than {MAX_ROWS:,} rows; keep the rows you want to import", source=path)
        r = {k.strip(): (v or "").strip() for k, v in raw.items() if k is not None}
        est = None
        if time_col and r.get(time_col.strip()):
            try:
                est = float(r[time_col.strip()])
            except ValueError:
                est = None
        oom = {"true": True, "false": False}.get(r.get("is_oom", "").lower())
        rows.append(FasopRow(line, *(_int(r[c], c, path, line) for c in ("mbs", "tp", "dp", "pp")),
                             _list(r["node placement"], "node placement", path, line, str),
                             _list(r["partition"], "partition", path, line, int), est, oom))
    return rows


def _node_pool(cluster: Cluster, entry: str) -> list[int]:
    """Global indices of the cluster nodes an entry of `node placement` may take, cluster order."""
    by_type = [nt for nt in cluster.node_types if nt.name.lower() == entry.lower()]
    types = by_type or peer_rows.node_types_for_gpu(cluster, INSTANCE_GPU.get(entry.lower(), entry))
    return [n.index for n in cluster.nodes if n.type in types]


def devices_in_rank_order(row: FasopRow, cluster: Cluster, source: str, where: str) -> list[Device]:
    taken: set[int] = set()
    out: list[Device] = []
    for j, entry in enumerate(row.nodes):
        pool = _node_pool(cluster, entry)
        if not pool:
            raise InputError(f"{where}: node {j} is '{entry}', which matches no node type of cluster "
                             f"'{cluster.name}' ({', '.join(f'{nt.name}: {nt.gpu.name}' for nt in cluster.node_types)})"
                             "; name the node type after the instance or give a cluster with that GPU", source=source)
        free = [n for n in pool if n not in taken]
        if not free:
            raise InputError(f"{where}: the row places {sum(1 for e in row.nodes if _node_pool(cluster, e) == pool)} "
                             f"'{entry}' nodes, cluster '{cluster.name}' has {len(pool)}; give a cluster with as "
                             "many nodes", source=source)
        taken.add(free[0])
        node = cluster.nodes[free[0]]
        out += [Device(node.index, g) for g in range(node.type.gpus_per_node)]
    return out


def read_layout(path: str, inst: Instance, rank: int) -> PeerLayout:
    row = peer_rows.pick_row(read_rows(path), rank, path, "FASOP")
    where = f"FASOP row {rank} (line {row.line})"
    size = row.tp * row.dp
    if len(row.partition) != row.pp:
        raise InputError(f"{where}: the partition has {len(row.partition)} stages but pp is {row.pp}", source=path)
    devices = devices_in_rank_order(row, inst.cluster, path, where)
    if len(devices) != size * row.pp:
        raise InputError(f"{where}: tp {row.tp} x dp {row.dp} x pp {row.pp} = {size * row.pp} GPUs, but its "
                         f"{len(row.nodes)} nodes hold {len(devices)} GPUs on cluster '{inst.cluster.name}'; FASOP "
                         "uses every GPU of its nodes (--gpu_per_node): give a cluster with "
                         f"{size * row.pp // len(row.nodes)} GPUs per node", source=path)
    mbs, m = peer_rows.micro_batches(inst.job.global_batch_size, row.dp, row.mbs, None, path, where)
    blocks = peer_rows.split_slots(row.partition, block_slots(inst), path, where)
    stages = tuple(PeerStage(tuple(devices[s * size:(s + 1) * size]), row.tp, row.dp, mbs, blocks[s])
                   for s in range(row.pp))
    notes = ("FASOP marked this row out of memory (is_oom True) under its memory model",) if row.is_oom else ()
    return PeerLayout("fasop", rank, stages, m, row.est_step_s,
                      f"tp {row.tp}, dp {row.dp}, pp {row.pp}, mbs {row.mbs}, nodes {', '.join(row.nodes)}, "
                      f"partition {list(row.partition)}", notes)


def block_slots(inst: Instance) -> list[bool]:
    """FASOP's layer slots (estimate.get_layer_type): [embedding, blocks..., post_process];
    T5: [embedding, encoder blocks..., embedding, decoder blocks...]."""
    m = inst.model
    if m.arch == "t5":
        return [False] + [True] * m.encoder_layers + [False] + [True] * (m.num_layers - m.encoder_layers)
    return [False] + [True] * m.num_layers + [False]
