"""Gang throughput side by side: three schedulers, one workload, one invocation.

Each scheduler gets a fresh test bed with the same node count (``bench-64x8`` scaled: racks of
8 nodes x 8 GPUs) and the same seeded pods, all created *before* the scheduler starts:

- ``stock``: the stock kube-scheduler (default profile) on the workload as plain pods;
- ``lockstep``: the stock kube-scheduler with ``scheduler-config/lockstep.yaml`` and Lockstep,
  gangs declared with Lockstep's annotations;
- ``sp``: scheduler-plugins v0.34.7 Coscheduling
  (``scheduler-config/scheduler-plugins-coscheduling.yaml``), gangs as ``PodGroup`` objects.

Every scheduler runs with client QPS/burst 200/400. Times are ``time.monotonic()`` readings of
this process: ``t0`` is taken just before the scheduler process is spawned, a pod's binding time
when the binding recorder's watch delivers it. Metrics per scheduler:

- pods/s: pods bound / (last binding - t0);
- gang done p50/p95: per gang, last member bound - t0;
- gang bind spread p95: per gang, last binding - first binding;
- nodes per gang: distinct nodes a gang's members landed on (mean);
- arrival p95: a second phase creates gangs one by one while the scheduler runs (after the
  first batch is bound); per gang, all members bound - its last member created;
- RSS of Lockstep (and of each scheduler) at the end, and the API requests each run made
  (kube-apiserver's ``apiserver_request_total``, delta over the run);
- CPU-seconds from t0 to the batch's last binding (read within 0.1 s of it, so a run that
  stalls is not charged for the wait) per process (kube-apiserver, etcd, KWOK, the scheduler,
  Lockstep, this harness with its binding recorder) and for the whole machine (``/proc/stat``,
  with the time the hypervisor stole), and the machine's CPU per pod: on two saturated cores
  the span follows it.

The machine is small and shared: compare the ratios within one run, not absolute pods/s.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import math
import os
import random
import re
import statistics
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from testbed.bins import REPO
from testbed.cluster import create_nodes, load_topology, nodes_from_topology
from testbed.http import get
from testbed.kube import Kube
from testbed.recorder import BindingRecorder
from testbed.runner import TestBed, free_port
from testbed.workloads import pod, podgroup

__all__ = [
    "SCHEDULERS",
    "TABLE_COLUMNS",
    "GangSpec",
    "Workload",
    "build_pods",
    "cpu_breakdown",
    "median_ratios",
    "mixed",
    "parse_prometheus",
    "percentile",
    "ratios",
    "round_orders",
    "run",
    "summarize",
    "uniform",
]

SCHEDULERS = ("stock", "lockstep", "sp")
MODES = ("burst", "steady", "backlog")
CONTROL_PLANE = ("etcd", "kube-apiserver", "kwok")
LOCKSTEPS = ("lockstep", "lockstep-ungated")
LABELS = {
    "stock": "stock kube-scheduler, plain pods",
    "lockstep": "kube-scheduler + Lockstep, default install (its webhook pins or gates)",
    "lockstep-ungated": "kube-scheduler + Lockstep, no webhook",
    "sp": "scheduler-plugins Coscheduling, PodGroups",
}
SP_SCHEDULER = "scheduler-plugins-scheduler"
LOCKSTEP_CONFIG = REPO / "scheduler-config" / "lockstep.yaml"
SP_CONFIG = REPO / "scheduler-config" / "scheduler-plugins-coscheduling.yaml"
NODE_GPUS = 8
NS = "bench"
QPS, BURST = 200, 400

MIXED_SIZES = (2, 2, 4, 4, 4, 8, 8, 8, 16, 16, 32, 64)
MIXED_GPUS = (1, 1, 2, 2, 4, 8)
PLAIN_SHARE = 0.1
"""In the mixed shape, about this share of pods are plain (no gang), 1-8 GPUs each."""

TABLE_COLUMNS = (
    ("scheduler", "scheduler"),
    ("pods_per_s", "pods/s"),
    ("pods_per_s_after_first", "pods/s after 1st bind"),
    ("gang_done_p50_s", "gang done p50 s"),
    ("gang_done_p95_s", "gang done p95 s"),
    ("spread_p95_ms", "bind spread p95 ms"),
    ("nodes_per_gang", "nodes/gang"),
    ("arrival_p95_s", "arrival p95 s"),
    ("steady_arrival_p95_s", "stream arrival p95 s"),
    ("unbound", "unbound"),
    ("pinned_share", "members pinned at creation"),
    ("rss_mb", "Lockstep RSS MB"),
    ("machine_cpu_ms_per_pod", "machine CPU ms/pod"),
)


# ---------------------------------------------------------------------------- workload (pure)


@dataclass(frozen=True)
class GangSpec:
    """``size`` pods of ``gpus`` GPUs each; ``gang=False`` is a plain pod (size 1)."""

    name: str
    size: int
    gpus: int
    gang: bool = True

    @property
    def total_gpus(self) -> int:
        return self.size * self.gpus

    def pod_names(self) -> list[str]:
        return [self.name] if not self.gang else [f"{self.name}-{i}" for i in range(self.size)]


@dataclass(frozen=True)
class Workload:
    shape: str
    seed: int | None
    groups: tuple[GangSpec, ...]
    """Gangs and plain pods, in creation order."""
    arrivals: tuple[GangSpec, ...] = ()
    """Gangs created one by one while the scheduler runs (after ``groups`` are bound)."""

    @property
    def pods(self) -> int:
        return sum(g.size for g in self.groups)

    @property
    def gpus(self) -> int:
        return sum(g.total_gpus for g in self.groups)

    def describe(self) -> dict[str, Any]:
        gangs = [g for g in self.groups if g.gang]
        return {"shape": self.shape, "seed": self.seed, "gangs": len(gangs),
                "plain_pods": sum(1 for g in self.groups if not g.gang), "pods": self.pods,
                "gpus": self.gpus, "arrival_gangs": len(self.arrivals),
                "gang_sizes": sorted({g.size for g in gangs}),
                "gpus_per_pod": sorted({g.gpus for g in self.groups})}


def uniform(gangs: int, size: int, gpus: int, arrivals: int = 0) -> Workload:
    """``gangs`` gangs of ``size`` pods x ``gpus`` GPUs (the issue's 100 x 8 x 1)."""
    if gangs < 1 or size < 1 or not 1 <= gpus <= NODE_GPUS:
        raise ValueError(f"need gangs >= 1, size >= 1, 1 <= gpus <= {NODE_GPUS}")
    return Workload("uniform", None,
                    tuple(GangSpec(f"g{i:04d}", size, gpus) for i in range(gangs)),
                    tuple(GangSpec(f"a{i:04d}", size, gpus) for i in range(arrivals)))


def mixed(seed: int, gangs: int, capacity_gpus: int, arrivals: int = 0,
          fill: float = 0.6) -> Workload:
    """Seeded gangs of 2-64 pods x 1-8 GPUs plus ~10% plain pods.

    Gangs are drawn until ``gangs`` or until the next one would push the batch past ``fill`` of
    ``capacity_gpus`` (so every scheduler can place all of it); arrivals come from the same
    distribution within a further 15% of capacity."""
    rng = random.Random(seed)
    budget = int(capacity_gpus * fill)
    groups: list[GangSpec] = []
    used = n_gangs = n_plain = 0
    pods_in_gangs = 0
    while n_gangs < gangs:
        size, gpus = rng.choice(MIXED_SIZES), rng.choice(MIXED_GPUS)
        if used + size * gpus > budget:
            break
        groups.append(GangSpec(f"g{n_gangs:04d}", size, gpus))
        used += size * gpus
        n_gangs += 1
        pods_in_gangs += size
        # interleave plain pods so they are ~PLAIN_SHARE of all pods
        while n_plain < PLAIN_SHARE / (1 - PLAIN_SHARE) * pods_in_gangs:
            g = rng.choice(MIXED_GPUS)
            if used + g > budget:
                break
            groups.append(GangSpec(f"p{n_plain:04d}", 1, g, gang=False))
            used += g
            n_plain += 1
    extra: list[GangSpec] = []
    room = int(capacity_gpus * 0.15)
    for i in range(arrivals):
        size, gpus = rng.choice(MIXED_SIZES), rng.choice(MIXED_GPUS)
        while size * gpus > room and size > 2:
            size //= 2
        if size * gpus > room:
            break
        room -= size * gpus
        extra.append(GangSpec(f"a{i:04d}", size, gpus))
    return Workload("mixed", seed, tuple(groups), tuple(extra))


def build_pods(spec: GangSpec, scheduler: str, ns: str = NS
               ) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The pods (and the PodGroup, for ``sp`` gangs) of one group as ``scheduler`` takes them.

    The pods are the same in every run (requests, names); only the gang declaration and the
    ``schedulerName`` differ. ``stock`` gets no gang declaration at all."""
    pods = []
    for name in spec.pod_names():
        b = pod(name, ns).gpu(spec.gpus).annotate("bench/group", spec.name)
        if scheduler == "stock":
            b.scheduler("default-scheduler")
        elif scheduler in LOCKSTEPS:
            b.scheduler("lockstep")
            if spec.gang:  # as users write them: Lockstep's webhook, when on, adds the gate
                b.gang(spec.name, spec.size, timeout=60)
        elif scheduler == "sp":
            b.scheduler(SP_SCHEDULER)
            if spec.gang:
                b.sp_group(spec.name)
        else:
            raise ValueError(f"unknown scheduler {scheduler!r}")
        pods.append(b.build())
    group = (podgroup(spec.name, spec.size, ns, timeout=60)
             if scheduler == "sp" and spec.gang else None)
    return pods, group


# ---------------------------------------------------------------------------- results (pure)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def _r(v: float | None, nd: int = 2) -> float | None:
    return None if v is None else round(v, nd)


Binding = tuple[str, float]
"""(node, monotonic time the binding was seen)."""


def summarize(groups: Sequence[GangSpec], bound: Mapping[str, Binding], t0: float,
              ) -> dict[str, Any]:
    """Throughput and gang metrics of the pre-created batch (pod name -> binding)."""
    names = [n for g in groups for n in g.pod_names()]
    times = [bound[n][1] for n in names if n in bound]
    span = (max(times) - t0) if times else None
    done, spread, nodes = [], [], []
    complete = tightest = 0
    for g in groups:
        if not g.gang:
            continue
        got = [bound[n] for n in g.pod_names() if n in bound]
        if len(got) < g.size:
            continue
        complete += 1
        ts = [t for _, t in got]
        done.append(max(ts) - t0)
        spread.append(max(ts) - min(ts))
        used = len({node for node, _ in got})
        nodes.append(used)
        tightest += used == -(-g.total_gpus // NODE_GPUS)
    gangs = sum(1 for g in groups if g.gang)
    return {
        "pods": len(names),
        "bound": len(times),
        "unbound": len(names) - len(times),
        "span_s": _r(span),
        "pods_per_s": _r(len(times) / span if span else None, 1),
        "pods_per_s_after_first": _r((len(times) - 1) / (max(times) - min(times))
                                     if len(times) > 1 and max(times) > min(times) else None, 1),
        "first_bind_s": _r(min(times) - t0 if times else None),
        "gangs": gangs,
        "gangs_complete": complete,
        "gang_done_p50_s": _r(percentile(done, 50)),
        "gang_done_p95_s": _r(percentile(done, 95)),
        "spread_p95_ms": _r(None if not spread else 1000 * (percentile(spread, 95) or 0.0), 0),
        "spread_p50_ms": _r(None if not spread else 1000 * (percentile(spread, 50) or 0.0), 0),
        "nodes_per_gang": _r(sum(nodes) / len(nodes) if nodes else None),
        "gangs_on_fewest_nodes": tightest,
    }


def summarize_arrivals(arrivals: Sequence[GangSpec], bound: Mapping[str, Binding],
                       created: Mapping[str, float]) -> dict[str, Any]:
    """Per arriving gang: all members bound - its last member created."""
    lat = []
    for g in arrivals:
        ts = [bound[n][1] for n in g.pod_names() if n in bound]
        if len(ts) == g.size and g.name in created:
            lat.append(max(ts) - created[g.name])
    return {"arrival_gangs": len(arrivals), "arrival_complete": len(lat),
            "arrival_p50_s": _r(percentile(lat, 50)), "arrival_p95_s": _r(percentile(lat, 95)),
            "arrival_max_s": _r(max(lat) if lat else None)}


def ratios(rows: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """Lockstep/stock and Lockstep/scheduler-plugins for pods/s (higher is better) and gang
    done p50 (lower is better), from one run's rows."""
    by = {r["key"]: r for r in rows}
    out: dict[str, float | None] = {}

    def div(a: Any, b: Any) -> float | None:
        return round(a / b, 2) if isinstance(a, int | float) and isinstance(b, int | float) \
            and b else None

    ls = by.get("lockstep", {})
    for other in ("stock", "sp"):
        o = by.get(other, {})
        out[f"pods_per_s_lockstep_over_{other}"] = div(ls.get("pods_per_s"), o.get("pods_per_s"))
        out[f"gang_done_p50_lockstep_over_{other}"] = div(ls.get("gang_done_p50_s"),
                                                           o.get("gang_done_p50_s"))
    return out


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str, prefixes: Sequence[str] = ()
                     ) -> list[tuple[str, dict[str, str], float]]:
    """Samples of a Prometheus text exposition (name, labels, value), optionally only names
    starting with one of ``prefixes``."""
    out = []
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _SAMPLE.match(line)
        if not m or (prefixes and not m.group(1).startswith(tuple(prefixes))):
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out.append((m.group(1), dict(_LABEL.findall(m.group(2) or "")), value))
    return out


