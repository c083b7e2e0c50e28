"""Node lists as protobuf (``app.kube.nodeproto``), against answers captured from kube-apiserver
v1.34 (``tests/fixtures/nodeproto/capture.py``): the same nodes must make the same records
as their JSON, and the client must ask for protobuf, accept JSON, and read protobuf errors.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from app.kube.client import KubeClient, KubeConfig
from app.kube.errors import APIError
from app.kube.nodeproto import decode_node_list, decode_status
from coscheduling import node_from_json
from testbed.bins import REPO

from .test_fasthttp import Seen, serving

FIXTURES = REPO / "tests" / "fixtures" / "nodeproto"


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def test_the_same_nodes_make_the_same_records_as_their_json() -> None:
    from_pb = [node_from_json(n) for n in decode_node_list(fixture("nodes.pb"))["items"]]
    from_json = [node_from_json(n) for n in orjson.loads(fixture("nodes.json"))["items"]]
    assert from_pb == from_json
    by_name = {n.name: n for n in from_pb}
    # the fixture holds what could go wrong: taints with and without a value, a cordon,
    # extended resources and topology labels
    assert by_name["gpu-b"].taints == (
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
        {"key": "maintenance", "effect": "NoExecute"})
    assert by_name["cpu-c"].unschedulable and not by_name["gpu-a"].unschedulable
    assert by_name["gpu-a"].labels["lockstep.dev/rack"] == "r0"
    assert by_name["gpu-a"].allocatable != by_name["gpu-b"].allocatable


def test_a_page_carries_the_continue_token_and_resource_version() -> None:
    page = decode_node_list(fixture("nodes-page1.pb"))
    assert len(page["items"]) == 2
    assert page["metadata"]["continue"] and page["metadata"]["resourceVersion"].isdigit()
    assert decode_node_list(fixture("nodes.pb"))["metadata"]["continue"] == ""


def test_errors_come_as_a_status() -> None:
    bad = decode_status(fixture("status-400.pb"))
    assert (bad["code"], bad["reason"]) == (400, "BadRequest")
    assert "invalid continue token" in bad["message"]
    assert decode_status(fixture("status-404.pb"))["reason"] == "NotFound"


@pytest.mark.parametrize("data", [fixture("nodes.json"), b"", b"k8s\x00\xff\xff\xff",
                                  fixture("nodes.pb")[:-7]])
def test_anything_else_is_a_value_error(data: bytes) -> None:
    with pytest.raises(ValueError):
        decode_node_list(data)


def _serve_bytes(body: bytes, status: int, ctype: str) -> Any:
    async def handler(req: Seen, w: asyncio.StreamWriter) -> bool:
        w.write(b"HTTP/1.1 %d X\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s"
                % (status, ctype.encode(), len(body), body))
        await w.drain()
        return True
    return handler


@pytest.mark.parametrize("answer", ["protobuf", "json"])
async def test_the_node_list_asks_for_protobuf_and_takes_either(answer: str) -> None:
    body, ctype = ((fixture("nodes.pb"), "application/vnd.kubernetes.protobuf")
                   if answer == "protobuf" else (fixture("nodes.json"), "application/json"))
    async with serving({"/api/v1/nodes": _serve_bytes(body, 200, ctype)}) as srv:
        kube = KubeClient(KubeConfig(srv.url))
        nodes, rv = await kube.list_parsed("/api/v1/nodes", node_from_json,
                                           protobuf=decode_node_list)
        pods = await kube.request("GET", "/api/v1/pods")
        await kube.aclose()
    assert sorted(n.name for n in nodes) == ["cpu-c", "gpu-a", "gpu-b"] and rv
    accept = [s.headers["accept"] for s in srv.seen]
    assert accept[0] == "application/vnd.kubernetes.protobuf, application/json"
    assert accept[1] == "application/json" and pods["path"] == "/api/v1/pods"


async def test_a_protobuf_error_is_an_api_error_with_its_message() -> None:
    handler = _serve_bytes(fixture("status-400.pb"), 400, "application/vnd.kubernetes.protobuf")
    async with serving({"/api/v1/nodes": handler}) as srv:
        kube = KubeClient(KubeConfig(srv.url))
        with pytest.raises(APIError, match="invalid continue token") as e:
            await kube.list_parsed("/api/v1/nodes", node_from_json, protobuf=decode_node_list)
        await kube.aclose()
    assert e.value.status == 400 and e.value.reason == "BadRequest"
