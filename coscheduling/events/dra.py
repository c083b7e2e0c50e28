"""Watch events of the four ``resource.k8s.io/v1`` kinds, into the device inventory.

What each event does to the core's state: one :class:`~coscheduling.events.kind.Kind` entry
per kind (:data:`DEVICE_KINDS`), which ``coscheduling.events.watched`` pairs with its watch
beside Kubernetes' own kinds.

A change to a slice or a claim may let a waiting gang fit: the store's epoch is bumped, which
is what makes gated and blocked gangs planned again (the same signal node changes give).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from ..corestate import CoreState
from ..devices.align import observed
from ..devices.demand import CLAIMS_FIELD
from ..devices.model import Claim, ClaimKey, ClaimTemplate, DeviceClass, DeviceSlice
from ..devices.stale import stale
from ..reasons import DevicesNotReady, InvalidDeclaration
from .kind import Kind

__all__ = ["DEVICE_CLASSES", "DEVICE_KINDS", "RESOURCE_CLAIMS", "RESOURCE_CLAIM_TEMPLATES",
           "RESOURCE_SLICES"]

R = TypeVar("R")


def _changed(st: CoreState) -> None:
    """Devices changed: waiting gangs may fit now, and plans follow what kube-scheduler
    allocated (``devices.align.observed``). Members that wait for devices (turned away at
    the filter) are nudged: no cluster event of theirs would wake them."""
    st.store.epoch += 1
    observed(st.devices, st.store.nodes, st.store.pods, st.ledger.get)
    for g in st.gangs.values():
        if g.turned_away and (isinstance(g.reason, DevicesNotReady) or (
                isinstance(g.reason, InvalidDeclaration)
                and g.reason.error.field.endswith(CLAIMS_FIELD))):
            st.outbox.requeue.update(g.wake())


def _kind(name: str, table: Callable[[CoreState], Mapping[str, R]], key: Callable[[R], str],
          put: Callable[[CoreState, R], None], drop: Callable[[CoreState, str], None]
          ) -> Kind[str, R]:
    def upsert(st: CoreState, rec: R) -> None:
        put(st, rec)
        _changed(st)

    def delete(st: CoreState, k: str) -> None:
        drop(st, k)
        _changed(st)

    return Kind(name, table, key, upsert, delete)


def _claim_key(c: Claim) -> ClaimKey:
    return c.key


def _put_claim(st: CoreState, c: Claim) -> None:
    st.devices.put_claim(c)
    if stale(st.devices, c, st.store.pods, lambda p: p in st.membership, st.ledger.get):
        st.outbox.deallocate[c.key] = (c.uid, c.resource_version)
    else:
        st.outbox.deallocate.pop(c.key, None)


RESOURCE_SLICES: Kind[str, DeviceSlice] = _kind(
    "resourceslices", lambda st: st.devices.slices, lambda s: s.name,
    lambda st, s: st.devices.put_slice(s), lambda st, k: st.devices.drop_slice(k))
DEVICE_CLASSES: Kind[str, DeviceClass] = _kind(
    "deviceclasses", lambda st: st.devices.classes, lambda c: c.name,
    lambda st, c: st.devices.put_class(c), lambda st, k: st.devices.drop_class(k))
RESOURCE_CLAIMS: Kind[str, Claim] = _kind(
    "resourceclaims", lambda st: st.devices.claims, _claim_key,
    _put_claim, lambda st, k: st.devices.drop_claim(k))
RESOURCE_CLAIM_TEMPLATES: Kind[str, ClaimTemplate] = _kind(
    "resourceclaimtemplates", lambda st: st.devices.templates, lambda t: t.key,
    lambda st, t: st.devices.put_template(t), lambda st, k: st.devices.drop_template(k))
DEVICE_KINDS: dict[str, Kind[str, Any]] = {
    k.name: k for k in (DEVICE_CLASSES, RESOURCE_SLICES, RESOURCE_CLAIMS,
                        RESOURCE_CLAIM_TEMPLATES)}
"""DRA's four kinds by resource name (``coscheduling.events.watched`` pairs each with its watch)."""
