"""Which pods defragmentation may move: values and one predicate, no state.

A pod moves only when moving it loses nothing but the work since it started: its controller
recreates it (:data:`RECREATING_KINDS`), it did not opt out (:data:`MOVABLE_ANNOTATION`),
its priority is not above the waiting gang's, and it is no gang member (a gang moves whole
or not at all; this version moves no gang). Only pods of Lockstep's own schedulers move: the
replacement must pass Lockstep's filter to be steered to the room reserved for it (a pod of
another profile could land back on the freed node).
"""

from __future__ import annotations

from ..records import PodRecord

__all__ = ["MOVABLE_ANNOTATION", "RECREATING_KINDS", "why_not_movable"]

MOVABLE_ANNOTATION = "lockstep.dev/movable"
"""``"false"`` on a pod: never moved to make room for a gang (preemption still applies)."""

RECREATING_KINDS = frozenset({"ReplicaSet", "StatefulSet", "Job"})
"""Controllers that recreate a pod evicted through the Eviction API."""


def why_not_movable(pod: PodRecord, priority: int, schedulers: frozenset[str]) -> str | None:
    """None when ``pod`` (a plain pod, bound) may move for a gang of ``priority``; else
    why not, in a few words."""
    if pod.owner is None:
        return "bare pod (no controller recreates it)"
    if pod.owner.kind not in RECREATING_KINDS:
        return f"owned by a {pod.owner.kind}, which is not known to recreate it"
    if pod.annotations.get(MOVABLE_ANNOTATION, "").lower() == "false":
        return f"opted out ({MOVABLE_ANNOTATION}: \"false\")"
    if pod.priority > priority:
        return f"priority {pod.priority} is above the gang's {priority}"
    if pod.scheduler_name not in schedulers:
        return f"scheduled by {pod.scheduler_name}, whose replacement Lockstep cannot steer"
    if pod.deleting or not pod.holds_capacity:
        return "not running"
    return None
