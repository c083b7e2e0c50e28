"""The verbs check a pod's shape without work that grows with its node affinity: an affinity
over the planner's limits is left out of the check (it is never evaluated), one within them
is checked as before."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import orjson

from app.http.verbs import VerbsApp
from app.kube.client import KubeClient, KubeConfig
from app.service import Lockstep
from coscheduling import Coscheduler, Settings, node_from_json
from coscheduling.events import ingest
from tests.builders import node, pod


def _filter(p: dict[str, Any]) -> tuple[int, dict[str, Any], float]:
    async def go() -> tuple[int, dict[str, Any], float]:
        core = Coscheduler(Settings())
        core.upsert(ingest.NODES, node_from_json(node("n1").gpus(8).build()))
        service = Lockstep(core, KubeClient(KubeConfig("http://127.0.0.1:9")))
        transport = httpx.ASGITransport(app=VerbsApp(service))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            t = time.perf_counter()
            r = await c.post("/filter", content=orjson.dumps(
                {"Pod": p, "Nodes": None, "NodeNames": ["n1"]}))
            took = time.perf_counter() - t
        await service.kube.aclose()
        return r.status_code, r.json(), took
    return asyncio.run(go())


def _with_terms(terms: list[Any]) -> dict[str, Any]:
    obj = pod("web").gpu(1).build()
    obj["metadata"]["uid"] = "u1"
    obj["spec"]["affinity"] = {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}
    return obj


def test_a_plain_pod_with_thousands_of_affinity_terms_is_filtered_without_checking_each() -> None:
    """Before: each of the 4,000 terms was validated as a model, ~0.5 s of the event loop
    per call (benchmarks/stall.py), on every filter and every webhook review of the pod."""
    terms = [{"matchExpressions": [{"key": "zone", "operator": "In",
                                    "values": [f"z{j}" for j in range(8)]}]}
             for _ in range(4000)]
    status, body, took = _filter(_with_terms(terms))
    assert status == 200 and body["NodeNames"] == ["n1"]  # kube-scheduler's to evaluate
    assert took < 0.25


def test_an_affinity_within_the_limits_is_still_checked() -> None:
    status, body, _ = _filter(_with_terms([{"matchExpressions": [{"key": 7}]}]))
    assert status == 422 and any("matchExpressions.0.key" in f for f in body["fields"])
