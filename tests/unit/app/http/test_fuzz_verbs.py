"""Property-based fuzzing of the HTTP edge: /filter, /prioritize, /bind and the debug GETs.

The in-process app (``extender_app``) runs on a real ``Lockstep`` service whose Kubernetes API
is faked in memory (``tests.fakeapi.Wire``: bindings succeed), reached through
``httpx.ASGITransport``. Hypothesis generates request bodies from several families:

* well-formed extender args for pods the cache knows (plain pods, members of a complete gang,
  of a gang still short of members, a bound pod), with known and unknown node names;
* the same args with random mutations (a value anywhere in the tree replaced by a random JSON
  value of another type, or deleted), duplicated and unicode node names, huge node lists
  (up to 20,000 names) and NodeList bodies;
* truncated JSON (a valid body cut anywhere), random bytes, random JSON documents;
* bodies over the size limit, with and without a Content-Length header.

Every answer must be a 2xx or a 4xx; a 4xx carries ``{"error": ..., "fields": [...]}`` naming
at least one field; 2xx answers keep the wire contract (filter returns only names it was
given, prioritize one score 0..10 per name). A rejected request must leave the service as it
was: the gang table (``core.queries.gang_views()``), ``parked_total()``, the
parked calls, and the pod and node caches are compared before and after each 4xx.

Accepted bind calls may park (an admitted gang waiting for its quorum): each request is given
``PARK_GRACE`` seconds and then cancelled, the way a client hanging up cancels it, which
exercises the abandon path too.

Budget: ``make test`` runs a seeded (derandomized) ``LOCKSTEP_FUZZ_VERBS_EXAMPLES`` examples
per verb (default 250, about 3 s each). The long run is opt-in:
``LOCKSTEP_FUZZ_VERBS_EXAMPLES=10000 make fuzz-verbs`` (at least 10,000 requests per verb;
``LOCKSTEP_FUZZ_VERBS_SEED=n`` picks a seed, default derandomized). Counts per verb (2xx,
4xx, 5xx, parked) are printed and written to ``run/fuzz-verbs-summary.json``.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import urllib.parse
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from app.kube.client import KubeClient, KubeConfig
from app.process import extender_app
from app.service import Lockstep
from coscheduling import Coscheduler, GangDefaults, Settings, node_from_json, pod_from_json
from coscheduling.events import ingest
from testbed.bins import REPO
from tests.builders import node, pod
from tests.fakeapi import Wire

EXAMPLES = int(os.environ.get("LOCKSTEP_FUZZ_VERBS_EXAMPLES", "250"))
SEED = os.environ.get("LOCKSTEP_FUZZ_VERBS_SEED")
MAX_BODY = 64 * 1024
PARK_GRACE = 0.05
NOW = 1000.0
SUMMARY = REPO / "run" / "fuzz-verbs-summary.json"

NODES = [f"n{i}" for i in range(6)]
counts: dict[str, Counter[str]] = {}


# ---------------------------------------------------------------------------- the service

class FakeAPI:
    """Every write succeeds; bindings are counted; a pod the cache does not know does not
    exist at the API server either (a read of it is a 404)."""

    def __init__(self) -> None:
        self.bindings = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/binding"):
            self.bindings += 1
        if request.method == "GET" and "/pods/" in request.url.path:
            return httpx.Response(404, json={"reason": "NotFound", "message": "not found"})
        return httpx.Response(201, json={})


def _known_pods() -> list[dict[str, Any]]:
    pods = [pod(f"web-{i}").gpu(1).build() for i in range(2)]
    pods += [pod(f"g-{i}").gang("g", min_member=3, timeout=30).gpu(1).build() for i in range(3)]
    pods += [pod(f"short-{i}").gang("short", min_member=4).gpu(1).build() for i in range(2)]
    pods += [pod("big-0").gang("big", min_member=2).gpu(2).build(),
             pod("big-1").gang("big", min_member=2).gpu(2).build()]
    pods.append(pod("done").gpu(1).on("n0").build())
    pods.append(pod("other", "team-b").gang("g", min_member=2).gpu(1).build())
    return pods


KNOWN_PODS = _known_pods()
"""Built once: the builders number UIDs from a global counter, and a strategy that drew
different UIDs on replay would make hypothesis's generation flaky."""


