"""What NCCL reaches on each kind of link: published nccl-tests figures (catalog/nccl.csv, one
row a figure with its source) reduced to two numbers a link, the mean of its rows:

    bus_efficiency  large-message bus bandwidth over the link's line rate (1: no figure, nominal)
    latency_s       the smallest message's time, paid once a collective or transfer (0: no figure)

costmodel.transfer_s prices every collective and transfer with them:
    t = latency_s + bus volume / (bus_efficiency x line rate).

A node type names its links' kinds (cluster.NodeType.intra_node_link, inter_node_link); the
default, "nominal", takes the cluster's figures as what a collective reaches (efficiency 1, no
latency), as milp-plan did before these figures.
"""
from __future__ import annotations

import csv
import functools
from dataclasses import dataclass

from milp_plan.resources import catalog_file

LINKS = ("nvlink", "pcie", "infiniband", "ethernet")
NOMINAL = "nominal"
MEASURES = ("bus_efficiency", "latency_us")


@dataclass(frozen=True)
class Link:
    bus_efficiency: float
    latency_s: float


def figures() -> list[dict[str, str]]:
    """The rows of catalog/nccl.csv (comment lines skipped)."""
    with open(catalog_file("nccl.csv"), newline="") as fh:
        return list(csv.DictReader(line for line in fh if not line.startswith("#")))


@functools.lru_cache(maxsize=1)
def links() -> dict[str, Link]:
    """Each link kind's mean figures."""
    rows = figures()
    out = {}
    for kind in LINKS:
        got = {m: [float(r["value"]) for r in rows if r["link"] == kind and r["measure"] == m] for m in MEASURES}
        eff = sum(got["bus_efficiency"]) / len(got["bus_efficiency"]) if got["bus_efficiency"] else 1.0
        lat = sum(got["latency_us"]) / len(got["latency_us"]) * 1e-6 if got["latency_us"] else 0.0
        out[kind] = Link(eff, lat)
    return out


def link(kind: str) -> Link:
    """The figures of a link kind (LINKS, or NOMINAL: efficiency 1, no latency)."""
    return Link(1.0, 0.0) if kind == NOMINAL else links()[kind]
