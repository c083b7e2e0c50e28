"""Hostile input through the real API server, on the default install: no pod or group object
of any convention stops, freezes or crashes Lockstep.

Lockstep runs as deployed (its admission webhook on, with the certificate it issues itself),
so every pod below passes through the webhook at creation and through the watch afterwards.
Each convention gets a batch of objects whose sizes, counts, timeouts and names are huge,
negative, zero, non-numeric, 4,301 and 5,000 digits long, unicode, or deeply nested JSON;
some are refused by the API server's own validation (CRD schemas, label syntax), which is
counted, not failed. After each batch:

* ``/healthz`` answers within 1 s;
* a normal gang still binds within 20 s;
* the API server called the webhook and was answered (its fail-open count did not move: a
  500 or a timeout would have been ignored and counted there);
* each hostile gang that must be invalid is reported invalid with the field named
  (``/debug/pods``, what ``lockstep explain`` shows);

and at the end Lockstep is the process that started, alive. Every failed check is collected
and the test fails once, listing them all, so a run shows every case still open.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest

from testbed.kube import KubeError
from testbed.workloads import PodBuilder, pod

from .conftest import SCHEDULER_CONFIG, Cluster, ClusterFactory
from .test_webhook import fail_open

K8S_UPSTREAM = "v1.37.2"
KOORD = "gang.scheduling.koordinator.sh/"
LIGHT = "pod-group.scheduling.sigs.k8s.io/"
VOLCANO_PGS = "/apis/scheduling.volcano.sh/v1beta1/namespaces/{ns}/podgroups"
VOLCANO_QUEUES = "/apis/scheduling.volcano.sh/v1beta1/queues"
SP_PGS = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups"
UPSTREAM = "/apis/scheduling.k8s.io/v1beta1/namespaces/{ns}"

DIGITS_4301 = "9" * 4301
DIGITS_5000 = "9" * 5000
DEEP = "[" * 3000 + '"x"' + "]" * 3000
"""Nested past what a recursive JSON decoder takes (Python's json stops near 1,000)."""

BAD_SIZES: dict[str, str] = {
    "ten-million": "10000000", "int32-max": "2147483647",
    "int64-over": "9223372036854775808", "negative": "-5", "zero": "0", "word": "abc",
    "digits-4301": DIGITS_4301, "digits-5000": DIGITS_5000, "cjk": "三", "fraction": "2.5",
    "nested": DEEP,
}
"""Values a gang-size field must refuse: the gang is invalid, with the field named."""
ODD_SIZES: dict[str, str] = {"arabic-digits": "٣", "padded": " 2 ", "plus": "+2"}
"""Values that must not crash anything; whether they are a size is the convention's call."""
BAD_TIMEOUTS: dict[str, str] = {"digits-5000": DIGITS_5000, "negative": "-30", "word": "abc",
                                "huge": "99999999999999999999", "nested": DEEP}
"""Timeouts: refused or capped, never a crash or a wait that long."""
RAW_INTS: dict[str, str] = {"ten-million": "10000000", "int32-max": "2147483647",
                            "int64-over": "9223372036854775808", "negative": "-5", "zero": "0",
                            "digits-5000": DIGITS_5000, "fraction": "2.5",
                            "word": '"abc"', "nested": '{"a":' * 200 + "1" + "}" * 200}
"""JSON values (written raw) for integer fields of group objects; the CRD schemas refuse
many, which is counted."""


@dataclass
class Hostile:
    """What the suite did and found, for the summary line and the failure message."""

    created: int = 0
    refused: int = 0
    checks: int = 0
    failures: list[str] = field(default_factory=list)
    invalid: list[tuple[str, str]] = field(default_factory=list)
    """(pod name, text the field must be named by): gangs that must be reported invalid."""
    refusals: list[str] = field(default_factory=list)
    """What the API server refused and its first words, for a summary."""
    pods: list[str] = field(default_factory=list)
    """Pods created by the batch running (``run_batches(..., cleanup=True)`` deletes them)."""

    def check(self, ok: bool, what: str) -> None:
        if ok:
            self.checks += 1
        else:
            self.failures.append(what)


def default_install(cluster: ClusterFactory, k8s: str | None = None,
                    topology: str = "tiny-3x2", volcano: bool | None = None) -> Cluster:
    """Lockstep as deployed: its webhook on, its own certificate (``test_webhook``).
    ``volcano``: its CRDs served (default: on 1.34, where the Volcano batch runs)."""
    c = cluster(topology, lockstep=False, volcano=k8s is None if volcano is None else volcano,
                **({"k8s": k8s} if k8s else {}))
    c.lockstep_url = c.bed.start_lockstep(extra_args=("--backoff=3",), webhook=True,
                                          webhook_certs="own")
    c.bed.start_scheduler(SCHEDULER_CONFIG, name="lockstep-scheduler",
                          extender_url=c.lockstep_url)
    c.extra["pid"] = c.bed.procs["lockstep"].pid
    c.extra["fail_open"] = fail_open(c)
    return c


def create_pod(c: Cluster, h: Hostile, obj: dict[str, Any], must_name: str | None) -> None:
    """Create a hostile pod; ``must_name``: its gang must be invalid, naming this field."""
    obj["metadata"]["namespace"] = c.ns
    try:
        c.kube.create_pod(obj)
    except KubeError as e:
        if e.status >= 500:
            h.failures.append(f"API server answered {e.status} for pod "
                              f"{obj['metadata']['name']}: {str(e)[:200]}")
        h.refused += 1
        h.refusals.append(f"pod {obj['metadata']['name']}: {e.status} {str(e)[:160]}")
        return
    h.created += 1
    h.pods.append(obj["metadata"]["name"])
    if must_name is not None:
        h.invalid.append((obj["metadata"]["name"], must_name))


def create_raw(c: Cluster, h: Hostile, path: str, body: dict[str, Any],
               raw: dict[str, str] | None = None) -> bool:
    """POST ``body`` with each ``"@name@"`` string replaced by the raw JSON text ``raw[name]``
    (numbers no JSON library here writes); True when the API server created it."""
    data = orjson.dumps(body)
    for k, v in (raw or {}).items():
        data = data.replace(orjson.dumps(f"@{k}@"), v.encode())
    r = httpx.post(c.bed.api_url + path, content=data, verify=False, timeout=30,
                   headers={"Authorization": f"Bearer {c.bed.token}",
                            "Content-Type": "application/json"})
    if r.status_code >= 500:
        h.failures.append(f"API server answered {r.status_code} for {path}: {r.text[:200]}")
    if r.status_code == 201:
        h.created += 1
        return True
    h.refused += 1
    h.refusals.append(f"{path.rsplit('/', 1)[1]} {body['metadata'].get('name')}: "
                      f"{r.status_code} {r.text[:300]}")
    return False


def small(name: str) -> PodBuilder:
    """A pod of 10m CPU and no GPU: one wrongly taken for schedulable holds nothing the
    normal gangs need (3 nodes x 32 CPUs hold thousands)."""
    return pod(name).cpu("10m").memory("10Mi")


def hostile_pod(name: str, annotations: dict[str, str] | None = None,
                labels: dict[str, str] | None = None) -> dict[str, Any]:
    b = small(name)
    for k, v in (annotations or {}).items():
        b.annotate(k, v)
    obj = b.build()
    obj["metadata"]["labels"].update(labels or {})
    return obj


# -------------------------------------------------------------------------- the batches


def lockstep_batch(c: Cluster, h: Hostile) -> None:
    for case, v in BAD_SIZES.items():
        create_pod(c, h, hostile_pod(f"ls-{case}", {"lockstep.dev/pod-group": f"ls-{case}",
                                                    "lockstep.dev/min-member": v}),
                   "min-member")
    for case, v in ODD_SIZES.items():
        create_pod(c, h, hostile_pod(f"ls-odd-{case}", {
            "lockstep.dev/pod-group": f"ls-odd-{case}", "lockstep.dev/min-member": v}), None)
    for case, v in BAD_TIMEOUTS.items():
        create_pod(c, h, hostile_pod(f"ls-timeout-{case}", {
            "lockstep.dev/pod-group": f"ls-timeout-{case}", "lockstep.dev/min-member": "3",
            "lockstep.dev/timeout-seconds": v}), None)
    create_pod(c, h, hostile_pod("ls-unicode", {
        "lockstep.dev/pod-group": "ünïcødé-" + "é" * 300 + "-🙂" * 100,
        "lockstep.dev/min-member": "2"}), None)
    create_pod(c, h, hostile_pod("ls-long-name", {
        "lockstep.dev/pod-group": "g" * 200_000, "lockstep.dev/min-member": "2"}), None)
    terms = [{"matchExpressions": [{"key": "zone", "operator": "In",
                                    "values": [f"z{j}" for j in range(8)]}]}
             for _ in range(3000)]
    for i in range(2):  # both members: the gang has its quorum and is planned
        obj = hostile_pod(f"ls-affinity-{i}", {"lockstep.dev/pod-group": "ls-affinity",
                                               "lockstep.dev/min-member": "2"})
        obj["spec"]["affinity"] = {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}
        create_pod(c, h, obj, None)
    h.invalid.append(("ls-affinity-0", "nodeSelectorTerms"))


def koordinator_batch(c: Cluster, h: Hostile) -> None:
    for case, v in BAD_SIZES.items():
        create_pod(c, h, hostile_pod(f"koord-{case}", {KOORD + "name": f"koord-{case}",
                                                       KOORD + "min-available": v}),
                   "min-available")
        create_pod(c, h, hostile_pod(f"koord-total-{case}", {
            KOORD + "name": f"koord-total-{case}", KOORD + "min-available": "2",
            KOORD + "total-number": v}), None)
        create_pod(c, h, hostile_pod(f"light-{case}", {LIGHT + "min-available": v},
                                     {LIGHT + "name": f"light-{case}"}), "min-available")
    for case, v in BAD_TIMEOUTS.items():
        create_pod(c, h, hostile_pod(f"koord-wait-{case}", {
            KOORD + "name": f"koord-wait-{case}", KOORD + "min-available": "3",
            KOORD + "waiting-time": v}), None)
    for case, v in {"nested": DEEP, "long": '["' + "a/b" * 50_000 + '"]',
                    "many": orjson.dumps([f"e2e/g{i}" for i in range(10_000)]).decode(),
                    "object": '{"a": {"b": [1, 2, {"c": null}]}}'}.items():
        create_pod(c, h, hostile_pod(f"koord-groups-{case}", {
            KOORD + "name": f"koord-groups-{case}", KOORD + "min-available": "2",
            KOORD + "groups": v}), "groups")


def kueue_batch(c: Cluster, h: Hostile) -> None:
    for case, v in {**BAD_SIZES, **ODD_SIZES}.items():
        obj = hostile_pod(f"kueue-{case}", {"kueue.x-k8s.io/pod-group-total-count": v},
                          {"kueue.x-k8s.io/pod-group-name": f"kueue-{case}"})
        create_pod(c, h, obj, "pod-group-total-count" if case in BAD_SIZES else None)
    # A label value over 63 characters: the API server refuses it (counted).
    create_pod(c, h, hostile_pod("kueue-label", {"kueue.x-k8s.io/pod-group-total-count": "2"},
                                 {"kueue.x-k8s.io/pod-group-name": "x" * 64}), None)


def scheduler_plugins_batch(c: Cluster, h: Hostile) -> None:
    path = SP_PGS.format(ns=c.ns)
    for case, v in RAW_INTS.items():
        name = f"sp-{case}"
        body = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
                "metadata": {"name": name}, "spec": {"minMember": "@v@"}}
        if create_raw(c, h, path, body, {"v": v}):
            create_pod(c, h, small(f"{name}-0").sp_group(name).build(), "minMember")
        timeout = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
                   "metadata": {"name": f"sp-timeout-{case}"},
                   "spec": {"minMember": 3, "scheduleTimeoutSeconds": "@v@"}}
        if create_raw(c, h, path, timeout, {"v": v}):
            create_pod(c, h, small(f"sp-timeout-{case}-0").sp_group(f"sp-timeout-{case}")
                       .build(), None)
    for case, q in {"digits-5000": DIGITS_5000, "exponent": "9e99999", "negative": "-8",
                    "word": "lots"}.items():
        name = f"sp-res-{case}"
        body = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
                "metadata": {"name": name},
                "spec": {"minMember": 1, "minResources": {"nvidia.com/gpu": q}}}
        if create_raw(c, h, path, body):
            create_pod(c, h, small(f"{name}-0").sp_group(name).build(), None)


