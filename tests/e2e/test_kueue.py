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
- fair sharing: two teams in a cohort with weights 1 and 2 and a stream of short groups
  from both, more than the 16 GPUs hold; the weight-2 team holds clearly more GPUs (the
  borrowed ones split 2:1), every group bound whole. The curve is printed (docs/kueue.md).
- a PyTorchJob through a LocalQueue, with the real training-operator: Kueue suspends it on
  creation and unsuspends it on admission, the operator makes its PodGroup and pods,
  Lockstep binds them whole; a second job beyond quota stays suspended with no pod.
- Lockstep's own preemption under Kueue: quota above capacity, Kueue admits everything; a
  high-priority group of another LocalQueue evicts nothing, one of the same LocalQueue
  evicts the low group whole (Lockstep acts, Kueue preempts nothing).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from coscheduling.gang.gating import GANG_GATE
from testbed import kueue
from testbed.kube import NotFound
from testbed.kubeflow import JOBS, pytorchjob, start_training_operator
from testbed.kueue import ADMISSION_GATE, TOPOLOGY_GATE

from .conftest import Cluster, ClusterFactory, settle


def start(c: Cluster, *queues: dict[str, Any], local: dict[str, str], **kw: Any) -> str:
    """Kueue running (``kw``: for ``start_kueue``), one ResourceFlavor, ``queues``
    (ClusterQueues) and the LocalQueues ``local`` (name -> ClusterQueue) in the test's
    namespace; what it took, for the report."""
    t0 = time.monotonic()
    kueue.start_kueue(c.bed, **kw)
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


def kueue_gates(c: Cluster, name: str) -> list[str]:
    """Kueue's own gates on the pod. Lockstep's webhook (the default install) adds its gate
    after Kueue's; it stays until Lockstep admits the gang, so it is not Kueue's doing."""
    return [g for g in gates(c, name) if g in (ADMISSION_GATE, TOPOLOGY_GATE)]


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
    c.kube.wait("Kueue's gates off all 8 pods",
                lambda: not any(kueue_gates(c, n) for n in names), 30)
    first = c.kube.wait("one group bound in full", lambda: whole(c, ["x", "y"], 4), 60)
    t_first = time.monotonic() - t0
    other = "y" if first == "x" else "x"
    settle(3)
    assert none_bound(c, other), c.bound()
    assert all(c.kube.pod(c.ns, n)["status"].get("phase") == "Pending"
               for n in c.names(other, 4))
    assert admitted(c, other)  # Kueue let it go; Lockstep is what holds it back, whole:
    for n in c.names(other, 4):  # behind Lockstep's gate, out of kube-scheduler's queue
        assert gates(c, n) == [GANG_GATE], (n, gates(c, n))
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
    # Kueue's two gates, and Lockstep's after them (its webhook gates a member another
    # party holds: it cannot be pinned before Kueue lets it go).
    assert gates(c, "g-0")[-1] == GANG_GATE
    assert set(gates(c, "g-0")) == {ADMISSION_GATE, TOPOLOGY_GATE, GANG_GATE}
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


# ------------------------------------------------------------------------------ fair sharing

FAIR_RUN = 50.0
"""Seconds of the stream (both teams backlogged throughout)."""
FAIR_WARMUP = 12.0
"""Seconds before the shares are judged: the bed fills and the first groups finish."""
FAIR_RUNTIMES = (4, 5, 6, 7)
"""Each pod Succeeds this many seconds after it starts running (KWOK's runtime stage), by
group number in turn, so that groups do not all end at once."""
FAIR_BACKLOG = 3
"""Groups each team keeps waiting (none of their pods bound) at all times."""


