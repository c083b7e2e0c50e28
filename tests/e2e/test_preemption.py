"""Gang-aware preemption on the real test bed (kube-apiserver, the stock kube-scheduler with
Lockstep's profile, KWOK nodes): an urgent gang evicts whole lower-priority gangs and plain
pods, never a partial victim, and nothing is evicted when preemption cannot help.

The operator's two cases from the issue, on the 3 x 2-GPU bed:

* a low-priority 4 x 1-GPU gang runs; a high-priority 4 x 1-GPU gang arrives: the low gang is
  evicted whole (all four pods, ``DisruptionTarget`` set, a ``Preempted`` Event naming the
  preemptor) and the high gang binds in full;
* six low-priority 1-GPU plain pods fill the bed; a high-priority 2 x 2-GPU gang arrives:
  exactly four plain pods go, on two nodes (the fewest), and the gang binds in full.

With Kubeflow's real training-operator: a high-priority PyTorchJob preempts a running
low-priority one; the operator recreates the evicted pods, which wait with zero bound while
the high job runs, and run in full once it is deleted.

A Volcano PodGroup whose ``priorityClassName`` is high preempts although its pods carry no
priority of their own.

And the guards, each with nothing evicted: a high-priority gang too big even after evicting
everything, a gang of equal priority, and a high-priority gang whose class says
``preemptionPolicy: Never``. The binding recorder asserts no partial gang throughout.
"""

from __future__ import annotations

import re
from typing import Any

import httpx

from testbed.kubeflow import JOBS, delete_job, pytorchjob, start_training_operator
from testbed.workloads import pod, podgroup

from .conftest import Cluster, ClusterFactory, settle

HIGH, LOW, NEVER = ("e2e-high", 100000), ("e2e-low", 10), ("e2e-high-never", 100000)


def priority_classes(c: Cluster) -> None:
    for (name, value), policy in ((HIGH, "PreemptLowerPriority"), (LOW, "PreemptLowerPriority"),
                                  (NEVER, "Never")):
        c.kube.create("/apis/scheduling.k8s.io/v1/priorityclasses", {
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name}, "value": value, "preemptionPolicy": policy})


def gang(c: Cluster, ns: str, name: str, size: int, gpus: int,
         cls: tuple[str, int]) -> list[str]:
    c.kube.create(f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups",
                  podgroup(name, size, ns))
    c.recorder.min_member_of[f"{ns}/{name}"] = size
    names = []
    for i in range(size):
        obj = pod(f"{name}-{i}", ns).sp_group(name).gpu(gpus).priority(cls[1], cls[0]).build()
        if cls == NEVER:
            obj["spec"]["preemptionPolicy"] = "Never"  # admission copies it from the class
        obj["spec"]["terminationGracePeriodSeconds"] = 0
        c.kube.create_pod(obj)
        names.append(obj["metadata"]["name"])
    return names


def plain(c: Cluster, ns: str, name: str, cls: tuple[str, int]) -> str:
    obj = pod(name, ns).gpu(1).priority(cls[1], cls[0]).build()
    obj["spec"]["terminationGracePeriodSeconds"] = 0
    c.kube.create_pod(obj)
    return name


