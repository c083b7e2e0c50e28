"""The what-if's dry plan on a real core: fits now (nodes, racks, pins), fits after
preemption (whole victim gangs, plain pods, GPUs freed), waits (the reason, what would make
it fit, the earliest known start), never fits; each answer checked against what the core
then does when the same objects are created, and the core's observable state unchanged by
the what-if itself."""

from __future__ import annotations

from typing import Any

import pytest

from coscheduling import (
    Coscheduler,
    GateAtCreation,
    Offload,
    PinAtCreation,
    Proposal,
    Settings,
    Verdict,
    WhatIfError,
    gang_key,
    node_from_json,
    pod_from_json,
)
from coscheduling.conventions.volcano_queues import queue_from_json
from coscheduling.events import ingest
from coscheduling.reasons import DoesNotFit, InvalidDeclaration, QueueFull, WaitingForMembers
from tests.builders import node, pod, podgroup
from tests.unit.coscheduling.creation.test_placer import burst


def cluster(*gpus: int, racks: int = 1, preemption: bool = True) -> Coscheduler:
    core = Coscheduler(Settings(backoff_seconds=5, preemption=preemption))
    for i, n in enumerate(gpus):
        core.upsert(ingest.NODES, node_from_json(
            node(f"n{i}").gpus(n).rack(f"r{i % racks}")
            .label("nvidia.com/gpu.clique", f"c{i}").build()))
    return core


def creating(name: str, gang: str, size: int, gpus: int = 1, prio: int = 0
             ) -> dict[str, Any]:
    obj = pod(name).gang(gang, size, timeout=30).gpu(gpus).priority(prio).build()
    obj["metadata"].pop("uid", None)
    obj.pop("status", None)
    return obj


def running(core: Coscheduler, gang: str, size: int, node_name: str, prio: int) -> None:
    for i in range(size):
        obj = pod(f"{gang}-{i}").gang(gang, size, timeout=30).gpu(1).priority(prio) \
            .on(node_name).build()
        core.upsert_pod(pod_from_json(obj))


def observed(core: Coscheduler) -> tuple[object, ...]:
    """Everything the facade shows of the core (what a what-if must leave as it was)."""
    q = core.queries
    return (dict(q.pods), q.plans(), q.reserved_total(), q.gang_views(),
            q.preemptions_in_flight(), q.parked_total(),
            {n: (q.free(n), q.free_unreserved(n)) for n in sorted(q.nodes)},
            core.drain(), q.next_deadline())


def test_fits_now_names_each_members_node_rack_clique_and_pin_and_is_what_creation_does(
) -> None:
    core = cluster(4, 4, 4, 4, racks=2)
    running(core, "busy", 2, "n0", 0)
    objs = [creating(f"w{i}", "g", 4, gpus=2) for i in range(4)]
    observed(core)  # drains what the setup queued
    before = observed(core)
    answer = core.what_if(objs, 0.0).run()
    assert observed(core) == before  # the dry plan changed nothing
    assert answer.verdict is Verdict.FITS
    (out,) = answer.outcomes
    assert out.level == "rack" and all(p.pinned for p in out.placed)
    where = {p.pod.split("/")[1]: p.node for p in out.placed}
    racks = {dict(p.domains)["rack"] for p in out.placed}
    assert len(racks) == 1
    assert {dict(p.domains)["clique"] for p in out.placed} <= {"c1", "c2", "c3"}
    # The same objects created now, unchanged: the webhook pins them exactly there.
    placed = burst(core, objs)
    assert all(isinstance(a, PinAtCreation) for a in placed.values())
    assert {k: a.node for k, a in placed.items() if isinstance(a, PinAtCreation)} == where


