"""GPU catalog and clusters: node types, nodes and devices.

A cluster file (YAML) lists node types; each type has a GPU (a catalog key, or an
inline `gpu: {name, memory_gib, peak_tflops, memory_gb_per_s}`), a node count,
per-GPU intra-node bandwidth, per-node inter-node bandwidth and a price per node-hour.
"""
from __future__ import annotations

import functools
import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from milp_plan.errors import InputError
from milp_plan.fileio import check_fields, load_yaml, number, sha256_text
from milp_plan.resources import catalog_file, shipped_dir

DEFAULT_CLUSTER = "default"
# Size limits (larger clusters are refused, naming the limit): the search and the plan file grow
# with the number of GPUs; scale-8192 is the largest shipped.
MAX_GPUS_PER_NODE = 64
MAX_NODE_TYPES = 32
MAX_GPUS = 65536


@dataclass(frozen=True)
class GPU:
    """One GPU model. Units in the names."""

    name: str
    memory_gib: float
    peak_tflops: float          # dense bf16 (fp16 where no bf16), TFLOP/s
    memory_gb_per_s: float      # 10^9 bytes/s
    source: str = ""


@functools.lru_cache(maxsize=1)
def gpu_catalog() -> dict[str, GPU]:
    path = catalog_file("gpus.yaml")
    data = load_yaml(path, "GPU catalog")
    return {name: _gpu_from_mapping(name, spec, str(path), f"gpu '{name}'") for name, spec in data.items()}


def _gpu_from_mapping(name: str, spec: Mapping[str, Any], source: str, where: str) -> GPU:
    check_fields(spec, source=source, where=where, required=["memory_gib", "peak_tflops", "memory_gb_per_s"],
                 optional=["source", "name"])
    return GPU(
        name=name,
        memory_gib=number(spec, "memory_gib", source=source, where=where),
        peak_tflops=number(spec, "peak_tflops", source=source, where=where),
        memory_gb_per_s=number(spec, "memory_gb_per_s", source=source, where=where),
        source=str(spec.get("source", "")),
    )


def lookup_gpu(name: str, *, source: str = "", where: str = "") -> GPU:
    catalog = gpu_catalog()
    if name in catalog:
        return catalog[name]
    lowered = {k.lower(): k for k in catalog}
    if str(name).lower() in lowered:
        return catalog[lowered[str(name).lower()]]
    raise InputError(f"{where}: unknown GPU '{name}'; use one of {', '.join(catalog)} "
                     "or define it inline as gpu: {name, memory_gib, peak_tflops, memory_gb_per_s}",
                     source=source or None)


