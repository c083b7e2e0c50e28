"""Faults between Lockstep and the API server, and kube-scheduler restarting with binds parked.

Lockstep reaches kube-apiserver through ``testbed.proxy.FaultProxy`` (plain HTTP on loopback,
TLS to the API server); kube-scheduler, kwok and the test talk to the API server directly.
One test bed runs the API faults in phases, each with a fresh gang of four 1-GPU pods:

1. latency: 300 ms added to every request (lists, watches, bindings, events);
2. dropped connections: two binding requests dropped unanswered, one binding carried out by
   the API server but its answer lost, and every watch stream hung up mid-gang;
3. 5xx and 429 answers on bindings (503, 503, 429);
4. 5xx and 429 answers on watches (every stream hung up, the next four watch requests fail);
5. etcd restart with three bind calls parked (the fourth member is placeable only after);
6. a watch that expires during admission: three binds parked, the pod watch hung up and
   its resume answered with a 410 ``ERROR`` event, the fourth member replaced meanwhile;
7. kube-apiserver restart in the middle of a gang's group bind: two of its four bindings
   reach the API server, the other two are held by the proxy, the API server is stopped,
   the held bindings fail (Lockstep's retries included), and the API server comes back.

After each phase: the binding recorder sees no partial gang (window ``WINDOW``; phase 7 has
``RECOVERY``: a gang whose bindings straddle an API server outage is partly bound for as
long as the outage, which no binder can prevent; it must complete after), Lockstep's
``/debug/gangs`` member and bound counts equal a fresh list of the pods within
``CONVERGE`` seconds, and all along a sampler checks that no bind call stays parked past
its gang's deadline.

The second test stops kube-scheduler while three bind calls are parked: its connections
drop, Lockstep must notice the hang-ups and release those members' slots (``parked`` in
``/debug/gangs`` back to 0), and the gang must complete once kube-scheduler is back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from testbed.proxy import FaultProxy, Rule
from testbed.workloads import gang, pod

from .conftest import SCHEDULER_CONFIG, Cluster, ClusterFactory

TOPOLOGY = "racks-2x4-h100"
WINDOW = 2.0
"""Seconds from a gang's first binding to its min-member-th."""
RECOVERY = 30.0
"""The same window for the gang whose group bind straddles the API server restart."""
CONVERGE = 10.0
"""Seconds for Lockstep's gang table to match a fresh list of the pods."""
LATE = 1.5
"""How far past its gang's deadline a parked call may be seen (the sampler's resolution)."""
TIMEOUT = 60
BINDING = r"/binding$"
PODS_WATCH = r"^/api/v1/pods$"


@dataclass
class Faulted:
    c: Cluster
    proxy: FaultProxy
    late: list[str] = field(default_factory=list)
    samples: int = 0
    phases: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="deadline-sampler",
                                        daemon=True)

    def _sample(self) -> None:
        """No bind call may stay parked past its gang's deadline."""
        assert self.c.lockstep_url
        with httpx.Client(base_url=self.c.lockstep_url, timeout=5) as http:
            while not self._stop.wait(0.25):
                try:
                    gangs = http.get("/debug/gangs").json()["gangs"]
                except (httpx.HTTPError, ValueError):
                    continue
                self.samples += 1
                for g in gangs:
                    left = g.get("deadlineInSeconds")
                    if g["parked"] and left is not None and left < -LATE:
                        self.late.append(f"{g['gang']}: {g['parked']} parked, deadline "
                                         f"{-left:.1f}s ago")

    def gangs(self, ns: str) -> dict[str, dict[str, Any]]:
        return {g["gang"]: g for g in self.c.lockstep("/debug/gangs")["gangs"]
                if str(g["gang"]).startswith(ns + "/")}

    def parked(self, ns: str, name: str) -> int:
        g = self.gangs(ns).get(f"{ns}/{name}")
        return int(g["parked"]) if g else 0

    def create(self, ns: str, *pods: dict[str, Any]) -> None:
        for p in pods:
            p["metadata"]["namespace"] = ns
            self.c.kube.create_pod(p)

    def replace(self, ns: str, old: str, new: dict[str, Any]) -> None:
        """Delete pod ``old`` and create ``new`` (same name) once it is gone."""
        self.c.kube.delete_pod(ns, old)
        self.c.kube.wait(f"{old} gone", lambda: old not in {
            p["metadata"]["name"] for p in self.c.kube.pods(ns)}, 30)
        self.create(ns, new)

    def truth(self, ns: str) -> dict[str, tuple[int, int]]:
        """gang -> (members, bound) from a fresh list of the pods."""
        out: dict[str, list[int]] = {}
        for p in self.c.kube.pods(ns):
            meta = p["metadata"]
            g = (meta.get("annotations") or {}).get("lockstep.dev/pod-group")
            if not g or meta.get("deletionTimestamp"):
                continue
            t = out.setdefault(f"{ns}/{g}", [0, 0])
            t[0] += 1
            t[1] += 1 if p["spec"].get("nodeName") else 0
        return {k: (v[0], v[1]) for k, v in out.items()}

    def converged(self, ns: str, what: str) -> float:
        """Seconds until Lockstep's gang table agrees with the API server (fails after
        ``CONVERGE``)."""
        t0 = time.monotonic()
        last: Any = None
        while time.monotonic() - t0 < CONVERGE:
            truth = self.truth(ns)
            seen = {k: (int(g["members"]), int(g["bound"])) for k, g in self.gangs(ns).items()
                    if int(g["members"]) > 0}
            if seen == truth:
                return time.monotonic() - t0
            last = (truth, seen)
            time.sleep(0.2)
        raise AssertionError(f"after {what}: Lockstep's gangs did not converge to the API "
                             f"server's within {CONVERGE}s: (API server, Lockstep) = {last}")

    def check(self, ns: str, what: str, window: float = WINDOW) -> None:
        self.c.recorder.assert_gang_invariants(ns, window)
        partial = self.c.metric("lockstep_partial_gangs_total")
        assert partial == 0, f"after {what}: Lockstep reported {partial:g} partial gang(s)"
        took = self.converged(ns, what)
        assert not self.late, f"after {what}: parked past the deadline: {self.late[:5]}"
        self.phases.append(f"{what}: 0 partial gangs, caches converged in {took:.1f}s")


