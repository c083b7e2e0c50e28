"""Placement at creation: the webhook's question "pin this member now, or gate it?".

Every gated member costs one pod update when its gate comes off (the lift and pin), an
update the peers never make. Lockstep's webhook runs in the process that holds the cache and
the ledger, so when a member is created it can answer at once:

* its gang is ADMITTED and an expected member of its shape holds a slot
  (``coscheduling.expected``): the member takes that slot and is **pinned at creation**;
* its gang is WAITING and can be admitted now (the members that exist, this one, and, when
  the members are alike, expected copies of it up to ``minMember``): the whole plan is
  reserved and this member is pinned; held members are lifted as before;
* anything else: it is **gated**, as before, and lifted when its gang is admitted.

The pinned pod reaches the API server with the required node affinity the lift would have
written and no gate, so kube-scheduler filters one node for it and there is no extra write.

Promises kept: a member pinned at creation that the watch has not shown within
``PROVISIONAL_SECONDS`` (its creation failed, or was refused by a later webhook) is taken out
again, which gives the gang's slots back (:func:`expire_provisional`); nothing is evicted for
a gang planned at creation (preemption waits for its members to exist); a pod carrying
another party's scheduling gate, a pod without a name yet (``generateName``), a gang group
and a gang whose members are not alike are gated.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .admission import reconcile, try_admit
from .expected import adopt, expect, forget, shape
from .gang import Gang, GangPhase
from .gating import pinned_terms
from .ingest import delete_pod, upsert_pod
from .membership import countable, resolve_pod
from .podgroup import GangKey, GangSpec
from .reasons import GangReason
from .records import NodeName, PodKey, PodRecord
from .state import CoreState

__all__ = ["PROVISIONAL_SECONDS", "GateAtCreation", "PinAtCreation", "expire_provisional",
           "next_provisional_deadline", "pinned_at_creation", "place_at_creation", "withdraw"]

PROVISIONAL_SECONDS = 10.0
"""How long a member pinned at creation may take to appear in the watch before its slot is
given back (the API server answers a create in milliseconds; the watch follows)."""


@dataclass(frozen=True, slots=True)
class PinAtCreation:
    """Create the pod pinned to ``node``, without Lockstep's gate."""

    node: NodeName
    gang: GangKey


@dataclass(frozen=True, slots=True)
class GateAtCreation:
    """Create the pod behind Lockstep's gate; ``why`` says why it could not be placed
    (``reason``: the gang's reason, when admission said no)."""

    why: str
    reason: GangReason | None = None


Placement = PinAtCreation | GateAtCreation


def place_at_creation(st: CoreState, pod: PodRecord, now: float) -> Placement:
    """Decide for ``pod`` (the object as the API server is about to create it) and, when
    pinned, count it at once as a member holding its slot."""
    if not pod.name:
        return GateAtCreation("no name yet (generateName): its slot could not be named")
    if pod.node_name is not None or pod.gated:
        return GateAtCreation("another party holds it back (a scheduling gate of its own)")
    if pod.key in st.store.pods:
        return GateAtCreation(f"a pod named {pod.key} exists already")
    m = resolve_pod(st, pod)
    if not isinstance(m, GangSpec):
        return GateAtCreation("no usable gang declaration yet (its PodGroup, say)")
    if m.parts or m.group:
        return GateAtCreation("a member of a gang group: planned when its gangs exist")
    rec = replace(pod, uid="", held=False, resource_version=0)
    g = st.gangs.get(m.key)
    if g is not None and g.phase is GangPhase.ADMITTED:
        return _take_expected_slot(st, g, m, rec, now)
    if g is not None and g.phase is not GangPhase.WAITING:
        return GateAtCreation(f"its gang is {g.phase.value}")
    return _admit_now(st, g, m, rec, now)


def _take_expected_slot(st: CoreState, g: Gang, m: GangSpec, rec: PodRecord,
                        now: float) -> Placement:
    _enter(st, g, m, rec)
    node = adopt(st, g, rec)
    if node is None:
        _leave(st, g, rec.key)
        if any(k in st.expected for k in g.members):
            # The plan assumed members like the first; this one is not: plan the gang
            # again from the members that exist (it waits for them, gated, holding nothing).
            forget(st, g)
            reconcile(st, g)
        return GateAtCreation("its gang is admitted and holds no slot of its shape")
    return _pin(st, g, rec, node, now)


