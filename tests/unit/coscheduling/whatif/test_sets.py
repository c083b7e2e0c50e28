"""A what-if's JobSet, LeaderWorkerSet and TrainJob (with its runtime) read as the pods their
controllers would create, shaped so the conventions resolve them as they would the real
pods; every count bounded before a pod is built."""

from __future__ import annotations

from typing import Any

import pytest

from coscheduling import pod_from_json
from coscheduling.conventions import resolve
from coscheduling.conventions.jobset import JOBSET
from coscheduling.podgroup import GangDefaults, GangSpec, gang_key
from coscheduling.whatif import WhatIfError, expand
from coscheduling.whatif.expand import Expanded

POD = {"spec": {"schedulerName": "lockstep", "containers": [{"name": "node", "image": "x"}]}}


def specs(found: Expanded) -> dict[str, GangSpec]:
    out = {}
    for m in found.pods:
        spec = resolve(pod_from_json(m.obj), {s: {gang_key(*k.split("/", 1)): r
                                                  for k, r in g.items()}
                                              for s, g in found.groups.items()},
                       GangDefaults())
        assert isinstance(spec, GangSpec), (m.obj["metadata"]["name"], spec)
        out[m.obj["metadata"]["name"]] = spec
    return out


def rjob(name: str, replicas: int = 1, parallelism: int = 1, **extra: Any) -> dict[str, Any]:
    return {"name": name, "replicas": replicas, **extra,
            "template": {"spec": {"parallelism": parallelism, "completions": parallelism,
                                  "template": {"metadata": {"annotations": {
                                      "lockstep.dev/gang-of": "jobset"}}, **POD}}}}


def test_an_opted_in_jobset_expands_into_its_child_jobs_pods() -> None:
    obj = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
           "metadata": {"name": "train", "namespace": "ml"},
           "spec": {"replicatedJobs": [rjob("driver"), rjob("workers", 2, 2)]}}
    found = expand([obj], 1000, ["lockstep"])
    assert [m.obj["metadata"]["name"] for m in found.pods] == [
        "train-driver-0-0", "train-workers-0-0", "train-workers-0-1", "train-workers-1-0",
        "train-workers-1-1"]
    assert not any(m.named for m in found.pods) and found.pods[0].source == "JobSet ml/train"
    assert found.groups[JOBSET]["ml/train"].total == 5
    got = specs(found)
    assert {s.key for s in got.values()} == {gang_key("ml", "train")}
    assert got["train-workers-1-0"].part == gang_key("ml", "train-workers-1")
    assert got["train-workers-1-0"].min_member == 2


def test_a_leaderworkerset_expands_into_its_groups() -> None:
    obj = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
           "metadata": {"name": "llm"},
           "spec": {"replicas": 3, "leaderWorkerTemplate": {"size": 4, "workerTemplate": POD}}}
    found = expand([obj], 1000, ["lockstep"])
    assert len(found.pods) == 12 and all(m.named for m in found.pods)
    got = specs(found)
    assert got["llm-1"].part == got["llm-1-3"].part == gang_key("default", "llm-1")
    assert got["llm-2-1"].min_member == 4 and got["llm-0"].min_parts == 1


def runtime(policy: dict[str, Any], initializers: bool = True) -> dict[str, Any]:
    def step(name: str, step: str, **extra: Any) -> dict[str, Any]:
        return {"name": name, **extra, "template": {
            "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": step}},
            "spec": {"template": POD}}}
    jobs = [step("dataset-initializer", "dataset-initializer"),
            step("model-initializer", "model-initializer"),
            step("node", "trainer", dependsOn=[
                {"name": "dataset-initializer", "status": "Complete"},
                {"name": "model-initializer", "status": "Complete"}])]
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
            "metadata": {"name": "torch"},
            "spec": {"mlPolicy": {"numNodes": 1, "torch": {}}, "podGroupPolicy": policy,
                     "template": {"spec": {"replicatedJobs": jobs if initializers
                                           else [{**jobs[2], "dependsOn": None}]}}}}


TRAINJOB = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": "tj"},
            "spec": {"runtimeRef": {"name": "torch"},
                     "trainer": {"numNodes": 4,
                                 "resourcesPerNode": {"limits": {"nvidia.com/gpu": 1}}}}}


def test_a_trainjob_with_initializers_expands_by_stages() -> None:
    found = expand([TRAINJOB, runtime({"coscheduling": {"scheduleTimeoutSeconds": 120}})],
                   1000, ["lockstep"])
    assert len(found.pods) == 6
    pg = found.groups[next(s for s in found.groups if s.value == "scheduler-plugins")]
    assert pg["default/tj"].min_member == 6
    got = specs(found)
    node = got["tj-node-0-3"]
    assert (node.key, node.stage, node.min_member) == (gang_key("default", "tj"), 1, 4)
    assert node.timeout_seconds == 120
    assert got["tj-dataset-initializer-0-0"].stage == 0
    gpu = next(m for m in found.pods if m.obj["metadata"]["name"] == "tj-node-0-0")
    assert gpu.obj["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 1}}


def test_a_trainjob_with_the_volcano_policy_gets_volcanos_podgroup() -> None:
    found = expand([TRAINJOB, runtime({"volcano": {}}, initializers=False)], 1000,
                   ["lockstep"])
    got = specs(found)
    assert got["tj-node-0-0"].min_member == 4 and got["tj-node-0-0"].source.value == "volcano"


@pytest.mark.parametrize(("objs", "field"), [
    ([TRAINJOB], "TrainJob.spec.runtimeRef"),
    ([{"kind": "JobSet", "metadata": {"name": "j"},
       "spec": {"replicatedJobs": [rjob("a", 2**31 - 1, 2**31 - 1)]}}],
     "JobSet.spec.replicatedJobs[0].replicas"),
    ([{"kind": "JobSet", "metadata": {"name": "j"},
       "spec": {"replicatedJobs": [rjob("a", 30, 30)]}}], "JobSet default/j"),
    ([{"kind": "LeaderWorkerSet", "metadata": {"name": "l"},
       "spec": {"replicas": 20, "leaderWorkerTemplate": {"size": 20, "workerTemplate": POD}}}],
     "LeaderWorkerSet default/l"),
    ([{"kind": "LeaderWorkerSet", "metadata": {"name": "l"},
       "spec": {"replicas": 2**40, "leaderWorkerTemplate": {"workerTemplate": POD}}}],
     "LeaderWorkerSet.spec.replicas"),
])
def test_bad_or_too_large_sets_are_refused_naming_the_field(objs: list[Any], field: str
                                                            ) -> None:
    with pytest.raises(WhatIfError) as e:
        expand(objs, 100, ["lockstep"])
    assert e.value.field == field


def test_a_leader_ready_set_expands_into_pods_admitted_alone() -> None:
    obj = {"kind": "LeaderWorkerSet", "metadata": {"name": "llm"},
           "spec": {"replicas": 2, "startupPolicy": "LeaderReady",
                    "leaderWorkerTemplate": {"size": 3, "workerTemplate": POD}}}
    found = expand([obj], 1000, ["lockstep"])
    assert {s.min_member for s in specs(found).values()} == {1}
    assert any("LeaderReady" in n for n in found.notes)
