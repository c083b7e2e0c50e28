"""``POST /debug/what-if`` and ``lockstep explain --what-if``: the answer on the wire, the
status codes of bad input (malformed YAML, unknown kinds, another scheduler's pods, a body
too big), the /debug guard, the CLI's exit codes, and a what-if leaves the core as it was."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from app import cli
from app.http.whatif import MAX_BODY
from app.kube.client import KubeClient, KubeConfig
from app.process import extender_app
from app.service import Lockstep
from coscheduling import Coscheduler, Settings, node_from_json, pod_from_json
from coscheduling.events import ingest
from tests.builders import node, pod
from tests.fakeapi import Wire


@pytest.fixture
def service() -> Lockstep:
    core = Coscheduler(Settings(backoff_seconds=5))
    for i in range(4):
        core.upsert(ingest.NODES, node_from_json(node(f"n{i}").gpus(4).rack(f"r{i // 2}")
                                                 .build()))
    writes: list[httpx.Request] = []

    def api(req: httpx.Request) -> httpx.Response:
        writes.append(req)
        return httpx.Response(201, json={})
    kube = KubeClient(KubeConfig("http://api.test"), connect=Wire(api))
    svc = Lockstep(core, kube)
    svc.api_writes = writes  # type: ignore[attr-defined]
    return svc


class Client:
    """The app in this process, called as a loopback client (or from ``peer``)."""

    def __init__(self, service: Lockstep, peer: str = "127.0.0.1") -> None:
        self.app = extender_app(service)
        self.peer = peer

    async def apost(self, path: str, content: str | bytes,
                    headers: dict[str, str] | None = None) -> httpx.Response:
        transport = httpx.ASGITransport(app=self.app, client=(self.peer, 1))
        async with httpx.AsyncClient(transport=transport, base_url="http://lockstep",
                                     timeout=30) as c:
            return await c.post(path, content=content, headers=headers)

    def post(self, path: str, content: str | bytes,
             headers: dict[str, str] | None = None) -> httpx.Response:
        return asyncio.run(self.apost(path, content, headers))


@pytest.fixture
def client(service: Lockstep) -> Client:
    return Client(service)


def gang_yaml(name: str, size: int, gpus: int, prio: int = 0) -> str:
    docs = []
    for i in range(size):
        obj = pod(f"{name}-{i}").gang(name, size, timeout=30).gpu(gpus).priority(prio).build()
        obj["metadata"].pop("uid", None)
        obj.pop("status", None)
        docs.append(obj)
    return yaml.safe_dump_all(docs)


def test_the_answer_names_nodes_and_topology(client: Client, service: Lockstep) -> None:
    q = service.core.queries
    before = (dict(q.pods), q.plans(), q.gang_views())
    r = client.post("/debug/what-if", content=gang_yaml("g", 2, 2))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["verdict"] == "fits-now" and body["exitCode"] == 0
    (out,) = body["outcomes"]
    assert len(out["placed"]) == 2 and out["placed"][0]["topology"]["rack"] in ("r0", "r1")
    assert all(p["pinnedAtCreation"] for p in out["placed"])
    assert (dict(q.pods), q.plans(), q.gang_views()) == before
    assert service.api_writes == []  # type: ignore[attr-defined]  # nothing sent to the API


@pytest.mark.parametrize(("body", "status", "says"), [
    pytest.param("kind: Pod\nmetadata: {name: [", 400, "malformed YAML at line", id="yaml"),
    pytest.param("kind: Gizmo\nmetadata: {name: x}\n", 400, "'Gizmo' is not a kind",
                 id="unknown-kind"),
    pytest.param(yaml.safe_dump(pod("x").scheduler("default-scheduler").gpu(1).build()), 400,
                 "is not Lockstep's", id="another-scheduler"),
    pytest.param("", 400, "empty", id="empty"),
    pytest.param("kind: Deployment\nmetadata: {name: d}\nspec: {replicas: 100000, template: "
                 "{spec: {containers: []}}}\n", 400, "0..1000 (--max-gang-size",
                 id="replicas-over-the-limit"),
    pytest.param("x" * (MAX_BODY + 1), 413, "more than", id="too-big"),
])
def test_bad_input_is_a_4xx_naming_what_is_wrong(client: Client, body: str, status: int,
                                                 says: str) -> None:
    r = client.post("/debug/what-if", content=body)
    assert r.status_code == status, r.text
    assert says in r.json()["error"]


def test_the_debug_guard_applies(service: Lockstep) -> None:
    c = Client(service, "10.0.0.9")
    assert c.post("/debug/what-if", content=gang_yaml("g", 2, 2)).status_code == 403


@pytest.fixture
def served(client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's POST goes to the app in this process."""
    def post(url: str, **kw: Any) -> httpx.Response:
        path = "/" + url.split("/", 3)[3]  # http://host:port/debug/what-if
        return client.post(path, content=kw["content"], headers=kw["headers"])
    monkeypatch.setattr(httpx, "post", post)


