"""Each convention's status computed from a status model built by hand, with no core: the
model (``conventions.base.StatusModel``) is all a convention's status reads. Then the core's
side: the one function that builds the model (``Coscheduler.status_model``).
"""

from __future__ import annotations

from typing import Any

from coscheduling import (
    BindFailed,
    BindGroup,
    Bound,
    NodeName,
    Park,
    gang_key,
    pod_key,
)
from coscheduling.conventions import scheduler_plugins, upstream, volcano
from coscheduling.conventions.base import (
    GangStatusModel,
    MemberCounts,
    StatusModel,
    StatusPatch,
)
from coscheduling.conventions.scheduler_plugins import podgroup_from_json
from coscheduling.conventions.upstream import Condition, GroupPolicy, UpstreamPodGroup
from coscheduling.conventions.volcano import volcano_podgroup_from_json
from coscheduling.conventions.volcano_queues import QueueRecord
from coscheduling.events import ingest
from coscheduling.podgroup import InvalidGang, Source
from coscheduling.reasons import InvalidDeclaration, NotEnoughMinResources, PartiallyBound, Reason
from tests.builders import node, pod, podgroup
from tests.unit.coscheduling.test_core import add, cluster

NOW = "2026-11-28T00:00:00Z"
GPU = "nvidia.com/gpu"


def words(why: Reason) -> str:
    """A stand-in for the adapter's wording: which reason it was."""
    return f"<{type(why).__name__}>"


def by_path(patches: list[StatusPatch]) -> dict[str, dict[str, Any]]:
    return {p.path.rsplit("/", 2)[-2]: dict(p.status) for p in patches}


# ---------------------------------------------------------------------------- scheduler-plugins


def test_scheduler_plugins_status_from_a_hand_built_model() -> None:
    """Phases and counts per PodGroup; a partial gang's condition; a gang group's own
    PodGroups each counting their members (only those that exist); an invalid PodGroup's
    GangInvalid condition; gangs of other conventions left alone."""
    sp = Source.SCHEDULER_PLUGINS
    run, part, worker, launcher = (gang_key("default", n)
                                   for n in ("run", "part", "workers", "launcher"))
    bad = podgroup_from_json(podgroup("bad", 0))
    assert bad.error is not None
    partial = PartiallyBound(part, 1, 2, ("403 forbidden",))
    model = StatusModel(
        gangs={
            run: GangStatusModel(run, sp, 2, MemberCounts(total=2, scheduled=2, placed=2,
                                                          bound=2, running=2)),
            part: GangStatusModel(part, sp, 2, MemberCounts(total=2, scheduled=1), partial=partial),
            gang_key("default", "gang-group[...]"): GangStatusModel(
                gang_key("default", "gang-group[...]"), sp, 3, parts=(
                    GangStatusModel(worker, sp, 2, MemberCounts(total=2, running=2)),
                    GangStatusModel(launcher, sp, 1, MemberCounts(total=1), holding=True),
                    GangStatusModel(gang_key("default", "gone"), sp, 1))),
            gang_key("default", "lockstep"): GangStatusModel(
                gang_key("default", "lockstep"), Source.LOCKSTEP, 1),
        },
        objects={sp: {k: podgroup_from_json(podgroup(k.split("/")[1], 1))
                      for k in (run, part, worker, launcher)} | {bad.key: bad}},
    )
    got = by_path(scheduler_plugins.status_patches(model, words, NOW))
    assert got["run"] == {"phase": "Running", "scheduled": 2, "running": 2, "succeeded": 0,
                          "failed": 0}
    assert got["part"]["phase"] == "Scheduling"
    assert got["part"]["conditions"] == [{
        "type": "GangPartiallyBound", "status": "True", "reason": "BindingFailed",
        "message": "<PartiallyBound>", "lastTransitionTime": NOW}]
    assert (got["workers"]["phase"], got["workers"]["running"]) == ("Running", 2)
    assert got["launcher"]["phase"] == "Scheduling"  # the group holds a reservation
    assert got["bad"]["phase"] == "Pending"
    assert got["bad"]["conditions"][0]["type"] == "GangInvalid"
    assert got["bad"]["conditions"][0]["message"] == "<InvalidDeclaration>"
    assert set(got) == {"run", "part", "workers", "launcher", "bad"}


