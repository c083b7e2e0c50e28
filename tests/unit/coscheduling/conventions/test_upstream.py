"""The upstream gang API (scheduling.k8s.io Workload / PodGroup) read as Lockstep gangs.

Objects are written as the Kubernetes API documents them (k8s.io/api scheduling/v1alpha1 in
1.35, v1alpha2 in 1.36, v1alpha3 and v1beta1 in 1.37), not as Lockstep would like them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from app.kube.cache import ClusterCache
from app.kube.client import KubeClient, KubeConfig
from coscheduling import Coscheduler, GangPhase, Settings, gang_key, node_from_json, pod_key
from coscheduling.conventions.upstream import (
    Condition,
    ConditionUpdate,
    GangProgress,
    GroupPolicy,
    Priority,
    UpstreamPodGroup,
    combine,
    condition_updates,
    resolve_upstream,
    upstream_podgroup_from_json,
    upstream_workload_from_json,
    workload_gang_key,
)
from coscheduling.events import ingest
from coscheduling.podgroup import GangDefaults, GangSpec, InvalidGang, MissingPodGroup, Source
from coscheduling.reasons import (
    DoesNotFit,
    InvalidDeclaration,
    PodGroupNotFound,
    WaitingForMembers,
)
from coscheduling.records import PodRecord, pod_from_json
from coscheduling.topology.domains import DEFAULT_LEVELS
from tests.builders import node, pod
from tests.fakeapi import Wire

DEFAULTS = GangDefaults(timeout_seconds=60, max_timeout_seconds=240)
KEY = gang_key("default", "train")
V1B1 = "PodGroup (scheduling.k8s.io/v1beta1).spec"


def podgroup(name: str = "train", version: str = "v1beta1", *, min_count: Any = 4,
             basic: bool = False, topology: list[Any] | None = None,
             extra_spec: dict[str, Any] | None = None,
             status: dict[str, Any] | None = None) -> dict[str, Any]:
    """A PodGroup as a workload controller creates it from a Workload's template (1.36+)."""
    policy: dict[str, Any] = {"basic": {}} if basic else {"gang": {"minCount": min_count}}
    spec: dict[str, Any] = {"schedulingPolicy": policy}
    if version == "v1alpha2":
        spec["podGroupTemplateRef"] = {"workload": {"workloadName": "job",
                                                    "podGroupTemplateName": "workers"}}
    else:
        spec["workloadRef"] = {"workloadName": "job", "templateName": "workers"}
    if topology is not None:
        spec["schedulingConstraints"] = {"topology": topology}
    spec.update(extra_spec or {})
    obj: dict[str, Any] = {"apiVersion": f"scheduling.k8s.io/{version}", "kind": "PodGroup",
                           "metadata": {"name": name, "namespace": "default", "generation": 1},
                           "spec": spec}
    if status is not None:
        obj["status"] = status
    return obj


def workload_v1alpha1(name: str = "job", groups: list[dict[str, Any]] | None = None
                      ) -> dict[str, Any]:
    """A 1.35 Workload: pods point at it with spec.workloadRef."""
    return {"apiVersion": "scheduling.k8s.io/v1alpha1", "kind": "Workload",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"controllerRef": {"apiGroup": "batch", "kind": "Job", "name": name},
                     "podGroups": groups if groups is not None else [
                         {"name": "workers", "policy": {"gang": {"minCount": 4}}},
                         {"name": "driver", "policy": {"basic": {}}}]}}


def member(name: str = "w0", group: str | None = "train",
           workload_ref: dict[str, str] | None = None, **annotations: str) -> PodRecord:
    b = pod(name).gpu(1)
    for k, v in annotations.items():
        b.annotate(k.replace("__", "/").replace("_", "-"), v)
    obj = b.build()
    if group is not None:
        obj["spec"]["schedulingGroup"] = {"podGroupName": group}
    if workload_ref is not None:
        obj["spec"]["workloadRef"] = workload_ref
    return pod_from_json(obj)


