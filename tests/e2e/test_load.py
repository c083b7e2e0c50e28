"""Load: 2,000 bind calls parked at once, then every gang released together.

In-process, not on the test bed: the app (``extender_app``) on a real ``Lockstep`` service and
core, its Kubernetes API faked in memory (``tests.fakeapi.Wire``: bindings succeed and are
recorded), driven by 2,020 concurrent ``POST /bind`` requests through
``httpx.ASGITransport``. What is measured is Lockstep's own work (the verbs, the waiting map,
the group binds) without a 2-core machine's kube-apiserver and kube-scheduler in the way.

20 gangs of 101 one-GPU pods (``min-member`` 101) on 256 nodes of 8 GPUs: every gang is
admitted (filter), 100 members of each bind and park (2,000 parked calls), then the last
member of each gang arrives and all 2,020 calls must be answered with success, each pod bound
exactly once, to the node its gang's plan gave it, and nothing left parked. Reported (printed
and written to ``run/load-summary.json``): wall and CPU time to park and to resolve, the
event loop's lateness (a 10 ms ticker) while parking the burst, while holding 2,000 parked
calls for a second, and while resolving, the process's RSS, and the load average (on a
shared 2-core machine wall times stretch with it; CPU seconds do not).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import resource
import time
from collections import Counter
from typing import Any

import httpx

from app.kube.client import KubeClient, KubeConfig
from app.process import extender_app
from app.service import Lockstep
from coscheduling import (
    Coscheduler,
    GangDefaults,
    NodeName,
    PodKey,
    Settings,
    node_from_json,
    pod_from_json,
)
from coscheduling.events import ingest
from testbed.bins import REPO
from tests.builders import node, pod
from tests.fakeapi import Wire

GANGS = 20
SIZE = 101
PARKED = GANGS * (SIZE - 1)
NODES = 256
SUMMARY = REPO / "run" / "load-summary.json"


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / 2**20


class Ticker:
    """How late a 10 ms sleep wakes up: the event loop's responsiveness under load."""

    def __init__(self) -> None:
        self.late: list[tuple[float, float]] = []
        """(time the sleep started, how late it woke, in seconds)."""
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(0.01)
            self.late.append((t, time.perf_counter() - t - 0.01))

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        assert self._task is not None
        self._task.cancel()

    def between(self, t0: float, t1: float) -> dict[str, float]:
        xs = sorted(late for t, late in self.late if t0 <= t <= t1) or [0.0]
        return {"ticks": len(xs), "p50_ms": round(1000 * xs[len(xs) // 2], 1),
                "p99_ms": round(1000 * xs[int(0.99 * (len(xs) - 1))], 1),
                "max_ms": round(1000 * xs[-1], 1)}


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def test_two_thousand_parked_binds_resolve(capsys: Any) -> None:
    bindings: Counter[tuple[str, str]] = Counter()

    def api(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/binding"):
            body = json.loads(request.content)
            bindings[(request.url.path.split("/")[-2], body["target"]["name"])] += 1
        return httpx.Response(201, json={})

    rss0 = rss_mib()
    core = Coscheduler(Settings(defaults=GangDefaults(timeout_seconds=200,
                                                      max_timeout_seconds=240)))
    for i in range(NODES):
        core.upsert(ingest.NODES, node_from_json(
            node(f"n{i:03d}").gpus(8).rack(f"r{i // 16}", f"b{i // 64}").build()))
    names = [NodeName(f"n{i:03d}") for i in range(NODES)]
    for g in range(GANGS):
        for m in range(SIZE):
            core.upsert_pod(pod_from_json(
                pod(f"g{g}-{m}").gang(f"g{g}", min_member=SIZE, timeout=200).gpu(1).build()))
    kube = KubeClient(KubeConfig("http://api.test"), connect=Wire(api))
    service = Lockstep(core, kube)
    app = extender_app(service)

    # Admission: every gang fits (2,020 of 2,048 GPUs), each member gets its planned node.
    t0 = time.perf_counter()
    plan: dict[str, str] = {}
    for g in range(GANGS):
        for m in range(SIZE):
            p = core.queries.pods[PodKey(f"default/g{g}-{m}")]
            d = service.filter(p, names)
            assert d.unresolvable is None and len(d.passed) == 1, d
            plan[p.name] = d.passed[0]
    admit_s = time.perf_counter() - t0
    rss_admitted = rss_mib()

    ticker = Ticker()
    ticker.start()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://lockstep.test", timeout=120) as client:
        async def bind(name: str) -> dict[str, Any]:
            r = await client.post("/bind", json={"PodName": name, "PodNamespace": "default",
                                                 "PodUID": "", "Node": plan[name]})
            assert r.status_code == 200, r.text
            return dict(r.json())

        first = [f"g{g}-{m}" for g in range(GANGS) for m in range(SIZE - 1)]
        random.Random(11).shuffle(first)
        t1, c1 = time.perf_counter(), cpu_seconds()
        parked = [asyncio.ensure_future(bind(n)) for n in first]
        while core.queries.parked_total() < PARKED:
            assert not any(t.done() for t in parked), "a bind call returned before its quorum"
            await asyncio.sleep(0.01)
        park_s, park_cpu = time.perf_counter() - t1, cpu_seconds() - c1
        rss_parked = rss_mib()
        assert core.queries.parked_total() == PARKED and len(service.parked) == PARKED
        assert not bindings, "something bound before its gang's quorum"
        t_idle = time.perf_counter()
        await asyncio.sleep(1.0)  # holding 2,000 parked calls should cost the loop nothing
        assert not any(t.done() for t in parked)

        t2, c2 = time.perf_counter(), cpu_seconds()
        last = [asyncio.ensure_future(bind(f"g{g}-{SIZE - 1}")) for g in range(GANGS)]
        answers = await asyncio.wait_for(asyncio.gather(*parked, *last), 60)
        resolve_s, resolve_cpu = time.perf_counter() - t2, cpu_seconds() - c2
        t3 = time.perf_counter()
    ticker.stop()
    loop = {"parking": ticker.between(t1, t_idle), "holding": ticker.between(t_idle, t2),
            "resolving": ticker.between(t2, t3)}
    await kube.aclose()

    errors = [a["Error"] for a in answers if a["Error"]]
    assert not errors, errors[:5]
    assert len(answers) == GANGS * SIZE
    assert sum(bindings.values()) == GANGS * SIZE and set(bindings.values()) == {1}
    assert dict(bindings) == {(n, plan[n]): 1 for n in plan}
    assert core.queries.parked_total() == 0 and not service.parked
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    figures = {
        "gangs": GANGS, "members": SIZE, "parked_at_once": PARKED, "nodes": NODES,
        "admit_all_s": round(admit_s, 3),
        "park_2000": {"wall_s": round(park_s, 3), "cpu_s": round(park_cpu, 3)},
        "resolve_all": {"wall_s": round(resolve_s, 3), "cpu_s": round(resolve_cpu, 3)},
        "loop_lateness_ms": loop,
        "load_average": list(os.getloadavg()),
        "rss_mib": {"start": round(rss0, 1), "admitted": round(rss_admitted, 1),
                    "parked": round(rss_parked, 1), "end": round(rss_mib(), 1),
                    "peak": round(peak, 1)},
        "in_process": True,
    }
    SUMMARY.parent.mkdir(exist_ok=True)
    SUMMARY.write_text(json.dumps(figures, indent=2) + "\n")
    with capsys.disabled():
        print(f"\nload (in-process): {json.dumps(figures)}")
