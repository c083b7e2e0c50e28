"""The memory benchmark's pure parts: the workload it creates and the metrics it reads."""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks.memory import (
    BOUND_SHARE,
    GANG_NS,
    NOBODY,
    build_workload,
    cache_counts,
    gated,
)
from coscheduling.resources import fits, pod_requests, resource_list, sub
from testbed.cluster import load_topology, nodes_from_topology


@pytest.fixture(scope="module")
def nodes() -> list[dict]:
    return nodes_from_topology(load_topology("bench-64x8"), nodes=100)


def test_counts_and_roles_add_up(nodes) -> None:
    wl = build_workload(nodes, 5000, gangs=20, gang_size=8)
    assert wl.pods == 5000
    assert len(wl.bound) == round(5000 * BOUND_SHARE) == 500
    assert len(wl.gangs) == 160
    assert len(wl.pending) == 5000 - 500 - 160
    names = [(p["metadata"]["namespace"], p["metadata"]["name"])
             for p in (*wl.bound, *wl.pending, *wl.gangs)]
    assert len(set(names)) == len(names)
    d = wl.describe()
    assert (d["bound"], d["pending"], d["gang_pods"], d["gangs"]) == (500, 4340, 160, 20)


def test_bound_pods_run_on_real_nodes_within_capacity(nodes) -> None:
    wl = build_workload(nodes, 5000, gangs=20)
    free = {n["metadata"]["name"]: resource_list(n["status"]["allocatable"]) for n in nodes}
    for p in wl.bound:
        node = p["spec"]["nodeName"]
        need = pod_requests(p["spec"])
        assert fits(need, free[node]), f"{p['metadata']['name']} overfills {node}"
        free[node] = sub(free[node], need)
        assert not gated(p)
    # spread: every node runs some, and every node keeps half its GPUs for gangs
    assert len({p["spec"]["nodeName"] for p in wl.bound}) == len(nodes)
    assert all(f.get("nvidia.com/gpu", 0) >= 4 for f in free.values())


def test_too_many_bound_pods_is_refused(nodes) -> None:
    with pytest.raises(ValueError, match="does not fit"):
        build_workload(nodes[:2], 1000, gangs=0, bound_share=1.0)
    with pytest.raises(ValueError):
        build_workload(nodes, 100, gangs=20, gang_size=8)  # 160 gang pods > 100


def test_pending_pods_belong_to_no_running_scheduler(nodes) -> None:
    wl = build_workload(nodes, 2000, gangs=10)
    assert all(p["spec"]["schedulerName"] == NOBODY and "nodeName" not in p["spec"]
               and not gated(p) for p in wl.pending)
    # realistic: requests == limits, labels and annotations as a controller stamps them
    p = wl.pending[0]
    res = p["spec"]["containers"][0]["resources"]
    assert res["requests"] == res["limits"]
    assert len(p["metadata"]["labels"]) >= 4 and len(p["metadata"]["annotations"]) >= 2


def test_gang_pods_are_held_lockstep_gangs(nodes) -> None:
    wl = build_workload(nodes, 2000, gangs=10, gang_size=8, gang_timeout=60)
    assert all(gated(p) for p in wl.gangs)
    assert all(p["metadata"]["namespace"] == GANG_NS for p in wl.gangs)
    assert all(p["spec"]["schedulerName"] == "lockstep" for p in wl.gangs)
    groups = Counter(p["metadata"]["annotations"]["lockstep.dev/pod-group"] for p in wl.gangs)
    assert len(groups) == 10 and set(groups.values()) == {8}
    a = wl.gangs[0]["metadata"]["annotations"]
    assert a["lockstep.dev/min-member"] == "8" and a["lockstep.dev/timeout-seconds"] == "60"
    assert all(pod_requests(p["spec"])["nvidia.com/gpu"] == 1 for p in wl.gangs)


def test_seeded(nodes) -> None:
    assert build_workload(nodes, 1500, gangs=5) == build_workload(nodes, 1500, gangs=5)
    assert build_workload(nodes, 1500, gangs=5) != build_workload(nodes, 1500, gangs=5, seed=1)


def test_cache_counts_reads_lockstep_metrics() -> None:
    text = (
        "# HELP lockstep_cache_pods Pods in the cache.\n"
        "# TYPE lockstep_cache_pods gauge\n"
        "lockstep_cache_pods 50000.0\n"
        "lockstep_cache_nodes 5000.0\n"
        "lockstep_reserved_gpus 800.0\n"
        'lockstep_gate_lifts_total{outcome="pinned"} 792.0\n'
        'lockstep_gate_lifts_total{outcome="unpinned"} 8.0\n'
        'lockstep_gangs{phase="admitted"} 100.0\n'
        "lockstep_binds_total 0.0\n"
    )
    c = cache_counts(text)
    assert c["cache_pods"] == 50000 and c["cache_nodes"] == 5000
    assert c["reserved_gpus"] == 800 and c["gate_lifts"] == 800
    assert c["gate_lifts_pinned"] == 792 and c["gangs_admitted"] == 100
    assert "binds_total" not in c
