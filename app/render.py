"""Reasons and decisions into the words people read, in exactly one place.

The same sentence goes into ``FailedAndUnresolvableNodes`` (which kube-scheduler folds into
its FailedScheduling event), into Lockstep's own Events and into the explain endpoint.
"""

from __future__ import annotations

from coscheduling import NoFit, Notice, NoticeKind, format_resources
from coscheduling.reasons import (
    BackingOff,
    BeingPreempted,
    BindTargetGone,
    DevicesNotReady,
    DoesNotFit,
    ExtraMemberWaits,
    HigherPriorityPodsWaiting,
    InvalidDeclaration,
    MembersLost,
    NotEnoughMinResources,
    PartiallyBound,
    PlannedNodeLost,
    PodGroupNotFound,
    PodNotInCache,
    Preempting,
    PreemptionStalled,
    QueueFull,
    QueueNotFound,
    QueueNotOpen,
    Reason,
    ReservedForGangs,
    TimedOut,
    UnknownNode,
    WaitingForMembers,
    WrongNode,
)

__all__ = ["render", "render_nofit", "render_notice"]


def render_nofit(n: NoFit) -> str:
    shape = format_resources(n.shape)
    text = f"needs {n.members} x {shape}, {n.free_units} free outside reservations"
    if n.free_units >= n.members and n.required_level:
        text = (
            f"needs {n.members} x {shape} inside one {n.required_level} "
            f"(topology-required), the best {n.required_level} holds {n.widest_domain_fit}"
        )
    elif n.free_units >= n.members:
        text = f"needs {n.members} x {shape}: capacity exists but not on nodes the members may use"
    if n.notes:
        text += "; " + "; ".join(n.notes)
    return text


def render(reason: Reason) -> str:
    """The reason in words, as Events, ``explain``, conditions and bind answers say it."""
    for part in (_render_placement, _render_binding, _render_queues_and_preemption):
        if (text := part(reason)) is not None:
            return text
    raise AssertionError(f"unrendered reason {reason!r}")


def _render_placement(reason: Reason) -> str | None:
    """Why a gang is not placed: members, declaration, room."""
    match reason:
        case WaitingForMembers(gang, have, need):
            more = need - have
            return f"gang {gang}: {have}/{need} members exist, waiting for {more} more"
        case InvalidDeclaration(err):
            where = f"gang {err.key}: " if err.key else ""
            value = f" {err.value!r}" if err.value else ""
            return f"{where}invalid {err.field}{value}: {err.problem}"
        case PodGroupNotFound(gang, api):
            return f"gang {gang}: PodGroup {gang} ({api}) not found"
        case BackingOff(gang, left, cause):
            why = f" after {render(cause)}" if cause else ""
            return f"gang {gang}: backing off for {left:.0f}s more{why}"
        case DoesNotFit(gang, nofit, reserved_by, preemption):
            held = f" (reserved by {', '.join(reserved_by[:3])})" if reserved_by else ""
            why = f"; {preemption}" if preemption else ""
            return f"gang {gang} does not fit: {render_nofit(nofit)}{held}{why}"
        case NotEnoughMinResources(gang, want, free):
            return (
                f"gang {gang}: minResources {format_resources(want)} exceed free "
                f"{format_resources(free, want)} outside reservations"
            )
        case ExtraMemberWaits(gang, planned):
            return f"gang {gang}: {planned} members planned; extra members wait until it is bound"
        case PlannedNodeLost(gang, node, nofit):
            return f"gang {gang}: planned node {node} no longer fits and {render_nofit(nofit)}"
        case ReservedForGangs(node, gangs, short, nominated):
            holding = ([f"gang {', '.join(gangs[:3])}"] if gangs else []) + (
                [f"preempting pod {', '.join(nominated[:3])}"] if nominated else [])
            return (
                f"node {node}: short of {format_resources(short)} outside capacity reserved "
                f"for {' and '.join(holding) or 'nobody'}"
            )
        case UnknownNode(node):
            return f"node {node} is not in Lockstep's cache yet"
    return None


