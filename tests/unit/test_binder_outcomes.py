"""The binder reports each binding's outcome with the UID it bound.

A BindGroup's outcomes reach the core together, once its last binding is back; a member
deleted and created again under its name in between is another pod, and only the UID tells
the core that an outcome is not about it (found by the model test, seed 2279538499)."""

from __future__ import annotations

import asyncio
from typing import Any

from app.binder import Binder
from app.metrics import Metrics
from coscheduling import Bound, Coscheduler, NodeName, Settings, pod_from_json, pod_key
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
    binder = Binder(core, _Kube(), Metrics(core, lambda _: {}),  # type: ignore[arg-type]
                    None, None, clock=lambda: 0.0, after_change=lambda: None,  # type: ignore[arg-type]
                    kick=asyncio.Event(), bind_retries=0)
    outcome = await binder._bind_one(pod_key("default", "p"), NodeName("n0"))
    assert outcome == Bound(pod_key("default", "p"), NodeName("n0"), obj["metadata"]["uid"])
