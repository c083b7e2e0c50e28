"""Is a what-if cheap? ``POST /debug/what-if`` latency at 5,000 nodes and 50,000 pods, and
the verbs' latency while what-ifs run (goal: p95 <= 200 ms, no stall).

The server is the stall benchmark's (``benchmarks.stall``): the real app over a synthetic
core, every node full of bound pods of priority 0-9 and 2-member gangs but 16 left free,
and pending plain pods to bring the cache to ``pods``. From another process, one shape at a
time, ``rounds`` what-ifs each, while the stall benchmark's probes (``/healthz``, ``/filter``
and ``/bind`` of plain pods) run:

* ``fits``: a 2 x 8-GPU gang (room on the free nodes);
* ``preempts``: a 17 x 8-GPU gang of priority 1000, one member more than the free nodes
  hold: the victim search, in its slices;
* ``waits``: the same gang at priority 0: nothing is below it, so it waits;
* ``never``: one pod of 16 GPUs (no node has that many).

Each what-if row: its round trip p50 / p95 / max and the verdict; each probe row: its p50 /
p99 / max idle and while the what-ifs ran, and the longest time work held the server's loop.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from typing import Any

import httpx
import yaml

from . import stall
from .synthetic import cluster_nodes
from .verbs import _free_port, _pct

__all__ = ["GOAL_P95_MS", "SHAPES", "TABLE_COLUMNS", "run"]

GOAL_P95_MS = 200.0
TABLE_COLUMNS = (("shape", "what-if"), ("verdict", "verdict"), ("n", "n"),
                 ("p50_ms", "p50 ms"), ("p95_ms", "p95 ms"), ("max_ms", "max ms"))


def _gang(name: str, size: int, gpus: int, prio: int, rack: str | None = None) -> str:
    docs = []
    for i in range(size):
        spec: dict[str, Any] = {"schedulerName": "lockstep", "priority": prio, "containers": [
            {"name": "c", "resources": {"requests": {"nvidia.com/gpu": str(gpus), "cpu": "1",
                                                     "memory": "1Gi"}}}]}
        if rack is not None:
            spec["nodeSelector"] = {"lockstep.dev/rack": rack}
        ann = {"lockstep.dev/pod-group": name, "lockstep.dev/min-member": str(size)} \
            if size > 1 else {}
        docs.append({"apiVersion": "v1", "kind": "Pod", "spec": spec, "metadata": {
            "name": f"{name}-{i}", "namespace": "bench", "annotations": ann}})
    return yaml.safe_dump_all(docs)


SHAPES = {
    "fits": (_gang("wf", 2, 8, 5), "fits-now"),
    "preempts": (_gang("wp", stall.FREE_NODES + 1, 8, 1000), "fits-after-preemption"),
    "waits": (_gang("ww", 2, 8, 0, "rack-0000"), "waits"),
    "never": (_gang("wn", 1, 16, 5), "never-fits"),
}
"""Each shape's manifest and the verdict it must get."""


def serve(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.whatif")
    for name in ("--nodes", "--pods", "--port"):
        ap.add_argument(name, type=int, required=True)
    ap.add_argument("--api", required=True)
    args = ap.parse_args(argv)
    import uvicorn

    from app.process import extender_app
    from app.service import freeze_synced_heap

    bound = len(stall.fill(args.nodes, 0, 0))
    service = stall.build(args.nodes, 0, max(1000, args.pods - bound), args.api)
    freeze_synced_heap()  # as the service does once its cache has synced
    config = uvicorn.Config(extender_app(service), host="127.0.0.1", port=args.port,
                            log_level="warning", access_log=False)
    asyncio.run(stall._serve(service, uvicorn.Server(config)))


def _ask(client: httpx.Client, rounds: int, times: dict[str, list[float]],
         verdicts: dict[str, set[str]]) -> list[float]:
    """``rounds`` what-ifs of each shape, one at a time; every round trip in ``times``."""
    calls: list[float] = []
    for shape, (manifest, _) in SHAPES.items():
        for _ in range(rounds):
            t = time.perf_counter()
            r = client.post("/debug/what-if", content=manifest,
                            headers={"content-type": "application/yaml"})
            took = time.perf_counter() - t
            if r.status_code != 200:
                raise RuntimeError(f"what-if {shape}: {r.status_code} {r.text[:300]}")
            calls.append(took)
            times[shape].append(took * 1000)
            verdicts[shape].add(r.json()["verdict"])
    return calls


def run(nodes: int = 5000, pods: int = 50000, rounds: int = 20, idle_seconds: float = 3.0,
        log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Serve, measure the probes idle, then during the what-ifs; rows as the module says."""
    stub = ThreadingHTTPServer(("127.0.0.1", 0), stall._StubAPI)
    threading.Thread(target=stub.serve_forever, daemon=True).start()
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "benchmarks.whatif", "--nodes", str(nodes),
                               "--pods", str(pods), "--port", str(port),
                               "--api", f"http://127.0.0.1:{stub.server_address[1]}"])
    base = f"http://127.0.0.1:{port}"
    names = [n["metadata"]["name"] for n in cluster_nodes(nodes)]
    times: dict[str, list[float]] = {s: [] for s in SHAPES}
    verdicts: dict[str, set[str]] = {s: set() for s in SHAPES}
    try:
        with httpx.Client(base_url=base, timeout=120) as client:
            stall._wait_up(client, server, 300)
            probes = stall._Probes(base, names, names[-stall.FREE_NODES:])
            log(f"  server up: {nodes} nodes, {pods} pods; idle for {idle_seconds:g} s")
            probe_rows = stall._rows("idle", *probes.during(lambda: stall._sleep(idle_seconds)))
            log(f"  what-ifs: {rounds} of each of {', '.join(SHAPES)}")
            probe_rows += stall._rows("what-if", *probes.during(
                lambda: _ask(client, rounds, times, verdicts)))
            cached = client.get("/metrics").text.count("\n")  # the server is alive after
    finally:
        server.terminate()
        server.wait(10)
        stub.shutdown()
        stub.server_close()
    rows = [{"shape": s, "verdict": "/".join(sorted(verdicts[s])), "expected": SHAPES[s][1],
             "n": len(v), "p50_ms": round(_pct(v, 0.5), 1), "p95_ms": round(_pct(v, 0.95), 1),
             "max_ms": round(max(v), 1)} for s, v in times.items()]
    return {"nodes": nodes, "pods": pods, "rounds": rounds, "goal_p95_ms": GOAL_P95_MS,
            "rows": rows, "probes": probe_rows, "alive_after": cached > 0}


if __name__ == "__main__":
    serve(sys.argv[1:])
