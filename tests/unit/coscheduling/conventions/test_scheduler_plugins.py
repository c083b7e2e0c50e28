"""Gang membership from every convention, and bad declarations named by field."""

from __future__ import annotations

import pytest

from coscheduling.conventions import resolve
from coscheduling.conventions.scheduler_plugins import podgroup_from_json
from coscheduling.podgroup import (
    GangDefaults,
    GangSpec,
    InvalidGang,
    MatchPolicy,
    MissingPodGroup,
    Source,
    gang_key,
)
from coscheduling.records import PodRecord, pod_from_json
from tests.builders import pod, podgroup

DEFAULTS = GangDefaults(timeout_seconds=60, max_timeout_seconds=240)


@pytest.mark.parametrize(
    ("annotations", "labels", "want"),
    [
        pytest.param({"lockstep.dev/pod-group": "g", "lockstep.dev/min-member": "3"}, {},
                     GangSpec(gang_key("default", "g"), 3, 60, Source.LOCKSTEP), id="lockstep"),
        pytest.param({"lockstep.dev/min-member": "2", "lockstep.dev/timeout-seconds": "90s"},
                     {"lockstep.dev/pod-group": "g"},
                     GangSpec(gang_key("default", "g"), 2, 90, Source.LOCKSTEP),
                     id="lockstep-label-and-duration"),
        pytest.param({"scheduling.k8s.io/group-name": "v",
                      "scheduling.volcano.sh/group-min-member": "4"}, {},
                     GangSpec(gang_key("default", "v"), 4, 60, Source.VOLCANO), id="volcano"),
        pytest.param({"gang.scheduling.koordinator.sh/name": "k",
                      "gang.scheduling.koordinator.sh/min-available": "2",
                      "gang.scheduling.koordinator.sh/waiting-time": "2m"}, {},
                     GangSpec(gang_key("default", "k"), 2, 120, Source.KOORDINATOR,
                              match_policy=MatchPolicy.ONCE_SATISFIED),
                     id="koordinator"),
        pytest.param({"lockstep.dev/pod-group": "g", "lockstep.dev/min-member": "2",
                      "lockstep.dev/timeout-seconds": "1h"}, {},
                     GangSpec(gang_key("default", "g"), 2, 240, Source.LOCKSTEP, capped_from=3600),
                     id="timeout-capped-and-reported"),
        pytest.param({}, {}, None, id="no-gang"),
    ],
)
def test_resolve(annotations: dict[str, str], labels: dict[str, str], want: object) -> None:
    assert resolve(declared(annotations, labels), {}, DEFAULTS) == want


def declared(annotations: dict[str, str], labels: dict[str, str]) -> PodRecord:
    b = pod("p")
    for k, v in annotations.items():
        b.annotate(k, v)
    for k, v in labels.items():
        b.label(k, v)
    return pod_from_json(b.build())


@pytest.mark.parametrize(
    ("annotations", "want_field", "want_problem"),
    [
        pytest.param({"lockstep.dev/min-member": "1.5"}, "lockstep.dev/min-member",
                     "not a whole number", id="fraction"),
        pytest.param({"lockstep.dev/min-member": "2", "lockstep.dev/timeout-seconds": "0"},
                     "lockstep.dev/timeout-seconds", "greater than 0", id="zero-timeout"),
        pytest.param({"lockstep.dev/min-member": "2", "scheduling.volcano.sh/group-min-member": "3",
                      "scheduling.k8s.io/group-name": "g"},
                     "scheduling.volcano.sh/group-min-member", "conflicts", id="sizes-conflict"),
    ],
)
def test_invalid(annotations: dict[str, str], want_field: str, want_problem: str) -> None:
    b = pod("p").gang("g")
    for k, v in annotations.items():
        b.annotate(k, v)
    got = resolve(pod_from_json(b.build()), {}, DEFAULTS)
    assert isinstance(got, InvalidGang)
    assert got.field == want_field and want_problem in got.problem


def test_scheduler_plugins_needs_its_podgroup() -> None:
    p = pod_from_json(pod("p").label("scheduling.x-k8s.io/pod-group", "pg").build())
    assert resolve(p, {}, DEFAULTS) == MissingPodGroup(gang_key("default", "pg"))
    pg = podgroup_from_json(podgroup("pg", 3, timeout=30, min_resources={"nvidia.com/gpu": "3"}))
    got = resolve(p, {Source.SCHEDULER_PLUGINS: {pg.key: pg}}, DEFAULTS)
    assert got == GangSpec(gang_key("default", "pg"), 3, 30, Source.SCHEDULER_PLUGINS,
                           {"nvidia.com/gpu": 3})


@pytest.mark.parametrize("min_member", [0, -1, "x", True])
def test_bad_podgroup_min_member_is_an_error_value(min_member: object) -> None:
    pg = podgroup_from_json(podgroup("pg", min_member))
    assert pg.error is not None and pg.error.field == "PodGroup.spec.minMember"


KUEUE_KEY = gang_key("default", "grp")