def known_pods() -> list[dict[str, Any]]:
    return copy.deepcopy(KNOWN_PODS)


class Harness:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        core = Coscheduler(Settings(backoff_seconds=5,
                                    defaults=GangDefaults(timeout_seconds=30,
                                                          max_timeout_seconds=60)))
        for i, name in enumerate(NODES):
            core.upsert(ingest.NODES, node_from_json(node(name).gpus(2).rack(f"r{i % 2}").build()))
        self.pods = known_pods()
        for p in self.pods:
            core.upsert_pod(pod_from_json(p))
        self.api = FakeAPI()
        kube = KubeClient(KubeConfig("http://api.test"), connect=Wire(self.api))
        self.service = Lockstep(core, kube, clock=lambda: NOW)
        app = extender_app(self.service, max_body=MAX_BODY)
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                        base_url="http://lockstep.test")

    def close(self) -> None:
        self.loop.run_until_complete(self.client.aclose())
        self.loop.run_until_complete(self.service.kube.aclose())
        self.loop.close()

    def state(self) -> tuple[Any, ...]:
        q = self.service.core.queries
        return (repr(q.gang_views()), q.parked_total(), len(q.pods),
                len(q.nodes), dict(q.pods), sorted(q.nodes),
                sorted(self.service.parked), self.api.bindings)

    def send(self, verb: str, method: str, path: str, content: Any = None,
             headers: dict[str, str] | None = None) -> httpx.Response | None:
        """One request; None when it was still pending (parked) after ``PARK_GRACE``."""
        async def go() -> httpx.Response:
            return await self.client.request(method, path, content=content, headers=headers)

        async def bounded() -> httpx.Response | None:
            try:
                return await asyncio.wait_for(go(), PARK_GRACE if verb == "bind" else 30)
            except TimeoutError:
                return None

        c = counts.setdefault(verb, Counter())
        c["requests"] += 1
        before = self.state()
        r = self.loop.run_until_complete(bounded())
        if r is None:
            c["parked"] += 1
            return None
        c[f"{r.status_code // 100}xx"] += 1
        assert r.status_code < 500, f"{method} {path} -> {r.status_code}: {r.text[:500]}"
        assert r.status_code // 100 in (2, 4), f"{method} {path} -> {r.status_code}"
        if r.status_code >= 400:
            body = r.json()
            assert isinstance(body.get("error"), str) and body["error"], body
            fields = body.get("fields")
            assert isinstance(fields, list) and fields, f"4xx names no field: {body}"
            assert all(isinstance(f, str) and f for f in fields), body
            assert self.state() == before, f"rejected {method} {path} changed state: {body}"
        return r


@pytest.fixture
def harness() -> Any:
    h = Harness()
    yield h
    h.close()


def fuzz_settings(f: Callable[..., None]) -> Callable[..., None]:
    s = settings(max_examples=EXAMPLES, deadline=None, database=None,
                 derandomize=SEED is None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                        HealthCheck.large_base_example])
    f = s(f)
    return seed(int(SEED))(f) if SEED is not None else f


def report(verb: str) -> None:
    c = counts.get(verb, Counter())
    extra = f" ({c['bound']} bound, {c['refused']} refused)" if verb == "bind" else ""
    print(f"\nfuzz {verb}: {c['requests']} requests: {c['2xx']} 2xx{extra}, {c['4xx']} 4xx, "
          f"{c['5xx']} 5xx, {c['parked']} parked (cancelled after {PARK_GRACE}s)")
    SUMMARY.parent.mkdir(exist_ok=True)
    old = json.loads(SUMMARY.read_text()) if SUMMARY.exists() else {}
    old[verb] = {**dict(c), "examples_budget": EXAMPLES, "seed": SEED or "derandomized"}
    SUMMARY.write_text(json.dumps(old, indent=2, sort_keys=True) + "\n")


