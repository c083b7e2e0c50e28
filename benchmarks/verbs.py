"""Verb latency: filter and prioritize against a cache of N nodes, next to a no-op endpoint.

The no-op endpoint parses the same request and answers it unchanged, so the ratio
filter/no-op is Lockstep's own cost on top of the wire format, measured in one run on the
same (noisy, shared) machine. Requests are sent one at a time, as kube-scheduler's single
scheduling thread does.
"""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import time
from typing import Any

import httpx
import orjson

from coscheduling import pod_from_json

from .synthetic import loaded_core, plain_pod, waiting_gang

SIZES = (500, 5000, 15000)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _measure(client: httpx.Client, path: str, body: bytes, n: int) -> list[float]:
    out = []
    headers = {"Content-Type": "application/json"}
    for _ in range(n):
        t = time.perf_counter()
        r = client.post(path, content=body, headers=headers)
        out.append((time.perf_counter() - t) * 1000)
        if r.status_code != 200:
            raise RuntimeError(f"{path}: {r.status_code} {r.text[:200]}")
    return out


def _admission_ms(nodes: int) -> float:
    """In-process: plan and admit a fresh 8 x 8-GPU gang on a half-busy cluster."""
    core = loaded_core(nodes)
    times = []
    names = sorted(core.queries.nodes)
    for round_ in range(5):
        for p in waiting_gang(f"g{round_}", 8):
            core.upsert_pod(pod_from_json(p))
        first = core.queries.pods[f"bench/g{round_}-0"]  # type: ignore[index]
        t = time.perf_counter()
        d = core.filter(first, names, 0.0)
        times.append((time.perf_counter() - t) * 1000)
        assert len(d.passed) == 1, d
    return statistics.median(times)


def run(requests: int = 300, sizes: tuple[int, ...] = SIZES) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        port = _free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.verbs_server", "--nodes", str(n), "--port",
             str(port)],
        )
        try:
            base = f"http://127.0.0.1:{port}"
            with httpx.Client(base_url=base, timeout=30) as client:
                deadline = time.monotonic() + 60
                while True:
                    try:
                        if client.get("/healthz").status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    if time.monotonic() > deadline:
                        raise RuntimeError("benchmark server did not start")
                    time.sleep(0.2)
                names = [f"node-{i:05d}" for i in range(n)]
                plain = orjson.dumps({"Pod": plain_pod("web"), "Nodes": None,
                                      "NodeNames": names})
                member = orjson.dumps({"Pod": waiting_gang("admitted", 8)[0], "Nodes": None,
                                       "NodeNames": names})
                for path, body in (("/noop", plain), ("/filter", plain), ("/prioritize", plain)):
                    _measure(client, path, body, 20)  # warm-up
                res: dict[str, list[float]] = {"noop": [], "filter": [], "filter-gang": [],
                                               "prioritize": []}
                # Interleave in small slices so machine noise hits every endpoint alike.
                for _ in range(requests // 20):
                    res["noop"] += _measure(client, "/noop", plain, 20)
                    res["filter"] += _measure(client, "/filter", plain, 20)
                    res["filter-gang"] += _measure(client, "/filter", member, 20)
                    res["prioritize"] += _measure(client, "/prioritize", plain, 20)
        finally:
            server.terminate()
            server.wait(10)
        row: dict[str, Any] = {"nodes": n, "requests": requests}
        for k, v in res.items():
            row[f"{k}_p50_ms"] = round(_pct(v, 0.5), 3)
            row[f"{k}_p99_ms"] = round(_pct(v, 0.99), 3)
        row["filter_vs_noop_p99"] = round(row["filter_p99_ms"] / row["noop_p99_ms"], 2)
        row["filter_vs_noop_p50"] = round(row["filter_p50_ms"] / row["noop_p50_ms"], 2)
        row["prioritize_vs_noop_p99"] = round(row["prioritize_p99_ms"] / row["noop_p99_ms"], 2)
        row["gang_admission_ms"] = round(_admission_ms(n), 2)
        rows.append(row)
    return rows


TABLE_COLUMNS = (
    ("nodes", "nodes"),
    ("noop_p50_ms", "no-op p50"),
    ("noop_p99_ms", "no-op p99"),
    ("filter_p50_ms", "filter p50"),
    ("filter_p99_ms", "filter p99"),
    ("filter-gang_p99_ms", "gang filter p99"),
    ("prioritize_p50_ms", "prioritize p50"),
    ("prioritize_p99_ms", "prioritize p99"),
    ("filter_vs_noop_p99", "filter/no-op p99"),
    ("gang_admission_ms", "admit 8x8 gang"),
)