@pytest.mark.parametrize(
    ("annotations", "labels", "want"),
    [
        # What Kueue's plain-pod integration documents: the group name as a label, the size
        # as an annotation on every pod of the group.
        pytest.param({"kueue.x-k8s.io/pod-group-total-count": "3"},
                     {"kueue.x-k8s.io/pod-group-name": "grp",
                      "kueue.x-k8s.io/queue-name": "user-queue"},
                     GangSpec(KUEUE_KEY, 3, 60, Source.KUEUE), id="label-and-total-count"),
        pytest.param({"kueue.x-k8s.io/pod-group-name": "grp",
                      "kueue.x-k8s.io/pod-group-total-count": "4"}, {},
                     GangSpec(KUEUE_KEY, 4, 60, Source.KUEUE), id="annotation-form"),
        pytest.param({}, {"kueue.x-k8s.io/pod-group-name": "grp"},
                     InvalidGang(KUEUE_KEY, "kueue.x-k8s.io/pod-group-total-count", "",
                                 "missing: kueue.x-k8s.io/pod-group-name=grp needs "
                                 "kueue.x-k8s.io/pod-group-total-count"),
                     id="missing-total-count"),
        pytest.param({"kueue.x-k8s.io/pod-group-total-count": "three"},
                     {"kueue.x-k8s.io/pod-group-name": "grp"},
                     InvalidGang(KUEUE_KEY, "kueue.x-k8s.io/pod-group-total-count", "three",
                                 "not a whole number"), id="bad-total-count"),
        pytest.param({"kueue.x-k8s.io/pod-group-total-count": "3",
                      "lockstep.dev/pod-group": "other", "lockstep.dev/min-member": "3"},
                     {"kueue.x-k8s.io/pod-group-name": "grp"},
                     InvalidGang(None, "metadata",
                                 "lockstep.dev/pod-group=other, kueue.x-k8s.io/pod-group-name=grp",
                                 "conflicting gang declarations"), id="two-group-names"),
        pytest.param({"kueue.x-k8s.io/pod-group-total-count": "3",
                      "lockstep.dev/pod-group": "grp", "lockstep.dev/min-member": "2"},
                     {"kueue.x-k8s.io/pod-group-name": "grp"},
                     InvalidGang(KUEUE_KEY, "kueue.x-k8s.io/pod-group-total-count", "3",
                                 "conflicts with min-member 2 declared elsewhere"),
                     id="sizes-disagree"),
        pytest.param({}, {"kueue.x-k8s.io/queue-name": "user-queue"}, None,
                     id="queued-but-no-group"),
    ],
)
def test_resolve_kueue_pod_groups(annotations: dict[str, str], labels: dict[str, str],
                                  want: object) -> None:
    assert resolve(declared(annotations, labels), {}, DEFAULTS) == want


def test_a_pod_behind_a_scheduling_gate_is_not_an_active_member() -> None:
    obj = pod("p").build()
    obj["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    gated = pod_from_json(obj)
    assert gated.other_gate and not gated.active
    obj["spec"]["schedulingGates"] = []
    assert pod_from_json(obj).active


def volcano_pg(name: str, spec: dict[str, object]) -> dict[str, object]:
    """A PodGroup as Volcano's job controller (or Kubeflow's in volcano mode) creates it."""
    return {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": "default"}, "spec": spec}


VKEY = gang_key("default", "job-pg")


@pytest.mark.parametrize(
    ("spec", "pod_min", "want"),
    [
        pytest.param({"minMember": 4, "queue": "default", "priorityClassName": "high",
                      "minResources": {"nvidia.com/gpu": "4", "cpu": "8"}}, None,
                     GangSpec(VKEY, 4, 60, Source.VOLCANO,
                              min_resources={"nvidia.com/gpu": 4, "cpu": 8000},
                              priority_class="high"),
                     id="podgroup-gives-size-min-resources-and-priority-class"),
        pytest.param(None, None, MissingPodGroup(VKEY, "scheduling.volcano.sh"),
                     id="podgroup-not-created-yet"),
        pytest.param({"minMember": 0}, None,
                     InvalidGang(VKEY, "PodGroup (scheduling.volcano.sh).spec.minMember", "0",
                                 "must be at least 1"), id="zero-min-member"),
        pytest.param({"minMember": 2}, "2", GangSpec(VKEY, 2, 60, Source.VOLCANO),
                     id="pod-annotation-agrees"),
        pytest.param({"minMember": 4}, "3", GangSpec(VKEY, 3, 60, Source.VOLCANO),
                     id="pod-annotation-wins-as-before"),
        pytest.param({"minMember": 4, "priorityClassName": "low"}, "3",
                     GangSpec(VKEY, 3, 60, Source.VOLCANO, priority_class="low"),
                     id="pod-annotation-sizes-the-podgroup-still-names-the-class"),
    ],
)
def test_resolve_volcano_podgroup(spec: dict[str, object] | None, pod_min: str | None,
                                  want: object) -> None:
    from coscheduling.conventions.volcano import volcano_podgroup_from_json

    b = pod("w-0").annotate("scheduling.k8s.io/group-name", "job-pg")
    if pod_min is not None:
        b.annotate("scheduling.volcano.sh/group-min-member", pod_min)
    groups = {} if spec is None else {VKEY: volcano_podgroup_from_json(volcano_pg("job-pg", spec))}
    assert resolve(pod_from_json(b.build()), {Source.VOLCANO: groups}, DEFAULTS) == want