# ---------------------------------------------------------------------------- strategies

scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
           | st.floats(allow_nan=False) | st.text(max_size=12))
json_values = st.recursive(
    scalars,
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=12)
names = (st.sampled_from(NODES) | st.sampled_from(["", " ", "ghost", "N0", "n0\x00", "ñ0",
                                                   "n" * 300, "../n0", "🚀"])
         | st.text(max_size=20))


def paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += paths(v, (*prefix, i))
    return out


@st.composite
def mutated(draw: st.DrawFn, base: Any) -> Any:
    """``base`` with 1-3 values somewhere in its tree replaced by random JSON, or deleted."""
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(paths(doc)))
        if not where:
            doc = draw(json_values)
            continue
        parent = doc
        try:
            for k in where[:-1]:
                parent = parent[k]
            if draw(st.booleans()) and isinstance(parent, dict):
                parent.pop(where[-1], None)
            else:
                parent[where[-1]] = draw(json_values)
        except (KeyError, IndexError, TypeError):
            continue
    return doc


@st.composite
def node_names(draw: st.DrawFn) -> list[str]:
    kind = draw(st.sampled_from(["known", "mixed", "dupes", "huge"]))
    if kind == "known":
        return draw(st.lists(st.sampled_from(NODES), max_size=6, unique=True))
    if kind == "mixed":
        return draw(st.lists(names, max_size=12))
    if kind == "dupes":
        return draw(st.lists(st.sampled_from(NODES[:2]), min_size=2, max_size=8))
    n = draw(st.integers(500, 20_000))
    return [NODES[i % len(NODES)] if i % 3 else f"ghost-{i}" for i in range(n)]


@st.composite
def extender_args(draw: st.DrawFn) -> Any:
    p = draw(st.sampled_from(known_pods()))
    if draw(st.integers(0, 4)) == 0:  # a pod the cache has never seen
        p = copy.deepcopy(p)
        p["metadata"]["name"] = draw(st.text(min_size=1, max_size=30))
    listed = draw(node_names())
    if draw(st.integers(0, 5)) == 0:
        items = [node(n).gpus(2).build() if n in NODES else {"metadata": {"name": n}}
                 for n in listed[:200]]
        args: dict[str, Any] = {"Pod": p, "Nodes": {"items": items}, "NodeNames": None}
    else:
        args = {"Pod": p, "Nodes": None, "NodeNames": listed}
    if draw(st.integers(0, 2)) == 0 and len(listed) < 100:
        args = draw(mutated(args))
    return args


def dumps(doc: Any) -> bytes:
    """orjson, or the standard library for integers beyond 64 bits (valid JSON all the same)."""
    try:
        return orjson.dumps(doc)
    except TypeError:
        return json.dumps(doc, ensure_ascii=False).encode()


def raw_families(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[tuple[str, Any]]:
    def truncated(doc: Any) -> st.SearchStrategy[tuple[str, Any]]:
        data = dumps(doc)
        return st.integers(0, max(0, len(data) - 1)).map(lambda i: ("truncated", data[:i]))

    return st.one_of(
        valid.map(lambda d: ("valid", d)),
        valid.map(lambda d: ("valid", d)),
        valid.flatmap(truncated),
        st.binary(max_size=200).map(lambda b: ("bytes", b)),
        json_values.map(lambda d: ("json", dumps(d))),
        st.integers(MAX_BODY + 1, 3 * MAX_BODY).map(lambda n: ("oversized", n)),
        st.integers(MAX_BODY + 1, 3 * MAX_BODY).map(lambda n: ("oversized-chunked", n)),
    )


def encode(family: str, value: Any) -> tuple[Any, dict[str, str]]:
    headers = {"Content-Type": "application/json"}
    if family == "valid":
        return dumps(value), headers
    if family in ("truncated", "bytes", "json"):
        return value, headers
    body = b'{"Pod": {}, "NodeNames": ["' + b"x" * value + b'"]}'
    if family == "oversized":
        return body, headers

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(body), 8192):
            yield body[i:i + 8192]

    return chunks(), headers  # no Content-Length: the limit must hold while streaming


