"""Fixtures for end-to-end tests on the real test bed.

Each test gets its own control plane (etcd, kube-apiserver, kwok; ~4 s to start) so clusters
and capacity never leak between tests. ``cluster(..., k8s="v1.37.2")`` (or
``LOCKSTEP_K8S_VERSION`` for all) picks the Kubernetes version; 1.34 by default. Binaries
are built on first use (``make bins``): a missing binary is built, never a reason to skip.

Lockstep runs as installed by default: its admission webhook on, with the certificate it
issues itself, registered through ``deploy/webhook/webhook.yaml`` (``TestBed.start_lockstep``).
``cluster(..., webhook=False)`` is the extender alone, only for a test about that path (its
docstring says why).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from coscheduling.gang.gating import GANG_GATE
from testbed.bins import REPO, BinaryMissing, ensure_bins
from testbed.cluster import create_nodes, load_topology, nodes_from_topology
from testbed.dra import is_dra_node
from testbed.kube import Kube
from testbed.recorder import BindingRecorder
from testbed.runner import TestBed, default_k8s

SCHEDULER_CONFIG = REPO / "scheduler-config" / "lockstep.yaml"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark e2e tests; leave out the long soak (``@pytest.mark.soak``) unless
    ``LOCKSTEP_SOAK_SECONDS`` asks for it (``make soak``). It is deselected, not skipped:
    its short version always runs."""
    soak = bool(os.environ.get("LOCKSTEP_SOAK_SECONDS"))
    keep, drop = [], []
    for item in items:
        if "tests/e2e" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)
        (drop if item.get_closest_marker("soak") and not soak else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="session", autouse=True)
def _binaries() -> None:
    try:
        ensure_bins()
    except BinaryMissing as e:  # build-bins.sh printed what is needed and how to get it
        pytest.fail(f"the test bed's binaries are missing and could not be built: {e}",
                    pytrace=False)


@dataclass
class Cluster:
    bed: TestBed
    kube: Kube
    recorder: BindingRecorder
    ns: str
    lockstep_url: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    hold: float = 20.0
    """Seconds a gang member may hold DRA devices unbound (``BindingRecorder.claim_problems``),
    checked when the test ends."""

    def create(self, *pods: dict[str, Any]) -> None:
        for p in pods:
            p["metadata"]["namespace"] = self.ns
            self.kube.create_pod(p)

    def names(self, prefix: str, n: int) -> list[str]:
        return [f"{prefix}-{i}" for i in range(n)]

    def bound(self) -> dict[str, str]:
        return self.recorder.bound(self.ns)

    def wait_bound(self, names: list[str], timeout: float = 60.0) -> dict[str, str]:
        return self.recorder.wait_bound(self.ns, names, timeout)

    def wait_running(self, names: list[str], timeout: float = 60.0) -> None:
        self.kube.wait(f"{names} Running", lambda: all(
            self.kube.pod(self.ns, n).get("status", {}).get("phase") == "Running"
            for n in names), timeout)

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        return self.kube.events(self.ns, name)

    def wait_event(self, name: str | None, reason: str, contains: str = "",
                   timeout: float = 30.0) -> dict[str, Any]:
        """An Event on pod ``name`` (``None``: on any object in the namespace)."""
        def find() -> dict[str, Any] | None:
            for e in self.events(name):
                if e.get("reason") == reason and contains in e.get("message", ""):
                    return e
            return None
        return dict(self.kube.wait(f"event {reason} on {name} containing {contains!r}", find,
                                   timeout))

    def wait_held(self, name: str, contains: str, timeout: float = 30.0) -> str:
        """Until pod ``name`` waits behind Lockstep's gate (the default install's webhook
        gated it: ``SchedulingGated``, out of kube-scheduler's queue, no node) and Lockstep's
        explanation (``lockstep explain``) contains ``contains``; returns the explanation."""
        def held() -> str | None:
            obj = self.kube.pod(self.ns, name)
            gated = any(g.get("name") == GANG_GATE
                        for g in obj["spec"].get("schedulingGates") or ())
            why = str(self.lockstep(f"/debug/pods/{self.ns}/{name}").get("explanation") or "")
            return why if gated and not obj["spec"].get("nodeName") and contains in why \
                else None
        return str(self.kube.wait(f"{name} held, explained with {contains!r}", held, timeout,
                                  interval=0.3))

    def lockstep(self, path: str) -> Any:
        assert self.lockstep_url
        return httpx.get(self.lockstep_url + path, timeout=10).json()

    def lockstep_prioritize(self, pod: dict[str, Any]) -> list[dict[str, Any]]:
        """Ask Lockstep's prioritize verb directly, as kube-scheduler would."""
        assert self.lockstep_url
        nodes = [n["metadata"]["name"] for n in self.kube.list("/api/v1/nodes")]
        pod["metadata"]["namespace"] = self.ns
        r = httpx.post(self.lockstep_url + "/prioritize", timeout=10,
                       json={"Pod": pod, "Nodes": None, "NodeNames": nodes})
        r.raise_for_status()
        return list(r.json())

    def metric(self, name: str) -> float:
        assert self.lockstep_url
        for line in httpx.get(self.lockstep_url + "/metrics", timeout=10).text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def delete(self, *names: str) -> None:
        for n in names:
            self.kube.delete_pod(self.ns, n)