def test_fits_after_preemption_names_whole_victim_gangs_and_is_what_the_sweep_does() -> None:
    core = cluster(4)
    running(core, "low", 4, "n0", 10)
    objs = [creating(f"high-{i}", "high", 4, prio=100) for i in range(4)]
    observed(core)  # drains what the setup queued
    before = observed(core)
    answer = core.what_if(objs, 0.0).run()
    assert observed(core) == before
    (out,) = answer.outcomes
    assert out.verdict is Verdict.PREEMPTS and answer.verdict is Verdict.PREEMPTS
    assert out.victims is not None and out.victims.gangs == (gang_key("default", "low"),)
    assert out.victims.gpus == 4 and out.victims.evicted == 4
    assert not any(p.pinned for p in out.placed)
    # Created: gated at creation (nothing is evicted for pods being created), then the
    # held-gang sweep evicts exactly the victims the what-if named.
    placed = burst(core, objs)
    assert all(isinstance(a, GateAtCreation) for a in placed.values())
    for i, o in enumerate(objs):
        gated = {**o, "metadata": {**o["metadata"], "uid": f"u{i}", "resourceVersion": "5"},
                 "spec": {**o["spec"], "schedulingGates": [{"name": "lockstep.dev/gang"}]}}
        core.upsert_pod(pod_from_json(gated))
    core.admit_gated(1.0)
    assert sorted(e.pod for e in core.drain().evictions) == sorted(
        f"default/low-{i}" for i in range(4))
    assert core.queries.plans()[gang_key("default", "high")] == {p.pod: p.node for p in out.placed}


def test_waits_says_why_what_would_make_it_fit_and_the_earliest_start() -> None:
    core = cluster(4, 4)
    # An admitted gang holds n0 and n1 with a deadline: room known to come back then.
    for i in range(8):
        core.upsert_pod(pod_from_json(pod(f"a-{i}").gang("a", 8, timeout=30).gpu(1).build()))
    a0 = core.queries.pods["default/a-0"]  # type: ignore[index]
    assert core.filter(a0, sorted(core.queries.nodes), 0.0).passed
    objs = [creating(f"w{i}", "g", 2, gpus=2) for i in range(2)]
    observed(core)  # drains what the setup queued
    before = observed(core)
    answer = core.what_if(objs, 10.0).run()
    assert observed(core) == before
    (out,) = answer.outcomes
    assert out.verdict is Verdict.WAITS
    assert isinstance(out.reason, DoesNotFit) and out.reason.reserved_by == (
        gang_key("default", "a"),)
    assert out.hints and "4 GPUs" in out.hints[0]
    assert out.earliest is not None and out.earliest.seconds == 20.0
    assert "default/a" in out.earliest.event


def test_too_few_members_wait_for_the_rest() -> None:
    core = cluster(8)
    answer = core.what_if([creating("w0", "g", 3)], 0.0).run()
    (out,) = answer.outcomes
    assert out.verdict is Verdict.WAITS
    assert out.reason == WaitingForMembers(gang_key("default", "g"), 1, 3)


@pytest.mark.parametrize(("objs", "why"), [
    pytest.param([creating(f"w{i}", "g", 2, gpus=8) for i in range(2)], "empty cluster",
                 id="too-big-for-any-node"),
    pytest.param([pod(f"w{i}").gang("g", 2).gpu(2).annotate(
        "lockstep.dev/topology-required", "rack").build() for i in range(2)],
        "in one rack", id="required-rack-no-domain-satisfies"),
])
def test_never_fits_is_proven_on_the_empty_cluster(objs: list[dict[str, Any]],
                                                    why: str) -> None:
    core = cluster(2, 2, racks=2)
    answer = core.what_if(objs, 0.0).run()
    (out,) = answer.outcomes
    assert out.verdict is Verdict.NEVER and answer.verdict is Verdict.NEVER
    assert "empty cluster" in out.why and (why in out.why or why == "empty cluster")


def test_an_invalid_declaration_never_fits_with_the_field_named() -> None:
    core = cluster(4)
    objs = [pod("w0").gang("g", 5000).gpu(1).build()]
    (out,) = core.what_if(objs, 0.0).run().outcomes
    assert out.verdict is Verdict.NEVER and isinstance(out.reason, InvalidDeclaration)


