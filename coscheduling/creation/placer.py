"""Placement at creation: the webhook's question "pin this member now, or gate it?".

Every gated member costs one pod update when its gate comes off (the lift and pin), an
update the peers never make. Lockstep's webhook runs in the process that holds the cache and
the ledger, so when a member is created it can answer at once. A pin is required node
affinity set at creation: it can never be taken off an existing pod, so Lockstep pins only
on nodes chosen once the gang's **quorum exists** (its members that exist, plus members whose
reviews the webhook is answering right now). A gang that times out or backs off later is then
tied only to nodes planned for a whole quorum, never to nodes chosen for its first member:

* its gang, with the members that exist, the members under review and this one, **meets its
  quorum** and fits now (and no higher-priority pod being placed needs the room): the whole
  plan is reserved, every member under review is **pinned**, the held ones are lifted;
* its gang does not meet its quorum yet but its members are being created together (a
  burst: a Job's or a benchmark's creators in parallel): the review is **held**
  (:class:`AwaitQuorum`) for up to ``HOLD_SECONDS`` after the gang's latest review, at most
  ``HOLD_MAX_SECONDS`` in all, waiting for the reviews that complete the quorum; when the
  window closes without it, every held review is gated and the gang is remembered as created
  slowly (its later members are gated at once, not held);
* anything else: it is **gated**, as before, and lifted when its gang is admitted.

Nothing is reserved for a review that is held: no slot, no gang, no placeholder, so a
review of a member of a gang of ten million costs what one of a gang of two does (and one
whose quorum is beyond ``HOLD_LIMIT`` is gated at once). A member that disagrees with its
gang on ``minMember`` is gated and counts for nothing: the gang is what its first members
(or its PodGroup) say, as the filter verb answers such a member too. That holds for reviews
already held when the gang came into being saying otherwise: they are gated then, never
pinned into its quorum (a gang's ``minMember`` never comes from a pod that may never land).

Promises kept: a member pinned at creation that the watch has not shown within
``PIN_LANDING_SECONDS`` (its creation failed, or was refused by a later webhook) is taken out
again, which gives the gang's slots back (:func:`expire_pins`); a held review whose pod
appears in the watch (the API server gave up on the webhook and created it as it was) is no
longer held; nothing is evicted for a gang planned at creation; a pod carrying another
party's scheduling gate, a pod without a name yet (``generateName``) and a gang group are
gated.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace

from ..actions import Answer, AwaitQuorum, GateAtCreation, PinAtCreation, Placement
from ..corestate import CoreState
from ..events.ingest import delete_pod, upsert_pods
from ..gang.admission import try_admit
from ..gang.gating import pinned_node, pinned_terms
from ..gang.membership import countable, meets_quorum, resolve_pod
from ..podgroup import GangKey, GangSpec
from ..records import NodeName, PodKey, PodRecord
from ..state.gang import Gang, GangPhase
from .state import Hold

__all__ = ["HOLD_LIMIT", "HOLD_MAX_SECONDS", "HOLD_SECONDS", "PIN_LANDING_SECONDS",
           "drain_answers",
           "expire_holds", "expire_pins", "landed", "next_hold_deadline",
           "next_pin_deadline", "pinned_at_creation", "place_at_creation",
           "release_hold", "withdraw"]

PIN_LANDING_SECONDS = 10.0
"""How long a member pinned at creation may take to appear in the watch before its slot is
given back (the API server answers a create in milliseconds; the watch follows)."""
HOLD_SECONDS = 0.4
"""How long a held review waits for the next review of its gang: members created together
arrive within milliseconds of each other (tens of them on an API server under load); a
creator that waits for each create to return (one at a time) never sends the next while
this one is held, and pays this once per gang (its gang is then remembered as slow)."""
HOLD_MAX_SECONDS = 1.0
"""The longest any review is held, well under the webhook's ``timeoutSeconds`` (2 s in
``deploy/webhook/``): past that the API server would create the pod as it was."""
HOLD_LIMIT = 256
"""Reviews held for one gang at most, and the largest number of members a gang may still
miss for its review to be held: a bigger quorum is gated at once (no work per member)."""
HELD_TOTAL = 2048
"""Reviews held over all gangs at most (the API server's own concurrency is far lower)."""
SLOW_REMEMBERED = 4096
"""Gangs remembered as created slowly (their reviews are gated at once, not held)."""


def place_at_creation(st: CoreState, pod: PodRecord, now: float) -> Placement:
    """Decide for ``pod`` (the object as the API server is about to create it) and, when
    pinned, count it at once as a member holding its slot. Answers for other held reviews
    decided here wait in :func:`drain_answers`."""
    if not pod.name:
        return GateAtCreation("no name yet (generateName): its slot could not be named")
    if pod.node_name is not None or pod.other_gate:
        return GateAtCreation("another party holds it back (a scheduling gate of its own)")
    if pod.key in st.store.pods or _held_gang(st, pod.key) is not None:
        return GateAtCreation(f"a pod named {pod.key} exists already")
    m = resolve_pod(st, pod)
    if not isinstance(m, GangSpec):
        return GateAtCreation("no usable gang declaration yet (its PodGroup, say)")
    if m.parts or m.group:
        return GateAtCreation("a member of a gang group: planned when its gangs exist")
    # As the API server is about to create it: no UID, no version, not held (a review's
    # record always is; copying it, once per member, only to say so cost a tenth of this).
    rec = pod if not pod.uid and not pod.gated and not pod.resource_version \
        else replace(pod, uid="", gated=False, resource_version=0)
    g = st.gangs.get(m.key)
    spec = g.spec if g is not None else None
    hold = _agreeing_hold(st, m.key, spec)
    if spec is None:
        spec = hold.spec if hold is not None else m
    if spec.min_member != m.min_member:
        return GateAtCreation(
            f"members of the gang disagree on minMember: this one says {m.min_member}, "
            f"the gang {spec.min_member} (the gang's stands; this member counts for "
            "nothing until it agrees)")
    if g is not None and g.phase is not GangPhase.WAITING:
        return GateAtCreation(f"its gang is {g.phase.value}: planned by the gang")
    live = st.live(g) if g is not None else []
    under_review = list(hold.pods.values()) if hold is not None else []
    if meets_quorum(st, spec, countable(spec, [*live, *under_review, rec])):
        return _admit_quorum(st, g, spec, rec, m, now)
    return _hold(st, spec, rec, len(live) + len(under_review) + 1, now)


def _agreeing_hold(st: CoreState, key: GangKey, spec: GangSpec | None) -> Hold | None:
    """The reviews held for gang ``key``, when they agree with its gang's ``spec``.

    Reviews held before the gang existed agree with the first held one; the gang may since
    have come from a member the watch showed that declares another ``minMember``. Those held
    reviews then disagree with their gang: they are gated now, counting for nothing, and are
    never pinned into its quorum, since a pinned member's ``minMember`` could become the
    gang's while its pod may never land (a core rebuilt from the API server would differ).
    """
    hold = st.creation.holds.get(key)
    if hold is None or spec is None or hold.spec.min_member == spec.min_member:
        return hold
    del st.creation.holds[key]
    _answer(st, list(hold.pods), GateAtCreation(
        f"members of the gang disagree on minMember: this one says {hold.spec.min_member}, "
        f"the gang {spec.min_member} (the gang's stands; this member counts for nothing "
        "until it agrees)"))
    return None


def _hold(st: CoreState, spec: GangSpec, rec: PodRecord, have: int, now: float
          ) -> Placement:
    """Hold ``rec``'s review for the reviews that complete its gang's quorum, or gate it."""
    key = spec.key
    if key in st.creation.slow_gangs:
        return GateAtCreation("its gang's members are created one at a time: gated until "
                              "its quorum exists")
    missing = spec.min_member - have
    held_now = sum(len(h.pods) for h in st.creation.holds.values())
    hold = st.creation.holds.get(key)
    if missing > HOLD_LIMIT or held_now >= HELD_TOTAL \
            or (hold is not None and len(hold.pods) >= HOLD_LIMIT):
        return GateAtCreation(f"its gang misses {missing} members: more than the "
                              f"{HOLD_LIMIT} a review waits for")
    if hold is None:
        hold = st.creation.holds[key] = Hold(spec, now, now)
    hold.pods[rec.key] = rec
    hold.until = min(hold.first + HOLD_MAX_SECONDS, now + HOLD_SECONDS)
    return AwaitQuorum(key, hold.until)


def _admit_quorum(st: CoreState, g: Gang | None, spec: GangSpec, rec: PodRecord,
                  m: GangSpec, now: float) -> Placement:
    """The quorum exists (members, reviews held and ``rec``): plan the gang whole now.
    ``m``: the membership ``rec`` declares, resolved by this review."""
    hold = st.creation.holds.pop(spec.key, None)
    st.creation.slow_gangs.pop(spec.key, None)  # a job recreated under its name may come in a burst
    reviews = [*(hold.pods.values() if hold is not None else ()), rec]
    created = g is None
    if g is None:
        g = st.gangs[spec.key] = Gang(spec.key, st.ledger)
    for r in reviews:
        _enter(st, g, spec, r)
    if g.spec is None:
        g.spec = spec
    outcome = try_admit(st, g, g.spec, st.live(g), now, may_preempt=False)
    if not isinstance(outcome, dict):
        for r in reviews:
            _leave(st, g, r.key)
        if created or not g.members:
            _drop_if_empty(st, g)
        gate = GateAtCreation(
            f"its gang cannot be admitted now ({type(outcome).__name__})", outcome)
        _answer(st, [r.key for r in reviews if r.key != rec.key], gate)
        return gate
    mine: Answer = GateAtCreation("its gang was admitted with the members that exist; "
                                     "an extra")
    pins: list[PodRecord] = []
    for r in reviews:
        node = outcome.get(r.key)
        if node is None:
            # The plan left it out (an extra beyond the quorum): gated like any other.
            _leave(st, g, r.key)
            placed: Answer = GateAtCreation("an extra beyond its gang's plan")
        else:
            pins.append(_pin(st, r, node, now))
            placed = PinAtCreation(node, g.key)
        if r.key == rec.key:
            mine = placed
        else:
            st.creation.answers[r.key] = placed
    # The arrivals' bookkeeping, as if the watch had shown them, the gang decided once for
    # all of them. ``m`` is what this review resolved against the objects as they are:
    # nothing since (holds, entries, the plan) changed them, so it is every pinned
    # record's that declares alike (``rec``'s own pinned record does; a held review
    # counted under a PodGroup that changed since resolves to the new one).
    upsert_pods(st, pins, (rec, m))
    return mine


def _answer(st: CoreState, keys: list[PodKey], placed: Answer) -> None:
    for key in keys:
        st.creation.answers[key] = placed


def drain_answers(st: CoreState) -> dict[PodKey, Answer]:
    """Answers decided for held reviews since the last drain (the webhook sends them)."""
    out, st.creation.answers = st.creation.answers, {}
    return out


def next_hold_deadline(st: CoreState) -> float | None:
    return min((h.until for h in st.creation.holds.values()), default=None)


def expire_holds(st: CoreState, now: float) -> None:
    """Gangs whose window closed without their quorum: their held reviews are gated (see
    :func:`drain_answers`), and the gang is remembered as created slowly."""
    for key in [k for k, h in st.creation.holds.items() if now >= h.until]:
        hold = st.creation.holds.pop(key)
        _remember_slow(st, key)
        _answer(st, list(hold.pods), GateAtCreation(
            f"its quorum of {hold.spec.min_member} did not exist within "
            f"{HOLD_MAX_SECONDS:g} s of its first review: gated until it does"))


def release_hold(st: CoreState, key: PodKey) -> None:
    """The review of ``key`` is held no more: answered elsewhere (the webhook call was given
    up on), or its pod appeared in the watch."""
    gang = _held_gang(st, key)
    if gang is not None:
        hold = st.creation.holds[gang]
        hold.pods.pop(key, None)
        if not hold.pods:
            del st.creation.holds[gang]


def landed(st: CoreState, key: PodKey) -> None:
    """The watch shows ``key``: a review still held for it was answered without Lockstep
    (the API server gave up on the call and created the pod as it was)."""
    if st.creation.holds:
        release_hold(st, key)


def _held_gang(st: CoreState, key: PodKey) -> GangKey | None:
    for gang, hold in st.creation.holds.items():
        if key in hold.pods:
            return gang
    return None


def _remember_slow(st: CoreState, key: GangKey) -> None:
    slow: OrderedDict[GangKey, None] = st.creation.slow_gangs
    slow[key] = None
    slow.move_to_end(key)
    while len(slow) > SLOW_REMEMBERED:
        slow.popitem(last=False)


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


def _pin(st: CoreState, rec: PodRecord, node: NodeName, now: float) -> PodRecord:
    """``rec`` pinned to ``node``, counted as pinned until the watch shows it (the caller counts
    it: :func:`~coscheduling.events.ingest.upsert_pods`)."""
    st.creation.pinned[rec.key] = now + PIN_LANDING_SECONDS
    return replace(rec, required_affinity=tuple(pinned_terms(rec.required_affinity, node)))


def withdraw(st: CoreState, key: PodKey) -> None:
    """The webhook took back a pin it gave (the pod came back with another party's gate):
    the member is no longer counted until the watch shows it."""
    if st.creation.pinned.pop(key, None) is not None:
        pod = st.store.pods.get(key)
        if pod is not None and not pod.uid:
            delete_pod(st, key)


def pinned_at_creation(st: CoreState, key: PodKey) -> NodeName | None:
    """The node ``key`` was pinned to at creation, while the watch has not shown it yet
    (what the webhook checks when the API server reinvokes it for the same pod)."""
    if key not in st.creation.pinned:
        return None
    slot = st.ledger.get(key)
    if slot is not None:
        return slot.node
    # Its gang gave its room back meanwhile (a sibling's pin was taken back, say): the pod
    # still carries the pin, and the webhook must still recognise it to take it off.
    pod = st.store.pods.get(key)
    node = pinned_node(pod.required_affinity) if pod is not None else None
    return NodeName(node) if node is not None else None


def next_pin_deadline(st: CoreState) -> float | None:
    return min(st.creation.pinned.values(), default=None)


def expire_pins(st: CoreState, now: float) -> list[PodKey]:
    """Members pinned at creation the watch never showed: taken out, slots given back."""
    late = [k for k, t in st.creation.pinned.items() if now >= t]
    for key in late:
        withdraw(st, key)
    return late
