"""Placement at creation, as the admission webhook asks it of the running service.

A gated member costs one pod update when Lockstep lifts its gate; a member whose gang's
quorum exists as it is created, and fits, can be pinned by the webhook instead, in the same
process that holds the ledger (``coscheduling.creation.placer``), and reach the API server with its
pin and no gate. A review whose gang has no quorum yet is held (an asyncio future the route
awaits) until sibling reviews complete it or its window closes (a timer here gates it).

:class:`CreationPlacer` is that question and its two companions, with what only the adapter
knows: whether this process may reserve at all (its cache synced and its verbs served: a
starting Lockstep, with half a cache, gates), the clock, and the pod as a record. With two
replicas the Service spreads reviews over both; only the leader, which holds the ledger, may
pin: a standby (or a leader still rebuilding its view) gates every member, and the leader
lifts those gates as for any gated gang (docs/failover.md).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from pydantic import ValidationError

from coscheduling import (
    AwaitQuorum,
    NodeName,
    PinAtCreation,
    PodRecord,
    QuantityError,
    RecordError,
    eligible,
    pinned_node,
    pinned_terms,
    pod_from_json,
    pod_key,
)

from ..service import Lockstep
from .wire import validate_shape

__all__ = ["CreationPlacer"]

log = logging.getLogger("lockstep.webhook")


class CreationPlacer:
    """Pin a member being created, recognise a pin given earlier, take a pin back."""

    def __init__(self, service: Lockstep) -> None:
        self.service = service
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0

    def _record(self, obj: dict[str, Any], namespace: str) -> PodRecord | None:
        meta = obj.get("metadata")
        if isinstance(meta, dict) and not meta.get("namespace") and namespace:
            obj = {**obj, "metadata": {**meta, "namespace": namespace}}
        try:
            validate_shape(obj)  # what the extender verbs check first, too
            return pod_from_json(obj)
        except (ValidationError, RecordError, QuantityError):
            return None  # gated: the watch's copy is decoded (and reported) as usual

    def place(self, obj: dict[str, Any], namespace: str
              ) -> list[dict[str, Any]] | asyncio.Future[list[dict[str, Any]] | None] | None:
        """The required node-selector terms that pin ``obj`` to its planned node, its slot
        reserved; None: gate it; a future: the review is held until its gang's quorum
        exists (or the window closes), and the future gives one of those two answers."""
        s = self.service
        if not (s.cache.synced and s.verbs_served) or s.failed is not None:
            return None
        rec = self._record(obj, namespace)
        if rec is None or pinned_node(rec.required_affinity) is not None:
            return None  # pinned by its author (or by a Lockstep before a restart): gated
        placed = s.core.place_at_creation(rec, s.clock())
        # Held reviews this one answered, gated members its admission lifts, the timer for
        # the pin's deadline: all in the core's drain.
        s.after_change()
        if isinstance(placed, PinAtCreation):
            return pinned_terms(rec.required_affinity, placed.node)
        if isinstance(placed, AwaitQuorum):
            fut = s.held.open(rec)
            self._arm(placed.until)
            return fut
        log.debug("gating %s at creation: %s", rec.key, placed.why)
        return None

    def give_up(self, obj: dict[str, Any], namespace: str) -> None:
        """A held review that is answered without its quorum (its wait ran out here)."""
        rec = self._record(obj, namespace)
        if rec is not None and self.service.held.drop(rec.key):
            self.service.core.release_hold(rec.key)

    def _arm(self, until: float) -> None:
        """Wake at ``until`` to gate the held reviews whose window closed."""
        if self._timer is not None and self._timer_at <= until:
            return
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._timer_at = until
        self._timer = loop.call_later(max(0.0, until - self.service.clock()), self._expire)

    def _expire(self) -> None:
        self._timer = None
        s = self.service
        s.core.expire_holds(s.clock())
        s.send_queued()  # the gated reviews' answers
        if (nxt := s.core.queries.next_hold_deadline()) is not None:
            self._arm(nxt)

    def pinned(self, obj: dict[str, Any], namespace: str) -> NodeName | None:
        """The node this process pinned ``obj`` to when it was reviewed before (the API
        server reinvokes the webhook after a later one changed the pod), or None."""
        meta = obj.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        ns = (meta.get("namespace") if isinstance(meta, dict) else None) or namespace
        if not isinstance(name, str) or not name or not isinstance(ns, str):
            return None
        return self.service.core.queries.pinned_at_creation(pod_key(ns, name))

    def still_fits(self, obj: dict[str, Any], namespace: str, node: str) -> bool:
        """A pod pinned before is still the pod its slot was reserved for: the pin kept, the
        same requests (a later webhook may add a sidecar, or take the pin off), and the pinned
        node still meets every constraint the pod now carries. A later webhook may have
        narrowed it (a ``nodeSelector``, an affinity term, a toleration taken away): a pin it
        cannot meet would leave it stuck for good, its slot held until the gang's deadline."""
        rec = self._record(obj, namespace)
        q = self.service.core.queries
        held = q.pod(rec.key) if rec is not None else None
        at = q.node(NodeName(node))
        return (rec is not None and held is not None and held.requests == rec.requests
                and pinned_node(rec.required_affinity) == node
                and at is not None and eligible(rec, at))

    def withdraw(self, obj: dict[str, Any], namespace: str) -> None:
        """Take back the pin given to ``obj`` (it is gated now): its slot is free again."""
        rec = self._record(obj, namespace)
        if rec is not None:
            self.service.core.withdraw_creation(rec.key)
            self.service.after_change()