def test_a_pytorchjob_with_its_podgroup_is_its_pods_in_one_gang() -> None:
    core = cluster(4, 4)
    tpl = {"spec": {"containers": [{"name": "c", "resources": {
        "limits": {"nvidia.com/gpu": "1"}}}]}}
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
           "metadata": {"name": "train", "namespace": "default"},
           "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": tpl},
                                            "Worker": {"replicas": 3, "template": tpl}}}}
    answer = core.what_if([job, podgroup("train", 4)], 0.0).run()
    (out,) = answer.outcomes
    assert out.unit == "default/train" and out.members == 4 and out.verdict is Verdict.FITS
    assert sorted(p.pod for p in out.placed) == [
        "default/train-master-0", *(f"default/train-worker-{i}" for i in range(3))]


def test_a_second_unit_sees_the_room_the_first_takes() -> None:
    core = cluster(4)
    objs = [creating(f"a{i}", "a", 2, gpus=2) for i in range(2)]
    objs += [creating(f"b{i}", "b", 2, gpus=2) for i in range(2)]
    answer = core.what_if(objs, 0.0).run()
    assert [o.verdict for o in answer.outcomes] == [Verdict.FITS, Verdict.WAITS]
    assert answer.verdict is Verdict.WAITS


def test_a_plain_pod_fits_on_room_no_gang_holds_and_is_never_pinned() -> None:
    core = cluster(4)
    (out,) = core.what_if([pod("solo").gpu(2).build()], 0.0).run().outcomes
    assert out.verdict is Verdict.FITS and not out.gang and not out.placed[0].pinned


@pytest.mark.parametrize(("obj", "field"), [
    (pod("x").scheduler("default-scheduler").gpu(1).build(), "spec.schedulerName"),
    (pod("x").gpu(1).priority(5, "nope").build(), "spec.priorityClassName"),
])
def test_pods_for_another_scheduler_or_an_unknown_class_are_refused(obj: dict[str, Any],
                                                                    field: str) -> None:
    core = cluster(4)
    obj["spec"].pop("priority", None)
    with pytest.raises(WhatIfError) as e:
        core.what_if([obj], 0.0)
    assert e.value.field.endswith(field)


def test_a_pod_that_exists_already_is_refused() -> None:
    core = cluster(4)
    core.upsert_pod(pod_from_json(pod("x").gpu(1).build()))
    with pytest.raises(WhatIfError, match="exists already"):
        core.what_if([pod("x").gpu(1).build()], 0.0)


def test_a_kueue_group_or_a_pod_with_a_gate_of_its_own_is_placed_but_not_pinned() -> None:
    """Kueue's webhook gates every pod of its pod-group integration, and the webhook pins
    no pod another party holds back: the plan is the same, made once the gate comes off."""
    core = cluster(4, 4)
    kueue_pods = [pod(f"k{i}").label("kueue.x-k8s.io/queue-name", "team")
                  .label("kueue.x-k8s.io/pod-group-name", "k")
                  .annotate("kueue.x-k8s.io/pod-group-total-count", "2").gpu(1).build()
                  for i in range(2)]
    (out,) = core.what_if(kueue_pods, 0.0).run().outcomes
    assert out.verdict is Verdict.FITS and out.unit == "default/k"
    assert not any(p.pinned for p in out.placed)
    gated = [creating(f"w{i}", "g", 2) for i in range(2)]
    gated[0]["spec"]["schedulingGates"] = [{"name": "example.com/hold"}]
    (out,) = core.what_if(gated, 0.0).run().outcomes
    # w0 does not count until its gate comes off, so the quorum never exists at creation:
    # w1 is held, then gated, and both are placed by the plan once w0 is let go.
    assert out.verdict is Verdict.FITS and not any(p.pinned for p in out.placed)


