"""The members of a gang pinned at creation together are counted as one batch
(``ingest.upsert_pods`` from ``creation.placer``): each gang they touch is decided once, not
once per member, and a member declaring alike the review (resolved already) is not resolved
again.

The proof is a comparison: the same reviews, watch events and time, in the same order,
through a core as shipped and through a core that upserts every pinned member on its own
(``ingest.upsert_pod`` one after another, resolving each, as the placer did before), must
leave the same state (gangs, memberships, pods, the ledger, plans, held reviews, what was
answered and queued) after every step."""

from __future__ import annotations

import copy
import random
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coscheduling import (
    BindGroup,
    BindNow,
    Coscheduler,
    NodeName,
    PinAtCreation,
    Settings,
    node_from_json,
    pod_from_json,
    pod_key,
    podgroup_from_json,
)
from coscheduling.actions import Bound
from coscheduling.corestate import CoreState
from coscheduling.creation import placer as placer_module
from coscheduling.events import ingest
from coscheduling.events import ingest as ingest_module
from coscheduling.gang.gating import pinned_terms
from coscheduling.podgroup import Membership
from coscheduling.records import PodKey, PodRecord
from tests.builders import node, pod, podgroup
from tests.internals import state_of
from tests.unit.coscheduling.events.test_status_events import snapshot as core_snapshot

NODES = [f"n{i}" for i in range(3)]
GANGS = ["g0", "g1", "pg"]
"""Two gangs declared by annotations, one by a scheduler-plugins PodGroup (whose minMember
can change while its reviews are held)."""
PODS = [f"{g}-{i}" for g in GANGS for i in range(5)]


def one_by_one(st_: CoreState, pods: Sequence[PodRecord],
               known: tuple[PodRecord, Membership] | None = None) -> None:
    """How the placer counted pinned members before: one full upsert each."""
    for p in pods:
        ingest_module.upsert_pod(st_, p)


def snapshot(core: Coscheduler) -> dict[str, Any]:
    s = state_of(core)
    return {
        **core_snapshot(core),
        "holds": {k: (h.spec, h.first, h.until, dict(h.pods)) for k, h in s.creation.holds.items()},
        "provisional": dict(s.creation.pinned),
        "slow": list(s.creation.slow_gangs),
        "plans": core.queries.plans(),
        "answers": dict(s.creation.answers),
    }


