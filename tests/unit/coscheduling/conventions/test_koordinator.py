"""Koordinator's full gang key set, from the objects its documentation shows.

The resolver table is built from Koordinator's gang-scheduling proposal and
``apis/extension/coscheduling.go`` (annotation way, CRD way, the lightweight labels); the
core tests check what each key changes: gang groups admit and bind only together,
match-policy decides who counts toward the quorum, NonStrict retries without a backoff.
"""

from __future__ import annotations

from typing import Any

import pytest

from coscheduling import (
    BindGroup,
    BindNow,
    Coscheduler,
    GangPhase,
    NodeName,
    Park,
    pod_from_json,
    pod_key,
)
from coscheduling.conventions import resolve
from coscheduling.conventions.koordinator import group_key
from coscheduling.conventions.scheduler_plugins import podgroup_from_json, podgroup_statuses
from coscheduling.events import ingest
from coscheduling.podgroup import (
    GangDefaults,
    GangKey,
    GangSpec,
    InvalidGang,
    MatchPolicy,
    Mode,
    Source,
    gang_key,
)
from coscheduling.reasons import WaitingForMembers
from tests.builders import node, pod, podgroup
from tests.invariants import check_invariants
from tests.unit.coscheduling.test_core import add, cluster

DEFAULTS = GangDefaults(timeout_seconds=60, max_timeout_seconds=240)
K = "gang.scheduling.koordinator.sh/"
GA, GB = gang_key("default", "gang-a"), gang_key("other", "gang-b")
GROUP = '["default/gang-a", "other/gang-b"]'


def koord(name: str, gang: str, **ann: str) -> dict[str, Any]:
    b = pod(name)
    b.annotate(K + "name", gang)
    for k, v in ann.items():
        b.annotate(K + k.replace("_", "-"), v)
    return b.build()


@pytest.mark.parametrize(
    ("annotations", "want"),
    [
        pytest.param({"min-available": "5"},
                     GangSpec(GA, 5, 60, Source.KOORDINATOR,
                              match_policy=MatchPolicy.ONCE_SATISFIED), id="basic"),
        pytest.param({"min-available": "5", "waiting-time": "3600s", "total-number": "5",
                      "mode": "Strict"},
                     GangSpec(GA, 5, 240, Source.KOORDINATOR, capped_from=3600, total=5,
                              match_policy=MatchPolicy.ONCE_SATISFIED),
                     id="proposal-example-without-groups"),
        pytest.param({"min-available": "2", "total-number": "4", "mode": "NonStrict",
                      "match-policy": "only-waiting"},
                     GangSpec(GA, 2, 60, Source.KOORDINATOR, total=4, mode=Mode.NON_STRICT,
                              match_policy=MatchPolicy.ONLY_WAITING), id="non-strict"),
        pytest.param({"min-available": "2", "match-policy": "waiting-and-running",
                      "groups": ""},
                     GangSpec(GA, 2, 60, Source.KOORDINATOR,
                              match_policy=MatchPolicy.WAITING_AND_RUNNING),
                     id="empty-groups-is-no-group"),
        pytest.param({"min-available": "2", "groups": '["default/gang-a"]'},
                     GangSpec(GA, 2, 60, Source.KOORDINATOR,
                              match_policy=MatchPolicy.ONCE_SATISFIED),
                     id="group-of-one-is-a-gang"),
        pytest.param({"min-available": "5", "groups": GROUP},
                     GangSpec(group_key((GA, GB)), 5, 60, Source.KOORDINATOR,
                              match_policy=MatchPolicy.ONCE_SATISFIED, part=GA,
                              group=(GA, GB)), id="gang-group-across-namespaces"),
    ],
)
def test_resolve_annotation_way(annotations: dict[str, str], want: GangSpec) -> None:
    got = resolve(pod_from_json(koord("p", "gang-a", **{
        k.replace("-", "_"): v for k, v in annotations.items()})), {}, DEFAULTS)
    assert got == want


