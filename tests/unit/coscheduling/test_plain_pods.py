"""Plain pods beside gangs: what Lockstep bound is counted at once, a pod the watch has not
shown is learnt from the call, kube-scheduler's priority order holds between pending plain
pods and gangs, and a plain pod's last answers are kept for ``explain``."""

from __future__ import annotations

from typing import Any

import pytest

from coscheduling import (
    BindNow,
    Bound,
    Coscheduler,
    NodeName,
    Reject,
    Settings,
    gang_key,
    node_from_json,
    pod_from_json,
    pod_key,
)
from coscheduling.events import ingest
from coscheduling.reasons import (
    DoesNotFit,
    HigherPriorityPodsWaiting,
    PodNotInCache,
    ReservedForGangs,
)
from tests.builders import node, pod
from tests.internals import state_of


def cluster(*gpus: int) -> Coscheduler:
    core = Coscheduler(Settings(backoff_seconds=10))
    for i, n in enumerate(gpus):
        core.upsert(ingest.NODES, node_from_json(node(f"n{i}").gpus(n).rack("r0").build()))
    return core


def add(core: Coscheduler, obj: dict[str, Any]) -> dict[str, Any]:
    core.upsert_pod(pod_from_json(obj))
    return obj


def held_gang(core: Coscheduler, name: str, size: int, gpus: int = 1,
              priority: int = 0) -> list[dict[str, Any]]:
    return [add(core, pod(f"{name}-{i}").gang(name, size, timeout=30).gpu(gpus)
                .priority(priority).gated().build()) for i in range(size)]


def bind_plain(core: Coscheduler, obj: dict[str, Any], node_name: str) -> None:
    key = pod_key("default", obj["metadata"]["name"])
    decision = core.bind(key, NodeName(node_name), 0.0, obj["metadata"]["uid"])
    assert decision == BindNow(key, NodeName(node_name))
    core.bind_outcomes([Bound(key, NodeName(node_name))])


def test_a_pod_lockstep_bound_is_counted_before_the_watch_shows_it() -> None:
    core = cluster(2)
    web = add(core, pod("web").gpu(2).build())
    bind_plain(core, web, "n0")
    # The watch has not shown the binding; a stale event (still pending) arrives first.
    add(core, web)
    held_gang(core, "g", 2)
    core.admit_gated(1.0)
    g = core.queries.gang_view(gang_key("default", "g"))
    assert g is not None and not g.plan
    assert isinstance(g.reason, DoesNotFit)
    assert core.queries.free(NodeName("n0")).get("nvidia.com/gpu") == 0
    # The watch confirms it, then the pod finishes: the room is free again.
    add(core, pod("web").gpu(2).on("n0").build() | {"metadata": web["metadata"]})
    assert state_of(core).assumed == {}
    done = pod("web").gpu(2).on("n0", phase="Succeeded").build()
    add(core, done | {"metadata": web["metadata"]})
    core.admit_gated(2.0)
    assert core.queries.gang_view(gang_key("default", "g")).plan  # type: ignore[union-attr]


def test_an_assumption_ends_when_the_pod_is_replaced_or_deleted() -> None:
    core = cluster(2)
    web = add(core, pod("web").gpu(2).build())
    bind_plain(core, web, "n0")
    add(core, pod("web").gpu(2).build())  # recreated under the same name: a new UID
    assert state_of(core).assumed == {}
    assert core.queries.pod(pod_key("default", "web")).node_name is None  # type: ignore[union-attr]
    bind_plain(core, core_pod_json(core, "web"), "n0")
    core.delete_pod(pod_key("default", "web"))
    assert state_of(core).assumed == {}
    assert core.queries.free(NodeName("n0")).get("nvidia.com/gpu") == 2


def core_pod_json(core: Coscheduler, name: str) -> dict[str, Any]:
    rec = core.queries.pod(pod_key("default", name))
    assert rec is not None
    return {"metadata": {"name": name, "uid": rec.uid}}


