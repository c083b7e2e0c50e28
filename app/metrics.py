"""Prometheus metrics, ``lockstep_`` prefixed, following Prometheus naming rules.

Gauges that describe state (gangs by phase, parked binds, cache age) are computed at scrape
time from the core, so they can never drift from what the core holds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from coscheduling import GangPhase, Queries

__all__ = ["Metrics"]

_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0, 300.0,
)


class _StateCollector(Collector):
    def __init__(self, queries: Queries, sync_age: Callable[[float], dict[str, float]],
                 failed: Callable[[], dict[str, int]]) -> None:
        self._q = queries
        self._sync_age = sync_age
        self._failed = failed

    def collect(self) -> Iterable[Metric]:
        now = time.monotonic()
        gangs = GaugeMetricFamily("lockstep_gangs", "Gangs known to Lockstep, by phase.",
                                  labels=["phase"])
        counts = {p.value: 0 for p in GangPhase}
        for v in self._q.gang_views():
            counts[v.phase.value] += 1
        for phase, n in sorted(counts.items()):
            gangs.add_metric([phase], n)
        yield gangs
        yield GaugeMetricFamily("lockstep_parked_binds", "Bind calls held in the waiting map.",
                                value=self._q.parked_total())
        yield GaugeMetricFamily(
            "lockstep_reserved_gpus", "GPUs reserved for admitted gangs and not yet bound.",
            value=self._q.reserved_gpus())
        allocatable, used = self._gpus()
        yield GaugeMetricFamily("lockstep_allocatable_gpus",
                                "GPUs the cached nodes can allocate.", value=allocatable)
        yield GaugeMetricFamily(
            "lockstep_used_gpus", "GPUs requested by pods bound or assumed on cached nodes.",
            value=used)
        yield CounterMetricFamily(
            "lockstep_partial_gangs",
            "Gangs left partly bound because a member's binding failed for good after "
            "siblings bound (each is also a GangPartiallyBound Event and condition).",
            value=self._q.partial_gangs)
        age = GaugeMetricFamily(
            "lockstep_cache_sync_age_seconds",
            "Seconds since the last list, watch event or bookmark (-1 before the first list).",
            labels=["resource"],
        )
        for name, a in sorted(self._sync_age(now).items()):
            age.add_metric([name], a)
        yield age
        failed = CounterMetricFamily(
            "lockstep_cache_objects_failed",
            "Objects (or responses) the cache could not take in and skipped, logged, while "
            "its watch went on: a bug one object set off, or JSON it could not decode.",
            labels=["resource"])
        for name, n in sorted(self._failed().items()):
            failed.add_metric([name], n)
        yield failed
        yield GaugeMetricFamily("lockstep_cache_nodes", "Nodes in the cache.",
                                value=len(self._q.nodes))
        yield GaugeMetricFamily("lockstep_cache_pods", "Pods in the cache.",
                                value=len(self._q.pods))

    def _gpus(self) -> tuple[int, int]:
        return self._q.gpu_totals()


class Metrics:
    def __init__(self, queries: Queries, sync_age: Callable[[float], dict[str, float]],
                 failed: Callable[[], dict[str, int]] = dict) -> None:
        self.registry = CollectorRegistry()
        self.leading = Gauge(
            "lockstep_leading",
            "1 while this replica acts: its sidecar kube-scheduler holds the Lease and its view "
            "is rebuilt for the term (docs/failover.md); 0 on a standby.",
            registry=self.registry)
        self.leading.set(1)
        self.verb_seconds = Histogram(
            "lockstep_verb_duration_seconds",
            "Time to answer an extender verb (bind includes time parked).",
            ["verb"], buckets=_LATENCY_BUCKETS, registry=self.registry,
        )
        self.arrival_to_bound = Histogram(
            "lockstep_gang_arrival_to_bound_seconds",
            "From the creation of a gang's first member (the API server's timestamp, whole "
            "seconds) to the moment its quorum's bindings completed.",
            buckets=_LATENCY_BUCKETS, registry=self.registry,
        )
        self.admission_wait = Histogram(
            "lockstep_gang_admission_wait_seconds",
            "From a gang's first filter call to the moment its quorum was released to bind.",
            buckets=_LATENCY_BUCKETS, registry=self.registry,
        )
        self.lifts = Counter(
            "lockstep_gate_lifts_total",
            "Lockstep's scheduling gate taken off pods, by outcome (pinned: to the planned "
            "node; unpinned: no plan holds the pod; failed: the API refused for good).",
            ["outcome"], registry=self.registry,
        )
        self.preemptions = Counter(
            "lockstep_preemptions_total",
            "Preemptions started: a gang that did not fit evicted lower-priority work.",
            registry=self.registry,
        )
        self.preemption_victims = Counter(
            "lockstep_preemption_victims_total",
            "Victims of preemptions, by kind (gang: a whole gang; pod: a plain pod).",
            ["kind"], registry=self.registry,
        )
        self.evictions = Counter(
            "lockstep_evictions_total",
            "Victim pods Lockstep deleted, by outcome (deleted; gone: deleted or replaced "
            "already; failed: the API refused).",
            ["outcome"], registry=self.registry,
        )
        self.defrag_moves = Counter(
            "lockstep_defrag_moves_total",
            "Pods moved to make room for a waiting gang (defragmentation), by outcome "
            "(evicted; gone: deleted or replaced already; refused: the Eviction API said no, "
            "a PodDisruptionBudget for one; failed).",
            ["outcome"], registry=self.registry,
        )
        self.claims_deallocated = Counter(
            "lockstep_claims_deallocated_total",
            "DRA claims whose unused allocation Lockstep cleared, by outcome (cleared; left: "
            "changed meanwhile, or the API refused).",
            ["outcome"], registry=self.registry,
        )
        self.bind_errors = Counter(
            "lockstep_bind_errors_total", "Bind calls answered with an error, by cause.",
            ["cause"], registry=self.registry,
        )
        self.binds = Counter(
            "lockstep_binds_total", "Pods bound through the API by Lockstep.",
            registry=self.registry,
        )
        self.rejections = Counter(
            "lockstep_filter_rejections_total", "Gang pods turned away by filter, by reason.",
            ["reason"], registry=self.registry,
        )
        self.timeouts = Counter(
            "lockstep_gang_timeouts_total", "Gangs that reached their deadline short of quorum.",
            registry=self.registry,
        )
        self.webhook = Counter(
            "lockstep_webhook_admissions_total",
            "Pod admission requests the mutating webhook answered, by decision (pinned: "
            "placed at creation, no gate; gated: Lockstep's gate added; unpinned: a pin taken "
            "back on reinvocation; malformed: answered 400).",
            ["decision"], registry=self.registry,
        )
        self.registry.register(_StateCollector(queries, sync_age, failed))