def volcano_batch(c: Cluster, h: Hostile) -> None:
    path = VOLCANO_PGS.format(ns=c.ns)
    for case, v in RAW_INTS.items():
        name = f"vc-{case}"
        body = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                "metadata": {"name": name}, "spec": {"minMember": "@v@", "queue": "default"}}
        if create_raw(c, h, path, body, {"v": v}):
            create_pod(c, h, hostile_pod(f"{name}-0", {"scheduling.k8s.io/group-name": name}),
                       "minMember")
    for case, v in BAD_SIZES.items():
        create_pod(c, h, hostile_pod(f"vc-ann-{case}", {
            "scheduling.k8s.io/group-name": f"vc-ann-{case}",
            "scheduling.volcano.sh/group-min-member": v}), None)
    for case, q in {"digits-5000": DIGITS_5000, "exponent": "9e99999", "negative": "-8"}.items():
        queue = f"q-{case}"
        created = create_raw(c, h, VOLCANO_QUEUES, {
            "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
            "metadata": {"name": queue},
            "spec": {"weight": "@w@", "capability": {"nvidia.com/gpu": q, "cpu": q}}},
            {"w": "2147483647"})
        name = f"vc-queue-{case}"
        if create_raw(c, h, path, {
                "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                "metadata": {"name": name},
                "spec": {"minMember": 1, "queue": queue if created else "default",
                         "minResources": {"nvidia.com/gpu": q}}}):
            create_pod(c, h, hostile_pod(f"{name}-0", {"scheduling.k8s.io/group-name": name}),
                       None)
    # Queue demand with no pods at all: minMember 2^31-1 in a queue.
    create_raw(c, h, path, {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                            "metadata": {"name": "vc-empty"},
                            "spec": {"minMember": "@v@", "queue": "default"}},
               {"v": "2147483647"})