# ---------------------------------------------------------------------------- the verbs

def check_filter(r: httpx.Response, family: str, value: Any) -> None:
    if family != "valid" or r.status_code != 200:
        return
    out = r.json()
    if value.get("NodeNames") is not None:
        given_names = set(value["NodeNames"])
        assert set(out["NodeNames"]) <= given_names, out
    assert set(out["FailedNodes"]) | set(out["FailedAndUnresolvableNodes"]) <= set(
        value.get("NodeNames") or [n["metadata"]["name"]
                                   for n in (value.get("Nodes") or {}).get("items", [])])


def check_prioritize(r: httpx.Response, family: str, value: Any) -> None:
    if family != "valid" or r.status_code != 200:
        return
    out = r.json()
    listed = value["NodeNames"] if value.get("NodeNames") is not None else [
        n["metadata"]["name"] for n in value["Nodes"]["items"]]
    assert [h["Host"] for h in out] == listed
    assert all(isinstance(h["Score"], int) and 0 <= h["Score"] <= 10 for h in out)


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_fuzz_filter_and_prioritize(harness: Harness, verb: str) -> None:
    check = check_filter if verb == "filter" else check_prioritize

    @fuzz_settings
    @given(raw_families(extender_args()))
    def run(case: tuple[str, Any]) -> None:
        family, value = case
        content, headers = encode(family, value)
        r = harness.send(verb, "POST", f"/{verb}", content, headers)
        assert r is not None
        check(r, family, value)

    run()
    report(verb)
    assert counts[verb]["5xx"] == 0


@st.composite
def binding_args(draw: st.DrawFn) -> Any:
    p = draw(st.sampled_from(known_pods()))
    meta = p["metadata"]
    real = draw(st.integers(0, 3)) > 0  # mostly a pod the cache knows, on a known node
    args: dict[str, Any] = {
        "PodName": meta["name"] if real else draw(names),
        "PodNamespace": meta["namespace"] if real else draw(
            st.sampled_from(["default", "x"]) | st.text(max_size=70)),
        "PodUID": draw(st.sampled_from(["", meta["uid"], "uid-0"]) | st.text(max_size=10)),
        "Node": draw(st.sampled_from(NODES)) if real else draw(names),
    }
    if draw(st.integers(0, 2)) == 0:
        args = draw(mutated(args))
    return args


def test_fuzz_bind(harness: Harness) -> None:
    """Bind calls, including real gang members on the nodes their admitted gang planned
    (filter runs first for those, so the gang is admitted and the call parks or binds)."""
    core = harness.service.core

    @fuzz_settings
    @given(raw_families(binding_args()), st.integers(0, 1))
    def run(case: tuple[str, Any], admit: int) -> None:
        family, value = case
        if family == "valid" and admit == 0 and isinstance(value, dict):
            key = f"{value.get('PodNamespace')}/{value.get('PodName')}"
            p = core.queries.pod(key)  # type: ignore[arg-type]
            if p is not None and p.node_name is None:
                d = harness.service.filter(p, NODES)
                if d.unresolvable is None and d.passed:
                    value = {**value, "Node": d.passed[0]}
        content, headers = encode(family, value)
        r = harness.send("bind", "POST", "/bind", content, headers)
        if r is not None and r.status_code == 200:
            counts["bind"]["bound" if r.json()["Error"] == "" else "refused"] += 1

    run()
    report("bind")
    assert counts["bind"]["5xx"] == 0