def _render_binding(reason: Reason) -> str | None:
    """Why a bind call is answered, or a bound gang is not whole."""
    match reason:
        case TimedOut(gang, parked, need, timeout, stragglers):
            missing = f"; not ready: {', '.join(stragglers)}" if stragglers else ""
            return (
                f"gang {gang} timed out after {timeout:g}s with {parked}/{need} members "
                f"ready to bind{missing}"
            )
        case WrongNode(gang, planned, asked):
            return f"gang {gang}: bind to {asked} but the plan holds {planned or 'no node'}"
        case MembersLost(gang, have, need, lost):
            gone = f" ({', '.join(lost)} left)" if lost else ""
            return (f"gang {gang}: {have}/{need} members left after admission{gone}; "
                    "reservation released, waiting for replacements")
        case PodNotInCache(pod, uid, cached):
            if cached is None:
                return f"pod {pod} is not in Lockstep's cache yet; retried when the watch shows it"
            return (f"pod {pod} uid {uid or '?'} is not the pod Lockstep knows (uid {cached}): "
                    "it was deleted or recreated")
        case BindTargetGone(gang, pod, what):
            return f"gang {gang}: not binding {pod}: {what}"
        case DevicesNotReady(gang, pod, why):
            return f"gang {gang}: {pod}'s DRA devices: {why}"
        case PartiallyBound(gang, bound, need, failures):
            why = "; ".join(failures)
            return (f"gang {gang} is partially bound ({bound}/{need}): a member's binding "
                    f"failed after its siblings bound: {why}")
    return None


def _render_queues_and_preemption(reason: Reason) -> str | None:
    """Why a gang waits for others: its Volcano queue, higher priorities, preemption."""
    match reason:
        case QueueNotFound(gang, queue):
            return (f"gang {gang}: Volcano queue {queue!r} does not exist; the group waits "
                    f"until it is created (or spec.queue names another)")
        case QueueNotOpen(gang, queue, state):
            return (f"gang {gang}: Volcano queue {queue!r} is {state}; the group waits until "
                    f"the queue is Open")
        case QueueFull(gang, queue, want, used, capability, over):
            return (f"gang {gang}: Volcano queue {queue!r} is at its capability "
                    f"{format_resources(capability)}: its other groups hold "
                    f"{format_resources(used)} and this one needs {format_resources(want)} "
                    f"({', '.join(over)} over); it waits until they finish")
        case HigherPriorityPodsWaiting(gang, priority, pods, count):
            listed = ", ".join(pods) + (f" and {count - len(pods)} more" if count > len(pods)
                                        else "")
            return (f"gang {gang} (priority {priority}) waits for {count} pod(s) of higher "
                    f"priority that kube-scheduler is placing and that would not fit beside "
                    f"it: {listed}")
        case Preempting(gang, victim_gangs, plain, gpus, waiting):
            units = [f"{len(victim_gangs)} gang(s) ({', '.join(victim_gangs[:3])})"
                     if victim_gangs else "", f"{plain} plain pod(s)" if plain else ""]
            return (f"gang {gang} is preempting {' and '.join(u for u in units if u)}, "
                    f"{gpus} GPUs, waiting for {waiting} pod(s) to terminate")
        case PreemptionStalled(gang, still_there):
            return (f"gang {gang}: {still_there} preemption victim(s) outlived their grace "
                    f"period; the held room was given back and the gang is planned again")
        case BeingPreempted(gang, by):
            return (f"gang {gang} was preempted by gang {by}, which is not running yet; it "
                    f"waits until then")
    return None


def render_notice(notice: Notice) -> str:
    """The message of the Event a notice becomes."""
    gang = notice.gang or "?"
    match notice.kind:
        case NoticeKind.ADMITTED:
            return f"gang {gang} admitted, capacity reserved: {notice.detail}"
        case NoticeKind.RELEASED:
            return f"gang {gang} reached quorum ({notice.detail}); members bind together"
        case NoticeKind.BOUND:
            return f"gang {gang}: {notice.detail}"
        case NoticeKind.PREEMPTED:
            return f"Preempted {notice.detail}" + (f": gang {gang} is evicted whole"
                                                     if notice.gang else "")
        case NoticeKind.MOVING:
            return f"gang {gang}: {notice.detail}"
        case NoticeKind.MOVED:
            return f"Moved {notice.detail}"
        case NoticeKind.TIMEOUT_CAPPED:
            return f"gang {gang}: timeout {notice.detail} (kube-scheduler httpTimeout bound)"
    return render(notice.reason) if notice.reason is not None else f"gang {gang}"
