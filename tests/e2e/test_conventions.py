"""Gang conventions other projects write, on the real test bed.

These pods carry exactly what Kueue's plain-pod integration writes on the pods it manages (the
``kueue.x-k8s.io/pod-group-name`` label, the ``kueue.x-k8s.io/pod-group-total-count``
annotation and the ``kueue.x-k8s.io/admission`` scheduling gate until it admits the group):
they prove Lockstep reads the objects. tests/e2e/test_kueue.py runs Kueue's real controller.
"""

from __future__ import annotations

from typing import Any

from coscheduling.gang.gating import GANG_GATE
from testbed.workloads import pod, podgroup

from .conftest import Cluster, ClusterFactory, settle

GATE = "kueue.x-k8s.io/admission"


def one_runs_the_other_waits(c: Cluster, groups: tuple[str, str], size: int) -> str:
    """Two gangs that cannot both fit: one binds in full, the other holds nothing.
    Returns the one that waits."""
    c.kube.wait("one group bound", lambda: any(
        all(f"{g}-{i}" in c.bound() for i in range(size)) for g in groups), 60)
    settle(3)
    bound = c.bound()
    done = [g for g in groups if all(f"{g}-{i}" in bound for i in range(size))]
    assert len(done) == 1, bound
    other = groups[1] if done == [groups[0]] else groups[0]
    assert not any(n.startswith(f"{other}-") for n in bound), bound
    c.recorder.assert_gang_invariants(c.ns)
    return other