def test_lightweight_coscheduling_labels_are_koordinator_gangs() -> None:
    p = (pod("p").label("pod-group.scheduling.sigs.k8s.io/name", "light")
         .label("pod-group.scheduling.sigs.k8s.io/min-available", "3").build())
    got = resolve(pod_from_json(p), {}, DEFAULTS)
    assert isinstance(got, GangSpec)
    assert (got.key, got.min_member, got.source) == (gang_key("default", "light"), 3,
                                                   Source.KOORDINATOR)


def test_crd_way_reads_the_options_from_the_podgroup_and_the_pod_wins() -> None:
    obj = podgroup("gang-a", 5)
    obj["metadata"]["annotations"] = {K + "total-number": "6", K + "mode": "NonStrict",
                                      K + "groups": GROUP, "unrelated": "x"}
    pg = podgroup_from_json(obj)
    assert "unrelated" not in pg.annotations
    member = pod("p").label("scheduling.x-k8s.io/pod-group", "gang-a").build()
    got = resolve(pod_from_json(member), {Source.SCHEDULER_PLUGINS: {pg.key: pg}}, DEFAULTS)
    assert isinstance(got, GangSpec)
    assert (got.key, got.part, got.total, got.mode) == (group_key((GA, GB)), GA, 6,
                                                        Mode.NON_STRICT)
    member["metadata"]["annotations"] = {K + "mode": "Strict"}
    got = resolve(pod_from_json(member), {Source.SCHEDULER_PLUGINS: {pg.key: pg}}, DEFAULTS)
    assert isinstance(got, GangSpec) and got.mode is Mode.STRICT


@pytest.mark.parametrize(
    ("annotations", "field", "problem"),
    [
        pytest.param({"min-available": "4", "total-number": "3"}, K + "total-number",
                     "fewer than min-available 4", id="total-below-min"),
        pytest.param({"min-available": "4", "total-number": "many"}, K + "total-number",
                     "not a whole number", id="total-not-a-number"),
        pytest.param({"min-available": "2", "mode": "strict"}, K + "mode",
                     "Strict or NonStrict", id="mode-wrong-case"),
        pytest.param({"min-available": "2", "match-policy": "all"}, K + "match-policy",
                     "must be one of", id="unknown-match-policy"),
        pytest.param({"min-available": "2", "groups": "default/gang-a,other/gang-b"},
                     K + "groups", "JSON list", id="groups-not-json"),
        pytest.param({"min-available": "2", "groups": '["gang-a", "other/gang-b"]'},
                     K + "groups", "namespace/name", id="groups-entry-without-namespace"),
        pytest.param({"min-available": "2", "groups": '["other/gang-b", "other/gang-c"]'},
                     K + "groups", "does not list this gang", id="groups-without-itself"),
    ],
)
def test_contradictions_name_the_field(annotations: dict[str, str], field: str,
                                       problem: str) -> None:
    got = resolve(pod_from_json(koord("p", "gang-a", **{
        k.replace("-", "_"): v for k, v in annotations.items()})), {}, DEFAULTS)
    assert isinstance(got, InvalidGang)
    assert got.field == field and problem in got.problem


def test_match_policy_alias_of_the_lightweight_prefix() -> None:
    p = koord("p", "gang-a", min_available="2")
    p["metadata"]["annotations"]["pod-group.scheduling.sigs.k8s.io/match-policy"] = \
        "only-waiting"
    got = resolve(pod_from_json(p), {}, DEFAULTS)
    assert isinstance(got, GangSpec) and got.match_policy is MatchPolicy.ONLY_WAITING


# ---------------------------------------------------------------------- the core


def grouped(name: str, gang: str, ns: str, mm: int, **ann: str) -> dict[str, Any]:
    obj = koord(name, gang, min_available=str(mm), groups=GROUP, **ann)
    obj["metadata"]["namespace"] = ns
    obj["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": "1"}}
    return obj


