"""The web page (/ui) at cluster scale: 5,000 8-GPU nodes in racks of 16 and 50,000 pods in
the core (plain pods, gangs running, gangs waiting), synthetic as in ``benchmarks.synthetic``.

Measures each JSON endpoint's time to answer and its size, served by Lockstep's own app on
127.0.0.1 (uvicorn, as in production); the same answers computed without HTTP (what each
costs the event loop; over loopback HTTP, ~40 ms of delayed-ACK wait is added to every
request by the client, whatever its size); and, with ``--browser``, the page in headless
Chromium: from navigation to the first full render, and a rack opened by a click.

    python -m benchmarks.ui [--nodes 5000] [--pods 50000] [--browser] [--out run/ui-bench.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from app.kube.client import KubeClient, KubeConfig
from app.process import extender_app
from app.service import Lockstep
from coscheduling import Coscheduler, GangKey, Settings, node_from_json, pod_from_json
from coscheduling.events import ingest

from .synthetic import cluster_nodes, running_pods

__all__ = ["build_core", "main", "measure"]


def _gang_pod(gang: str, i: int, size: int, node: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulerName": "lockstep", "containers": [{
        "name": "c", "resources": {"requests": {"nvidia.com/gpu": "1", "cpu": "8"}}}]}
    if node is not None:
        spec["nodeName"] = node
    ns = f"team-{hash(gang) % 20:02d}"
    return {"metadata": {"name": f"{gang}-{i}", "namespace": ns, "uid": f"{gang}-{i}",
                         "creationTimestamp": "2026-11-25T00:00:00Z",
                         "annotations": {"lockstep.dev/pod-group": gang,
                                         "lockstep.dev/min-member": str(size)}},
            "spec": spec, "status": {"phase": "Running" if node else "Pending"}}


def build_core(n_nodes: int, n_pods: int, size: int = 8) -> Coscheduler:
    """``n_nodes`` half-busy nodes (a 4-GPU plain pod on every other one), then gangs of
    ``size`` 1-GPU pods up to ``n_pods`` pods: bound on the free GPUs while they last (running
    gangs), the rest pending one member short of quorum (waiting gangs)."""
    core = Coscheduler(Settings())
    nodes = cluster_nodes(n_nodes)
    for n in nodes:
        core.upsert(ingest.NODES, node_from_json(n))
    plain = running_pods(n_nodes)
    for p in plain:
        core.upsert_pod(pod_from_json(p))
    free = [(n["metadata"]["name"], 8 - (4 if i % 2 == 0 else 0)) for i, n in enumerate(nodes)]
    slots = [name for name, k in free for _ in range(k)]
    left = n_pods - len(plain)
    g = 0
    while left > 0:
        bound = len(slots) >= size
        members = size if bound else min(size - 1, left)
        for i in range(members):
            core.upsert_pod(pod_from_json(_gang_pod(f"g{g:05d}", i, size,
                                                    slots.pop() if bound else None)))
        left -= members
        g += 1
    return core


def measure(core: Coscheduler, rounds: int = 5, browser: str | None = None) -> dict[str, Any]:
    """Each endpoint's median time over ``rounds`` and its size, over real HTTP."""
    service = Lockstep(core, KubeClient(KubeConfig("http://127.0.0.1:1")))
    app = extender_app(service)
    import uvicorn

    config = uvicorn.Config(app, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])),
                              daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    base = f"http://127.0.0.1:{port}"
    out: dict[str, Any] = {"nodes": len(core.queries.nodes), "pods": len(core.queries.pods),
                           "gangs": len(core.queries.gang_views()), "endpoints": {}}
    try:
        with httpx.Client(base_url=base, timeout=60) as c:
            c.get("/ui")  # loads FastAPI's routes once, as the first request in production
            racks = c.get("/ui/api/racks").json()
            out["racks"] = len(racks["racks"])
            busiest = max(racks["racks"], key=lambda r: r["used"])["rack"]
            gang = c.get("/ui/api/gangs", params={"limit": 1}).json()["gangs"][0]
            paths = {
                "page (/ui)": "/ui", "script (/ui/ui.js)": "/ui/ui.js",
                "gangs (200 rows)": "/ui/api/gangs",
                "gangs, one state": "/ui/api/gangs?state=waiting",
                "racks (aggregates)": "/ui/api/racks",
                "one rack (16 nodes)": f"/ui/api/rack?rack={busiest}",
                "one gang": f"/ui/api/gang/{gang['namespace']}/{gang['name']}",
            }
            for label, path in paths.items():
                times, size = [], 0
                for _ in range(rounds):
                    t0 = time.perf_counter()
                    r = c.get(path)
                    times.append(time.perf_counter() - t0)
                    r.raise_for_status()
                    size = len(r.content)
                out["endpoints"][label] = {"ms": round(statistics.median(times) * 1000, 1),
                                           "bytes": size}
        out["compute_ms"] = _compute(core, busiest, gang["gang"], rounds)
        first = ("page (/ui)", "script (/ui/ui.js)", "gangs (200 rows)", "racks (aggregates)")
        out["first_load_bytes"] = sum(out["endpoints"][k]["bytes"] for k in first)
        if browser:
            out["browser"] = _browser(base, browser, rounds)
    finally:
        server.should_exit = True
        thread.join(10)
    return out


def _compute(core: Coscheduler, rack: str, gang: str, rounds: int) -> dict[str, float]:
    """The same answers without HTTP: what each costs Lockstep's event loop (median ms)."""
    import orjson

    from app.http import ui

    now, wall = time.monotonic(), time.time()
    calls: dict[str, Callable[[], dict[str, Any]]] = {
        "gangs (200 rows)": lambda: ui.gangs_page(core.queries, now, wall),
        "racks (aggregates)": lambda: ui.racks(core.queries),
        "one rack (16 nodes)": lambda: ui.rack_nodes(core.queries, rack),
        "one gang": lambda: ui.gang_detail(core.queries, GangKey(gang), now, wall, ()),
    }
    out = {}
    for label, call in calls.items():
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            orjson.dumps(call())
            times.append(time.perf_counter() - t0)
        out[label] = round(statistics.median(times) * 1000, 1)
    return out


def _browser(base: str, chromium: str, rounds: int) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    loads, opens = [], []
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        for _ in range(rounds):
            page = b.new_page(viewport={"width": 1400, "height": 1000})
            t0 = time.perf_counter()
            page.goto(base + "/ui")
            page.wait_for_selector("#gang-rows tr")
            page.wait_for_selector(".rack")
            loads.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            page.locator(".rack").first.click()
            page.wait_for_selector("#rack-detail .gpu")
            opens.append(time.perf_counter() - t0)
            page.close()
        b.close()
    return {"first_render_ms": round(statistics.median(loads) * 1000),
            "open_rack_ms": round(statistics.median(opens) * 1000)}


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.ui")
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--pods", type=int, default=50000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--browser", action="store_true", help="also load the page in Chromium")
    ap.add_argument("--out", default="run/ui-bench.json")
    args = ap.parse_args()
    t0 = time.perf_counter()
    core = build_core(args.nodes, args.pods)
    built = time.perf_counter() - t0
    chromium = None
    if args.browser:
        from testbed.browser import ensure_chromium

        chromium = str(ensure_chromium())
    result = {"build_seconds": round(built, 1), **measure(core, args.rounds, chromium)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
