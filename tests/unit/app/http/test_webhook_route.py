"""The gang-gate webhook: the "does this pod declare a gang" predicate and POST /mutate/pods.

The route runs in-process on ``extender_app`` (the extender's port) and ``webhook_app``
(the webhook's own port) with the Kubernetes API faked: the webhook never calls it.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.http.webhook import MAX_BODY
from app.kube.client import KubeClient, KubeConfig
from app.process import extender_app, webhook_app
from app.service import Lockstep
from coscheduling import Coscheduler, Settings, pod_from_json
from coscheduling.conventions import declarations as _declarations
from coscheduling.gang.gating import GANG_GATE, declares_gang
from tests.fakeapi import Wire

# ---------------------------------------------------------------------------- the predicate

DECLARATIONS = [
    pytest.param("annotations", "lockstep.dev/pod-group", id="lockstep-annotation"),
    pytest.param("labels", "lockstep.dev/pod-group", id="lockstep-label"),
    pytest.param("labels", "scheduling.x-k8s.io/pod-group", id="scheduler-plugins"),
    pytest.param("annotations", "scheduling.k8s.io/group-name", id="volcano"),
    pytest.param("annotations", "scheduling.volcano.sh/group-name", id="volcano-own-key"),
    pytest.param("annotations", "gang.scheduling.koordinator.sh/name", id="koordinator"),
    pytest.param("labels", "pod-group.scheduling.sigs.k8s.io/name", id="koordinator-light"),
    pytest.param("labels", "kueue.x-k8s.io/pod-group-name", id="kueue-label"),
    pytest.param("annotations", "kueue.x-k8s.io/pod-group-name", id="kueue-annotation"),
]


def raw_pod(*, labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
            spec: dict[str, Any] | None = None, name: str = "p") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ml", "labels": labels or {},
                         "annotations": annotations or {}},
            "spec": {"schedulerName": "lockstep",
                     "containers": [{"name": "c", "image": "i"}], **(spec or {})}}


@pytest.mark.parametrize(("where", "key"), DECLARATIONS)
def test_every_convention_lockstep_reads_declares_a_gang(where: str, key: str) -> None:
    assert declares_gang(raw_pod(**{where: {key: "train"}}))
    assert not declares_gang(raw_pod(**{where: {key: ""}}))  # empty is no declaration


@pytest.mark.parametrize(("where", "key"), [
    pytest.param("annotations", "scheduling.x-k8s.io/pod-group", id="sp-as-annotation"),
    pytest.param("labels", "scheduling.k8s.io/group-name", id="volcano-as-label"),
    pytest.param("labels", "gang.scheduling.koordinator.sh/name", id="koord-as-label"),
    pytest.param("annotations", "lockstep.dev/min-member", id="size-without-name"),
])
def test_keys_in_places_lockstep_does_not_read_declare_nothing(where: str, key: str) -> None:
    assert not declares_gang(raw_pod(**{where: {key: "train"}}))


@pytest.mark.parametrize("spec", [
    pytest.param({"schedulingGroup": {"podGroupName": "pg"}}, id="scheduling-group"),
    pytest.param({"workloadRef": {"name": "w", "podGroup": "workers"}}, id="workload-ref"),
])
def test_upstream_gang_api_declares_a_gang(spec: dict[str, Any]) -> None:
    assert declares_gang(raw_pod(spec=spec))


@pytest.mark.parametrize("obj", [
    pytest.param({}, id="empty"),
    pytest.param({"metadata": None, "spec": None}, id="nulls"),
    pytest.param({"metadata": {"labels": ["x"], "annotations": "x"}}, id="wrong-types"),
    pytest.param({"spec": {"schedulingGroup": "pg"}}, id="group-not-object"),
    pytest.param({"spec": {"schedulingGroup": {"podGroupName": ""}}}, id="group-empty"),
    pytest.param({"spec": {"workloadRef": {"podGroup": "workers"}}}, id="ref-without-name"),
    pytest.param(raw_pod(labels={"app": "web"}), id="plain"),
])
def test_no_declaration(obj: dict[str, Any]) -> None:
    assert not declares_gang(obj)


KEYS = [str(p.values[1]) for p in DECLARATIONS] + [
    "scheduling.volcano.sh/group-min-member", "app", "lockstep.dev/min-member"]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.dictionaries(st.sampled_from(KEYS), st.sampled_from(["", "g", "h"]), max_size=4),
       st.dictionaries(st.sampled_from(KEYS), st.sampled_from(["", "g", "h"]), max_size=4))
def test_predicate_agrees_with_what_resolve_reads(labels: dict[str, str],
                                                  annotations: dict[str, str]) -> None:
    """The keys ``podgroup.resolve`` looks at, and nothing else (it may not drift)."""
    obj = raw_pod(labels=labels, annotations=annotations)
    assert declares_gang(obj) == bool(_declarations(pod_from_json(obj)))


# ---------------------------------------------------------------------------- the route


class NoAPI:
    def __call__(self, request: httpx.Request) -> httpx.Response:
        raise AssertionError(f"the webhook called the API: {request.method} {request.url}")


@pytest.fixture
def service() -> Lockstep:
    core = Coscheduler(Settings(scheduler_names=frozenset({"lockstep", "lockstep-b"})))
    kube = KubeClient(KubeConfig("http://api.test"), connect=Wire(NoAPI()))
    return Lockstep(core, kube)


@pytest.fixture(params=["extender-port", "webhook-port"])
async def client(request: pytest.FixtureRequest, service: Lockstep
                 ) -> AsyncIterator[httpx.AsyncClient]:
    app = (extender_app(service) if request.param == "extender-port"
           else webhook_app(service))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://lockstep.test") as c:
        yield c


def review(obj: dict[str, Any] | None, *, operation: str = "CREATE", uid: str = "u-1",
           kind: str = "Pod", sub_resource: str | None = None) -> dict[str, Any]:
    req: dict[str, Any] = {
        "uid": uid, "kind": {"group": "", "version": "v1", "kind": kind},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": kind},
        "namespace": "ml", "operation": operation,
        "userInfo": {"username": "system:serviceaccount:kubeflow:training-operator"},
        "object": obj, "oldObject": None, "dryRun": False,
        "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
    }
    if sub_resource:
        req["subResource"] = sub_resource
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}


def apply_patch(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 ``add``, the only operation the webhook writes."""
    out = copy.deepcopy(obj)
    for op in ops:
        assert op["op"] == "add"
        *parents, last = op["path"].lstrip("/").split("/")
        target = out
        for p in parents:
            target = target[p]
        if last == "-":
            target.append(op["value"])
        else:
            target[last] = op["value"]
    return out


