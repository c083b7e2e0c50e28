"""Defragmentation (issue 45): a gang that fits the free capacity overall but no node it needs
has the fewest movable pods (then the fewest GPU-seconds) moved off one node, each with room
reserved elsewhere now; one test per rule."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from coscheduling import (
    Coscheduler,
    GangPhase,
    NodeName,
    Settings,
    gang_key,
    node_from_json,
    pod_from_json,
    pod_key,
)
from coscheduling.actions import NoticeKind
from coscheduling.defrag import search
from coscheduling.defrag.carry import hold_key
from coscheduling.events import ingest
from coscheduling.events.ingest import PDBS
from coscheduling.placement.planner import plan_gang
from coscheduling.preemption.budgets import budget_from_json
from coscheduling.reasons import DoesNotFit
from coscheduling.records import Owner
from tests.builders import node, pod
from tests.internals import state_of

BIG = gang_key("default", "big")
AFTER = 30.0


def cluster(*gpus: int, **settings: Any) -> Coscheduler:
    core = Coscheduler(Settings(backoff_seconds=5, defrag_after=AFTER, **settings))
    for i, n in enumerate(gpus):
        core.upsert(ingest.NODES, node_from_json(node(f"n{i}").gpus(n).rack("r0").build()))
    return core


def owned(name: str, gpus: int, on: str | None, *, owner: str = "rs", kind: str = "ReplicaSet",
          started: float = 1000.0, **extra: Any) -> dict[str, Any]:
    b = pod(name).gpu(gpus)
    for k, v in extra.get("labels", {}).items():
        b = b.label(k, v)
    for k, v in extra.get("annotations", {}).items():
        b = b.annotate(k, v)
    if "priority" in extra:
        b = b.priority(extra["priority"])
    if "scheduler" in extra:
        b = b.scheduler(extra["scheduler"])
    if on is not None:
        b = b.on(on)
    obj = b.build()
    if kind:
        obj["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": kind,
                                               "name": owner, "uid": f"uid-{owner}",
                                               "controller": True}]
    if on is not None:
        obj["status"]["startTime"] = "1970-01-01T00:16:40Z"  # 1000 s
        if started != 1000.0:
            obj["status"]["startTime"] = _stamp(started)
    return obj


def _stamp(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def place(core: Coscheduler, *objs: dict[str, Any]) -> None:
    for o in objs:
        core.upsert_pod(pod_from_json(o))


def big(core: Coscheduler, gpus: int = 8, prio: int = 0) -> None:
    core.upsert_pod(pod_from_json(pod("big-0").gang("big", 1, timeout=60).gpu(gpus)
                                  .priority(prio).build()))


def ask(core: Coscheduler, now: float) -> Any:
    return core.filter(core.queries.pods[pod_key("default", "big-0")], [], now)


def fragmented(core: Coscheduler) -> None:
    """n0: one 4-GPU pod; n1, n3: two 2-GPU pods each; n2: three 2-GPU pods. 14 GPUs free,
    no node with 8."""
    place(core, owned("a", 4, "n0"), owned("b1", 2, "n1"), owned("b2", 2, "n1"),
          owned("c1", 2, "n2"), owned("c2", 2, "n2"), owned("c3", 2, "n2"),
          owned("d1", 2, "n3"), owned("d2", 2, "n3"))


def test_the_fewest_pods_move_each_with_room_reserved_elsewhere_and_the_gang_is_admitted(
) -> None:
    core = cluster(8, 8, 8, 8)
    fragmented(core)
    big(core)
    assert core.drain().evictions == []
    ask(core, 0.0)
    assert core.drain().evictions == []  # it waits --defrag-after first
    ask(core, AFTER + 1)
    out = core.drain()
    assert [(e.pod, e.move) for e in out.evictions] == [(pod_key("default", "a"), True)]
    g = core.queries.gangs[BIG]
    assert g.phase is GangPhase.ADMITTED and g.plan == {pod_key("default", "big-0"):
                                                         NodeName("n0")}
    held = state_of(core).preemption.nominations.get(
        hold_key(core.queries.pods[pod_key("default", "a")]))
    assert held is not None and held.node != NodeName("n0")
    assert {n.kind for n in out.notices} >= {NoticeKind.MOVING, NoticeKind.MOVED}
    # The member binds on n0 once the moved pod is gone, not before.
    member = core.queries.pods[pod_key("default", "big-0")]
    assert core.filter(member, [NodeName("n0")], AFTER + 2).passed == []
    core.delete_pod(pod_key("default", "a"), core.queries.pods[pod_key("default", "a")].uid)
    assert core.filter(member, [NodeName("n0")], AFTER + 3).passed == [NodeName("n0")]


def test_the_wait_before_a_move_ends_with_the_gang_woken_by_the_timer() -> None:
    core = cluster(8, 8, 8, 8)
    fragmented(core)
    big(core)
    ask(core, 0.0)
    core.drain()
    assert core.queries.next_deadline() == pytest.approx(AFTER)
    core.expire(AFTER)
    assert pod_key("default", "big-0") in core.drain().requeue


def test_among_equal_counts_the_pod_that_loses_the_least_work_moves() -> None:
    core = cluster(8, 8, 8)
    place(core, owned("old", 4, "n0", started=100.0), owned("young", 4, "n1", started=900.0),
          owned("x", 4, "n2", started=50.0))
    big(core)
    ask(core, 0.0)
    ask(core, 2000.0)
    assert [e.pod for e in core.drain().evictions] == [pod_key("default", "young")]


@pytest.mark.parametrize("why", ["bare", "opted-out", "higher", "other-scheduler",
                                 "daemonset"])
def test_pods_that_may_not_move_never_move(why: str) -> None:
    core = cluster(8, 8)
    extra: dict[str, Any] = {}
    kind = "ReplicaSet"
    if why == "bare":
        kind = ""
    elif why == "opted-out":
        extra["annotations"] = {"lockstep.dev/movable": "false"}
    elif why == "higher":
        extra["priority"] = 10
    elif why == "other-scheduler":
        extra["scheduler"] = "default-scheduler"
    else:
        kind = "DaemonSet"
    place(core, owned("p", 4, "n0", kind=kind, **extra), owned("q", 4, "n1", kind=kind,
                                                                 **extra))
    big(core)
    ask(core, 0.0)
    ask(core, AFTER + 1)
    assert core.drain().evictions == []
    assert core.queries.gangs[BIG].phase is GangPhase.WAITING


def test_equal_priority_moves_and_a_gang_member_does_not() -> None:
    core = cluster(8, 8)
    place(core, owned("p", 4, "n0", priority=5),
          pod_to_obj(pod("m-0").gang("m", 1).gpu(4).priority(5).on("n1")))
    big(core, prio=5)
    ask(core, 0.0)
    ask(core, AFTER + 1)
    # Both are at the gang's priority (no victim): p moves to n1, m-0 (a gang's) never.
    assert [e.pod for e in core.drain().evictions] == [pod_key("default", "p")]


def pod_to_obj(b: Any) -> dict[str, Any]:
    obj: dict[str, Any] = b.build()
    return obj


def test_no_move_without_room_for_every_moved_pod_elsewhere() -> None:
    core = cluster(8, 8)
    place(core, owned("p", 4, "n0"), owned("q", 6, "n1"))  # 6 free; p fits nowhere else
    big(core, gpus=6)
    ask(core, 0.0)
    ask(core, AFTER + 1)
    assert core.drain().evictions == []
    reason = core.queries.gangs[BIG].reason
    assert isinstance(reason, DoesNotFit) and "no room elsewhere" in reason.preemption


def test_a_budget_that_forbids_the_move_leaves_the_gang_waiting_with_its_name() -> None:
    core = cluster(8, 8, 8, 8)
    fragmented(core)
    core.upsert(PDBS, budget_from_json({
        "metadata": {"name": "keep-all", "namespace": "default"},
        "spec": {"selector": {}}, "status": {"disruptionsAllowed": 0}}))
    big(core)
    ask(core, 0.0)
    ask(core, AFTER + 1)
    assert core.drain().evictions == []
    reason = core.queries.gangs[BIG].reason
    assert isinstance(reason, DoesNotFit) and "default/keep-all" in reason.preemption


def test_the_rate_limit_caps_pods_moved_per_minute() -> None:
    core = cluster(8, 8, 8, defrag_rate=1)
    place(core, owned("b1", 2, "n0"), owned("b2", 2, "n0"), owned("c", 6, "n1"),
          owned("d", 6, "n2"))  # only freeing n0 works, and it moves two pods
    big(core)
    ask(core, 0.0)
    ask(core, AFTER + 1)
    assert core.drain().evictions == []
    assert "--defrag-rate" in str(core.queries.gangs[BIG].reason)


def test_off_with_one_flag() -> None:
    core = cluster(8, 8, 8, 8, defrag=False)
    fragmented(core)
    big(core)
    ask(core, 0.0)
    ask(core, AFTER + 1)
    assert core.drain().evictions == []


def test_the_replacement_is_steered_to_its_reserved_node_and_never_moved_again() -> None:
    core = cluster(8, 8, 8, 8)
    fragmented(core)
    big(core)
    ask(core, 0.0)
    ask(core, AFTER + 1)
    core.drain()
    held = state_of(core).preemption.nominations.get(
        hold_key(core.queries.pods[pod_key("default", "a")]))
    assert held is not None
    core.delete_pod(pod_key("default", "a"), core.queries.pods[pod_key("default", "a")].uid)
    new = owned("a-new", 4, None)
    place(core, new)
    every = [NodeName(f"n{i}") for i in range(4)]
    d = core.filter(core.queries.pods[pod_key("default", "a-new")], every, AFTER + 2)
    assert d.passed == [held.node]
    assert pod_key("default", "a-new") in state_of(core).defrag.moved
    # Bound there, it is not movable for another gang.
    from coscheduling.defrag.carry import movable_pods
    bound = dict(new)
    bound["spec"] = {**new["spec"], "nodeName": held.node}
    bound["status"] = {"phase": "Running", "startTime": _stamp(1000.0)}
    place(core, bound)
    assert pod_key("default", "a-new") not in {m.key for m in movable_pods(state_of(core), 0)}


def test_the_owner_is_read_from_the_controller_reference() -> None:
    rec = pod_from_json(owned("p", 1, "n0", kind="StatefulSet", owner="db"))
    assert rec.owner == Owner("StatefulSet", "db", "uid-db")
    obj = owned("q", 1, "n0")
    obj["metadata"]["ownerReferences"][0]["controller"] = False
    assert pod_from_json(obj).owner is None


def test_the_search_tries_a_bounded_number_of_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Work is bounded whatever the cluster: at most NODES_TRIED nodes are planned for."""
    core = cluster(*([8] * 40))
    place(core, *(owned(f"p{i}", 4, f"n{i}") for i in range(40)))
    # Every node could be freed by moving one pod; none of the moves finds room (patched
    # below), so every node screened in is a trial that fails: the search must stop.
    core.upsert_pod(pod_from_json(pod("big-0").gang("big", 1, timeout=60).gpu(8).build()))
    calls = 0
    real = plan_gang

    def counting(*a: Any, **k: Any) -> Any:
        nonlocal calls
        calls += 1
        return real(*a, **k)

    monkeypatch.setattr(search, "plan_gang", counting)
    monkeypatch.setattr(search, "_room_elsewhere", lambda *a: None)
    ask(core, 0.0)
    ask(core, AFTER + 1)
    assert core.drain().evictions == []
    assert calls <= search.NODES_TRIED * (search.MAX_MOVED + 1)