def test_a_volcano_group_in_the_manifest_waits_for_its_queue_capability() -> None:
    """The manifest's own Volcano PodGroup names the queue (not one the store holds)."""
    core = cluster(4, 4)
    core.replace(ingest.QUEUES, [queue_from_json(
        {"metadata": {"name": "small"}, "spec": {"capability": {"nvidia.com/gpu": "2"}},
         "status": {"state": "Open"}})])
    group = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
             "metadata": {"name": "v", "namespace": "default"},
             "spec": {"minMember": 2, "queue": "small"}}
    members = [pod(f"v{i}").annotate("scheduling.k8s.io/group-name", "v").gpu(2).build()
               for i in range(2)]
    (out,) = core.what_if([group, *members], 0.0).run().outcomes
    assert out.verdict is Verdict.WAITS and isinstance(out.reason, QueueFull)
    assert out.reason.queue == "small"
    group["spec"]["queue"] = "default"  # unlimited: it fits
    (out,) = core.what_if([group, *members], 0.0).run().outcomes
    assert out.verdict is Verdict.FITS


def test_a_deployments_replicas_fit_gated_not_pinned() -> None:
    core = cluster(4, 4)
    tpl = pod("t").gang("web", 3).gpu(1).build()
    dep = {"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": "web", "namespace": "default"},
           "spec": {"replicas": 3, "template": {"metadata": tpl["metadata"],
                                                "spec": tpl["spec"]}}}
    answer = core.what_if([dep], 0.0).run()
    (out,) = answer.outcomes
    assert out.verdict is Verdict.FITS and out.members == 3
    assert not any(p.pinned for p in out.placed)
    assert any("Deployment default/web: 3 replica(s)" in n for n in answer.notes)


def test_extras_beyond_min_member_are_placed_but_the_pins_depend_on_arrival() -> None:
    core = cluster(4, 4)
    objs = [pod(f"w{i}").gang("g", 2).gpu(1).build() for i in range(3)]
    (out,) = core.what_if(objs, 0.0).run().outcomes
    assert out.verdict is Verdict.FITS and len(out.placed) == 3
    assert not any(p.pinned for p in out.placed) and "first 2 created are pinned" in out.why


def test_the_room_a_preemption_frees_beyond_its_preemptor_is_an_earliest_start() -> None:
    """A preemption in flight evicts a whole 8-GPU gang for a 4-GPU one: once the victims
    are gone (by the end of their grace at the latest) 4 GPUs are free for a waiting gang."""
    core = cluster(8)
    running(core, "low", 8, "n0", 10)
    high = [pod(f"high-{i}").gang("high", 4, timeout=30).gpu(1).priority(100).build()
            for i in range(4)]
    for obj in high:
        obj["status"]["conditions"] = [{"type": "PodScheduled", "status": "False",
                                        "reason": "Unschedulable"}]
        core.upsert_pod(pod_from_json(obj))
    core.admit_gated(0.0)
    (flight,) = core.queries.preemptions_in_flight()
    objs = [creating(f"w{i}", "w", 4) for i in range(4)]
    (out,) = core.what_if(objs, 1.0).run().outcomes
    assert out.verdict is Verdict.WAITS
    assert out.earliest is not None and out.earliest.seconds == round(flight.deadline - 1.0, 1)
    assert "the victims of gang default/high's preemption are gone" in out.earliest.event