@st.composite
def debug_requests(draw: st.DrawFn) -> tuple[str, str]:
    which = draw(st.sampled_from(["gangs", "nodes", "pod", "pod", "pod", "method"]))
    if which in ("gangs", "nodes"):
        query = draw(st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2))
        return "GET", f"/debug/{which}?{urllib.parse.urlencode(query)}"
    if which == "method":
        return draw(st.sampled_from(["POST", "PUT", "DELETE"])), draw(
            st.sampled_from(["/debug/gangs", "/debug/nodes", "/debug/pods/default/g-0"]))
    p = draw(st.sampled_from(known_pods()))
    ns = draw(st.just(p["metadata"]["namespace"]) | st.text(max_size=70))
    name = draw(st.just(p["metadata"]["name"]) | names | st.text(max_size=300))
    quote = draw(st.booleans())
    enc = (lambda s: urllib.parse.quote(s, safe="")) if quote else (
        lambda s: urllib.parse.quote(s, safe="/"))
    return "GET", f"/debug/pods/{enc(ns)}/{enc(name)}"


def test_fuzz_debug_endpoints(harness: Harness) -> None:
    # Some state worth explaining: an admitted gang and a gang short of members.
    core = harness.service.core
    harness.service.filter(core.queries.pods["default/g-0"], NODES)  # type: ignore[index]
    harness.service.filter(core.queries.pods["default/short-0"], NODES)  # type: ignore[index]

    @fuzz_settings
    @given(debug_requests())
    def run(req: tuple[str, str]) -> None:
        method, path = req
        r = harness.send("debug", method, path)
        assert r is not None
        if r.status_code == 200:
            r.json()

    run()
    report("debug")
    assert counts["debug"]["5xx"] == 0


# ---------------------------------------------------------------------------- regressions
# What the fuzzer found (and the same class of bug read off the parsing path it reached),
# pinned: each was an unhandled exception (a 500) or a 4xx naming no
# field before app/http/wire.py's PodShape and the edge's handlers.

def _with(path: str, value: Any) -> bytes:
    p = pod("web-0").gpu(1).build()
    target = p
    keys = path.split(".")
    for k in keys[:-1]:
        target = target.setdefault(k, {})
    target[keys[-1]] = value
    return orjson.dumps({"Pod": p, "NodeNames": NODES})


@pytest.mark.parametrize(("verb", "body", "field"), [
    ("filter", _with("spec.containers", [None]), "Pod.spec.containers.0"),
    ("filter", _with("spec.containers", [{"resources": []}]), "Pod.spec.containers.0.resources"),
    ("filter", _with("spec.affinity", "x"), "Pod.spec.affinity"),
    ("filter", _with("spec.affinity", {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [5]}]}}}),
     "Pod.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution."
     "nodeSelectorTerms.0.matchExpressions.0"),
    ("filter", _with("spec.tolerations", [{"key": ["k"]}]), "Pod.spec.tolerations.0.key"),
    ("prioritize", _with("spec.priority", "high"), "Pod.spec.priority"),
    ("prioritize", _with("spec.nodeName", ["n0"]), "Pod.spec.nodeName"),
    ("prioritize", _with("status", [1]), "Pod.status"),
    ("filter", orjson.dumps({"Pod": pod("web-0").build(), "NodeNames": None,
                             "Nodes": {"items": [{"metadata": "n0"}]}}),
     "Nodes.items.0.metadata.name"),
    ("filter", b"", "body"),
    ("bind", b"x" * (2 * 1024 * 1024), "body"),
])
def test_found_by_fuzzing_is_a_4xx_naming_the_field(
    harness: Harness, verb: str, body: bytes, field: str,
) -> None:
    r = harness.send(verb, "POST", f"/{verb}", body, {"Content-Type": "application/json"})
    assert r is not None and 400 <= r.status_code < 500, r and r.text
    assert field in r.json()["fields"], r.json()


def test_routing_errors_name_the_field(harness: Harness) -> None:
    r = harness.send("debug", "POST", "/debug/gangs")
    assert r is not None and r.status_code == 405 and r.json()["fields"] == ["method"]
    r = harness.send("debug", "GET", "/debug/pods/default/a/b")
    assert r is not None and r.status_code == 404 and r.json()["fields"] == ["path"]
    for method, path in (("GET", "/debug/gangs/"), ("POST", "/filter/")):  # were 307s
        r = harness.send("debug", method, path)
        assert r is not None and r.status_code == 404 and r.json()["fields"] == ["path"]
