"""JobSet v0.10.1 and Kubeflow Trainer v2.1.0: what spec each pod resolves to.

The pods are shaped as the real controllers create them: JobSet's ``labelAndAnnotateObject``
(pkg/controllers/jobset_controller.go) puts the same keys on every pod as labels and as
annotations, and copies ``alpha.jobset.sigs.k8s.io/exclusive-topology`` from the JobSet or
the replicatedJob template as an annotation; Trainer's coscheduling plugin labels every pod
``scheduling.x-k8s.io/pod-group: <trainjob>`` and makes a PodGroup of that name whose
``minMember`` sums every replicatedJob's pods (``coscheduling.go``), and its JobSet has the
TrainJob's name, with the runtime's ``dependsOn`` (torchtune runtimes: both initializers,
then ``node``).
"""

from __future__ import annotations

from typing import Any

import pytest

from coscheduling import pod_from_json
from coscheduling.conventions import resolve
from coscheduling.conventions.base import Objects, PodGroupRecord
from coscheduling.conventions.jobset import (
    JOBSET,
    MAX_CHILD_JOBS,
    MAX_REPLICATED_JOBS,
    JobSetRecord,
    jobset_from_json,
)
from coscheduling.conventions.scheduler_plugins import podgroup_from_json
from coscheduling.conventions.volcano import volcano_podgroup_from_json
from coscheduling.gang.gating import declares_gang
from coscheduling.podgroup import (
    GangDefaults,
    GangKey,
    GangSpec,
    InvalidGang,
    Membership,
    MissingPodGroup,
    Source,
    gang_key,
)
from tests.builders import pod

DEFAULTS = GangDefaults()
JS = "jobset.sigs.k8s.io/"


def rjob(name: str, replicas: int = 1, parallelism: int = 1,
         depends: tuple[str, ...] = (), status: str = "Complete",
         annotations: dict[str, str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "replicas": replicas, "template": {
        "metadata": {"annotations": annotations or {}},
        "spec": {"parallelism": parallelism, "completions": parallelism,
                 "template": {"spec": {"containers": [{"name": name, "image": "x"}]}}}}}
    if depends:
        out["dependsOn"] = [{"name": d, "status": status} for d in depends]
    return out


def jobset(name: str, *jobs: dict[str, Any], ns: str = "default") -> dict[str, Any]:
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"replicatedJobs": list(jobs)}}