def filt(core: Coscheduler, name: str, ns: str = "default") -> list[NodeName]:
    p = core.queries.pod(pod_key(ns, name))
    assert p is not None
    return core.filter(p, sorted(core.queries.nodes), 0.0).passed


def test_a_gang_group_waits_for_every_gang_and_binds_only_together() -> None:
    """Koordinator's GangGroup: gang-a (2) and gang-b (1, another namespace) bind only when
    both have their minimum; gang-a alone, though complete, holds nothing."""
    core = cluster(node("n0").gpus(4).build())
    add(core, grouped("a0", "gang-a", "default", 2), grouped("a1", "gang-a", "default", 2))
    assert filt(core, "a0") == []
    assert core.queries.reserved_gpus() == 0
    assert isinstance(core.filter(core.queries.pod(pod_key("default", "a0")),  # type: ignore[arg-type]
                                  [NodeName("n0")], 0.0).unresolvable, WaitingForMembers)
    add(core, grouped("b0", "gang-b", "other", 1))
    assert core.drain().requeue  # the turned-away members are woken
    assert filt(core, "a0") == ["n0"]
    assert core.queries.reserved_gpus() == 3  # the whole group's plan, both gangs
    check_invariants(core)
    assert isinstance(core.bind(pod_key("default", "a0"), NodeName("n0"), 0.0), Park)
    assert filt(core, "a1") == ["n0"]
    # Both of gang-a parked (its own minimum met) but gang-b is not: still parked.
    assert isinstance(core.bind(pod_key("default", "a1"), NodeName("n0"), 0.0), Park)
    assert filt(core, "b0", "other") == ["n0"]
    d = core.bind(pod_key("other", "b0"), NodeName("n0"), 0.0)
    assert isinstance(d, BindGroup) and len(d.binds) == 3
    check_invariants(core)


def test_a_gang_group_that_does_not_fit_whole_holds_nothing() -> None:
    core = cluster(node("n0").gpus(2).build())
    add(core, grouped("a0", "gang-a", "default", 2), grouped("a1", "gang-a", "default", 2),
        grouped("b0", "gang-b", "other", 1))
    assert filt(core, "a0") == [] and filt(core, "b0", "other") == []
    assert core.queries.reserved_gpus() == 0
    check_invariants(core)


def test_a_member_disagreeing_with_its_own_gang_is_named() -> None:
    core = cluster(node("n0").gpus(8).build())
    add(core, grouped("a0", "gang-a", "default", 2), grouped("a1", "gang-a", "default", 3),
        grouped("b0", "gang-b", "other", 1))
    p = core.queries.pod(pod_key("default", "a1"))
    assert p is not None
    reason = core.filter(p, [NodeName("n0")], 0.0).unresolvable
    assert reason is not None and "disagree" in str(reason)


def two_of(policy: str, **extra: str) -> tuple[Coscheduler, list[dict[str, Any]]]:
    core = cluster(node("n0").gpus(4).build())
    objs = [koord(f"k{i}", "g", min_available="2", match_policy=policy, **extra)
            for i in range(2)]
    for o in objs:
        o["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": "1"}}
    add(core, *objs)
    for i in range(2):
        assert filt(core, f"k{i}") == ["n0"]
        core.bind(pod_key("default", f"k{i}"), NodeName("n0"), 0.0)
    for o in objs:  # the watch sees both bound
        o["spec"]["nodeName"] = "n0"
        o["status"] = {"phase": "Running"}
    add(core, *objs)
    # One member dies and its controller creates a replacement.
    core.delete_pod(pod_key("default", "k1"), objs[1]["metadata"]["uid"])
    repl = koord("k2", "g", min_available="2", match_policy=policy, **extra)
    repl["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": "1"}}
    add(core, repl)
    return core, objs