def test_scheduler_plugins_failed_and_finished_phases() -> None:
    sp = Source.SCHEDULER_PLUGINS
    key = gang_key("default", "g")

    def phase(counts: MemberCounts) -> str:
        return scheduler_plugins.podgroup_status(GangStatusModel(key, sp, 2, counts)).phase

    assert phase(MemberCounts(total=2, succeeded=2)) == "Finished"
    assert phase(MemberCounts(total=2, failed=1)) == "Failed"  # 1 > 2 - 2: cannot reach 2
    assert phase(MemberCounts(total=3, failed=1)) == "Scheduling"  # 1 of 3 failed: may
    assert phase(MemberCounts(total=2)) == "Pending"


# ---------------------------------------------------------------------------- Volcano


def vpg(name: str, gpus: int, queue: str = "default", phase: str = "") -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"minMember": 2, "queue": queue, "minResources": {GPU: str(gpus)}}}
    if phase:
        obj["status"] = {"phase": phase}
    return obj


def test_volcano_status_from_a_hand_built_model() -> None:
    """Enqueued while its minResources fit the free capacity and its queue has room; held
    Pending with an Unschedulable condition naming the queue's reason otherwise; what a gang
    already holds in a queue counts against the queue's capability."""
    held = gang_key("default", "held")
    groups = {r.key: r for r in map(volcano_podgroup_from_json, [
        vpg("a", 2, "q"), vpg("b", 2, "q"), vpg("c", 2), vpg("d", 8),
        vpg("run", 2, phase="Inqueue")])}
    run = gang_key("default", "run")
    model = StatusModel(
        gangs={
            held: GangStatusModel(held, Source.VOLCANO, 2, queue="q", allocated={GPU: 2}),
            run: GangStatusModel(run, Source.VOLCANO, 2,
                                 MemberCounts(total=2, scheduled=2, placed=2, bound=2,
                                              running=2), queue="default", allocated={GPU: 2}),
        },
        objects={Source.VOLCANO: groups},
        queues={"q": QueueRecord("q", {GPU: 4}, "Open")},
        free={GPU: 6},
    )
    got = by_path(volcano.status_patches(model, words, NOW))
    assert got["a"] == {"phase": "Inqueue", "running": 0, "succeeded": 0, "failed": 0,
                        "conditions": []}
    assert got["b"]["phase"] == "Pending"
    [cond] = got["b"]["conditions"]
    assert (cond["type"], cond["reason"], cond["message"]) == (
        "Unschedulable", "QueueFull", "<QueueFull>")  # held 2 + a's 2 fill q's 4
    assert got["c"]["phase"] == "Inqueue"
    assert got["d"]["conditions"][0]["reason"] == "NotEnoughResources"  # 8 > 6 - 2 - 2
    assert (got["run"]["phase"], got["run"]["running"]) == ("Running", 2)


def test_volcano_without_podgroups_writes_nothing() -> None:
    assert volcano.status_patches(StatusModel(), words, NOW) == []


# ---------------------------------------------------------------------------- upstream


def upg(name: str, condition: Condition | None = None, managers: tuple[str, ...] = ("lockstep",),
        error: InvalidGang | None = None) -> UpstreamPodGroup:
    return UpstreamPodGroup(gang_key("default", name), "v1beta1", GroupPolicy(2), error,
                            condition, managers if condition else (), 3)


def test_upstream_condition_from_a_hand_built_model() -> None:
    """Scheduled once minCount members are bound; Unschedulable with the core's reason;
    SchedulerError for an invalid declaration; nothing where the condition already says so
    or another field manager wrote it."""
    keys = {n: gang_key("default", n) for n in ("done", "stuck", "bad", "same", "theirs")}
    nofit = NotEnoughMinResources(keys["stuck"], {GPU: 8}, {GPU: 2})
    invalid = InvalidDeclaration(InvalidGang(keys["bad"], "spec.x", "1", "wrong"))
    same = Condition("PodGroupInitiallyScheduled", "False", "Unschedulable",
                     "<NotEnoughMinResources>", "2026-01-01T00:00:00Z")
    model = StatusModel(
        gangs={
            keys["done"]: GangStatusModel(keys["done"], Source.UPSTREAM, 2,
                                          MemberCounts(total=2, bound=2)),
            keys["stuck"]: GangStatusModel(keys["stuck"], Source.UPSTREAM, 2, reason=nofit),
            keys["bad"]: GangStatusModel(keys["bad"], None, None, reason=invalid),
            keys["same"]: GangStatusModel(keys["same"], Source.UPSTREAM, 2, reason=nofit),
            keys["theirs"]: GangStatusModel(keys["theirs"], Source.UPSTREAM, 2, reason=nofit),
        },
        upstream={keys["done"]: upg("done"), keys["stuck"]: upg("stuck"),
                  keys["bad"]: upg("bad"), keys["same"]: upg("same", same),
                  keys["theirs"]: upg("theirs", same, ("kube-scheduler",))},
    )
    patches = upstream.status_patches(model, words, NOW)
    assert all(p.strategic and not p.remembered for p in patches)
    got = {k: v["conditions"][0] for k, v in by_path(patches).items()}
    assert set(got) == {"done", "stuck", "bad"}
    assert (got["done"]["status"], got["done"]["reason"]) == ("True", "Scheduled")
    assert got["done"]["message"] == "2/2 members bound together by Lockstep"
    assert (got["stuck"]["status"], got["stuck"]["reason"], got["stuck"]["message"]) == (
        "False", "Unschedulable", "<NotEnoughMinResources>")
    assert (got["bad"]["reason"], got["bad"]["observedGeneration"]) == ("SchedulerError", 3)