def test_kueue_fair_sharing_gives_the_weight_2_team_twice_the_borrowed_gpus_all_whole(
    cluster: ClusterFactory,
) -> None:
    """Kueue's fair sharing (the preemption strategies its docs give) with two teams in one
    cohort, weights 1 and 2, 2 GPUs of nominal quota each and a lender's 12: 16 GPUs on
    16 GPUs, 12 of them only to borrow. A stream of 2 x 1-GPU groups (4-7 s each) from both
    teams, each keeping three groups waiting: Kueue shares the borrowed 12 by weight (A 4,
    B 8: A holds 6 GPUs, B 10, where equal weights would give 8 and 8), and Lockstep binds
    every admitted group whole. Sampled every 0.5 s."""
    c = cluster("pcie-pairs")  # 4 nodes x 4 GPUs
    setup = start(c, *(kueue.cluster_queue(name, gpus=2, cohort="shared", weight=weight,
                                             reclaim_within_cohort="Any")
                         for name, weight in (("team-a", "1"), ("team-b", "2"))),
                    kueue.cluster_queue("lender", gpus=12, cohort="shared"),
                    local={"a": "team-a", "b": "team-b"},
                    fair_sharing=kueue.FAIR_SHARING_STRATEGIES)
    made = {"a": 0, "b": 0}
    ended: set[str] = set()  # groups Kueue preempted, whose Workloads the test deleted
    samples: list[tuple[float, int, int]] = []
    t0 = time.monotonic()
    tick = 0
    while (t := time.monotonic() - t0) < FAIR_RUN:
        held = {"a": 0, "b": 0}
        waiting: dict[str, set[str]] = {"a": set(), "b": set()}
        for p in c.kube.pods(c.ns):
            meta, spec, status = p["metadata"], p["spec"], p["status"]
            team, group = meta["labels"][kueue.QUEUE_LABEL], meta["labels"][kueue.GROUP_LABEL]
            conds = {x["type"] for x in status.get("conditions") or ()}
            if "TerminationTarget" in conds and group not in ended:
                # Kueue preempted the group (fair sharing): its pods are Failed, and Kueue
                # requeues its Workload, which, admitted again, would hold quota with no pod
                # to run, waiting for replacements (pkg/controller/jobframework/
                # reconciler.go, "handle eviction"; pod_controller.go). A user ends such a
                # group the way Kueue ends one: by deleting its Workload.
                ended.add(group)
                with contextlib.suppress(NotFound):
                    c.kube.delete(f"{kueue.WORKLOADS.format(ns=c.ns)}/{group}", grace=None)
            if not spec.get("nodeName"):
                if status.get("phase") == "Pending" and group not in ended:
                    waiting[team].add(group)
            elif (status.get("phase") not in ("Succeeded", "Failed")
                  and not meta.get("deletionTimestamp")):
                held[team] += 1
        samples.append((round(t, 1), held["a"], held["b"]))
        order = ("a", "b") if tick % 2 == 0 else ("b", "a")
        for _ in range(FAIR_BACKLOG):
            for team in order:
                if len(waiting[team]) < FAIR_BACKLOG:
                    made[team] += 1
                    group = f"{team}{made[team]}"
                    submit(c, group, 2, team,
                           runtime_seconds=FAIR_RUNTIMES[made[team] % len(FAIR_RUNTIMES)])
                    waiting[team].add(group)
        tick += 1
        time.sleep(max(0.0, t0 + tick * 0.5 - time.monotonic()))
    c.recorder.assert_gang_invariants(c.ns)

    judged = [(a, b) for t, a, b in samples if t >= FAIR_WARMUP]
    mean_a = sum(a for a, _ in judged) / len(judged)
    mean_b = sum(b for _, b in judged) / len(judged)
    curve = " ".join(f"{t:.0f}s:{a}/{b}" for t, a, b in samples[::4])
    cqs = {q: c.kube.get(f"/apis/kueue.x-k8s.io/v1beta2/clusterqueues/team-{q}")
           for q in ("a", "b")}
    shares = {q: ((cq.get("status") or {}).get("fairSharing") or {}).get("weightedShare")
              for q, cq in cqs.items()}
    finished = sum(1 for w in kueue.workloads(c.kube, c.ns) if condition(w, "Finished"))
    print(f"\n[fair sharing] {setup}; {made['a']} + {made['b']} groups submitted, "
          f"{finished} finished, {len(ended)} preempted by Kueue ({sorted(ended)}); GPUs held "
          f"(A/B) from {FAIR_WARMUP:.0f}s to {FAIR_RUN:.0f}s: mean {mean_a:.2f}/{mean_b:.2f} "
          f"(fair by weight: 6/10); weightedShare at the end {shares}; curve (t:A/B every 2 s) "
          f"{curve}")
    print("[fair sharing samples] " + " ".join(f"{t}:{a}/{b}" for t, a, b in samples))
    assert finished >= 16, finished  # the stream turned over: groups ran and finished
    # Both teams backlogged: the weight-2 team holds clearly more (fair 10 vs 6, 1.67x;
    # equal weights would give 8 and 8), and the cohort stays busy.
    assert mean_b >= 1.3 * mean_a, (mean_a, mean_b)
    assert mean_a >= 3.0, (mean_a, mean_b)  # A is not starved: it keeps its nominal and more
    assert mean_a + mean_b >= 10.0, (mean_a, mean_b)  # 16 when every GPU is held