def test_a_pod_over_an_affinity_limit_never_fits_without_a_pass_over_the_nodes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Its never-fit proof asked every node about 4,000 terms (1-2 s at 5,000 nodes)."""
    from coscheduling.whatif import later

    asked: list[str] = []
    real = later.eligible
    monkeypatch.setattr(later, "eligible", lambda p, n, **kw: asked.append(n.name) or real(
        p, n, **kw))
    core = cluster(4, 4)
    obj = pod("p").gpu(1).build()
    obj["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["a"]}]}] * 4000}}}
    (out,) = core.what_if([obj], 0.0).run().outcomes
    assert out.verdict is Verdict.NEVER and "nodeAffinity" in out.why
    assert asked == []


def _scenarios() -> list[tuple[Coscheduler, list[dict[str, Any]], float]]:
    fits = cluster(4, 4, 4, 4, racks=2)
    running(fits, "busy", 2, "n0", 0)
    preempts = cluster(4)
    running(preempts, "low", 4, "n0", 10)
    waits = cluster(4, 4)
    for i in range(8):
        waits.upsert_pod(pod_from_json(pod(f"a-{i}").gang("a", 8, timeout=30).gpu(1).build()))
    waits.filter(waits.queries.pods["default/a-0"], sorted(waits.queries.nodes), 0.0)  # type: ignore[index]
    never_ = cluster(2, 2, racks=2)
    return [
        (fits, [creating(f"w{i}", "g", 4, gpus=2) for i in range(4)], 0.0),
        (preempts, [creating(f"high-{i}", "high", 4, prio=100) for i in range(4)], 0.0),
        (waits, [creating(f"w{i}", "g", 2, gpus=2) for i in range(2)], 10.0),
        (never_, [creating(f"w{i}", "g", 2, gpus=8) for i in range(2)], 0.0),
    ]


@pytest.mark.parametrize("at", range(4), ids=["fits", "preempts", "waits", "never"])
def test_a_big_unit_planned_off_the_loop_on_a_snapshot_gets_the_same_answer(
        at: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Above ``HEAVY_PAIRS`` the planning, the never-fit proof, the victim search and the
    earliest start run on a snapshot, handed out as ``Offload`` work: same answers, and
    the core unchanged."""
    from coscheduling.whatif import dryrun

    core, objs, now = _scenarios()[at]
    observed(core)
    before = observed(core)
    live = core.what_if(objs, now).run()
    monkeypatch.setattr(dryrun, "HEAVY_PAIRS", 0)
    run = core.what_if(objs, now)
    offloaded = 0
    got = run.advance()
    while not isinstance(got, Proposal):
        if isinstance(got, Offload):
            offloaded += 1
            got = run.advance(got.work())
        else:
            got = run.advance()
    assert offloaded >= 1 and got == live
    assert observed(core) == before


def koord(name: str, gang: str, size: int) -> dict[str, Any]:
    """A member of a Koordinator gang group of the gangs ``k1`` and ``k2`` (issue 44)."""
    obj = (pod(name).annotate("gang.scheduling.koordinator.sh/name", gang)
           .annotate("gang.scheduling.koordinator.sh/min-available", str(size))
           .annotate("gang.scheduling.koordinator.sh/groups",
                     '["default/k1", "default/k2"]').gpu(1).build())
    obj["metadata"].pop("uid", None)
    obj.pop("status", None)
    return obj


def test_a_group_of_groups_is_answered_subgroup_by_subgroup() -> None:
    """It was refused ("planned once all its gangs exist"): the group is one unit, each
    gang whole in its own tightest domain, and it waits while a gang is short."""
    core = cluster(2, 2, 2, racks=3)
    whole = [koord(f"a{i}", "k1", 2) for i in range(2)] + [koord(f"b{i}", "k2", 2)
                                                            for i in range(2)]
    answer = core.what_if(whole, 0.0).run()
    (out,) = answer.outcomes
    assert answer.verdict is Verdict.FITS and len(out.placed) == 4
    racks = {}
    for p in out.placed:
        racks.setdefault(p.pod.split("/")[1][0], set()).add(dict(p.domains)["rack"])
    assert all(len(r) == 1 for r in racks.values())  # each gang in one rack (a 2-GPU node)
    short = core.what_if(whole[:3], 0.0).run()
    assert short.verdict is Verdict.WAITS
    assert short.outcomes[0].reason == WaitingForMembers(gang_key("default", "k2"), 1, 2)
