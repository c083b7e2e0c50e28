"""Placement at creation, as the admission webhook asks it of the running service.

A gated member costs one pod update when Lockstep lifts its gate; a member whose gang fits
as it is created can be pinned by the webhook instead, in the same process that holds the
ledger (``coscheduling.creation``), and reach the API server with its pin and no gate.

:class:`CreationPlacer` is that question and its two companions, with what only the adapter
knows: whether this process may reserve at all (its cache synced and its verbs served: a
starting Lockstep, with half a cache, gates), the clock, and the pod as a record. Lockstep runs
one replica per scheduler (``deploy/deployment.yaml``), so the replica that answers the
webhook is the one that holds the ledger; there is no standby that could pin without it.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError

from coscheduling import (
    GateAtCreation,
    NodeName,
    PinAtCreation,
    PodRecord,
    RecordError,
    pod_from_json,
    pod_key,
)
from coscheduling.gating import pinned_node, pinned_terms
from coscheduling.resources import QuantityError

from .service import Lockstep
from .wire import PodShape

__all__ = ["CreationPlacer"]

log = logging.getLogger("lockstep.webhook")


class CreationPlacer:
    """Pin a member being created, recognise a pin given earlier, take a pin back."""

    def __init__(self, service: Lockstep) -> None:
        self.service = service

    def _record(self, obj: dict[str, Any], namespace: str) -> PodRecord | None:
        meta = obj.get("metadata")
        if isinstance(meta, dict) and not meta.get("namespace") and namespace:
            obj = {**obj, "metadata": {**meta, "namespace": namespace}}
        try:
            PodShape.model_validate(obj)  # what the extender verbs check first, too
            return pod_from_json(obj)
        except (ValidationError, RecordError, QuantityError):
            return None  # gated: the watch's copy is decoded (and reported) as usual

    def place(self, obj: dict[str, Any], namespace: str) -> list[dict[str, Any]] | None:
        """The required node-selector terms that pin ``obj`` to its planned node, its slot
        reserved; None: gate it."""
        s = self.service
        if not (s.cache.synced and s.verbs_served) or s.failed is not None:
            return None
        rec = self._record(obj, namespace)
        if rec is None or pinned_node(rec.required_affinity) is not None:
            return None  # pinned by its author (or by a Lockstep before a restart): gated
        placed = s.core.place_at_creation(rec, s.clock())
        s.flush()  # held members its admission lifts; the timer for the pin's deadline
        if isinstance(placed, PinAtCreation):
            return pinned_terms(rec.required_affinity, placed.node)
        assert isinstance(placed, GateAtCreation)
        log.debug("gating %s at creation: %s", rec.key, placed.why)
        return None

    def pinned(self, obj: dict[str, Any], namespace: str) -> NodeName | None:
        """The node this process pinned ``obj`` to when it was reviewed before (the API
        server reinvokes the webhook after a later one changed the pod), or None."""
        meta = obj.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        ns = (meta.get("namespace") if isinstance(meta, dict) else None) or namespace
        if not isinstance(name, str) or not name or not isinstance(ns, str):
            return None
        return self.service.core.pinned_at_creation(pod_key(ns, name))

    def still_fits(self, obj: dict[str, Any], namespace: str, node: str) -> bool:
        """A pod pinned before is still the pod its slot was reserved for: the pin kept and
        the same requests (a later webhook may add a sidecar, or take the pin off)."""
        rec = self._record(obj, namespace)
        held = self.service.core.pod(rec.key) if rec is not None else None
        return (rec is not None and held is not None and held.requests == rec.requests
                and pinned_node(rec.required_affinity) == node)

    def withdraw(self, obj: dict[str, Any], namespace: str) -> None:
        """Take back the pin given to ``obj`` (it is gated now): its slot is free again."""
        rec = self._record(obj, namespace)
        if rec is not None:
            self.service.core.withdraw_creation(rec.key)
            self.service.flush()
