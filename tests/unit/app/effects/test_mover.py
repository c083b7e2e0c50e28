"""Pods moved to make room for a gang go through the Eviction API (PodDisruptionBudgets
honoured by the API server), not a delete; a 429 is counted as refused."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from app.effects import poster
from app.kube.client import KubeClient, KubeConfig
from app.service import Lockstep
from coscheduling import Coscheduler, NodeName, PodKey, Settings
from coscheduling.actions import Eviction
from tests.fakeapi import Wire


class EvictionAPI:
    """Answers with ``statuses`` in turn (then 201) and records every call."""

    def __init__(self, *statuses: int) -> None:
        self.statuses = list(statuses)
        self.calls: list[tuple[str, str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.calls.append((request.method, request.url.path, body))
        status = self.statuses.pop(0) if self.statuses else 201
        return httpx.Response(status, json={"reason": "TooManyRequests",
                                            "message": "Cannot evict pod as it would violate "
                                                       "the pod's disruption budget."})


async def evict(api: EvictionAPI, seconds: float) -> Lockstep:
    svc = Lockstep(Coscheduler(Settings()), KubeClient(KubeConfig("http://api.test"),
                                                       connect=Wire(api)))
    svc.poster.offer_evictions([Eviction(PodKey("default/a"), "uid-a", NodeName("n0"),
                                         "default/big", 0, None, move=True)])
    task = asyncio.create_task(svc.poster.evict())
    await asyncio.sleep(seconds)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return svc


def count(svc: Lockstep, name: str, outcome: str) -> float:
    got = svc.metrics.registry.get_sample_value(name, {"outcome": outcome})
    return got or 0.0


async def test_a_move_is_an_eviction_with_the_uid_as_precondition() -> None:
    api = EvictionAPI()
    svc = await evict(api, 0.1)
    assert api.calls == [("POST", "/api/v1/namespaces/default/pods/a/eviction", {
        "apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": "a", "namespace": "default"},
        "deleteOptions": {"preconditions": {"uid": "uid-a"}}})]
    assert count(svc, "lockstep_defrag_moves_total", "evicted") == 1
    assert svc.metrics.registry.get_sample_value("lockstep_preemptions_total") == 0


async def test_a_budget_refusal_is_retried_then_counted_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(poster, "MOVE_RETRY", 0.001)
    api = EvictionAPI(*([429] * 5))
    svc = await evict(api, 0.2)
    assert len(api.calls) == 5 and all(c[0] == "POST" for c in api.calls)
    assert count(svc, "lockstep_defrag_moves_total", "refused") == 1
