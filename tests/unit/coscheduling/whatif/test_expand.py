"""A what-if's objects read as the pods they would create: a Job's parallelism and Indexed
names, a Deployment's replicas, a PyTorchJob's replica types and the PodGroup its operator
would create, a Kueue Workload's podSets, a Volcano PodGroup; every count bounded before a
pod is built, and every refusal names its field."""

from __future__ import annotations

from typing import Any

import pytest

from coscheduling.conventions.base import Source
from coscheduling.conventions.kueue import GROUP, TOTAL
from coscheduling.whatif import MAX_OBJECTS, WhatIfError, expand

TPL = {"spec": {"schedulerName": "lockstep", "containers": [{"name": "c"}]}}


def job(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
            "spec": {"template": TPL, **spec}}


def names(objs: list[Any], limit: int = 1000) -> list[str]:
    return [m.obj["metadata"]["name"] for m in expand(objs, limit, ["lockstep"]).pods]


def test_a_job_creates_min_of_parallelism_and_completions_pods() -> None:
    assert names([job(parallelism=4, completions=2)]) == ["j-0", "j-1"]
    assert names([job(parallelism=3)]) == ["j-0", "j-1", "j-2"]
    found = expand([job(parallelism=2, completionMode="Indexed")], 1000, ["lockstep"])
    assert [m.obj["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
            for m in found.pods] == ["0", "1"]
    assert not any(m.named for m in found.pods)  # generated names: gated, not pinned


def test_a_deployment_creates_its_replicas() -> None:
    dep = {"kind": "Deployment", "metadata": {"name": "d", "namespace": "ml"},
           "spec": {"replicas": 3, "template": TPL}}
    found = expand([dep], 1000, ["lockstep"])
    assert [m.obj["metadata"]["namespace"] for m in found.pods] == ["ml"] * 3


def test_a_pytorchjob_without_its_podgroup_gets_the_operators() -> None:
    pj = {"kind": "PyTorchJob", "metadata": {"name": "t"}, "spec": {"pytorchReplicaSpecs": {
        "Worker": {"replicas": 2, "template": {"spec": {"containers": []}}},
        "Master": {"replicas": 1, "template": {"spec": {"containers": []}}}}}}
    found = expand([pj], 1000, ["lockstep"])
    assert [m.obj["metadata"]["name"] for m in found.pods] == ["t-master-0", "t-worker-0",
                                                               "t-worker-1"]
    assert all(m.obj["spec"]["schedulerName"] == "lockstep" for m in found.pods)
    assert found.groups[Source.SCHEDULER_PLUGINS]["default/t"].min_member == 3


def test_a_pytorchjob_with_a_volcano_podgroup_is_volcanos() -> None:
    pj = {"kind": "PyTorchJob", "metadata": {"name": "t"}, "spec": {"pytorchReplicaSpecs": {
        "Worker": {"replicas": 2, "template": TPL}}}}
    pg = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
          "metadata": {"name": "t"}, "spec": {"minMember": 2, "queue": "q"}}
    found = expand([pj, pg], 1000, ["lockstep"])
    assert found.pods[0].obj["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "t"
    assert found.groups[Source.VOLCANO]["default/t"].queue == "q"


def test_a_kueue_workload_is_one_kueue_pod_group() -> None:
    wl = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
          "metadata": {"name": "w"}, "spec": {"queueName": "lq", "priority": 7, "podSets": [
              {"name": "driver", "count": 1, "template": TPL},
              {"name": "workers", "count": 2, "template": TPL}]}}
    found = expand([wl], 1000, ["lockstep"])
    assert [m.obj["metadata"]["name"] for m in found.pods] == ["w-driver-0", "w-workers-0",
                                                               "w-workers-1"]
    assert {m.obj["metadata"]["labels"][GROUP] for m in found.pods} == {"w"}
    assert {m.obj["metadata"]["annotations"][TOTAL] for m in found.pods} == {"3"}
    assert {m.obj["spec"]["priority"] for m in found.pods} == {7}  # the Workload's own


@pytest.mark.parametrize(("objs", "field"), [
    ([job(parallelism=10**12)], "Job.spec.parallelism"),
    ([job(parallelism="3")], "Job.spec.parallelism"),
    ([{"kind": "Deployment", "metadata": {"name": "d"},
       "spec": {"replicas": 1001, "template": TPL}}], "Deployment.spec.replicas"),
    ([job(parallelism=600), job(parallelism=600)], "Job.spec.parallelism"),
    ([job(parallelism=1, completions=2**40)], "Job.spec.completions"),
    ([{"kind": "Gizmo"}], "document 1.kind"),
    ([{"kind": "Pod", "metadata": {}}], "Pod.metadata.name"),
    (["text"], "document 1"),
    ([{"kind": "Pod", "metadata": {"name": f"p{i}"}, "spec": {}}
      for i in range(MAX_OBJECTS + 1)], "manifest"),
    ([{"apiVersion": "example.com/v1", "kind": "PodGroup", "metadata": {"name": "g"}}],
     "PodGroup.apiVersion"),
    ([{"kind": "Job", "metadata": {"name": "j"}, "spec": {}}], "Job.spec.template"),
])
def test_bad_objects_are_refused_naming_the_field(objs: list[Any], field: str) -> None:
    with pytest.raises(WhatIfError) as e:
        expand(objs, 1000, ["lockstep"])
    assert e.value.field == field