ClusterFactory = Callable[..., Cluster]


@pytest.fixture
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ClusterFactory]:
    made: list[Cluster] = []

    def make(topology: str, *, lockstep: bool = True, stock: bool = False,
             lockstep_args: tuple[str, ...] = ("--backoff=3",),
             extra_tokens: dict[str, tuple[str, list[str]]] | None = None,
             volcano: bool = False, k8s: str | None = None, webhook: bool = True,
             dra: bool = False, feature_gates: tuple[str, ...] = ()) -> Cluster:
        bed = TestBed(run_dir=tmp_path / f"bed{len(made)}", extra_tokens=extra_tokens or {},
                      with_volcano=volcano, k8s=k8s or default_k8s(),
                      feature_gates=feature_gates)
        bed.start()
        kube = Kube(bed.api_url, bed.token)
        c = Cluster(bed, kube, BindingRecorder(kube), ns="e2e")
        made.append(c)
        request.node.stash[_BEDS] = [m.bed for m in made]
        nodes = nodes_from_topology(load_topology(topology))
        create_nodes(kube, nodes)  # a DRA node's ResourceSlice too
        kube.ensure_namespace(c.ns)
        c.recorder.start()
        if dra or any(map(is_dra_node, nodes)):  # claims from ResourceClaimTemplates
            bed.start_controller_manager()
        if stock:
            bed.start_scheduler(None, name="kube-scheduler")
        if lockstep:
            c.lockstep_url = bed.start_lockstep(extra_args=lockstep_args, webhook=webhook)
            bed.start_scheduler(SCHEDULER_CONFIG, name="lockstep-scheduler",
                                extender_url=c.lockstep_url)
        return c

    yield make
    # Every run checks DRA allocations as it records bindings: no gang member parked with
    # devices for long, no device held twice (testbed.claims).
    problems = [p for c in made for _, _, p in c.recorder.claim_problems(hold=c.hold)]
    for c in made:
        c.recorder.stop()
        c.bed.stop()
        c.kube.close()
    if problems:
        pytest.fail("DRA claims: " + "; ".join(problems), pytrace=False)


_BEDS = pytest.StashKey[list[TestBed]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.failed and call.when == "call":
        for bed in item.stash.get(_BEDS, []):
            report.sections.append((f"test bed logs ({bed.dir})", bed.tail_logs(30)))
    return report


def grant_as_deployed(bed: TestBed, user: str) -> None:
    """The default install's RBAC, bound to ``user`` standing in for Lockstep's service
    account: ``deploy/rbac.yaml``'s ClusterRole ``lockstep`` and ``deploy/webhook/rbac.yaml``
    (its own webhook certificate: the Secret and the configuration's caBundle), exactly as
    shipped. A Lockstep started under ``name="lockstep"`` then needs nothing more."""
    bed.kubectl("apply", "--server-side", "-f", str(REPO / "deploy" / "namespace.yaml"),
                "-f", str(REPO / "deploy" / "rbac.yaml"))
    subject = {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}
    grants = []
    for d in yaml.safe_load_all((REPO / "deploy" / "webhook" / "rbac.yaml").read_text()):
        if d and d["kind"].endswith("Binding"):
            d["subjects"] = [subject]
        if d:
            grants.append(d)
    grants.append({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": f"lockstep-as-{user}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "lockstep"},
        "subjects": [subject]})
    bed.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(grants))


def settle(seconds: float) -> None:
    """Give kube-scheduler time to make (wrong) decisions we then assert did not happen."""
    time.sleep(seconds)


# An API refusal is logged as "403 Forbidden: ..."; a bare substring "403" also matched the
# extender's port (":41403") in uvicorn's start-up line, which failed CI once.
_FORBIDDEN = re.compile(r"\b403\b|forbidden", re.IGNORECASE)


def assert_not_forbidden(log_path: Path) -> None:
    """Fails when the extender's log shows the API server refusing it anything (an RBAC gap)."""
    hits = [line for line in log_path.read_text().splitlines() if _FORBIDDEN.search(line)]
    assert not hits, "\n".join(hits[-10:])
