"""The terminal plan table: compact device lists."""
from milp_plan.report import _merge_hosts


def test_runs_of_numbered_hosts_with_the_same_gpus_merge():
    parts = [("h-1", "0-7"), ("h-2", "0-7"), ("h-3", "0-7"), ("h-5", "0-7"), ("x", "0-3"), ("h-6", "0-7")]
    assert _merge_hosts(parts) == ["h-[1-3][0-7]", "h-5[0-7]", "x[0-3]", "h-6[0-7]"]


def test_short_runs_and_different_gpus_stay_apart():
    assert _merge_hosts([("node1", "0-7"), ("node2", "0-7")]) == ["node1[0-7]", "node2[0-7]"]
    assert _merge_hosts([("n1", "0-7"), ("n2", "0-3"), ("n3", "0-7")]) == ["n1[0-7]", "n2[0-3]", "n3[0-7]"]