def kueue_pod(name: str, group: str, total: int, *, gated: bool = False) -> dict[str, Any]:
    obj = pod(name).annotate("kueue.x-k8s.io/pod-group-total-count", str(total)).gpu(1).build()
    obj["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] = group
    obj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "user-queue"
    if gated:
        obj["spec"]["schedulingGates"] = [{"name": GATE}]
    return obj


def test_two_kueue_pod_groups_on_six_gpus_one_runs_the_other_holds_nothing(
    cluster: ClusterFactory,
) -> None:
    c = cluster("tiny-3x2")
    for i in range(4):  # interleaved, as two controllers would create them
        c.create(kueue_pod(f"x-{i}", "x", 4), kueue_pod(f"y-{i}", "y", 4))
    other = one_runs_the_other_waits(c, ("x", "y"), 4)
    first = "x" if other == "y" else "y"
    c.delete(*(f"{first}-{i}" for i in range(4)))  # the first job finishes
    c.wait_bound([f"{other}-{i}" for i in range(4)], 30)
    c.recorder.assert_gang_invariants(c.ns)


def test_gated_members_wait_for_kueue_then_the_group_binds_together(
    cluster: ClusterFactory,
) -> None:
    c = cluster("tiny-3x2")
    c.create(*(kueue_pod(f"k-{i}", "k", 3, gated=True) for i in range(3)))
    c.create(kueue_pod("k-3", "k", 3, gated=False))  # a stray ungated member is not enough
    settle(3)
    assert c.bound() == {}
    for i in range(3):  # Kueue admits the Workload: it removes its gate from every pod
        live = c.kube.pod(c.ns, f"k-{i}")["spec"]["schedulingGates"]
        # Lockstep's webhook put its own gate after Kueue's; that one is Lockstep's to lift.
        assert [g["name"] for g in live] == [GATE, GANG_GATE], live
        c.kube.patch(f"/api/v1/namespaces/{c.ns}/pods/k-{i}",
                     {"spec": {"schedulingGates": [g for g in live if g["name"] != GATE]}})
    bound = c.wait_bound([f"k-{i}" for i in range(4)], 30)  # k-3 is an extra beyond 3
    assert len(bound) == 4
    c.recorder.assert_gang_invariants(c.ns)


def volcano_pod(name: str, group: str) -> dict[str, Any]:
    """What Volcano's job controller (and Kubeflow's in volcano mode) puts on a pod: the
    group name annotation only; the size lives on the PodGroup."""
    return pod(name).annotate("scheduling.k8s.io/group-name", group).gpu(1).build()


def volcano_podgroup(name: str, min_member: int) -> dict[str, Any]:
    return {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": {"name": name},
            "spec": {"minMember": min_member, "queue": "default",
                     "minResources": {"nvidia.com/gpu": str(min_member)}}}


def test_volcano_gangs_take_their_size_from_volcanos_podgroup(cluster: ClusterFactory) -> None:
    c = cluster("tiny-3x2", volcano=True)
    for i in range(4):
        c.create(volcano_pod(f"a-{i}", "a"), volcano_pod(f"b-{i}", "b"))
    c.wait_held("a-0", "scheduling.volcano.sh) not found")  # behind the gate, explained
    assert c.bound() == {}
    for g in ("a", "b"):
        c.kube.create(f"/apis/scheduling.volcano.sh/v1beta1/namespaces/{c.ns}/podgroups",
                      volcano_podgroup(g, 4))
    c.recorder.min_member_of.update({f"{c.ns}/a": 4, f"{c.ns}/b": 4})
    one_runs_the_other_waits(c, ("a", "b"), 4)


def test_lockstep_enqueues_volcano_podgroups_that_fit_and_says_why_others_wait(
    cluster: ClusterFactory,
) -> None:
    """Controllers in volcano mode create no pods until their PodGroup is Inqueue; Lockstep
    plays Volcano's enqueue step: 4 GPUs of 6 fit, a second 4-GPU group must wait."""
    c = cluster("tiny-3x2", volcano=True)
    path = f"/apis/scheduling.volcano.sh/v1beta1/namespaces/{c.ns}/podgroups"
    c.kube.create(path, volcano_podgroup("first", 4))
    c.kube.wait("first Inqueue", lambda: (c.kube.get(f"{path}/first").get("status") or {})
                .get("phase") == "Inqueue", 20)
    c.kube.create(path, volcano_podgroup("second", 4))

    def second() -> dict[str, Any]:
        return c.kube.get(f"{path}/second").get("status") or {}

    c.kube.wait("second Pending with a reason", lambda: any(
        cond.get("type") == "Unschedulable" and "minResources" in cond.get("message", "")
        for cond in second().get("conditions") or ()), 20)
    assert second().get("phase") == "Pending"
    c.create(*(volcano_pod(f"first-{i}", "first") for i in range(4)))  # the controller goes
    c.wait_bound([f"first-{i}" for i in range(4)], 30)
    c.kube.wait("first Running", lambda: (c.kube.get(f"{path}/first").get("status") or {})
                .get("phase") == "Running", 30)
    c.delete(*(f"first-{i}" for i in range(4)))
    c.kube.delete(f"{path}/first")
    c.kube.wait("second Inqueue", lambda: second().get("phase") == "Inqueue", 20)
    c.recorder.assert_gang_invariants(c.ns)


KOORD = "gang.scheduling.koordinator.sh/"


def koord_pod(name: str, gang: str, min_available: int, **options: str) -> dict[str, Any]:
    """Koordinator's annotation way, as its gang-scheduling proposal writes it."""
    b = (pod(name).annotate(KOORD + "name", gang)
         .annotate(KOORD + "min-available", str(min_available))
         .annotate(KOORD + "waiting-time", "30s").gpu(1))
    for k, v in options.items():
        b.annotate(KOORD + k, v)
    return b.build()


def test_two_koordinator_gangs_on_six_gpus_one_runs_the_other_holds_nothing(
    cluster: ClusterFactory,
) -> None:
    c = cluster("tiny-3x2")
    for i in range(4):
        c.create(koord_pod(f"x-{i}", "x", 4, **{"total-number": "4"}),
                 koord_pod(f"y-{i}", "y", 4, **{"total-number": "4", "mode": "NonStrict"}))
    other = one_runs_the_other_waits(c, ("x", "y"), 4)
    first = "x" if other == "y" else "y"
    c.delete(*(f"{first}-{i}" for i in range(4)))
    c.wait_bound([f"{other}-{i}" for i in range(4)], 30)
    c.recorder.assert_gang_invariants(c.ns)


def test_a_koordinator_gang_group_binds_only_when_every_gang_can(
    cluster: ClusterFactory,
) -> None:
    """A job with two roles in one GangGroup: the workers' gang is complete, but nothing binds
    until the launcher's gang exists too; then both bind together."""
    c = cluster("tiny-3x2")
    groups = f'["{c.ns}/workers", "{c.ns}/launcher"]'
    c.create(*(koord_pod(f"workers-{i}", "workers", 3, groups=groups) for i in range(3)))
    c.wait_held("workers-0", "launcher")
    settle(2)
    assert c.bound() == {}
    c.create(koord_pod("launcher-0", "launcher", 1, groups=groups))
    c.wait_bound([*(f"workers-{i}" for i in range(3)), "launcher-0"], 30)
    c.recorder.assert_gang_invariants(c.ns)
    problems = c.recorder.gang_problems(c.ns)
    assert problems == [], problems


def test_a_koordinator_gang_group_declared_on_podgroups_binds_whole_and_reports_each(
    cluster: ClusterFactory,
) -> None:
    """Koordinator's CRD way: the groups annotation sits on scheduler-plugins PodGroups. The
    group binds as one, and each PodGroup's status counts its own members."""
    c = cluster("tiny-3x2")
    path = f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{c.ns}/podgroups"
    groups = f'["{c.ns}/workers", "{c.ns}/launcher"]'
    for name, mm in (("workers", 3), ("launcher", 1)):
        obj = podgroup(name, mm, c.ns)
        obj["metadata"]["annotations"] = {KOORD + "groups": groups}
        c.kube.create(path, obj)
    c.recorder.min_member_of.update({f"{c.ns}/workers": 3, f"{c.ns}/launcher": 1})
    c.create(*(pod(f"workers-{i}").sp_group("workers").gpu(1).build() for i in range(3)))
    c.wait_held("workers-0", "launcher")
    assert c.bound() == {}
    c.create(pod("launcher-0").sp_group("launcher").gpu(1).build())
    c.wait_bound([*(f"workers-{i}" for i in range(3)), "launcher-0"], 30)
    for name, n in (("workers", 3), ("launcher", 1)):
        c.kube.wait(f"{name} Running", lambda name=name, n=n: (
            c.kube.get(f"{path}/{name}").get("status") or {}).get("running") == n, 30)
    c.recorder.assert_gang_invariants(c.ns)
