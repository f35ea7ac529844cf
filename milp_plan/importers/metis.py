"""Metis (ATC'24) inputs: a cluster JSON + hostfile, and a profile directory.

Cluster (`--cluster metis:CLUSTER.json,HOSTFILE`, or `--cluster CLUSTER.json` with a file
named `hostfile` or `hostfile.txt` beside it):

* CLUSTER.json maps each host (IP or name) to `instance_type` (GPU name),
  `inter_bandwidth`, `intra_bandwidth` and `memory` (GPU memory, GB).
* HOSTFILE has one `<host> slots=<n>` (or `<host> <n>`) line per node; `#` starts a
  comment. Only the hostfile's hosts are nodes, in hostfile order; the JSON must
  describe each of them (extra JSON hosts are ignored, but must still be valid hosts).

Conversions (the notice in the cluster description says which were applied):

* Bandwidth: Metis' cost model reads `inter_bandwidth` and `intra_bandwidth` in units
  of 2^20 bytes per millisecond: model/cost_estimator.py multiplies the value by
  1024 * 1024 and divides bytes by it to get ms (`_get_pp_cost`, `_get_dp_cost`); its
  results/ use values like 10 and 46. One unit is therefore

      2^20 B/ms = 1,048,576 x 1000 B/s = 1.048576 GB/s    (GB = 10^9 bytes)

  and a value v <= 1e4 becomes v x 1.048576 GB/s (46 -> 48.234496 GB/s). Metis' README
  example writes bytes/s instead (312500000.0 = 2.5 Gbit/s); in the code's unit such a
  value would be a network above 10^15 B/s, so a value > 1e6 is read as bytes/s and
  divided by 1e9. A value in between is ambiguous and rejected. `intra_bandwidth`
  becomes the per-GPU intra-node bandwidth, `inter_bandwidth` the per-node network
  bandwidth. (Metis' own GPUCluster.get_inter_bandwidth returns the intra value, a bug
  of theirs not copied here.)
* GPU: `instance_type` maps to a catalog GPU by exact name (case-insensitive), else by
  a unique prefix (`A10` -> A10, `P100` -> P100-16GB), else by a prefix whose catalog
  memory equals `memory` within 0.5 GB (`A100` + 80 -> A100-80GB, `V100` + 16 ->
  V100-16GB, `V100` + 32 -> V100-32GB). `memory` then replaces the catalog memory
  (like `gpu_memory_gib` in a YAML cluster): Metis' example P100 with `memory: 15` is
  a P100-16GB planned at 15 GB.
* Price: Metis has none, so every node type costs 0 $/h; cost objectives need a YAML
  cluster with `usd_per_hour`.
* Hosts with the same GPU, memory, bandwidths and slots form one node type named
  `<gpu>-x<slots>` (a `-2`, `-3` suffix when the name repeats).

Profiles (`DeviceType.<GPU>_tp<T>_bs<B>.json`, one iteration with micro = global batch
= B): `model.num_layers` counts embedding and head as layers; per layer slot,
`execution_time.layer_compute_total_ms[]` is forward + backward in ms. Each native row
takes the mean over the slots of its kind (see `slots`) and splits it 1:2,

    fwd_ms = t / 3,   bwd_ms = 2 t / 3      (backward ~ 2 x forward FLOPs),

with micro_batch_size = B, tp = T, gpu = <GPU> as written in the file name (the
instance maps it to a cluster GPU) and seq_length = the job's sequence length.
`model.parameters.parameters_per_layer_bytes[]` becomes `param_bytes` per kind; a block
slot's bytes x tp must be 2 or 4 per parameter of the model's block (within 15%), else the
profile is of another model shape: an error. Metis files record no sequence length: a
directory whose name says one (`gpt3_seq1024`, `seq_len-2048`) sets the job's when --seq-len
is not given (a note says so) and must agree with it when it is (else an error); a directory
whose name says none is read at the job's length, with a note.
What else a file measures goes where the cost model has the term (Metis' own cost model,
model/cost_estimator.py, charges the same quantities):

* `forward_backward_time_ms - sum(layer_compute_total_ms)`: per micro-batch, the time no
  layer holds (the loss, synchronisation; Metis' `fb_sync`, charged to the last stage once
  per micro-batch): added to the head's fwd + bwd before the 1:2 split, so the last stage
  pays it on every micro-batch; 0 when the difference is negative;
* `batch_generator_time_ms`: building one micro-batch (Metis charges it per micro-batch):
  added to the embedding's forward, so the first stage pays it before every forward;
* `optimizer_time_ms`: one Adam step over the whole model on one GPU of the tp group, i.e.
  over num_parameters / tp parameters: the column `optimizer_ns_per_param` (the cost model's
  optimizer time, costmodel.optimizer_s, uses it instead of its bandwidth formula);
* `execution_memory.layer_memory_total_mb[]`: a layer's whole footprint at micro-batch B
  (its parameters, gradients and optimizer state plus one micro-batch's activations): the
  column `mem_total_bytes` (x 2^20); the cost model takes a layer's measured activations as
  that total less its model states (costmodel.measured_activation_bytes) and says so;
* `forward_backward_time_ms` and the others are also kept per file in the provenance.

Times are measured with tp, so `tp_comm_included` is true.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from milp_plan.cluster import GPU, MAX_GPUS, Cluster, NodeType, gpu_catalog, valid_host
from milp_plan.errors import InputError
from milp_plan import fileio
from milp_plan.fileio import check_fields, number, read_text
from milp_plan.importers import slots
from milp_plan.model import Model
from milp_plan.profile import Profile

HOSTFILE_NAMES = ("hostfile", "hostfile.txt")
MAX_SLOTS = 64            # GPUs per host (cluster.MAX_GPUS_PER_NODE)
BYTES_PER_S_ABOVE = 1e6   # a bandwidth above this is bytes/s (Metis' README example)
METIS_UNITS_UP_TO = 1e4   # a bandwidth up to this is in Metis' unit, 2^20 bytes per ms
GB_PER_S_PER_METIS_UNIT = 2**20 * 1e3 / 1e9   # 2^20 B/ms in 10^9 B/s: 1.048576
MIB = 2.0**20              # layer_memory_total_mb: torch allocator bytes / 2^20
_HOST_FIELDS = ["instance_type", "inter_bandwidth", "intra_bandwidth", "memory"]
_PROFILE_NAME = re.compile(r"^DeviceType\.(?P<gpu>.+?)_tp(?P<tp>\d+)_bs(?P<bs>\d+)\.json$")
_SEQ_IN_NAME = re.compile(r"seq(?:_?len(?:gth)?)?[_-]?(\d+)", re.IGNORECASE)   # gpt3_seq1024, seq_len-2048


def load_json(path: Path, what: str) -> Any:
    """fileio.load_json: syntax, NaN/Infinity and nesting depth checked in one place."""
    return fileio.load_json(path, what)


# ---- cluster -------------------------------------------------------------------------
def split_spec(spec: str) -> tuple[Path, Path]:
    """'CLUSTER.json,HOSTFILE' -> both paths; 'CLUSTER.json' -> the hostfile found beside it."""
    parts = [p.strip() for p in spec.split(",")]
    if len(parts) == 2 and all(parts):
        return Path(parts[0]), Path(parts[1])
    if len(parts) != 1 or not parts[0]:
        raise InputError("a Metis cluster is metis:CLUSTER.json,HOSTFILE (two paths, one comma)", source=spec)
    cluster = Path(parts[0])
    for name in HOSTFILE_NAMES:
        if (cluster.parent / name).is_file():
            return cluster, cluster.parent / name
    raise InputError(f"no hostfile beside this Metis cluster JSON (looked for {', '.join(HOSTFILE_NAMES)}); "
                     "give it as --cluster metis:CLUSTER.json,HOSTFILE", source=str(cluster))


def parse_hostfile(path: Path) -> list[tuple[str, int]]:
    """(host, slots) per node in file order, from `<host> slots=<n>` or `<host> <n>` lines."""
    out: list[tuple[str, int]] = []
    for lineno, raw in enumerate(read_text(path, "Metis hostfile").splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        host, slots_n = _hostfile_line(line.split(), path, lineno)
        if host in (h for h, _ in out):
            raise InputError(f"line {lineno}: host '{host}' appears twice; list each node once", source=str(path))
        out.append((host, slots_n))
    if not out:
        raise InputError("hostfile lists no hosts; write one '<host> slots=<n>' line per node", source=str(path))
    return out


def _hostfile_line(tokens: list[str], path: Path, lineno: int) -> tuple[str, int]:
    form = "write '<host> slots=<n>' or '<host> <n>'"
    if not valid_host(tokens[0]):
        raise InputError(f"line {lineno}: {tokens[0]!r} is not an IP address or RFC 1123 host name "
                         f"(letters, digits, hyphens and dots only); {form}", source=str(path))
    count = tokens[1].removeprefix("slots=") if len(tokens) == 2 else ""
    # ASCII digits only: str.isdigit() accepts '²' and other digits int() cannot read
    if not re.fullmatch(r"[0-9]{1,4}", count) or not 0 < int(count) <= MAX_SLOTS:
        raise InputError(f"line {lineno}: {' '.join(tokens)[:60]!r} has no GPU count from 1 to {MAX_SLOTS}; {form}",
                         source=str(path))
    return tokens[0], int(count)


def bandwidth_gb_per_s(value: float, source: str, where: str, field: str) -> tuple[float, str]:
    """GB/s and the unit it was read in: > 1e6 -> bytes/s / 1e9; <= 1e4 -> Metis' 2^20 B/ms
    x 1.048576; between: error (see the module docstring)."""
    if value > BYTES_PER_S_ABOVE:
        return value / 1e9, "bytes/s"
    if value <= METIS_UNITS_UP_TO:
        return value * GB_PER_S_PER_METIS_UNIT, "MiB/ms"
    raise InputError(f"{where}: field '{field}' = {value:g} is ambiguous (Metis' unit, 2^20 bytes per ms, gives "
                     "values <= 1e4; bytes/s are > 1e6); write it in 2^20 bytes per ms as Metis' cost model "
                     "reads it, or in bytes/s", source=source)


def match_catalog_gpu(instance_type: str, memory_gb: float, source: str, where: str) -> GPU:
    """Exact (case-insensitive) catalog name, else unique prefix, else the prefix match with this memory."""
    catalog = gpu_catalog()
    name = instance_type.lower()
    exact = [g for k, g in catalog.items() if k.lower() == name]
    prefix = [g for k, g in catalog.items() if k.lower().startswith(name)]
    by_memory = [g for g in prefix if abs(g.memory_gib - memory_gb) < 0.5]
    for found in (exact, prefix, by_memory):
        if len(found) == 1:
            g = found[0]
            return GPU(g.name, memory_gb, g.peak_tflops, g.memory_gb_per_s, g.source)
    hint = f"it matches {', '.join(g.name for g in prefix)} and memory {memory_gb:g} picks none" if prefix else \
        "no catalog GPU has this name"
    raise InputError(f"{where}: unknown GPU instance_type '{instance_type}' ({hint}); set instance_type to one of "
                     f"{', '.join(catalog)}, or write a YAML cluster with an inline gpu", source=source)


def _host_record(host: str, spec: Any, source: str) -> tuple[tuple, dict[str, str]]:
    """(group key, units used) for one host of the cluster JSON."""
    where = f"host '{host}'"
    check_fields(spec, source=source, where=where, required=_HOST_FIELDS)
    itype = spec["instance_type"]
    if not isinstance(itype, str) or not itype.strip():
        raise InputError(f"{where}: field 'instance_type' must be a GPU name like A100", source=source)
    memory = number(spec, "memory", source=source, where=where)
    gpu = match_catalog_gpu(itype.strip(), memory, source, where)
    intra, u_intra = bandwidth_gb_per_s(number(spec, "intra_bandwidth", source=source, where=where, maximum=1e15),
                                        source, where, "intra_bandwidth")
    inter, u_inter = bandwidth_gb_per_s(number(spec, "inter_bandwidth", source=source, where=where, maximum=1e15),
                                        source, where, "inter_bandwidth")
    return (gpu, intra, inter), {"intra_bandwidth": u_intra, "inter_bandwidth": u_inter}


def _read_hosts(path: Path) -> dict[str, Any]:
    data = load_json(path, "Metis cluster JSON")
    if not isinstance(data, Mapping) or not data:
        raise InputError("a Metis cluster JSON maps each host to {instance_type, inter_bandwidth, "
                         "intra_bandwidth, memory}", source=str(path))
    for host in data:
        if not valid_host(host):
            raise InputError(f"host {host!r} is not an IP address or RFC 1123 host name (letters, digits, hyphens "
                             "and dots only); rename it", source=str(path))
    return dict(data)


def _group_nodes(nodes: list[tuple[str, int]], hosts: dict[str, Any], json_path: Path,
                 host_path: Path) -> tuple[tuple[NodeType, ...], dict[str, set[str]]]:
    groups: dict[tuple, list[str]] = {}
    units: dict[str, set[str]] = {}
    for host, n in nodes:
        if host not in hosts:
            raise InputError(f"host '{host}' is not in {json_path}; add it there with "
                             f"{', '.join(_HOST_FIELDS)}", source=str(host_path))
        (gpu, intra, inter), used = _host_record(host, hosts[host], str(json_path))
        for field, unit in used.items():
            units.setdefault(field, set()).add(unit)
        groups.setdefault((gpu, intra, inter, n), []).append(host)
    types, seen = [], Counter()
    for (gpu, intra, inter, n), members in groups.items():
        base = f"{gpu.name.lower()}-x{n}"
        seen[base] += 1
        name = base if seen[base] == 1 else f"{base}-{seen[base]}"
        types.append(NodeType(name, gpu, n, len(members), intra, inter, 0.0, tuple(members)))
    return tuple(types), units


def _notice(units: dict[str, set[str]]) -> str:
    said = {"bytes/s": "bytes/s (divided by 1e9)", "MiB/ms": "2^20 bytes/ms (x 1.048576 GB/s)"}
    parts = [f"{field} read as " + " and ".join(said[u] for u in sorted(units[field], reverse=True))
             for field in ("intra_bandwidth", "inter_bandwidth") if units.get(field)]
    return ("Metis cluster; " + ", ".join(parts) + "; Metis has no prices: usd_per_hour 0 "
            "(use a YAML cluster with usd_per_hour for cost objectives)")


def load_metis_cluster(spec: str) -> Cluster:
    """A Cluster from `CLUSTER.json,HOSTFILE` (or `CLUSTER.json` with a hostfile beside it)."""
    json_path, host_path = split_spec(spec)
    hosts = _read_hosts(json_path)
    nodes = parse_hostfile(host_path)
    gpus = sum(n for _, n in nodes)
    if gpus > MAX_GPUS:
        raise InputError(f"{gpus:,} GPUs, more than milp-plan's limit of {MAX_GPUS:,} (milp_plan.cluster.MAX_GPUS)",
                         source=str(host_path))
    types, units = _group_nodes(nodes, hosts, json_path, host_path)
    return Cluster(f"metis-{json_path.stem}", types, source=f"metis:{json_path},{host_path}",
                   description=_notice(units))


# ---- profiles ------------------------------------------------------------------------
def _field(data: Any, dotted: str, source: str) -> Any:
    cur = data
    for key in dotted.split("."):
        if not isinstance(cur, Mapping) or key not in cur:
            raise InputError(f"missing field '{dotted}'; a Metis profile needs model.num_layers and "
                             "execution_time.layer_compute_total_ms", source=source)
        cur = cur[key]
    return cur


def _optional(data: Any, dotted: str) -> Any:
    try:
        return _field(data, dotted, "")
    except InputError:
        return None


BYTES_PER_PARAMETER = (2.0, 4.0)   # what a profiler may count per parameter (fp16/bf16, fp32)
PARAMETER_TOLERANCE = 0.15          # relative: a block slot's bytes against the model's block


def check_block_parameters(per_kind: Mapping[str, float], model: Model, tp: int, source: str) -> None:
    """A block slot's `parameters_per_layer_bytes` x tp must be 2 or 4 bytes per parameter of the
    model's block (within PARAMETER_TOLERANCE): otherwise the profile was measured on a model of
    another shape (hidden size, ffn size) than the one planned, and its times do not apply."""
    for kind, nbytes in per_kind.items():
        if kind in ("embedding", "head") or nbytes <= 0:
            continue
        params = model.layer_params(kind)
        ratio = nbytes * tp / params
        if any(abs(ratio / b - 1.0) <= PARAMETER_TOLERANCE for b in BYTES_PER_PARAMETER):
            continue
        about = " or ".join(f"{math.sqrt(nbytes * tp / (b * 12)):,.0f} at {b:g} bytes a parameter"
                            for b in reversed(BYTES_PER_PARAMETER))
        raise InputError(f"field 'model.parameters.parameters_per_layer_bytes': a {kind} slot holds {nbytes:,.0f} "
                         f"bytes at tp {tp}, {ratio:.3g} bytes per parameter of {model.name}'s {kind} ({params:,} "
                         f"parameters, hidden size {model.hidden_size}), not 2 or 4: the profile was measured on "
                         f"another model (hidden size about {about}); pass --model with the profiled model's shape",
                         source=source)


@dataclass(frozen=True)
class MetisFile:
    """What one Metis profile file gives, per layer kind (means over the kind's slots) and per step.

    fb_ms: forward + backward ms of one layer; param_bytes: the rank's parameter bytes (or None);
    memory_mb: `layer_memory_total_mb` (or None); sync_ms: the per-micro-batch time no layer
    holds, forward_backward_time_ms - sum(layer_compute_total_ms) (loss, synchronisation; >= 0);
    batch_ms: `batch_generator_time_ms` (0 if absent); optimizer_ms: `optimizer_time_ms` (or None)."""

    fb_ms: dict[str, float]
    param_bytes: dict[str, float] | None
    memory_mb: dict[str, float] | None
    sync_ms: float
    batch_ms: float
    optimizer_ms: float | None
    summary: dict[str, Any]


def _time_field(data: Any, key: str, src: str) -> float | None:
    value = _optional(data, f"execution_time.{key}")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InputError(f"field 'execution_time.{key}' must be a finite number of ms >= 0, got {value!r:.40}",
                         source=src)
    return float(value)


def _metis_file(path: Path, model: Model, tp: int = 1) -> MetisFile:
    """One Metis profile file, checked (see MetisFile)."""
    src = str(path)
    data = load_json(path, "Metis profile")
    n = _field(data, "model.num_layers", src)
    if isinstance(n, bool) or not isinstance(n, int) or n < 3:
        raise InputError(f"field 'model.num_layers' must be a whole number >= 3 (embedding + blocks + head), "
                         f"got {n!r}", source=src)
    times = slots.check_numbers(_field(data, "execution_time.layer_compute_total_ms", src), src,
                                "execution_time.layer_compute_total_ms")
    if len(times) != n:
        raise InputError(f"execution_time.layer_compute_total_ms has {len(times)} entries but model.num_layers is "
                         f"{n}; they must match", source=src)
    slots.check_slot_count(n, model, src, "model.num_layers",
                           f"profile {model.name} with Metis, or pass --model with {n - 2} layers")
    params = _optional(data, "model.parameters.parameters_per_layer_bytes")
    if params is not None:
        params = slots.check_numbers(params, src, "model.parameters.parameters_per_layer_bytes")
        if len(params) != n:
            raise InputError(f"model.parameters.parameters_per_layer_bytes has {len(params)} entries, not "
                             f"model.num_layers = {n}", source=src)
        check_block_parameters(slots.mean_by_kind(params, model), model, tp, src)
    memory = _optional(data, "execution_memory.layer_memory_total_mb")
    if memory is not None:
        memory = slots.check_numbers(memory, src, "execution_memory.layer_memory_total_mb")
        if len(memory) != n:
            raise InputError(f"execution_memory.layer_memory_total_mb has {len(memory)} entries, not "
                             f"model.num_layers = {n}", source=src)
    fb = _time_field(data, "forward_backward_time_ms", src)
    summary: dict[str, Any] = {"name": path.name, "layer_compute_sum_ms": sum(times)}
    for key in ("forward_backward_time_ms", "optimizer_time_ms", "batch_generator_time_ms"):
        value = _time_field(data, key, src)
        if value is not None:
            summary[key] = value
    if memory is not None:
        summary["layer_memory_total_mb_sum"] = sum(memory)
    return MetisFile(slots.mean_by_kind(times, model), params and slots.mean_by_kind(params, model),
                     memory and slots.mean_by_kind(memory, model),
                     max(0.0, fb - sum(times)) if fb is not None else 0.0,
                     summary.get("batch_generator_time_ms", 0.0), summary.get("optimizer_time_ms"), summary)


def metis_files(directory: Path) -> list[tuple[Path, str, int, int]]:
    """(path, gpu, tp, batch size) of every DeviceType.*.json file, sorted by name."""
    out = []
    for path in sorted(directory.glob("DeviceType.*.json")):
        m = _PROFILE_NAME.match(path.name)
        if not m or int(m["tp"]) <= 0 or int(m["bs"]) <= 0:
            raise InputError("a Metis profile is named DeviceType.<GPU>_tp<T>_bs<B>.json with T, B > 0; "
                             "rename it", source=str(path))
        out.append((path, m["gpu"], int(m["tp"]), int(m["bs"])))
    if not out:
        raise InputError("no Metis profile (DeviceType.<GPU>_tp<T>_bs<B>.json) in this directory",
                         source=str(directory))
    return out


def named_seq_length(directory: str | Path) -> int | None:
    """The sequence length a Metis profile directory's name states (`..seq1024..`, `seq_len-2048`),
    or None. Metis files record none, so the name is the only place one can be read."""
    m = _SEQ_IN_NAME.search(Path(directory).resolve().name)
    return int(m[1]) if m and int(m[1]) > 0 else None


def load_metis_profiles(directory: Path, model: Model, seq_length: int | None = None) -> Profile:
    """Native rows from a Metis profile directory; seq_length defaults to the one the directory's
    name states (named_seq_length), else the model's. A name that states another length than
    `seq_length` is an error; a directory whose name states none gets a notice in the provenance
    (`notice`: the times are read as measured at `seq`, which nothing in the files confirms)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise InputError("Metis profile directory not found; check the path", source=str(directory))
    named = named_seq_length(directory)
    seq = seq_length or named or model.seq_length
    if named is not None and named != seq:
        raise InputError(f"field 'seq_length': the directory name says the profiles were measured at sequence "
                         f"length {named}, but the job's is {seq}; pass --seq-len {named}, or profile at {seq} "
                         f"and name the directory seq{seq}", source=str(directory))
    notice = (f"Metis profile {directory}: sequence length {seq} read from the directory name" if named else
              f"Metis profile {directory} records no sequence length: its times are read as measured at the job's "
              f"sequence length {seq}; if they were not, pass --seq-len N (or name the directory seqN)")
    rows, summaries = [], []
    files = metis_files(directory)
    columns = {"param_bytes": True, "mem_total_bytes": True, "optimizer_ns_per_param": True}
    for path, gpu, tp, bs in files:
        f = _metis_file(path, model, tp)
        summaries.append(f.summary)
        columns["param_bytes"] &= f.param_bytes is not None
        columns["mem_total_bytes"] &= f.memory_mb is not None
        columns["optimizer_ns_per_param"] &= f.optimizer_ms is not None
        rate = None if f.optimizer_ms is None else f.optimizer_ms * 1e6 / (model.num_parameters / tp)
        for kind, t in f.fb_ms.items():
            t += f.sync_ms if kind == "head" else 0.0
            fwd = t / 3.0 + (f.batch_ms if kind == "embedding" else 0.0)
            rows.append((model.name, gpu, tp, bs, seq, kind, fwd, 2.0 * t / 3.0,
                         f.param_bytes and f.param_bytes[kind], f.memory_mb and f.memory_mb[kind] * MIB, rate))
    table = slots.table(rows, list(columns))
    table = table.drop(columns=[c for c, every in columns.items() if not every])
    provenance = {
        "format": "metis", "file": str(directory), "origin": "measured (Metis profiler)",
        "sha256": slots.combined_sha256(p for p, *_ in files),
        "conversions": "fwd_ms = t / 3, bwd_ms = 2 t / 3 with t = layer_compute_total_ms (mean over the slots "
                       "of a kind; slot 0 embedding, last slot head), the head's t plus forward_backward_time_ms - "
                       "sum(layer_compute_total_ms), the embedding's fwd_ms plus batch_generator_time_ms; "
                       "mem_total_bytes = layer_memory_total_mb x 2^20; optimizer_ns_per_param = "
                       f"optimizer_time_ms x 1e6 / ({model.num_parameters:,} parameters / tp); "
                       f"micro_batch_size = bs; seq_length = {seq} (not in Metis files)",
        "tp_comm_included": True, "files": summaries, "notice": notice,
    }
    return Profile(table, [provenance])
