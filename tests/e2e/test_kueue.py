"""Real Kueue v0.17.0 in front of Lockstep on the test bed: Kueue admits pod groups against
quota, Lockstep places what Kueue admitted, whole or not at all.

Kueue's manager runs out of a cluster with its webhooks (testbed/kueue.py says what it needs);
the pods are what users write for Kueue's pod-group integration (queue and group labels, the
total-count annotation, ``schedulerName: lockstep``), and Kueue's webhook gates them. Every
scenario asserts with the binding recorder that no gang was ever partially bound.

- quota above capacity: Kueue admits two 4-GPU groups on 6 GPUs (8 GPUs of quota); Lockstep
  runs one whole and binds nothing of the other until the first one's pods are deleted (Kueue
  keeps that group's quota: a deleted pod of a retriable group awaits a replacement).
- quota below capacity: Kueue holds a team's groups beyond its 4 GPUs behind its gate while
  another team's group is admitted beside them; deleting the running group's Workload (how
  Kueue ends a pod group) frees the quota and the next group is admitted and placed whole.
- a cohort: a team borrowing another's unused quota is evicted whole when the lender reclaims
  it, and within a ClusterQueue a higher-priority group evicts a lower-priority one.
- a group with fewer pods than its total count: gated, no Workload admitted, until the last
  pod exists; then bound whole.
"""

from __future__ import annotations

import time
from typing import Any

from testbed import kueue
from testbed.kueue import ADMISSION_GATE, TOPOLOGY_GATE

from .conftest import Cluster, ClusterFactory, settle


def start(c: Cluster, *queues: dict[str, Any], local: dict[str, str]) -> str:
    """Kueue running, one ResourceFlavor, ``queues`` (ClusterQueues) and the LocalQueues
    ``local`` (name -> ClusterQueue) in the test's namespace; what it took, for the report."""
    t0 = time.monotonic()
    kueue.start_kueue(c.bed)
    t1 = time.monotonic()
    kueue.create(c.kube, kueue.resource_flavor())
    for cq in queues:
        kueue.create(c.kube, cq)
    for name, cq_name in local.items():
        kueue.create(c.kube, kueue.local_queue(name, cq_name), ns=c.ns)
    s = c.bed.startup_seconds
    return (f"Kueue ready in {t1 - t0:.1f}s (certificates, CRDs, webhook configurations "
            f"{s['kueue-prerequisites']:.1f}s, manager {s['kueue']:.1f}s, webhook called "
            f"{s['kueue-webhook']:.1f}s), queues Active {time.monotonic() - t1:.1f}s")


def submit(c: Cluster, group: str, size: int, queue: str, **kw: Any) -> list[str]:
    c.create(*kueue.group_pods(group, size, queue, **kw))
    return c.names(group, size)


def workload(c: Cluster, group: str) -> dict[str, Any] | None:
    """The Workload Kueue made for a pod group (named after the group)."""
    return next((w for w in kueue.workloads(c.kube, c.ns) if w["metadata"]["name"] == group),
                None)


def admitted(c: Cluster, group: str) -> bool:
    wl = workload(c, group)
    return wl is not None and kueue.workload_admitted(wl)


def gates(c: Cluster, name: str) -> list[str]:
    return [g["name"] for g in c.kube.pod(c.ns, name)["spec"].get("schedulingGates") or ()]


def whole(c: Cluster, groups: list[str], size: int) -> str | None:
    """The first of ``groups`` with all ``size`` pods bound."""
    bound = c.bound()
    return next((g for g in groups if all(f"{g}-{i}" in bound for i in range(size))), None)


def none_bound(c: Cluster, group: str) -> bool:
    return not any(n.startswith(f"{group}-") for n in c.bound())


def running(c: Cluster) -> list[str]:
    """Pods on a node that hold it: not terminal, not being deleted."""
    return sorted(p["metadata"]["name"] for p in c.kube.pods(c.ns)
                  if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
                  and p["status"].get("phase") not in ("Succeeded", "Failed"))


def stopped(c: Cluster, names: list[str]) -> bool:
    """Every pod of ``names`` gone or terminal (a deleted pod Kueue still holds by its
    finalizer stays Failed, as a kubelet leaves it)."""
    pods = {p["metadata"]["name"]: p for p in c.kube.pods(c.ns)}
    return all(n not in pods or pods[n]["status"].get("phase") in ("Succeeded", "Failed")
               for n in names)