def test_once_satisfied_replacement_binds_at_once() -> None:
    core, _ = two_of("once-satisfied")
    assert filt(core, "k2") == ["n0"]
    assert isinstance(core.bind(pod_key("default", "k2"), NodeName("n0"), 0.0), BindNow)
    check_invariants(core)


def test_waiting_and_running_replacement_joins_the_running_member() -> None:
    core, _ = two_of("waiting-and-running")
    assert filt(core, "k2") == ["n0"]
    # k0 runs and k2 asks to bind: together minMember, so k2 binds now, not parked.
    assert isinstance(core.bind(pod_key("default", "k2"), NodeName("n0"), 0.0), BindNow)
    check_invariants(core)


def test_only_waiting_replacement_needs_min_member_waiting_pods() -> None:
    core, _ = two_of("only-waiting")
    # The running member does not count: one waiting pod is not a quorum of 2.
    assert filt(core, "k2") == []
    assert core.queries.reserved_gpus() == 0
    repl = koord("k3", "g", min_available="2", match_policy="only-waiting")
    repl["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": "1"}}
    add(core, repl)
    assert filt(core, "k2") == ["n0"]
    assert isinstance(core.bind(pod_key("default", "k2"), NodeName("n0"), 0.0), Park)
    assert filt(core, "k3") == ["n0"]
    assert isinstance(core.bind(pod_key("default", "k3"), NodeName("n0"), 0.0), BindGroup)
    check_invariants(core)


@pytest.mark.parametrize(("mode", "backs_off"), [("Strict", True), ("NonStrict", False)])
def test_non_strict_retries_without_a_backoff(mode: str, backs_off: bool) -> None:
    core = cluster(node("n0").gpus(4).build())
    objs = [koord(f"k{i}", "g", min_available="2", mode=mode, waiting_time="10s")
            for i in range(2)]
    add(core, *objs)
    assert filt(core, "k0") == ["n0"]
    core.bind(pod_key("default", "k0"), NodeName("n0"), 0.0)
    core.expire(11.0)  # k1 never came to bind
    g = core.queries.gangs[GangKey("default/g")]
    assert g.phase is GangPhase.BACKING_OFF
    p = core.queries.pod(pod_key("default", "k0"))
    assert p is not None
    passed = core.filter(p, [NodeName("n0")], 11.5).passed
    assert (passed == []) is backs_off
    check_invariants(core)


def test_a_gang_group_declared_the_crd_way_reports_on_each_podgroup() -> None:
    """Koordinator's CRD way: two scheduler-plugins PodGroups carry the groups annotation.
    Each PodGroup's status counts its own members against its own minMember."""
    core = cluster(node("n0").gpus(4).build())
    groups = '["default/workers", "default/launcher"]'
    for name, mm in (("workers", 2), ("launcher", 1)):
        obj = podgroup(name, mm)
        obj["metadata"]["annotations"] = {K + "groups": groups}
        core.upsert(ingest.SP_PODGROUPS, podgroup_from_json(obj))
    members = [("w0", "workers"), ("w1", "workers"), ("l0", "launcher")]
    objs = [pod(n).label("scheduling.x-k8s.io/pod-group", g).gpu(1).build() for n, g in members]
    add(core, *objs)
    st = podgroup_statuses(core.queries.status_model())
    assert set(st) == {gang_key("default", "workers"), gang_key("default", "launcher")}
    assert all(s.phase == "Pending" for s in st.values())
    for n, _ in members:
        assert filt(core, n) == ["n0"]
        core.bind(pod_key("default", n), NodeName("n0"), 0.0)
    for o in objs:  # the watch sees them bound and running
        o["spec"]["nodeName"] = "n0"
        o["status"] = {"phase": "Running"}
    add(core, *objs)
    st = podgroup_statuses(core.queries.status_model())
    assert (st[gang_key("default", "workers")].running,
            st[gang_key("default", "launcher")].running) == (2, 1)
    assert all(s.phase == "Running" for s in st.values())
