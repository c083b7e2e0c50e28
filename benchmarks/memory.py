"""Lockstep's memory with a large cluster cached (goal: RSS <= 300 MB at 5,000 nodes and
50,000 pods).

Lockstep lists and watches every node and every pod of the cluster, not only its own, because
the capacity it reserves for gangs is what the *other* pods leave free. Its memory therefore
grows with the cluster, and this benchmark measures it on the real test bed (etcd,
kube-apiserver, KWOK; no kube-scheduler is needed):

- ``nodes`` KWOK nodes of ``bench-64x8`` (racks of 8 nodes x 8 GPUs);
- ``pods`` pods in all, spread over a few namespaces: about ``BOUND_SHARE`` of them bound
  (created with ``spec.nodeName``, so KWOK runs them; spread over the nodes within their
  capacity), ``gangs`` Lockstep gangs of ``gang_size`` x 1 GPU behind Lockstep's gate (as its
  webhook would create them, so Lockstep admits them, reserves their capacity and lifts the
  gates; with no kube-scheduler running they then stay pending, which is fine here), and the
  rest pending pods of a scheduler that does not run (``schedulerName: nobody``): the backlog
  a busy cluster carries;
- pod specs as a controller would stamp them: requests equal to limits, a handful of labels
  and annotations, env, ports and probes, so the API's objects are not unrealistically small.

Everything is created before Lockstep starts (what a restart of Lockstep in a big cluster
sees); Lockstep's own start on the empty bed gives a baseline first. Then: the time until
``/readyz`` answers, the time until ``/metrics`` shows the whole cluster cached
(``lockstep_cache_nodes``, ``lockstep_cache_pods``) and all gates lifted, a few seconds to
settle, and Lockstep's RSS and peak RSS (VmHWM) from /proc, sampled over the whole run.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import random
import resource
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from coscheduling.gang.gating import GANG_GATE
from coscheduling.resources import Resources, fits, pod_requests, resource_list, sub
from testbed.cluster import create_nodes, load_topology, nodes_from_topology
from testbed.kube import Kube
from testbed.runner import TestBed
from testbed.workloads import pod

from .throughput import (
    Sampler,
    _cpu_seconds,
    _create_all,
    _get_text,
    _rss_mb,
    format_table,
    parse_prometheus,
)

__all__ = [
    "BOUND_SHARE",
    "GOAL_MB",
    "TABLE_COLUMNS",
    "MemoryWorkload",
    "build_workload",
    "cache_counts",
    "run",
]

GOAL_MB = 300.0
"""Goal: Lockstep's RSS with 5,000 nodes and 50,000 pods cached."""
GOAL_NODES, GOAL_PODS = 5000, 50000
BOUND_SHARE = 0.10
"""About this share of all pods are bound (running on KWOK nodes)."""
TEAMS = ("team-a", "team-b", "team-c", "team-d", "team-e")
"""Namespaces of the bound and pending pods; the gangs live in ``GANG_NS``."""
GANG_NS = "train"
GPU = "nvidia.com/gpu"
NOBODY = "nobody"
"""The scheduler name of the pending backlog: no such scheduler runs."""

# (kind, cpu, memory, GPUs): what bound and pending pods request.
RUNNING_SHAPES = (("web", "500m", "1Gi", 0), ("web", "1", "2Gi", 0),
                  ("infer", "4", "32Gi", 1), ("train", "16", "128Gi", 2),
                  ("train", "32", "256Gi", 4))
PENDING_SHAPES = (*RUNNING_SHAPES, ("batch", "2", "8Gi", 0), ("train", "64", "512Gi", 8))

TABLE_COLUMNS = (
    ("nodes_cached", "nodes cached"),
    ("pods_cached", "pods cached"),
    ("bound", "bound"),
    ("pending", "pending"),
    ("gang_pods", "gang pods"),
    ("gates_lifted", "gates lifted"),
    ("reserved_gpus", "reserved GPUs"),
    ("baseline_rss_mb", "empty RSS MB"),
    ("rss_mb", "RSS MB"),
    ("peak_rss_mb", "peak RSS MB"),
    ("ready_s", "ready s"),
    ("cached_s", "all cached s"),
    ("goal", "goal <= 300 MB"),
)


# ---------------------------------------------------------------------------- workload (pure)