def test_a_gang_member_the_watch_has_not_shown_is_learnt_from_the_filter_call() -> None:
    core = cluster(4)
    first = add(core, pod("g-0").gang("g", 2).gpu(1).build())
    early = pod("g-1").gang("g", 2).gpu(1).build()  # not delivered by the watch yet
    early["metadata"]["resourceVersion"] = "7"  # newer than anything the watch delivered
    decision = core.filter(pod_from_json(early), [NodeName("n0")], 0.0)
    assert decision.unresolvable is None and decision.passed == ["n0"]
    assert core.queries.pod(pod_key("default", "g-1")) is not None
    assert core.queries.gang_view(gang_key("default", "g")).members == 2  # type: ignore[union-attr]
    assert first  # the first member was there all along


@pytest.mark.parametrize("seen", [
    pytest.param(True, id="its-deletion-was-watched"),
    pytest.param(False, id="deleted-before-the-watch-or-list-reached-it"),
])
def test_a_filter_call_for_a_deleted_pod_is_not_learnt(seen: bool) -> None:
    core = cluster(4)
    gone = pod("g-0").gang("g", 2).gpu(1).build()
    gone["metadata"]["resourceVersion"] = "7"
    if seen:
        add(core, gone)
        core.delete_pod(pod_key("default", "g-0"), gone["metadata"]["uid"])
    else:
        core.pods_listed(9)  # a list at revision 9 did not hold it: it went before that
    decision = core.filter(pod_from_json(gone), [NodeName("n0")], 0.0)
    assert isinstance(decision.unresolvable, PodNotInCache)
    assert core.queries.pod(pod_key("default", "g-0")) is None


def plain_ahead(core: Coscheduler, n: int, gpus: int, priority: int,
                **marks: Any) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        b = pod(f"inf-{i}").gpu(gpus).priority(priority)
        obj = b.build()
        if marks.get("unschedulable"):
            obj["status"]["conditions"] = [{"type": "PodScheduled", "status": "False",
                                            "reason": "Unschedulable"}]
        out.append(add(core, obj))
    return out


@pytest.mark.parametrize(("plain_gpus", "plain_priority", "unschedulable", "want_wait"), [
    pytest.param(1, 100, False, True, id="higher-priority-pods-need-the-room"),
    pytest.param(1, 0, False, False, id="equal-priority-pods-do-not-hold-it-back"),
    pytest.param(1, 100, True, False, id="pods-kube-scheduler-marked-unschedulable-do-not"),
])
def test_a_gang_waits_for_higher_priority_pods_kube_scheduler_is_placing(
    plain_gpus: int, plain_priority: int, unschedulable: bool, want_wait: bool,
) -> None:
    core = cluster(1, 1, 1)  # either three 1-GPU plain pods or the 3-member gang
    plain_ahead(core, 3, plain_gpus, plain_priority, unschedulable=unschedulable)
    held_gang(core, "g", 3, priority=10)
    core.admit_gated(0.0)
    view = core.queries.gang_view(gang_key("default", "g"))
    assert view is not None
    if want_wait:
        assert not view.plan
        assert isinstance(view.reason, HigherPriorityPodsWaiting)
        assert view.reason.count == 3 and view.reason.pods[0] == "default/inf-0"
    else:
        assert len(view.plan) == 3


def test_higher_priority_pods_that_fit_beside_the_gang_do_not_hold_it_back() -> None:
    core = cluster(2, 2, 2)
    plain_ahead(core, 3, 1, 100)
    held_gang(core, "g", 3, priority=10)
    core.admit_gated(0.0)
    assert len(core.queries.gang_view(gang_key("default", "g")).plan) == 3  # type: ignore[union-attr]


