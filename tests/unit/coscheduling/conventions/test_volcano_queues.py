"""Volcano queues: a Volcano gang enters its Queue only while the queue is Open and its
capability has room (``coscheduling.conventions.volcano_queues``, gated in admission and in
the enqueue status)."""

from __future__ import annotations

from typing import Any

import pytest

from app.render import render
from coscheduling import Coscheduler, GangPhase, Settings, node_from_json, pod_from_json, pod_key
from coscheduling.conventions.volcano import volcano_podgroup_from_json, volcano_statuses
from coscheduling.conventions.volcano_queues import QueueRecord, QueueUse, demand, queue_from_json
from coscheduling.events import ingest
from coscheduling.podgroup import gang_key
from coscheduling.reasons import QueueFull, QueueNotFound, QueueNotOpen
from tests.builders import node, pod

GPU = "nvidia.com/gpu"
A = gang_key("default", "a")


def queue(name: str, gpus: int | None = None, state: str | None = "Open") -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
                           "metadata": {"name": name}, "spec": {"weight": 1}}
    if gpus is not None:
        obj["spec"]["capability"] = {GPU: str(gpus)}
    if state is not None:
        obj["status"] = {"state": state}
    return obj


def vpg(name: str, size: int, q: str | None = "q", min_resources: bool = True
        ) -> dict[str, Any]:
    spec: dict[str, Any] = {"minMember": size}
    if q is not None:
        spec["queue"] = q
    if min_resources:
        spec["minResources"] = {GPU: str(size)}
    return {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": "default"}, "spec": spec}


# ------------------------------------------------------------------ the rules, pure


def use(*queues: dict[str, Any]) -> QueueUse:
    return QueueUse({q.name: q for q in map(queue_from_json, queues)})


def test_capability_exceeded_counts_what_the_queues_other_groups_hold() -> None:
    u = use(queue("q", 4))
    u.take(gang_key("default", "other"), "q", {GPU: 3})
    why = u.check(A, "q", {GPU: 2, "cpu": 2000})
    assert isinstance(why, QueueFull)
    assert why.over == (GPU,) and why.used == {GPU: 3} and why.capability == {GPU: 4}
    assert u.check(A, "q", {GPU: 1}) is None  # exactly at the capability is fine
    u.take(A, "q", {GPU: 2})  # a group's own share is not counted against it
    assert u.check(A, "q", {GPU: 1}) is None


def test_only_the_resources_the_capability_names_are_limited() -> None:
    u = use(queue("q", 4))
    assert u.check(A, "q", {"cpu": 10**9, "memory": 2**50}) is None


@pytest.mark.parametrize("state", ["Closed", "Closing", "Unknown"])
def test_a_queue_that_is_not_open_takes_nothing(state: str) -> None:
    why = use(queue("q", state=state)).check(A, "q", {GPU: 1})
    assert why == QueueNotOpen(A, "q", state)


def test_a_queue_without_a_state_counts_as_open() -> None:
    """Volcano's controller writes Open for an empty state; without it nobody writes one."""
    assert use(queue("q", 4, state=None)).check(A, "q", {GPU: 4}) is None


def test_a_missing_queue_holds_the_group_except_default() -> None:
    assert use().check(A, "q", {GPU: 1}) == QueueNotFound(A, "q")
    assert use().check(A, "default", {GPU: 100}) is None  # Volcano creates it, unlimited


def test_a_queue_without_capability_is_unlimited() -> None:
    assert use(queue("q")).check(A, "q", {GPU: 10**6}) is None


def test_cpu_or_memory_capability_of_zero_is_unlimited_as_in_volcano() -> None:
    q = queue_from_json({"metadata": {"name": "q"},
                         "spec": {"capability": {"cpu": "0", GPU: "2"}}})
    assert q == QueueRecord("q", {GPU: 2}, "")


def test_demand_is_min_resources_or_members_times_min_member() -> None:
    assert demand({GPU: 4}, 2, []) == {GPU: 4}
    assert demand({}, 4, [{GPU: 1}, {GPU: 1}]) == {GPU: 4}  # two more like the last
    assert demand({}, 2, [{GPU: 2}, {GPU: 1}, {GPU: 1}]) == {GPU: 3}


def test_podgroup_queue_defaults_to_default() -> None:
    assert volcano_podgroup_from_json(vpg("a", 1, q=None)).queue == "default"
    assert volcano_podgroup_from_json(vpg("a", 1, q="team")).queue == "team"


# ------------------------------------------------------------------ through the core


def core_with(*queues: dict[str, Any], gpus: int = 8) -> Coscheduler:
    core = Coscheduler(Settings(backoff_seconds=10))
    core.upsert(ingest.NODES, node_from_json(node("n0").gpus(gpus // 2).build()))
    core.upsert(ingest.NODES, node_from_json(node("n1").gpus(gpus - gpus // 2).build()))
    core.replace(ingest.QUEUES, [queue_from_json(q) for q in queues])
    return core


def gang(core: Coscheduler, name: str, size: int = 4, q: str | None = "q",
         min_resources: bool = True) -> None:
    core.upsert(ingest.VOLCANO_PODGROUPS, volcano_podgroup_from_json(
        vpg(name, size, q, min_resources)))
    for i in range(size):
        core.upsert_pod(pod_from_json(
            pod(f"{name}-{i}").annotate("scheduling.k8s.io/group-name", name).gpu(1).build()))


def filt(core: Coscheduler, name: str, now: float = 0.0) -> Any:
    return core.filter(core.queries.pods[pod_key("default", name)], sorted(core.queries.nodes), now)


def delete_gang(core: Coscheduler, name: str, size: int = 4) -> None:
    for i in range(size):
        core.delete_pod(pod_key("default", f"{name}-{i}"))


def test_two_gangs_in_a_queue_of_four_gpus_on_eight_one_runs_then_the_other() -> None:
    core = core_with(queue("q", 4))
    gang(core, "a")
    gang(core, "b")
    assert filt(core, "a-0").passed
    no = filt(core, "b-0")
    assert not no.passed and isinstance(no.unresolvable, QueueFull)
    text = render(no.unresolvable)
    assert "queue 'q'" in text and "{nvidia.com/gpu: 4}" in text
    view = core.queries.gang_view(gang_key("default", "b"))
    assert view is not None and isinstance(view.reason, QueueFull)
    core.drain()
    delete_gang(core, "a")  # the running gang finishes: b is tried again at once
    assert pod_key("default", "b-0") in core.drain().requeue
    assert filt(core, "b-0").passed


def test_closed_queue_holds_the_gang_until_it_opens() -> None:
    core = core_with(queue("q", state="Closed"))
    gang(core, "a")
    assert filt(core, "a-0").unresolvable == QueueNotOpen(A, "q", "Closed")
    core.drain()
    core.upsert(ingest.QUEUES, queue_from_json(queue("q")))
    assert pod_key("default", "a-0") in core.drain().requeue
    assert filt(core, "a-0").passed


def test_missing_queue_holds_the_gang_until_it_is_created() -> None:
    core = core_with()
    gang(core, "a", q="nope")
    assert filt(core, "a-0").unresolvable == QueueNotFound(A, "nope")
    core.upsert(ingest.QUEUES, queue_from_json(queue("nope")))
    assert filt(core, "a-0").passed


def test_without_the_queue_crd_nothing_is_gated() -> None:
    core = core_with(queue("q", state="Closed"))
    core.unserved(ingest.QUEUES)
    gang(core, "a")
    assert filt(core, "a-0").passed


def test_unlimited_queue_admits_both() -> None:
    core = core_with(queue("q"))
    gang(core, "a")
    gang(core, "b")
    assert filt(core, "a-0").passed and filt(core, "b-0").passed


def test_without_min_resources_the_members_requests_count() -> None:
    core = core_with(queue("q", 4))
    gang(core, "a", min_resources=False)
    gang(core, "b", min_resources=False)
    assert filt(core, "a-0").passed
    assert isinstance(filt(core, "b-0").unresolvable, QueueFull)


def test_other_conventions_are_never_gated() -> None:
    core = core_with(queue("q", 0, state="Closed"))
    for i in range(4):
        core.upsert_pod(pod_from_json(pod(f"x-{i}").gang("x", min_member=4).gpu(1).build()))
    assert filt(core, "x-0").passed


def test_a_growing_capability_admits_the_waiting_gang() -> None:
    core = core_with(queue("q", 4))
    gang(core, "a")
    gang(core, "b")
    assert filt(core, "a-0").passed
    assert isinstance(filt(core, "b-0").unresolvable, QueueFull)
    core.drain()
    core.upsert(ingest.QUEUES, queue_from_json(queue("q", 8)))
    assert pod_key("default", "b-0") in core.drain().requeue
    assert filt(core, "b-0").passed


def test_the_enqueue_status_says_which_queue_holds_a_group_back() -> None:
    core = core_with(queue("q", 4), queue("shut", state="Closing"))
    for name, q in (("a", "q"), ("b", "q"), ("c", "shut"), ("d", "gone")):
        core.upsert(ingest.VOLCANO_PODGROUPS, volcano_podgroup_from_json(vpg(name, 4, q)))
    out = {k.split("/")[1]: (s.phase, type(s.waiting).__name__ if s.waiting else None)
           for k, s in volcano_statuses(core.queries.status_model()).items()}
    assert out == {"a": ("Inqueue", None), "b": ("Pending", "QueueFull"),
                   "c": ("Pending", "QueueNotOpen"), "d": ("Pending", "QueueNotFound")}


def test_extra_members_never_take_a_queue_past_its_capability() -> None:
    core = core_with(queue("q", 3))
    gang(core, "a", size=2)  # minResources 2 GPUs: two members, both planned
    assert filt(core, "a-0").passed
    core.upsert_pod(pod_from_json(
        pod("a-2").annotate("scheduling.k8s.io/group-name", "a").gpu(1).build()))
    assert filt(core, "a-2").passed  # 3 of 3
    core.upsert_pod(pod_from_json(
        pod("a-3").annotate("scheduling.k8s.io/group-name", "a").gpu(1).build()))
    assert isinstance(filt(core, "a-3").unresolvable, QueueFull)


def test_a_gang_with_more_members_than_its_queue_holds_waits() -> None:
    """Admission plans every member that fits: all of them must fit the queue."""
    core = core_with(queue("q", 3))
    gang(core, "a", size=2)
    for i in (2, 3):
        core.upsert_pod(pod_from_json(
            pod(f"a-{i}").annotate("scheduling.k8s.io/group-name", "a").gpu(1).build()))
    assert isinstance(filt(core, "a-0").unresolvable, QueueFull)


def test_the_last_member_of_a_gang_leaving_wakes_the_queue() -> None:
    core = core_with(queue("q", 4))
    core.upsert(ingest.VOLCANO_PODGROUPS, volcano_podgroup_from_json(vpg("a", 4)))
    for i in range(4):  # running: bound members hold their room in the queue
        core.upsert_pod(pod_from_json(pod(f"a-{i}").annotate(
            "scheduling.k8s.io/group-name", "a").gpu(1).on(f"n{i // 2}").build()))
    gang(core, "b")
    for i in range(3):
        core.delete_pod(pod_key("default", f"a-{i}"))
    assert isinstance(filt(core, "b-0").unresolvable, QueueFull)  # a-3 still holds one
    core.drain()
    core.delete_pod(pod_key("default", "a-3"))
    assert pod_key("default", "b-0") in core.drain().requeue
    assert filt(core, "b-0").passed


def test_the_last_member_of_a_gang_finishing_wakes_the_queue() -> None:
    core = core_with(queue("q", 4))
    core.upsert(ingest.VOLCANO_PODGROUPS, volcano_podgroup_from_json(vpg("a", 4)))
    members = [pod(f"a-{i}").annotate("scheduling.k8s.io/group-name", "a").gpu(1)
               for i in range(4)]
    for i, b in enumerate(members):
        core.upsert_pod(pod_from_json(b.on(f"n{i // 2}").build()))
    gang(core, "b")
    for i in range(3):
        core.upsert_pod(pod_from_json(members[i].on(f"n{i // 2}", "Succeeded").build()))
    assert isinstance(filt(core, "b-0").unresolvable, QueueFull)  # a-3 still runs
    core.drain()
    core.upsert_pod(pod_from_json(members[3].on("n1", "Succeeded").build()))
    assert pod_key("default", "b-0") in core.drain().requeue
    assert filt(core, "b-0").passed


def test_an_extra_of_a_gang_already_bound_never_takes_its_queue_past_capability() -> None:
    """Found by the model: once the gang is bound (RELEASED) an extra member was filtered as
    an ordinary pod, and a queue of 2 GPUs ended up holding 3."""
    core = core_with(queue("q", 2))
    gang(core, "a", size=2)
    nodes = {name: filt(core, name).passed[0] for name in ("a-0", "a-1")}
    for name, at in nodes.items():  # bound, as the watch then shows them
        core.upsert_pod(pod_from_json(pod(name).annotate("scheduling.k8s.io/group-name", "a")
                                      .gpu(1).on(at).build()))
    assert core.queries.gangs[gang_key("default", "a")].phase is GangPhase.RELEASED
    core.upsert_pod(pod_from_json(
        pod("a-2").annotate("scheduling.k8s.io/group-name", "a").gpu(1).build()))
    assert isinstance(filt(core, "a-2").unresolvable, QueueFull)