# ------------------------------------------------------------------------------ PyTorchJob


JOB_RUNTIME = 10
"""Seconds the first PyTorchJob's pods run: long enough to assert on the second job while
the first one still holds the quota."""


def queued_pytorchjob(name: str, queue: str, *, workers: int,
                      runtime_seconds: int | None = None) -> dict[str, Any]:
    """A PyTorchJob (Workers only, one GPU each, no ``schedulerName``: the operator's
    ``--gang-scheduler-name=lockstep`` writes it) sent to Kueue's LocalQueue ``queue``;
    ``runtime_seconds``: its pods Succeed that long after they start."""
    job = pytorchjob(name, workers=workers, scheduler_name=None)
    job["metadata"]["labels"] = {kueue.QUEUE_LABEL: queue}
    if runtime_seconds:
        for spec in job["spec"]["pytorchReplicaSpecs"].values():
            spec["template"]["metadata"] = {"annotations": {
                kueue.RUNTIME_ANNOTATION: str(runtime_seconds)}}
    return job


def job_pods(c: Cluster, job: str) -> list[str]:
    return sorted(p["metadata"]["name"] for p in c.kube.pods(
        c.ns, labelSelector=f"training.kubeflow.org/job-name={job}"))


def suspended(c: Cluster, job: str) -> bool:
    return bool((c.kube.get(f"{JOBS.format(ns=c.ns)}/{job}")["spec"].get("runPolicy")
                 or {}).get("suspend"))


