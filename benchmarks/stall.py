"""Does the event loop stall? Verbs and ``/healthz`` latency while the worst cases run.

Lockstep answers every verb, the webhook and the probes from one asyncio loop; work that
runs on it without yielding delays all of them. This benchmark serves a real Lockstep app
(``extender_app``, in a process of its own, as ``benchmarks.verbs_server`` does) over a
synthetic core, and measures from another process, one request at a time per probe:

* ``/healthz``, ``/filter`` of a plain pod, ``/bind`` of a plain pod (bindings go to a stub
  API server in the client process that answers 201);

first with nothing else running (``idle``), then while a worst case runs:

* ``preemption``: the cluster (``--nodes`` x 8 GPUs, racks and blocks) is full of bound,
  lower-priority pods and 2-member gangs, except a few free nodes for the probes' plain
  pods; a 64 x 8-GPU gang of higher priority asks, through ``/filter``, and finds no room:
  the core searches for victims. ``gangs`` such gangs ask one after another.
* ``hostile``: 100 hostile pods arrive, each through the admission webhook
  (``/mutate/pods``) and then ``/filter`` (which learns a pod the watch has not delivered,
  through the same ingest as the watch): huge, negative, zero, non-numeric and 5,000-digit
  sizes in every convention's annotations and labels, thousands of affinity terms, unicode
  and deeply nested values.
* ``big gang``: on a cluster of its own (``--nodes`` x 8 GPUs, every other node running one
  4-GPU pod, so every gang below fits spread), a ``--big``-member gang (1,000 by default,
  ``--max-gang-size``'s default) is planned whole by one call: its first member's
  ``/filter`` (its other members pending), or the admission review of its last member (the
  others pending), each with members of 1 GPU and of 8 GPUs.
* ``all-different gang``: the same four gangs on a fresh cluster of the same shape, but every
  member asks its own CPU request (1.000, 1.001, ... CPUs): no two members are alike.
* ``dra``: on a cluster of its own, ``--dra-nodes`` nodes x 8 DRA GPUs (ResourceSlices as
  NVIDIA's driver publishes them, no ``nvidia.com/gpu``), a 1-member gang asks through
  ``/filter`` with (a) one claim whose selector nests three ``all`` macros over a
  ``--dra-list``-item literal list, (b) 16 claims of 32 requests each (512 devices: no node
  holds it), (c) one claim whose selector matches no device.

Each row: the probe's p50 / p99 / max (ms) in that phase, and how long the worst case's own
calls took. A stall shows as a p99 near the worst case's call time; a loop that yields keeps
the p99 near the idle one.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import functools
import random
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import orjson

from coscheduling.events import ingest

from .synthetic import cluster_nodes, plain_pod, running_pods
from .verbs import _free_port, _pct

__all__ = ["PROBES", "TABLE_COLUMNS", "hostile_pods", "run"]

PROBES = ("healthz", "filter", "bind")
FREE_NODES = 16
"""Nodes left empty for the probes' plain pods: 128 GPUs, less than one 64 x 8-GPU gang."""
GANG = 64
GANG_GPUS = 8
HOSTILE = 100
BIG = 1000
"""Members of the big gang: ``--max-gang-size``'s default (app/cli.py)."""
BIG_GANGS = (("filter", 1), ("filter", 8), ("webhook", 1), ("webhook", 8))
"""The big-gang phases: the call that plans the gang, and each member's GPUs."""
DRA_NODES = 300
"""Nodes of the DRA cluster (x 8 DRA GPUs)."""
DRA_LIST = 15
"""Items of the literal list the nested-macro selector iterates three deep."""
DRA_CASES = ("nested all", "16 claims x 32 requests", "selector matches nothing")
"""The DRA phases, in order: each a 1-member gang asking through ``/filter``."""

TABLE_COLUMNS = (("phase", "phase"), ("probe", "probe"), ("n", "requests"),
                 ("p50_ms", "p50 ms"), ("p99_ms", "p99 ms"), ("max_ms", "max ms"),
                 ("errors", "errors"), ("load_calls", "worst-case calls"),
                 ("load_max_s", "longest call s"), ("loop_held_max_s", "loop held max s"))


# ------------------------------------------------------------------------------- the server