def js_pod(js: str, job: str, index: int, n: int, *, replicas: int = 1,
           annotations: dict[str, str] | None = None,
           labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod of child Job ``<js>-<job>-<index>``, as the JobSet controller labels it."""
    b = pod(f"{js}-{job}-{index}-{n}-abcde")
    keys = {JS + "jobset-name": js, JS + "jobset-uid": "uid-js",
            JS + "replicatedjob-name": job, JS + "restart-attempt": "0",
            JS + "replicatedjob-replicas": str(replicas), JS + "global-replicas": "3",
            JS + "job-index": str(index), JS + "job-key": "0123abcd",
            JS + "job-global-index": "0", JS + "group-name": "default",
            JS + "group-replicas": "3", JS + "job-group-index": "0",
            "batch.kubernetes.io/job-completion-index": str(n)}
    for k, v in keys.items():
        b.label(k, v).annotate(k, v)
    for k, v in (annotations or {}).items():
        b.annotate(k, v)
    for k, v in (labels or {}).items():
        b.label(k, v)
    return b.build()


def objects(*jsets: dict[str, Any], groups: tuple[PodGroupRecord, ...] = (),
            volcano: tuple[PodGroupRecord, ...] = ()) -> Objects:
    out: dict[Source, dict[GangKey, PodGroupRecord]] = {
        JOBSET: {(r := jobset_from_json(j)).key: r for j in jsets}}
    out[Source.SCHEDULER_PLUGINS] = {g.key: g for g in groups}
    out[Source.VOLCANO] = {g.key: g for g in volcano}
    return out


def resolved(obj: dict[str, Any], objs: Objects) -> Membership:
    return resolve(pod_from_json(obj), objs, DEFAULTS)


OPT_IN = {"lockstep.dev/gang-of": "jobset"}
DRIVER_WORKERS = jobset("train", rjob("driver"), rjob("workers", replicas=2, parallelism=2))


def test_a_jobset_without_the_opt_in_is_no_gang() -> None:
    obj = js_pod("train", "driver", 0, 0)
    assert not declares_gang(obj)
    assert resolved(obj, objects(DRIVER_WORKERS)) is None


def test_an_opted_in_jobset_is_one_gang_of_its_child_jobs() -> None:
    objs = objects(DRIVER_WORKERS)
    driver = js_pod("train", "driver", 0, 0, annotations=OPT_IN)
    worker = js_pod("train", "workers", 1, 1, replicas=2, annotations=OPT_IN)
    assert declares_gang(driver)
    d, w = resolved(driver, objs), resolved(worker, objs)
    assert isinstance(d, GangSpec) and isinstance(w, GangSpec), (d, w)
    children = (gang_key("default", "train-driver-0"), gang_key("default", "train-workers-0"),
                gang_key("default", "train-workers-1"))
    assert d.key == w.key == gang_key("default", "train") and d.source is JOBSET
    assert d.group == w.group == children and d.group is w.group  # one shared tuple
    assert (d.part, d.min_member, d.stage) == (children[0], 1, 0)
    assert (w.part, w.min_member, w.stage) == (children[2], 2, 0)
    assert d.min_parts is None and not d.part_exclusive and d.part_topology is None


def test_an_opted_in_pod_waits_for_its_jobset_object() -> None:
    m = resolved(js_pod("train", "driver", 0, 0, annotations=OPT_IN), objects())
    assert isinstance(m, MissingPodGroup) and m.key == gang_key("default", "train")


@pytest.mark.parametrize(("annotations", "labels", "field", "problem"), [
    ({"lockstep.dev/gang-of": "jobsets"}, {}, "lockstep.dev/gang-of", "must be jobset"),
    ({}, {JS + "job-index": "2"}, JS + "job-index", "below workers's 2 replicas"),
    ({}, {JS + "job-index": "9" * 40}, JS + "job-index", "below"),
    ({}, {JS + "replicatedjob-name": "ghost"}, JS + "replicatedjob-name", "no replicatedJob"),
    ({"alpha.jobset.sigs.k8s.io/exclusive-topology": "a" * 400}, {},
     "alpha.jobset.sigs.k8s.io/exclusive-topology", "never whole before it is admitted"),
])
def test_a_bad_value_names_its_field(annotations: dict[str, str], labels: dict[str, str],
                                     field: str, problem: str) -> None:
    obj = js_pod("train", "workers", 1, 0, replicas=2, annotations={**OPT_IN, **annotations})
    obj["metadata"]["labels"].update(labels)
    obj["metadata"]["annotations"].update(labels)
    m = resolved(obj, objects(DRIVER_WORKERS))
    assert isinstance(m, InvalidGang) and m.field == field and problem in m.problem, m


def test_a_pod_no_jobset_made_cannot_opt_in() -> None:
    m = resolved(pod("lonely").annotate("lockstep.dev/gang-of", "jobset").build(), objects())
    assert isinstance(m, InvalidGang) and m.field == "lockstep.dev/gang-of"
    assert "no JobSet's" in m.problem


def test_exclusive_topology_is_refused_with_the_opt_in() -> None:
    """JobSet's pod webhook admits a child Job's followers only once its leader pod is
    scheduled (the bed showed it): read as a gang, such a JobSet would wait forever."""
    zone = {"alpha.jobset.sigs.k8s.io/exclusive-topology": "topology.kubernetes.io/zone"}
    m = resolved(js_pod("train", "workers", 0, 0, replicas=2, annotations={**OPT_IN, **zone}),
                 objects(DRIVER_WORKERS))
    assert isinstance(m, InvalidGang)
    assert m.field == "alpha.jobset.sigs.k8s.io/exclusive-topology"
    assert "leader is scheduled" in m.problem and "lockstep.dev/gang-of: jobset" in m.problem


@pytest.mark.parametrize(("jobs", "field", "problem"), [
    ([rjob(f"j{i}") for i in range(MAX_REPLICATED_JOBS + 1)], "JobSet.spec.replicatedJobs",
     f"above the limit of {MAX_REPLICATED_JOBS}"),
    ([rjob("a", replicas=MAX_CHILD_JOBS), rjob("b")], "JobSet.spec.replicatedJobs[1].replicas",
     f"above the limit of {MAX_CHILD_JOBS}"),
    ([rjob("a", replicas=2**40)], "JobSet.spec.replicatedJobs[0].replicas", "int32"),
    ([rjob("a", parallelism=-1)], "JobSet.spec.replicatedJobs[0].template.spec.parallelism",
     "at least 1"),
    ([rjob("a"), rjob("b", depends=("c",))], "JobSet.spec.replicatedJobs[1].dependsOn[0].name",
     "names no earlier replicatedJob"),
    ([rjob("a", depends=("a",))], "JobSet.spec.replicatedJobs[0].dependsOn[0].name",
     "names no earlier replicatedJob"),
])
def test_a_jobset_past_a_limit_is_kept_with_an_error_naming_the_field(
        jobs: list[dict[str, Any]], field: str, problem: str) -> None:
    rec = jobset_from_json(jobset("big", *jobs))
    assert rec.error is not None and rec.error.field == field and problem in rec.error.problem
    assert rec.children == ()  # no key was built
    m = resolved(js_pod("big", "a", 0, 0, annotations=OPT_IN), {JOBSET: {rec.key: rec}})
    assert m == rec.error


def test_a_huge_jobset_costs_no_work_before_it_is_refused() -> None:
    rec = jobset_from_json(jobset("huge", rjob("a", replicas=2**31 - 1, parallelism=2**31 - 1)))
    assert rec.error is not None and rec.children == ()


# ---------------------------------------------------------------------------- Trainer v2


def trainjob_jobset(name: str, nodes: int) -> dict[str, Any]:
    """The JobSet Trainer v2.1.0 makes for a TrainJob on a torchtune-style runtime."""
    return jobset(name,
                  rjob("dataset-initializer"), rjob("model-initializer"),
                  rjob("node", parallelism=nodes,
                       depends=("dataset-initializer", "model-initializer")))


def trainer_pod(tj: str, job: str, n: int, *, volcano: bool = False) -> dict[str, Any]:
    if volcano:
        return js_pod(tj, job, 0, n, annotations={"scheduling.k8s.io/group-name": tj})
    return js_pod(tj, job, 0, n, labels={"scheduling.x-k8s.io/pod-group": tj})


def sp_group(name: str, min_member: int) -> PodGroupRecord:
    return podgroup_from_json({"metadata": {"name": name, "namespace": "default"},
                               "spec": {"minMember": min_member,
                                        "scheduleTimeoutSeconds": 120}})


def test_trainer_initializers_then_nodes_are_read_as_stages() -> None:
    """The seed of issue 44: Trainer's PodGroup counts the initializers with the 4 nodes
    (minMember 6 here), but the nodes are created only once both initializers complete.
    Each pod resolves to its child Job's stage: the initializers' stage 0 (admitted
    whole, both), the nodes' stage 1."""
    objs = objects(trainjob_jobset("tj", 4), groups=(sp_group("tj", 6),))
    init = resolved(trainer_pod("tj", "dataset-initializer", 0), objs)
    model = resolved(trainer_pod("tj", "model-initializer", 0), objs)
    node = resolved(trainer_pod("tj", "node", 3), objs)
    assert isinstance(init, GangSpec) and isinstance(model, GangSpec)
    assert isinstance(node, GangSpec)
    tj = gang_key("default", "tj")
    # The PodGroup's key and convention stay: its status is written there.
    assert init.key == node.key == tj and node.source is Source.SCHEDULER_PLUGINS
    assert node.timeout_seconds == 120
    assert init.group == (gang_key("default", "tj-dataset-initializer-0"),
                          gang_key("default", "tj-model-initializer-0"),
                          gang_key("default", "tj-node-0"))
    assert [(m.part, m.stage, m.min_member) for m in (init, model, node)] == [
        (gang_key("default", "tj-dataset-initializer-0"), 0, 1),
        (gang_key("default", "tj-model-initializer-0"), 0, 1),
        (gang_key("default", "tj-node-0"), 1, 4)]
    # The nodes' child Job is declared in its stage before any node exists: the core must
    # not wait for it beside the initializers (it would wait forever).
    assert init.part_stages == node.part_stages == ((gang_key("default", "tj-node-0"), 1),)


def test_trainer_volcano_policy_is_read_by_stages_too() -> None:
    vg = volcano_podgroup_from_json({"metadata": {"name": "tj", "namespace": "default"},
                                     "spec": {"minMember": 6}})
    objs = objects(trainjob_jobset("tj", 4), volcano=(vg,))
    node = resolved(trainer_pod("tj", "node", 0, volcano=True), objs)
    assert isinstance(node, GangSpec) and node.source is Source.VOLCANO
    assert (node.stage, node.min_member, node.part) == (1, 4, gang_key("default", "tj-node-0"))


def test_trainer_without_initializers_stays_a_flat_gang() -> None:
    objs = objects(jobset("tj", rjob("node", parallelism=4)), groups=(sp_group("tj", 4),))
    m = resolved(trainer_pod("tj", "node", 2), objs)
    assert isinstance(m, GangSpec) and m.min_member == 4 and m.group == () and m.part is None


def test_a_gang_counting_fewer_pods_than_its_jobset_is_read_as_written() -> None:
    """A user's PodGroup over the trainer nodes alone (4 of 6 pods): those coexist."""
    objs = objects(trainjob_jobset("tj", 4), groups=(sp_group("tj", 4),))
    m = resolved(trainer_pod("tj", "node", 0), objs)
    assert isinstance(m, GangSpec) and m.min_member == 4 and m.group == () and m.stage == 0


def test_before_the_jobset_is_seen_the_gang_is_read_as_written() -> None:
    m = resolved(trainer_pod("tj", "node", 0), objects(groups=(sp_group("tj", 6),)))
    assert isinstance(m, GangSpec) and m.min_member == 6 and m.group == ()


def test_a_jobset_with_dependson_read_by_locksteps_own_keys() -> None:
    """The same reading for any JobSet with dependsOn, whatever convention declares it."""
    objs = objects(jobset("etl", rjob("extract"), rjob("load", replicas=2, depends=("extract",),
                                                     status="Ready")))
    ann = {"lockstep.dev/pod-group": "etl-gang", "lockstep.dev/min-member": "3"}
    m = resolved(js_pod("etl", "load", 1, 0, replicas=2, annotations=ann), objs)
    assert isinstance(m, GangSpec) and m.key == gang_key("default", "etl-gang")
    assert (m.part, m.stage, m.min_member) == (gang_key("default", "etl-load-1"), 1, 1)


def test_a_koordinator_gang_group_is_left_as_koordinator_says() -> None:
    objs = objects(trainjob_jobset("tj", 1))
    ann = {"gang.scheduling.koordinator.sh/name": "a",
           "gang.scheduling.koordinator.sh/min-available": "3",
           "gang.scheduling.koordinator.sh/groups": '["default/a", "default/b"]'}
    m = resolved(js_pod("tj", "node", 0, 0, annotations=ann), objs)
    assert isinstance(m, GangSpec) and m.part == gang_key("default", "a") and m.stage == 0


def test_a_jobset_status_update_changes_no_record() -> None:
    """The store keeps what the spec says: a status-only event is an equal record, which
    the ingest entry skips (no pod is resolved again)."""
    a = trainjob_jobset("tj", 4)
    b = {**a, "status": {"replicatedJobsStatus": [{"name": "node", "ready": 4}]}}
    assert jobset_from_json(a) == jobset_from_json(b)
    assert isinstance(jobset_from_json(a), JobSetRecord)


def test_a_jobset_that_comes_after_its_pods_resolves_them_again() -> None:
    """The watch may bring the JobSet after its pods (a relist, a CRD installed late): its
    pods are resolved again, whichever convention they declare their gang by, and a
    status-only event of it resolves nothing (the record is equal)."""
    from coscheduling import Coscheduler, pod_key
    from coscheduling.conventions import jobset as js_conv
    from coscheduling.events import ingest
    from tests.unit.coscheduling.test_core import cluster

    core: Coscheduler = cluster()
    ann = {"lockstep.dev/pod-group": "etl-gang", "lockstep.dev/min-member": "3"}
    core.upsert_pod(pod_from_json(js_pod("etl", "extract", 0, 0, annotations=ann)))
    key = pod_key("default", "etl-extract-0-0-abcde")
    before = core.queries.membership(key)
    assert isinstance(before, GangSpec) and before.group == ()
    kind = ingest.kind_of(js_conv.CONVENTION, js_conv.WATCHES[0])
    core.upsert(kind, jobset_from_json(
        jobset("etl", rjob("extract"), rjob("load", replicas=2, depends=("extract",)))))
    after = core.queries.membership(key)
    assert isinstance(after, GangSpec) and after.stage == 0 and len(after.group) == 3
    core.delete(kind, gang_key("default", "etl"))
    gone = core.queries.membership(key)
    assert isinstance(gone, GangSpec) and gone.group == ()


def test_trainers_podgroup_read_by_stages_still_gets_its_status() -> None:
    """The PodGroup keeps its key when it is read by subgroups, so its phase and counts are
    written to it (a Koordinator gang group's key is no object's, and reports per part)."""
    from coscheduling.conventions.base import GangStatusModel, MemberCounts, StatusModel
    from coscheduling.conventions.scheduler_plugins import podgroup_statuses

    tj = gang_key("default", "tj")
    part = GangStatusModel(gang_key("default", "tj-node-0"), Source.SCHEDULER_PLUGINS, 4)
    g = GangStatusModel(tj, Source.SCHEDULER_PLUGINS, 6,
                        MemberCounts(total=2, scheduled=2, placed=2, bound=2, running=2),
                        holding=True, parts=(part,))
    model = StatusModel(gangs={tj: g}, objects={Source.SCHEDULER_PLUGINS: {
        tj: sp_group("tj", 6)}})
    st = podgroup_statuses(model)
    assert list(st) == [tj] and st[tj].phase == "Scheduling" and st[tj].running == 2


def test_an_unchanged_jobset_event_resolves_no_pod_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """JobSet's controller updates its status as every child Job moves: such an event
    brings an equal record, and no pod is resolved again (each time was a pass over every
    pod in the store)."""
    from coscheduling import Coscheduler
    from coscheduling.conventions import jobset as js_conv
    from coscheduling.events import ingest
    from tests.unit.coscheduling.test_core import cluster

    core: Coscheduler = cluster()
    ann = {"lockstep.dev/pod-group": "etl-gang", "lockstep.dev/min-member": "3"}
    core.upsert_pod(pod_from_json(js_pod("etl", "extract", 0, 0, annotations=ann)))
    kind = ingest.kind_of(js_conv.CONVENTION, js_conv.WATCHES[0])
    spec = jobset("etl", rjob("extract"), rjob("load", replicas=2, depends=("extract",)))
    core.upsert(kind, jobset_from_json(spec))
    calls: list[object] = []
    real = ingest.upsert_pod
    monkeypatch.setattr(ingest, "upsert_pod", lambda st, pod, **kw: (calls.append(pod),
                                                                     real(st, pod, **kw)))
    core.upsert(kind, jobset_from_json({**spec, "status": {"restarts": 0}}))
    assert calls == []
    core.upsert(kind, jobset_from_json(jobset("etl", rjob("extract"))))  # a real change
    assert len(calls) == 1
