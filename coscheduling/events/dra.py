"""Watch events of the four ``resource.k8s.io/v1`` kinds, into the device inventory.

What each event does to the core's state. The ingest table's entries that route events here
are built from :data:`FEEDS` by ``coscheduling.events.ingest`` (``DEVICE_CLASSES``, ...), and
``coscheduling.events.watched`` lists the four kinds beside Kubernetes' own.

A change to a slice or a claim may let a waiting gang fit: the store's epoch is bumped, which
is what makes gated and blocked gangs planned again (the same signal node changes give).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..corestate import CoreState
from ..devices.align import observed
from ..devices.demand import CLAIMS_FIELD
from ..devices.model import Claim, ClaimKey, ClaimTemplate, DeviceClass, DeviceSlice
from ..devices.stale import stale
from ..reasons import DevicesNotReady, InvalidDeclaration

__all__ = ["CLAIMS", "CLASSES", "FEEDS", "SLICES", "TEMPLATES", "Feed"]

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Feed(Generic[R]):
    """One kind's events as data, in the shape of ``coscheduling.events.ingest.Kind`` (which the
    module cannot import: ingest imports this one)."""

    name: str
    current: Callable[[CoreState], Mapping[str, R]]
    key: Callable[[R], str]
    upsert: Callable[[CoreState, R], None]
    delete: Callable[[CoreState, str], None]


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


def _feed(name: str, table: Callable[[CoreState], Mapping[str, R]], key: Callable[[R], str],
          put: Callable[[CoreState, R], None], drop: Callable[[CoreState, str], None]
          ) -> Feed[R]:
    def upsert(st: CoreState, rec: R) -> None:
        put(st, rec)
        _changed(st)

    def delete(st: CoreState, k: str) -> None:
        drop(st, k)
        _changed(st)

    return Feed(name, table, key, upsert, delete)


def _claim_key(c: Claim) -> ClaimKey:
    return c.key


def _put_claim(st: CoreState, c: Claim) -> None:
    st.devices.put_claim(c)
    if stale(st.devices, c, st.store.pods, lambda p: p in st.membership, st.ledger.get):
        st.outbox.deallocate[c.key] = (c.uid, c.resource_version)
    else:
        st.outbox.deallocate.pop(c.key, None)


SLICES: Feed[DeviceSlice] = _feed(
    "resourceslices", lambda st: st.devices.slices, lambda s: s.name,
    lambda st, s: st.devices.put_slice(s), lambda st, k: st.devices.drop_slice(k))
CLASSES: Feed[DeviceClass] = _feed(
    "deviceclasses", lambda st: st.devices.classes, lambda c: c.name,
    lambda st, c: st.devices.put_class(c), lambda st, k: st.devices.drop_class(k))
CLAIMS: Feed[Claim] = _feed(
    "resourceclaims", lambda st: st.devices.claims, _claim_key,
    _put_claim, lambda st, k: st.devices.drop_claim(k))
TEMPLATES: Feed[ClaimTemplate] = _feed(
    "resourceclaimtemplates", lambda st: st.devices.templates, lambda t: t.key,
    lambda st, t: st.devices.put_template(t), lambda st, k: st.devices.drop_template(k))
FEEDS: tuple[Feed[Any], ...] = (CLASSES, SLICES, CLAIMS, TEMPLATES)
"""The four kinds, in the order they are watched."""
