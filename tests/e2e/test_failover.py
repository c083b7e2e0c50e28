"""Failover on the real test bed: two Lockstep + kube-scheduler pairs (``testbed.replicas``),
the leader killed with SIGKILL, both its processes, as a node failure takes a pod.

The leader is killed with binds parked (a gang whose members are created apart, so the
first wait for the last), during a preemption in flight (victims being evicted), and during
a burst of gang creations through the webhook (the forwarder spreads reviews over both
replicas, as the Service does). Each time the other replica takes over on the deployed lease
durations (15/10/2 s), and: no partial gang (the binding recorder checks every gang
throughout), no victim evicted twice (each victim's UID is deleted once: the DELETE carries
it as a precondition), no pin or reservation lost (every gang completes, its pinned members
on their pinned node), and every gang completes. Then a rolling update under steady load:
each replica replaced in turn, the new one started before the old one goes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from testbed.replicas import Replicas
from testbed.workloads import gang, pod

from .conftest import Cluster, ClusterFactory

TAKEOVER = 15.0 + 2.0 + 30.0
"""Lease duration, a retry period, and room for kube-scheduler's backoff and the rebuild."""


@pytest.fixture
def pairs(cluster: ClusterFactory) -> Iterator[tuple[Cluster, Replicas]]:
    c = cluster("tiny-3x2", lockstep=False)
    r = Replicas(c.bed).start()
    try:
        yield c, r
    finally:
        r.stop()


def create_gang(c: Cluster, name: str, size: int, gpus: int = 1, **kw: Any) -> list[str]:
    pods = gang(name, size, namespace=c.ns, gpus=gpus, **kw)
    c.create(*pods)
    return [p["metadata"]["name"] for p in pods]


HOLD = "e2e.lockstep.dev/hold"
"""A finalizer of the test's own: a victim stays terminating until the test lets it go."""


def terminating(c: Cluster) -> list[str]:
    return [p["metadata"]["name"] for p in c.kube.list(f"/api/v1/namespaces/{c.ns}/pods")
            if p["metadata"].get("deletionTimestamp")]


def test_failover_kill_the_leader_with_binds_parked(pairs: tuple[Cluster, Replicas]) -> None:
    """The gang's last member is one kube-scheduler's own filter rejects, so the leader
    admits the gang and the others' bind calls park; the leader dies with them parked (their
    kube-scheduler with it). The member made placeable, the new leader binds the whole gang."""
    c, r = pairs
    leader = r.wait_leader(c.kube)
    pods = gang("parked", 4, namespace=c.ns)
    last = pod("parked-3", c.ns).gang("parked", 4).gpu(1).unplaceable().build()
    c.create(*pods[:3], last)
    url = r.replicas[leader].url

    def parked() -> int:
        got = httpx.get(url + "/debug/gangs", timeout=5).json()["gangs"]
        return sum(int(g.get("parked") or 0) for g in got if str(g["gang"]).endswith("/parked"))

    c.kube.wait("three binds parked on the leader", lambda: parked() >= 3, 60)
    r.kill(leader)
    c.kube.delete_pod(c.ns, "parked-3")
    c.kube.wait("the unplaceable member gone", lambda: "parked-3" not in {
        p["metadata"]["name"] for p in c.kube.list(f"/api/v1/namespaces/{c.ns}/pods")}, 30)
    c.create(pods[3])
    r.wait_leader(c.kube, timeout=TAKEOVER, not_=leader)
    c.wait_bound([p["metadata"]["name"] for p in pods], timeout=TAKEOVER)
    c.recorder.assert_gang_invariants(c.ns)


