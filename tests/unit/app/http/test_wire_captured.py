"""Replays request bodies captured from the real kube-scheduler v1.34 on the test bed
(tests/fixtures/wire/*.json, written by ``python -m tests.fixtures.wire.capture``)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from app.http.wire import BindingArgs, ExtenderArgs
from app.kube.client import KubeClient, KubeConfig
from app.process import extender_app
from app.service import Lockstep
from coscheduling import Coscheduler, Settings, node_from_json, pod_from_json
from coscheduling.events import ingest
from testbed.bins import REPO
from tests.builders import node
from tests.fakeapi import Wire

WIRE = REPO / "tests" / "fixtures" / "wire"


def captured(verb: str) -> dict[str, Any]:
    return dict(json.loads((WIRE / f"{verb}.json").read_text()))


def test_captured_bodies_use_capitalised_keys_and_node_names() -> None:
    f = captured("filter")
    assert set(f) == {"Pod", "Nodes", "NodeNames"}
    assert f["Nodes"] is None and f["NodeNames"]
    assert set(captured("bind")) == {"PodName", "PodNamespace", "PodUID", "Node"}
    ExtenderArgs.model_validate(f)
    ExtenderArgs.model_validate(captured("prioritize"))
    BindingArgs.model_validate(captured("bind"))


@pytest.fixture
async def client() -> AsyncIterator[tuple[httpx.AsyncClient, Lockstep]]:
    core = Coscheduler(Settings())
    for name in captured("filter")["NodeNames"]:
        core.upsert(ingest.NODES, node_from_json(node(name).gpus(2).build()))
    core.upsert_pod(pod_from_json(captured("filter")["Pod"]))  # the pod watch came first
    calls: list[str] = []

    def api(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        return httpx.Response(201, json={})

    service = Lockstep(core, KubeClient(KubeConfig("http://api.test"),
                                        connect=Wire(api)))
    app = extender_app(service)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://lockstep.test") as c:
        yield c, service


async def test_captured_filter_is_answered_in_wire_format(
    client: tuple[httpx.AsyncClient, Lockstep],
) -> None:
    c, _ = client
    body = captured("filter")
    r = await c.post("/filter", json=body)
    assert r.status_code == 200
    out = r.json()
    assert set(out) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes",
                        "Error"}
    # train-0 is one of a 2-member gang and is alone so far: every node unresolvable.
    assert out["NodeNames"] == []
    assert set(out["FailedAndUnresolvableNodes"]) == set(body["NodeNames"])
    assert "1/2 members exist" in next(iter(out["FailedAndUnresolvableNodes"].values()))


async def test_captured_prioritize_scores_each_node(
    client: tuple[httpx.AsyncClient, Lockstep],
) -> None:
    c, _ = client
    body = captured("prioritize")
    r = await c.post("/prioritize", json=body)
    assert r.status_code == 200
    assert sorted(h["Host"] for h in r.json()) == sorted(body["NodeNames"])


async def test_captured_bind_for_a_short_gang_is_refused_with_the_reason(
    client: tuple[httpx.AsyncClient, Lockstep],
) -> None:
    c, service = client
    service.core.upsert_pod(pod_from_json(captured("filter")["Pod"]))
    r = await c.post("/bind", json=captured("bind"))
    assert r.status_code == 200
    assert "1/2 members exist" in r.json()["Error"]