@pytest.mark.parametrize(("manifest", "code", "says"), [
    (gang_yaml("g", 2, 2), 0, "fits now"),
    (gang_yaml("g", 4, 4) + "---\n" + gang_yaml("h", 4, 4), 1, "waits"),
    (gang_yaml("g", 2, 8), 2, "never fits"),
    ("kind: Gizmo\nmetadata: {name: x}\n", 2, "'Gizmo' is not a kind"),
])
def test_cli_exit_codes(served: None, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                        manifest: str, code: int, says: str) -> None:
    f = tmp_path / "job.yaml"
    f.write_text(manifest)
    assert cli.main(["explain", "--what-if", str(f)]) == code
    out = capsys.readouterr()
    assert says in out.out + out.err


def test_cli_json_is_the_wire_model(served: None, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "job.yaml"
    f.write_text(gang_yaml("g", 2, 2))
    assert cli.main(["explain", "--what-if", str(f), "-o", "json"]) == 0
    assert '"verdict":"fits-now"' in capsys.readouterr().out


def test_cli_missing_file_is_bad_input(tmp_path: Path) -> None:
    assert cli.main(["explain", "--what-if", str(tmp_path / "none.yaml")]) == 2


def test_service_core_sees_a_pod_created_after_the_what_if(client: Client,
                                                           service: Lockstep) -> None:
    """A what-if leaves nothing behind that a later pod of the same name would collide with."""
    client.post("/debug/what-if", content=gang_yaml("g", 2, 2))
    service.core.upsert_pod(pod_from_json(pod("g-0").gang("g", 2).gpu(2).build()))
    assert "default/g-0" in service.core.queries.pods


async def test_one_what_if_at_a_time(service: Lockstep) -> None:
    """A second what-if while one runs is answered 429, not queued without bound."""
    c = Client(service)  # one app: its lock is shared by the three requests
    manifest = gang_yaml("g", 2, 2) + "---\n" + gang_yaml("h", 2, 2)  # two units: it yields
    got = await asyncio.gather(*(c.apost("/debug/what-if", manifest) for _ in range(3)))
    codes = sorted(r.status_code for r in got)
    assert codes[0] == 200 and 429 in codes, codes
    assert "one at a time" in next(r for r in got if r.status_code == 429).json()["error"]


@pytest.mark.parametrize(("body", "says"), [
    pytest.param("a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 9) + "]\n"
        for i in range(8)), "expands to more than", id="billion-laughs"),
    pytest.param("kind: Pod\nmetadata: {name: p}\nspec: " + "[" * 5000 + "]" * 5000,
                 "nesting depth", id="nested-5000-deep"),
    pytest.param("kind: Pod\nmetadata: {name: p}\nspec: " + "[" * 70 + "]" * 70,
                 "deeper than 64", id="nested-70-deep"),
    pytest.param("kind: Deployment\nmetadata: {name: d}\nspec: {replicas: " + "9" * 5000
                 + "}\n", "malformed YAML", id="5000-digit-number"),
    pytest.param('{"kind": "Pod", "metadata": {"name": "p"}, "spec": "x"}', "Pod.spec",
                 id="json"),
    pytest.param('{"kind": "List", "items": []}', "empty", id="empty-list"),
])
def test_hostile_manifests_are_refused_before_any_work(client: Client, body: str,
                                                       says: str) -> None:
    """Each was a 500 (a RecursionError or ValueError out of the YAML parser) or would walk
    billions of values, before the bounds."""
    r = client.post("/debug/what-if", content=body)
    assert r.status_code == 400, r.text
    assert says in r.json()["error"]


def test_a_json_list_of_objects_and_a_kind_list_are_read(client: Client) -> None:
    objs = [yaml.safe_load(d) for d in gang_yaml("g", 2, 2).split("---\n") if d.strip()]
    for body in (json.dumps(objs), json.dumps({"kind": "List", "items": objs})):
        r = client.post("/debug/what-if", content=body)
        assert r.status_code == 200 and r.json()["outcomes"][0]["members"] == 2, r.text


def test_a_big_unit_is_planned_in_a_thread_with_the_same_answer(
        client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    from coscheduling.whatif import dryrun

    manifest = gang_yaml("g", 2, 2)
    live = client.post("/debug/what-if", content=manifest).json()
    monkeypatch.setattr(dryrun, "HEAVY_PAIRS", 0)
    assert client.post("/debug/what-if", content=manifest).json() == live
