"""Create latency through Lockstep's webhook, against the same API server without it.

``python -m benchmarks creates``: does the default install make pod creates slower,
and do creates of a burst wait on each other? One test bed (``--nodes`` KWOK nodes x 8 GPUs,
Lockstep's default install with its own certificate, no kube-scheduler: only the create is
timed), six phases, each in a namespace of its own:

* **webhook, 16 creators**: ``--gangs`` gangs of ``--size`` 1-GPU pods created through one pool
  of 16 threads, in gang order, as ``throughput``'s burst does. Lockstep holds each review
  until its gang's quorum of reviews is in hand (``coscheduling.creation.placer``), so a
  member's create returns when its gang's last member reached the webhook;
* **webhook, one creator**: ``--serial-gangs`` gangs created one pod at a time, each create
  waiting for the last, as a client that waits for each answer does. Such a gang's first
  review is held for ``HOLD_SECONDS`` (no sibling can come while it waits), then gated, and
  the gang is remembered as created slowly (its later members are gated at once);
* **webhook, a gang at a time**: ``2 x --serial-gangs`` gangs, each gang's members created
  together (``--size`` threads), the next gang once all are answered, as a controller that
  creates a job's pods in one batch does (and ``throughput --mode steady`` per gang): the
  gang's creates take as long as its slowest member plus the hold;
* then the MutatingWebhookConfiguration is deleted (the API server stops calling it once its
  informer sees that: a dry-run probe says when) and all three are run again.

Per phase: the creates' span and rate, the CPU the API server, etcd and Lockstep spent per
create, each create's latency (client clock, p50 / p90 / p99 /
max), the webhook's answers (``lockstep_webhook_admissions_total``), and the API server's own
time in the webhook call per create (``apiserver_admission_webhook_admission_duration_seconds``
sum / count): the hold is inside that, Lockstep's own work is the part the no-hold answers
(gated at once) show. The quorum hold's share of a create is that time over the create's
latency.
"""

from __future__ import annotations

import concurrent.futures
import statistics
import time
from collections.abc import Sequence
from typing import Any

from testbed.cluster import create_nodes, load_topology, nodes_from_topology
from testbed.kube import Kube
from testbed.runner import TestBed

from .throughput import (
    GangSpec,
    _cpu_seconds,
    _get_text,
    _wait_nodes_ready,
    build_pods,
    parse_prometheus,
)

__all__ = ["TABLE_COLUMNS", "run"]

WEBHOOK_SERIES = "apiserver_admission_webhook_admission_duration_seconds"
SETTLE_SECONDS = 3.0
"""After every node is Ready, before the first phase."""

TABLE_COLUMNS = (
    ("phase", "phase"),
    ("creates", "creates"),
    ("span_s", "span s"),
    ("creates_per_s", "creates/s"),
    ("p50_ms", "p50 ms"),
    ("p90_ms", "p90 ms"),
    ("p99_ms", "p99 ms"),
    ("max_ms", "max ms"),
    ("webhook_ms_per_create", "in webhook ms/create"),
    ("webhook_share", "webhook share of p50"),
    ("cpu_ms_per_create", "CPU ms per create"),
    ("answers", "webhook answers"),
)


