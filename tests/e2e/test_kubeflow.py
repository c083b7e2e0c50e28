"""Real PyTorchJobs through Kubeflow's real training-operator v1 on the test bed.

The operator is built from its Go module (testbed/kubeflow.py says what it needs out of a
cluster) and run in each of its gang modes; the PyTorchJobs are what users write. Seed case:
two 4-pod jobs, one GPU a pod, 6 GPUs: one job runs in full, the other has no pod bound, and
it starts in full once the first job is deleted.

- ``--gang-scheduler-name=scheduler-plugins``: scheduler-plugins PodGroups and pod labels;
  the templates say ``schedulerName: lockstep`` (the operator keeps it, with a warning event).
- ``--gang-scheduler-name=volcano``: Volcano PodGroups and pod annotations; the operator
  creates no pod until Lockstep, playing Volcano's enqueue step, moves the PodGroup to
  ``Inqueue``. Templates say ``schedulerName: lockstep``. When the templates put CPU and
  memory in ``requests`` and the GPU in ``limits`` only, v1.8.1 leaves the GPUs out of the
  PodGroup's ``minResources``: both groups fit by that measure and are enqueued, the operator
  creates both jobs' pods, and Lockstep's gang admission is what keeps the second job at zero.
- ``--gang-scheduler-name=lockstep``: any name but ``volcano`` means scheduler-plugins
  PodGroups, and the operator writes that name into templates that have none, so users'
  PyTorchJobs need no ``schedulerName`` at all. The setup to recommend.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from testbed.kubeflow import JOBS, delete_job, pytorchjob, start_training_operator

from .conftest import Cluster, ClusterFactory, settle

SP_PODGROUPS = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups"
VOLCANO_PODGROUPS = "/apis/scheduling.volcano.sh/v1beta1/namespaces/{ns}/podgroups"

# job -> its pods, as the operator names them: a Master and 3 Workers, and 4 Workers only.
PODS = {
    "train-a": ["train-a-master-0", *(f"train-a-worker-{i}" for i in range(3))],
    "train-b": [f"train-b-worker-{i}" for i in range(4)],
}


def job_pods(c: Cluster, job: str) -> list[dict[str, Any]]:
    return c.kube.pods(c.ns, labelSelector=f"training.kubeflow.org/job-name={job}")


def job_condition(c: Cluster, job: str) -> str | None:
    conds = (c.kube.get(f"{JOBS.format(ns=c.ns)}/{job}").get("status") or {}).get(
        "conditions") or ()
    return str(conds[-1]["type"]) if conds else None


@pytest.mark.parametrize(("gang_scheduler", "template_scheduler", "limits_only"), [
    pytest.param("scheduler-plugins", "lockstep", False, id="scheduler-plugins"),
    pytest.param("volcano", "lockstep", True, id="volcano"),
    pytest.param("volcano", "lockstep", False, id="volcano-gpu-in-limits-only"),
    pytest.param("lockstep", None, True, id="lockstep-as-gang-scheduler-name"),
])
def test_two_pytorchjobs_on_six_gpus_one_runs_the_other_holds_nothing(
    cluster: ClusterFactory, gang_scheduler: str, template_scheduler: str | None,
    limits_only: bool,
) -> None:
    volcano = gang_scheduler == "volcano"
    held_back = volcano and limits_only  # the operator creates no pod for the waiting job
    c = cluster("tiny-3x2", volcano=volcano)
    t_start = time.monotonic()
    start_training_operator(c.bed, gang_scheduler)
    t_operator = time.monotonic() - t_start
    c.recorder.min_member_of.update({f"{c.ns}/{job}": 4 for job in PODS})

    t0 = time.monotonic()
    for job in (pytorchjob("train-a", master=True, workers=3, scheduler_name=template_scheduler,
                           limits_only=limits_only),
                pytorchjob("train-b", workers=4, scheduler_name=template_scheduler,
                           limits_only=limits_only)):
        c.kube.create(JOBS.format(ns=c.ns), job)
    first = c.kube.wait("one PyTorchJob bound in full", lambda: next(
        (job for job, pods in PODS.items() if all(p in c.bound() for p in pods)), None), 60)
    t_first = time.monotonic() - t0
    other = "train-b" if first == "train-a" else "train-a"
    settle(3)
    bound = c.bound()
    assert all(p in bound for p in PODS[first]), bound
    assert not any(p in bound for p in PODS[other]), bound
    c.recorder.assert_gang_invariants(c.ns)

    # What the operator wrote, in its mode.
    for pod in job_pods(c, first):
        meta = pod["metadata"]
        assert pod["spec"]["schedulerName"] == "lockstep", meta["name"]
        if volcano:
            assert meta["annotations"]["scheduling.k8s.io/group-name"] == first
        else:
            assert meta["labels"]["scheduling.x-k8s.io/pod-group"] == first
    groups = (VOLCANO_PODGROUPS if volcano else SP_PODGROUPS).format(ns=c.ns)
    for job in PODS:
        spec = c.kube.get(f"{groups}/{job}")["spec"]
        assert spec["minMember"] == 4
        assert ("nvidia.com/gpu" in spec["minResources"]) == limits_only, spec
    if held_back:
        # The operator holds the waiting job's pods back; Lockstep says why it waits.
        assert job_pods(c, other) == []
        status = c.kube.get(f"{groups}/{other}").get("status") or {}
        assert status.get("phase") == "Pending", status
        assert any(cond.get("type") == "Unschedulable"
                   for cond in status.get("conditions") or ()), status
    else:
        assert sorted(p["metadata"]["name"] for p in job_pods(c, other)) == PODS[other]
    c.kube.wait(f"{first} Running", lambda: job_condition(c, first) == "Running", 30)
    # A template's schedulerName other than the gang scheduler's name is kept, with a warning;
    # with --gang-scheduler-name=lockstep there is nothing to warn about.
    warned = any(e.get("reason") == "SetPodTemplateSchedulerName"
                 for e in c.kube.events(c.ns, first, "PyTorchJob"))
    assert warned == (template_scheduler is not None)

    t1 = time.monotonic()
    delete_job(c.kube, c.ns, first)  # the first job is deleted (and garbage-collected)
    c.wait_bound(PODS[other], 60)
    t_second = time.monotonic() - t1
    c.kube.wait(f"{other} Running", lambda: job_condition(c, other) == "Running", 30)
    c.recorder.assert_gang_invariants(c.ns)
    print(f"\n[{gang_scheduler}, limits_only={limits_only}] operator ready in "
          f"{t_operator:.1f}s; {first} bound in full {t_first:.1f}s after submission, "
          f"{other} 0/4 bound; {other} bound in full {t_second:.1f}s after {first} was deleted")


def test_pytorchjobs_through_the_default_install(
    cluster: ClusterFactory,
) -> None:
    """The setup to recommend, with Lockstep's webhook as deployed: the operator's pods reach
    the webhook as they are created, one create at a time. Each member is pinned at
    creation once its gang's quorum exists, or gated (and lifted onto its plan) before it:
    a member pinned binds where it was pinned, the job that fits binds in full, and the
    other job is gated with nothing bound until the first is deleted. (Since pins wait for
    the quorum, an operator that creates a job's pods one by one is mostly, here wholly,
    gated and lifted: the fast path is a burst's, docs/design.md.)"""
    from .test_webhook import decisions, failed_open_since_start, gates, pin, with_webhook

    c = with_webhook(cluster)
    start_training_operator(c.bed, "lockstep")
    c.recorder.min_member_of.update({f"{c.ns}/{job}": 4 for job in PODS})
    before = decisions(c)
    c.kube.create(JOBS.format(ns=c.ns), pytorchjob("train-a", master=True, workers=3,
                                                   scheduler_name=None))
    c.wait_bound(PODS["train-a"], 60)
    c.kube.create(JOBS.format(ns=c.ns), pytorchjob("train-b", workers=4, scheduler_name=None))
    c.kube.wait("train-b's pods created", lambda: len(job_pods(c, "train-b")) == 4, 60)
    settle(3)
    bound = c.bound()
    assert not any(p in bound for p in PODS["train-b"]), bound
    c.recorder.assert_gang_invariants(c.ns)
    after = decisions(c)
    delta = {k: d for k in after if (d := after[k] - before.get(k, 0.0))}
    assert delta.get("pinned", 0) + delta.get("gated", 0) == 8, delta
    for p in job_pods(c, "train-a"):  # a pinned member bound where it was pinned
        if p["metadata"]["name"] in bound and not gates(p):
            assert pin(p) == bound[p["metadata"]["name"]], p["spec"]
    for p in job_pods(c, "train-b"):  # no room: every member gated
        assert gates(p) and not p["spec"].get("nodeName"), p["metadata"]["name"]
    delete_job(c.kube, c.ns, "train-a")
    c.wait_bound(PODS["train-b"], 60)
    c.recorder.assert_gang_invariants(c.ns)
    assert failed_open_since_start(c) == 0
    print(f"\n[default install] webhook decisions for 8 operator pods: {delta}")


def _natural(name: str) -> list[object]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def test_a_ranked_pytorchjobs_ranks_land_in_topology_order(cluster: ClusterFactory) -> None:
    """A PyTorchJob's pods carry their rank as the operator writes it (the Master, then the
    Workers by ``replica-index``): Lockstep's plan puts adjacent ranks on one node and the
    nodes in their topology order (one rack here, so the nodes' names in natural order).
    A Master and 11 Workers of 2 GPUs on 8-GPU nodes: ranks 0-3, 4-7 and 8-11 each share a
    node, in node order. The pods' names sort otherwise (``worker-10`` before
    ``worker-2``), so a plan that ignored ranks would put rank 11 beside ranks 0-2."""
    c = cluster("racks-2x4-h100")
    start_training_operator(c.bed, "lockstep")
    c.recorder.min_member_of[f"{c.ns}/ranked"] = 12
    c.kube.create(JOBS.format(ns=c.ns), pytorchjob("ranked", master=True, workers=11, gpus=2,
                                                   scheduler_name=None))
    by_rank = ["ranked-master-0", *(f"ranked-worker-{i}" for i in range(11))]
    bound = c.wait_bound(by_rank, 60)
    nodes = [bound[p] for p in by_rank]
    quads = [nodes[k:k + 4] for k in range(0, 12, 4)]
    assert all(len(set(q)) == 1 for q in quads), nodes  # ranks 4k..4k+3 share a node
    order = [q[0] for q in quads]
    racks = {c.kube.get(f"/api/v1/nodes/{n}")["metadata"]["labels"].get(
        "lockstep.dev/rack") for n in order}
    assert len(set(order)) == 3 and len(racks) == 1, (nodes, racks)
    assert order == sorted(order, key=_natural), nodes
    c.recorder.assert_gang_invariants(c.ns)
