"""DRA gangs through their life on the default install: a PyTorchJob whose pods claim GPUs
from a ResourceClaimTemplate, a DRA gang preempting another, and Lockstep restarting while DRA
members are parked at bind holding their devices.

The real control plane of ``test_dra.py`` (kube-controller-manager's resourceclaim controller
and garbage collector, the fake NVIDIA driver's slices); the PyTorchJobs are Kubeflow's
training-operator v1.9.3 (its API types let a pod template name a ResourceClaimTemplate,
v1.8.1's do not: ``testbed/versions.env``). The binding recorder checks every claim it saw
when each test ends (``testbed.claims``).
"""

from __future__ import annotations

from typing import Any

from testbed.bins import EXTRA_VERSIONS
from testbed.dra import API, claim_template
from testbed.kubeflow import JOBS, delete_job, pytorchjob, start_training_operator
from testbed.workloads import pod

from .conftest import Cluster, ClusterFactory, settle
from .test_dra import devices_of, templates

TRAINING_OPERATOR = EXTRA_VERSIONS["training-operator"][0]
HIGH, LOW = ("e2e-high", 100000), ("e2e-low", 10)


def job_pods(c: Cluster, job: str) -> list[dict[str, Any]]:
    return c.kube.pods(c.ns, labelSelector=f"training.kubeflow.org/job-name={job}")


def devices(held: dict[str, tuple[str, ...]]) -> set[str]:
    return {d for ds in held.values() for d in ds}


def test_a_pytorchjob_whose_pods_claim_gpus_runs_whole_and_the_other_holds_nothing(
        cluster: ClusterFactory) -> None:
    """Two PyTorchJobs of 4 pods (a Master and 3 Workers; 4 Workers), each pod with a 1-GPU
    claim from the same ResourceClaimTemplate, on 3 DRA nodes x 2 GPUs: the first runs
    whole holding 4 devices, the second has its pods, none bound and no device, and runs
    whole once the first is deleted."""
    c = cluster("dra-tiny-3x2")
    start_training_operator(c.bed, "lockstep", version=TRAINING_OPERATOR)
    templates(c, claim_template("one-gpu"))
    pods = {"train-a": ["train-a-master-0", *(f"train-a-worker-{i}" for i in range(3))],
            "train-b": [f"train-b-worker-{i}" for i in range(4)]}
    c.recorder.min_member_of.update({f"{c.ns}/{job}": 4 for job in pods})
    c.kube.create(JOBS.format(ns=c.ns), pytorchjob(
        "train-a", master=True, workers=3, scheduler_name=None, claim_template="one-gpu"))
    c.wait_bound(pods["train-a"], 60)
    template = job_pods(c, "train-a")[0]["spec"]
    assert template["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName":
                                           "one-gpu"}], template  # as written, kept
    c.kube.create(JOBS.format(ns=c.ns), pytorchjob(
        "train-b", workers=4, scheduler_name=None, claim_template="one-gpu"))
    c.kube.wait("train-b's pods created", lambda: len(job_pods(c, "train-b")) == 4, 60)
    settle(3)
    c.kube.wait("train-a's 4 devices", lambda: len(devices_of(c, pods["train-a"])) == 4, 10)
    assert len(devices(devices_of(c, pods["train-a"]))) == 4
    assert not any(p in c.bound() for p in pods["train-b"]), c.bound()
    assert devices_of(c, pods["train-b"]) == {}
    c.recorder.assert_gang_invariants(c.ns)
    delete_job(c.kube, c.ns, "train-a")
    c.wait_bound(pods["train-b"], 60)
    c.kube.wait("train-b's 4 devices", lambda: len(devices_of(c, pods["train-b"])) == 4, 10)
    c.recorder.assert_gang_invariants(c.ns)


def priority_classes(c: Cluster) -> None:
    for name, value in (HIGH, LOW):
        c.kube.create("/apis/scheduling.k8s.io/v1/priorityclasses", {
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name}, "value": value,
            "preemptionPolicy": "PreemptLowerPriority"})


def dra_gang(c: Cluster, name: str, size: int, template: str, cls: tuple[str, int]
             ) -> list[str]:
    for i in range(size):
        c.create(pod(f"{name}-{i}").gang(name, size).claim(template=template)
                 .priority(cls[1], cls[0]).build())
    return c.names(name, size)


def test_a_dra_gang_preempts_a_dra_gang_whose_claims_are_released_first(
        cluster: ClusterFactory) -> None:
    """A low-priority gang of 3 x 2-GPU claims fills the 6 devices; a high-priority gang of
    2 x 2-GPU claims arrives: the low gang is evicted whole, its claims let their devices go,
    and only then are the high gang's claims allocated and its pods bound (the recorder
    fails the test if a device is allocated while a victim's claim still holds it)."""
    c = cluster("dra-tiny-3x2")
    priority_classes(c)
    templates(c, claim_template("two-gpus", count=2))
    low = dra_gang(c, "low", 3, "two-gpus", LOW)
    c.wait_bound(low, 45)
    c.kube.wait("the low gang's 6 devices", lambda: len(devices(devices_of(c, low))) == 6, 10)
    high = dra_gang(c, "high", 2, "two-gpus", HIGH)
    try:
        c.wait_bound(high, 60)
    except TimeoutError as e:
        raise AssertionError(f"{e}; Lockstep: {c.lockstep('/debug/gangs')}") from e
    left = {p["metadata"]["name"] for p in c.kube.pods(c.ns)}
    assert not left & set(low), "the low gang is evicted whole"
    c.kube.wait("the high gang's 4 devices", lambda: len(devices(devices_of(c, high))) == 4,
                10)
    first_high = min(r.bound_at for r in c.recorder.records(c.ns, "high") if r.bound_at)
    released = [h.end for h in c.recorder.claims.holds if h.pods and any(
        n.startswith("low-") for n in h.pods.values())]
    assert released and all(t is not None and t < first_high for t in released), \
        "every victim's claim released before the preemptor's first binding"
    c.recorder.assert_gang_invariants(c.ns)