def condition(wl: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    return next((dict(x) for x in ((wl or {}).get("status") or {}).get("conditions") or ()
                 if x.get("type") == kind and x.get("status") == "True"), None)


def test_kueue_admits_two_groups_above_capacity_lockstep_runs_one_whole(
    cluster: ClusterFactory,
) -> None:
    """8 GPUs of quota on 6 GPUs: Kueue admits both 4-GPU groups and ungates all 8 pods;
    Lockstep binds one group in full and nothing of the other until the first is deleted."""
    c = cluster("tiny-3x2")
    setup = start(c, kueue.cluster_queue("team", gpus=8), local={"team": "team"})

    t0 = time.monotonic()
    for i in range(4):  # interleaved, as two users would submit them
        c.create(*kueue.group_pods("x", 4, "team")[i:i + 1],
                 *kueue.group_pods("y", 4, "team")[i:i + 1])
    c.kube.wait("both Workloads admitted", lambda: admitted(c, "x") and admitted(c, "y"), 30)
    t_admitted = time.monotonic() - t0
    names = c.names("x", 4) + c.names("y", 4)
    c.kube.wait("Kueue's gates off all 8 pods", lambda: not any(gates(c, n) for n in names), 30)
    first = c.kube.wait("one group bound in full", lambda: whole(c, ["x", "y"], 4), 60)
    t_first = time.monotonic() - t0
    other = "y" if first == "x" else "x"
    settle(3)
    assert none_bound(c, other), c.bound()
    assert all(c.kube.pod(c.ns, n)["status"].get("phase") == "Pending"
               for n in c.names(other, 4))
    assert admitted(c, other)  # Kueue let it go; Lockstep is what holds it back, whole
    why = c.lockstep(f"/debug/pods/{c.ns}/{other}-0")["explanation"]
    assert f"gang {c.ns}/{other} does not fit" in why, why
    c.recorder.assert_gang_invariants(c.ns)

    t1 = time.monotonic()
    c.delete(*c.names(first, 4))  # the first job is done: its pods are deleted
    c.wait_bound(c.names(other, 4), 60)
    t_second = time.monotonic() - t1
    settle(1)
    assert running(c) == c.names(other, 4)
    c.recorder.assert_gang_invariants(c.ns)
    # Kueue keeps a retriable group's quota when its pods are deleted: they turn Failed (as a
    # kubelet leaves them), its finalizer holds them, and the Workload waits for replacements.
    assert stopped(c, c.names(first, 4))
    wl = workload(c, first)
    assert kueue.workload_admitted(wl or {}) and condition(wl, "WaitingForReplacementPods"), wl
    print(f"\n[quota above capacity] {setup}; both "
          f"admitted {t_admitted:.1f}s after submission; {first} bound in full at "
          f"{t_first:.1f}s, {other} 0/4 bound; {other} bound in full {t_second:.1f}s after "
          f"{first}'s pods were deleted")


def test_kueue_holds_groups_beyond_quota_gated_lockstep_places_admitted_ones_whole(
    cluster: ClusterFactory,
) -> None:
    """Team A's ClusterQueue has 4 GPUs: of its three 4-GPU groups one is admitted and placed
    whole, two stay behind Kueue's gate with no pod bound; team B's 2-GPU group is admitted
    and placed beside it. When A's first group's Workload is deleted, the next is admitted
    and placed."""
    c = cluster("tiny-3x2")
    setup = start(c, kueue.cluster_queue("team-a", gpus=4),
                    kueue.cluster_queue("team-b", gpus=2),
                    local={"a": "team-a", "b": "team-b"})

    t0 = time.monotonic()
    a_groups = ["a1", "a2", "a3"]
    for g in a_groups:
        submit(c, g, 4, "a")
    submit(c, "b1", 2, "b")
    first = c.kube.wait("one of A's groups admitted", lambda: next(
        (g for g in a_groups if admitted(c, g)), None), 30)
    c.kube.wait("B's group admitted", lambda: admitted(c, "b1"), 30)
    t_admitted = time.monotonic() - t0
    c.wait_bound(c.names(first, 4) + c.names("b1", 2), 60)
    t_bound = time.monotonic() - t0
    settle(3)
    held = [g for g in a_groups if g != first]
    for g in held:
        assert not admitted(c, g), workload(c, g)
        assert none_bound(c, g), c.bound()
        for n in c.names(g, 4):  # behind Kueue's gates, not in kube-scheduler's queue
            assert ADMISSION_GATE in gates(c, n), (n, gates(c, n))
    assert sorted(c.bound()) == sorted(c.names(first, 4) + c.names("b1", 2))
    c.recorder.assert_gang_invariants(c.ns)

    t1 = time.monotonic()
    # A's group is ended the way Kueue documents for a pod group (deleting its pods would not
    # do: Kueue keeps a retriable group's quota for replacement pods): delete its Workload.
    # Kueue deletes the pods, lets them go and frees the quota.
    c.kube.delete(f"{kueue.WORKLOADS.format(ns=c.ns)}/{first}", grace=None)
    following = c.kube.wait("the next of A's groups admitted", lambda: next(
        (g for g in held if admitted(c, g)), None), 30)
    c.wait_bound(c.names(following, 4), 60)
    t_next = time.monotonic() - t1
    last = next(g for g in held if g != following)
    settle(2)
    assert stopped(c, c.names(first, 4))
    assert running(c) == sorted(c.names(following, 4) + c.names("b1", 2))
    assert not admitted(c, last) and none_bound(c, last)
    assert all(ADMISSION_GATE in gates(c, n) for n in c.names(last, 4))
    c.recorder.assert_gang_invariants(c.ns)
    print(f"\n[quota] {setup}; {first} and b1 admitted "
          f"{t_admitted:.1f}s after submission and bound in full at {t_bound:.1f}s; "
          f"{', '.join(held)} held behind Kueue's gate with 0 bound; {following} admitted and "
          f"bound in full {t_next:.1f}s after {first}'s Workload was deleted, {last} still "
          f"held")


def test_kueue_reclaims_borrowed_quota_and_preempts_lower_priority_lockstep_places_whole(
    cluster: ClusterFactory,
) -> None:
    """Two ClusterQueues in one cohort (A: 4 GPUs, B: 2 GPUs; reclaimWithinCohort: Any,
    withinClusterQueue: LowerPriority). B borrows A's unused quota for a 4-GPU group; A's
    4-GPU group reclaims it: Kueue evicts B's group whole and Lockstep places A's whole. Then
    a higher-priority group in A evicts A's running one the same way."""
    c = cluster("tiny-3x2")
    for name, value in (("low", 100), ("high", 1000)):
        c.kube.create("/apis/scheduling.k8s.io/v1/priorityclasses",
                      {"metadata": {"name": name}, "value": value})
    setup = start(c, *(kueue.cluster_queue(name, gpus=gpus, cohort="shared",
                                             reclaim_within_cohort="Any",
                                             within_cluster_queue="LowerPriority")
                         for name, gpus in (("team-a", 4), ("team-b", 2))),
                    local={"a": "team-a", "b": "team-b"})
    # Read at v1beta1, the API server converts through Kueue's conversion webhook (cohortName
    # in v1beta2 is cohort in v1beta1).
    v1beta1 = c.kube.get("/apis/kueue.x-k8s.io/v1beta1/clusterqueues/team-a")
    assert v1beta1["spec"].get("cohort") == "shared", v1beta1["spec"]

    t0 = time.monotonic()
    borrower = submit(c, "b1", 4, "b")
    c.wait_bound(borrower, 60)  # 4 GPUs on B's 2 of quota: 2 borrowed from A
    t_borrowed = time.monotonic() - t0
    assert admitted(c, "b1")

    t1 = time.monotonic()
    low = submit(c, "a-low", 4, "a", priority_class="low")
    c.kube.wait("B's group evicted whole", lambda: stopped(c, borrower), 60)
    c.wait_bound(low, 60)
    t_reclaimed = time.monotonic() - t1
    assert not admitted(c, "b1")
    c.recorder.assert_gang_invariants(c.ns)

    t2 = time.monotonic()
    high = submit(c, "a-high", 4, "a", priority_class="high")
    c.kube.wait("the lower-priority group evicted whole", lambda: stopped(c, low), 60)
    c.wait_bound(high, 60)
    t_preempted = time.monotonic() - t2
    settle(1)
    assert running(c) == sorted(high)
    c.recorder.assert_gang_invariants(c.ns)
    pods = {p["metadata"]["name"]: p for p in c.kube.pods(c.ns)}
    # Kueue evicted each victim whole, every pod, for the reason of its policy
    # (pkg/scheduler/preemption/preemption.go); Lockstep, whose victims get DisruptionTarget,
    # evicted nothing: quota preemption is Kueue's.
    for names, why in ((borrower, "reclamation within the cohort"),
                       (low, "prioritization in the ClusterQueue")):
        for n in names:
            conds = {x["type"]: x for x in pods[n]["status"].get("conditions") or ()}
            assert why in conds.get("TerminationTarget", {}).get("message", ""), (n, conds)
            assert "DisruptionTarget" not in conds, (n, conds)
    assert condition(workload(c, "b1"), "Evicted") or not admitted(c, "b1")
    print(f"\n[cohort] {setup}; b1 borrowing, bound in full "
          f"{t_borrowed:.1f}s after submission; A reclaimed: b1 evicted whole and a-low bound "
          f"in full {t_reclaimed:.1f}s after its submission; a-high preempted a-low whole and "
          f"was bound in full {t_preempted:.1f}s after its submission")


def test_kueue_gates_a_group_until_all_its_pods_exist_then_lockstep_binds_it_whole(
    cluster: ClusterFactory,
) -> None:
    """What Kueue's webhook writes on a group's pod (both of its gates, its finalizer, the
    managed label), and that Kueue admits nothing until the total count of pods exists."""
    c = cluster("tiny-3x2")
    start(c, kueue.cluster_queue("team", gpus=8), local={"team": "team"})
    pods = kueue.group_pods("g", 2, "team")
    c.create(pods[0])
    settle(2)
    meta = c.kube.pod(c.ns, "g-0")["metadata"]
    assert set(gates(c, "g-0")) == {ADMISSION_GATE, TOPOLOGY_GATE}
    assert "kueue.x-k8s.io/managed" in (meta.get("finalizers") or ())
    assert meta["labels"].get("kueue.x-k8s.io/managed") == "true"
    assert not admitted(c, "g") and c.bound() == {}
    t0 = time.monotonic()
    c.create(pods[1])
    c.wait_bound(["g-0", "g-1"], 30)
    t_bound = time.monotonic() - t0
    assert admitted(c, "g")
    c.recorder.assert_gang_invariants(c.ns)
    print(f"\n[gate] 1 of 2 pods: gated, no Workload admitted; the group bound in full "
          f"{t_bound:.1f}s after its second pod was created")