def _admit_now(st: CoreState, g: Gang | None, m: GangSpec, rec: PodRecord,
               now: float) -> Placement:
    if g is None:
        g = st.gangs[m.key] = Gang(m.key, st.ledger)
    live = st.live(g)
    missing = m.min_member - len(countable(m, [*live, rec]))
    if missing > 0 and (unlike := _unlike(m, live, rec)) is not None:
        _drop_if_empty(st, g)
        return GateAtCreation(unlike)
    _enter(st, g, m, rec)
    expected = expect(st, g, rec, m, missing) if missing > 0 else []
    if g.spec is None:
        g.spec = m
    outcome = try_admit(st, g, g.spec, st.live(g), now, may_preempt=False)
    if not isinstance(outcome, dict):
        forget(st, g, expected)
        _leave(st, g, rec.key)
        _drop_if_empty(st, g)
        return GateAtCreation(f"its gang cannot be admitted now ({type(outcome).__name__})",
                              outcome)
    if rec.key not in outcome:
        # The members that exist made the quorum and the plan left this one out: the gang
        # is admitted with them, and this one is an extra, gated like any other.
        _leave(st, g, rec.key)
        return GateAtCreation("its gang was admitted with the members that exist; an extra")
    return _pin(st, g, rec, outcome[rec.key], now)


def _unlike(m: GangSpec, live: list[PodRecord], rec: PodRecord) -> str | None:
    """Why the members not created yet cannot be taken to be like ``rec``, or None."""
    if any(shape(p) != shape(rec) for p in live):
        return "its members are not alike: planned once they all exist"
    for k, v in m.min_resources.items():
        if v != m.min_member * rec.requests.get(k, 0):
            return (f"minResources {k}={v} is not minMember x this member's request: "
                    "planned once its members exist")
    return None


def _enter(st: CoreState, g: Gang, m: GangSpec, rec: PodRecord) -> None:
    """Count ``rec`` as a member for planning (no bookkeeping of a real arrival yet)."""
    st.store.put_pod(rec)
    st.membership[rec.key] = m
    g.members.add(rec.key)


def _leave(st: CoreState, g: Gang, key: PodKey) -> None:
    g.drop_slot(key)
    g.members.discard(key)
    st.membership.pop(key, None)
    st.store.drop_pod(key)


def _drop_if_empty(st: CoreState, g: Gang) -> None:
    if not g.members and not g.plan and g.phase is GangPhase.WAITING:
        st.gangs.pop(g.key, None)


def _pin(st: CoreState, g: Gang, rec: PodRecord, node: NodeName, now: float) -> Placement:
    pinned = replace(rec, required_affinity=tuple(pinned_terms(rec.required_affinity, node)))
    st.provisional[rec.key] = now + PROVISIONAL_SECONDS
    upsert_pod(st, pinned)  # the arrival's bookkeeping, as if the watch had shown it
    return PinAtCreation(node, g.key)


def withdraw(st: CoreState, key: PodKey) -> None:
    """The webhook took back a pin it gave (the pod came back with another party's gate):
    the member is no longer counted until the watch shows it."""
    if st.provisional.pop(key, None) is not None:
        pod = st.store.pods.get(key)
        if pod is not None and not pod.uid:
            delete_pod(st, key)


def pinned_at_creation(st: CoreState, key: PodKey) -> NodeName | None:
    """The node ``key`` was pinned to at creation, while the watch has not shown it yet
    (what the webhook checks when the API server reinvokes it for the same pod)."""
    if key not in st.provisional:
        return None
    slot = st.ledger.get(key)
    return slot.node if slot is not None else None


def next_provisional_deadline(st: CoreState) -> float | None:
    return min(st.provisional.values(), default=None)


def expire_provisional(st: CoreState, now: float) -> list[PodKey]:
    """Members pinned at creation the watch never showed: taken out, slots given back."""
    late = [k for k, t in st.provisional.items() if now >= t]
    for key in late:
        withdraw(st, key)
    return late
