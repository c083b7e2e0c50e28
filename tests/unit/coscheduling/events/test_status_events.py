"""A watch event that only reports a bound member running (phase, startTime) is stored
without re-deciding its gang (``ingest.upsert_pod``, ``records.status_only``).

The proof is a comparison: the same events, in the same order, through a core that takes
every event the full way, must leave the same state (gangs, memberships, pods, the ledger,
the waiting map, what the core queued) as the core that takes the short way."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coscheduling import (
    BindGroup,
    BindNow,
    Coscheduler,
    NodeName,
    Settings,
    node_from_json,
    pod_from_json,
    pod_key,
)
from coscheduling.actions import Bound
from coscheduling.corestate import CoreState
from coscheduling.events import ingest
from coscheduling.events import ingest as ingest_module
from coscheduling.gang import membership
from coscheduling.podgroup import Membership
from coscheduling.records import PodKey, PodRecord, status_only
from tests.builders import node, pod
from tests.internals import state_of

NODES = [f"n{i}" for i in range(3)]
PODS = [f"g{g}-{i}" for g in range(2) for i in range(4)]


def snapshot(core: Coscheduler) -> dict[str, Any]:
    """Everything the gang rules keep, and what they queued (read in place, not drained: a
    held review's answer stays for the caller that waits for it)."""
    s = state_of(core)
    return {
        "gangs": {k: (g.phase, dict(g.plan), set(g.binding), set(g.members), g.spec,
                      g.reason, dict(g.told), set(g.turned_away))
                  for k, g in s.gangs.items()},
        "membership": dict(s.membership),
        "pods": {k: (p, p.resource_version) for k, p in s.store.pods.items()},
        "used": copy.deepcopy(s.store.used),
        "epoch": s.store.epoch,
        "ledger": {k: s.ledger.get(k) for k in s.store.pods},
        "waiting": {k: s.waiting.node(k) for k in s.store.pods},
        "assumed": dict(s.assumed),
        "held_touched": set(s.creation.gated.touched),
        "pending_plain": dict(s.plain.pending),
        "queued": (list(s.outbox.notices), set(s.outbox.requeue), list(s.outbox.unparked),
                   set(s.outbox.lift)),
        "next_deadline": core.queries.next_deadline(),
    }


class Twin:
    """One sequence of events, applied to two cores: ``fast`` as shipped, ``full`` with
    the short way turned off."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch
        self.fast = Coscheduler(Settings(backoff_seconds=10))
        self.full = Coscheduler(Settings(backoff_seconds=10))
        self.objs: dict[str, dict[str, Any]] = {}
        self.rv = 100
        self.short_ways = 0
        for n in NODES:
            for core in (self.fast, self.full):
                core.upsert(ingest.NODES, node_from_json(node(n).gpus(4).build()))

    def both(self, what: Any) -> None:
        """``what(core)`` on each core; the full one never takes the short way."""
        what(self.fast)
        with self.monkeypatch.context() as m:
            m.setattr(ingest_module, "status_only", lambda old, new: False)
            m.setattr(ingest_module, "declares_alike", lambda old, new: False)
            what(self.full)
        assert snapshot(self.fast) == snapshot(self.full)

    def watch(self, name: str, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.objs[name] = obj
        rec = pod_from_json(obj)
        old = self.fast.queries.pods.get(rec.key)
        if old is not None and old.uid == rec.uid and status_only(old, rec):
            self.short_ways += 1
        self.both(lambda core: core.upsert_pod(pod_from_json(obj)))


def _step(t: Twin, op: tuple[int, int, int], now: float) -> None:
    kind, i, x = op
    name = PODS[i % len(PODS)]
    key = pod_key("default", name)
    obj = t.objs.get(name)
    rec = t.fast.queries.pods.get(key)
    if kind == 0 and obj is None:  # created
        gang = name.split("-")[0]
        t.watch(name, pod(name).gang(gang, min_member=2 + i // 4).gpu(1).build())
    elif kind == 1 and rec is not None and rec.node_name is None:  # kube-scheduler's cycle
        def cycle(core: Coscheduler) -> None:
            p = core.queries.pods[key]
            core.filter(p, [NodeName(n) for n in NODES], now)
            gang = core.queries.gang_of(key)
            planned = core.queries.plans().get(gang, {}).get(key) if gang is not None else None
            target = planned if planned is not None and x % 5 else NODES[x % len(NODES)]
            d = core.bind(key, NodeName(target), now, p.uid)
            binds = {key: d.node} if isinstance(d, BindNow) else \
                d.binds if isinstance(d, BindGroup) else {}
            if binds:
                pods = core.queries.pods
                core.bind_outcomes([Bound(k, n, pods[k].uid) for k, n in binds.items()])
        t.both(cycle)
    elif kind == 2 and obj is not None and rec is not None and rec.node_name is not None:
        if not obj["spec"].get("nodeName"):  # the watch shows the binding
            t.watch(name, {**obj, "spec": {**obj["spec"], "nodeName": rec.node_name}})
        else:  # the kubelet reports it running: the status-only event
            t.watch(name, {**obj, "status": {
                "phase": "Running", "podIP": f"10.0.0.{x}",
                "startTime": f"2026-11-27T21:{x % 60:02d}:00Z",
                "conditions": [{"type": "Ready", "status": "True"}]}})
    elif kind == 3 and obj is not None:  # a label changes (not status-only)
        t.watch(name, {**obj, "metadata": {**obj["metadata"], "labels": {
            **obj["metadata"].get("labels", {}), "x": str(x)}}})
    elif kind == 6 and obj is not None:  # its declaration changes: resolved again
        ann = dict(obj["metadata"].get("annotations", {}))
        ann["lockstep.dev/min-member"] = str(2 + x % 3)
        if x % 7 == 0:
            ann["lockstep.dev/pod-group"] = "g9"
        t.watch(name, {**obj, "metadata": {**obj["metadata"], "annotations": ann}})
    elif kind == 4 and obj is not None and x % 2:  # it ends
        t.watch(name, {**obj, "status": {"phase": "Succeeded" if x % 4 == 1 else "Failed"}})
    elif kind == 4 and obj is not None:  # deleted
        del t.objs[name]
        t.both(lambda core: core.delete_pod(key, obj["metadata"]["uid"]))
    elif kind == 5:  # time passes: deadlines, backoffs, gated gangs
        t.both(lambda core: (core.expire(now), core.admit_gated(now)))


KINDS = (0, 0, 1, 1, 1, 2, 2, 2, 2, 3, 4, 5, 6)
"""Created, a scheduling cycle, the watch showing it bound or running, relabelled, ended or
deleted, time passing, its gang annotations changed: weighted so that most runs bind gangs
and see them run."""
OPS = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 7), st.integers(0, 59)),
               max_size=80)


@settings(max_examples=150, deadline=None)
@given(ops=OPS)
def test_status_only_events_leave_the_state_the_full_path_leaves(ops: list[tuple[int, int, int]]
                                                                 ) -> None:
    with pytest.MonkeyPatch.context() as mp:
        t = Twin(mp)
        for n, op in enumerate(ops):
            _step(t, op, float(n))


def test_seeded_runs_take_the_short_way_and_leave_the_state_the_full_path_leaves(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Longer runs than hypothesis draws: a member finishing or deleted after its gang ran,
    a gang that loses a member while others run (each must be noticed the full way)."""
    short = 0
    for seed in range(120):
        r = random.Random(seed)
        with monkeypatch.context() as m:
            t = Twin(m)
            for n in range(60):
                _step(t, (r.choice(KINDS), r.randint(0, 7), r.randint(0, 59)), float(n))
            short += t.short_ways
    assert short > 30  # the runs exercise the short way, not only the full one


def test_a_gang_bound_then_running_takes_the_short_way(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    """The burst's sequence (created, bound, running) takes the short way twice per member
    and leaves both cores alike: a check that the comparison above compares something."""
    t = Twin(monkeypatch)
    ops = [(0, i, 0) for i in range(3)] + [(1, i, i) for i in range(3)] \
        + [(2, i, 0) for i in range(3)] + [(2, i, 7) for i in range(3)]
    for n, op in enumerate(ops):
        _step(t, op, float(n))
    # the watch showing Lockstep's own binding (assumed already) is short too
    assert t.short_ways == 6
    keys = [PodKey(pod_key("default", PODS[i])) for i in range(3)]
    pods = t.fast.queries.pods
    assert all(pods[k].phase == "Running" and pods[k].started > 0 for k in keys)
    assert [t.fast.queries.gang_state(g) for g in t.fast.queries.gangs] == ["running"]


def test_a_record_handed_back_to_be_resolved_is_never_short(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """``upsert_pod`` without ``watched`` (a PodGroup came, so its pods are resolved again
    from their stored records) always resolves: the stored record is status-only to itself."""
    t = Twin(monkeypatch)
    for n, op in enumerate([(0, 0, 0), (0, 1, 0), (0, 2, 0), (1, 0, 0), (1, 1, 1),
                            (1, 2, 2), (2, 0, 0)]):
        _step(t, op, float(n))
    key = pod_key("default", PODS[0])
    s = state_of(t.fast)
    calls: list[PodKey] = []
    real = membership.resolve_pod

    def counted(st_: CoreState, p: PodRecord) -> Membership:
        calls.append(p.key)
        return real(st_, p)

    monkeypatch.setattr(ingest_module, "resolve_pod", counted)
    ingest.upsert_pod(s, s.store.pods[key])
    assert calls == [key]