def _pct(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def _webhook_time(kube_text: str) -> tuple[float, float]:
    """(seconds, calls) the API server spent calling mutating webhooks so far."""
    total = count = 0.0
    for name, labels, v in parse_prometheus(kube_text, (WEBHOOK_SERIES,)):
        if labels.get("type") != "admit":
            continue
        if name == f"{WEBHOOK_SERIES}_sum":
            total += v
        elif name == f"{WEBHOOK_SERIES}_count":
            count += v
    return total, count


def _answers(url: str | None) -> dict[str, float]:
    if url is None:
        return {}
    found = parse_prometheus(_get_text(f"{url}/metrics"), ("lockstep_webhook_admissions_total",))
    return {labels.get("decision", ""): v for _, labels, v in found}


def _create_timed(kube: Kube, batches: list[list[tuple[str, dict[str, Any]]]], workers: int
                  ) -> tuple[list[float], float]:
    """Create each batch through ``workers`` threads in order, the next batch once the last
    is answered; each create's seconds, and the span from the first create sent to the last
    answered."""
    def one(o: tuple[str, dict[str, Any]]) -> float:
        t = time.perf_counter()
        kube.create(o[0], o[1])
        return time.perf_counter() - t

    t0 = time.perf_counter()
    lat: list[float] = []
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for batch in batches:
            lat += pool.map(one, batch)
    return lat, time.perf_counter() - t0


def _phase(bed: TestBed, kube: Kube, url: str | None, name: str, ns: str, gangs: int,
           size: int, workers: int, by_gang: bool = False) -> dict[str, Any]:
    """``by_gang``: a gang's members together, the next gang once they are all created (as
    a controller creating a job's pods in one batch does); else every pod through one pool."""
    kube.ensure_namespace(ns)
    groups = [[(f"/api/v1/namespaces/{ns}/pods", p)
               for p in build_pods(GangSpec(f"{ns}-{i:04d}", size, 1), "lockstep", ns)[0]]
              for i in range(gangs)]
    objs = [o for g in groups for o in g]
    metrics = f"{bed.api_url}/metrics"
    pids = {k: bed.procs[k].pid for k in ("kube-apiserver", "lockstep", "etcd")}
    (w0, c0), a0 = _webhook_time(_get_text(metrics, bed.token)), _answers(url)
    cpu0 = {k: _cpu_seconds(pid) or 0.0 for k, pid in pids.items()}
    lat, span = _create_timed(kube, groups if by_gang else [objs], workers)
    cpu1 = {k: _cpu_seconds(pid) or 0.0 for k, pid in pids.items()}
    (w1, c1), a1 = _webhook_time(_get_text(metrics, bed.token)), _answers(url)
    answers = {k: int(v - a0.get(k, 0.0)) for k, v in a1.items() if v - a0.get(k, 0.0)}
    calls = c1 - c0
    per_create = (w1 - w0) / len(objs) if calls else 0.0
    p50 = statistics.median(lat)
    return {
        "phase": name, "creates": len(objs), "workers": workers,
        "span_s": round(span, 2), "creates_per_s": round(len(objs) / span, 1),
        "p50_ms": round(p50 * 1000, 1), "p90_ms": round(_pct(lat, 0.9) * 1000, 1),
        "p99_ms": round(_pct(lat, 0.99) * 1000, 1), "max_ms": round(max(lat) * 1000, 1),
        "mean_ms": round(statistics.fmean(lat) * 1000, 1),
        "webhook_calls": int(calls),
        "webhook_ms_per_create": round(per_create * 1000, 1),
        "webhook_share": round(per_create / statistics.fmean(lat), 2) if calls else 0.0,
        "answers": answers,
        "cpu_ms_per_create": {k: round((cpu1[k] - cpu0[k]) * 1000 / len(objs), 2)
                              for k in pids},
    }


def _without_webhook(kube: Kube, name: str = "lockstep") -> None:
    """Delete the configuration and wait until a dry-run create of a gang pod is no longer
    gated (the API server's informer has dropped the webhook)."""
    kube.delete(f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{name}")
    probe = build_pods(GangSpec("webhook-gone-probe", 1, 1), "lockstep", "default")[0][0]
    kube.wait("the API server no longer calling the webhook", lambda: not kube.request(
        "POST", "/api/v1/namespaces/default/pods", probe,
        params={"dryRun": "All"})["spec"].get("schedulingGates"), 30.0, interval=0.1)


def run(nodes: int = 1000, gangs: int = 100, size: int = 8, serial_gangs: int = 20
        ) -> dict[str, Any]:
    """The six phases on one bed; returns the JSON (rows in run order)."""
    rows = []
    with TestBed() as bed:
        kube = Kube(bed.api_url, bed.token)
        create_nodes(kube, nodes_from_topology(load_topology("bench-64x8"), nodes=nodes))
        url: str | None = bed.start_lockstep(webhook=True)
        # KWOK patches each new node's status once: those patches must not fall inside the
        # first phase only (they did: 0.2 s of the API server's CPU in its first 5 s).
        _wait_nodes_ready(kube, nodes, 120.0)
        time.sleep(SETTLE_SECONDS)
        for hooked in (True, False):
            if not hooked:
                _without_webhook(kube)
                url = None
            tag = "webhook" if hooked else "no webhook"
            rows.append(_phase(bed, kube, url, f"{tag}, 16 creators",
                               f"c-{'w' if hooked else 'n'}-par", gangs, size, 16))
            rows.append(_phase(bed, kube, url, f"{tag}, a gang at a time",
                               f"c-{'w' if hooked else 'n'}-gang", serial_gangs * 2, size,
                               size, by_gang=True))
            rows.append(_phase(bed, kube, url, f"{tag}, one creator",
                               f"c-{'w' if hooked else 'n'}-one", serial_gangs, size, 1))
    return {"nodes": nodes, "gangs": gangs, "size": size, "serial_gangs": serial_gangs,
            "rows": rows}