def upstream_batch(c: Cluster, h: Hostile) -> None:
    api = UPSTREAM.format(ns=c.ns)
    for case, v in RAW_INTS.items():
        name = f"up-{case}"
        create_raw(c, h, f"{api}/workloads", {
            "apiVersion": "scheduling.k8s.io/v1beta1", "kind": "Workload",
            "metadata": {"name": name},
            "spec": {"controllerRef": {"apiGroup": "batch", "kind": "Job", "name": name},
                     "podGroupTemplates": [{"name": "workers", "schedulingPolicy": {
                         "gang": {"minCount": "@v@"}}}]}}, {"v": v})
        if create_raw(c, h, f"{api}/podgroups", {
                "apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
                "metadata": {"name": name},
                "spec": {"workloadRef": {"workloadName": name, "templateName": "workers"},
                         "schedulingPolicy": {"gang": {"minCount": "@v@"}}}}, {"v": v}):
            obj = small(f"{name}-0").build()
            obj["spec"]["schedulingGroup"] = {"podGroupName": name}
            create_pod(c, h, obj, "minCount")


# ------------------------------------------------------------------------------ the checks


def healthy_and_binding(c: Cluster, h: Hostile, batch: str,
                        claim_template: str | None = None) -> None:
    """``/healthz`` within 1 s, a normal gang bound within 20 s, the webhook answered.
    ``claim_template``: the normal gang's members claim a DRA GPU each from it (else one
    ``nvidia.com/gpu`` each)."""
    assert c.lockstep_url
    t = time.monotonic()
    try:
        ok = httpx.get(c.lockstep_url + "/healthz", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        ok = False
    h.check(ok and time.monotonic() - t < 1.0, f"{batch}: /healthz did not answer 200 in 1 s")
    names = [f"ok-{batch}-0", f"ok-{batch}-1"]
    for n in names:
        b = pod(n).gang(f"ok-{batch}", 2)
        obj = (b.claim(template=claim_template) if claim_template else b.gpu(1)).build()
        obj["metadata"]["namespace"] = c.ns
        c.kube.create_pod(obj)
    try:
        c.wait_bound(names, 20)
        h.check(True, "")
    except TimeoutError:
        h.failures.append(f"{batch}: a normal gang of 2 did not bind within 20 s")
    c.delete(*names)  # its GPUs back for the next batch
    moved = fail_open(c) - c.extra["fail_open"]
    h.check(moved == 0, f"{batch}: the API server ignored {moved:g} failed webhook call(s)")
    c.extra["fail_open"] = fail_open(c)
    alive = c.bed.procs["lockstep"].alive()
    h.check(alive, f"{batch}: Lockstep exited")
    if not alive:
        pytest.fail("Lockstep exited:\n" + c.bed.tail("lockstep", 40) + "\n"
                    + "\n".join(h.failures))


def explanation(c: Cluster, name: str) -> str:
    assert c.lockstep_url
    try:
        r = httpx.get(f"{c.lockstep_url}/debug/pods/{c.ns}/{name}", timeout=5)
    except httpx.HTTPError as e:
        return f"(no answer: {e!r})"
    return str(r.json().get("explanation") or r.json())


def reported_invalid(c: Cluster, h: Hostile) -> None:
    """Each gang that must be invalid says so and names the field (within 10 s of the
    watch seeing it)."""
    deadline = time.monotonic() + 10
    for name, field_name in h.invalid:
        while True:
            text = explanation(c, name)
            ok = field_name in text and ("invalid" in text or "at most" in text)
            if ok or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        h.check(ok, f"{name}: not reported invalid naming {field_name!r}: {text[:300]}")
    h.invalid.clear()


def run_batches(c: Cluster, h: Hostile, batches: dict[str, Callable[[Cluster, Hostile], None]],
                capsys: pytest.CaptureFixture[str], claim_template: str | None = None,
                cleanup: bool = False) -> None:
    """``claim_template``: the normal gang's DRA claims; ``cleanup``: each batch's pods are
    deleted after its checks (its other objects stay)."""
    for batch, make in batches.items():
        before = len(h.failures)
        t0 = time.monotonic()
        make(c, h)
        made = time.monotonic() - t0
        healthy_and_binding(c, h, batch, claim_template)
        reported_invalid(c, h)
        if cleanup:
            c.delete(*h.pods)
        h.pods.clear()
        with capsys.disabled():
            print(f"\n  hostile batch {batch}: {h.created} created, {h.refused} refused so far; "
                  f"{len(h.failures) - before} failed check(s); made in {made:.1f} s, "
                  f"checked in {time.monotonic() - t0 - made:.1f} s", flush=True)
    pid = c.bed.procs["lockstep"].pid
    h.check(pid == c.extra["pid"] and c.bed.procs["lockstep"].alive(),
            "Lockstep is not the process that started (it exited or was restarted)")
    stopped = [line for line in (c.bed.dir / "lockstep.log").read_text().splitlines()
               if "stopped:" in line and "task" in line]
    h.check(not stopped, f"a Lockstep task stopped: {stopped[:3]}")
    with capsys.disabled():
        print(f"\nhostile suite: {h.created} objects created, {h.refused} refused by the API "
              f"server, {h.checks} checks passed, {len(h.failures)} failed", flush=True)
    assert not h.failures, "\n".join(h.failures)


def test_hostile_pods_and_group_objects_of_every_convention_never_stop_lockstep(
    cluster: ClusterFactory, capsys: pytest.CaptureFixture[str],
) -> None:
    c = default_install(cluster)
    run_batches(c, Hostile(), {
        "lockstep": lockstep_batch, "koordinator": koordinator_batch, "kueue": kueue_batch,
        "scheduler-plugins": scheduler_plugins_batch, "volcano": volcano_batch}, capsys)


def test_hostile_upstream_podgroups_and_workloads_never_stop_lockstep(
    cluster: ClusterFactory, capsys: pytest.CaptureFixture[str],
) -> None:
    """scheduling.k8s.io Workload and PodGroup (served by Kubernetes 1.37's test bed)."""
    c = default_install(cluster, K8S_UPSTREAM)
    run_batches(c, Hostile(), {"upstream": upstream_batch}, capsys)