# ------------------------------------------------------------------------------ parsing


@pytest.mark.parametrize(
    ("obj", "version", "want_policy", "want_error"),
    [
        pytest.param(podgroup(), "v1beta1", GroupPolicy(4, None, f"{V1B1}.schedulingPolicy"),
                     None, id="v1beta1-gang"),
        pytest.param(podgroup(version="v1alpha3"), "v1alpha3",
                     GroupPolicy(4, None,
                                 "PodGroup (scheduling.k8s.io/v1alpha3).spec.schedulingPolicy"),
                     None, id="v1alpha3-gang"),
        pytest.param(podgroup(version="v1alpha2"), "v1alpha2",
                     GroupPolicy(4, None,
                                 "PodGroup (scheduling.k8s.io/v1alpha2).spec.schedulingPolicy"),
                     None, id="v1alpha2-gang-with-template-ref"),
        pytest.param(podgroup(basic=True), "v1beta1",
                     GroupPolicy(None, None, f"{V1B1}.schedulingPolicy"), None, id="basic"),
        pytest.param(podgroup(topology=[{"key": "topology.kubernetes.io/zone"}]), "v1beta1",
                     GroupPolicy(4, "topology.kubernetes.io/zone", f"{V1B1}.schedulingPolicy"),
                     None, id="topology-constraint"),
        pytest.param(podgroup(min_count=0), "v1beta1", None,
                     (f"{V1B1}.schedulingPolicy.gang.minCount", "must be at least 1"),
                     id="min-count-zero"),
        pytest.param(podgroup(min_count="4"), "v1beta1", None,
                     (f"{V1B1}.schedulingPolicy.gang.minCount", "not a whole number"),
                     id="min-count-string"),
        pytest.param(podgroup(min_count=None), "v1beta1", None,
                     (f"{V1B1}.schedulingPolicy.gang.minCount", "missing"),
                     id="min-count-missing"),
        pytest.param(podgroup(extra_spec={"schedulingPolicy": {"basic": {},
                                                               "gang": {"minCount": 2}}}),
                     "v1beta1", None,
                     (f"{V1B1}.schedulingPolicy", "exactly one of basic or gang"),
                     id="basic-and-gang"),
        pytest.param(podgroup(extra_spec={"schedulingPolicy": {}}), "v1beta1", None,
                     (f"{V1B1}.schedulingPolicy", "missing: exactly one of basic or gang"),
                     id="no-policy"),
        pytest.param(podgroup(topology=[{"key": "a"}, {"key": "b"}]), "v1beta1", None,
                     (f"{V1B1}.schedulingConstraints.topology", "exactly one topology"),
                     id="two-topology-constraints"),
        pytest.param(podgroup(topology=[{}]), "v1beta1", None,
                     (f"{V1B1}.schedulingConstraints.topology[0].key", "missing"),
                     id="topology-without-key"),
        pytest.param(podgroup(extra_spec={"parentCompositePodGroupName": ["job"]}), "v1beta1",
                     None, (f"{V1B1}.parentCompositePodGroupName", "not an object name"),
                     id="composite-child-bad-parent"),
    ],
)
def test_podgroup_from_json(obj: dict[str, Any], version: str,
                            want_policy: GroupPolicy | None,
                            want_error: tuple[str, str] | None) -> None:
    got = upstream_podgroup_from_json(obj, version)
    assert got.key == KEY and got.version == version and got.generation == 1
    assert got.policy == want_policy
    if want_error is None:
        assert got.error is None
    else:
        assert got.error is not None and got.error.key == KEY
        assert (got.error.field, want_error[1] in got.error.problem) == (want_error[0], True)


