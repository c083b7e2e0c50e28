"""Adding a convention is adding one module (and its line in the registry).

A throwaway convention, written here as the module a contributor would add (its own keys, its
own PodGroup-like object, its own status), is registered and nothing else changes: the
webhook gates its pods, the adapter's cache watches its objects, the core ingests them and
resolves its pods' gangs from them, and the status writer's one loop writes its status.
"""

from __future__ import annotations

import asyncio
import json
import types
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from app.effects import status_writer
from app.effects.status_writer import StatusWriter
from app.kube.cache import ClusterCache
from app.kube.client import KubeClient, KubeConfig
from coscheduling import (
    Coscheduler,
    GangSpec,
    MissingPodGroup,
    Watched,
    conventions,
    declares_gang,
    node_from_json,
    pod_from_json,
    pod_key,
    watched_table,
)
from coscheduling.events import ingest
from tests.builders import node, pod
from tests.fakeapi import Wire

MODULE = '''
"""Example.com's gangs: a pod label names a ``Gang`` object, whose ``spec.members`` is the
size; Lockstep writes back how many members are bound."""

from collections.abc import Mapping
from typing import Any

from coscheduling.conventions.base import (
    Convention, Found, Key, Objects, PodGroupAPI, PodGroupRecord, Render, StatusModel,
    StatusPatch, StatusWrite, Watch,
)
from coscheduling.podgroup import GangKey, MissingPodGroup, Source, gang_key
from coscheduling.records import PodRecord

SOURCE = Source("example.com")
LABEL = "example.com/gang"


def parse(obj: Mapping[str, Any]) -> PodGroupRecord:
    meta = obj.get("metadata") or {}
    key = gang_key(meta.get("namespace") or "default", meta.get("name") or "")
    return PodGroupRecord(key, int((obj.get("spec") or {}).get("members", 1)), None, {})


API = PodGroupAPI("example.com", "v1", "gangs", parse, "Gang.spec.members")


def from_object(pod: PodRecord, key: GangKey, found: Found, objects: Objects
                ) -> Found | MissingPodGroup:
    gang = objects.get(SOURCE, {}).get(key)
    if gang is None:
        return MissingPodGroup(key, API.group)
    return Found(SOURCE, gang.min_member, size_field=API.size_field)


def patches(model: StatusModel, render: Render, now: str) -> list[StatusPatch]:
    return [StatusPatch(g.key, API.status_path(*g.key.split("/", 1)), {"bound": g.members.bound})
            for g in model.gangs.values() if g.source is SOURCE]


CONVENTION = Convention(SOURCE, declares=(Key(LABEL, "label"),), podgroup=API,
                        from_object=from_object, watches=(Watch.of(API, "example-gangs"),),
                        status=StatusWrite(API.group, patches))
'''


class Recorder:
    """The API server's side of status writes: every request's method, path and body."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.writes.append((request.method, request.url.path,
                            json.loads(request.content or b"null")))
        return httpx.Response(200, json={})


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """The throwaway module, registered after the shipped conventions."""
    module = types.ModuleType("example_convention")
    exec(compile(MODULE, "example_convention.py", "exec"), module.__dict__)
    monkeypatch.setattr(conventions, "REGISTRY", (*conventions.REGISTRY, module.CONVENTION))
    return module


def gang_object(members: int) -> dict[str, Any]:
    return {"apiVersion": "example.com/v1", "kind": "Gang",
            "metadata": {"namespace": "default", "name": "train"},
            "spec": {"members": members}}


def entry(name: str) -> Watched:
    [found] = [w for w in watched_table() if w.watch.name == name]
    return found


async def test_a_registered_convention_is_watched_ingested_and_its_status_written(
        example: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    api = Recorder()
    kube = KubeClient(KubeConfig("http://api.test"), connect=Wire(api))
    core = Coscheduler()

    # Watched: the table and the adapter's cache list it, where its CRD serves it.
    gangs = entry("example-gangs")
    assert gangs.watch.path == "/apis/example.com/v1/gangs"
    cache = ClusterCache(core, kube)
    assert cache.resources["example-gangs"].kind is gangs.kind
    assert "gangs.example.com" in cache.crd_names()

    # Gated at creation by the webhook, like any gang member.
    members = [pod(f"t-{i}").gpu(1).label(example.LABEL, "train").build() for i in range(2)]
    assert declares_gang(members[0])

    # Ingested: its pods wait for their object, then take their size from it.
    core.upsert(ingest.NODES, node_from_json(node("n0").gpus(8).build()))
    for obj in members:
        core.upsert_pod(pod_from_json(obj))
    member = pod_key("default", "t-0")
    assert isinstance(core.queries.membership(member), MissingPodGroup)
    core.upsert(gangs.kind, gangs.watch.parse(gang_object(2), "v1"))
    spec = core.queries.membership(member)
    assert isinstance(spec, GangSpec)
    assert (spec.source, spec.min_member) == (example.SOURCE, 2)

    # Its status written: one pass of the writer's loop over the registry.
    passes = 0

    async def sleep(_: float) -> None:
        nonlocal passes
        passes += 1
        if passes > 1:
            raise asyncio.CancelledError

    monkeypatch.setattr(status_writer, "asyncio", SimpleNamespace(sleep=sleep))
    writer = StatusWriter(core, kube)
    with pytest.raises(asyncio.CancelledError):
        await writer.run()
    assert ("PATCH", "/apis/example.com/v1/namespaces/default/gangs/train/status",
            {"status": {"bound": 0}}) in api.writes
    assert writer.failed == 0

    # Its object gone, its pods wait for it again.
    core.delete(gangs.kind, spec.key)
    assert isinstance(core.queries.membership(member), MissingPodGroup)