def request_delta(before: Sequence[tuple[str, dict[str, str], float]],
                  after: Sequence[tuple[str, dict[str, str], float]]) -> dict[str, int]:
    """apiserver_request_total deltas keyed ``VERB resource[/subresource]`` (writes and reads
    that changed)."""

    def fold(samples: Sequence[tuple[str, dict[str, str], float]]) -> dict[str, float]:
        acc: dict[str, float] = {}
        for name, lab, v in samples:
            if name != "apiserver_request_total":
                continue
            res = lab.get("resource", "")
            if lab.get("subresource"):
                res += "/" + lab["subresource"]
            key = f"{lab.get('verb', '')} {res}"
            acc[key] = acc.get(key, 0.0) + v
        return acc

    a, b = fold(before), fold(after)
    return {k: int(b[k] - a.get(k, 0.0)) for k in sorted(b) if b[k] - a.get(k, 0.0) >= 1}


API_SERIES = ("apiserver_request_total", "apiserver_terminated_watchers_total")
"""kube-apiserver series read before and after the batch."""


def watchers_terminated(before: Sequence[tuple[str, dict[str, str], float]],
                        after: Sequence[tuple[str, dict[str, str], float]]) -> dict[str, int]:
    """Watches the API server closed because their client fell behind, by resource.

    The watch cache gives each watcher a buffer of about a second of the resource's recent
    event rate (22 pod events on a young test bed); a client that lets it fill past the
    dispatch budget is cut off and must watch again. A burst of pod writes on busy cores
    (800 gate lifts, say) cuts off every slow pod watcher: kube-scheduler's, KWOK's, Lockstep's."""

    def fold(samples: Sequence[tuple[str, dict[str, str], float]]) -> dict[str, float]:
        acc: dict[str, float] = {}
        for name, lab, v in samples:
            if name == "apiserver_terminated_watchers_total":
                res = lab.get("resource", "")
                acc[res] = acc.get(res, 0.0) + v
        return acc

    a, b = fold(before), fold(after)
    return {k: int(b[k] - a.get(k, 0.0)) for k in sorted(b) if b[k] - a.get(k, 0.0) >= 1}


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def format_table(rows: Sequence[Mapping[str, Any]],
                 columns: Sequence[tuple[str, str]] = TABLE_COLUMNS) -> str:
    heads = [h for _, h in columns]
    cells = [[_fmt(r.get(k)) for k, _ in columns] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(heads, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def median_ratios(per_round: Sequence[Mapping[str, float | None]]) -> dict[str, Any]:
    """Each ratio's median over the rounds, and its range under ``<ratio>_range``.

    The machine's speed drifts by a third between runs of the same code, so one
    round's ratio is one sample; rounds alternate the schedulers' order."""
    out: dict[str, Any] = {}
    for k in (per_round[0] if per_round else {}):
        vals = sorted(v for r in per_round if (v := r.get(k)) is not None)
        out[k] = round(statistics.median(vals), 2) if vals else None
        out[f"{k}_range"] = [vals[0], vals[-1]] if vals else None
    return out


def round_orders(schedulers: Sequence[str], rounds: int) -> list[list[str]]:
    """Forward, then backward, and so on: no scheduler always runs on the freshest machine."""
    return [list(schedulers) if i % 2 == 0 else list(reversed(schedulers))
            for i in range(rounds)]


def format_ratios(r: Mapping[str, Any]) -> str:
    def f(k: str) -> str:
        v = r.get(k)
        span = r.get(f"{k}_range")
        if v is None:
            return "-"
        return f"{v:.2f}x" + (f" ({span[0]:.2f}-{span[1]:.2f})" if span else "")
    return (f"Lockstep/stock: pods/s {f('pods_per_s_lockstep_over_stock')}, gang done p50 "
            f"{f('gang_done_p50_lockstep_over_stock')}   "
            f"Lockstep/scheduler-plugins: pods/s {f('pods_per_s_lockstep_over_sp')}, gang done "
            f"p50 {f('gang_done_p50_lockstep_over_sp')}\n"
            "(goal: pods/s >= 0.6x stock and >= 1.0x scheduler-plugins)")


# ---------------------------------------------------------------------------- the runs


def _get_bytes(url: str, token: str | None = None, timeout: float = 10.0) -> bytes:
    status, body = get(url, token, timeout)
    if not 200 <= status < 300:
        raise RuntimeError(f"GET {url}: {status or 'not reachable'}")
    return body


def _get_text(url: str, token: str | None = None, timeout: float = 10.0) -> str:
    return _get_bytes(url, token, timeout).decode()


def _latency_ms(url: str) -> float:
    """One GET's round trip (ms): Lockstep's event-loop lag plus CPU scheduling delay."""
    t = time.perf_counter()
    with urllib.request.urlopen(url, timeout=5.0) as r:
        r.read()
    return (time.perf_counter() - t) * 1000


def _rss_mb(pid: int | None) -> dict[str, float | None]:
    out: dict[str, float | None] = {"rss_mb": None, "peak_rss_mb": None}
    if pid is None:
        return out
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                out["rss_mb"] = round(int(line.split()[1]) / 1024, 1)
            elif line.startswith("VmHWM:"):
                out["peak_rss_mb"] = round(int(line.split()[1]) / 1024, 1)
    return out


def _cpu_seconds(pid: int | None) -> float | None:
    """utime + stime of a process so far (clock ticks of /proc/<pid>/stat)."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 2)


def _own_cpu_seconds() -> float:
    """This process's CPU (all threads): the binding recorder's watch is part of the load."""
    t = os.times()
    return round(t.user + t.system, 2)


def _machine_seconds() -> tuple[float, float] | None:
    """CPU-seconds the whole machine spent busy (all cores) and those the hypervisor stole.

    ``/proc/stat``: busy is user, nice, system, irq and softirq (guest time is already inside
    user); steal is another tenant of the host running on our cores."""
    try:
        ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    hz = os.sysconf("SC_CLK_TCK")
    steal = ticks[7] if len(ticks) > 7 else 0
    return sum(ticks[i] for i in (0, 1, 2, 5, 6)) / hz, steal / hz


def cpu_breakdown(before: Mapping[str, float | None], after: Mapping[str, float | None],
                  machine: float | None, pods: int, steal: float | None = None
                  ) -> dict[str, float | None]:
    """CPU-seconds per process over the batch, plus the whole machine's and its cost per pod.

    A process missing from ``before`` started inside the batch (the schedulers, at t0) and
    counts from zero. ``other`` is what no listed process explains (other tenants of a shared
    machine, the kernel): large values mean a run to distrust."""
    out: dict[str, float | None] = {}
    for k, v in after.items():
        start = before.get(k, 0.0)
        out[k] = round(v - start, 2) if v is not None and start is not None else None
    known = sum(v for v in out.values() if v is not None)
    out["machine"] = round(machine, 2) if machine is not None else None
    out["other"] = round(machine - known, 2) if machine is not None else None
    out["machine_ms_per_pod"] = (round(1000 * machine / pods, 1)
                                 if machine is not None and pods else None)
    out["steal"] = round(steal, 2) if steal is not None else None
    return out


@dataclass
class Sampler:
    """Polls ``fn`` every ``interval`` seconds in a thread; keeps (t, value) pairs."""

    fn: Callable[[], Any]
    interval: float = 0.5
    samples: list[tuple[float, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                self.samples.append((time.monotonic(), self.fn()))
            self._stop.wait(self.interval)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> list[tuple[float, Any]]:
        self._stop.set()
        self._thread.join(5)
        return self.samples


@dataclass
class RunOptions:
    nodes: int
    timeout: float = 300.0
    arrival_gap: float = 0.5
    stall: float = 45.0
    """Stop waiting for the batch after this many seconds without a new binding."""
    profile: bool = False
    """Scrape kube-scheduler and Lockstep metrics over time, run py-spy on Lockstep and take
    Go CPU profiles of kube-apiserver and the scheduler (``pprof_seconds`` from t0)."""
    pprof_seconds: int = 10
    """Length of the Go CPU profiles: they cannot be stopped early, so choose more than the
    batch's span; the harness waits for them before the arrival phase."""
    out: Path = Path("bench-results")
    lockstep_overrides: dict[str, Any] = field(default_factory=dict)
    """KubeSchedulerConfiguration keys to override for the Lockstep run (experiments)."""
    lockstep_args: tuple[str, ...] = ()
    tag: str = ""
    mode: str = "burst"
    """``burst``: the scheduler runs first and every pod is created at once, as fast as the
    API server takes them (t0 at the first create): the headline, what a queue of submitted
    jobs released together gives; ``steady``: the scheduler runs first and gangs arrive at
    ``rate`` per second, as a stream of job submissions does (t0 at the first create), as
    scheduler_perf's steady workloads; ``backlog``: every pod created before the scheduler
    starts (t0 at its start). Backlog lets Lockstep's webhook plan and pin every gang before
    t0 while the peers do all their work inside the span: shown, never a headline."""
    rate: float = 5.0
    """Gangs (and plain pods) created per second in ``steady`` mode."""
    pin: bool = False
    """Pin etcd, kube-apiserver and KWOK to CPU 0 and the scheduler (with Lockstep) to CPU 1:
    a stand-in for a control plane on machines of its own."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r}: one of {', '.join(MODES)}")
        if self.rate <= 0:
            raise ValueError("rate must be positive")


_STARTER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="lockstep-start")
"""Starts Lockstep while the main thread starts kube-scheduler."""


def _create_all(kube: Kube, objs: list[tuple[str, dict[str, Any]]], workers: int = 16) -> None:
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda o: kube.create(o[0], o[1]), objs))


def _objects(groups: Sequence[GangSpec], scheduler: str
             ) -> tuple[list[tuple[str, dict[str, Any]]], list[tuple[str, dict[str, Any]]]]:
    pods, pgs = [], []
    for g in groups:
        ps, pg = build_pods(g, scheduler)
        pods += [(f"/api/v1/namespaces/{NS}/pods", p) for p in ps]
        if pg is not None:
            pgs.append((f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{NS}/podgroups", pg))
    return pods, pgs


def _scheduler_summary(samples: Sequence[tuple[str, dict[str, str], float]]) -> dict[str, Any]:
    """The kube-scheduler metrics that explain where a run's time went."""
    out: dict[str, Any] = {}
    for name, lab, v in samples:
        if name in ("scheduler_scheduling_attempt_duration_seconds_sum",
                    "scheduler_scheduling_attempt_duration_seconds_count"):
            key = f"attempt_{name.rsplit('_', 1)[1]}_{lab.get('result', '')}"
            out[key] = round(out.get(key, 0.0) + v, 3)
        elif name == "scheduler_schedule_attempts_total":
            out[f"attempts_{lab.get('result', '')}"] = int(out.get(
                f"attempts_{lab.get('result', '')}", 0) + v)
        elif name in ("scheduler_scheduling_algorithm_duration_seconds_sum",
                      "scheduler_scheduling_algorithm_duration_seconds_count"):
            out[f"algorithm_{name.rsplit('_', 1)[1]}"] = round(v, 3)
        elif name == "scheduler_framework_extension_point_duration_seconds_sum":
            key = f"ext_{lab.get('extension_point')}_{lab.get('status')}_sum"
            out[key] = round(out.get(key, 0.0) + v, 3)
        elif name == "scheduler_framework_extension_point_duration_seconds_count":
            key = f"ext_{lab.get('extension_point')}_{lab.get('status')}_count"
            out[key] = int(out.get(key, 0) + v)
        elif name == "scheduler_queue_incoming_pods_total":
            key = f"incoming_{lab.get('queue')}_{lab.get('event')}"
            out[key] = int(out.get(key, 0) + v)
        elif name == "scheduler_unschedulable_pods":
            out[f"unschedulable_now_{lab.get('plugin')}"] = int(v)
        elif name in ("scheduler_pod_scheduling_attempts_sum",
                      "scheduler_pod_scheduling_attempts_count"):
            out[name.removeprefix("scheduler_")] = int(v)
        elif name in ("scheduler_pod_scheduling_sli_duration_seconds_sum",
                      "scheduler_pod_scheduling_sli_duration_seconds_count"):
            out[name.removeprefix("scheduler_")] = round(out.get(
                name.removeprefix("scheduler_"), 0.0) + v, 3)
    return dict(sorted(out.items()))


def _lockstep_summary(samples: Sequence[tuple[str, dict[str, str], float]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, lab, v in samples:
        if name.startswith("lockstep_verb_duration_seconds_") and "le" not in lab:
            out[f"verb_{lab.get('verb')}_{name.rsplit('_', 1)[1]}"] = round(v, 4)
        elif name == "lockstep_verb_duration_seconds_bucket":
            out.setdefault(f"verb_{lab.get('verb')}_buckets", {})[lab["le"]] = int(v)
        elif name.startswith("lockstep_gang_admission_wait_seconds_") and "le" not in lab:
            out[f"admission_wait_{name.rsplit('_', 1)[1]}"] = round(v, 3)
        elif name in ("lockstep_binds_total", "lockstep_gang_timeouts_total"):
            out[name.removeprefix("lockstep_")] = int(v)
        elif name == "lockstep_gate_lifts_total":
            out[f"gate_lifts_{lab.get('outcome')}"] = int(v)
        elif name in ("lockstep_filter_rejections_total", "lockstep_bind_errors_total"):
            key = f"{name.removeprefix('lockstep_').removesuffix('_total')}_" + \
                  (lab.get("reason") or lab.get("cause") or "")
            out[key] = int(v)
    return out


def _pending_sample(url: str) -> dict[str, float]:
    text = _get_text(url, timeout=3.0)
    return {lab.get("queue", ""): v for name, lab, v in
            parse_prometheus(text, ("scheduler_pending_pods",)) if name == "scheduler_pending_pods"}


def _fetch_pprof(url: str, out: Path, token: str | None, timeout: float) -> str:
    """GET a Go ``/debug/pprof/profile`` into ``out``; returns the path written."""
    out.write_bytes(_get_bytes(url, token, timeout))
    return str(out)


_PPROF = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="pprof")
"""Fetches the Go CPU profiles (each GET lasts the profile's length)."""


def _pprof(base: str, component: str, scheduler: str, opts: RunOptions, seconds: float,
           token: str | None = None) -> tuple[str, concurrent.futures.Future[str]]:
    out = opts.out / f"pprof-{scheduler}{'-' + opts.tag if opts.tag else ''}-{component}.pb.gz"
    secs = max(1, math.ceil(seconds))
    return component, _PPROF.submit(_fetch_pprof, f"{base}/debug/pprof/profile?seconds={secs}",
                                    out, token, secs + 60.0)


def _spy(pid: int, out: Path, seconds: float) -> subprocess.Popen[bytes] | None:
    exe = Path(REPO / ".venv" / "bin" / "py-spy")
    if not exe.exists():
        return None
    return subprocess.Popen(
        [str(exe), "record", "-p", str(pid), "-r", "100", "-d", str(int(seconds)), "-f", "raw",
         "-o", str(out), "--nonblocking"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _ready_nodes(kube: Kube) -> int:
    return sum(1 for n in kube.list("/api/v1/nodes")
               if any(c.get("type") == "Ready" and c.get("status") == "True"
                      for c in (n.get("status") or {}).get("conditions") or ()))


def _wait_nodes_ready(kube: Kube, nodes: int, timeout: float) -> float:
    """Wait until KWOK has marked every node Ready; returns the seconds waited.

    KWOK patches each new node's status once (1,000 nodes take it a few seconds). Unwaited,
    a few hundred of those patches, and every node watcher's share of them, fell inside some
    runs' measured span and not others' (0 to 530 per run)."""
    start = time.monotonic()
    kube.wait(f"{nodes} nodes Ready", lambda: _ready_nodes(kube) >= nodes, timeout=timeout,
              interval=0.5)
    return round(time.monotonic() - start, 2)


def _pin(pids: Sequence[int | None], cpu: int) -> None:
    """Bind each process (its threads too: Go runtimes start theirs at once) to ``cpu``."""
    for pid in pids:
        if pid is None:
            continue
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(int(tid), {cpu})


def _stream(kube: Kube, groups: Sequence[GangSpec], scheduler: str, t0: float, rate: float,
            created: dict[str, float]) -> None:
    """Create group ``i`` at ``t0 + i / rate`` (late ones at once: a stream that the API server
    cannot take at that rate shows as a longer span); ``created`` gets each group's time once
    its last member exists. An infinite rate is a burst: every group's objects at once."""
    if math.isinf(rate):
        _burst(kube, groups, scheduler, created)
        return
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        for i, g in enumerate(groups):
            delay = t0 + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            objs, pg = _objects([g], scheduler)
            for path, obj in pg:
                kube.create(path, obj)
            list(pool.map(lambda o: kube.create(o[0], o[1]), objs))
            created[g.name] = time.monotonic()


def _burst(kube: Kube, groups: Sequence[GangSpec], scheduler: str,
           created: dict[str, float]) -> None:
    """Every group's PodGroup, then every pod, through one pool of 16 creators (the same
    pool size a stream uses): nothing is paced, so the API server's admission (and
    Lockstep's webhook in it) sets the pace."""
    pods, pgs = _objects(groups, scheduler)
    _create_all(kube, pgs)
    _create_all(kube, pods)
    done = time.monotonic()
    for g in groups:
        created[g.name] = done


def _gated_share(bed: TestBed, url: str | None) -> dict[str, float] | None:
    """How the webhook answered the run's gang members (pinned at creation, gated, ...)."""
    if url is None:
        return None
    found = parse_prometheus(_get_text(f"{url}/metrics"), ("lockstep_webhook_admissions_total",))
    return {labels.get("decision", ""): v for _, labels, v in found}


def _bindings(rec: BindingRecorder) -> dict[str, Binding]:
    return {r.name: (r.node, r.bound_at) for r in rec.records(NS)
            if r.bound_at is not None and r.node and r.deleted_at is None}


def run_one(scheduler: str, wl: Workload, opts: RunOptions) -> dict[str, Any]:
    """One scheduler on a fresh test bed; returns its row (metrics and the raw extras)."""
    row: dict[str, Any] = {"key": scheduler, "scheduler": LABELS[scheduler]
                           + (f" [{opts.tag}]" if opts.tag else ""),
                           "loadavg_start": [round(x, 2) for x in os.getloadavg()]}
    with TestBed(profiling=opts.profile) as bed:
        kube = Kube(bed.api_url, bed.token)
        create_nodes(kube, nodes_from_topology(load_topology("bench-64x8"), nodes=opts.nodes))
        kube.ensure_namespace(NS)
        steady = opts.mode in ("steady", "burst")
        rate = math.inf if opts.mode == "burst" else opts.rate
        row["mode"] = opts.mode + (" pinned" if opts.pin else "")
        # The default install: Lockstep's webhook is in the path of every pod create, so it
        # is up (its certificate issued, its caBundle set) before the first pod is created.
        webhook = scheduler == "lockstep"
        ls_url: str | None = None
        decided0: dict[str, float] = {}
        if webhook:
            ls_url = bed.start_lockstep(extra_args=opts.lockstep_args, webhook=True)
            decided0 = _gated_share(bed, ls_url) or {}  # the bed's dry-run probes
        if not steady:
            pods, pgs = _objects(wl.groups, scheduler)
            _create_all(kube, pgs)
            _create_all(kube, pods)
        row["nodes_ready_wait_s"] = _wait_nodes_ready(kube, opts.nodes, opts.timeout)
        if opts.pin:
            _pin([bed.procs[k].pid for k in CONTROL_PLANE if k in bed.procs], 0)
        rec = BindingRecorder(kube).start()
        api_metrics = f"{bed.api_url}/metrics"
        before = parse_prometheus(_get_text(api_metrics, bed.token), API_SERIES)
        # The rest of the machine's CPU per run: every scheduler's writes cost the API server,
        # etcd and KWOK too, on the same two cores. Counted from t0, like the schedulers'.
        infra: dict[str, int | None] = {
            k: bed.procs[k].pid for k in ("kube-apiserver", "etcd", "kwok") if k in bed.procs}
        if ls_url is not None:
            infra["lockstep"] = bed.procs["lockstep"].pid
        cpu0: dict[str, float | None] = {k: _cpu_seconds(pid) for k, pid in infra.items()}
        cpu0["harness"], machine0 = _own_cpu_seconds(), _machine_seconds()
        # Backlog: Lockstep without its webhook starts inside the span, at the same moment
        # as kube-scheduler (both are "the scheduler"): it admits gangs as soon as it has
        # listed the cluster, and that work must be timed too.
        t0 = time.monotonic()
        pprofs = [_pprof(bed.api_url, "kube-apiserver", scheduler, opts, opts.pprof_seconds,
                         bed.token)] if opts.profile and not steady else []
        ls_start: concurrent.futures.Future[str] | None = None
        if scheduler in LOCKSTEPS and ls_url is None:
            port = free_port()
            ls_url = f"http://127.0.0.1:{port}"
            ls_start = _STARTER.submit(bed.start_lockstep, extra_args=opts.lockstep_args,
                                       port=port)
        if scheduler == "stock":
            proc = bed.start_scheduler(None, name="kube-scheduler")
        elif scheduler in LOCKSTEPS:
            proc = bed.start_scheduler(LOCKSTEP_CONFIG, name="lockstep-scheduler",
                                       extender_url=ls_url, overrides=opts.lockstep_overrides)
        else:
            proc = bed.start_scheduler(SP_CONFIG, name="sp-scheduler", binary="scheduler-plugins")
        row["scheduler_ready_s"] = round(time.monotonic() - t0, 2)
        if ls_start is not None:
            ls_start.result()
            row["lockstep_ready_s"] = round(time.monotonic() - t0, 2)
        if opts.pin:
            _pin([proc.pid, bed.procs["lockstep"].pid if ls_url else None], 1)
        created: dict[str, float] = {}
        if steady:
            # Everything runs before the first gang arrives: the span is the stream's.
            cpu0["scheduler"] = _cpu_seconds(proc.pid)
            if ls_url is not None:
                cpu0["lockstep"] = _cpu_seconds(bed.procs["lockstep"].pid)
            cpu0["harness"], machine0 = _own_cpu_seconds(), _machine_seconds()
            t0 = time.monotonic()
            if opts.profile:
                pprofs = [_pprof(bed.api_url, "kube-apiserver", scheduler, opts,
                                 opts.pprof_seconds, bed.token)]
            feeder = threading.Thread(target=_stream, name="steady-arrivals", daemon=True,
                                      args=(kube, wl.groups, scheduler, t0, rate, created))
            feeder.start()
        ls_pid = bed.procs["lockstep"].pid if ls_url else None
        if opts.profile and ls_url:  # now at work: no longer "idle" (kept for the report)
            idle = [_latency_ms(f"{ls_url}/healthz") for _ in range(20)]
            row["lockstep_healthz_idle_ms"] = {"p50": _r(percentile(idle, 50)),
                                               "p95": _r(percentile(idle, 95))}
        sched_metrics = str(proc.ready_url).replace("/healthz", "/metrics")
        if opts.profile:  # from its /healthz answering to the apiserver profile's end
            pprofs.append(_pprof(str(proc.ready_url).removesuffix("/healthz"), "scheduler",
                                 scheduler, opts, opts.pprof_seconds - (time.monotonic() - t0)))
        pending = Sampler(lambda: _pending_sample(sched_metrics)).start() if opts.profile \
            else None
        lag = Sampler(lambda: _latency_ms(f"{ls_url}/healthz"), 0.2).start() \
            if opts.profile and ls_url else None
        spy = None
        if opts.profile and ls_pid is not None:
            spy_out = opts.out / f"pyspy-{scheduler}{'-' + opts.tag if opts.tag else ''}.txt"
            spy = _spy(ls_pid, spy_out, opts.timeout)
            row["pyspy_file"] = str(spy_out)
        names = [n for g in wl.groups for n in g.pod_names()]
        deadline = t0 + opts.timeout

        def cpu_now() -> tuple[dict[str, float | None], tuple[float, float] | None]:
            # Both schedulers' processes started at t0: all their CPU so far is the batch's.
            now: dict[str, float | None] = {k: _cpu_seconds(pid) for k, pid in infra.items()}
            now["harness"], now["scheduler"] = _own_cpu_seconds(), _cpu_seconds(proc.pid)
            if ls_pid is not None:
                now["lockstep"] = _cpu_seconds(ls_pid)
            return now, _machine_seconds()

        progress, last_progress = -1, time.monotonic()
        # CPU is read at each new binding, so a run that stalls is not charged for the wait.
        cpu1, machine1 = cpu_now()
        while time.monotonic() < deadline:
            b = rec.bound(NS)
            if len(b) != progress:
                cpu1, machine1 = cpu_now()
            if all(n in b for n in names):
                break
            if len(b) != progress:
                progress, last_progress = len(b), time.monotonic()
            elif time.monotonic() - last_progress > opts.stall:
                # e.g. the stock scheduler's spreading left no node with 8 free GPUs
                row["stalled_after_s"] = round(last_progress - t0, 1)
                break
            time.sleep(0.1)
        t_batch = time.monotonic()
        if spy is not None:
            spy.send_signal(2)
            try:
                _, err = spy.communicate(timeout=30)
                if spy.returncode not in (0, None) and err:
                    row["pyspy_error"] = err.decode(errors="replace")[-500:]
            except subprocess.TimeoutExpired:
                spy.kill()
        for component, fut in pprofs:
            try:
                row.setdefault("pprof_files", {})[component] = fut.result()
            except Exception as err:  # a missing profile must not lose the run
                row.setdefault("pprof_errors", {})[component] = repr(err)[:300]
        busy, steal = ((machine1[0] - machine0[0], machine1[1] - machine0[1])
                       if machine0 is not None and machine1 is not None else (None, None))
        row["cpu_s"] = cpu_breakdown(cpu0, cpu1, busy, len(rec.bound(NS)), steal)
        row["machine_cpu_ms_per_pod"] = row["cpu_s"]["machine_ms_per_pod"]
        sched_text = _get_text(sched_metrics)
        after = parse_prometheus(_get_text(api_metrics, bed.token), API_SERIES)
        ls_text = _get_text(f"{ls_url}/metrics") if ls_url else ""
        bound = _bindings(rec)
        row.update(summarize(wl.groups, bound, t0))
        row["batch_wall_s"] = round(t_batch - t0, 2)
        if steady:
            feeder.join(timeout=30)
            row.update({f"steady_{k}": v for k, v in summarize_arrivals(
                [g for g in wl.groups if g.gang], bound, created).items()})
            row["steady_rate"] = None if math.isinf(rate) else rate
        if webhook:
            decided = {k: v - decided0.get(k, 0.0)
                       for k, v in (_gated_share(bed, ls_url) or {}).items()}
            row["members_gated"] = decided
            placed = sum(decided.get(k, 0.0) for k in ("pinned", "gated", "unpinned"))
            row["pinned_share"] = round(decided.get("pinned", 0.0) / placed, 3) if placed else None
        # ---- phase 2: gangs arriving while the scheduler runs (steady mode was all that)
        arrivals = () if steady else wl.arrivals
        arrived: dict[str, float] = {}
        for g in arrivals:
            objs, pg = _objects([g], scheduler)
            _create_all(kube, pg)
            _create_all(kube, objs, workers=min(16, len(objs)))
            arrived[g.name] = time.monotonic()
            time.sleep(opts.arrival_gap)
        arr_names = [n for g in arrivals for n in g.pod_names()]
        deadline = time.monotonic() + min(opts.timeout, 60.0 if "stalled_after_s" in row
                                          else 120.0)
        while arr_names and time.monotonic() < deadline:
            b = rec.bound(NS)
            if all(n in b for n in arr_names):
                break
            time.sleep(0.05)
        bound = _bindings(rec)
        row.update(summarize_arrivals(arrivals, bound, arrived))
        if arrivals:
            # The arrival phase alone: members created before their quorum are turned away
            # and must be woken (requeue nudges); the batch phase never does that.
            arr_after = parse_prometheus(_get_text(api_metrics, bed.token),
                                         ("apiserver_request_total",))
            row["api_requests_arrivals"] = request_delta(after, arr_after)
            row["kube_scheduler_after_arrivals"] = _scheduler_summary(
                parse_prometheus(_get_text(sched_metrics), ("scheduler_",)))
        if ls_pid is not None:
            row.update(_rss_mb(ls_pid))
        row["scheduler_rss_mb"] = _rss_mb(proc.pid)["rss_mb"]
        row["api_requests"] = request_delta(before, after)
        row["watchers_terminated"] = watchers_terminated(before, after)
        row["kube_scheduler"] = _scheduler_summary(parse_prometheus(sched_text, ("scheduler_",)))
        if ls_text:
            row["lockstep"] = _lockstep_summary(parse_prometheus(ls_text, ("lockstep_",)))
            evs = kube.list(f"/api/v1/namespaces/{NS}/events")
            by_reason: dict[str, int] = {}
            for e in evs:
                if (e.get("source") or {}).get("component") == "lockstep":
                    by_reason[e.get("reason", "")] = by_reason.get(e.get("reason", ""), 0) + 1
            row["lockstep_events"] = by_reason
        if pending is not None:
            row["pending_pods"] = [(round(t - t0, 2), v) for t, v in pending.stop()]
        if lag is not None:
            probes = [v for t, v in lag.stop() if t <= t_batch]
            row["lockstep_healthz_ms"] = {"n": len(probes), "p50": _r(percentile(probes, 50)),
                                          "p95": _r(percentile(probes, 95)),
                                          "max": _r(max(probes) if probes else None)}
        row["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        rec.stop()
        kube.close()
    return row


def run(wl: Workload, opts: RunOptions, schedulers: Sequence[str] = SCHEDULERS,
        on_row: Callable[[dict[str, Any]], None] | None = None, rounds: int = 1
        ) -> dict[str, Any]:
    """Every scheduler once per round; with several rounds the ratios are medians."""
    opts.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    per_round = []
    for i, order in enumerate(round_orders(schedulers, rounds)):
        this = []
        for s in order:
            row = run_one(s, wl, opts)
            if rounds > 1:
                row["round"] = i + 1
            this.append(row)
            if on_row:
                on_row(row)
        rows += this
        per_round.append(ratios(this))
    return {"nodes": opts.nodes, "node_gpus": NODE_GPUS, "qps": QPS, "burst": BURST,
            "workload": wl.describe(), "workload_groups": [asdict(g) for g in wl.groups],
            "arrival_gap_s": opts.arrival_gap, "rounds": rounds, "rows": rows,
            "ratios": per_round[0] if rounds == 1 else median_ratios(per_round),
            "ratios_by_round": per_round}