@dataclass(frozen=True)
class MemoryWorkload:
    """The pods of one run, by role, in creation order (each a Pod as JSON)."""

    bound: tuple[dict[str, Any], ...]
    pending: tuple[dict[str, Any], ...]
    gangs: tuple[dict[str, Any], ...]

    @property
    def pods(self) -> int:
        return len(self.bound) + len(self.pending) + len(self.gangs)

    def namespaces(self) -> list[str]:
        return sorted({p["metadata"]["namespace"]
                       for p in (*self.bound, *self.pending, *self.gangs)})

    def describe(self) -> dict[str, Any]:
        return {"pods": self.pods, "bound": len(self.bound), "pending": len(self.pending),
                "gang_pods": len(self.gangs),
                "gangs": len({p["metadata"]["annotations"]["lockstep.dev/pod-group"]
                              for p in self.gangs}),
                "namespaces": self.namespaces()}


def _realistic(b: Any, kind: str, team: str, i: int) -> dict[str, Any]:
    """What a controller stamps on its pods beyond requests: labels, annotations, env, ports,
    probes (Lockstep's list sees all of it, even though its records keep little)."""
    obj: dict[str, Any] = b.annotate("bench/kind", kind) \
        .annotate("prometheus.io/scrape", "true").annotate("prometheus.io/port", "9090") \
        .build()
    app = f"{kind}-{i // 50:04d}"
    obj["metadata"]["labels"].update({
        "app.kubernetes.io/name": app, "app.kubernetes.io/part-of": team,
        "app.kubernetes.io/managed-by": "bench", "pod-template-hash": f"{i // 50:08x}",
        "bench/team": team})
    c = obj["spec"]["containers"][0]
    c["env"] = [{"name": "APP", "value": app}, {"name": "TEAM", "value": team},
                {"name": "LOG_LEVEL", "value": "info"},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    c["ports"] = [{"name": "http", "containerPort": 8080}, {"name": "metrics",
                                                           "containerPort": 9090}]
    c["readinessProbe"] = {"httpGet": {"path": "/healthz", "port": 8080},
                           "periodSeconds": 10}
    return obj


def _shaped(name: str, ns: str, shape: tuple[str, str, str, int], i: int) -> dict[str, Any]:
    kind, cpu, mem, gpus = shape
    b = pod(name, ns).cpu(cpu).memory(mem)
    if gpus:
        b.gpu(gpus)
    return _realistic(b, kind, ns, i)


def build_workload(nodes: Sequence[Mapping[str, Any]], pods: int, *, gangs: int = 100,
                   gang_size: int = 8, bound_share: float = BOUND_SHARE, seed: int = 12,
                   gang_timeout: float = 60.0) -> MemoryWorkload:
    """``pods`` pods for ``nodes`` (Node objects as JSON): bound, pending and gang pods.

    ``round(pods * bound_share)`` pods are bound, placed round-robin over the nodes within each
    node's allocatable (cpu, memory, pods) and leaving at least half of its GPUs free, so gangs
    always find room; a drawn shape that fits nowhere gives way to smaller ones (in the end a
    CPU-only pod). ``gangs`` x ``gang_size`` pods of 1 GPU carry Lockstep's gate; the rest are
    pending pods for scheduler ``nobody``. Seeded: the same arguments give the same pods.
    Raises ValueError when the bound pods do not fit or the counts do not add up.
    """
    n_gang = gangs * gang_size
    n_bound = round(pods * bound_share)
    n_pending = pods - n_bound - n_gang
    if n_pending < 0 or not 0 <= bound_share <= 1 or (not nodes and n_bound):
        raise ValueError(f"{pods} pods cannot hold {n_bound} bound and {n_gang} gang pods "
                         f"on {len(nodes)} nodes")
    rng = random.Random(seed)
    free: list[Resources] = []
    for n in nodes:
        alloc = resource_list((n.get("status") or {}).get("allocatable"))
        if GPU in alloc:
            alloc[GPU] -= alloc[GPU] // 2  # kept free for the gangs
        free.append(alloc)
    names = [str(n["metadata"]["name"]) for n in nodes]
    by_size = sorted(RUNNING_SHAPES, key=lambda s: (s[3], s), reverse=True)
    bound: list[dict[str, Any]] = []
    cursor = 0
    for i in range(n_bound):
        ns = TEAMS[i % len(TEAMS)]
        drawn = rng.choice(RUNNING_SHAPES)
        placed = None
        for shape in (drawn, *(s for s in by_size if s[3] < drawn[3] or s == by_size[-1])):
            obj = _shaped(f"run-{i:05d}", ns, shape, i)
            need = pod_requests(obj["spec"])
            for step in range(len(nodes)):
                j = (cursor + step) % len(nodes)
                if fits(need, free[j]):
                    placed = j
                    break
            if placed is not None:
                break
        if placed is None:
            raise ValueError(f"bound pod {i} does not fit on any of {len(nodes)} nodes")
        free[placed] = sub(free[placed], need)
        cursor = placed + 1
        obj["spec"]["nodeName"] = names[placed]
        obj["spec"]["schedulerName"] = "default-scheduler"
        bound.append(obj)
    pending = []
    for i in range(n_pending):
        obj = _shaped(f"pend-{i:05d}", TEAMS[i % len(TEAMS)], rng.choice(PENDING_SHAPES), i)
        obj["spec"]["schedulerName"] = NOBODY
        pending.append(obj)
    gang_pods = [
        _realistic(pod(f"gang-{g:03d}-{m}", GANG_NS).gang(f"gang-{g:03d}", gang_size,
                                                            timeout=gang_timeout)
                   .gpu(1).gated(), "train", GANG_NS, g)
        for g in range(gangs) for m in range(gang_size)]
    return MemoryWorkload(tuple(bound), tuple(pending), tuple(gang_pods))


def gated(obj: Mapping[str, Any]) -> bool:
    """True while the pod carries Lockstep's scheduling gate."""
    return any(g.get("name") == GANG_GATE for g in obj["spec"].get("schedulingGates") or ())


def cache_counts(metrics_text: str) -> dict[str, float]:
    """The gauges and counters of Lockstep's /metrics this benchmark waits on and reports."""
    out: dict[str, float] = {}
    for name, lab, v in parse_prometheus(metrics_text, ("lockstep_",)):
        if name in ("lockstep_cache_nodes", "lockstep_cache_pods", "lockstep_reserved_gpus"):
            out[name.removeprefix("lockstep_")] = v
        elif name == "lockstep_gate_lifts_total":
            out["gate_lifts"] = out.get("gate_lifts", 0.0) + v
            out[f"gate_lifts_{lab.get('outcome', '')}"] = v
        elif name == "lockstep_gangs":
            out[f"gangs_{lab.get('phase', '')}"] = v
    return out


# ---------------------------------------------------------------------------- the run


def _paths(objs: Sequence[Mapping[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(f"/api/v1/namespaces/{o['metadata']['namespace']}/pods", dict(o)) for o in objs]


def _timed(fn: Callable[[], Any]) -> float:
    t = time.monotonic()
    fn()
    return round(time.monotonic() - t, 2)


def _wait(what: str, cond: Callable[[], bool], timeout: float, interval: float = 0.5) -> float:
    """Seconds until ``cond()`` held; raises TimeoutError naming ``what``."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
    return round(time.monotonic() - t0, 2)


def _ready_nodes(kube: Kube) -> int:
    return sum(1 for n in kube.nodes() if any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (n.get("status") or {}).get("conditions") or ()))


def _cpu(bed: TestBed) -> dict[str, float | None]:
    """CPU seconds so far of this process and of the control plane (who limits creation)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    return {"bench": me.ru_utime + me.ru_stime,
            **{n: _cpu_seconds(bed.procs[n].pid) for n in ("kube-apiserver", "etcd", "kwok")}}


def _cpu_delta(a: Mapping[str, float | None], b: Mapping[str, float | None]
               ) -> dict[str, float | None]:
    return {k: round(vb - va, 1) if (va := a[k]) is not None and (vb := b[k]) is not None
            else None for k in a}


@contextlib.contextmanager
def _frozen() -> Iterator[None]:
    """The workload's ~2 million dicts and strings live to the end: out of the collector's
    sight, full collections no longer walk them (~25% of this process's CPU per create)."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def run(nodes: int, pods: int, *, gangs: int = 100, gang_size: int = 8, settle: float = 5.0,
        timeout: float = 600.0, workers: int = 16,
        log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """One measurement on a fresh test bed; returns the row and what was created how fast."""
    node_objs = nodes_from_topology(load_topology("bench-64x8"), nodes=nodes)
    wl = build_workload(node_objs, pods, gangs=gangs, gang_size=gang_size)
    row: dict[str, Any] = {"nodes": nodes, **wl.describe()}
    created: dict[str, Any] = {}
    with _frozen(), TestBed() as bed:
        kube = Kube(bed.api_url, bed.token)
        # Lockstep on the empty cluster first: the interpreter, FastAPI and the core alone.
        bed.start_lockstep(webhook=False)  # as measured so far: the gangs come pre-gated
        time.sleep(1.0)
        row["baseline_rss_mb"] = _rss_mb(bed.procs["lockstep"].pid)["rss_mb"]
        bed.stop_process("lockstep")

        created["nodes_s"] = _timed(lambda: create_nodes(kube, node_objs))
        # KWOK marks every node Ready (a status write each); pods created meanwhile compete
        # with it for the two cores, so the creation rate below is of pods alone.
        created["nodes_ready_wait_s"] = _wait("KWOK to make the nodes Ready",
                                              lambda: _ready_nodes(kube) >= nodes, timeout, 2.0)
        for ns in wl.namespaces():
            kube.ensure_namespace(ns)
        cpu0, load0 = _cpu(bed), os.getloadavg()[0]
        for role, objs in (("bound", wl.bound), ("pending", wl.pending), ("gangs", wl.gangs)):
            s = _timed(functools.partial(_create_all, kube, _paths(objs), workers=workers))
            created[f"{role}_s"] = s
            created[f"{role}_per_s"] = round(len(objs) / s) if s else None
            log(f"  created {len(objs)} {role} pods in {s} s")
        total = sum(created[f"{r}_s"] for r in ("bound", "pending", "gangs"))
        created["pods_s"] = round(total, 2)
        created["pods_per_s"] = round(wl.pods / total) if total else None
        created["cpu_s"] = _cpu_delta(cpu0, _cpu(bed))
        created["loadavg_1m"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
        # KWOK turns the bound pods Running; let it finish so Lockstep lists a still cluster.
        created["running_wait_s"] = _wait("KWOK to run the bound pods", lambda: len(
            kube.list("/api/v1/pods", fieldSelector="status.phase=Running")) >= len(wl.bound),
            timeout, interval=2.0)

        def lockstep_rss() -> float | None:
            """The running Lockstep's RSS (None before it is spawned: the baseline one is
            stopped), so the timeline covers its initial list too."""
            proc = bed.procs["lockstep"]
            return _rss_mb(proc.pid)["rss_mb"] if proc.alive() else None

        t0 = time.monotonic()
        rss = Sampler(lockstep_rss, 0.25).start()
        url = bed.start_lockstep(webhook=False)
        row["ready_s"] = round(time.monotonic() - t0, 2)
        pid = bed.procs["lockstep"].pid
        counts: dict[str, float] = {}

        def cached() -> bool:
            counts.update(cache_counts(_get_text(f"{url}/metrics")))
            return (counts.get("cache_nodes") == nodes and counts.get("cache_pods") == wl.pods
                    and counts.get("gate_lifts", 0) >= len(wl.gangs))

        try:
            _wait("Lockstep to cache the cluster and lift every gate", cached, timeout, 0.25)
        except TimeoutError as e:
            row["error"] = str(e)
        row["cached_s"] = round(time.monotonic() - t0, 2)
        row["cpu_s_to_cached"] = _cpu_seconds(pid)
        time.sleep(settle)
        counts.update(cache_counts(_get_text(f"{url}/metrics")))
        row.update(_rss_mb(pid))
        row["rss_timeline_mb"] = [(round(t - t0, 2), v) for t, v in rss.stop()[::2]
                                  if v is not None]
        row["nodes_cached"] = int(counts.get("cache_nodes", -1))
        row["pods_cached"] = int(counts.get("cache_pods", -1))
        row["gates_lifted"] = int(counts.get("gate_lifts", 0))
        row["reserved_gpus"] = int(counts.get("reserved_gpus", 0))
        row["lockstep"] = counts
        row["still_gated"] = sum(1 for p in kube.pods(GANG_NS) if gated(p))
        row["goal_met"] = row["rss_mb"] is not None and row["rss_mb"] <= GOAL_MB
        row["peak_within_goal"] = (row["peak_rss_mb"] is not None
                                   and row["peak_rss_mb"] <= GOAL_MB)
        # The goal is stated at 5,000 nodes and 50,000 pods; a smaller run only hints at it.
        at_scale = nodes >= GOAL_NODES and wl.pods >= GOAL_PODS
        row["goal"] = ("met" if row["goal_met"] else "MISSED") + ("" if at_scale
                                                                  else " (smaller run)")
        row["context_rss_mb"] = {name: _rss_mb(bed.procs[name].pid)["rss_mb"]
                                 for name in ("kube-apiserver", "etcd", "kwok")}
        kube.close()
    return {"goal_mb": GOAL_MB, "workers": workers, "settle_s": settle, "created": created,
            "rows": [row]}


def format_result(result: Mapping[str, Any]) -> str:
    """The table plus one line on how the cluster was built (creation rate)."""
    c = result["created"]
    row = result["rows"][0]
    cpu = ", ".join(f"{k} {v:g}" for k, v in c["cpu_s"].items() if v is not None)
    load = " -> ".join(f"{v:g}" for v in c["loadavg_1m"])
    return (format_table(result["rows"], TABLE_COLUMNS) + "\n"
            f"(created {row['pods']} pods in {c['pods_s']} s, {c['pods_per_s']} pods/s with "
            f"{result['workers']} threads, CPU s {cpu}, load {load}; {row['nodes']} nodes in "
            f"{c['nodes_s']} s; RSS read {result['settle_s']:g} s after everything was cached)")