@pytest.fixture
def faulted(cluster: ClusterFactory) -> Iterator[Faulted]:
    c = cluster(TOPOLOGY, lockstep=False)
    proxy = FaultProxy("127.0.0.1", c.bed.api_port).start()
    kubeconfig = proxy.kubeconfig(c.bed.dir / "kubeconfig-lockstep-proxied", c.bed.token)
    c.lockstep_url = c.bed.start_lockstep(kubeconfig=kubeconfig, extra_args=("--backoff=3",))
    c.bed.start_scheduler(SCHEDULER_CONFIG, name="lockstep-scheduler",
                          extender_url=c.lockstep_url)
    f = Faulted(c, proxy)
    f._thread.start()
    try:
        yield f
    finally:
        f._stop.set()
        f._thread.join(5)
        proxy.stop()
        print(f"\nfault proxy: {dict(proxy.counts)}")
        print("\n".join(f"  {p}" for p in f.phases))


def park_three(f: Faulted, ns: str, name: str, timeout: int = TIMEOUT) -> dict[str, Any]:
    """Create four members whose fourth kube-scheduler cannot place, wait until three bind
    calls are parked, and return the placeable fourth that is to replace it.

    The unplaceable member is created first and the test waits until Lockstep has seen it:
    kube-scheduler's own filter rejects it, so Lockstep never hears of it through a verb,
    and had it been the member completing the gang, members turned away a moment earlier
    as "3/4 members exist" would wait for an unrelated pod event (reported separately)."""
    pods = gang(name, 4, timeout=timeout)
    f.create(ns, pod(f"{name}-3").gang(name, 4, timeout=timeout).gpu(1).unplaceable().build())
    f.c.kube.wait(f"Lockstep sees {name}-3", lambda: int(
        f.gangs(ns).get(f"{ns}/{name}", {}).get("members", 0)) == 1, 30)
    f.create(ns, *pods[:3])
    f.c.kube.wait(f"three binds parked ({name})", lambda: f.parked(ns, name) == 3, 30)
    return pods[3]


