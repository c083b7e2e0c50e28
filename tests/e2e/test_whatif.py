"""Would it fit? ``lockstep explain --what-if`` against the default install (Lockstep with
its webhook and own certificates) on the real test bed, then the same objects created at
once, unchanged, on a bed where nothing else changes: the answer is what happens.

* fits now: each member's node is the node it binds to, and the members the answer says are
  pinned at creation carry that pin as the API server stored them;
* fits after preemption: exactly the victims it names are evicted, whole, and the members
  bind where it said;
* waits: nothing binds, and the reason is the one ``lockstep explain`` then gives;
* a Job or a Deployment (kube-controller-manager's real controllers): its generated pods bind
  on the nodes it named, as a multiset per member shape;
* two DRA gangs in one manifest: the second sees the devices planned for the first as taken.
"""

from __future__ import annotations

import copy
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from app import cli
from testbed import kueue
from testbed.dra import claim_template
from testbed.kubeflow import JOBS, pytorchjob, start_training_operator
from testbed.runner import KCM_WORKLOAD_CONTROLLERS
from testbed.workloads import gang, pod

from .conftest import Cluster, ClusterFactory, settle
from .test_conventions import volcano_pod, volcano_podgroup
from .test_dra import devices_of, templates
from .test_preemption import HIGH, LOW, deleted, priority_classes
from .test_webhook import burst, pin, stored


