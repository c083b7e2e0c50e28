"""Gang membership from every convention, and bad declarations named by field."""

from __future__ import annotations

import pytest

from coscheduling.podgroup import (
    GangDefaults,
    GangSpec,
    InvalidGang,
    MissingPodGroup,
    Source,
    gang_key,
    podgroup_from_json,
    resolve,
)
from coscheduling.records import pod_from_json
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
                     GangSpec(gang_key("default", "k"), 2, 120, Source.KOORDINATOR),
                     id="koordinator"),
        pytest.param({"lockstep.dev/pod-group": "g", "lockstep.dev/min-member": "2",
                      "lockstep.dev/timeout-seconds": "1h"}, {},
                     GangSpec(gang_key("default", "g"), 2, 240, Source.LOCKSTEP, capped_from=3600),
                     id="timeout-capped-and-reported"),
        pytest.param({}, {}, None, id="no-gang"),
    ],
)
def test_resolve(annotations: dict[str, str], labels: dict[str, str], want: object) -> None:
    b = pod("p")
    for k, v in annotations.items():
        b.annotate(k, v)
    for k, v in labels.items():
        b.label(k, v)
    assert resolve(pod_from_json(b.build()), {}, DEFAULTS) == want


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
    got = resolve(p, {pg.key: pg}, DEFAULTS)
    assert got == GangSpec(gang_key("default", "pg"), 3, 30, Source.SCHEDULER_PLUGINS,
                           {"nvidia.com/gpu": 3})


@pytest.mark.parametrize("min_member", [0, -1, "x", True])
def test_bad_podgroup_min_member_is_an_error_value(min_member: object) -> None:
    pg = podgroup_from_json(podgroup("pg", min_member))
    assert pg.error is not None and pg.error.field == "PodGroup.spec.minMember"
