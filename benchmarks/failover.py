"""Failover: from the leader killed to the next gang bound, over repeated kills.

Two Lockstep + kube-scheduler pairs run on the test bed (``testbed.replicas``) with the
deployed scheduler configuration, so the lease durations are the deploy defaults (15/10/0.5 s)
and the figure is what a cluster gets. Each round: the leading pair is killed with SIGKILL
(both processes, as a node failure), a 2-member gang is created at once through the webhook,
and the clock stops when its last member is bound. The killed pair is then started again (a
fresh standby) and the gang deleted. Reported: p50, p95 and max over the rounds, against the
goal of the lease duration plus 2 s, and how long the Lease took to change hands.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import yaml

from testbed.replicas import SCHEDULER_CONFIG, Replicas
from testbed.runner import TestBed

__all__ = ["TABLE_COLUMNS", "run", "summarize"]

TABLE_COLUMNS = (("kills", "kills"), ("p50_s", "p50 s"), ("p95_s", "p95 s"),
                 ("max_s", "max s"), ("takeover_p50_s", "lease moved p50 s"),
                 ("lease_duration_s", "lease s"), ("goal_s", "goal s"), ("met", "goal met"))
NAMESPACE = "bench"


def lease_duration() -> float:
    """The deployed ``leaderElection.leaseDuration`` the bench runs with, in seconds."""
    election = yaml.safe_load(SCHEDULER_CONFIG.read_text())["leaderElection"]
    return float(str(election["leaseDuration"]).rstrip("s"))


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def summarize(samples: list[float], takeovers: list[float], lease: float) -> dict[str, Any]:
    """One row: the quantiles of ``samples`` (kill -> next gang bound, seconds)."""
    goal = lease + 2.0
    p95 = _quantile(samples, 0.95)
    return {"kills": len(samples), "p50_s": round(statistics.median(samples), 2),
            "p95_s": round(p95, 2), "max_s": round(max(samples), 2),
            "takeover_p50_s": round(statistics.median(takeovers), 2) if takeovers else None,
            "lease_duration_s": lease, "goal_s": goal, "met": p95 <= goal}


def _gang(name: str) -> list[dict[str, Any]]:
    from testbed.workloads import gang

    return gang(name, 2, namespace=NAMESPACE)


def _round(bed: TestBed, r: Replicas, kube: Any, i: int) -> tuple[float, float]:
    leader = r.wait_leader(kube, timeout=120)
    r.kill(leader)
    t0 = time.monotonic()
    pods = _gang(f"after-kill-{i}")
    for p in pods:
        kube.create_pod(p)
    moved = None
    names = {p["metadata"]["name"] for p in pods}
    while True:
        if moved is None and r.leader(kube) not in (None, leader):
            moved = time.monotonic() - t0
        bound = {p["metadata"]["name"] for p in kube.list(f"/api/v1/namespaces/{NAMESPACE}/pods")
                 if p["spec"].get("nodeName")}
        if names <= bound:
            took = time.monotonic() - t0
            break
        if time.monotonic() - t0 > 180:
            raise RuntimeError(f"round {i}: the gang was not bound 180 s after the kill")
        time.sleep(0.05)
    r.start_one(leader)  # a fresh standby for the next round
    for n in names:
        kube.delete_pod(NAMESPACE, n)
    return took, moved if moved is not None else took


def run(kills: int = 20, log: Callable[[str], None] = print) -> dict[str, Any]:
    from testbed.cluster import create_nodes, load_topology, nodes_from_topology
    from testbed.kube import Kube

    samples: list[float] = []
    takeovers: list[float] = []
    with TestBed() as bed:
        kube = Kube(bed.api_url, bed.token)
        create_nodes(kube, nodes_from_topology(load_topology("tiny-3x2")))
        kube.ensure_namespace(NAMESPACE)
        r = Replicas(bed).start()
        try:
            for i in range(kills):
                took, moved = _round(bed, r, kube, i)
                samples.append(took)
                takeovers.append(moved)
                log(f"  kill {i + 1}/{kills}: next gang bound {took:.2f} s after the kill "
                    f"(lease moved after {moved:.2f} s)")
        finally:
            r.stop()
            kube.close()
    return {"rows": [summarize(samples, takeovers, lease_duration())],
            "samples_s": [round(s, 3) for s in samples],
            "takeovers_s": [round(s, 3) for s in takeovers]}
