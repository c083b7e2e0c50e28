"""Volcano on a cluster that gains its CRDs after Lockstep started, and Volcano's queues.

A training operator in Volcano mode is often installed together with Volcano's CRDs, after
the scheduler is up: Lockstep must notice the PodGroup CRD at once (a watch of
CustomResourceDefinitions wakes the PodGroup loop), not at its 30 s poll.

Volcano's ``Queue``: a real Queue object (Volcano's own CRD) with a capability of 4 GPUs on
an 8-GPU cluster lets one 4-GPU gang of the queue run at a time; a closed queue takes none.
"""

from __future__ import annotations

import time
from typing import Any

from testbed.cluster import create_nodes, load_topology, nodes_from_topology
from testbed.runner import VOLCANO_CRD

from .conftest import Cluster, ClusterFactory, settle
from .test_conventions import volcano_pod, volcano_podgroup

QUEUES = "/apis/scheduling.volcano.sh/v1beta1/queues"


def test_volcano_crd_installed_after_start_is_noticed_at_once(cluster: ClusterFactory) -> None:
    c = cluster("tiny-3x2")  # no Volcano CRD: Lockstep starts without it
    c.kube.wait("Lockstep ready", lambda: c.lockstep("/debug/gangs") is not None, 10)
    time.sleep(1.0)  # its Volcano PodGroup loop has found nothing and sleeps
    t0 = time.monotonic()
    c.bed.kubectl("apply", "--server-side", "-f", str(VOLCANO_CRD))
    c.bed.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                  "crd/podgroups.scheduling.volcano.sh")
    c.kube.create(f"/apis/scheduling.volcano.sh/v1beta1/namespaces/{c.ns}/podgroups",
                  volcano_podgroup("late", 4))
    c.recorder.min_member_of[f"{c.ns}/late"] = 4
    c.create(*(volcano_pod(f"late-{i}", "late") for i in range(4)))
    c.wait_bound([f"late-{i}" for i in range(4)], 30)
    took = time.monotonic() - t0
    print(f"Volcano CRD applied to the gang bound: {took:.2f}s")
    assert took < 10.0, took
    c.recorder.assert_gang_invariants(c.ns)


def _gang_reason(c: Cluster, name: str) -> str:
    for g in c.lockstep("/debug/gangs")["gangs"]:
        if g["gang"] == f"{c.ns}/{name}":
            return str(g.get("reason") or "")
    return ""


def _podgroup_status(c: Cluster, name: str) -> dict[str, Any]:
    path = f"/apis/scheduling.volcano.sh/v1beta1/namespaces/{c.ns}/podgroups/{name}"
    return dict(c.kube.get(path).get("status") or {})


def test_a_queue_of_four_gpus_runs_one_four_gpu_gang_at_a_time(cluster: ClusterFactory) -> None:
    c = cluster("tiny-3x2", volcano=True)
    have = {n["metadata"]["name"] for n in c.kube.nodes()}
    create_nodes(c.kube, [n for n in nodes_from_topology(load_topology("tiny-3x2"), nodes=4)
                          if n["metadata"]["name"] not in have])  # 4 nodes x 2 GPUs = 8
    c.kube.create(QUEUES, {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
                           "metadata": {"name": "team"},
                           "spec": {"weight": 1, "capability": {"nvidia.com/gpu": "4"}}})
    pgs = f"/apis/scheduling.volcano.sh/v1beta1/namespaces/{c.ns}/podgroups"
    for g in ("a", "b"):
        body = volcano_podgroup(g, 4)
        body["spec"]["queue"] = "team"
        c.kube.create(pgs, body)
        c.recorder.min_member_of[f"{c.ns}/{g}"] = 4
    for i in range(4):
        c.create(volcano_pod(f"a-{i}", "a"), volcano_pod(f"b-{i}", "b"))
    c.kube.wait("one gang bound", lambda: any(
        all(f"{g}-{i}" in c.bound() for i in range(4)) for g in ("a", "b")), 30)
    settle(3)  # 8 GPUs would hold both: only the queue keeps the other out
    bound = c.bound()
    first = "a" if "a-0" in bound else "b"
    other = "b" if first == "a" else "a"
    assert not any(n.startswith(f"{other}-") for n in bound), bound
    assert "Volcano queue 'team' is at its capability" in _gang_reason(c, other)
    c.kube.wait("the waiting group's condition names the queue", lambda: any(
        cond.get("reason") == "QueueFull" and "'team'" in cond.get("message", "")
        for cond in _podgroup_status(c, other).get("conditions") or ()), 20)
    assert _podgroup_status(c, other).get("phase") == "Pending"

    # Closing the queue: the waiting gang now waits for the queue to open.
    c.kube.patch(f"{QUEUES}/team/status", {"status": {"state": "Closed"}})
    c.kube.wait("reason: queue Closed", lambda: "'team' is Closed" in _gang_reason(c, other), 20)
    c.kube.patch(f"{QUEUES}/team/status", {"status": {"state": "Open"}})
    settle(2)
    assert not any(n.startswith(f"{other}-") for n in c.bound())  # open, but still full

    # The running gang finishes: the other is admitted and binds whole.
    t0 = time.monotonic()
    c.delete(*(f"{first}-{i}" for i in range(4)))
    c.kube.delete(f"{pgs}/{first}")
    c.wait_bound([f"{other}-{i}" for i in range(4)], 30)
    print(f"running gang deleted to the queued gang bound: {time.monotonic() - t0:.2f}s")
    c.recorder.assert_gang_invariants(c.ns)
