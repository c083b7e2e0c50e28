"""Where a Lockstep run's time goes: a breakdown from ``throughput --profile`` output.

``python -m benchmarks.profile_report [bench-results/throughput-profile.json]`` reads the row
of the Lockstep run (kube-scheduler's /metrics, Lockstep's /metrics, the API request counts,
the /healthz probe) and the py-spy raw profile it names, and prints the per-pod budget of
kube-scheduler's single scheduling thread, the API writes per gang, and the share of py-spy's
wall-clock samples of Lockstep's event-loop thread under each named activity.

py-spy samples a thread unless it sits in an idle call (epoll), so a thread that is runnable
but waiting for a CPU is counted: on a loaded machine the shares are of *wall* time the loop
was not free to answer a verb, not of CPU time (compare ``cpu_s`` with the span).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["ACTIVITIES", "GO_AREAS", "pprof_cum", "pyspy_shares", "report", "scheduling_budget"]

ACTIVITIES: tuple[tuple[str, str], ...] = (
    ("binding POSTs (Binder._bind_one)", "Binder._bind_one"),
    ("Event POSTs (Poster.post_events)", "Poster.post_events"),
    ("requeue nudges (Poster.nudge)", "Poster.nudge"),
    ("gate lifts (Poster.lift)", "Poster.lift"),
    ("PodGroup status writes", "StatusWriter.run"),
    ("watch processing (ClusterCache.run)", "ClusterCache.run"),
    ("deadline timer (Binder.expire_loop)", "Binder.expire_loop"),
    ("filter route (parse + core + encode)", "VerbsApp._filter"),
    ("  of which request parsing (_decode)", "_decode (app/http/verbs.py"),
    ("  of which Coscheduler.filter", "Coscheduler.filter"),
    ("bind route (excluding the parked wait)", "VerbsApp._bind"),
    ("FastAPI (routes beside the verbs: metrics, debug)", "FastAPI.__call__"),
    ("writing responses to kube-scheduler", "RequestResponseCycle.send"),
    ("httpcore failed `import sniffio` per call", "_find_and_load"),
    ("HTTP client (httpx/httpcore, all calls)", "AsyncClient.send"),
)


GO_AREAS: dict[str, tuple[tuple[str, str], ...]] = {
    "kube-apiserver": (
        ("PATCH handling (gate lifts, status patches)", "handlers.(*patcher).patchResource"),
        ("  of which pod status (KWOK)", "pod/storage.(*StatusREST).Update"),
        ("  of which node status (KWOK)", "node/storage.(*StatusREST).Update"),
        ("bindings (pods/binding)", "storage.(*BindingREST).Create"),
        ("creates (events, bindings, pods)", "handlers.CreateNamedResource.createHandler"),
        ("lists and watches served", "handlers.ListResource.func1"),
        ("  watch events encoded and sent", "handlers.(*WatchServer).HandleHTTP"),
        ("TLS handshakes", "crypto/tls.(*Conn).serverHandshake"),
        ("garbage collector", "runtime.gcBgMarkWorker"),
    ),
    "scheduler": (
        ("scheduling cycles (the scheduling thread)", "scheduler.(*Scheduler).schedulingCycle"),
        ("in-tree filters (parallel workers)", "runtime.(*frameworkImpl).RunFilterPlugins"),
        ("scores (parallel workers)", "runtime.(*frameworkImpl).RunScorePlugins"),
        ("binding cycles", "scheduler.(*Scheduler).bindingCycle"),
        ("extender calls", "scheduler.(*HTTPExtender).send"),
        ("  new connections to the extender", "net/http.(*Transport).dialConn"),
        ("watch events decoded", "watch.(*StreamWatcher).receive"),
        ("informer lists", "cache.(*Reflector).list"),
        ("garbage collector", "runtime.gcBgMarkWorker"),
    ),
}
"""Per Go component: (label, a function name fragment) whose cumulative CPU is reported."""

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0}


def _seconds(text: str) -> float | None:
    m = re.fullmatch(r"([0-9.]+)(ns|us|µs|ms|s|min|h)", text)
    return float(m.group(1)) * _UNITS[m.group(2)] if m else None


def pprof_cum(top: str, needles: Sequence[str]) -> tuple[float | None, dict[str, float]]:
    """(total CPU-s, needle -> cumulative CPU-s of the first function naming it) from the
    text of ``go tool pprof -top -cum -nodecount=0``.

    The first match is the outermost frame naming the needle, so nested calls (a recursive
    walk, wrappers) are not counted twice. A needle no function names gets 0."""
    total = None
    m = re.search(r"Total samples = ([0-9.]+\S*)", top)
    if m:
        total = _seconds(m.group(1))
    found: dict[str, float] = {n: 0.0 for n in needles}
    seen: set[str] = set()
    for line in top.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or _seconds(parts[3]) is None:
            continue
        cum, func = _seconds(parts[3]), parts[5]
        for n in needles:
            if n not in seen and n in func:
                seen.add(n)
                found[n] = round(cum or 0.0, 6)
    return total, found


def _go() -> str | None:
    return shutil.which("go") or next(
        (str(p) for p in (Path("/usr/local/go/bin/go"),) if p.exists()), None)


def _find(name: str, base: Path) -> Path:
    """A file a row names: as written (absolute, or from the working directory), else next
    to the report's JSON (results copied elsewhere keep their files beside them)."""
    for p in (Path(name), base / Path(name).name):
        if p.exists():
            return p
    return Path(name)