def test_failover_kill_the_leader_during_a_preemption(pairs: tuple[Cluster, Replicas]) -> None:
    """The victims are held terminating by a finalizer, so the preemption is in flight when
    the leader dies; the new leader rebuilds it from the API server (the victims'
    ``DisruptionTarget`` and deletion), evicts no one again, and binds the preemptor whole
    once the victims go."""
    c, r = pairs
    for name, value in (("e2e-high", 100000), ("e2e-low", 10)):
        c.kube.create("/apis/scheduling.k8s.io/v1/priorityclasses", {
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name}, "value": value})
    leader = r.wait_leader(c.kube)
    low = []
    for g in ("low-a", "low-b", "low-c"):
        objs = [pod(f"{g}-{i}", c.ns).gang(g, 2).gpu(1).priority(10, "e2e-low").build()
                for i in range(2)]
        for o in objs:
            o["metadata"]["finalizers"] = [HOLD]
        c.create(*objs)
        low += [o["metadata"]["name"] for o in objs]
    c.wait_bound(low, timeout=60)
    high = [pod(f"high-{i}", c.ns).gang("high", 4).gpu(1).priority(100000, "e2e-high").build()
            for i in range(4)]
    c.create(*high)
    deadline = time.monotonic() + 60
    while not (going := terminating(c)):
        assert time.monotonic() < deadline, "no victim was evicted"
        time.sleep(0.1)
    time.sleep(0.5)  # the rest of the victims' deletions are sent
    r.kill(leader)
    new = r.wait_leader(c.kube, timeout=TAKEOVER, not_=leader)
    time.sleep(3.0)  # the new leader rebuilt and acts: it must not evict the victims again
    going = terminating(c)
    assert len(going) >= 2 and {n.rsplit("-", 1)[0] for n in going} <= {"low-a", "low-b",
                                                                         "low-c"}
    for n in going:
        c.kube.patch(f"/api/v1/namespaces/{c.ns}/pods/{n}", {"metadata": {"finalizers": None}})
    c.wait_bound([p["metadata"]["name"] for p in high], timeout=TAKEOVER + 30)
    deleted = httpx.get(r.replicas[new].url + "/metrics", timeout=10).text
    again = [line for line in deleted.splitlines()
             if line.startswith('lockstep_evictions_total{outcome="deleted"}')]
    assert again in ([], ['lockstep_evictions_total{outcome="deleted"} 0.0']), again
    c.recorder.assert_gang_invariants(c.ns)
    for p in c.kube.list(f"/api/v1/namespaces/{c.ns}/pods"):  # let the bed clean up
        if p["metadata"].get("finalizers"):
            c.kube.patch(f"/api/v1/namespaces/{c.ns}/pods/{p['metadata']['name']}",
                         {"metadata": {"finalizers": None}})


def test_failover_kill_the_leader_during_a_burst_through_the_webhook(
        pairs: tuple[Cluster, Replicas]) -> None:
    c, r = pairs
    leader = r.wait_leader(c.kube)
    names: list[str] = []
    errors: list[BaseException] = []

    def burst() -> None:
        try:
            for i in range(6):
                names.extend(create_gang(c, f"burst-{i}", 1, runtime=2))
                time.sleep(0.3)
        except BaseException as e:  # reported below
            errors.append(e)

    t = threading.Thread(target=burst)
    t.start()
    time.sleep(0.6)
    r.kill(leader)
    t.join(60)
    assert not errors
    assert r.forwarder.connections > 0
    r.wait_leader(c.kube, timeout=TAKEOVER, not_=leader)
    c.wait_bound(names, timeout=TAKEOVER + 30)
    c.recorder.assert_gang_invariants(c.ns)


def test_failover_rolling_update_under_steady_load(pairs: tuple[Cluster, Replicas]) -> None:
    """Replace one replica, then the other, while gangs keep arriving: each is stopped as a
    rolled pod is (SIGTERM to both processes: Lockstep answers its parked binds and stops)
    and started again, and the other keeps or takes the lead; every
    gang binds whole. (The Deployment's surge pod starts before the old one stops; here a
    replica keeps its ports, so it stops first: the harder order, one replica left alone.)"""
    c, r = pairs
    names: list[str] = []
    stop = threading.Event()

    def load() -> None:
        i = 0
        while not stop.is_set():
            names.extend(create_gang(c, f"load-{i}", 2, runtime=1))
            i += 1
            time.sleep(1.0)

    t = threading.Thread(target=load)
    t.start()
    try:
        for name in sorted(r.replicas):
            for proc in (name, f"{name}-scheduler"):
                c.bed.stop_process(proc)
            r.start_one(name)
            r.wait_leader(c.kube, timeout=TAKEOVER)
    finally:
        stop.set()
        t.join(30)
    c.wait_bound(names, timeout=TAKEOVER + 30)
    c.recorder.assert_gang_invariants(c.ns)

