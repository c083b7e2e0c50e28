"""Kubernetes' own gang API (scheduling.k8s.io Workload / PodGroup) on a real 1.37 API server.

The 1.37.2 test bed serves ``scheduling.k8s.io/v1beta1`` (and ``v1alpha3``) with the
``GenericWorkload`` gate on at the API server, while kube-scheduler runs with it off: its
native gang plugin is out of the picture and Lockstep alone makes the gangs all or nothing.
Objects are what a workload controller writes: a Workload with a gang ``podGroupTemplate``, a
PodGroup per run copying the template's policy, and pods naming it in
``spec.schedulingGroup.podGroupName``. Lockstep runs under exactly its ClusterRole
(deploy/rbac.yaml), so the RBAC for what it reads and writes is proven too.
"""

from __future__ import annotations

from typing import Any

import httpx

from testbed.workloads import pod

from .conftest import (
    SCHEDULER_CONFIG,
    Cluster,
    ClusterFactory,
    assert_not_forbidden,
    grant_as_deployed,
    settle,
)

K8S = "v1.37.2"
API = "/apis/scheduling.k8s.io/v1beta1"
TOKEN = "lockstep-upstream-token"
USER = "lockstep-upstream"
CONDITION = "PodGroupInitiallyScheduled"
RACK = "lockstep.dev/rack"


def workload(name: str, min_count: int) -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "Workload",
            "metadata": {"name": name},
            "spec": {"controllerRef": {"apiGroup": "batch", "kind": "Job", "name": name},
                     "podGroupTemplates": [{
                         "name": "workers",
                         "schedulingPolicy": {"gang": {"minCount": min_count}}}]}}


def podgroup(name: str, min_count: int, version: str = "v1beta1",
             topology: str | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": f"scheduling.k8s.io/{version}", "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {"workloadRef": {"workloadName": name, "templateName": "workers"},
                 "schedulingPolicy": {"gang": {"minCount": min_count}}}}
    if topology is not None:
        obj["spec"]["schedulingConstraints"] = {"topology": [{"key": topology}]}
    return obj


def member(name: str, group: str, gpus: int = 1) -> dict[str, Any]:
    obj = pod(name).gpu(gpus).build()
    obj["spec"]["schedulingGroup"] = {"podGroupName": group}
    return obj


def job(c: Cluster, name: str, size: int) -> None:
    """What a controller creates first: the Workload and this run's PodGroup."""
    c.kube.create(f"{API}/namespaces/{c.ns}/workloads", workload(name, size))
    c.kube.create(f"{API}/namespaces/{c.ns}/podgroups", podgroup(name, size))


def condition(c: Cluster, group: str) -> dict[str, Any]:
    pg = c.kube.get(f"{API}/namespaces/{c.ns}/podgroups/{group}")
    return next((x for x in (pg.get("status") or {}).get("conditions") or ()
                 if x.get("type") == CONDITION), {})


def upstream_bed(cluster: ClusterFactory, topology: str = "tiny-3x2") -> Cluster:
    """A 1.37 bed with Lockstep as installed (its webhook on) running under exactly the
    `lockstep` ClusterRole and its webhook's certificate RBAC."""
    c = cluster(topology, k8s=K8S, lockstep=False,
                extra_tokens={TOKEN: (USER, ["system:authenticated"])})
    bed = c.bed
    grant_as_deployed(bed, USER)
    c.lockstep_url = bed.start_lockstep(kubeconfig=bed.kubeconfig_for(TOKEN, "lockstep"),
                                        extra_args=("--backoff=3",))
    bed.start_scheduler(SCHEDULER_CONFIG, name="lockstep-scheduler",
                        extender_url=c.lockstep_url)
    return c


def no_forbidden(c: Cluster) -> None:
    assert_not_forbidden(c.bed.dir / "lockstep.log")