def _pprof_lines(files: Mapping[str, str], base: Path) -> list[str]:
    out: list[str] = []
    go = _go()
    for component, name in files.items():
        path = _find(name, base)
        areas = GO_AREAS.get(component, ())
        if go is None or not path.exists() or not areas:
            out.append(f"  Go CPU profile of {component}: {path} "
                       "(read it with `go tool pprof -top -cum FILE`)")
            continue
        top = subprocess.run([go, "tool", "pprof", "-top", "-cum", "-nodecount=0", str(path)],
                             capture_output=True, text=True, timeout=120).stdout
        total, cum = pprof_cum(top, [n for _, n in areas])
        out.append(f"  Go CPU profile of {component} ({path.name}): {total} CPU-s sampled")
        for label, needle in areas:
            out.append(f"    {cum[needle]:6.2f} s  {label}")
    return out


def pyspy_shares(lines: Iterable[str], needles: Sequence[str]) -> tuple[int, dict[str, int]]:
    """Total samples and, per needle, the samples whose stack contains it (py-spy ``raw``
    format: ``frame;frame;... count`` per line)."""
    total = 0
    hits = dict.fromkeys(needles, 0)
    for line in lines:
        stack, _, n = line.rstrip("\n").rpartition(" ")
        if not stack or not n.isdigit():
            continue
        total += int(n)
        for needle in needles:
            if needle in stack:
                hits[needle] += int(n)
    return total, hits


def scheduling_budget(row: Mapping[str, Any]) -> dict[str, float | None]:
    """Per scheduled pod, in ms: kube-scheduler's algorithm time split into in-tree filters,
    Lockstep's filter handler, and the rest of the extender round trip."""
    ks, ls = row.get("kube_scheduler", {}), row.get("lockstep", {})
    n = ks.get("algorithm_count") or 0
    if not n:
        return {}
    algo = 1000 * ks.get("algorithm_sum", 0.0) / n
    intree = 1000 * (ks.get("ext_Filter_Success_sum", 0.0) + ks.get(
        "ext_PreFilter_Success_sum", 0.0)) / n
    handler = 1000 * ls.get("verb_filter_sum", 0.0) / max(1.0, ls.get("verb_filter_count", 0.0))
    span = row.get("span_s")
    return {
        "algorithm_ms_per_pod": round(algo, 1),
        "intree_prefilter_filter_ms_per_pod": round(intree, 1),
        "lockstep_filter_handler_ms_per_pod": round(handler, 1) if ls else None,
        "extender_wait_outside_handler_ms_per_pod": round(algo - intree - handler, 1)
        if ls else None,
        "algorithm_share_of_span": round(ks.get("algorithm_sum", 0.0) / span, 2) if span
        else None,
        "pods_per_s_if_bound_by_algorithm": round(1000 / algo, 1) if algo else None,
    }