class Twin:
    """One sequence of steps on two cores: ``batch`` as shipped, ``single`` with the
    pinned members upserted one by one."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch
        self.batch = Coscheduler(Settings(backoff_seconds=10))
        self.single = Coscheduler(Settings(backoff_seconds=10))
        self.objs: dict[str, dict[str, Any]] = {}
        self.pins: dict[str, PinAtCreation] = {}
        self.rv = 100
        self.now = 0.0
        self.batched = 0
        for n in NODES:
            for core in (self.batch, self.single):
                core.upsert(ingest.NODES, node_from_json(node(n).gpus(4).build()))
        real = ingest_module._counted_again

        def counted(st_: CoreState, p: PodRecord, m: Membership) -> Any:
            g = real(st_, p, m)
            self.batched += g is not None
            return g

        monkeypatch.setattr(ingest_module, "_counted_again", counted)

    def both(self, what: Any) -> Any:
        out = what(self.batch)
        with self.monkeypatch.context() as m:
            m.setattr(placer_module, "upsert_pods", one_by_one)
            again = what(self.single)
        assert out == again
        assert snapshot(self.batch) == snapshot(self.single)
        return out

    def review(self, name: str, size: int, gpus: int, now: float) -> None:
        gang = name.split("-")[0]
        b = pod(name).gpu(gpus)
        if gang == "pg":
            b = b.label("scheduling.x-k8s.io/pod-group", "pg")
        else:
            b = b.gang(gang, size, timeout=30)
        obj = b.build()
        obj["metadata"].pop("uid", None)
        self.objs[name] = obj
        placed = self.both(lambda core: core.place_at_creation(pod_from_json(obj), now))
        answers = {k.split("/", 1)[1]: a for k, a in
                   self.batch.drain().answers.items()}
        self.single.drain()
        answers[name] = placed
        for n, a in answers.items():
            if isinstance(a, PinAtCreation):
                self.pins[n] = a

    def watch(self, name: str, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.rv)
        obj["metadata"]["uid"] = f"u-{name}-{self.rv}"
        self.objs[name] = obj
        self.both(lambda core: core.upsert_pod(pod_from_json(obj)))


def _step(t: Twin, op: tuple[int, int, int]) -> None:
    kind, i, x = op
    t.now += 0.05 + (x * 0.2 if kind == 3 else 0.0)  # a burst's reviews, or up to 12 s
    now = t.now
    name = PODS[i % len(PODS)]
    key = pod_key("default", name)
    rec = t.batch.queries.pods.get(key)
    if kind == 0:  # reviewed: up to 4 of a gang's members, as a burst's creators call
        gang = name.split("-")[0]
        fresh = [n for n in PODS if n.startswith(gang + "-") and n not in t.objs]
        for n in fresh[:1 + x % 4]:
            t.review(n, 2 + (x % 7 == 0) + (i // 5 == 1), 1 + (x % 5 == 0), now)
    elif kind == 1 and name in t.pins and rec is not None and not rec.uid:  # lands pinned
        obj = t.objs[name]
        t.watch(name, {**obj, "spec": {**obj["spec"], "affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": pinned_terms((), t.pins[name].node)}}}}})
    elif kind == 2 and name in t.objs and rec is None:  # lands as it was (gated, or held)
        obj = t.objs[name]
        t.watch(name, {**obj, "spec": {**obj["spec"],
                                       "schedulingGates": [{"name": "lockstep.dev/gang"}]}})
    elif kind == 3:  # time passes: held reviews, provisional pins, deadlines
        t.both(lambda core: (core.expire_holds(now), core.expire(now), core.admit_gated(now)))
    elif kind == 4 and rec is not None and not rec.uid:  # the webhook takes its pin back
        t.both(lambda core: core.withdraw_creation(key))
    elif kind == 5:  # the PodGroup comes or changes (its held reviews resolve otherwise:
        # another timeout, and the held ones are upserted the full way when pinned)
        pg = podgroup_from_json(podgroup("pg", 2 + x % 2, timeout=30 + 30 * (x % 4 < 2)))
        t.both(lambda core: core.upsert(ingest.SP_PODGROUPS, pg))
    elif kind == 6 and rec is not None and rec.uid:  # deleted
        t.objs.pop(name, None)
        t.pins.pop(name, None)
        t.both(lambda core: core.delete_pod(key, rec.uid))
    elif kind == 7 and rec is not None and rec.uid and rec.node_name is None and not rec.gated:
        def cycle(core: Coscheduler) -> None:  # kube-scheduler's cycle and the binding
            p = core.queries.pods[key]
            core.filter(p, [NodeName(n) for n in NODES], now)
            gang = core.queries.gang_of(key)
            planned = core.queries.plans().get(gang, {}).get(key) if gang is not None else None
            d = core.bind(key, NodeName(planned or NODES[x % 3]), now, p.uid)
            binds = {key: d.node} if isinstance(d, BindNow) else \
                d.binds if isinstance(d, BindGroup) else {}
            if binds:
                pods = core.queries.pods
                core.bind_outcomes([Bound(k, n, pods[k].uid) for k, n in binds.items()])
        t.both(cycle)


KINDS = (0, 0, 0, 0, 1, 1, 2, 3, 3, 4, 5, 6, 7, 7)
"""Reviews most (so quorums complete), pins landing, gated members landing, time passing,
a pin taken back, the PodGroup changing, deletions and scheduling cycles."""
OPS = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, len(PODS) - 1),
                         st.integers(0, 59)), max_size=80)


@settings(max_examples=150, deadline=None)
@given(ops=OPS)
def test_pinned_members_counted_as_a_batch_leave_the_state_one_by_one_leaves(
        ops: list[tuple[int, int, int]]) -> None:
    with pytest.MonkeyPatch.context() as mp:
        t = Twin(mp)
        for op in ops:
            _step(t, op)


def test_seeded_runs_batch_pins_and_leave_the_state_one_by_one_leaves(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Longer runs than hypothesis draws; the runs take the batched way (a check that the
    comparison compares something)."""
    batched = 0
    for seed in range(150):
        r = random.Random(seed)
        with monkeypatch.context() as m:
            t = Twin(m)
            for _ in range(70):
                _step(t, (r.choice(KINDS), r.randrange(len(PODS)), r.randint(0, 59)))
            batched += t.batched
    assert batched > 200