def _bound(name: str, node: str, gpus: int, prio: int, gang: str | None = None
           ) -> dict[str, Any]:
    ann = {"lockstep.dev/pod-group": gang, "lockstep.dev/min-member": "2"} if gang else {}
    return {"metadata": {"name": name, "namespace": "bench", "uid": name, "annotations": ann},
            "spec": {"schedulerName": "lockstep", "nodeName": node, "priority": prio,
                     "containers": [{"name": "c", "resources": {"requests": {
                         "nvidia.com/gpu": str(gpus), "cpu": "1", "memory": "1Gi"}}}]},
            "status": {"phase": "Running"}}


def _member(gang: str, i: int) -> dict[str, Any]:
    return {"metadata": {"name": f"{gang}-{i}", "namespace": "bench", "uid": f"{gang}-{i}",
                         "annotations": {"lockstep.dev/pod-group": gang,
                                         "lockstep.dev/min-member": str(GANG)}},
            "spec": {"schedulerName": "lockstep", "priority": 1000,
                     "containers": [{"name": "c", "resources": {"requests": {
                         "nvidia.com/gpu": str(GANG_GPUS), "cpu": "8", "memory": "8Gi"}}}]},
            "status": {"phase": "Pending"}}


def _probe_pod(i: int) -> dict[str, Any]:
    """A CPU-only plain pod: it fits on the free nodes however many were bound before."""
    p = plain_pod(f"web-{i}", gpus=0)
    p["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "10m", "memory": "1Mi"}
    return p


def fill(nodes: int, gangs: int, probes: int, seed: int = 1) -> list[dict[str, Any]]:
    """Every pod of the synthetic cluster, bound and pending, in the order to upsert."""
    rng = random.Random(seed)
    pods: list[dict[str, Any]] = []
    full = nodes - FREE_NODES
    used = [0] * full
    pairs = 0
    for i in range(full):
        if i % 16 < 15 and i + 1 < full and used[i] == 0 and rng.random() < 0.3:
            pairs += 1  # a 2-member gang across this node and the next, 4 GPUs on each
            for j, n in enumerate((i, i + 1)):
                pods.append(_bound(f"pair{pairs}-{j}", f"node-{n:05d}", 4, rng.randint(0, 5),
                                   f"pair{pairs}"))
                used[n] += 4
        k = 0
        while used[i] < 8:
            g = min(8 - used[i], rng.choice([1, 2, 4]))
            pods.append(_bound(f"p{i}-{k}", f"node-{i:05d}", g, rng.randint(0, 9)))
            used[i], k = used[i] + g, k + 1
    pods += [_member(f"hi{g}", i) for g in range(gangs) for i in range(GANG)]
    pods += [_probe_pod(i) for i in range(probes)]
    return pods


def big_gang(via: str, gpus: int, size: int, different: bool = False
             ) -> tuple[str, list[dict[str, Any]]]:
    """The big gang of a phase: its name and every member (``size`` of them); ``different``:
    member ``i`` asks 1 + i/1000 CPUs, so no two members are alike."""
    name = f"{'diff' if different else 'big'}-{via}-{gpus}"
    pods = []
    for i in range(size):
        p = _member(name, i)
        p["metadata"]["annotations"]["lockstep.dev/min-member"] = str(size)
        p["spec"]["containers"][0]["resources"]["requests"] = {
            "nvidia.com/gpu": str(gpus), "cpu": f"{1000 + i}m" if different else "1",
            "memory": "1Gi"}
        pods.append(p)
    return name, pods


def fill_big(nodes: int, probes: int, size: int, different: bool = False
             ) -> list[dict[str, Any]]:
    """The big-gang cluster's pods: one 4-GPU pod on every other node, each big gang's
    members pending (all but the last one of a gang planned by the webhook), the probes'."""
    pods = running_pods(nodes)
    for via, gpus in BIG_GANGS:
        members = big_gang(via, gpus, size, different)[1]
        pods += members[:-1] if via == "webhook" else members
    return pods + [_probe_pod(i) for i in range(probes)]


def nested_selector(items: int) -> str:
    """Three ``all`` macros nested over a literal list of ``items`` numbers: items^3
    evaluations per device, from an expression of a hundred characters."""
    xs = "[" + ",".join(str(i) for i in range(1, items + 1)) + "]"
    return f"{xs}.all(a, {xs}.all(b, {xs}.all(c, a + b + c > 0)))"


def dra_cluster(nodes: int) -> list[dict[str, Any]]:
    """``nodes`` DRA nodes: 8 GPUs each in a ResourceSlice, none as ``nvidia.com/gpu``."""
    from testbed import dra

    out = []
    for n in cluster_nodes(nodes, gpus=0):
        del n["status"]["allocatable"]["nvidia.com/gpu"]
        n["metadata"]["annotations"] = {dra.DRA_GPUS: "8"}
        out.append(n)
    return out


def dra_objects(items: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The DRA phases' claim templates and their pending 1-member gangs, in
    ``DRA_CASES``' order."""
    from testbed import dra

    nested = dra.claim_template("nested", namespace="bench",
                                selectors=[nested_selector(items)])
    many = dra.claim_template("many", namespace="bench")
    many["spec"]["spec"]["devices"]["requests"] = [
        {"name": f"r{j}", "exactly": {"deviceClassName": dra.DEVICE_CLASS, "count": 1}}
        for j in range(32)]
    none = dra.claim_template("none", namespace="bench", selectors=[
        f"device.attributes['{dra.DRIVER}'].productName == 'no such GPU'"])
    pods = []
    for case, claims in zip(DRA_CASES, (["nested"], ["many"] * 16, ["none"]), strict=True):
        p = _member(_dra_gang(case), 0)
        p["metadata"]["annotations"]["lockstep.dev/min-member"] = "1"
        p["spec"]["containers"][0]["resources"] = {
            "requests": {"cpu": "1", "memory": "1Gi"},
            "claims": [{"name": f"c{k}"} for k in range(len(claims))]}
        p["spec"]["resourceClaims"] = [{"name": f"c{k}", "resourceClaimTemplateName": t}
                                       for k, t in enumerate(claims)]
        pods.append(p)
    return [nested, many, none], pods


def _dra_gang(case: str) -> str:
    return "dra-" + "-".join(case.split()[:2])


def build(nodes: int, gangs: int, probes: int, api: str, big: int = 0,
          different: bool = False, dra: bool = False, dra_list: int = 1) -> Any:
    """The Lockstep service the server runs (imports the app only in the server process);
    ``big``: the big-gang cluster with gangs of that many members (each member its own CPU
    request when ``different``); ``dra``: the DRA cluster of ``nodes`` nodes, its nested
    selector over a list of ``dra_list`` items."""
    from app.kube.client import KubeClient, KubeConfig
    from app.service import Lockstep
    from coscheduling import Coscheduler, Settings, node_from_json, pod_from_json
    from coscheduling.devices.wire import class_from_json, slice_from_json, template_from_json

    core = Coscheduler(Settings())
    if dra:
        from testbed import dra as driver

        for n in dra_cluster(nodes):
            core.upsert(ingest.NODES, node_from_json(n))
            if (published := driver.slice_for_node(n)) is not None:
                core.upsert(ingest.RESOURCE_SLICES, slice_from_json(published))
        core.upsert(ingest.DEVICE_CLASSES, class_from_json(driver.device_class()))
        templates, pending = dra_objects(dra_list)
        for t in templates:
            core.upsert(ingest.RESOURCE_CLAIM_TEMPLATES, template_from_json(t))
    else:
        for n in cluster_nodes(nodes):
            core.upsert(ingest.NODES, node_from_json(n))
        pending = fill_big(nodes, probes, big, different) if big else fill(nodes, gangs, probes)
    for p in pending + ([_probe_pod(i) for i in range(probes)] if dra else []):
        core.upsert_pod(pod_from_json(p))
    service = Lockstep(core, KubeClient(KubeConfig(api)))
    for res in service.cache.resources.values():
        res.synced = True  # as if listed: the webhook places and the core admits
    return service


def serve(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.stall")
    for name in ("--nodes", "--gangs", "--probes", "--port"):
        ap.add_argument(name, type=int, required=True)
    ap.add_argument("--big", type=int, default=0)
    ap.add_argument("--different", action="store_true")
    ap.add_argument("--dra", action="store_true")
    ap.add_argument("--dra-list", type=int, default=1)
    ap.add_argument("--api", required=True)
    args = ap.parse_args(argv)
    import uvicorn

    from app.process import extender_app

    service = build(args.nodes, args.gangs, args.probes, args.api, args.big, args.different,
                    args.dra, args.dra_list)
    app = extender_app(service)
    config = uvicorn.Config(app, host="127.0.0.1", port=args.port, log_level="warning",
                            access_log=False)
    asyncio.run(_serve(service, uvicorn.Server(config)))


async def _serve(service: Any, server: Any) -> None:
    """The HTTP server plus the deadline timer, whose sweeps go on with a victim search
    that a verb left unfinished (the core searches in slices of bounded work)."""
    tasks = [asyncio.create_task(service.binder.expire_loop(), name="deadline-timer"),
             asyncio.create_task(service.lag.run(), name="loop-lag")]
    try:
        await server.serve()
    finally:
        for t in tasks:
            t.cancel()


# ------------------------------------------------------------------------------- the client


class _StubAPI(BaseHTTPRequestHandler):
    """Answers every write 201 and every read 404: bindings succeed, nothing else matters."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self._send(201, b'{"kind":"Status","status":"Success"}')

    def do_PATCH(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self._send(200, b"{}")

    def do_GET(self) -> None:
        self._send(404, b'{"kind":"Status","code":404,"reason":"NotFound"}')

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        return


def hostile_pods(n: int = HOSTILE) -> list[dict[str, Any]]:
    """``n`` pods a careless or hostile tenant could create, cycling through the shapes."""
    huge = "9" * 5000
    koord = "gang.scheduling.koordinator.sh/"
    deep = "[" * 5000 + '"x"' + "]" * 5000  # deeper than json.loads can recurse
    many_terms = [{"matchExpressions": [{"key": "zone", "operator": "In",
                                         "values": [f"z{j}" for j in range(8)]}]}
                  for _ in range(4000)]
    shapes: list[tuple[dict[str, str], dict[str, str], Any]] = [
        ({"lockstep.dev/pod-group": "g", "lockstep.dev/min-member": huge}, {}, None),
        ({"lockstep.dev/pod-group": "g", "lockstep.dev/min-member": "10000000"}, {}, None),
        ({"lockstep.dev/pod-group": "g", "lockstep.dev/min-member": str(2**31 - 1)}, {}, None),
        ({"lockstep.dev/pod-group": "g", "lockstep.dev/min-member": "-3"}, {}, None),
        ({"lockstep.dev/pod-group": "g", "lockstep.dev/min-member": "0"}, {}, None),
        ({"lockstep.dev/pod-group": "g", "lockstep.dev/min-member": "四"}, {}, None),
        ({"lockstep.dev/pod-group": "g", "lockstep.dev/min-member": "2",
          "lockstep.dev/timeout-seconds": huge}, {}, None),
        ({koord + "name": "k", koord + "min-available": huge}, {}, None),
        ({koord + "name": "k", koord + "min-available": "2", koord + "total-number": huge},
         {}, None),
        ({koord + "name": "k", koord + "min-available": "2", koord + "groups": deep},
         {}, None),
        ({"kueue.x-k8s.io/pod-group-total-count": "10000000"},
         {"kueue.x-k8s.io/pod-group-name": "q"}, None),
        ({"kueue.x-k8s.io/pod-group-total-count": huge},
         {"kueue.x-k8s.io/pod-group-name": "q"}, None),
        ({"scheduling.volcano.sh/group-min-member": huge,
          "scheduling.k8s.io/group-name": "v"}, {}, None),
        ({"lockstep.dev/pod-group": "g-ünïcødé-" + "é" * 300,
          "lockstep.dev/min-member": "2"}, {}, None),
        ({"lockstep.dev/pod-group": "aff", "lockstep.dev/min-member": "2"}, {}, many_terms),
    ]
    out = []
    for i in range(n):
        ann, labels, terms = shapes[i % len(shapes)]
        p = plain_pod(f"hostile-{i}", gpus=1)
        p["metadata"]["annotations"] = dict(ann)
        p["metadata"]["labels"] = dict(labels)
        p["metadata"]["resourceVersion"] = str(10**9 + i)  # newer than anything listed
        if terms is not None:
            p["spec"]["affinity"] = {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}
        out.append(p)
    return out


def _review(pod: dict[str, Any], uid: str) -> bytes:
    return orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                         "request": {"uid": uid, "kind": {"group": "", "version": "v1",
                                                          "kind": "Pod"},
                                     "operation": "CREATE", "namespace": "bench",
                                     "object": pod}})


class _Probes:
    """One thread per probe, each sending one request at a time until told to stop."""

    def __init__(self, base: str, names: list[str], free: list[str]) -> None:
        self.base, self.names, self.free = base, names, free
        self.stop = threading.Event()
        self.times: dict[str, list[float]] = {p: [] for p in PROBES}
        self.errors: dict[str, int] = dict.fromkeys(PROBES, 0)
        self.failed: dict[str, list[str]] = {p: [] for p in PROBES}
        """The first few failed answers of each probe in the phase, as they came."""
        self._next_pod = 0
        self._lock = threading.Lock()

    def _pod(self) -> int:
        with self._lock:
            self._next_pod += 1
            return self._next_pod - 1

    def _call(self, client: httpx.Client, probe: str) -> str | None:
        """One probe request: None when it was answered as it should be, else what came."""
        if probe == "healthz":
            r = client.get("/healthz")
            ok = r.status_code == 200
        elif probe == "filter":
            body = orjson.dumps({"Pod": _probe_pod(0), "Nodes": None, "NodeNames": self.names})
            r = client.post("/filter", content=body,
                            headers={"content-type": "application/json"})
            ok = r.status_code == 200 and bool(r.json().get("NodeNames"))
        else:
            i = self._pod()
            r = client.post("/bind", json={"PodName": f"web-{i}", "PodNamespace": "bench",
                                           "PodUID": f"web-{i}",
                                           "Node": self.free[i % len(self.free)]})
            ok = r.status_code == 200 and r.json().get("Error") == ""
        return None if ok else f"{r.status_code} {r.text[:200]}"

    def _loop(self, probe: str) -> None:
        with httpx.Client(base_url=self.base, timeout=60) as client:
            while not self.stop.is_set():
                t = time.perf_counter()
                try:
                    failed = self._call(client, probe)
                except httpx.HTTPError as e:
                    failed = repr(e)
                self.times[probe].append((time.perf_counter() - t) * 1000)
                if failed is not None:
                    self.errors[probe] += 1
                    if len(self.failed[probe]) < 3:
                        self.failed[probe].append(failed)
                time.sleep(0.01)  # a steady trickle, as a prober and a scheduler send

    def during(self, load: Callable[[], list[float]]) -> tuple[list[float], dict[str, Any]]:
        """Run the probes while ``load`` runs; returns the load's call times and results."""
        loop = httpx.get(self.base + "/debug/loop", params={"reset": "1"}, timeout=120)
        loop.raise_for_status()
        self.stop.clear()
        self.times = {p: [] for p in PROBES}
        self.errors = dict.fromkeys(PROBES, 0)
        self.failed = {p: [] for p in PROBES}
        threads = [threading.Thread(target=self._loop, args=(p,), daemon=True) for p in PROBES]
        for t in threads:
            t.start()
        time.sleep(0.3)  # the probes are going before the worst case starts
        try:
            calls = load()
        finally:
            self.stop.set()
            for t in threads:
                t.join(70)
        held = httpx.get(self.base + "/debug/loop", timeout=120).json()
        return calls, {"times": self.times, "errors": self.errors, "failed": self.failed,
                       "loop": held}


def _rows(phase: str, calls: list[float], got: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per probe; ``loop_held_max_s`` is the server's own measure of the longest
    time work held its loop in the phase (``/debug/loop``)."""
    rows = []
    for probe in PROBES:
        v = got["times"][probe] or [0.0]
        rows.append({"phase": phase, "probe": probe, "n": len(got["times"][probe]),
                     "p50_ms": round(_pct(v, 0.5), 2), "p99_ms": round(_pct(v, 0.99), 2),
                     "max_ms": round(max(v), 2), "errors": got["errors"][probe],
                     "failed": got["failed"][probe],
                     "load_calls": len(calls),
                     "load_max_s": round(max(calls), 3) if calls else 0.0,
                     "loop_held_max_s": got["loop"].get("maxLagSeconds")})
    return rows


def _wait_up(client: httpx.Client, server: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if client.get("/healthz").status_code == 200:
                return
        except httpx.TransportError:
            pass
        if server.poll() is not None:
            raise RuntimeError(f"benchmark server exited with {server.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError("benchmark server did not start")
        time.sleep(0.2)


class _Server:
    """A benchmark server in a process of its own, talking to the stub API server."""

    def __init__(self, nodes: int, gangs: int, stub: ThreadingHTTPServer, big: int = 0,
                 *extra: str) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.stall", "--nodes", str(nodes), "--gangs",
             str(gangs), "--probes", "20000", "--port", str(self.port), "--big", str(big),
             "--api", f"http://127.0.0.1:{stub.server_address[1]}", *extra])

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def run(nodes: int = 5000, gangs: int = 3, hostile: int = HOSTILE, idle_seconds: float = 3.0,
        log: Callable[[str], None] = lambda _: None, big: int = BIG, different: bool = True,
        dra_nodes: int = DRA_NODES, dra_list: int = DRA_LIST, baseline: bool = True,
        alike: bool = True) -> dict[str, Any]:
    """Serve, measure idle, then during each worst case; rows as ``TABLE_COLUMNS``.
    ``big`` = 0 leaves the big-gang phases out, ``different`` = False the all-different
    ones, ``dra_nodes`` = 0 the DRA ones and ``dra_list`` = 0 the nested-macro one;
    ``baseline`` = False leaves out idle, preemption and hostile, ``alike`` = False the big
    gangs of alike members."""
    stub = ThreadingHTTPServer(("127.0.0.1", 0), _StubAPI)
    threading.Thread(target=stub.serve_forever, daemon=True).start()
    names = [n["metadata"]["name"] for n in cluster_nodes(nodes)]
    big_out: list[dict[str, Any]] = []
    dra_out: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    slowest: list[tuple[float, str]] = []
    alive = True
    SEARCHES.clear()
    server: _Server | None = None
    try:
        if baseline:
            server = _Server(nodes, gangs, stub)
            with httpx.Client(base_url=server.base, timeout=120) as client:
                _wait_up(client, server.proc, 300)
                probes = _Probes(server.base, names, names[-FREE_NODES:])
                log(f"  server up: {nodes} nodes; idle for {idle_seconds:g} s")
                rows = _rows("idle", *probes.during(lambda: _sleep(idle_seconds)))
                log(f"  preemption: {gangs} gang(s) of {GANG} x {GANG_GPUS} GPUs search for "
                    "victims")
                rows += _rows("preemption", *probes.during(
                    lambda: _preempt(client, names, gangs)))
                log(f"  searches (wall s, outcome): {SEARCHES}")
                log(f"  hostile: {hostile} pods through the webhook and /filter")
                rows += _rows("hostile", *probes.during(
                    lambda: _hostile(client, names, hostile, failures, slowest)))
                alive = client.get("/healthz").status_code == 200
        for kind, wanted in (("big", big if alike else 0),
                             ("different", big if different else 0)):
            if wanted:
                if server is not None:
                    server.close()
                extra = ("--different",) if kind == "different" else ()
                server = _Server(nodes, 0, stub, big, *extra)
                rows += _big_phases(server, names, big, big_out, log, kind == "different")
        if dra_nodes:
            if server is not None:
                server.close()
            server = _Server(dra_nodes, 0, stub, 0, "--dra", "--dra-list", str(max(dra_list, 1)))
            dra_names = [n["metadata"]["name"] for n in cluster_nodes(dra_nodes)]
            cases = DRA_CASES if dra_list else DRA_CASES[1:]
            rows += _dra_phases(server, dra_names, cases, dra_out, log)
        for row in rows:
            if row["failed"]:
                log(f"  {row['phase']} {row['probe']}: {row['errors']} failed, first: "
                    f"{row['failed']}")
    finally:
        if server is not None:
            server.close()
        stub.shutdown()
        stub.server_close()
    return {"nodes": nodes, "gangs": gangs, "gang": f"{GANG} x {GANG_GPUS} GPUs",
            "searches": list(SEARCHES),
            "hostile": hostile, "hostile_5xx": failures,
            "hostile_slowest_s": slowest, "alive_after": alive, "big": big,
            "big_outcomes": big_out, "dra_nodes": dra_nodes, "dra_list": dra_list,
            "dra_outcomes": dra_out, "rows": rows}


def _big_phases(server: _Server, names: list[str], big: int, out: list[dict[str, Any]],
                log: Callable[[str], None], different: bool = False) -> list[dict[str, Any]]:
    """Each big gang planned by one call (``BIG_GANGS``), with the probes going."""
    rows: list[dict[str, Any]] = []
    with httpx.Client(base_url=server.base, timeout=300) as client:
        _wait_up(client, server.proc, 300)
        probes = _Probes(server.base, names, names[-FREE_NODES:])
        for via, gpus in BIG_GANGS:
            phase = f"{'all-different' if different else 'big'} gang {via} {gpus}gpu"
            by = "its first member's /filter" if via == "filter" else "its last member's review"
            each = ", each its own CPU request" if different else ""
            log(f"  {phase}: a {big}-member gang of {gpus}-GPU members{each}, planned by {by}")
            rows += _rows(phase, *probes.during(
                functools.partial(_big, client, names, via, gpus, big, out, different)))
            log(f"    outcome: {out[-1]}")
    return rows


def _dra_phases(server: _Server, names: list[str], cases: Sequence[str],
                out: list[dict[str, Any]], log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Each DRA case's 1-member gang asks through ``/filter``, with the probes going."""
    rows: list[dict[str, Any]] = []
    pods = dict(zip(DRA_CASES, dra_objects(1)[1], strict=True))
    with httpx.Client(base_url=server.base, timeout=3600) as client:
        _wait_up(client, server.proc, 300)
        probes = _Probes(server.base, names, names[-FREE_NODES:])
        for case in cases:
            phase = f"dra {case}"
            log(f"  {phase}: a 1-member gang on {len(names)} nodes x 8 DRA GPUs")
            rows += _rows(phase, *probes.during(functools.partial(
                _ask, client, names, pods[case], {"case": case}, out)))
            log(f"    outcome: {out[-1]}")
    return rows


def _ask(client: httpx.Client, names: list[str], member: dict[str, Any], about: dict[str, Any],
         out: list[dict[str, Any]], timeout: float = 300.0) -> list[float]:
    """``member``'s ``/filter``, asked again while the answer says its plan is being
    computed or its gang is searching for victims (in slices, between calls); the calls'
    times, and ``about`` with the outcome appended to ``out``."""
    calls: list[float] = []
    start = time.perf_counter()
    while True:
        t = time.perf_counter()
        r = _post(client, "/filter", orjson.dumps(
            {"Pod": member, "Nodes": None, "NodeNames": names}))
        calls.append(time.perf_counter() - t)
        if r.status_code != 200:
            raise RuntimeError(f"/filter for {member['metadata']['name']}: {r.status_code} "
                               f"{r.text[:200]}")
        if (PLANNING not in r.text and SEARCHING not in r.text) \
                or time.perf_counter() - start > timeout:
            break
        time.sleep(0.05)
    out.append({**about, "calls": len(calls), "wall_s": round(time.perf_counter() - start, 3),
                "outcome": _outcome(r.json())})
    return calls


def _big(client: httpx.Client, names: list[str], via: str, gpus: int, size: int,
         out: list[dict[str, Any]], different: bool = False, timeout: float = 300.0
         ) -> list[float]:
    """The call that plans the big gang, asked again (as kube-scheduler and the API server
    retry) while the answer says its plan is being computed; the calls' times."""
    name, members = big_gang(via, gpus, size, different)
    if via == "filter":
        return _ask(client, names, members[0], {"gang": name, "via": via, "gpus": gpus,
                                                "members": size}, out)
    calls: list[float] = []
    start = time.perf_counter()
    while True:
        t = time.perf_counter()
        r = _post(client, "/mutate/pods", _review(members[-1], f"uid-{name}"))
        calls.append(time.perf_counter() - t)
        if r.status_code != 200:
            raise RuntimeError(f"{via} for {name}: {r.status_code} {r.text[:200]}")
        if PLANNING not in r.text or time.perf_counter() - start > timeout:
            break
        time.sleep(0.05)
    out.append({"gang": name, "via": via, "gpus": gpus, "members": size,
                "calls": len(calls), "wall_s": round(time.perf_counter() - start, 3),
                "outcome": _review_outcome(r.json())})
    return calls


def _review_outcome(answer: dict[str, Any]) -> str:
    """What the webhook did: pinned (to which node), gated, or neither."""
    patch = (answer.get("response") or {}).get("patch")
    ops = orjson.loads(base64.b64decode(patch)) if patch else []
    text = orjson.dumps(ops).decode()
    if "/spec/affinity" in text:
        node = next((v for v in re.findall(r'"values":\["([^"]+)"', text)), "?")
        return f"pinned to {node}"
    return "gated" if "schedulingGates" in text else f"neither: {text[:200]}"


PLANNING = "being planned"
"""What a gang's answer says while its plan is computed over several slices."""


def _sleep(seconds: float) -> list[float]:
    time.sleep(seconds)
    return []


SEARCHING = "searching for victims"
"""What a gang's reason says while its victim search is paused between slices."""


def _preempt(client: httpx.Client, names: list[str], gangs: int, timeout: float = 300.0
             ) -> list[float]:
    """Each gang asks (its first member's ``/filter``) until its search has ended: admitted,
    preempting, or told why not; the calls' times are returned, and each search's wall
    time is appended to ``_preempt.searches``."""
    calls = []
    for g in range(gangs):
        body = orjson.dumps({"Pod": _member(f"hi{g}", 0), "Nodes": None, "NodeNames": names})
        start = time.perf_counter()
        while True:
            t = time.perf_counter()
            r = client.post("/filter", content=body,
                            headers={"content-type": "application/json"})
            calls.append(time.perf_counter() - t)
            if r.status_code != 200:
                raise RuntimeError(f"/filter for hi{g}: {r.status_code} {r.text[:200]}")
            if SEARCHING not in r.text or time.perf_counter() - start > timeout:
                break
            time.sleep(0.05)
        SEARCHES.append((round(time.perf_counter() - start, 3), _outcome(r.json())))
    return calls


SEARCHES: list[tuple[float, str]] = []
"""(wall seconds, outcome) of each gang's victim search in the last run."""


def _outcome(answer: dict[str, Any]) -> str:
    if answer.get("NodeNames"):
        return f"admitted onto {answer['NodeNames'][0]}"
    failed = answer.get("FailedAndUnresolvableNodes") or answer.get("FailedNodes") or {}
    text = next(iter(failed.values()), "")
    return str(text)[:300]


def _hostile(client: httpx.Client, names: list[str], n: int, failures: list[str],
             slowest: list[tuple[float, str]]) -> list[float]:
    """Each hostile pod through the webhook, then ``/filter``; a 5xx is noted in
    ``failures`` (a defect to fix, not a reason to stop measuring), and the five slowest
    pods in ``slowest``."""
    calls = []
    for i, pod in enumerate(hostile_pods(n)):
        name = pod["metadata"]["name"]
        t = time.perf_counter()
        for path, body in (("/mutate/pods", _review(pod, f"uid-{i}")),
                           ("/filter", orjson.dumps({"Pod": pod, "Nodes": None,
                                                     "NodeNames": names}))):
            try:
                r = _post(client, path, body)
            except httpx.HTTPError as e:
                failures.append(f"{path} {name}: {e!r}")
                continue
            if r.status_code >= 500:
                failures.append(f"{path} {name}: {r.status_code} {r.text[:200]}")
        calls.append(time.perf_counter() - t)
        slowest.append((round(calls[-1], 3), name))
    slowest.sort(reverse=True)
    del slowest[5:]
    return calls


def _post(client: httpx.Client, path: str, body: bytes) -> httpx.Response:
    """POST once more on a fresh connection when the server closed the kept-alive one (it
    does after a 500 that an exception caused)."""
    headers = {"content-type": "application/json"}
    try:
        return client.post(path, content=body, headers=headers)
    except httpx.TransportError:
        return client.post(path, content=body, headers=headers)


if __name__ == "__main__":
    serve(sys.argv[1:])