def ask(c: Cluster, objs: list[dict[str, Any]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    """``lockstep explain --what-if FILE -o json`` against the bed's Lockstep: exit code and
    answer. Nothing is created (checked by the caller on the API server)."""
    assert c.lockstep_url
    for o in objs:
        o["metadata"]["namespace"] = c.ns
    f = tmp_path / "manifest.yaml"
    f.write_text(yaml.safe_dump_all(objs))
    capsys.readouterr()
    code = cli.main(["explain", "--what-if", str(f), "-o", "json", "--url", c.lockstep_url])
    return code, json.loads(capsys.readouterr().out)


def placed(answer: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """pod name -> (node, pinned at creation), over every unit."""
    return {p["pod"].split("/", 1)[1]: (p["node"], p["pinnedAtCreation"])
            for o in answer["outcomes"] for p in o["placed"]}


def test_fits_now_is_where_each_member_binds_and_is_pinned(
        cluster: ClusterFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    c = cluster("racks-2x4-h100")
    c.create(*gang("busy", 3, gpus=8), pod("half", c.ns).gpu(4).build())
    c.wait_bound(["busy-0", "busy-1", "busy-2", "half"], 30)
    settle(1)
    job = gang("train", 6, gpus=4)
    code, answer = ask(c, [*job], tmp_path, capsys)
    assert code == 0 and answer["verdict"] == "fits-now", answer
    want = placed(answer)
    assert set(want) == {f"train-{i}" for i in range(6)}
    assert all(pinned for _, pinned in want.values())
    (unit,) = answer["outcomes"]
    assert unit["placedWithin"] in ("rack", "clique", "block", "zone", None)
    assert {p["metadata"]["name"] for p in c.kube.pods(c.ns)} == {
        "busy-0", "busy-1", "busy-2", "half"}, "the what-if created nothing"
    # The same objects, created at once, unchanged.
    made = stored(burst(c, gang("train", 6, gpus=4)))
    assert {n: pin(o) for n, o in made.items()} == {n: node for n, (node, _) in want.items()}
    bound = c.wait_bound(list(want), 30)
    assert {n: bound[n] for n in want} == {n: node for n, (node, _) in want.items()}
    c.recorder.assert_gang_invariants(c.ns)


def test_fits_after_preemption_evicts_exactly_the_victims_it_names(
        cluster: ClusterFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    c = cluster("tiny-3x2")
    priority_classes(c)
    low = []
    for i in range(4):
        obj = pod(f"low-{i}", c.ns).gang("low", 4, 30).gpu(1).priority(LOW[1], LOW[0]).build()
        obj["spec"]["terminationGracePeriodSeconds"] = 0
        low.append(obj)
    c.create(*low)
    c.wait_bound([f"low-{i}" for i in range(4)], 30)
    settle(1)

    def high() -> list[dict[str, Any]]:
        out = []
        for i in range(4):
            obj = pod(f"high-{i}", c.ns).gang("high", 4, 30).gpu(1).priority(
                HIGH[1], HIGH[0]).build()
            obj["spec"]["terminationGracePeriodSeconds"] = 0
            out.append(obj)
        return out
    code, answer = ask(c, high(), tmp_path, capsys)
    assert code == 1 and answer["verdict"] == "fits-after-preemption", answer
    (unit,) = answer["outcomes"]
    assert unit["victims"]["gangs"] == [f"{c.ns}/low"] and unit["victims"]["pods"] == []
    assert unit["victims"]["evicted"] == 4 and unit["victims"]["gpusFreed"] == 4
    want = {n: node for n, (node, _) in placed(answer).items()}
    assert len(c.kube.pods(c.ns)) == 4, "the what-if evicted nobody"
    stored(burst(c, high()))
    bound = c.wait_bound(list(want), 60)
    assert deleted(c, c.ns, [f"low-{i}" for i in range(4)]) == {f"low-{i}" for i in range(4)}
    assert {n: bound[n] for n in want} == want
    c.recorder.assert_gang_invariants(c.ns)


def test_waits_binds_nothing_and_gives_the_reason_explain_gives(
        cluster: ClusterFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    c = cluster("tiny-3x2")
    c.create(*gang("busy", 2, gpus=2))
    c.wait_bound(["busy-0", "busy-1"], 30)
    settle(1)
    code, answer = ask(c, gang("late", 2, gpus=2), tmp_path, capsys)
    assert code == 1 and answer["verdict"] == "waits", answer
    (unit,) = answer["outcomes"]
    assert "needs 2 x" in unit["reason"] and unit["hints"], unit
    c.create(*gang("late", 2, gpus=2))
    explained = c.wait_held("late-0", "needs 2 x")
    settle(2)
    assert not {"late-0", "late-1"} & set(c.bound())
    assert explained == unit["reason"]
    # Once the busy gang goes, the room comes back and the late gang runs.
    c.delete("busy-0", "busy-1")
    c.wait_bound(["late-0", "late-1"], 30)


def test_two_dra_gangs_in_one_manifest_the_second_waits_for_the_first_ones_devices(
        cluster: ClusterFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The seed case with DRA GPUs, asked of the what-if as one manifest: 3 nodes x 2 devices,
    two 4-member gangs of one-device claims (ResourceClaimTemplate). The first fits now,
    pinned; the second waits, its reason naming the 2 devices left. Created in the manifest's
    order (each gang's members at once), the first binds where it said on 4 devices of its
    own and the second binds nothing, holds no device, and is explained as the what-if
    said. (Before, each unit saw the live devices: both "fits now", 8 members on 6.)"""
    c = cluster("dra-tiny-3x2")
    templates(c, claim_template("one-gpu"))
    settle(1)

    def objs(name: str) -> list[dict[str, Any]]:
        return gang(name, 4, claim_template="one-gpu")
    code, answer = ask(c, [*objs("a"), *objs("b")], tmp_path, capsys)
    assert code == 1 and answer["verdict"] == "waits", answer
    first, second = answer["outcomes"]
    assert first["verdict"] == "fits-now" and second["verdict"] == "waits", answer
    want = placed(answer)
    assert set(want) == set(c.names("a", 4)) and all(pinned for _, pinned in want.values())
    assert "DRA claims ask for 4 devices; 2 free" in second["reason"], second
    assert f"(reserved by {c.ns}/a)" in second["reason"], second
    assert c.kube.pods(c.ns) == [], "the what-if created nothing"
    made = stored(burst(c, objs("a")))
    assert {n: pin(o) for n, o in made.items()} == {n: node for n, (node, _) in want.items()}
    stored(burst(c, objs("b")))
    bound = c.wait_bound(list(want), 45)
    assert {n: bound[n] for n in want} == {n: node for n, (node, _) in want.items()}
    c.kube.wait("the first gang's 4 devices",
                lambda: len(devices_of(c, list(want))) == 4, timeout=10)
    held = devices_of(c, list(want))
    assert len({d for ds in held.values() for d in ds}) == 4, held
    explained = c.wait_held("b-0", "does not fit")
    settle(2)
    assert not set(c.names("b", 4)) & set(c.bound())
    assert devices_of(c, c.names("b", 4)) == {}
    # Word for word, but for what the first gang's binding changes: the what-if answers for
    # the moment the second is created, the first admitted and not bound yet (the core's
    # own reason then, unit-tested); once the first binds, its slots (and the reservation
    # the reason names) are given back, its devices held by its claims instead, and the
    # victim search counts its pods as bound ones looked at.
    assert "cannot preempt" in second["reason"]
    assert at_rest(explained) == at_rest(second["reason"])
    c.recorder.assert_gang_invariants(c.ns)


def at_rest(reason: str) -> str:
    """A reason without the words that change when a gang it names binds."""
    reason = re.sub(r" \(reserved by [^)]*\)", "", reason)
    return re.sub(r" \(\d+ looked at, [^)]*\)", "", reason)


def test_a_pytorchjob_goes_where_the_what_if_said(
        cluster: ClusterFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Kubeflow's real training-operator (``--gang-scheduler-name=lockstep``: templates
    without a schedulerName get Lockstep's, and a scheduler-plugins PodGroup of every
    replica): the what-if reads the PyTorchJob alone, assumes the operator's PodGroup, and
    names the pods as the operator names them."""
    c = cluster("tiny-3x2")
    start_training_operator(c.bed, "lockstep")
    c.create(pod("busy", c.ns).gpu(1).build())
    c.wait_bound(["busy"], 30)
    settle(1)
    job = pytorchjob("train", master=True, workers=3, scheduler_name=None)
    code, answer = ask(c, [job], tmp_path, capsys)
    assert code == 0 and answer["verdict"] == "fits-now", answer
    want = {n: node for n, (node, _) in placed(answer).items()}
    assert set(want) == {"train-master-0", *(f"train-worker-{i}" for i in range(3))}
    assert any("training-operator creates assumed (minMember 4)" in n for n in answer["notes"])
    c.recorder.min_member_of[f"{c.ns}/train"] = 4
    c.kube.create(JOBS.format(ns=c.ns), pytorchjob("train", master=True, workers=3,
                                                   scheduler_name=None))
    bound = c.wait_bound(list(want), 60)
    assert {n: bound[n] for n in want} == want
    c.recorder.assert_gang_invariants(c.ns)


def test_a_kueue_pod_group_goes_where_the_what_if_said_once_kueue_admits_it(
        cluster: ClusterFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Real Kueue v0.17 in front: its webhook gates the group's pods, so none is pinned at
    creation (the answer says so); once Kueue admits the group, they bind where it said."""
    c = cluster("tiny-3x2")
    kueue.start_kueue(c.bed)
    kueue.create(c.kube, kueue.resource_flavor())
    kueue.create(c.kube, kueue.cluster_queue("team", gpus=8))
    kueue.create(c.kube, kueue.local_queue("team", "team"), ns=c.ns)
    c.create(pod("busy", c.ns).gpu(1).build())
    c.wait_bound(["busy"], 30)
    settle(1)
    code, answer = ask(c, kueue.group_pods("g", 3, "team"), tmp_path, capsys)
    assert code == 0 and answer["verdict"] == "fits-now", answer
    assert answer["outcomes"][0]["unit"] == f"{c.ns}/g"
    got = placed(answer)
    assert set(got) == {"g-0", "g-1", "g-2"} and not any(pin for _, pin in got.values())
    c.create(*kueue.group_pods("g", 3, "team"))
    bound = c.wait_bound(list(got), 60)
    assert {n: bound[n] for n in got} == {n: node for n, (node, _) in got.items()}
    c.recorder.assert_gang_invariants(c.ns)


def test_a_volcano_group_waits_for_its_queue_and_one_in_an_open_queue_fits(
        cluster: ClusterFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Volcano PodGroups in the manifest, Lockstep playing Volcano's enqueue step: a group
    whose queue is at its capability waits (the reason Lockstep then gives), one in the
    default queue fits and binds where the what-if said."""
    c = cluster("tiny-3x2", volcano=True)
    c.kube.create("/apis/scheduling.volcano.sh/v1beta1/queues", {
        "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
        "metadata": {"name": "team"}, "spec": {"weight": 1,
                                               "capability": {"nvidia.com/gpu": "2"}}})
    pgs = f"/apis/scheduling.volcano.sh/v1beta1/namespaces/{c.ns}/podgroups"

    def group(name: str, queue: str) -> list[dict[str, Any]]:
        pg = volcano_podgroup(name, 2)
        pg["spec"]["queue"] = queue
        return [pg, volcano_pod(f"{name}-0", name), volcano_pod(f"{name}-1", name)]
    first = group("a", "team")
    c.kube.create(pgs, {**first[0], "metadata": {**first[0]["metadata"], "namespace": c.ns}})
    c.recorder.min_member_of[f"{c.ns}/a"] = 2
    c.create(*first[1:])
    c.wait_bound(["a-0", "a-1"], 30)
    settle(1)
    code, answer = ask(c, group("b", "team"), tmp_path, capsys)
    assert code == 1 and answer["verdict"] == "waits", answer
    assert "Volcano queue 'team' is at its capability" in answer["outcomes"][0]["reason"]
    code, answer = ask(c, group("d", "default"), tmp_path, capsys)
    assert code == 0 and answer["verdict"] == "fits-now", answer
    want = {n: node for n, (node, _) in placed(answer).items()}
    objs = group("d", "default")
    c.kube.create(pgs, {**objs[0], "metadata": {**objs[0]["metadata"], "namespace": c.ns}})
    c.recorder.min_member_of[f"{c.ns}/d"] = 2
    c.create(*objs[1:])
    bound = c.wait_bound(list(want), 30)
    assert {n: bound[n] for n in want} == want
    c.recorder.assert_gang_invariants(c.ns)


def test_bad_input_exits_2_naming_what_is_wrong(
        cluster: ClusterFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    c = cluster("tiny-3x2")
    other = pod("other", c.ns).scheduler("default-scheduler").gpu(1).build()
    code = cli.main(["explain", "--what-if", str(_write(tmp_path, [other])),
                     "--url", str(c.lockstep_url)])
    assert code == 2 and "is not Lockstep's" in capsys.readouterr().err
    r = httpx.post(str(c.lockstep_url) + "/debug/what-if", content=b"kind: [", timeout=10)
    assert r.status_code == 400 and "malformed YAML" in r.json()["error"]
    assert c.kube.pods(c.ns) == []


def _write(tmp_path: Path, objs: list[dict[str, Any]]) -> Path:
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump_all(objs))
    return f


def template(gang_name: str, labels: dict[str, str]) -> dict[str, Any]:
    """A pod template declaring the Lockstep gang ``gang_name`` of 4, 1 GPU each: the
    builder's pod without its name (the controller names it)."""
    obj = pod("x").gang(gang_name, 4).gpu(1).build()
    obj["spec"]["restartPolicy"] = "Never"  # a Job's template needs Never or OnFailure
    return {"metadata": {"labels": labels, "annotations": obj["metadata"]["annotations"]},
            "spec": obj["spec"]}


def shape(spec: dict[str, Any]) -> str:
    """What a member asks for (its containers' requests): members of one shape are
    interchangeable, so a generated name may land where the answer put any of them."""
    return json.dumps([c.get("resources", {}).get("requests", {}) for c in spec["containers"]],
                      sort_keys=True)


def goes_where_it_said(c: Cluster, objs: list[dict[str, Any]], create: str, selector: str,
                       tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Ask the what-if about ``objs`` (one workload), check it created nothing, create them
    at ``create`` right after, and compare the pods its controller makes (``selector``)
    once bound with the answer: per member shape, the nodes as a multiset."""
    c.create(pod("busy", c.ns).gpu(1).build())
    c.wait_bound(["busy"], 30)
    settle(1)
    code, answer = ask(c, copy.deepcopy(objs), tmp_path, capsys)
    assert code == 0 and answer["verdict"] == "fits-now", answer
    got = placed(answer)
    assert len(got) == 4 and not any(pin for _, pin in got.values()), answer
    tpl_shape = shape(objs[0]["spec"]["template"]["spec"])
    want = Counter((tpl_shape, node) for node, _ in got.values())
    assert [p["metadata"]["name"] for p in c.kube.pods(c.ns)] == ["busy"], \
        "the what-if created nothing"
    for o in objs:
        c.kube.create(create.format(ns=c.ns), o)
    c.kube.wait("its 4 pods", lambda: len(c.kube.pods(c.ns, labelSelector=selector)) == 4, 60)
    pods = c.kube.pods(c.ns, labelSelector=selector)
    bound = c.wait_bound([p["metadata"]["name"] for p in pods], 60)
    outcome = Counter((shape(p["spec"]), bound[p["metadata"]["name"]]) for p in pods)
    assert outcome == want, (outcome, answer)
    c.recorder.assert_gang_invariants(c.ns)


def test_an_indexed_job_goes_where_the_what_if_said(
        cluster: ClusterFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """kube-controller-manager's real Job controller: an Indexed Job of parallelism =
    completions = 4 whose template declares the gang; its generated pods bind, as a
    multiset, on the nodes the what-if named."""
    c = cluster("tiny-3x2")
    c.bed.start_controller_manager(KCM_WORKLOAD_CONTROLLERS)
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"},
           "spec": {"parallelism": 4, "completions": 4, "completionMode": "Indexed",
                    "template": template("train", {})}}
    goes_where_it_said(c, [job], "/apis/batch/v1/namespaces/{ns}/jobs",
                       "batch.kubernetes.io/job-name=train", tmp_path, capsys)


def test_a_deployment_goes_where_the_what_if_said(
        cluster: ClusterFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The real Deployment and ReplicaSet controllers: 4 replicas whose template declares
    the gang bind, as a multiset, on the nodes the what-if named."""
    c = cluster("tiny-3x2")
    c.bed.start_controller_manager(KCM_WORKLOAD_CONTROLLERS)
    tpl = template("web", {"app": "web"})
    del tpl["spec"]["restartPolicy"]  # a Deployment's pods restart Always
    dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
           "spec": {"replicas": 4, "selector": {"matchLabels": {"app": "web"}},
                    "template": tpl}}
    goes_where_it_said(c, [dep], "/apis/apps/v1/namespaces/{ns}/deployments", "app=web",
                       tmp_path, capsys)
