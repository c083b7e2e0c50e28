"""LeaderWorkerSet v0.7.0: what spec each pod resolves to.

Pods shaped as LWS makes them: the leader StatefulSet's template labels
``leaderworkerset.sigs.k8s.io/name`` and ``worker-index: "0"`` and annotates ``size``
(``exclusive-topology``, ``subgroup-policy-type``, ``subgroup-size`` and
``subgroup-exclusive-topology`` when the set has them; leaderworkerset_controller.go); the pod
webhook adds the leader's ``group-index`` and ``group-key``; each group's worker StatefulSet
labels ``group-index``, ``group-key`` and annotates ``size``, ``leader-name`` and the same
topology and subgroup keys (pod_controller.go), and the webhook adds ``worker-index``.
"""

from __future__ import annotations

from typing import Any

import pytest

from coscheduling import pod_from_json
from coscheduling.conventions import resolve
from coscheduling.conventions.lws import LWS, lws_from_json
from coscheduling.gang.gating import declares_gang
from coscheduling.podgroup import GangDefaults, GangSpec, InvalidGang, Membership, gang_key
from tests.builders import pod

L = "leaderworkerset.sigs.k8s.io/"
DEFAULTS = GangDefaults()


def lws_pod(lws: str, group: int, worker: int, size: int, **ann: str) -> dict[str, Any]:
    """Pod ``worker`` of group ``group`` (0 is the leader, ``<lws>-<group>``)."""
    name = f"{lws}-{group}" if worker == 0 else f"{lws}-{group}-{worker}"
    b = pod(name).label(L + "name", lws).label(L + "group-index", str(group)) \
        .label(L + "worker-index", str(worker)).label(L + "group-key", "9f86d081") \
        .label(L + "template-revision-hash", "5d8c").annotate(L + "size", str(size))
    if worker:
        b.annotate(L + "leader-name", f"{lws}-{group}")
    for k, v in ann.items():
        b.annotate(L + k.replace("_", "-"), v)
    return b.build()


def resolved(obj: dict[str, Any]) -> Membership:
    return resolve(pod_from_json(obj), {}, DEFAULTS)


def test_each_group_is_a_whole_subgroup_of_an_elastic_set() -> None:
    leader, worker = lws_pod("llm", 2, 0, 4), lws_pod("llm", 2, 3, 4)
    assert declares_gang(leader) and declares_gang(worker)
    for m in (resolved(leader), resolved(worker)):
        assert isinstance(m, GangSpec) and m.source is LWS
        assert m.key == gang_key("default", "llm") and m.part == gang_key("default", "llm-2")
        assert (m.min_member, m.min_parts, m.group) == (4, 1, ())
        assert (m.part_topology, m.part_exclusive) == (None, False)


@pytest.mark.parametrize("worker", [0, 1])
def test_exclusive_topology_reads_no_gang(worker: int) -> None:
    """With ``exclusive-topology`` LWS creates a group's workers only once its leader has a
    node: a group read whole would wait forever for them (the leader alone is 1/4, as the
    bed showed), and pods alone would be planned against LWS's anti-affinity."""
    assert resolved(lws_pod("llm", 2, worker, 4, exclusive_topology="lockstep.dev/rack")) \
        is None


@pytest.mark.parametrize(("size", "sub", "worker", "index", "own", "count"), [
    (4, 2, 0, 0, 2, 2), (4, 2, 1, 0, 2, 2), (4, 2, 2, 1, 2, 2), (4, 2, 3, 1, 2, 2),
    # size - 1 divides: the leader is the extra pod of subgroup 0 (LWS's getSubGroupIndex)
    (5, 2, 0, 0, 3, 2), (5, 2, 2, 0, 3, 2), (5, 2, 3, 1, 2, 2), (5, 2, 4, 1, 2, 2),
    (4, 3, 3, 0, 4, 1), (1, 1, 0, 0, 1, 1),
])
def test_lws_subgroups_are_subgroups_of_the_group(size: int, sub: int, worker: int,
                                                  index: int, own: int, count: int) -> None:
    m = resolved(lws_pod("tpu", 1, worker, size, subgroup_size=str(sub),
                         subgroup_exclusive_topology="cloud.google.com/gke-nodepool"))
    assert isinstance(m, GangSpec), m
    assert m.key == gang_key("default", "tpu-1")
    assert m.part == gang_key("default", f"tpu-1-sg{index}")
    assert m.group == tuple(sorted(gang_key("default", f"tpu-1-sg{i}") for i in range(count)))
    assert (m.min_member, m.min_parts, m.topology) == (own, None, None)
    assert (m.part_topology, m.part_exclusive) == ("cloud.google.com/gke-nodepool", True)


