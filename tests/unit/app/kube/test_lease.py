"""Leader election (``app.kube.lease``): Lockstep leads while its sidecar kube-scheduler holds the
Lease, is fenced by its own clock before another replica could take it, and acts (admits,
binds, pins, writes) only while it leads, after rebuilding its view from the API server."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from app.kube.client import KubeClient, KubeConfig
from app.kube.errors import NotLeading
from app.kube.lease import LeaseFollower, LeaseTiming, holder_host
from app.service import NOT_LEADING, Lockstep, LostLease
from coscheduling import Coscheduler, Settings, conventions, node_from_json, pod_from_json, pod_key
from coscheduling.events import ingest
from tests.builders import node, pod
from tests.fakeapi import SlowAPI, Wire
from tests.internals import state_of


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def lease(holder: str, renew: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"resourceVersion": rv},
            "spec": {"holderIdentity": holder, "renewTime": renew}}


def follower(clock: Clock, identity: str = "lockstep-a") -> LeaseFollower:
    kube = KubeClient(KubeConfig("http://api.test"), connect=Wire(lambda r: httpx.Response(404)))
    return LeaseFollower(kube, "lockstep-system", "lockstep-scheduler", identity, clock=clock)


def test_holder_host_is_kube_schedulers_hostname_part() -> None:
    assert holder_host("lockstep-a_0b5c2a9e-1f7d-4c1e-9a55-3f4c0d8e2b11") == "lockstep-a"
    assert holder_host("lockstep-a") == "lockstep-a"


def test_timing_must_fence_before_the_lease_can_pass() -> None:
    LeaseTiming(15, 10, 2)
    for bad in ((10, 10, 2), (15, 16, 2), (15, 10, 10), (15, 10, 0), (4000, 10, 2)):
        with pytest.raises(ValueError, match="renew deadline"):
            LeaseTiming(*bad)


def test_the_first_read_proves_nothing_a_renewal_after_it_does() -> None:
    clock = Clock()
    f = follower(clock)
    f.observe(lease("lockstep-a_u1", "t1", "1"), sent=100.0)
    assert not f.leading  # when was t1 written? maybe a lease period ago
    clock.t = 101.0
    f.observe(lease("lockstep-a_u1", "t2", "2"), sent=101.0)
    assert f.leading and f.term == 1
    # Written after the previous read was sent (100.0): fenced at 100 + renew deadline.
    clock.t = 109.99
    assert f.leading
    clock.t = 110.0
    assert not f.leading  # without any read: the clock alone fences


def test_an_unchanged_record_does_not_extend_the_lead() -> None:
    clock = Clock()
    f = follower(clock)
    f.observe(lease("lockstep-a_u1", "t1", "1"), sent=100.0)
    f.observe(lease("lockstep-a_u1", "t2", "2"), sent=101.0)
    for t in (103.0, 105.0, 107.0, 109.0):  # the sidecar stopped renewing
        clock.t = t
        f.observe(lease("lockstep-a_u1", "t2", "2"), sent=t)
    clock.t = 110.0
    assert not f.leading


def test_another_holder_ends_the_lead_at_once() -> None:
    clock = Clock()
    f = follower(clock)
    f.observe(lease("lockstep-a_u1", "t1", "1"), sent=100.0)
    f.observe(lease("lockstep-a_u1", "t2", "2"), sent=101.0)
    assert f.leading
    f.observe(lease("lockstep-b_u2", "t3", "3"), sent=102.0)
    assert not f.leading
    # A sidecar on another pod whose name merely begins the same is not ours.
    f.observe(lease("lockstep-a-2_u3", "t4", "4"), sent=103.0)
    f.observe(lease("lockstep-a-2_u3", "t5", "5"), sent=104.0)
    assert not f.leading


def test_the_lead_always_ends_before_another_replica_may_take_the_lease() -> None:
    """Whatever the read times, the fence is before every renewal's write + lease duration
    (the earliest another candidate acquires), by lease duration - renew deadline."""
    clock = Clock()
    f = follower(clock)
    timing = f.timing
    sends = [100.0, 100.7, 103.1, 103.2, 108.0, 108.9]
    writes = [100.5, 102.0, 103.15, 105.0, 108.5]  # each between two consecutive reads
    f.observe(lease("lockstep-a_u1", "t0", "0"), sent=sends[0])
    for i, (sent, written) in enumerate(zip(sends[1:], writes, strict=True)):
        clock.t = sent
        f.observe(lease("lockstep-a_u1", f"t{i + 1}", str(i + 1)), sent=sent)
        assert f._until <= written + timing.lease_duration - (
            timing.lease_duration - timing.renew_deadline)


def test_the_deployed_half_second_retry_keeps_the_lead_and_the_fence() -> None:
    """15/10/0.5 s (deploy/scheduler-config.yaml): the sidecar renews every 0.5 s and the
    follower reads every 0.25 s. While renewals come, the lead never lapses; once they stop
    (the leader is killed), the lead ends by the last write + renew deadline, at least
    lease duration - renew deadline before the standby kube-scheduler may take the Lease
    (client-go: observedTime + leaseDuration, observedTime no earlier than the write)."""
    clock = Clock()
    f = follower(clock)
    timing = f.timing
    assert (timing.lease_duration, timing.renew_deadline, timing.retry_period) == (
        15.0, 10.0, 0.5) and timing.poll == 0.25
    killed, last_write, rv = 130.0, 0.0, 0
    reads = [100.0 + i * timing.poll + 0.01 for i in range(int(60 / timing.poll))]
    for sent in reads:
        clock.t = sent
        writes = [100.0 + k * timing.retry_period for k in range(200)]
        done = [w for w in writes if w < min(sent, killed)]
        if done and done[-1] != last_write:
            last_write, rv = done[-1], rv + 1
        f.observe(lease("lockstep-a_u1", f"t{rv}", str(rv)), sent=sent)
        if 101.0 <= sent < killed:
            assert f.leading, sent  # no gap between renewals 0.5 s apart
        if sent >= last_write + timing.renew_deadline:
            assert not f.leading, sent
    assert f.term == 1 and not f.leading
    assert f._until <= last_write + timing.renew_deadline
    assert (last_write + timing.lease_duration) - f._until >= (
        timing.lease_duration - timing.renew_deadline)


def wire_lease(script: list[dict[str, Any] | int]) -> tuple[KubeClient, list[str]]:
    seen: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.path}")
        item = script.pop(0) if len(script) > 1 else script[0]
        if isinstance(item, int):
            return httpx.Response(item, json={"reason": "Scripted", "message": str(item)})
        return httpx.Response(200, json=item)

    return KubeClient(KubeConfig("http://api.test"), connect=Wire(handle)), seen


async def test_unreadable_lease_fences_on_time() -> None:
    clock = Clock()
    kube, seen = wire_lease([lease("lockstep-a_u1", "t1", "1"),
                             lease("lockstep-a_u1", "t2", "2"), 503])
    f = LeaseFollower(kube, "lockstep-system", "lockstep-scheduler", "lockstep-a", clock=clock)
    await f.read()
    clock.t = 101.0
    await f.read()
    assert f.leading
    clock.t = 105.0
    await f.read()  # 503: nothing learned
    assert f.leading
    clock.t = 110.0
    await f.read()
    assert not f.leading
    assert seen[0] == ("GET /apis/coordination.k8s.io/v1/namespaces/lockstep-system/"
                       "leases/lockstep-scheduler")


async def test_writes_are_refused_before_they_are_sent_while_not_leading() -> None:
    kube, seen = wire_lease([{}])
    kube.may_write = lambda: False
    with pytest.raises(NotLeading):
        await kube.bind("default", "p", "uid-p", "n0")
    with pytest.raises(NotLeading):
        await kube.merge_patch("/api/v1/namespaces/default/pods/secrets", {})
    assert seen == []
    await kube.request("GET", "/api/v1/namespaces/default/pods/p")
    # The replica's own upkeep (its webhook certificate and caBundle) is not fenced.
    await kube.request("PUT", "/api/v1/namespaces/lockstep-system/secrets/cert", json={})
    await kube.request("PATCH", "/apis/admissionregistration.k8s.io/v1/"
                       "mutatingwebhookconfigurations/lockstep", json=[])
    assert len(seen) == 3


async def test_a_write_waiting_for_a_connection_while_the_lead_is_lost_is_not_sent() -> None:
    """A slow API server both costs the lease and fills the 80 connection slots: a bind
    that passed the fence while leading waits for a slot; the lead is lost meanwhile. When
    a slot frees, the fence is checked again as the bytes would go out: refused, nothing
    sent (before: it was sent after the lease was lost)."""
    api = SlowAPI()
    kube = KubeClient(KubeConfig("http://api.test"), connect=Wire(api))
    leading = True
    kube.may_write = lambda: leading
    reads = await api.fill(kube)
    bind = asyncio.create_task(kube.bind("default", "p", "uid-p", "n0"))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not bind.done()  # past the fence's first check, waiting for a slot
    leading = False
    api.answer_all()
    with pytest.raises(NotLeading):
        await asyncio.wait_for(bind, 5.0)
    await asyncio.gather(*reads)
    assert api.writes == []
    leading = True  # the client still works: a write while leading goes out
    await kube.bind("default", "p", "uid-p", "n0")
    assert api.writes == ["POST /api/v1/namespaces/default/pods/p/binding"]
    await kube.aclose()


async def test_a_write_waits_for_a_connection_no_longer_than_the_fence() -> None:
    """The service wires the follower's fence into the client: a write that cannot get a
    connection slot gives up (NotLeading, nothing sent) when the lead's remaining time is
    up, not after the request timeout (30 s) while another replica may have taken over."""
    api = SlowAPI()
    clock = Clock()
    kube = KubeClient(KubeConfig("http://api.test"), connect=Wire(api))
    lead = LeaseFollower(kube, "lockstep-system", "lockstep-scheduler", "lockstep-a",
                         clock=clock)
    svc = Lockstep(Coscheduler(Settings(backoff_seconds=5)), kube, leader=lead)
    lead.observe(lease("lockstep-a_u1", "t1", "1"), sent=100.0)
    lead.observe(lease("lockstep-a_u1", "t2", "2"), sent=101.0)
    svc._acting_term = lead.term
    clock.t = 110.0 - 0.2  # the fence (100 + renew deadline) is 0.2 s away
    assert svc.acting and lead.remaining() == pytest.approx(0.2)
    reads = await api.fill(kube)
    started = asyncio.get_running_loop().time()
    with pytest.raises(NotLeading):
        await asyncio.wait_for(kube.bind("default", "p", "uid-p", "n0"), 5.0)
    assert asyncio.get_running_loop().time() - started < 5.0
    api.answer_all()
    await asyncio.gather(*reads)
    assert api.writes == []
    await kube.aclose()


@pytest.mark.parametrize(("edit", "renews"), [
    pytest.param({"spec": {"renewTime": "t3"}}, True, id="renewTime"),
    pytest.param({"spec": {"holderIdentity": "lockstep-a_u9"}}, True, id="holder-restarted"),
    pytest.param({"spec": {"leaseTransitions": 4}}, True, id="leaseTransitions"),
    pytest.param({"metadata": {"resourceVersion": "7"}}, False, id="resourceVersion"),
    pytest.param({"metadata": {"resourceVersion": "7", "labels": {"team": "ml"}}}, False,
                 id="labels"),
    pytest.param({"metadata": {"resourceVersion": "7", "annotations": {"a": "b"}}}, False,
                 id="annotations"),
    pytest.param({"metadata": {"resourceVersion": "7", "managedFields": [{"manager": "k"}]}},
                 False, id="managedFields"),
])
def test_only_a_change_client_gos_standby_sees_extends_the_lead(
        edit: dict[str, Any], renews: bool) -> None:
    """client-go's standby restarts its lease-duration wait only when the election record it
    reads from the Lease's spec changes (``observedRawRecord``); metadata is not in that
    record. A label, annotation or any metadata-only write (a new resourceVersion, the same
    holder and renewTime) must not extend the lead, or the standby takes the Lease while
    this replica still acts (before: any new resourceVersion extended it)."""
    clock = Clock()
    f = follower(clock)
    held = lease("lockstep-a_u1", "t2", "2")
    held["spec"]["leaseTransitions"] = 3
    f.observe(lease("lockstep-a_u1", "t1", "1") | {"spec": {**held["spec"], "renewTime": "t1"}},
              sent=100.0)
    f.observe(held, sent=101.0)
    for t in (103.0, 105.0, 107.0):  # the sidecar stopped renewing
        clock.t = t
        f.observe(held, sent=t)
    assert f.leading
    clock.t = 108.0
    edited = {"metadata": {**held["metadata"], **edit.get("metadata", {})},
              "spec": {**held["spec"], **edit.get("spec", {})}}
    f.observe(edited, sent=108.0)
    clock.t = 110.0  # the fence from the last renewal: sent 100 + renew deadline
    assert f.leading == renews


# ---------------------------------------------------------------- the service's acting gate


class ClusterAPI:
    """Lists the nodes and gated pods given; a watch ends at once; records writes."""

    def __init__(self, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        self.nodes, self.pods = nodes, pods
        self.writes: list[str] = []
        self.lists = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if request.method != "GET":
            self.writes.append(f"{request.method} {path}")
            return httpx.Response(200, json={})
        if "watch" in request.url.params:
            return httpx.Response(200, content=b"")
        items = {"/api/v1/nodes": self.nodes, "/api/v1/pods": self.pods,
                 "/apis/policy/v1/poddisruptionbudgets": [],
                 "/apis/scheduling.k8s.io/v1/priorityclasses": []}.get(path)
        if items is None:
            return httpx.Response(404, json={"reason": "NotFound", "message": path})
        self.lists += 1
        return httpx.Response(200, json={"metadata": {"resourceVersion": "5"}, "items": items})


def held_gang() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    nodes = [node(f"n{i}").gpus(4).build() for i in range(2)]
    pods = []
    for i in range(2):
        obj = pod(f"g-{i}").gang("g", 2, timeout=30).gpu(1).gated().build()
        obj["metadata"]["uid"] = f"uid-g-{i}"
        pods.append(obj)
    return nodes, pods


class Lead:
    """A follower whose verdict the test sets."""

    def __init__(self) -> None:
        self.leading = False
        self.term = 0
        self.changed = asyncio.Event()
        self.wake = asyncio.Event()

    def set(self, leading: bool) -> None:
        if leading and not self.leading:
            self.term += 1
        self.leading = leading
        self.changed.set()

    def remaining(self) -> float:
        return 10.0 if self.leading else 0.0

    async def run(self) -> None:
        await asyncio.Event().wait()


def standby(api: ClusterAPI) -> tuple[Lockstep, Lead]:
    lead = Lead()
    core = Coscheduler(Settings(backoff_seconds=5))
    kube = KubeClient(KubeConfig("http://api.test"), connect=Wire(api))
    svc = Lockstep(core, kube, leader=lead)  # type: ignore[arg-type]
    for n in api.nodes:
        core.upsert(ingest.NODES, node_from_json(n))
    for p in api.pods:
        core.upsert_pod(pod_from_json(p))
    for res in svc.cache.resources.values():
        res.synced = True
    return svc, lead


async def test_a_standby_admits_nothing_binds_nothing_and_writes_nothing() -> None:
    api = ClusterAPI(*held_gang())
    svc, _ = standby(api)
    svc.after_change()
    assert not svc.acting
    assert svc.metrics.registry.get_sample_value("lockstep_leading") == 0.0
    assert svc.core.queries.lift_target("default/g-0") is None
    assert await svc.bind("default", "g-0", "uid-g-0", "n0") == NOT_LEADING
    for conv in conventions.REGISTRY:  # every convention's status, as the writer's pass
        if conv.status is not None:
            await svc.status.write(conv.status, svc.core.queries.status_model())
    assert svc.poster.lifts.empty() and api.writes == []


async def test_a_new_leader_lists_again_before_it_acts_then_admits() -> None:
    api = ClusterAPI(*held_gang())
    svc, lead = standby(api)
    await svc.start()
    try:
        await asyncio.sleep(0.05)
        lists = api.lists
        lead.set(True)
        assert not svc.acting  # the view is not rebuilt for this term yet
        for _ in range(100):
            await asyncio.sleep(0.01)
            if svc.acting:
                break
        assert svc.acting and svc.rebuilds == 1 and api.lists >= lists + 2
        assert svc.metrics.registry.get_sample_value("lockstep_leading") == 1.0
        assert svc.core.queries.lift_target("default/g-0") is not None  # admitted once acting
    finally:
        await asyncio.wait_for(svc.stop(), 5)


async def test_a_deposed_leader_answers_its_parked_binds_and_stops() -> None:
    api = ClusterAPI(*held_gang())
    svc, lead = standby(api)
    await svc.start()
    try:
        lead.set(True)
        for _ in range(100):
            await asyncio.sleep(0.01)
            if svc.acting:
                break
        assert svc.acting
        answered = svc.parked.open("default/g-0")
        lead.set(False)
        await asyncio.wait_for(svc.stopped.wait(), 1.0)
        assert isinstance(svc.failed, LostLease)
        assert answered.done() and answered.result() == NOT_LEADING
    finally:
        await asyncio.wait_for(svc.stop(), 5)


def test_a_lease_that_never_lists_is_refused_by_the_cli() -> None:
    from app.cli import main

    assert main(["serve", "--leader-elect-lease=lockstep-scheduler"]) == 2
    assert main(["serve", "--leader-elect-lease=a/b", "--renew-deadline=20"]) == 2


async def test_a_standbys_webhook_gates_a_gang_that_fits_and_reserves_nothing() -> None:
    """A member whose gang fits is pinned by the leader; a standby gates it (its ledger may
    be stale) and the leader lifts it."""
    from app.http.webhook import create_webhook_app
    from tests.unit.app.http.test_webhook_pinning import member, mutate

    api = ClusterAPI(*held_gang())
    svc, lead = standby(api)
    transport = httpx.ASGITransport(app=create_webhook_app(svc))
    async with httpx.AsyncClient(transport=transport, base_url="https://lockstep.test") as c:
        ops = await mutate(c, member("solo", "solo", size=1))
        assert [o["path"] for o in ops] == ["/spec/schedulingGates"]
        assert state_of(svc.core).ledger.get(pod_key("ml", "solo")) is None
        lead.leading, lead.term, svc._acting_term = True, 1, 1  # the leader now
        ops = await mutate(c, member("solo2", "solo2", size=1))
        assert [o["path"] for o in ops] == ["/spec/affinity"]  # pinned


async def test_a_standby_answers_filter_with_an_error_kube_scheduler_retries() -> None:
    from app.http.verbs import VerbsApp

    api = ClusterAPI(*held_gang())
    svc, _ = standby(api)
    transport = httpx.ASGITransport(app=VerbsApp(svc))
    args = {"Pod": pod("p").gpu(1).build(), "Nodes": None, "NodeNames": ["n0", "n1"]}
    async with httpx.AsyncClient(transport=transport, base_url="http://lockstep.test") as c:
        r = await c.post("/filter", json=args)
    assert r.status_code == 200 and r.json()["Error"] == NOT_LEADING
    assert svc.core.queries.pod(pod_key("default", "p")) is None  # nothing decided, nothing kept


class LeaseAndCluster(ClusterAPI):
    """The cluster, and the Lease held by ``holder`` (the test moves it)."""

    def __init__(self, holder: str) -> None:
        super().__init__(*held_gang())
        self.holder, self.renewals = holder, 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if "/leases/" in request.url.path:
            self.renewals += 1
            return httpx.Response(200, json=lease(self.holder, f"t{self.renewals}",
                                                  str(self.renewals)))
        return super().__call__(request)


async def test_a_verb_from_the_new_leaders_sidecar_has_the_lease_read_at_once() -> None:
    """Its sidecar just took the Lease and calls: the replica reads the Lease then (not at
    its next poll, 50 s away here), rebuilds and answers, rather than refusing."""
    from app.http.verbs import VerbsApp

    api = LeaseAndCluster("lockstep-b_u2")
    kube = KubeClient(KubeConfig("http://api.test"), connect=Wire(api))
    lead = LeaseFollower(kube, "lockstep-system", "lockstep-scheduler", "lockstep-a",
                         timing=LeaseTiming(300, 200, 100))
    svc = Lockstep(Coscheduler(Settings(backoff_seconds=5)), kube, leader=lead)
    await svc.start()
    try:
        for _ in range(200):
            await asyncio.sleep(0.01)
            if svc.cache.synced and api.renewals:
                break
        assert not svc.acting
        api.holder = "lockstep-a_u1"  # our sidecar takes the Lease, then calls
        transport = httpx.ASGITransport(app=VerbsApp(svc))
        args = {"Pod": pod("p").gpu(1).build(), "Nodes": None, "NodeNames": ["n0", "n1"]}
        async with httpx.AsyncClient(transport=transport, base_url="http://l.test") as c:
            r = await c.post("/filter", json=args)
        assert r.json()["Error"] == "" and r.json()["NodeNames"], r.json()
        assert svc.acting and svc.rebuilds == 1
    finally:
        await asyncio.wait_for(svc.stop(), 5)