def within_reservation(c: Cluster, gang: str) -> dict[str, str]:
    """Pod -> node of every member of ``gang`` that holds devices unbound; asserts each holds
    them on the node its gang's reservation plans for it."""
    gangs = {g["gang"]: g for g in c.lockstep("/debug/gangs")["gangs"]}
    plan = {k.rsplit("/", 1)[-1]: v for k, v in
            (gangs.get(f"{c.ns}/{gang}", {}).get("reservation") or {}).items()}
    bound = c.bound()
    out = {}
    for name, held in devices_of(c, c.names(gang, 4)).items():
        if name in bound:
            continue
        nodes = {d.split("/")[1] for d in held}
        assert nodes == {plan.get(name)}, (name, held, plan)
        out[name] = plan[name]
    return out


def test_lockstep_restart_with_parked_dra_members_keeps_them_whole(
        cluster: ClusterFactory) -> None:
    """Three members of a 4 x 1-GPU DRA gang parked at bind, their devices allocated (the
    fourth cannot be placed by kube-scheduler); Lockstep restarts and loses the parked
    calls. Nothing binds while the fourth is missing, every device a member holds unbound is
    on its reservation's node, and once a placeable fourth exists all four bind with 4
    devices. The members wait parked with their devices for as long as the test makes them
    (tens of seconds, all inside their admitted gang's reservation), so the recorder's
    limit on a parked hold is raised to 90 s here."""
    c = cluster("dra-tiny-3x2")
    c.hold = 90.0
    templates(c, claim_template("one-gpu"))
    members = [pod(f"p-{i}").gang("p", 4, timeout=90).claim(template="one-gpu")
               for i in range(4)]
    members[3].unplaceable()
    c.create(*(m.build() for m in members))
    c.kube.wait("three parked", lambda: (c.lockstep("/debug/gangs")["gangs"] or [{}])[0].get(
        "parked") == 3, 45)
    c.kube.wait("the parked members' devices",
                lambda: len(devices_of(c, c.names("p", 3))) == 3, 10)
    assert len(within_reservation(c, "p")) == 3
    c.bed.restart("lockstep")
    settle(3)
    assert c.bound() == {}
    within_reservation(c, "p")
    c.delete("p-3")
    c.create(pod("p-3").gang("p", 4, timeout=90).claim(template="one-gpu").build())
    try:
        c.wait_bound(c.names("p", 4), 60)
    except TimeoutError as e:
        raise AssertionError(f"{e}; Lockstep: {c.lockstep('/debug/gangs')}") from e
    c.kube.wait("4 devices", lambda: len(devices(devices_of(c, c.names("p", 4)))) == 4, 10)
    c.recorder.assert_gang_invariants(c.ns, hold=c.hold)


def test_claims_api_is_served_and_the_scheduler_allocates(cluster: ClusterFactory) -> None:
    """The bed itself: resource.k8s.io/v1 served, the fake driver's DeviceClass and slices
    present, the resourceclaim controller making a pod's claim from its template and the
    stock kube-scheduler's DynamicResources plugin allocating it (a plain pod, no gang);
    KWOK runs the pod, and deleting it releases and deletes the claim."""
    c = cluster("dra-tiny-3x2")
    assert {s["spec"]["nodeName"] for s in c.kube.list(f"{API}/resourceslices")} == {
        "dra-r0-n0", "dra-r0-n1", "dra-r0-n2"}
    assert [d["metadata"]["name"] for d in c.kube.list(f"{API}/deviceclasses")] == [
        "gpu.nvidia.com"]
    templates(c, claim_template("one-gpu"))
    c.create(pod("solo").claim(template="one-gpu").build())
    c.wait_bound(["solo"], 30)
    c.wait_running(["solo"])
    status = c.kube.pod(c.ns, "solo")["status"]["resourceClaimStatuses"]
    claims = c.kube.list(f"{API}/namespaces/{c.ns}/resourceclaims")
    assert [cl["metadata"]["name"] for cl in claims] == [status[0]["resourceClaimName"]]
    assert claims[0]["status"]["reservedFor"][0]["name"] == "solo"
    c.delete("solo")
    c.kube.wait("the claim deleted with its pod", lambda: not c.kube.list(
        f"{API}/namespaces/{c.ns}/resourceclaims"), 30)
    assert devices_of(c, ["solo"]) == {}