def test_a_gang_of_eight_pinned_together_is_decided_once_and_not_resolved_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The work bound: the review completing a quorum of 8 reconciles its gang once for
    the 8 pins (was 8 times) and resolves none of them again (was 8): they declare alike
    the review, resolved already."""
    core = Coscheduler(Settings())
    for n in NODES:
        core.upsert(ingest.NODES, node_from_json(node(n).gpus(4).build()))
    objs = []
    for i in range(8):
        o = pod(f"w{i}").gang("g", 8, timeout=30).gpu(1).build()
        o["metadata"].pop("uid")
        objs.append(o)
    for o in objs[:7]:
        core.place_at_creation(pod_from_json(o), 0.0)
    reconciled: list[str] = []
    resolved: list[PodKey] = []
    real_reconcile, real_resolve = ingest_module.reconcile, ingest_module.resolve_pod

    def counted_reconcile(st_: CoreState, g: Any) -> None:
        reconciled.append(g.key)
        real_reconcile(st_, g)

    def counted_resolve(st_: CoreState, p: PodRecord) -> Membership:
        resolved.append(p.key)
        return real_resolve(st_, p)

    monkeypatch.setattr(ingest_module, "reconcile", counted_reconcile)
    monkeypatch.setattr(ingest_module, "resolve_pod", counted_resolve)
    placed = core.place_at_creation(pod_from_json(objs[7]), 0.0)
    assert isinstance(placed, PinAtCreation)
    assert all(isinstance(a, PinAtCreation) for a in core.drain().answers.values())
    assert reconciled == ["default/g"]
    assert resolved == []


def test_held_reviews_whose_podgroup_changed_meanwhile_are_counted_the_full_way(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Reviews held while their PodGroup changed resolve to another membership than the
    one they were counted under when the quorum completes: they are upserted the full
    way (the gang decided with each record that changed it), and both cores agree after
    every step."""
    t = Twin(monkeypatch)
    full: list[PodKey] = []
    real = ingest_module._upsert_pod

    def counted(st_: CoreState, p: PodRecord, watched: bool,
                resolved: tuple[Membership] | None) -> None:
        if resolved is not None:
            full.append(p.key)
        real(st_, p, watched, resolved)

    monkeypatch.setattr(ingest_module, "_upsert_pod", counted)
    pg = PODS.index("pg-0")
    _step(t, (5, 0, 3))  # minMember 3, timeout 30
    _step(t, (0, pg, 1))  # pg-0, pg-1 held
    _step(t, (5, 0, 1))  # minMember 3, timeout 60: the held ones now resolve otherwise
    _step(t, (0, pg, 0))  # pg-2 completes the quorum
    assert sorted(t.pins) == ["pg-0", "pg-1", "pg-2"]
    # Counted under the gang's spec as first held (timeout 30), each now declares another:
    # pg-2 too, the review itself (the gang's spec stands for the quorum it completes).
    assert sorted(full) == [pod_key("default", f"pg-{i}") for i in range(3)]
    assert t.batched == 0