def _writes_per_gang(row: Mapping[str, Any]) -> dict[str, float]:
    gangs = max(1, int(row.get("gangs_complete") or row.get("gangs") or 1))
    return {k: round(v / gangs, 1) for k, v in row.get("api_requests", {}).items()
            if k.split(" ", 1)[0] in ("POST", "PATCH", "PUT", "DELETE", "CREATE", "UPDATE")}


def report(doc: Mapping[str, Any], base: Path) -> str:
    out = []
    for row in doc.get("rows", ()):
        out.append(f"== {row['scheduler']}: {row.get('pods_per_s')} pods/s, span "
                   f"{row.get('span_s')} s, load average {row.get('loadavg_start')} -> "
                   f"{row.get('loadavg_end')}")
        for k, v in scheduling_budget(row).items():
            out.append(f"  {k}: {v}")
        ks = row.get("kube_scheduler", {})
        out.append(f"  attempts: {ks.get('attempts_scheduled')} scheduled, "
                   f"{ks.get('attempts_unschedulable', 0)} unschedulable, "
                   f"{ks.get('attempts_error', 0)} error; queue moves: "
                   + ", ".join(f"{k.removeprefix('incoming_')}={v}" for k, v in ks.items()
                               if k.startswith("incoming_")))
        pend = row.get("pending_pods") or []
        if pend:
            peak = {q: max(s[1].get(q, 0.0) for s in pend)
                    for q in ("active", "backoff", "unschedulable", "gated")}
            out.append(f"  scheduler_pending_pods peak by queue: {peak}")
        out.append(f"  API writes per gang: {_writes_per_gang(row)}")
        if row.get("lockstep_events"):
            out.append(f"  Lockstep Events by reason (listed at the end): "
                       f"{row['lockstep_events']}")
        if row.get("lockstep_healthz_ms"):
            out.append(f"  Lockstep /healthz round trip during the batch (ms): "
                       f"{row['lockstep_healthz_ms']}, before the scheduler started: "
                       f"{row.get('lockstep_healthz_idle_ms')}")
        cpu = row.get("cpu_s") or {}
        if cpu:
            parts = ", ".join(f"{k} {v}" for k, v in cpu.items()
                              if v is not None and k not in ("machine_ms_per_pod", "steal"))
            out.append(f"  CPU-s from t0 to the last batch binding ({row.get('span_s')} s span): "
                       f"{parts}; {cpu.get('machine_ms_per_pod')} ms per pod, "
                       f"{cpu.get('steal')} s stolen by the hypervisor; "
                       f"Lockstep RSS {row.get('rss_mb')} MB")
        spy = row.get("pyspy_file")
        if spy and (p := _find(spy, base)).exists():
            total, hits = pyspy_shares(p.read_text().splitlines(),
                                       [n for _, n in ACTIVITIES])
            possible = 100 * (row.get("batch_wall_s") or 0)
            out.append(f"  py-spy: {total} non-idle samples of ~{possible:.0f} possible "
                       f"(100 Hz): the loop was busy or waiting for a CPU "
                       f"{100 * total / possible if possible else 0:.0f}% of the batch")
            for label, needle in ACTIVITIES:
                out.append(f"    {100 * hits[needle] / max(1, total):5.1f}%  {label}")
        if row.get("watchers_terminated"):
            out.append(f"  watches the API server cut off (client too slow): "
                       f"{row['watchers_terminated']}")
        out.extend(_pprof_lines(row.get("pprof_files") or {}, base))
        for component, err in (row.get("pprof_errors") or {}).items():
            out.append(f"  Go CPU profile of {component} failed: {err}")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    path = Path(args[0] if args else "bench-results/throughput-profile.json")
    print(report(json.loads(path.read_text()), path.parent))


if __name__ == "__main__":
    main()