def metric(c: Cluster, name: str, labels: str = "") -> float:
    assert c.lockstep_url
    text = httpx.get(c.lockstep_url + "/metrics", timeout=10).text
    m = re.search(rf"^{name}(?:\{{{labels}\}})? (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def deleted(c: Cluster, ns: str, names: list[str]) -> set[str]:
    left = {p["metadata"]["name"] for p in c.kube.pods(ns)}
    return {n for n in names if n not in left}


def gang_reason(c: Cluster, key: str) -> str:
    gangs = {g["gang"]: g for g in c.lockstep("/debug/gangs")["gangs"]}
    return str((gangs.get(key) or {}).get("reason") or "")


def test_an_urgent_gang_evicts_a_whole_low_gang_and_runs_in_full(cluster: ClusterFactory
                                                                   ) -> None:
    c = cluster("tiny-3x2")
    c.kube.delete("/api/v1/nodes/" + sorted(
        n["metadata"]["name"] for n in c.kube.list("/api/v1/nodes"))[-1])  # 4 GPUs left
    priority_classes(c)
    ns = "pre-gang"
    c.kube.ensure_namespace(ns)
    low = gang(c, ns, "low", 4, 1, LOW)
    c.recorder.wait_bound(ns, low, 30)
    victims_seen: list[dict[str, Any]] = []

    def watch_low() -> bool:
        for p in c.kube.pods(ns):
            if p["metadata"]["name"] in low and p["metadata"].get("deletionTimestamp"):
                victims_seen.append(p)
        return False

    high = gang(c, ns, "high", 4, 1, HIGH)
    try:
        c.kube.wait("the high gang bound in full", lambda: watch_low() or (
            sum(n in c.recorder.bound(ns) for n in high) == 4), 60)
    except TimeoutError as e:  # say where it stopped: the gangs as Lockstep sees them
        raise AssertionError(f"{e}; Lockstep's gangs: {c.lockstep('/debug/gangs')}") from e
    assert deleted(c, ns, low) == set(low), "the low gang is evicted whole"
    events = [e for n in low for e in c.kube.events(ns, n) if e["reason"] == "Preempted"]
    assert {e["involvedObject"]["name"] for e in events} == set(low)
    assert all(f"{ns}/high" in e["message"] for e in events)
    assert metric(c, "lockstep_preemptions_total") == 1.0
    assert metric(c, "lockstep_preemption_victims_total", 'kind="gang"') == 1.0
    assert metric(c, "lockstep_preemption_victims_total", 'kind="pod"') == 0.0
    c.recorder.assert_gang_invariants(ns)


def test_an_urgent_gang_evicts_exactly_the_plain_pods_it_needs_on_the_fewest_nodes(
        cluster: ClusterFactory) -> None:
    c = cluster("tiny-3x2")
    priority_classes(c)
    ns = "pre-plain"
    c.kube.ensure_namespace(ns)
    infer = [plain(c, ns, f"infer-{i}", LOW) for i in range(6)]
    bound = c.recorder.wait_bound(ns, infer, 30)
    high = gang(c, ns, "high", 2, 2, HIGH)
    c.recorder.wait_bound(ns, high, 60)
    gone = deleted(c, ns, infer)
    assert len(gone) == 4, gone
    assert len({bound[n] for n in gone}) == 2, "two nodes emptied, not four pods spread"
    assert {c.recorder.bound(ns)[n] for n in high} == {bound[n] for n in gone}
    assert metric(c, "lockstep_preemption_victims_total", 'kind="pod"') == 4.0
    c.recorder.assert_gang_invariants(ns)


def test_an_urgent_plain_pod_evicts_the_pods_of_one_node_and_binds_there(
        cluster: ClusterFactory) -> None:
    """A plain pod of Lockstep's profile preempts too. kube-scheduler's own filters find no
    node for a 2-GPU pod on a bed full of 1-GPU ones, so it calls no extender: Lockstep's
    sweep sees the pod Unschedulable, evicts the two pods of one node, holds that room for
    it and wakes it once they are gone; kube-scheduler binds it there. A lower-priority
    pod arriving meanwhile does not take the room."""
    c = cluster("tiny-3x2")
    priority_classes(c)
    ns = "pre-plain-pod"
    c.kube.ensure_namespace(ns)
    infer = [plain(c, ns, f"infer-{i}", LOW) for i in range(6)]
    bound = c.recorder.wait_bound(ns, infer, 30)
    obj = pod("urgent", ns).gpu(2).priority(HIGH[1], HIGH[0]).build()
    obj["spec"]["terminationGracePeriodSeconds"] = 0
    c.kube.create_pod(obj)
    try:
        c.recorder.wait_bound(ns, ["urgent"], 60)
    except TimeoutError as e:
        raise AssertionError(f"{e}; Lockstep: {c.lockstep(f'/debug/pods/{ns}/urgent')}") from e
    gone = deleted(c, ns, infer)
    assert len(gone) == 2, gone
    assert {bound[n] for n in gone} == {c.recorder.bound(ns)["urgent"]}
    assert metric(c, "lockstep_preemptions_total") == 1.0
    assert metric(c, "lockstep_preemption_victims_total", 'kind="pod"') == 2.0
    events = [e for n in gone for e in c.kube.events(ns, n) if e["reason"] == "Preempted"]
    assert {e["involvedObject"]["name"] for e in events} == gone
    assert all(f"{ns}/urgent" in e["message"] for e in events)


def test_nothing_is_evicted_when_preemption_cannot_help_or_is_not_allowed(
        cluster: ClusterFactory) -> None:
    c = cluster("tiny-3x2")
    priority_classes(c)
    ns = "pre-guards"
    c.kube.ensure_namespace(ns)
    low = gang(c, ns, "low", 4, 1, LOW)
    c.recorder.wait_bound(ns, low, 30)
    too_big = gang(c, ns, "huge", 4, 2, HIGH)  # 8 GPUs on a 6-GPU bed
    same = gang(c, ns, "peer", 3, 1, LOW)
    never = gang(c, ns, "polite", 3, 1, NEVER)
    settle(8.0)  # several filter rounds for each gang
    assert deleted(c, ns, low) == set(), "a victim was evicted"
    bound = c.recorder.bound(ns)
    for names in (too_big, same, never):
        assert not any(n in bound for n in names)
    assert "even after evicting" in gang_reason(c, f"{ns}/huge")
    assert "no bound pod of its quota has a lower priority" in gang_reason(c, f"{ns}/peer")
    assert "preemptionPolicy is Never" in gang_reason(c, f"{ns}/polite")
    assert metric(c, "lockstep_preemptions_total") == 0.0
    c.recorder.assert_gang_invariants(ns)


def test_a_volcano_podgroups_priority_class_makes_it_preempt(cluster: ClusterFactory) -> None:
    """Volcano's scheduler takes a job's priority from its PodGroup's ``priorityClassName``;
    the pods here name no class (priority 0, below the low gang's 10), so only the group's
    class can make this gang preempt. The low gang goes whole, the Volcano gang binds 4/4."""
    c = cluster("tiny-3x2", volcano=True)
    c.kube.delete("/api/v1/nodes/" + sorted(
        n["metadata"]["name"] for n in c.kube.list("/api/v1/nodes"))[-1])  # 4 GPUs left
    priority_classes(c)
    ns = "pre-volcano"
    c.kube.ensure_namespace(ns)
    low = gang(c, ns, "low", 4, 1, LOW)
    c.recorder.wait_bound(ns, low, 30)
    c.kube.create(f"/apis/scheduling.volcano.sh/v1beta1/namespaces/{ns}/podgroups", {
        "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
        "metadata": {"name": "urgent", "namespace": ns},
        "spec": {"minMember": 4, "queue": "default", "priorityClassName": HIGH[0],
                 "minResources": {"nvidia.com/gpu": "4"}}})
    c.recorder.min_member_of[f"{ns}/urgent"] = 4
    urgent = []
    for i in range(4):
        obj = pod(f"urgent-{i}", ns).annotate("scheduling.k8s.io/group-name", "urgent") \
            .gpu(1).build()
        obj["spec"]["terminationGracePeriodSeconds"] = 0
        c.kube.create_pod(obj)
        urgent.append(obj["metadata"]["name"])
    assert all(p["spec"].get("priority", 0) == 0 for p in c.kube.pods(ns)
               if p["metadata"]["name"] in urgent)
    c.kube.wait("the Volcano gang bound in full", lambda: sum(
        n in c.recorder.bound(ns) for n in urgent) == 4, 60)
    assert deleted(c, ns, low) == set(low), "the low gang is evicted whole"
    assert metric(c, "lockstep_preemptions_total") == 1.0
    c.recorder.assert_gang_invariants(ns)


def test_a_high_priority_pytorchjob_preempts_a_low_one_which_waits_whole_then_runs(
        cluster: ClusterFactory) -> None:
    c = cluster("tiny-3x2")
    c.kube.delete("/api/v1/nodes/" + sorted(
        n["metadata"]["name"] for n in c.kube.list("/api/v1/nodes"))[-1])  # 4 GPUs left
    priority_classes(c)
    start_training_operator(c.bed, "lockstep")
    pods = {job: [f"{job}-worker-{i}" for i in range(4)] for job in ("low", "high")}
    c.recorder.min_member_of.update({f"{c.ns}/{job}": 4 for job in pods})
    c.kube.create(JOBS.format(ns=c.ns), pytorchjob("low", workers=4, scheduler_name=None,
                                                   priority_class=LOW[0]))
    c.wait_bound(pods["low"], 60)
    first = {p["metadata"]["name"]: p["metadata"]["uid"] for p in c.kube.pods(c.ns)}
    c.kube.create(JOBS.format(ns=c.ns), pytorchjob("high", workers=4, scheduler_name=None,
                                                   priority_class=HIGH[0]))
    c.wait_bound(pods["high"], 90)
    # The low job's pods were evicted (all four) and recreated by the operator: they wait,
    # none bound, while the high job holds the GPUs.
    c.kube.wait("the low job's pods recreated", lambda: sorted(
        p["metadata"]["name"] for p in c.kube.pods(c.ns)
        if p["metadata"]["name"] in pods["low"]
        and p["metadata"]["uid"] != first[p["metadata"]["name"]]) == pods["low"], 60)
    settle(3)
    now = {p["metadata"]["name"]: p for p in c.kube.pods(c.ns)}
    assert not any(now[n]["spec"].get("nodeName") for n in pods["low"])
    assert metric(c, "lockstep_preemption_victims_total", 'kind="gang"') == 1.0
    c.recorder.assert_gang_invariants(c.ns)
    delete_job(c.kube, c.ns, "high")
    c.kube.wait("the low job bound in full again", lambda: all(
        (p := {q["metadata"]["name"]: q for q in c.kube.pods(c.ns)}.get(n)) is not None
        and p["spec"].get("nodeName") for n in pods["low"]), 90)
    assert metric(c, "lockstep_preemptions_total") == 1.0
    c.recorder.assert_gang_invariants(c.ns)