def test_two_upstream_gangs_on_six_gpus_one_binds_the_other_holds_nothing(
    cluster: ClusterFactory,
) -> None:
    c = upstream_bed(cluster)
    assert c.kube.get("/version")["gitVersion"] == K8S
    for g in ("a", "b"):
        job(c, g, 4)
    for i in range(4):  # interleaved, as two controllers would create them
        c.create(member(f"a-{i}", "a"), member(f"b-{i}", "b"))
    c.kube.wait("one gang bound", lambda: any(
        all(f"{g}-{i}" in c.bound() for i in range(4)) for g in ("a", "b")), 60)
    settle(3)
    bound = c.bound()
    first = next(g for g in ("a", "b") if all(f"{g}-{i}" in bound for i in range(4)))
    other = "b" if first == "a" else "a"
    assert not any(n.startswith(f"{other}-") for n in bound), bound
    c.recorder.assert_gang_invariants(c.ns)

    # The verdicts, where users look: the PodGroup's condition, in the native vocabulary.
    c.kube.wait(f"{first} {CONDITION}=True", lambda: condition(c, first).get("status")
                == "True", 20)
    assert condition(c, first)["reason"] == "Scheduled"
    c.kube.wait(f"{other} {CONDITION}=False", lambda: condition(c, other).get("reason")
                == "Unschedulable", 20)
    assert "does not fit" in condition(c, other)["message"], condition(c, other)

    c.delete(*(f"{first}-{i}" for i in range(4)))  # the first job finishes
    c.wait_bound([f"{other}-{i}" for i in range(4)], 30)
    c.kube.wait(f"{other} {CONDITION}=True", lambda: condition(c, other).get("status")
                == "True", 20)
    c.recorder.assert_gang_invariants(c.ns)
    assert c.recorder.gang_problems(c.ns) == []
    no_forbidden(c)


def test_a_pod_whose_podgroup_arrives_later_binds(cluster: ClusterFactory) -> None:
    c = upstream_bed(cluster)
    c.create(*(member(f"late-{i}", "late") for i in range(2)))
    c.wait_held("late-0", "(scheduling.k8s.io) not found")
    assert c.bound() == {}
    # Created through v1alpha3: the same objects, read at the preferred version (v1beta1).
    c.kube.create(f"/apis/scheduling.k8s.io/v1alpha3/namespaces/{c.ns}/podgroups",
                  podgroup("late", 2, "v1alpha3"))
    c.wait_bound(["late-0", "late-1"], 30)  # woken by the PodGroup, not by a pod event
    c.kube.wait("late condition True", lambda: condition(c, "late").get("status") == "True",
                20)
    c.recorder.assert_gang_invariants(c.ns)
    no_forbidden(c)


def test_a_condition_the_native_plugin_wrote_is_left_alone(cluster: ClusterFactory) -> None:
    """With the gate on at kube-scheduler too, its gang plugin writes the condition as
    "kube-scheduler"; Lockstep must not argue with it in the same status."""
    c = upstream_bed(cluster)
    job(c, "native", 2)
    c.kube.request("PATCH", f"{API}/namespaces/{c.ns}/podgroups/native/status", {
        "status": {"conditions": [{
            "type": CONDITION, "status": "False", "reason": "Unschedulable",
            "message": "written by the native plugin", "lastTransitionTime":
                "2026-01-01T00:00:00Z"}]}},
        params={"fieldManager": "kube-scheduler"},
        content_type="application/strategic-merge-patch+json")
    c.create(*(member(f"native-{i}", "native") for i in range(2)))
    c.wait_bound(["native-0", "native-1"], 30)
    settle(3)  # the status loop runs every second
    assert condition(c, "native")["message"] == "written by the native plugin"