# ---------------------------------------------------------------------------- the core's side


def test_the_core_builds_the_model_of_gangs_with_an_object_only() -> None:
    """A gang declared on its pods alone has no object to write to: it is not counted. A
    PodGroup's gang is, with its members counted as the cluster shows them; and the model
    is a snapshot: an object that comes later is not in it."""
    core = cluster(node("n0").gpus(8).build())
    core.upsert(ingest.SP_PODGROUPS, podgroup_from_json(podgroup("sp", 2)))
    add(core,
        *(pod(f"sp-{i}").label("scheduling.x-k8s.io/pod-group", "sp").gpu(1)
          .on("n0").build() for i in range(2)),
        *(pod(f"own-{i}").gang("own", min_member=2).gpu(1).build() for i in range(2)))
    model = core.queries.status_model()
    assert set(model.gangs) == {gang_key("default", "sp")}
    g = model.gangs[gang_key("default", "sp")]
    assert (g.source, g.min_member, g.members) == (
        Source.SCHEDULER_PLUGINS, 2,
        MemberCounts(total=2, scheduled=2, placed=2, bound=2, running=2))
    assert model.queues is None and model.free == {}  # no Volcano PodGroup: not summed
    core.upsert(ingest.SP_PODGROUPS, podgroup_from_json(podgroup("later", 1)))
    assert gang_key("default", "later") not in model.objects[Source.SCHEDULER_PLUGINS]


def test_a_partly_bound_scheduler_plugins_gang_says_so_in_its_status() -> None:
    """A binding the API refused for good after its siblings bound: the core's model carries
    the partial gang, and the PodGroup's status shows GangPartiallyBound (never hidden)."""
    core = cluster(*(node(f"n{i}").gpus(1).build() for i in range(2)))
    core.upsert(ingest.SP_PODGROUPS, podgroup_from_json(podgroup("g", 2)))
    add(core, *(pod(f"p{i}").label("scheduling.x-k8s.io/pod-group", "g").gpu(1).build()
                for i in range(2)))
    where = {}
    for i in range(2):
        p = core.queries.pod(pod_key("default", f"p{i}"))
        assert p is not None
        [where[i]] = core.filter(p, sorted(core.queries.nodes), 0.0).passed
    assert isinstance(core.bind(pod_key("default", "p0"), where[0], 1.0), Park)
    assert isinstance(core.bind(pod_key("default", "p1"), where[1], 1.0), BindGroup)
    report = core.bind_outcomes([
        Bound(pod_key("default", "p0"), NodeName(where[0])),
        BindFailed(pod_key("default", "p1"), NodeName(where[1]), "403 forbidden",
                   permanent=True)])
    assert isinstance(report, PartiallyBound)
    model = core.queries.status_model()
    assert model.gangs[gang_key("default", "g")].partial == report
    [patch] = scheduler_plugins.status_patches(model, words, NOW)
    assert patch.status["conditions"][0]["type"] == "GangPartiallyBound"


def test_volcano_gangs_are_in_the_model_with_what_they_hold_in_their_queue() -> None:
    core = cluster(node("n0").gpus(8).build())
    core.upsert(ingest.VOLCANO_PODGROUPS, volcano_podgroup_from_json(vpg("v", 2)))
    add(core, *(pod(f"v-{i}").annotate("scheduling.k8s.io/group-name", "v").gpu(1)
                .on("n0").build() for i in range(2)))
    model = core.queries.status_model()
    g = model.gangs[gang_key("default", "v")]
    assert (g.queue, g.allocated[GPU], [r[GPU] for r in g.requests]) == ("default", 2, [1, 1])
    assert model.free[GPU] == 6  # 8 GPUs, 2 of them bound
