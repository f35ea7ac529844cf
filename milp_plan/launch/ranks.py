"""Global ranks for a plan, and the torchrun agents that produce exactly those ranks.

Megatron-LM builds its process groups from the global rank alone, in the order
tp-cp-ep-dp-pp (cp = ep = 1 here): rank = tp_rank + T * dp_rank + T * D * pp_rank.
A plan lists each stage's devices tp fastest, then dp, so device k of stage s must get

    rank(s, k) = sum_{i < s} |devices of stage i| + k        (= s * T * D + k when uniform)

and then RankGenerator's tp, dp and pp groups are exactly the plan's (stage s = pp rank s,
device k = tp rank k mod T, dp rank k div T).

torchrun numbers ranks per agent: global rank = (sum of nproc-per-node of the agents with
a lower --node-rank) + local rank, and local rank i runs on the i-th GPU of
CUDA_VISIBLE_DEVICES. So every agent must own a run of consecutive global ranks. A node
whose ranks form one run gets one agent; a node whose ranks form several runs (stage 0
and stage 2 on one node, stage 1 elsewhere) gets one agent per run, all started on that
node. Agents are numbered by their first rank; CUDA_VISIBLE_DEVICES lists an agent's
physical GPUs in rank order. Every plan whose devices are distinct is expressible this way.
"""
from __future__ import annotations

from dataclasses import dataclass

from milp_plan.cluster import Cluster
from milp_plan.plan import Plan


@dataclass(frozen=True)
class RankEntry:
    """One global rank: where it runs and what it holds."""

    rank: int
    node: int          # plan / cluster node index
    host: str | None
    agent: int         # torchrun --node-rank of the agent that starts it
    local_rank: int    # index in that agent's CUDA_VISIBLE_DEVICES
    local_gpu: int     # physical GPU index on the node
    gpu: str           # GPU type
    stage: int         # pipeline rank
    tp_rank: int
    dp_rank: int


@dataclass(frozen=True)
class Agent:
    """One torchrun agent: --node-rank `node_rank`, --nproc-per-node len(gpus)."""

    node_rank: int
    node: int
    host: str | None
    first_rank: int
    gpus: tuple[int, ...]  # physical GPU indices in local-rank order (CUDA_VISIBLE_DEVICES)

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(str(g) for g in self.gpus)

    @property
    def ranks(self) -> range:
        return range(self.first_rank, self.first_rank + len(self.gpus))


@dataclass(frozen=True)
class RankLayout:
    entries: tuple[RankEntry, ...]  # indexed by global rank
    agents: tuple[Agent, ...]       # indexed by torchrun node rank

    @property
    def world_size(self) -> int:
        return len(self.entries)

    def hosts(self) -> list[str | None]:
        """Distinct hosts in agent order (the order the node scripts are listed in)."""
        seen: list[str | None] = []
        for a in self.agents:
            if a.host not in seen:
                seen.append(a.host)
        return seen

    def agents_on(self, node: int) -> list[Agent]:
        return [a for a in self.agents if a.node == node]


def plan_ranks(plan: Plan) -> list[tuple[int, int, int, int]]:
    """(global rank, stage, tp rank, dp rank) of each device, in the plan's device order:
    rank = offset of the stage + tp_rank + tp * dp_rank."""
    out, offset = [], 0
    for s, st in enumerate(plan.stages):
        for k in range(len(st.devices)):
            out.append((offset + k, s, k % st.tp, k // st.tp))
        offset += len(st.devices)
    return out


def _runs(ranks: list[int]) -> list[list[int]]:
    """Split sorted ranks into maximal runs of consecutive integers."""
    runs: list[list[int]] = []
    for r in ranks:
        if runs and runs[-1][-1] + 1 == r:
            runs[-1].append(r)
        else:
            runs.append([r])
    return runs


def assign_ranks(plan: Plan, cluster: Cluster) -> RankLayout:
    """Global ranks of every device and the torchrun agents that realise them (see module doc)."""
    devices = [d for st in plan.stages for d in st.devices]
    info = plan_ranks(plan)
    by_node: dict[int, list[int]] = {}
    for (rank, _, _, _), d in zip(info, devices):
        by_node.setdefault(d.node, []).append(rank)
    runs = sorted((run for node in by_node for run in _runs(sorted(by_node[node]))), key=lambda run: run[0])
    agent_of: dict[int, tuple[int, int]] = {}
    agents = []
    for a, run in enumerate(runs):
        node = devices[run[0]].node
        agents.append(Agent(a, node, cluster.nodes[node].host, run[0], tuple(devices[r].local_gpu for r in run)))
        for i, r in enumerate(run):
            agent_of[r] = (a, i)
    entries = []
    for (rank, stage, tp_rank, dp_rank), d in zip(info, devices):
        a, local = agent_of[rank]
        entries.append(RankEntry(rank, d.node, cluster.nodes[d.node].host, a, local, d.local_gpu,
                                 plan.stages[stage].gpu, stage, tp_rank, dp_rank))
    return RankLayout(tuple(entries), tuple(agents))


RANK_TABLE_COLUMNS = ("global_rank", "host", "node", "node_rank", "local_rank", "cuda_device", "gpu", "stage",
                      "tp_rank", "dp_rank")


def rank_table_rows(layout: RankLayout) -> list[tuple]:
    """Rows of the rank table, in global-rank order (columns RANK_TABLE_COLUMNS)."""
    return [(e.rank, e.host or "", e.node, e.agent, e.local_rank, e.local_gpu, e.gpu, e.stage, e.tp_rank, e.dp_rank)
            for e in layout.entries]