_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def valid_host(host: str) -> bool:
    """An IP literal or an RFC 1123 host name (letters, digits, hyphens; dot-separated labels)."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    if not host or len(host) > 253:
        return False
    return all(_LABEL.match(label) for label in host.split("."))


@dataclass(frozen=True)
class NodeType:
    name: str
    gpu: GPU
    gpus_per_node: int
    count: int
    intra_node_gb_per_s: float  # per GPU, inside a node
    inter_node_gb_per_s: float  # per node, to the network
    usd_per_hour: float         # one node for one hour
    hosts: tuple[str, ...] = ()
    billing: str = "node"       # "node": a node with any GPU used is paid whole; "gpu": pay per GPU used
    # the links' kinds (nccl.py): "nominal" takes the figures above as what a collective reaches;
    # a named kind takes them as line rates, and NCCL's published efficiency and latency apply
    intra_node_link: str = "nominal"   # nominal | nvlink | pcie
    inter_node_link: str = "nominal"   # nominal | infiniband | ethernet

    @property
    def memory_gib(self) -> float:
        return self.gpu.memory_gib

    @property
    def usd_per_gpu_hour(self) -> float:
        return self.usd_per_hour / self.gpus_per_node

    def rent_usd_per_hour(self, gpus: int, nodes: int) -> float:
        """$/h of using `gpus` GPUs spread over `nodes` nodes of this type: whole nodes under
        node billing, the GPUs alone under GPU billing (the one place billing is applied)."""
        return self.usd_per_hour * nodes if self.billing == "node" else self.usd_per_gpu_hour * gpus

    def gpus_affordable(self, usd_per_hour: float) -> int:
        """Most GPUs of this type that `usd_per_hour` rents, whole nodes under node billing."""
        if self.billing == "node":
            return int(usd_per_hour // self.usd_per_hour) * self.gpus_per_node
        return int(usd_per_hour // self.usd_per_gpu_hour)


MIXED_SEP = "+"   # joins the GPU names of a stage whose dp replicas sit on several GPU types


@dataclass(frozen=True)
class MixedNodeType:
    """A bundle of whole nodes of several node types that hosts one stage whose dp replicas sit
    on different GPU types (a mixed-type stage, formulations/pipeline.md). It reads like a node
    type whose "node" is the bundle, with every figure the slowest (or smallest) member's:

    - gpus_per_node: the bundle's GPUs, sum n_i G_i; count: the bundles the cluster holds,
      min_i floor(count_i / n_i) (the formulation shares the member nodes with their own types'
      stages: add_shared_nodes);
    - intra/inter_node_gb_per_s: the least member's (a replica's ring and the stage's hops run
      over the slowest links), with that member's link kind;
    - memory_gib: the least member's; gpu: a GPU named by the members' names joined by
      MIXED_SEP (the plan's stage `gpu`), with the least memory, peak and bandwidth; the cost
      model prices times and measured activations per member (costmodel.layer_times: the
      slowest member's time of every layer, so the slowest replica paces the stage);
    - usd_per_hour: one bundle for an hour, sum n_i x usd_i (whole nodes: the same under node
      and GPU billing);
    - real_nodes, busiest_node: the bundle's nodes and the GPUs of its largest node (the
      stage's reduction is hierarchical over those nodes, its hops leave from that node)."""

    members: tuple[tuple[NodeType, int], ...]   # (node type, its nodes in one bundle), cluster order

    @property
    def name(self) -> str:
        return MIXED_SEP.join(f"{nt.name}x{n}" for nt, n in self.members)

    @property
    def gpu(self) -> GPU:
        gpus = [nt.gpu for nt, _ in self.members]
        return GPU(joined_gpu_name(g.name for g in gpus), min(g.memory_gib for g in gpus),
                   min(g.peak_tflops for g in gpus), min(g.memory_gb_per_s for g in gpus))

    @property
    def gpus_per_node(self) -> int:
        return sum(nt.gpus_per_node * n for nt, n in self.members)

    @property
    def count(self) -> int:
        return min(nt.count // n for nt, n in self.members)

    @property
    def real_nodes(self) -> int:
        return sum(n for _, n in self.members)

    @property
    def busiest_node(self) -> int:
        return max(nt.gpus_per_node for nt, _ in self.members)

    def _slowest(self, key: str) -> NodeType:
        return min((nt for nt, _ in self.members), key=lambda nt: getattr(nt, key))

    @property
    def intra_node_gb_per_s(self) -> float:
        return self._slowest("intra_node_gb_per_s").intra_node_gb_per_s

    @property
    def intra_node_link(self) -> str:
        return self._slowest("intra_node_gb_per_s").intra_node_link

    @property
    def inter_node_gb_per_s(self) -> float:
        return self._slowest("inter_node_gb_per_s").inter_node_gb_per_s

    @property
    def inter_node_link(self) -> str:
        return self._slowest("inter_node_gb_per_s").inter_node_link

    @property
    def memory_gib(self) -> float:
        return min(nt.memory_gib for nt, _ in self.members)

    @property
    def usd_per_hour(self) -> float:
        return sum(nt.usd_per_hour * n for nt, n in self.members)

    @property
    def usd_per_gpu_hour(self) -> float:
        return self.usd_per_hour / self.gpus_per_node

    billing = "node"   # class attributes, not fields: a bundle is paid whole and names no host
    hosts = ()

    def rent_usd_per_hour(self, gpus: int, nodes: int) -> float:
        """$/h of `nodes` bundles (a mixed-type stage takes whole member nodes)."""
        return self.usd_per_hour * nodes

    def gpus_affordable(self, usd_per_hour: float) -> int:
        return int(usd_per_hour // self.usd_per_hour) * self.gpus_per_node


def gpu_names(name: str) -> tuple[str, ...]:
    """The GPU types of a stage's `gpu` field: one name, or a mixed-type stage's names."""
    return tuple(name.split(MIXED_SEP))


def joined_gpu_name(names: Iterable[str]) -> str:
    """A stage's `gpu` field from its devices' GPU names in order: each name once, joined by
    MIXED_SEP (one name for a stage of one GPU type); gpu_names reads it back."""
    return MIXED_SEP.join(dict.fromkeys(names))


@dataclass(frozen=True)
class Node:
    index: int          # global node index, in file order
    type: NodeType
    host: str | None


@dataclass(frozen=True)
class Cluster:
    name: str
    node_types: tuple[NodeType, ...]
    source: str = ""
    description: str = ""

    @functools.cached_property
    def nodes(self) -> tuple[Node, ...]:
        out, i = [], 0
        for nt in self.node_types:
            for k in range(nt.count):
                out.append(Node(i, nt, nt.hosts[k] if nt.hosts else None))
                i += 1
        return tuple(out)

    @property
    def num_gpus(self) -> int:
        return sum(nt.count * nt.gpus_per_node for nt in self.node_types)

    def node_type(self, name: str) -> NodeType:
        for nt in self.node_types:
            if nt.name == name:
                return nt
        raise KeyError(name)

    def gpu_types(self) -> tuple[str, ...]:
        seen: list[str] = []
        for nt in self.node_types:
            if nt.gpu.name not in seen:
                seen.append(nt.gpu.name)
        return tuple(seen)

    def to_dict(self) -> dict[str, Any]:
        """A plain mapping that `cluster_from_mapping` reads back to an equal Cluster."""
        types = []
        for nt in self.node_types:
            d: dict[str, Any] = {
                "name": nt.name,
                "gpu": {"name": nt.gpu.name, "memory_gib": nt.gpu.memory_gib, "peak_tflops": nt.gpu.peak_tflops,
                        "memory_gb_per_s": nt.gpu.memory_gb_per_s},
                "gpus_per_node": nt.gpus_per_node, "count": nt.count,
                "intra_node_gb_per_s": nt.intra_node_gb_per_s, "inter_node_gb_per_s": nt.inter_node_gb_per_s,
                "usd_per_hour": nt.usd_per_hour, "billing": nt.billing,
            }
            if nt.hosts:
                d["hosts"] = list(nt.hosts)
            for key in ("intra_node_link", "inter_node_link"):
                if getattr(nt, key) != "nominal":
                    d[key] = getattr(nt, key)
            types.append(d)
        return {"name": self.name, "description": self.description, "node_types": types}

    def content_hash(self) -> str:
        import json
        return sha256_text(json.dumps(self.to_dict(), sort_keys=True))


_NODE_REQUIRED = ["name", "gpu", "gpus_per_node", "count", "intra_node_gb_per_s", "inter_node_gb_per_s",
                  "usd_per_hour"]
_NODE_OPTIONAL = ["gpu_memory_gib", "hosts", "billing", "description", "intra_node_link", "inter_node_link"]
LINK_KINDS = {"intra_node_link": ("nominal", "nvlink", "pcie"), "inter_node_link": ("nominal", "infiniband", "ethernet")}


def _node_type(spec: Any, i: int, source: str) -> NodeType:
    where = f"node_types[{i}]"
    if isinstance(spec, Mapping) and "name" in spec:
        where = f"node type '{spec['name']}'"
    check_fields(spec, source=source, where=where, required=_NODE_REQUIRED, optional=_NODE_OPTIONAL)
    gpu_spec = spec["gpu"]
    if isinstance(gpu_spec, Mapping):
        gname = str(gpu_spec.get("name", f"{spec['name']}-gpu"))
        gpu = _gpu_from_mapping(gname, {k: v for k, v in gpu_spec.items()}, source, f"{where}: gpu")
    else:
        gpu = lookup_gpu(str(gpu_spec), source=source, where=f"{where}: field 'gpu'")
    if MIXED_SEP in gpu.name:
        raise InputError(f"{where}: GPU name '{gpu.name}' contains '{MIXED_SEP}', which plans use to join the "
                         "GPU types of a mixed-type stage; rename it", source=source)
    if spec.get("gpu_memory_gib") is not None:
        mem = number(spec, "gpu_memory_gib", source=source, where=where)
        gpu = GPU(gpu.name, mem, gpu.peak_tflops, gpu.memory_gb_per_s, gpu.source)
    gpn = number(spec, "gpus_per_node", source=source, where=where, integer=True, maximum=MAX_GPUS_PER_NODE)
    count = number(spec, "count", source=source, where=where, integer=True, maximum=MAX_GPUS)
    if not isinstance(spec["name"], (str, int)) or not str(spec["name"]).strip():
        raise InputError(f"{where}: field 'name' must be a non-empty string", source=source)
    hosts = spec.get("hosts") or ()
    if hosts:
        if not isinstance(hosts, list) or len(hosts) != count:
            raise InputError(f"{where}: field 'hosts' must list exactly count={count} host names, "
                             f"got {len(hosts) if isinstance(hosts, list) else hosts!r}", source=source)
        for h in hosts:
            if not isinstance(h, str) or not valid_host(h):
                raise InputError(f"{where}: field 'hosts': {h!r} is not an IP address or RFC 1123 host name "
                                 "(letters, digits, hyphens and dots only)", source=source)
    billing = spec.get("billing", "node")
    if billing not in ("node", "gpu"):
        raise InputError(f"{where}: field 'billing' must be 'node' or 'gpu', got {billing!r}", source=source)
    links = {}
    for key, kinds in LINK_KINDS.items():
        links[key] = spec.get(key, "nominal")
        if links[key] not in kinds:
            raise InputError(f"{where}: field '{key}' must be one of {', '.join(kinds)}, got {links[key]!r}",
                             source=source)
    return NodeType(
        name=str(spec["name"]), gpu=gpu, gpus_per_node=gpn, count=count,
        intra_node_gb_per_s=number(spec, "intra_node_gb_per_s", source=source, where=where),
        inter_node_gb_per_s=number(spec, "inter_node_gb_per_s", source=source, where=where),
        usd_per_hour=number(spec, "usd_per_hour", source=source, where=where, allow_zero=True),
        hosts=tuple(hosts), billing=billing, **links,
    )


def cluster_from_mapping(data: Any, source: str) -> Cluster:
    check_fields(data, source=source, where="cluster", required=["name", "node_types"], optional=["description"])
    types = data["node_types"]
    if not isinstance(types, list) or not types:
        raise InputError("cluster: field 'node_types' must be a non-empty list", source=source)
    if len(types) > MAX_NODE_TYPES:
        raise InputError(f"cluster: {len(types)} node types, more than the limit of {MAX_NODE_TYPES}",
                         source=source)
    nts = tuple(_node_type(spec, i, source) for i, spec in enumerate(types))
    gpus = sum(nt.count * nt.gpus_per_node for nt in nts)
    if gpus > MAX_GPUS:
        raise InputError(f"cluster: {gpus:,} GPUs, more than milp-plan's limit of {MAX_GPUS:,} "
                         "(milp_plan.cluster.MAX_GPUS); plan a part of the cluster", source=source)
    names = [nt.name for nt in nts]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise InputError(f"cluster: node type names must be unique; '{sorted(dup)[0]}' appears twice", source=source)
    hosts = [h for nt in nts for h in nt.hosts]
    if len(set(hosts)) != len(hosts):
        raise InputError("cluster: every host must appear once across node types", source=source)
    return Cluster(str(data["name"]), nts, source=source, description=str(data.get("description") or ""))


def shipped_clusters() -> dict[str, Path]:
    return {p.stem: p for p in sorted(shipped_dir("clusters").glob("*.yaml"))}


def load_cluster(spec: str | Path | None) -> Cluster:
    """A shipped cluster name or a YAML path (importers.load_cluster also reads Metis clusters)."""
    if spec is None:
        spec = DEFAULT_CLUSTER
    text = str(spec)
    shipped = shipped_clusters()
    path = Path(text)
    present = path.exists() or path.is_symlink()  # a broken link or a loop: read_text names it
    if not present and text in shipped:
        path = shipped[text]
    elif not present:
        raise InputError(f"cluster file not found; give a path or one of the shipped clusters: "
                         f"{', '.join(shipped)}", source=text)
    return cluster_from_mapping(load_yaml(path, "cluster file"), str(path))