def test_a_topology_constraint_keeps_the_gang_in_one_rack(cluster: ClusterFactory) -> None:
    """``schedulingConstraints.topology[].key`` on the label Lockstep reads racks from: a gang
    no rack can hold waits (and says so) rather than spread; one that fits lands in one."""
    c = upstream_bed(cluster, "racks-2x4-h100")  # 2 racks x 4 nodes x 8 GPUs
    c.kube.create(f"{API}/namespaces/{c.ns}/podgroups", podgroup("wide", 5, topology=RACK))
    c.create(*(member(f"wide-{i}", "wide", gpus=8) for i in range(5)))  # 40 > 32 per rack
    c.kube.wait("wide Unschedulable", lambda: condition(c, "wide").get("reason")
                == "Unschedulable", 30)
    assert "rack" in condition(c, "wide")["message"], condition(c, "wide")
    c.kube.create(f"{API}/namespaces/{c.ns}/podgroups", podgroup("fits", 4, topology=RACK))
    c.create(*(member(f"fits-{i}", "fits", gpus=8) for i in range(4)))
    bound = c.wait_bound([f"fits-{i}" for i in range(4)], 30)
    assert len({n.split("-n")[0] for n in bound.values()}) == 1, bound
    assert not any(n.startswith("wide-") for n in c.bound())
    c.recorder.assert_gang_invariants(c.ns)


def test_lockstep_starts_fine_where_the_api_is_not_served(cluster: ClusterFactory) -> None:
    """The default 1.34 bed has no scheduling.k8s.io PodGroups: nothing fails, gangs work."""
    c = cluster("tiny-3x2")
    assert c.kube.get("/version")["gitVersion"] == "v1.34.10"
    c.create(*(pod(f"g-{i}").gang("g", 2).gpu(1).build() for i in range(2)))
    c.wait_bound(["g-0", "g-1"], 30)
    assert httpx.get(f"{c.lockstep_url}/readyz", timeout=10).status_code == 200
    log = (c.bed.dir / "lockstep.log").read_text()
    assert "upstream-podgroups: scheduling.k8s.io podgroups not served" in log, log[-2000:]
    assert c.bed.procs["lockstep"].alive()
    c.recorder.assert_gang_invariants(c.ns)


def test_a_podgroup_priority_class_makes_its_gang_preempt_a_lower_one(
        cluster: ClusterFactory) -> None:
    """The 1.37 PodGroup's ``priority`` (the API server's admission fills it from
    ``priorityClassName``) is the gang's priority: its pods name no class, yet it evicts a
    lower gang whole (6 pods where 4 GPUs would do: the defaulted ``disruptionMode: single``
    does not split a gang) and binds in full. Lockstep runs under exactly its ClusterRole."""
    c = upstream_bed(cluster)
    for name, value in (("up-high", 100000), ("up-low", 10)):
        c.kube.create("/apis/scheduling.k8s.io/v1/priorityclasses", {
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name}, "value": value})
    job(c, "low", 6)
    low = [f"low-{i}" for i in range(6)]
    for n in low:
        obj = member(n, "low")
        obj["spec"]["priorityClassName"] = "up-low"
        obj["spec"]["terminationGracePeriodSeconds"] = 0
        c.create(obj)
    c.wait_bound(low, 30)
    c.kube.create(f"{API}/namespaces/{c.ns}/workloads", workload("urgent", 4))
    pg = podgroup("urgent", 4)
    pg["spec"]["priorityClassName"] = "up-high"
    created = c.kube.create(f"{API}/namespaces/{c.ns}/podgroups", pg)
    urgent = [f"urgent-{i}" for i in range(4)]
    for n in urgent:
        c.create(member(n, "urgent"))
    c.wait_bound(urgent, 60)
    # What the API server made of it: admission filled the priority from the class, and
    # defaulted disruptionMode to single (Lockstep still evicts the gang whole).
    assert created["spec"]["priority"] == 100000
    assert created["spec"]["disruptionMode"] == {"single": {}}
    c.kube.wait("the low gang evicted whole", lambda: not any(
        p["metadata"]["name"] in low for p in c.kube.pods(c.ns)), 30)
    assert all(p["spec"].get("priority", 0) == 0 for p in c.kube.pods(c.ns)
               if p["metadata"]["name"] in urgent)
    c.recorder.assert_gang_invariants(c.ns)
    no_forbidden(c)
