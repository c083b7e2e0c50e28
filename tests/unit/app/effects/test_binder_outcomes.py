"""The binder reports each binding's outcome with the UID it bound.

A BindGroup's outcomes reach the core together, once its last binding is back; a member
deleted and created again under its name in between is another pod, and only the UID tells
the core that an outcome is not about it (found by the model test, seed 2279538499)."""

from __future__ import annotations

import asyncio
from typing import Any

from app.effects.binder import Binder
from app.effects.parked import ParkedCalls
from app.metrics import Metrics
from coscheduling import (
    Bound,
    Coscheduler,
    GangKey,
    NodeName,
    Park,
    Settings,
    pod_from_json,
    pod_key,
)
from tests.builders import pod


class _Kube:
    """Answers every binding as the API server does when it succeeds."""

    async def bind_retrying(self, key: Any, namespace: str, name: str, uid: str,
                            node: NodeName, **_: Any) -> Bound:
        return Bound(key, node)


async def test_an_outcome_carries_the_uid_of_the_pod_it_bound() -> None:
    core = Coscheduler(Settings())
    obj = pod("p").gpu(1).build()
    core.upsert_pod(pod_from_json(obj))
    binder = Binder(core, _Kube(), Metrics(core.queries, lambda _: {}),  # type: ignore[arg-type]
                    None, None, clock=lambda: 0.0, after_change=lambda: None,  # type: ignore[arg-type]
                    kick=asyncio.Event(), bind_retries=0)
    outcome = await binder._bind_one(pod_key("default", "p"), NodeName("n0"))
    assert outcome == Bound(pod_key("default", "p"), NodeName("n0"), obj["metadata"]["uid"])


class _ParkingCore:
    """A core that parks every bind call (what a gang short of its quorum gets)."""

    def __init__(self) -> None:
        self.abandoned: list[Any] = []

    def bind(self, key: Any, node: NodeName, now: float, uid: str) -> Park:
        return Park(GangKey("default/g"), deadline=now)

    def abandon(self, key: Any) -> None:
        self.abandoned.append(key)


async def test_a_call_let_go_in_the_step_that_parked_it_is_answered_at_once() -> None:
    """Acting on a change may let the very call just parked go (a gang giving its room back
    to higher-priority pods unparks its members): the answer must reach the call. Before,
    the call was opened only after that, the answer found nothing open, and kube-scheduler's
    bind call hung until its gang's deadline plus 5 s (found by the model, seed 401)."""
    core = _ParkingCore()
    parked = ParkedCalls()
    key = pod_key("default", "p")
    binder = Binder(core, _Kube(), None, parked, None,  # type: ignore[arg-type]
                    clock=lambda: 0.0, kick=asyncio.Event(), bind_retries=0,
                    after_change=lambda: parked.answer(key, "let go: room given back"))
    answer = await asyncio.wait_for(binder.bind(key, NodeName("n0"), "uid-1"), 2.0)
    assert answer == "let go: room given back"
    assert core.abandoned == [] and len(parked) == 0