def test_api_faults_leave_no_partial_gang_and_caches_converge(faulted: Faulted) -> None:
    f, c, proxy = faulted, faulted.c, faulted.proxy
    ns = c.ns

    # 1. latency on every request.
    proxy.add(Rule("delay", seconds=0.3))
    f.create(ns, *gang("lat", 4, timeout=TIMEOUT))
    c.wait_bound(c.names("lat", 4), 60)
    proxy.clear()
    f.check(ns, "300 ms latency")

    # 2. dropped connections: bindings dropped and lost, watches hung up.
    proxy.add(Rule("drop", path=BINDING, times=2))
    proxy.add(Rule("lose", path=BINDING, times=1))
    f.create(ns, *gang("drop", 4, timeout=TIMEOUT))
    proxy.kill_streams()
    c.wait_bound(c.names("drop", 4), 60)
    assert proxy.counts["drop"] == 2 and proxy.counts["lose"] == 1, proxy.counts
    proxy.clear()
    f.check(ns, "2 bindings dropped, 1 answer lost, watches hung up")

    # 3. 5xx and 429 on bindings.
    proxy.add(Rule("status", path=BINDING, status=503, times=2))
    proxy.add(Rule("status", path=BINDING, status=429, times=1))
    f.create(ns, *gang("err", 4, timeout=TIMEOUT))
    c.wait_bound(c.names("err", 4), 60)
    assert proxy.counts["status"] == 3, proxy.counts
    proxy.clear()
    f.check(ns, "503, 503, 429 on bindings")

    # 4. 5xx and 429 on watches.
    proxy.add(Rule("status", watch=True, status=500, times=2))
    proxy.add(Rule("status", watch=True, status=429, times=2))
    assert proxy.kill_streams() >= 2
    f.create(ns, *gang("werr", 4, timeout=TIMEOUT))
    c.wait_bound(c.names("werr", 4), 60)
    proxy.clear()
    f.check(ns, "watches hung up, then 500, 500, 429, 429 on watches")

    # 5. etcd restart with three binds parked.
    last = park_three(f, ns, "etcd")
    c.bed.restart("etcd")
    f.replace(ns, "etcd-3", last)
    c.wait_bound(c.names("etcd", 4), 60)
    f.check(ns, "etcd restart with 3 binds parked")

    # 6. the pod watch expires (410) while a gang is being admitted.
    last = park_three(f, ns, "exp")
    lists = proxy.counts["GET /api/v1/pods"]
    proxy.add(Rule("gone", path=PODS_WATCH, watch=True, times=1))
    assert proxy.kill_streams(PODS_WATCH) >= 1
    f.replace(ns, "exp-3", last)
    c.wait_bound(c.names("exp", 4), 60)
    assert proxy.counts["gone"] == 1, proxy.counts
    assert proxy.counts["GET /api/v1/pods"] > lists, "no relist after the 410"
    proxy.clear()
    f.check(ns, "pod watch expired (410) during admission")

    # 7. kube-apiserver restart in the middle of a gang's group bind (own namespace: the
    #    recovery window applies to this gang only).
    ns7 = "e2e-restart"
    c.kube.ensure_namespace(ns7)
    proxy.add(Rule("hold", path=BINDING, skip=2))
    f.create(ns7, *gang("api", 4, timeout=TIMEOUT))
    c.kube.wait("two bindings through, two held",
                lambda: proxy.held() == 2 and len(c.recorder.bound(ns7)) == 2, 60)
    c.bed.stop_process("kube-apiserver")
    proxy.clear()  # the held bindings now meet a stopped API server
    time.sleep(2.0)  # longer than Lockstep's bind retries (0.2 + 0.4 + 0.8 s)
    c.bed.restart("kube-apiserver")
    c.recorder.wait_bound(ns7, c.names("api", 4), 60)
    f.check(ns7, "kube-apiserver restart mid group bind", window=RECOVERY)
    f.check(ns, "(other gangs after the API server restart)")
    assert f.samples > 20, "the deadline sampler hardly ran"


def test_kube_scheduler_restart_with_binds_parked_releases_then_completes(
    faulted: Faulted,
) -> None:
    f, c = faulted, faulted.c
    ns = c.ns
    last = park_three(f, ns, "ks", timeout=120)
    c.bed.stop_process("lockstep-scheduler")
    problems = []
    t0 = time.monotonic()
    try:
        c.kube.wait("parked back to 0 after kube-scheduler hung up",
                    lambda: f.parked(ns, "ks") == 0, 10)
        f.phases.append(f"kube-scheduler stopped: parked 3 -> 0 in "
                        f"{time.monotonic() - t0:.1f}s")
    except TimeoutError:
        g = f.gangs(ns).get(f"{ns}/ks", {})
        problems.append(
            f"kube-scheduler stopped with 3 bind calls parked: after 10 s Lockstep still "
            f"holds {g.get('parked')} parked (phase {g.get('phase')}, deadline in "
            f"{g.get('deadlineInSeconds')}s): the hang-ups went unnoticed")
    c.bed.restart("lockstep-scheduler")
    f.replace(ns, "ks-3", last)
    try:
        c.wait_bound(c.names("ks", 4), 60)
        f.check(ns, "kube-scheduler restart with 3 binds parked")
    except (TimeoutError, AssertionError) as e:
        problems.append(f"after kube-scheduler came back: {e}")
    assert not problems, "\n".join(problems)
