"""NCCL's figures by link kind (milp_plan/nccl.py, catalog/nccl.csv) and the one transfer rule
(costmodel.transfer_s) that tp collectives, dp reductions and p2p transfers go through."""
from __future__ import annotations

import pytest

from milp_plan import costmodel as cm, nccl
from milp_plan.cluster import cluster_from_mapping
from milp_plan.errors import InputError
from clitools import run_cli
from tiny_instance import CLUSTER_YAML, tiny_instance


def test_every_figure_is_cited_and_known():
    rows = nccl.figures()
    assert len(rows) >= 8
    for r in rows:
        assert r["link"] in nccl.LINKS and r["measure"] in nccl.MEASURES, r
        assert r["source"].startswith("https://github.com/NVIDIA/") and r["system"] and r["where"], r
        assert float(r["value"]) > 0


def test_link_figures_are_the_means_of_their_rows():
    # nvlink: efficiency (0.822 + 0.667 + 0.693) / 3, latency 6 us (one row); infiniband:
    # (0.96 + 0.94) / 2 = 0.95, 19.9 us; pcie and ethernet: latencies only (efficiency 1)
    ln = nccl.links()
    assert ln["nvlink"].bus_efficiency == pytest.approx(2.182 / 3, rel=1e-12)
    assert ln["nvlink"].latency_s == pytest.approx(6e-6, rel=1e-12)
    assert (ln["infiniband"].bus_efficiency, ln["infiniband"].latency_s) == pytest.approx((0.95, 19.9e-6), rel=1e-12)
    assert (ln["pcie"].bus_efficiency, ln["pcie"].latency_s) == pytest.approx((1.0, 42.1e-6), rel=1e-12)
    assert (ln["ethernet"].bus_efficiency, ln["ethernet"].latency_s) == pytest.approx((1.0, 45.8e-6), rel=1e-12)


def test_transfer_by_hand():
    # 1.5 GB of bus volume over 300 GB/s NVLink: 6 us + 1.5e9 / (0.727333 x 300e9) = 6.8807 ms
    assert cm.transfer_s(1.5e9, 300, "nvlink") == pytest.approx(6e-6 + 1.5e9 / (2.182 / 3 * 300e9), rel=1e-12)
    # a nominal link is the figure as given, bit for bit what milp-plan computed before
    assert cm.transfer_s(1.5e9, 300) == 1.5e9 / (300 * 1e9)
    assert cm.transfer_s(0.0, 300, "nvlink") == 0.0
    # a ring all-reduce of 8 GPUs moves 2 x 7/8 of the bytes, one latency
    assert cm.ring_allreduce_s(1e9, 8, 300, "nvlink") == pytest.approx(cm.transfer_s(1.75e9, 300, "nvlink"))


def _tiny_with_links(tmp_path, intra="nvlink", inter="infiniband"):
    inst = tiny_instance(tmp_path)
    text = CLUSTER_YAML.replace("    usd_per_hour: 8\n", f"    usd_per_hour: 8\n    intra_node_link: {intra}\n"
                                f"    inter_node_link: {inter}\n")
    (tmp_path / "tiny-cluster.yaml").write_text(text)
    from milp_plan.instance import InstanceSpec, build_instance
    named = build_instance(InstanceSpec(cluster=str(tmp_path / "tiny-cluster.yaml"), model=str(tmp_path / "tiny-model.yaml"),
                                        profiles=str(tmp_path / "tiny-profile.csv"), global_batch_size=8))
    return inst, named


def test_node_types_name_their_links(tmp_path):
    # the "big" nodes say NVLink and InfiniBand: tp collectives, dp reductions and hops between
    # them pay the figures; the "small" nodes (nominal) do not
    plain, named = _tiny_with_links(tmp_path)
    big, small = named.cluster.node_types
    assert (big.intra_node_link, big.inter_node_link, small.intra_node_link) == ("nvlink", "infiniband", "nominal")
    # tp 2 all-reduce of 1e6 bytes inside a big node: 6 us + 1e6 / (0.7273 x 100e9)
    f, _ = cm.tp_comm_s(named, big, 2, 1, "block")
    assert f == pytest.approx(2 * (6e-6 + 1e6 / (2.182 / 3 * 100e9)), rel=1e-12)
    assert cm.tp_comm_s(plain, plain.cluster.node_types[0], 2, 1, "block")[0] == pytest.approx(2 * 1e6 / 100e9)
    # a hop from a big node to a small one runs at the slower link (small, 5 GB/s, nominal)
    assert cm.p2p_s(named, 1e6, big, small, False, 1) == 1e6 / (5 * 1e9)
    assert cm.p2p_s(named, 1e6, big, big, False, 2) == pytest.approx(19.9e-6 + 1e6 / (0.95 * 5e9), rel=1e-12)
    # the cluster's record keeps a nominal node type as it was (same hash as before)
    assert "intra_node_link" not in plain.cluster.to_dict()["node_types"][0]
    assert named.cluster.to_dict()["node_types"][0]["inter_node_link"] == "infiniband"


def test_bad_link_kind_is_one_line(tmp_path, capsys):
    with pytest.raises(InputError, match="intra_node_link.*nvlink"):
        cluster_from_mapping({"name": "c", "node_types": [{"name": "n", "gpu": "A100-80GB", "gpus_per_node": 8,
                                                           "count": 1, "intra_node_gb_per_s": 300,
                                                           "inter_node_gb_per_s": 50, "usd_per_hour": 1,
                                                           "intra_node_link": "infiniband"}]}, "test")
    bad = tmp_path / "c.yaml"
    bad.write_text(CLUSTER_YAML.replace("    usd_per_hour: 8\n", "    usd_per_hour: 8\n    inter_node_link: carrier-pigeon\n"))
    code, out, err = run_cli(capsys, "inspect", "--cluster", str(bad))
    assert code == 2 and "inter_node_link" in err and len(err.strip().splitlines()) == 1
