"""Preemption latency: a high-priority gang's last member created to all of it bound, when the
cluster is full of lower-priority gangs it must evict.

On the real test bed, as a default install runs (Lockstep with its gang-gate webhook, the
stock kube-scheduler with Lockstep's profile, KWOK nodes of ``bench-64x8``): every node holds
one low-priority pod of 8 GPUs, paired into 2-pod gangs (created bound, so KWOK runs them),
their ``terminationGracePeriodSeconds`` 0. Then, one round at a time, a high-priority gang of
2 x 8 GPUs is created; Lockstep evicts one low gang whole (the DisruptionTarget condition, a
delete), KWOK finishes the deletions, and the gang binds. Each round's latency is from the
last member's create call returning to both members bound (polled every 20 ms), so it
includes the victims' termination as KWOK plays it (immediate): what remains is Lockstep's
decision, the evictions, the watch delivering them, the gate lift and kube-scheduler's cycle.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from testbed.cluster import create_nodes, load_topology, nodes_from_topology
from testbed.kube import Kube
from testbed.runner import TestBed
from testbed.workloads import pod

from .memory import _ready_nodes, _wait
from .throughput import LOCKSTEP_CONFIG, _create_all, _get_text

__all__ = ["TABLE_COLUMNS", "run"]

HIGH, LOW = ("bench-high", 100000), ("bench-low", 10)
TABLE_COLUMNS = (("nodes", "nodes"), ("rounds", "rounds"), ("p50_s", "p50 s"),
                 ("p95_s", "p95 s"), ("max_s", "max s"), ("victim_pods", "victim pods"),
                 ("preemptions", "preemptions"))


def _low_pods(nodes: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for i, n in enumerate(nodes):
        obj = (pod(f"low-{i // 2}-{i % 2}", "low").gang(f"low-{i // 2}", 2).gpu(8)
               .priority(LOW[1], LOW[0]).build())
        obj["spec"]["nodeName"] = n["metadata"]["name"]
        obj["spec"]["terminationGracePeriodSeconds"] = 0
        out.append(("/api/v1/namespaces/low/pods", obj))
    return out


def _metric(text: str, name: str) -> float:
    """The sum of a metric's samples over its labels."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith((name + " ", name + "{")))


def run(nodes: int = 1000, rounds: int = 10, timeout: float = 120.0,
        log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    node_objs = nodes_from_topology(load_topology("bench-64x8"), nodes=nodes)
    nodes = len(node_objs) - len(node_objs) % 2
    row: dict[str, Any] = {"nodes": nodes, "rounds": rounds}
    with TestBed() as bed:
        kube = Kube(bed.api_url, bed.token)
        create_nodes(kube, node_objs[:nodes])
        _wait("KWOK to make the nodes Ready", lambda: _ready_nodes(kube) >= nodes, timeout, 2.0)
        for name, value in (HIGH, LOW):
            kube.create("/apis/scheduling.k8s.io/v1/priorityclasses", {
                "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                "metadata": {"name": name}, "value": value})
        for ns in ("low", "high"):
            kube.ensure_namespace(ns)
        _create_all(kube, _low_pods(node_objs[:nodes]))
        _wait("KWOK to run the low gangs", lambda: len(kube.list(
            "/api/v1/namespaces/low/pods", fieldSelector="status.phase=Running")) >= nodes,
            timeout, 2.0)
        url = bed.start_lockstep(webhook=True)
        bed.start_scheduler(LOCKSTEP_CONFIG, name="lockstep-scheduler", extender_url=url)
        latencies = []
        for r in range(rounds):
            names = [f"high-{r}-{i}" for i in range(2)]
            for name in names:
                kube.create_pod(pod(name, "high").gang(f"high-{r}", 2).gpu(8)
                                .priority(HIGH[1], HIGH[0]).build())
            t0 = time.monotonic()
            while True:
                got = [kube.get(f"/api/v1/namespaces/high/pods/{n}") for n in names]
                if all(p["spec"].get("nodeName") for p in got):
                    break
                if time.monotonic() - t0 > timeout:
                    raise TimeoutError(f"round {r}: the high gang was not bound in {timeout}s")
                time.sleep(0.02)
            latencies.append(time.monotonic() - t0)
            log(f"  round {r}: {latencies[-1]:.2f} s")
        text = _get_text(f"{url}/metrics", None)
    ordered = sorted(latencies)
    row.update(
        p50_s=round(statistics.median(ordered), 3),
        p95_s=round(ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))], 3),
        max_s=round(ordered[-1], 3),
        victim_pods=int(_metric(text, "lockstep_evictions_total")),
        preemptions=int(_metric(text, "lockstep_preemptions_total")),
        latencies_s=[round(x, 3) for x in latencies])
    return {"rows": [row]}