def test_condition_and_its_field_managers_by_version() -> None:
    cond = {"type": "PodGroupInitiallyScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/3 nodes", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    obj = podgroup(status={"conditions": [cond, {"type": "DisruptionTarget",
                                                 "status": "False"}]})
    obj["metadata"]["managedFields"] = [
        {"manager": "kube-scheduler", "operation": "Update", "subresource": "status",
         "fieldsV1": {"f:status": {"f:conditions": {
             '.': {}, 'k:{"type":"PodGroupInitiallyScheduled"}': {'.': {}}}}}},
        {"manager": "kubectl", "operation": "Update",
         "fieldsV1": {"f:spec": {"f:schedulingPolicy": {}}}},
    ]
    got = upstream_podgroup_from_json(obj, "v1beta1")
    assert got.condition == Condition("PodGroupInitiallyScheduled", "False", "Unschedulable",
                                      "0/3 nodes", "2026-01-01T00:00:00Z")
    assert got.condition_managers == ("kube-scheduler",)
    # 1.36 (v1alpha2) names its condition PodGroupScheduled: the 1.37 one is not it.
    assert upstream_podgroup_from_json(obj, "v1alpha2").condition is None


def test_workload_v1alpha1_pod_groups() -> None:
    wl = upstream_workload_from_json(workload_v1alpha1(groups=[
        {"name": "workers", "policy": {"gang": {"minCount": 4}}},
        {"name": "driver", "policy": {"basic": {}}},
        {"name": "bad", "policy": {"gang": {"minCount": -1}}},
    ]), "v1alpha1")
    where = "Workload (scheduling.k8s.io/v1alpha1).spec.podGroups[name={}].policy"
    assert wl.key == gang_key("default", "job")
    assert wl.groups["workers"] == GroupPolicy(4, None, where.format("workers"))
    assert wl.groups["driver"] == GroupPolicy(None, None, where.format("driver"))
    bad = wl.groups["bad"]
    assert isinstance(bad, InvalidGang) and bad.field == where.format("bad") + ".gang.minCount"


# ------------------------------------------------------------------------------ resolving


def groups(*objs: dict[str, Any], version: str = "v1beta1") -> dict[Any, UpstreamPodGroup]:
    recs = (upstream_podgroup_from_json(o, version) for o in objs)
    return {r.key: r for r in recs}


WL_KEY = gang_key("default", "job/workers/0")


@pytest.mark.parametrize(
    ("pod_rec", "pgs", "want"),
    [
        pytest.param(member(), groups(podgroup()), GangSpec(KEY, 4, 60, Source.UPSTREAM),
                     id="scheduling-group-gang"),
        pytest.param(member(), groups(podgroup(version="v1alpha2"), version="v1alpha2"),
                     GangSpec(KEY, 4, 60, Source.UPSTREAM), id="v1alpha2-gang"),
        pytest.param(member(), {}, MissingPodGroup(KEY, "scheduling.k8s.io"),
                     id="podgroup-not-there-yet"),
        pytest.param(member(), groups(podgroup(basic=True)), None, id="basic-is-no-gang"),
        pytest.param(member(group=None), groups(podgroup()), None, id="no-reference"),
        pytest.param(member(), groups(podgroup(topology=[{"key": "topology.kubernetes.io/zone"}])),
                     GangSpec(KEY, 4, 60, Source.UPSTREAM, topology="zone"), id="zone-label"),
        pytest.param(member(), groups(podgroup(topology=[{"key": "kubernetes.io/hostname"}])),
                     GangSpec(KEY, 4, 60, Source.UPSTREAM, topology="hostname"),
                     id="hostname-label"),
        pytest.param(member(), groups(podgroup(topology=[{"key": "nvidia.com/gpu.clique"}])),
                     GangSpec(KEY, 4, 60, Source.UPSTREAM, topology="clique"),
                     id="nvlink-clique-label"),
        pytest.param(member(), groups(podgroup(min_count=0)),
                     InvalidGang(KEY, f"{V1B1}.schedulingPolicy.gang.minCount", "0",
                                 "must be at least 1"), id="invalid-object"),
        pytest.param(member(workload_ref={"name": "job", "podGroup": "workers",
                                          "podGroupReplicaKey": "0"}, group=None), {},
                     MissingPodGroup(WL_KEY, "scheduling.k8s.io Workload job"),
                     id="workload-not-there-yet"),
    ],
)
def test_resolve_upstream(pod_rec: PodRecord, pgs: dict[Any, UpstreamPodGroup],
                          want: object) -> None:
    assert resolve_upstream(pod_rec, pgs, {}, DEFAULTS, DEFAULT_LEVELS) == want


def test_unknown_topology_key_is_named_never_dropped() -> None:
    """The API's own example key is not a label Lockstep knows: the gang is rejected with the
    field, rather than scheduled without the constraint its author wrote."""
    got = resolve_upstream(member(), groups(podgroup(topology=[
        {"key": "topology.kubernetes.io/rack"}])), {}, DEFAULTS, DEFAULT_LEVELS)
    assert isinstance(got, InvalidGang)
    assert got.field == f"{V1B1}.schedulingConstraints.topology[0].key"
    assert got.value == "topology.kubernetes.io/rack" and "lockstep.dev/rack" in got.problem


@pytest.mark.parametrize(
    ("ref", "want"),
    [
        pytest.param({"name": "job", "podGroup": "workers", "podGroupReplicaKey": "0"},
                     GangSpec(WL_KEY, 4, 60, Source.UPSTREAM), id="gang-with-replica-key"),
        pytest.param({"name": "job", "podGroup": "workers"},
                     GangSpec(gang_key("default", "job/workers"), 4, 60, Source.UPSTREAM),
                     id="gang-without-replica-key"),
        pytest.param({"name": "job", "podGroup": "driver"}, None, id="basic-group"),
        pytest.param({"name": "job", "podGroup": "ps"},
                     InvalidGang(gang_key("default", "job/ps"), "spec.workloadRef.podGroup", "ps",
                                 "Workload job has no such pod group (it has: driver, workers)"),
                     id="unknown-pod-group"),
    ],
)
def test_resolve_workload_ref_of_1_35(ref: dict[str, str], want: object) -> None:
    wl = upstream_workload_from_json(workload_v1alpha1(), "v1alpha1")
    got = resolve_upstream(member(group=None, workload_ref=ref), {}, {wl.key: wl}, DEFAULTS,
                           DEFAULT_LEVELS)
    assert got == want


def test_workload_gang_keys_never_collide_with_podgroup_names() -> None:
    assert workload_gang_key("ns", ("a", "b", "")) == "ns/a/b"
    assert workload_gang_key("ns", ("a", "b", "r1")) == "ns/a/b/r1"


UP = GangSpec(KEY, 4, 60, Source.UPSTREAM, topology="rack")
LS = GangSpec(KEY, 4, 90, Source.LOCKSTEP)


@pytest.mark.parametrize(
    ("other", "upstream", "want"),
    [
        pytest.param(None, UP, UP, id="upstream-alone"),
        pytest.param(LS, None, LS, id="other-alone-or-basic-policy"),
        pytest.param(LS, UP, GangSpec(KEY, 4, 90, Source.LOCKSTEP, topology="rack"),
                     id="agreeing-keeps-timeout-and-topology"),
        pytest.param(GangSpec(KEY, 3, 60, Source.LOCKSTEP), UP,
                     InvalidGang(KEY, "spec.schedulingPolicy.gang.minCount", "4",
                                 "conflicts with min-member 3 declared elsewhere"),
                     id="disagreeing-size"),
        pytest.param(GangSpec(gang_key("default", "other"), 4, 60, Source.LOCKSTEP), UP,
                     "conflicting gang declarations", id="different-gangs"),
        pytest.param(LS, MissingPodGroup(KEY, "scheduling.k8s.io"),
                     MissingPodGroup(KEY, "scheduling.k8s.io"), id="podgroup-still-missing"),
    ],
)
def test_combine_with_other_conventions(other: Any, upstream: Any, want: object) -> None:
    got = combine(other, upstream)
    if isinstance(want, str):
        assert isinstance(got, InvalidGang) and got.key is None and want in got.problem
    else:
        assert got == want


# ------------------------------------------------------------------------------ status


def pg_rec(version: str = "v1beta1", *, condition: Condition | None = None,
           managers: tuple[str, ...] = (), error: InvalidGang | None = None
           ) -> UpstreamPodGroup:
    return UpstreamPodGroup(KEY, version, GroupPolicy(4), error, condition, managers, 3)


NOFIT = DoesNotFit(KEY, None, ())  # type: ignore[arg-type]
TRUE = Condition("PodGroupInitiallyScheduled", "True", "Scheduled", "4/4")
BAD = InvalidGang(KEY, f"{V1B1}.schedulingConstraints.topology[0].key", "x", "unknown")


@pytest.mark.parametrize(
    ("rec", "progress", "want"),
    [
        pytest.param(pg_rec(), GangProgress(4, 4, None),
                     ConditionUpdate(KEY, "v1beta1", "PodGroupInitiallyScheduled", True,
                                     "Scheduled", None,
                                     "4/4 members bound together by Lockstep", 3),
                     id="bound-in-full"),
        pytest.param(pg_rec("v1alpha2"), GangProgress(4, 4, None),
                     ConditionUpdate(KEY, "v1alpha2", "PodGroupScheduled", True, "Scheduled",
                                     None, "4/4 members bound together by Lockstep", 3),
                     id="v1alpha2-condition-type"),
        pytest.param(pg_rec(), GangProgress(0, 4, NOFIT),
                     ConditionUpdate(KEY, "v1beta1", "PodGroupInitiallyScheduled", False,
                                     "Unschedulable", NOFIT, "", 3), id="does-not-fit"),
        pytest.param(pg_rec(error=BAD), GangProgress(0, None, None),
                     ConditionUpdate(KEY, "v1beta1", "PodGroupInitiallyScheduled", False,
                                     "SchedulerError", InvalidDeclaration(BAD), "", 3),
                     id="invalid-declaration"),
        pytest.param(pg_rec(), GangProgress(2, 4, WaitingForMembers(KEY, 2, 4)), None,
                     id="waiting-for-members-says-nothing"),
        pytest.param(pg_rec(condition=TRUE), GangProgress(1, 4, NOFIT), None,
                     id="true-is-terminal"),
        pytest.param(pg_rec(managers=("kube-scheduler",)), GangProgress(4, 4, None), None,
                     id="native-plugin-owns-it"),
        pytest.param(pg_rec(managers=("lockstep",)), GangProgress(0, 4, NOFIT),
                     ConditionUpdate(KEY, "v1beta1", "PodGroupInitiallyScheduled", False,
                                     "Unschedulable", NOFIT, "", 3), id="ours-to-update"),
    ],
)
def test_condition_updates(rec: UpstreamPodGroup, progress: GangProgress,
                           want: ConditionUpdate | None) -> None:
    got = condition_updates({KEY: rec}, {KEY: progress}, manager="lockstep")
    assert got == ([want] if want else [])


def test_no_condition_for_groups_whose_pods_are_not_locksteps() -> None:
    assert condition_updates({KEY: pg_rec()}, {}, manager="lockstep") == []


# ------------------------------------------------------------------------------ the core


def six_gpus(**labels: str) -> Coscheduler:
    core = Coscheduler(Settings(backoff_seconds=10))
    for i in range(3):
        b = node(f"n{i}").gpus(2)
        for k, v in labels.items():
            b.label(k, v)
        b.label("topology.kubernetes.io/zone", f"z{i % 2}")
        core.upsert(ingest.NODES, node_from_json(b.build()))
    return core


def test_pods_before_their_podgroup_wait_then_are_woken_when_it_arrives() -> None:
    core = six_gpus()
    for i in range(4):
        core.upsert_pod(member(f"w{i}"))
    w0 = core.queries.pods[pod_key("default", "w0")]
    d = core.filter(w0, sorted(core.queries.nodes), 0.0)
    assert d.unresolvable == PodGroupNotFound(KEY, "scheduling.k8s.io")
    core.drain()
    core.upsert(ingest.UPSTREAM_PODGROUPS, upstream_podgroup_from_json(podgroup(), "v1beta1"))
    assert pod_key("default", "w0") in core.drain().requeue  # woken, as for Volcano
    assert len(core.filter(w0, sorted(core.queries.nodes), 1.0).passed) == 1


def test_a_condition_written_back_does_not_re_resolve_or_wake() -> None:
    core = six_gpus()
    core.upsert(ingest.UPSTREAM_PODGROUPS, upstream_podgroup_from_json(podgroup(), "v1beta1"))
    for i in range(3):
        core.upsert_pod(member(f"w{i}"))
    w0 = core.queries.pods[pod_key("default", "w0")]
    d = core.filter(w0, sorted(core.queries.nodes), 0.0)
    assert isinstance(d.unresolvable, WaitingForMembers)
    core.drain()
    written = podgroup(status={"conditions": [{"type": "PodGroupInitiallyScheduled",
                                                "status": "False", "reason": "Unschedulable",
                                                "message": "x"}]})
    core.upsert(ingest.UPSTREAM_PODGROUPS, upstream_podgroup_from_json(written, "v1beta1"))
    assert core.drain().requeue == []
    assert core.queries.status_model().upstream[KEY].condition is not None


def test_zone_constraint_keeps_the_gang_in_one_zone() -> None:
    core = six_gpus()  # zones: n0, n2 in z0 (4 GPUs), n1 in z1 (2 GPUs)
    core.upsert(ingest.UPSTREAM_PODGROUPS, upstream_podgroup_from_json(podgroup(
        min_count=3, topology=[{"key": "topology.kubernetes.io/zone"}]), "v1beta1"))
    for i in range(3):
        core.upsert_pod(member(f"w{i}"))
    q = core.queries
    placed = {core.filter(q.pods[pod_key("default", f"w{i}")], sorted(q.nodes), 0.0).passed[0]
              for i in range(3)}
    assert placed <= {"n0", "n2"}
    view = core.queries.gang_view(KEY)
    assert view is not None and view.phase is GangPhase.ADMITTED and view.plan_level == "zone"


def test_podgroup_deleted_turns_members_back_to_missing() -> None:
    core = six_gpus()
    core.upsert(ingest.UPSTREAM_PODGROUPS,
                upstream_podgroup_from_json(podgroup(min_count=1), "v1beta1"))
    core.upsert_pod(member("w0"))
    assert isinstance(core.queries.membership(pod_key("default", "w0")), GangSpec)
    core.replace(ingest.UPSTREAM_PODGROUPS, [])
    m = core.queries.membership(pod_key("default", "w0"))
    assert m == MissingPodGroup(KEY, "scheduling.k8s.io")


def test_pods_of_other_schedulers_are_not_locksteps() -> None:
    core = six_gpus()
    obj = pod("native").gpu(1).scheduler("default-scheduler").build()
    obj["spec"]["schedulingGroup"] = {"podGroupName": "train"}
    core.upsert_pod(pod_from_json(obj))
    assert core.queries.membership(pod_key("default", "native")) is None


# ------------------------------------------------------------------------------ discovery


def discovery(served: dict[str, list[str]]) -> Any:
    """An API server serving scheduling.k8s.io ``served`` {version: resources}."""
    def api(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/apis/scheduling.k8s.io":
            return httpx.Response(200, json={"kind": "APIGroup", "name": "scheduling.k8s.io",
                                             "versions": [{"version": v} for v in served]})
        for v, resources in served.items():
            if path == f"/apis/scheduling.k8s.io/{v}":
                return httpx.Response(200, json={"resources": [{"name": r}
                                                               for r in resources]})
            if path == f"/apis/scheduling.k8s.io/{v}/podgroups" and "podgroups" in resources:
                if request.url.params.get("watch"):
                    return httpx.Response(200, content=b"")
                return httpx.Response(200, json={"metadata": {"resourceVersion": "5"},
                                                 "items": [podgroup(version=v)]})
        return httpx.Response(404, content=b"404 page not found\n")
    return api


async def until(cond: Any) -> None:
    for _ in range(300):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


@pytest.mark.parametrize(
    ("served", "want_version"),
    [
        pytest.param({"v1": ["priorityclasses"], "v1beta1": ["podgroups", "podgroups/status",
                                                            "workloads"],
                      "v1alpha3": ["podgroups", "workloads"]}, "v1beta1", id="1.37-both"),
        pytest.param({"v1": ["priorityclasses"], "v1alpha3": ["podgroups"]}, "v1alpha3",
                     id="1.37-alpha-only"),
        pytest.param({"v1": ["priorityclasses"], "v1alpha2": ["podgroups", "workloads"]},
                     "v1alpha2", id="1.36"),
        pytest.param({"v1": ["priorityclasses"]}, "", id="1.34-or-gate-off"),
        pytest.param({}, "", id="group-absent"),
    ],
)
async def test_podgroups_are_found_by_discovery_or_synced_empty(
        served: dict[str, list[str]], want_version: str) -> None:
    core = Coscheduler()
    cache = ClusterCache(core, KubeClient(KubeConfig("http://api.test"),
                                          connect=Wire(discovery(served))))
    res = cache.resources["upstream-podgroups"]
    task = asyncio.create_task(cache.run("upstream-podgroups"))
    try:
        await until(lambda: res.synced)
        if want_version:
            await until(lambda: KEY in core.queries.status_model().upstream)
            assert core.queries.status_model().upstream[KEY].version == want_version
            assert res.path == f"/apis/scheduling.k8s.io/{want_version}/podgroups"
        else:
            assert core.queries.status_model().upstream == {} and res.version == ""
        assert not task.done()  # never fails, never exits
    finally:
        task.cancel()


# ------------------------------------------------------------------------------ priority


@pytest.mark.parametrize(
    ("extra", "want"),
    [
        pytest.param({"priorityClassName": "high", "priority": 1000}, Priority(1000, "high"),
                     id="priority-filled-by-admission"),
        pytest.param({"priorityClassName": "high"}, Priority(None, "high"),
                     id="class-only-priority-not-filled"),
        pytest.param({"preemptionPolicy": "Never", "disruptionMode": {"single": {}}},
                     Priority(None, None, True), id="never"),
        pytest.param({"preemptionPolicy": "PreemptLowerPriority"}, Priority(),
                     id="preempt-lower-priority"),
    ],
)
def test_podgroup_priority_fields(extra: dict[str, Any], want: Priority) -> None:
    got = upstream_podgroup_from_json(podgroup(extra_spec=extra), "v1beta1")
    assert got.error is None and got.priority == want
    spec = resolve_upstream(member(), {KEY: got}, {}, DEFAULTS, DEFAULT_LEVELS)
    assert isinstance(spec, GangSpec)
    assert (spec.priority, spec.priority_class, spec.preempt_never) \
        == (want.value, want.class_name, want.never)


@pytest.mark.parametrize(
    ("extra", "field", "problem"),
    [
        pytest.param({"priority": "high"}, f"{V1B1}.priority", "not a whole number",
                     id="priority-not-a-number"),
        pytest.param({"preemptionPolicy": "Sometimes"}, f"{V1B1}.preemptionPolicy",
                     "Never or PreemptLowerPriority", id="unknown-policy"),
    ],
)
def test_bad_priority_fields_are_named(extra: dict[str, Any], field: str, problem: str) -> None:
    got = upstream_podgroup_from_json(podgroup(extra_spec=extra), "v1beta1")
    assert got.error is not None and got.error.field == field and problem in got.error.problem
