"""Volcano 1.14's subgroup policy (``spec.subGroupPolicy`` on its PodGroup) read as a group
of groups. Field names from ``volcano-sh/apis`` ``pkg/apis/scheduling/v1beta1/types.go``:
``name``, ``subGroupSize``, ``minSubGroups``, ``labelSelector``, ``matchLabelKeys``,
``networkTopology`` (``mode``, ``highestTierName``, ``highestTierAllowed``)."""

from __future__ import annotations

from typing import Any

import pytest

from coscheduling import Coscheduler, GangPhase, Settings, gang_key, node_from_json, pod_key
from coscheduling.conventions.volcano import volcano_podgroup_from_json
from coscheduling.events import ingest
from coscheduling.podgroup import GangKey, GangSpec, InvalidGang
from coscheduling.reasons import WaitingForMembers
from coscheduling.records import PodKey, pod_from_json
from tests.builders import node, pod
from tests.invariants import check_invariants

KEY = gang_key("default", "job")


def vpg(min_member: int = 4, policy: list[Any] | None = None) -> dict[str, Any]:
    if policy is None:
        policy = [{"name": "workers", "subGroupSize": 2,
                   "labelSelector": {"matchLabels": {"role": "worker"}},
                   "matchLabelKeys": ["replica"]}]
    return {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": {"name": "job", "namespace": "default"},
            "spec": {"minMember": min_member, "subGroupPolicy": policy}}


def member(core: Coscheduler, replica: str, i: int, role: str = "worker") -> PodKey:
    obj = (pod(f"w{replica}-{i}").gpu(1).annotate("scheduling.k8s.io/group-name", "job")
           .label("role", role).label("replica", replica).build())
    core.upsert_pod(pod_from_json(obj))
    return pod_key("default", f"w{replica}-{i}")


def cluster() -> Coscheduler:
    core = Coscheduler(Settings(backoff_seconds=10))
    for i in range(3):
        core.upsert(ingest.NODES, node_from_json(node(f"n{i}").gpus(2).build()))
    return core


@pytest.mark.parametrize(("policy", "field", "words"), [
    ([{"name": "a", "subGroupSize": 2}, {"name": "b", "subGroupSize": 2}],
     "subGroupPolicy", "exactly one"),
    ([{"name": "a"}], "subGroupPolicy[0].subGroupSize", "not a whole number"),
    ([{"name": "a", "subGroupSize": 2, "minSubGroups": 10**6}],
     "subGroupPolicy[0].minSubGroups", "above the limit"),
    ([{"name": "a", "subGroupSize": 2, "networkTopology": {"highestTierAllowed": 2}}],
     "highestTierAllowed", "by number"),
    ([{"name": "a", "subGroupSize": 2, "matchLabelKeys": ["k"] * 40}],
     "labelSelector", "at most 32"),
])
def test_a_policy_lockstep_cannot_honour_is_named(policy: list[Any], field: str,
                                                  words: str) -> None:
    rec = volcano_podgroup_from_json(vpg(policy=policy))
    assert rec.error is not None and field in rec.error.field and words in rec.error.problem


def test_the_policy_is_read_as_the_api_documents_it() -> None:
    rec = volcano_podgroup_from_json(vpg(policy=[{
        "name": "workers", "subGroupSize": 4, "minSubGroups": 2,
        "labelSelector": {"matchLabels": {"role": "worker"}}, "matchLabelKeys": ["replica"],
        "networkTopology": {"mode": "hard", "highestTierName": "rack"}}]))
    assert rec.error is None and rec.subgroups is not None
    p = rec.subgroups
    assert (p.name, p.size, p.min_groups, p.match_labels, p.match_label_keys, p.tier) == (
        "workers", 4, 2, (("role", "worker"),), ("replica",), "rack")


def test_a_member_is_in_its_subgroup_and_the_set_needs_min_member_in_whole_ones() -> None:
    core = cluster()
    core.upsert(ingest.VOLCANO_PODGROUPS, volcano_podgroup_from_json(vpg()))
    m = core.queries.membership(member(core, "0", 0))
    assert isinstance(m, GangSpec)
    assert (m.key, m.part, m.min_member, m.min_parts) == (
        KEY, GangKey("default/job/workers[0]"), 2, 2)  # minMember 4 / subGroupSize 2


def test_whole_subgroups_only_and_an_outsider_is_named() -> None:
    core = cluster()
    core.upsert(ingest.VOLCANO_PODGROUPS, volcano_podgroup_from_json(vpg()))
    # Volcano's enqueue step: the group must be Inqueue before its pods are admitted.
    a = [member(core, "0", i) for i in range(2)]
    b0 = member(core, "1", 0)
    c0 = member(core, "2", 0)
    q = core.queries
    d = core.filter(q.pods[a[0]], sorted(q.nodes), 0.0)
    assert isinstance(d.unresolvable, WaitingForMembers)  # 3 pods, one whole subgroup
    b1 = member(core, "1", 1)
    d = core.filter(q.pods[c0], sorted(q.nodes), 0.0)
    assert d.unresolvable == WaitingForMembers(GangKey("default/job/workers[2]"), 1, 2)
    assert core.filter(q.pods[b1], sorted(q.nodes), 0.0).passed
    g = q.gangs[KEY]
    assert g.phase is GangPhase.ADMITTED and set(g.plan) == {*a, b0, b1}
    check_invariants(core)
    out = core.queries.membership(member(core, "9", 0, role="driver"))
    assert isinstance(out, InvalidGang) and "matches no subgroup" in out.problem
