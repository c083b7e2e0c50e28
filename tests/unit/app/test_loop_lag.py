"""The loop-lag watch sees work that holds the event loop, and ``/debug/loop`` reports it."""

from __future__ import annotations

import asyncio
import gc
import time

import httpx
import pytest

from app.kube.client import KubeClient, KubeConfig
from app.process import extender_app
from app.service import LOOP_LAG_WARN_SECONDS, Lockstep, LoopLag
from coscheduling import Coscheduler, Settings, node_from_json
from coscheduling.events import ingest
from tests.builders import node


async def _held_for(seconds: float) -> LoopLag:
    lag = LoopLag(period=0.02)
    task = asyncio.create_task(lag.run())
    await asyncio.sleep(0.05)
    time.sleep(seconds)  # work that never yields, as a long verb would
    await asyncio.sleep(0.05)
    task.cancel()
    return lag


def test_work_that_holds_the_loop_is_measured_and_a_long_hold_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lag = asyncio.run(_held_for(0.3))
    assert 0.25 <= lag.max < 1.0 and lag.held_over_warn == 0
    lag.observe(LOOP_LAG_WARN_SECONDS + 0.5)
    assert lag.held_over_warn == 1 and "event loop held for 1.50s" in caplog.text
    lag.reset()
    assert lag.max == 0.0 and lag.held_over_warn == 0


def test_debug_loop_reports_the_longest_hold_and_resets_on_request() -> None:
    async def go() -> tuple[dict[str, float], dict[str, float]]:
        service = Lockstep(Coscheduler(Settings()), KubeClient(KubeConfig("http://127.0.0.1:9")))
        service.lag.observe(0.42)
        app = extender_app(service)
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 5000))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            first = (await c.get("/debug/loop", params={"reset": "1"})).json()
            second = (await c.get("/debug/loop")).json()
        await service.kube.aclose()
        return first, second

    first, second = asyncio.run(go())
    assert first["maxLagSeconds"] == 0.42 and first["lastLagSeconds"] == 0.42
    assert second["maxLagSeconds"] == 0.0


def test_the_heap_synced_at_start_is_out_of_the_collectors_walks() -> None:
    """Once the cache has synced and the verbs are served, what is alive (the cluster's
    records) is frozen: a full collection, which any big request may trigger, no longer
    walks it with the loop held. Before the sync nothing is frozen (half a cache)."""
    gc.unfreeze()
    service = Lockstep(Coscheduler(Settings()), KubeClient(KubeConfig("http://127.0.0.1:9")))
    record = node_from_json(node("n0").gpus(8).build())
    service.core.upsert(ingest.NODES, record)
    try:
        service.after_change()
        assert gc.get_freeze_count() == 0  # not synced yet
        assert gc.is_tracked(record) and any(o is record for o in gc.get_objects())
        for res in service.cache.resources.values():
            res.synced = True
        service.serve_verbs()
        assert gc.get_freeze_count() > 0
        assert not any(o is record for o in gc.get_objects())  # frozen, never walked
    finally:
        gc.unfreeze()
        asyncio.run(service.kube.aclose())