@pytest.mark.parametrize(("change", "field", "problem"), [
    ({"labels": {L + "group-index": "x"}}, L + "group-index", "not an index"),
    ({"labels": {L + "worker-index": "9" * 30}}, L + "worker-index", "not an index"),
    ({"labels": {L + "worker-index": "4"}}, L + "worker-index", "not below the size 4"),
    ({"annotations": {L + "size": "5000"}}, L + "size", "--max-gang-size"),
    ({"annotations": {L + "size": "0"}}, L + "size", "at least 1"),
    ({"annotations": {L + "subgroup-size": "5"}}, L + "subgroup-size", "above the limit of 4"),
    ({"annotations": {L + "size": "6", L + "subgroup-size": "4"}}, L + "subgroup-size",
     "divides neither"),
    ({"annotations": {L + "subgroup-size": "2", L + "subgroup-exclusive-topology": "bad key!"}},
     L + "subgroup-exclusive-topology", "not a node label key"),
])
def test_a_bad_value_names_its_field(change: dict[str, dict[str, str]], field: str,
                                     problem: str) -> None:
    obj = lws_pod("llm", 0, 1, 4)
    for where, values in change.items():
        obj["metadata"][where].update(values)
    m = resolved(obj)
    assert isinstance(m, InvalidGang) and m.field == field and problem in m.problem, m


def test_an_explicit_declaration_wins_over_the_set() -> None:
    """LWS's Volcano provider names a PodGroup per group; the pod is Volcano's alone."""
    obj = lws_pod("llm", 0, 1, 4)
    obj["metadata"]["annotations"]["scheduling.k8s.io/group-name"] = "llm-0-5d8c"
    obj["metadata"]["annotations"]["scheduling.volcano.sh/group-min-member"] = "4"
    m = resolved(obj)
    assert isinstance(m, GangSpec) and m.key == gang_key("default", "llm-0-5d8c")
    assert m.part is None


def test_a_set_may_opt_out() -> None:
    obj = lws_pod("llm", 0, 0, 4)
    obj["metadata"]["annotations"]["lockstep.dev/gang-of"] = "none"
    assert resolved(obj) is None


def test_a_pod_without_the_size_is_no_lws_member() -> None:
    obj = lws_pod("llm", 0, 0, 4)
    del obj["metadata"]["annotations"][L + "size"]
    assert resolved(obj) is None


# ---------------------------------------------------------------------------- the object


def lws_object(name: str, replicas: Any = 3, startup: str = "LeaderCreated") -> dict[str, Any]:
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"replicas": replicas, "startupPolicy": startup,
                     "leaderWorkerTemplate": {"size": 4}}}


def with_object(obj: dict[str, Any], *sets: dict[str, Any]) -> Membership:
    recs = {(r := lws_from_json(s)).key: r for s in sets}
    return resolve(pod_from_json(obj), {LWS: recs}, DEFAULTS)


def test_the_set_object_lists_every_group() -> None:
    m = with_object(lws_pod("llm", 1, 2, 4), lws_object("llm", 3))
    assert isinstance(m, GangSpec) and m.min_parts == 1
    assert m.group == tuple(gang_key("default", f"llm-{i}") for i in range(3))


def test_a_leader_ready_set_is_no_gang_of_a_whole_group() -> None:
    """LWS creates the workers once the leader runs: each pod is admitted alone."""
    m = with_object(lws_pod("llm", 1, 0, 4), lws_object("llm", 3, "LeaderReady"))
    assert isinstance(m, GangSpec) and m.key == gang_key("default", "llm-1")
    assert (m.min_member, m.part, m.group) == (1, None, ())


def test_a_set_past_the_limit_is_read_from_its_pods() -> None:
    rec = lws_from_json(lws_object("llm", 2**31 - 1))
    assert rec.error is not None and rec.error.field == "LeaderWorkerSet.spec.replicas"
    assert rec.groups == ()
    m = with_object(lws_pod("llm", 1, 2, 4), lws_object("llm", 2**31 - 1))
    assert isinstance(m, GangSpec) and m.group == () and m.part == gang_key("default", "llm-1")


def test_a_set_scaled_resolves_its_pods_again() -> None:
    from coscheduling import pod_key
    from coscheduling.conventions import lws as lws_conv
    from coscheduling.events import ingest
    from tests.unit.coscheduling.test_core import cluster

    core = cluster()
    core.upsert_pod(pod_from_json(lws_pod("llm", 0, 1, 4)))
    key = pod_key("default", "llm-0-1")
    kind = ingest.kind_of(lws_conv.CONVENTION, lws_conv.WATCHES[0])
    core.upsert(kind, lws_from_json(lws_object("llm", 2)))
    m = core.queries.membership(key)
    assert isinstance(m, GangSpec) and len(m.group) == 2
    core.upsert(kind, lws_from_json(lws_object("llm", 5)))
    m = core.queries.membership(key)
    assert isinstance(m, GangSpec) and len(m.group) == 5