def test_kueue_admits_a_pytorchjob_the_operator_makes_its_pods_lockstep_binds_them_whole(
    cluster: ClusterFactory,
) -> None:
    """Kueue's PyTorchJob integration (``kubeflow.org/v1``) with the real training-operator
    (``--gang-scheduler-name=lockstep``): of two 4-worker jobs on a 4-GPU ClusterQueue,
    Kueue admits one (it is unsuspended, the operator makes its PodGroup and pods, Lockstep
    binds them whole) and keeps the other suspended with no pod at all. When the first job's
    pods succeed, Kueue admits the second, and it is bound whole too."""
    c = cluster("tiny-3x2")
    t_start = time.monotonic()
    start_training_operator(c.bed, "lockstep")  # its CRD in place before Kueue starts
    t_operator = time.monotonic() - t_start
    setup = start(c, kueue.cluster_queue("team", gpus=4), local={"team": "team"},
                  frameworks=("pod", kueue.PYTORCHJOB))
    jobs = {job: [f"{job}-worker-{i}" for i in range(4)] for job in ("train-1", "train-2")}
    c.recorder.min_member_of.update({f"{c.ns}/{job}": 4 for job in jobs})

    t0 = time.monotonic()
    created = [c.kube.create(JOBS.format(ns=c.ns), queued_pytorchjob(
        "train-1", "team", workers=4, runtime_seconds=JOB_RUNTIME))]
    c.kube.wait("train-1's Workload", lambda: bool(kueue.workloads(c.kube, c.ns)), 30)
    created.append(c.kube.create(JOBS.format(ns=c.ns),
                                 queued_pytorchjob("train-2", "team", workers=4)))
    # Kueue's webhook suspended both as they were created.
    assert all(j["spec"]["runPolicy"]["suspend"] is True for j in created), created
    c.wait_bound(jobs["train-1"], 60)
    t_bound = time.monotonic() - t0
    c.recorder.assert_gang_invariants(c.ns)
    # Kueue's Workload for each job, owned by it (named pytorchjob-<job>-<hash>).
    def owned() -> dict[str, dict[str, Any]]:
        return {w["metadata"]["ownerReferences"][0]["name"]: w
                for w in kueue.workloads(c.kube, c.ns)}
    by_job = c.kube.wait("a Workload for each job", lambda: (
        w if sorted(w := owned()) == ["train-1", "train-2"] else None), 30)
    assert kueue.workload_admitted(by_job["train-1"])
    assert not kueue.workload_admitted(by_job["train-2"])
    assert not suspended(c, "train-1") and suspended(c, "train-2")
    pods = {p["metadata"]["name"]: p for p in c.kube.pods(c.ns)}
    for n in jobs["train-1"]:  # the operator's gang, as Lockstep reads it
        assert pods[n]["spec"]["schedulerName"] == "lockstep"
        labels = pods[n]["metadata"]["labels"]
        assert labels["scheduling.x-k8s.io/pod-group"] == "train-1"
        # Kueue labels a job's pods with the queues that admitted it (AssignQueueLabelsForPods,
        # beta and on in v0.17: jobframework/reconciler.go, assignQueueLabels), not with
        # kueue.x-k8s.io/queue-name, which is on the job.
        assert labels.get("kueue.x-k8s.io/local-queue-name") == "team", labels
        assert labels.get("kueue.x-k8s.io/cluster-queue-name") == "team", labels
        assert kueue.QUEUE_LABEL not in labels, labels
    pg = c.kube.get(f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{c.ns}/podgroups/train-1")
    assert pg["spec"]["minMember"] == 4
    settle(2)
    assert job_pods(c, "train-2") == []  # suspended: the operator made nothing
    assert suspended(c, "train-2") and sorted(c.bound()) == jobs["train-1"]

    # train-1's pods succeed (JOB_RUNTIME after they started): Kueue sees the job finish,
    # frees its quota and admits train-2; the operator makes its pods and Lockstep binds them whole.
    t1 = time.monotonic()
    c.wait_bound(jobs["train-2"], 60)
    t_second = time.monotonic() - t1
    assert not suspended(c, "train-2")
    wl1 = next(w for w in kueue.workloads(c.kube, c.ns)
               if w["metadata"]["ownerReferences"][0]["name"] == "train-1")
    assert condition(wl1, "Finished"), wl1
    assert all(c.kube.pod(c.ns, n)["status"].get("phase") == "Succeeded"
               for n in jobs["train-1"])
    c.recorder.assert_gang_invariants(c.ns)
    print(f"\n[PyTorchJob] operator ready in {t_operator:.1f}s; {setup}; train-1 admitted, "
          f"unsuspended and bound in full {t_bound:.1f}s after submission, train-2 suspended "
          f"with 0 pods; train-2 admitted and bound in full {t_second:.1f}s later, once "
          f"train-1's pods succeeded ({JOB_RUNTIME} s run)")


# ------------------------------------------------------- Lockstep's preemption and Kueue's


def test_lockstep_preempts_within_a_kueue_localqueue_never_across_quota_lines(
    cluster: ClusterFactory,
) -> None:
    """Quota above capacity (12 GPUs in each of two ClusterQueues on 6 GPUs, Kueue's
    ``withinClusterQueue: LowerPriority`` on), so Kueue admits every group and preempts
    nothing. A's low-priority 6-GPU group runs on every GPU. B's high-priority 4-GPU group
    (another LocalQueue and ClusterQueue) is admitted by Kueue, but Lockstep evicts nothing
    of A's: B waits with nothing bound. A's own high-priority 4-GPU group (A's LocalQueue)
    is admitted too (10 of 12 GPUs of quota), and Lockstep evicts A's low group, whole, for
    it: Lockstep acts, not Kueue, whose quota still holds the evicted group. B still waits."""
    c = cluster("tiny-3x2")
    for name, value in (("low", 100), ("high", 1000)):
        c.kube.create("/apis/scheduling.k8s.io/v1/priorityclasses",
                      {"metadata": {"name": name}, "value": value})
    setup = start(c, *(kueue.cluster_queue(name, gpus=12, within_cluster_queue="LowerPriority")
                         for name in ("team-a", "team-b")),
                    local={"a": "team-a", "b": "team-b"})

    t0 = time.monotonic()
    low = submit(c, "a-low", 6, "a", priority_class="low")
    c.wait_bound(low, 60)
    t_low = time.monotonic() - t0

    t1 = time.monotonic()
    b_high = submit(c, "b-high", 4, "b", priority_class="high")
    c.kube.wait("B's group admitted", lambda: admitted(c, "b-high"), 30)
    c.kube.wait("Kueue's gates off B's pods",
                lambda: not any(kueue_gates(c, n) for n in b_high), 30)
    why = c.kube.wait("Lockstep saying why B's group cannot preempt", lambda: next(
        (g.get("reason") for g in c.lockstep("/debug/gangs")["gangs"]
         if g["gang"] == f"{c.ns}/b-high" and "cannot preempt" in (g.get("reason") or "")),
        None), 30)
    t_b_refused = time.monotonic() - t1
    settle(5)  # several filter rounds: still nothing evicted, nothing of B bound
    assert "no bound pod of its quota has a lower priority" in why, why
    assert none_bound(c, "b-high"), c.bound()
    assert running(c) == sorted(low)
    assert c.metric("lockstep_preemptions_total") == 0.0
    c.recorder.assert_gang_invariants(c.ns)

    t2 = time.monotonic()
    a_high = submit(c, "a-high", 4, "a", priority_class="high")
    c.kube.wait("A's high-priority group admitted", lambda: admitted(c, "a-high"), 30)
    c.kube.wait("A's low group evicted whole", lambda: stopped(c, low), 60)
    c.wait_bound(a_high, 60)
    t_a_high = time.monotonic() - t2
    settle(3)
    assert running(c) == sorted(a_high)
    assert none_bound(c, "b-high")  # 2 GPUs free; B needs 4 and may not evict A's
    c.recorder.assert_gang_invariants(c.ns)
    # Lockstep evicted: every pod of the low group has DisruptionTarget and a Preempted
    # Event naming A's high group; Kueue preempted nothing (no TerminationTarget) and still
    # holds the low group's quota, its Workload admitted and waiting for replacement pods.
    pods = {p["metadata"]["name"]: p for p in c.kube.pods(c.ns)}
    for n in low:
        conds = {x["type"]: x for x in pods[n]["status"].get("conditions") or ()}
        assert "DisruptionTarget" in conds and "TerminationTarget" not in conds, (n, conds)
        events = [e for e in c.kube.events(c.ns, n) if e.get("reason") == "Preempted"]
        assert any(f"{c.ns}/a-high" in e.get("message", "") for e in events), (n, events)
    assert c.metric("lockstep_preemptions_total") == 1.0
    wl = c.kube.wait("a-low's Workload waiting for replacement pods", lambda: (
        w if condition(w := workload(c, "a-low"), "WaitingForReplacementPods") else None), 30)
    assert kueue.workload_admitted(wl) and not condition(wl, "Evicted"), wl
    assert admitted(c, "b-high") and admitted(c, "a-high")
    print(f"\n[Lockstep preemption under Kueue] {setup}; a-low (6 GPUs, priority 100) bound "
          f"in full {t_low:.1f}s after submission; b-high (LocalQueue b, priority 1000) "
          f"admitted by Kueue, Lockstep refused to evict across the quota line "
          f"{t_b_refused:.1f}s after its submission and bound 0 of it; a-high (LocalQueue a, "
          f"priority 1000) admitted, a-low evicted whole by Lockstep and a-high bound in full "
          f"{t_a_high:.1f}s after its submission; b-high still 0 bound; Kueue preempted "
          f"nothing")