async def mutate(client: httpx.AsyncClient, obj: dict[str, Any] | None, **kw: Any
                 ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The response part and the decoded patch ([] when there is none)."""
    r = await client.post("/mutate/pods", json=review(obj, **kw))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    resp = body["response"]
    assert resp["uid"] == kw.get("uid", "u-1")
    assert resp["allowed"] is True  # never a denial
    if "patch" not in resp:
        assert "patchType" not in resp
        return resp, []
    assert resp["patchType"] == "JSONPatch"
    return resp, json.loads(base64.b64decode(resp["patch"]))


def gates(obj: dict[str, Any]) -> list[str]:
    return [g["name"] for g in obj["spec"].get("schedulingGates") or ()]


@pytest.mark.parametrize(("where", "key"), DECLARATIONS)
async def test_gang_pod_gets_the_gate(client: httpx.AsyncClient, where: str, key: str) -> None:
    obj = raw_pod(**{where: {key: "train"}})
    _, patch = await mutate(client, obj)
    assert patch == [{"op": "add", "path": "/spec/schedulingGates",
                      "value": [{"name": GANG_GATE}]}]
    assert gates(apply_patch(obj, patch)) == [GANG_GATE]


async def test_gate_is_appended_to_other_gates(client: httpx.AsyncClient) -> None:
    obj = raw_pod(labels={"kueue.x-k8s.io/pod-group-name": "g"},
                  spec={"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]})
    _, patch = await mutate(client, obj)
    assert gates(apply_patch(obj, patch)) == ["kueue.x-k8s.io/admission", GANG_GATE]


@pytest.mark.parametrize("empty", [[], None])
async def test_empty_gate_list_is_replaced(client: httpx.AsyncClient, empty: Any) -> None:
    obj = raw_pod(annotations={"lockstep.dev/pod-group": "g"}, spec={"schedulingGates": empty})
    _, patch = await mutate(client, obj)
    assert gates(apply_patch(obj, patch)) == [GANG_GATE]


async def test_every_scheduler_name_of_lockstep_counts(client: httpx.AsyncClient) -> None:
    obj = raw_pod(annotations={"lockstep.dev/pod-group": "g"},
                  spec={"schedulerName": "lockstep-b"})
    _, patch = await mutate(client, obj)
    assert gates(apply_patch(obj, patch)) == [GANG_GATE]


async def test_upstream_pod_gets_the_gate(client: httpx.AsyncClient) -> None:
    obj = raw_pod(spec={"schedulingGroup": {"podGroupName": "pg"}})
    _, patch = await mutate(client, obj)
    assert gates(apply_patch(obj, patch)) == [GANG_GATE]


@pytest.mark.parametrize("obj", [
    pytest.param(raw_pod(annotations={"lockstep.dev/pod-group": "g"},
                         spec={"schedulingGates": [{"name": "x.dev/a"}, {"name": GANG_GATE}]}),
                 id="already-gated"),
    pytest.param(raw_pod(annotations={"lockstep.dev/pod-group": "g"},
                         spec={"nodeName": "n0"}), id="bound-by-its-creator"),
    pytest.param(raw_pod(labels={"app": "web"}), id="plain-pod"),
    pytest.param(raw_pod(annotations={"lockstep.dev/pod-group": "g"},
                         spec={"schedulerName": "default-scheduler"}), id="other-scheduler"),
    pytest.param(raw_pod(labels={"scheduling.x-k8s.io/pod-group": "g"},
                         spec={"schedulerName": "volcano"}), id="volcano-scheduler"),
])
async def test_no_patch(client: httpx.AsyncClient, obj: dict[str, Any]) -> None:
    _, patch = await mutate(client, obj)
    assert patch == []


@pytest.mark.parametrize(("operation", "kind", "sub", "obj"), [
    pytest.param("UPDATE", "Pod", None, raw_pod(annotations={"lockstep.dev/pod-group": "g"}),
                 id="update"),
    pytest.param("DELETE", "Pod", None, None, id="delete-without-object"),
    pytest.param("CONNECT", "PodExecOptions", "exec", {"kind": "PodExecOptions"}, id="exec"),
    pytest.param("CREATE", "Binding", "binding", {"target": {"name": "n0"}}, id="binding"),
    pytest.param("CREATE", "Eviction", "eviction", {"kind": "Eviction"}, id="eviction"),
])
async def test_anything_but_a_pod_create_is_allowed_unchanged(
    client: httpx.AsyncClient, operation: str, kind: str, sub: str | None,
    obj: dict[str, Any] | None,
) -> None:
    _, patch = await mutate(client, obj, operation=operation, kind=kind, sub_resource=sub)
    assert patch == []


async def test_decisions_are_counted(client: httpx.AsyncClient, service: Lockstep) -> None:
    def count(decision: str) -> float:
        return service.metrics.registry.get_sample_value(
            "lockstep_webhook_admissions_total", {"decision": decision}) or 0.0

    await mutate(client, raw_pod(annotations={"lockstep.dev/pod-group": "g"}))
    await mutate(client, raw_pod(annotations={"lockstep.dev/pod-group": "g"}))
    await mutate(client, raw_pod())
    await mutate(client, raw_pod(spec={"schedulerName": "default-scheduler"}))
    await client.post("/mutate/pods", content=b"{")
    assert (count("gated"), count("no-gang"), count("other-scheduler"),
            count("malformed")) == (2, 1, 1, 1)


GOOD = review(raw_pod(annotations={"lockstep.dev/pod-group": "g"}))


def without(path: str) -> bytes:
    doc = copy.deepcopy(GOOD)
    *parents, last = path.split(".")
    target = doc
    for p in parents:
        target = target[p]
    del target[last]
    return json.dumps(doc).encode()


def setting(path: str, value: Any) -> bytes:
    doc = copy.deepcopy(GOOD)
    *parents, last = path.split(".")
    target = doc
    for p in parents:
        target = target[p]
    target[last] = value
    return json.dumps(doc).encode()


@pytest.mark.parametrize(("raw", "field"), [
    pytest.param(b"", "body", id="empty"),
    pytest.param(b"{not json", "body", id="not-json"),
    pytest.param(b"[]", "body", id="not-an-object"),
    pytest.param(without("request"), "request", id="no-request"),
    pytest.param(without("request.uid"), "request.uid", id="no-uid"),
    pytest.param(setting("request.uid", ""), "request.uid", id="empty-uid"),
    pytest.param(without("request.kind"), "request.kind", id="no-kind"),
    pytest.param(setting("request.operation", "PATCH"), "request.operation", id="bad-operation"),
    pytest.param(setting("apiVersion", "admission.k8s.io/v1beta1"), "apiVersion",
                 id="v1beta1"),
    pytest.param(setting("kind", "Pod"), "kind", id="not-a-review"),
    pytest.param(setting("request.object", None), "request.object", id="create-without-pod"),
    pytest.param(setting("request.object", "pod"), "request.object", id="pod-not-object"),
    pytest.param(without("request.object.spec"), "request.object.spec", id="pod-without-spec"),
    pytest.param(setting("request.object.spec.schedulerName", 7),
                 "request.object.spec.schedulerName", id="scheduler-name-not-string"),
    pytest.param(setting("request.object.spec.schedulingGates", [{"nom": "x"}]),
                 "request.object.spec.schedulingGates.0.name", id="gate-without-name"),
    pytest.param(setting("request.object.metadata.annotations", {"a": 1}),
                 "request.object.metadata.annotations.a", id="annotation-not-string"),
])
async def test_malformed_review_is_a_400_naming_the_field(
    client: httpx.AsyncClient, raw: bytes, field: str,
) -> None:
    r = await client.post("/mutate/pods", content=raw,
                          headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    body = r.json()
    assert field in body["fields"], body
    assert body["error"]


async def test_oversized_body_is_a_413(client: httpx.AsyncClient) -> None:
    r = await client.post("/mutate/pods", content=b"{" + b" " * MAX_BODY + b"}")
    assert r.status_code == 413
    assert r.json()["fields"] == ["body"]


async def test_webhook_port_serves_only_the_webhook(service: Lockstep) -> None:
    app = webhook_app(service)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="https://lockstep.test") as c:
        assert (await c.get("/healthz")).text == "ok"
        for path in ("/filter", "/bind", "/debug/gangs", "/metrics", "/docs", "/openapi.json"):
            r = await c.request("POST" if path in ("/filter", "/bind") else "GET", path)
            assert r.status_code == 404, path
            assert r.json()["fields"] == ["path"]
        assert (await c.get("/mutate/pods")).status_code == 405


# ---------------------------------------------------------------------------- fuzz

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=3),
    max_leaves=8,
)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def mutated_reviews(draw: st.DrawFn) -> bytes:
    doc = copy.deepcopy(GOOD)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(doc)))
        if not path:
            doc = draw(JSON)
            continue
        parent = doc
        for p in path[:-1]:
            parent = parent[p]
        if draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(JSON)
    return json.dumps(doc).encode()


BODIES = mutated_reviews() | st.binary(max_size=64) | JSON.map(lambda d: json.dumps(d).encode())


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=BODIES)
async def test_no_body_makes_a_5xx(service: Lockstep, raw: bytes) -> None:
    app = webhook_app(service)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="https://lockstep.test") as c:
        r = await c.post("/mutate/pods", content=raw,
                         headers={"Content-Type": "application/json"})
    assert r.status_code in (200, 400), (r.status_code, r.text, raw)
    body = r.json()
    if r.status_code == 400:
        assert body["fields"] and body["error"]
    else:
        assert body["response"]["allowed"] is True


async def test_a_claim_review_is_answered_with_the_cores_narrowing(
        client: httpx.AsyncClient) -> None:
    """POST /mutate/resourceclaims: a claim no plan holds is allowed unchanged (the
    narrowing itself: tests/unit/coscheduling/devices/test_devices.py)."""
    claim = {"metadata": {"name": "p-gpu", "namespace": "ml"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                 "deviceClassName": "gpu"}}]}}}
    r = await client.post("/mutate/resourceclaims", json=review(claim, kind="ResourceClaim"))
    assert r.status_code == 200
    assert r.json()["response"] == {"uid": "u-1", "allowed": True}
    bad = await client.post("/mutate/resourceclaims", json={"kind": "AdmissionReview"})
    assert bad.status_code == 400


async def test_a_standby_never_narrows_a_claim() -> None:
    """A standby's plans may be stale (its view is rebuilt before it acts), so it narrows
    no claim: kube-scheduler's first fit and the leader's bind check handle an unnarrowed
    one. The acting replica narrows as its plan says."""
    from fastapi import FastAPI
    from prometheus_client import CollectorRegistry
    from prometheus_client import Counter as PromCounter

    from app.http.webhook import admission_router

    acting = [False]
    op = [{"op": "replace", "path": "/spec/devices/requests/0/firstAvailable", "value": []}]
    fapp = FastAPI()
    fapp.include_router(admission_router(
        frozenset({"default-scheduler"}),
        PromCounter("d", "d", ["decision"], registry=CollectorRegistry()),
        None, lambda: acting[0], lambda _ns, _obj: op))
    claim = {"metadata": {"name": "p-gpu", "namespace": "ml"}, "spec": {}}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=fapp),
                                 base_url="https://lockstep.test") as c:
        standby = await c.post("/mutate/resourceclaims",
                               json=review(claim, kind="ResourceClaim"))
        acting[0] = True
        leader = await c.post("/mutate/resourceclaims",
                              json=review(claim, kind="ResourceClaim"))
    assert standby.json()["response"] == {"uid": "u-1", "allowed": True}
    patch = leader.json()["response"]["patch"]
    assert json.loads(base64.b64decode(patch)) == op