def test_the_gang_is_tried_again_once_the_pods_ahead_leave_kube_schedulers_queue() -> None:
    core = cluster(1, 1, 1)
    (ahead,) = plain_ahead(core, 1, 1, 100)
    held_gang(core, "g", 3, priority=10)
    core.admit_gated(0.0)
    view = core.queries.gang_view(gang_key("default", "g"))
    assert view is not None and isinstance(view.reason, HigherPriorityPodsWaiting)
    # kube-scheduler found no room for it (its own filters): it is no longer being placed.
    ahead["status"]["conditions"] = [{"type": "PodScheduled", "status": "False",
                                      "reason": "Unschedulable"}]
    add(core, ahead)
    core.admit_gated(1.0)
    assert len(core.queries.gang_view(gang_key("default", "g")).plan) == 3  # type: ignore[union-attr]


@pytest.mark.parametrize(("gang_priority", "pod_priority", "want_refused"), [
    pytest.param(100, 10, True, id="higher-priority-gang-keeps-its-room"),
    pytest.param(10, 10, True, id="equal-priority-gang-keeps-its-room"),
    pytest.param(0, 10, False, id="lower-priority-gang-makes-room"),
])
def test_a_plain_bind_is_refused_for_a_reservation_only_of_its_priority_or_higher(
    gang_priority: int, pod_priority: int, want_refused: bool,
) -> None:
    core = cluster(2, 2)
    web = add(core, pod("web").gpu(2).priority(pod_priority).build())
    # kube-scheduler filtered web onto n0 while n0 was free; then the gang was admitted.
    assert core.filter(pod_from_json(web), [NodeName("n0")], 0.0).passed == ["n0"]
    if gang_priority < pod_priority:
        # A gang of lower priority is admitted over a pending pod only when Lockstep did
        # not know the pod was pending (its filter went to a replica that has since died).
        state_of(core).plain.pending.clear()
    held_gang(core, "g", 2, gpus=2, priority=gang_priority)
    core.admit_gated(0.0)
    gang = core.queries.gang_view(gang_key("default", "g"))
    assert gang is not None and len(gang.plan) == 2
    key = pod_key("default", "web")
    decision = core.bind(key, NodeName("n0"), 1.0, web["metadata"]["uid"])
    if want_refused:
        assert isinstance(decision, Reject) and isinstance(decision.reason, ReservedForGangs)
        assert decision.reason.gangs == (gang_key("default", "g"),)
        verdict = core.queries.plain_verdict(key)
        assert verdict is not None and verdict.bind_refused == decision.reason
    else:
        assert decision == BindNow(key, NodeName("n0"))
        after = core.queries.gang_view(gang_key("default", "g"))
        # web is counted on n0 at once; the gang holds nothing there, and with n1 alone it
        # no longer fits: it gave everything back.
        assert after is not None and "n0" not in after.plan.values()
        assert core.queries.reserved_on(NodeName("n0")) == {}
        assert core.queries.free(NodeName("n0")).get("nvidia.com/gpu") == 0
        assert not after.plan and isinstance(after.reason, DoesNotFit)
        # The binding fails after all: web is pending again and n0 free.
        from coscheduling import BindFailed
        core.bind_outcomes([BindFailed(key, NodeName("n0"), "409", permanent=True)])
        assert core.queries.pod(key).node_name is None  # type: ignore[union-attr]
        assert core.queries.free(NodeName("n0")).get("nvidia.com/gpu") == 2


def test_explain_keeps_a_plain_pods_last_filter_answer() -> None:
    core = cluster(2, 2)
    held_gang(core, "g", 2, gpus=2)
    core.admit_gated(0.0)
    web = add(core, pod("web").gpu(1).build())
    decision = core.filter(pod_from_json(web), [NodeName("n0"), NodeName("n1")], 3.0)
    assert decision.passed == []
    verdict = core.queries.plain_verdict(pod_key("default", "web"))
    assert verdict is not None and verdict.filtered_at == 3.0 and verdict.passed == 0
    assert set(verdict.refused) == {"n0", "n1"}
