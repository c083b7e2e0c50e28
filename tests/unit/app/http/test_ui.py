"""The web page's JSON (app/http/ui.py) on a real core: gang states and rows, racks and their
GPU slots, one gang's plan, the guard, and --ui=false."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from app.http.explain import explain_pod
from app.kube.client import KubeClient, KubeConfig
from app.process import extender_app
from app.service import Lockstep
from coscheduling import Coscheduler, PodKey, Settings, node_from_json, pod_from_json
from coscheduling.events import ingest
from tests.builders import node, pod
from tests.fakeapi import Wire

NAMES = [f"n{i}" for i in range(4)]


@pytest.fixture
def service() -> Lockstep:
    core = Coscheduler(Settings(backoff_seconds=5))
    for i, n in enumerate(NAMES):  # two racks of two 4-GPU nodes, one NVSwitch domain each
        core.upsert(ingest.NODES, node_from_json(node(n).gpus(4).rack(f"r{i // 2}")
                                        .interconnect("nvlink-pairs")
                                        .label("nvidia.com/gpu.clique", f"c{i // 2}")
                                        .label("lockstep.dev/numa-nodes", "2")
                                        .label("lockstep.dev/gpus-per-numa", "2").build()))
    kube = KubeClient(KubeConfig("http://api.test"),
                      connect=Wire(lambda _: httpx.Response(201, json={})))
    return Lockstep(core, kube)


async def client_for(service: Lockstep, *, ui: bool = True,
                     peer: tuple[str, int] = ("127.0.0.1", 1)) -> httpx.AsyncClient:
    app = extender_app(service, ui=ui)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=peer),
                             base_url="http://lockstep.test")


@pytest.fixture
async def client(service: Lockstep) -> AsyncIterator[httpx.AsyncClient]:
    async with await client_for(service) as c:
        yield c


def add(service: Lockstep, *pods: dict[str, object]) -> None:
    for p in pods:
        service.core.upsert_pod(pod_from_json(p))


async def gangs_in_three_states(service: Lockstep) -> None:
    """waiting (1 of 2 members), admitted (2 of 2 filtered, none bound), running (bound)."""
    add(service, pod("w0", "ml").gang("wait", min_member=2).gpu(1).priority(5).build())
    service.filter(service.core.queries.pods["ml/w0"], NAMES)  # type: ignore[index]
    add(service, *(pod(f"a{i}", "ml").gang("adm", min_member=2).gpu(2)
                   .annotate("lockstep.dev/rank", str(1 - i)).build() for i in range(2)))
    for i in range(2):
        service.filter(service.core.queries.pods[f"ml/a{i}"], NAMES)  # type: ignore[index]
    add(service, *(pod(f"r{i}", "team").gang("run", min_member=2).gpu(1).build()
                   for i in range(2)))
    nodes = [service.filter(service.core.queries.pods[f"team/r{i}"], NAMES).passed[0]  # type: ignore[index]
             for i in range(2)]
    binds = [asyncio.ensure_future(service.bind("team", f"r{i}", "", nodes[i])) for i in range(2)]
    assert await asyncio.gather(*binds) == ["", ""]
    for i in range(2):
        add(service, pod(f"r{i}", "team").gang("run", min_member=2).gpu(1)
            .on(nodes[i]).build())


async def test_gangs_by_state_with_rows_worst_first(client: httpx.AsyncClient,
                                                   service: Lockstep) -> None:
    await gangs_in_three_states(service)
    data = (await client.get("/ui/api/gangs")).json()
    assert {k: v for k, v in data["counts"].items() if v} == {
        "waiting": 1, "admitted": 1, "running": 1}
    assert [g["gang"] for g in data["gangs"]] == ["ml/wait", "ml/adm", "team/run"]
    wait = data["gangs"][0]
    assert (wait["members"], wait["bound"], wait["parked"], wait["pending"]) == (1, 0, 0, 1)
    assert wait["convention"] == "lockstep" and wait["priority"] == 5
    # the reason in the same words as `lockstep explain`
    why = (await client.get("/debug/pods/ml/w0")).json()["explanation"]
    assert wait["reason"] == why == "gang ml/wait: 1/2 members exist, waiting for 1 more"
    assert data["namespaces"] == ["ml", "team"]
    only = (await client.get("/ui/api/gangs", params={"namespace": "team"})).json()
    assert [g["gang"] for g in only["gangs"]] == ["team/run"] and only["total"] == 1
    admitted = (await client.get("/ui/api/gangs", params={"state": "admitted"})).json()
    assert [g["gang"] for g in admitted["gangs"]] == ["ml/adm"]
    bad = await client.get("/ui/api/gangs", params={"state": "sleeping"})
    assert bad.status_code == 400 and bad.json()["fields"] == ["state"]
    assert (await client.get("/ui/api/gangs", params={"limit": 0})).status_code == 400


async def test_racks_aggregate_and_one_rack_shows_each_gpu(client: httpx.AsyncClient,
                                                            service: Lockstep) -> None:
    await gangs_in_three_states(service)
    data = (await client.get("/ui/api/racks")).json()
    assert data["level"] == "rack"
    assert [r["name"] for r in data["racks"]] == ["r0", "r1"]
    assert data["totals"] == {"nodes": 4, "gpus": 16, "used": 2, "reserved": 4}
    assert sum(r["reserved"] for r in data["racks"]) == 4
    reserved_rack = next(r for r in data["racks"] if r["reserved"])
    assert reserved_rack["reservedFor"] == {"ml/adm": 4}
    rack = (await client.get("/ui/api/rack", params={"rack": reserved_rack["rack"]})).json()
    slots = [s for n in rack["nodes"] for s in n["slots"]]
    assert sorted(o for s, o in slots if s == "reserved") == ["ml/adm"] * 4
    first = rack["nodes"][0]
    assert first["islands"] == [2, 2] and first["numa"] == [2, 2]
    assert first["interconnect"] == "nvlink-pairs" and first["nvswitchDomain"] in ("c0", "c1")
    every = [s for r in data["racks"] for n in (await client.get(
        "/ui/api/rack", params={"rack": r["rack"]})).json()["nodes"] for s in n["slots"]]
    assert sorted(o for s, o in every if s == "used") == ["team/run", "team/run"]
    assert len(every) == 16
    missing = await client.get("/ui/api/rack", params={"rack": "nope"})
    assert missing.status_code == 404 and missing.json()["fields"] == ["rack"]


async def test_one_gangs_plan_members_and_events(client: httpx.AsyncClient,
                                                 service: Lockstep) -> None:
    await gangs_in_three_states(service)
    g = (await client.get("/ui/api/gang/ml/adm")).json()
    assert g["state"] == "admitted" and g["placedWithin"]
    assert {p["pod"] for p in g["plan"]} == {"ml/a0", "ml/a1"}
    assert all(p["node"] in NAMES and p["why"] for p in g["plan"])
    assert g["planWhy"].startswith("all members placed within one ")
    assert [m["state"] for m in g["memberPods"]] == ["pending", "pending"]
    assert [m["rank"] for m in g["memberPods"]] == ["1", "0"]
    assert {p["pod"]: p["rank"] for p in g["plan"]} == {"ml/a0": "1", "ml/a1": "0"}
    assert explain_pod(service, PodKey("ml/a1"))["rank"] == "0"
    assert explain_pod(service, PodKey("ml/w0"))["rank"] is None
    service.poster._remember("ml/adm", {
        "reason": "GangAdmitted", "message": "gang ml/adm admitted", "type": "Normal",
        "lastTimestamp": "2026-11-25T06:00:00Z", "involvedObject": {"name": "a0"}})
    g = (await client.get("/ui/api/gang/ml/adm")).json()
    assert g["events"] == [{"reason": "GangAdmitted", "message": "gang ml/adm admitted",
                            "type": "Normal", "lastTimestamp": "2026-11-25T06:00:00Z",
                            "pod": "a0"}]
    assert (await client.get("/ui/api/gang/ml/ghost")).status_code == 404


async def test_page_and_script_are_served(client: httpx.AsyncClient) -> None:
    page = await client.get("/ui")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'src="ui/ui.js"' in page.text
    js = await client.get("/ui/ui.js")
    assert js.status_code == 200 and "ui/api/gangs" in js.text


async def test_json_answers_loopback_or_the_token_only(service: Lockstep) -> None:
    async with await client_for(service, peer=("10.0.0.9", 5)) as c:
        for path in ("/ui/api/gangs", "/ui/api/racks", "/ui/api/rack?rack=r0",
                     "/ui/api/gang/ml/x"):
            assert (await c.get(path)).status_code == 403, path


async def test_ui_false_serves_nothing(service: Lockstep) -> None:
    async with await client_for(service, ui=False) as c:
        assert (await c.get("/ui")).status_code == 404
        assert (await c.get("/ui/api/gangs")).status_code == 404
        assert (await c.get("/debug/gangs")).status_code == 200


def test_history_is_bounded(service: Lockstep) -> None:
    from app.effects import poster
    for i in range(poster.HISTORY_GANGS + 5):
        for j in range(poster.HISTORY_PER_GANG + 3):
            service.poster._remember(f"ns/g{i}", {
                "reason": "R", "message": str(j), "type": "Normal", "lastTimestamp": "",
                "involvedObject": {"name": "p"}})
    h = service.poster.history
    assert len(h) == poster.HISTORY_GANGS and "ns/g0" not in h
    assert [e["message"] for e in h[f"ns/g{poster.HISTORY_GANGS + 4}"]] == [
        str(j) for j in range(3, poster.HISTORY_PER_GANG + 3)]


def test_ui_flag_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from app import cli
    parser = cli.argparse.ArgumentParser()
    cli._serve_parser(parser.add_subparsers())
    assert parser.parse_args(["serve"]).ui is True
    assert parser.parse_args(["serve", "--ui=false"]).ui is False
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--ui=maybe"])
    monkeypatch.setenv("LOCKSTEP_UI", "0")
    parser = cli.argparse.ArgumentParser()
    cli._serve_parser(parser.add_subparsers())
    assert parser.parse_args(["serve"]).ui is False


async def test_preemptions_in_flight_say_who_evicts_whom(client: httpx.AsyncClient,
                                                         service: Lockstep) -> None:
    # A low gang fills all 16 GPUs; a high 2 x 4-GPU gang evicts it whole.
    add(service, *(pod(f"l{i}", "batch").gang("low", min_member=4).gpu(4).priority(10)
                   .on(NAMES[i]).build() for i in range(4)))
    add(service, *(pod(f"h{i}", "prod").gang("high", min_member=2).gpu(4).priority(100)
                   .build() for i in range(2)))
    decision = service.filter(service.core.queries.pods["prod/h0"], [])  # type: ignore[index]
    assert decision.passed == [] and "preempting" in str(decision.unresolvable).lower()
    data = (await client.get("/ui/api/gangs")).json()
    (p,) = data["preemptions"]
    assert p["preemptor"] == "prod/high" and p["priority"] == 100
    assert p["victimGangs"] == ["batch/low"] and p["plainPods"] == 0
    assert p["victimPods"] == 4 and p["waitingFor"] == 4 and p["gpus"] == 16
    row = next(g for g in data["gangs"] if g["gang"] == "prod/high")
    assert "preempting 1 gang(s) (batch/low), 16 GPUs" in row["reason"]
