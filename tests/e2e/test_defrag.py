"""Defragmentation on the real test bed (issue 45): kube-apiserver, the stock kube-scheduler
with Lockstep's profile, KWOK nodes, and kube-controller-manager's real Deployment,
ReplicaSet and disruption controllers.

Three 8-GPU nodes each run two 2-GPU pods of one Deployment (placed one node at a time by
cordoning the others: 4 GPUs free on each, 12 in all). A gang of 2 x 4 GPUs that must share
one node (``lockstep.dev/topology-required: hostname``) waits, at the Deployment's priority
(so nothing is preempted):

* with defragmentation on (the default; ``--defrag-after=5`` only to keep the test short),
  the fewest pods move (the two of one node), through the Eviction API; the ReplicaSet
  recreates them, they land on the other nodes (steered to the room reserved for them), and
  the gang binds whole on the node they left;
* a PodDisruptionBudget that forbids the move (``minAvailable`` of every replica) leaves the
  gang waiting, nothing evicted, with a reason naming the budget.
"""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from testbed.runner import KCM_WORKLOAD_CONTROLLERS
from testbed.workloads import pod

from .conftest import Cluster, ClusterFactory

ARGS = ("--backoff=3", "--defrag-after=5")


def bed(cluster: ClusterFactory, tmp_path: Path) -> Cluster:
    topo = tmp_path / "three-8gpu.yaml"
    topo.write_text(yaml.safe_dump({"groups": [{
        "name": "gpu", "racks": 1, "nodes_per_rack": 3, "gpus": 8,
        "product": "NVIDIA-H100-80GB-HBM3", "interconnect": "nvswitch",
        "cpu": "64", "memory": "512Gi"}]}))
    c = cluster(str(topo), lockstep_args=ARGS)
    c.bed.start_controller_manager((*KCM_WORKLOAD_CONTROLLERS, "disruption-controller"))
    return c


def nodes(c: Cluster) -> list[str]:
    return sorted(n["metadata"]["name"] for n in c.kube.nodes())


def cordon(c: Cluster, names: list[str], off: bool) -> None:
    for n in names:
        c.kube.patch(f"/api/v1/nodes/{n}", {"spec": {"unschedulable": off}})


def web(c: Cluster, ns: str) -> dict[str, str]:
    """Deployment ``web``: six 2-GPU pods, two per node, placed one node at a time."""
    template = pod("web", ns).gpu(2).build()
    template["metadata"] = {"labels": {"app": "web"}}
    template["spec"]["terminationGracePeriodSeconds"] = 0
    deploy = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "web"}},
                 "template": template},
    }
    c.kube.create(f"/apis/apps/v1/namespaces/{ns}/deployments", deploy)
    all_nodes = nodes(c)
    for i, n in enumerate(all_nodes):
        cordon(c, [m for m in all_nodes if m != n], True)
        cordon(c, [n], False)
        c.kube.patch(f"/apis/apps/v1/namespaces/{ns}/deployments/web",
                     {"spec": {"replicas": 2 * (i + 1)}})
        c.kube.wait(f"two web pods on {n}", lambda n=n: sum(
            1 for node in running(c, ns).values() if node == n) == 2, 60)
    cordon(c, all_nodes, False)
    return running(c, ns)


def running(c: Cluster, ns: str) -> dict[str, str]:
    """Bound, not deleting web pods: name -> node."""
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in c.kube.pods(ns)
            if p["metadata"]["name"].startswith("web-") and p["spec"].get("nodeName")
            and not p["metadata"].get("deletionTimestamp")}


def train(c: Cluster, ns: str) -> list[str]:
    c.recorder.min_member_of[f"{ns}/train"] = 2
    names = []
    for i in range(2):
        obj = (pod(f"train-{i}", ns).gang("train", 2, timeout=120).gpu(4)
               .annotate("lockstep.dev/topology-required", "hostname").build())
        obj["spec"]["terminationGracePeriodSeconds"] = 0
        c.kube.create_pod(obj)
        names.append(obj["metadata"]["name"])
    return names


def gang_reason(c: Cluster, key: str) -> str:
    gangs = {g["gang"]: g for g in c.lockstep("/debug/gangs")["gangs"]}
    return str((gangs.get(key) or {}).get("reason") or "")


def test_the_fewest_pods_move_they_land_elsewhere_and_the_gang_runs_on_one_node(
        cluster: ClusterFactory, tmp_path: Path) -> None:
    c = bed(cluster, tmp_path)
    ns = "defrag"
    c.kube.ensure_namespace(ns)
    before = web(c, ns)
    assert sorted(before.values()) == sorted(nodes(c) * 2), before
    names = train(c, ns)
    try:
        got = c.recorder.wait_bound(ns, names, 90)
    except TimeoutError as e:
        raise AssertionError(f"{e}; Lockstep: {gang_reason(c, f'{ns}/train')}") from e
    (freed,) = set(got.values())  # both members on one node
    c.kube.wait("six web pods running again", lambda: len(running(c, ns)) == 6, 60)
    after = running(c, ns)
    moved = sorted(set(before) - set(after))
    assert len(moved) == 2, (before, after)  # the fewest: one node's two pods
    assert {before[n] for n in moved} == {freed}
    assert freed not in after.values(), f"a web pod landed back on {freed}: {after}"
    events = [e for n in moved for e in c.kube.events(ns, n) if e["reason"] == "MovedForGang"]
    assert {e["involvedObject"]["name"] for e in events} == set(moved)
    assert any(e["reason"] == "GangMovingPods" for n in names for e in c.kube.events(ns, n))
    c.recorder.assert_gang_invariants(ns)


def test_a_budget_that_forbids_the_move_leaves_the_gang_waiting_with_its_name(
        cluster: ClusterFactory, tmp_path: Path) -> None:
    c = bed(cluster, tmp_path)
    ns = "defrag-pdb"
    c.kube.ensure_namespace(ns)
    c.kube.create(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "web-all", "namespace": ns},
        "spec": {"minAvailable": 6, "selector": {"matchLabels": {"app": "web"}}}})
    before = web(c, ns)
    names = train(c, ns)
    c.kube.wait("the gang told the budget forbids the move", lambda: (
        f"PodDisruptionBudget {ns}/web-all" in gang_reason(c, f"{ns}/train")), 60)
    time.sleep(3)  # past --defrag-after: still nothing moves
    assert running(c, ns) == before
    assert not any(n in c.recorder.bound(ns) for n in names)
    assert f"PodDisruptionBudget {ns}/web-all" in gang_reason(c, f"{ns}/train")
    c.recorder.assert_gang_invariants(ns)
