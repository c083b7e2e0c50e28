"""What the binding recorder sees of DRA: every ResourceClaim's allocations over time.

A *hold* is one allocation of a claim: its devices, the pods it is for (the pod that owns a
claim made from a template, and every pod in ``status.reservedFor``), the node its
``nodeSelector`` names, from the moment the watch saw the allocation until it saw it cleared
or the claim deleted. Checked against the pods the recorder saw (``claim_problems``):

- **a parked hold is short**: a claim allocated to a gang member that is not bound must see it
  bound (or deleted) within ``hold`` seconds (20 by default: a loaded 2-core machine adds
  kube-scheduler backoffs of up to 5 s; a gang's timeout is 60 s). kube-scheduler allocates
  a member's devices before it calls the extender's bind, so a member parked at bind holds
  them. Held by a gang Lockstep admitted, the wait is its siblings' scheduling cycles (about
  a second); held by a gang Lockstep does not know to hold devices for (the seed's failure:
  two gangs each parked with devices the other needs), it lasts until the gang's timeout.
  Outside the product this is what "an allocated claim of an unbound member belongs to an
  admitted gang's reservation" can be observed as; the model checker states it exactly.
- **a device is held by one claim at a time**: allocations of the same device never overlap,
  so a preemptor's claim is only allocated after its victims' claims let the device go.
- **a claim is on its pod's node**: the allocation's node is where its pod was bound.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ClaimLedger", "Hold", "PodView"]


@dataclass
class Hold:
    namespace: str
    claim: str
    uid: str
    devices: tuple[str, ...]
    """``driver/pool/device`` of every allocated device."""
    node: str | None
    """The node the allocation's ``nodeSelector`` names (None: not node-local)."""
    start: float
    pods: dict[str, str] = field(default_factory=dict)
    """pod uid -> pod name: the owning pod and every pod reserved for."""
    end: float | None = None


@dataclass(frozen=True)
class PodView:
    """What the claim checks need of a pod the recorder saw."""

    name: str
    gang: str | None
    bound_at: float | None
    node: str | None
    deleted_at: float | None


def _devices(allocation: Mapping[str, Any]) -> tuple[str, ...]:
    results = (allocation.get("devices") or {}).get("results") or ()
    return tuple(sorted(f"{r.get('driver')}/{r.get('pool')}/{r.get('device')}"
                        for r in results))


def _node(allocation: Mapping[str, Any]) -> str | None:
    for term in (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or ():
        for m in term.get("matchFields") or ():
            if m.get("key") == "metadata.name" and m.get("operator") == "In" \
                    and len(m.get("values") or ()) == 1:
                return str(m["values"][0])
    return None


def _pods(obj: Mapping[str, Any]) -> dict[str, str]:
    meta = obj.get("metadata") or {}
    out = {str(o["uid"]): str(o["name"]) for o in meta.get("ownerReferences") or ()
           if o.get("kind") == "Pod" and o.get("uid")}
    for r in (obj.get("status") or {}).get("reservedFor") or ():
        if r.get("resource") == "pods" and r.get("uid"):
            out[str(r["uid"])] = str(r["name"])
    return out


@dataclass
class ClaimLedger:
    """Every hold seen, in the order seen (not thread-safe: the recorder locks around it)."""

    holds: list[Hold] = field(default_factory=list)
    _open: dict[str, Hold] = field(default_factory=dict)
    """claim uid -> its current hold."""

    def observe(self, etype: str, obj: Mapping[str, Any], now: float) -> None:
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid"))
        allocation = (obj.get("status") or {}).get("allocation")
        current = self._open.get(uid)
        devices = _devices(allocation) if allocation and etype != "DELETED" else ()
        if current is not None and current.devices != devices:
            current.end = now
            del self._open[uid]
            current = None
        if devices and current is None:
            current = Hold(str(meta.get("namespace", "")), str(meta.get("name", "")), uid,
                           devices, _node(allocation or {}), now)
            self._open[uid] = current
            self.holds.append(current)
        if current is not None:
            current.pods.update(_pods(obj))

    def relisted(self, uids: Iterable[str], now: float) -> None:
        """After a relist listing ``uids``: claims gone meanwhile let their devices go."""
        keep = set(uids)
        for uid in [u for u in self._open if u not in keep]:
            self._open.pop(uid).end = now

    def allocated(self, ns: str) -> dict[str, tuple[str, ...]]:
        """Pod name -> the devices its claims hold now, in ``ns``."""
        out: dict[str, tuple[str, ...]] = {}
        for h in self._open.values():
            if h.namespace == ns:
                for name in h.pods.values():
                    out[name] = tuple(sorted((*out.get(name, ()), *h.devices)))
        return out

    def problems(self, pods: Mapping[str, PodView], now: float, ns: str | None = None,
                 hold: float = 20.0) -> list[tuple[str, str, str]]:
        """(namespace, claim, problem) for every hold (in ``ns``) that breaks a rule of the
        module doc; ``pods`` maps a pod uid to what the recorder saw of it."""
        holds = [h for h in self.holds if ns is None or h.namespace == ns]
        out = [p for h in holds for p in self._hold_problems(h, pods, now, hold)]
        return out + self._overlaps(holds)

    @staticmethod
    def _hold_problems(h: Hold, pods: Mapping[str, PodView], now: float, hold: float
                       ) -> list[tuple[str, str, str]]:
        out = []
        end = h.end if h.end is not None else now
        for uid, name in sorted(h.pods.items()):
            p = pods.get(uid)
            if p is None:
                continue
            stop = min(t for t in (end, p.deleted_at, p.bound_at) if t is not None)
            if stop - h.start > hold:
                state = "never bound" if p.bound_at is None else \
                    f"bound {p.bound_at - h.start:.1f}s later"
                out.append((h.namespace, h.claim,
                            f"claim {h.claim} held {', '.join(h.devices)} for "
                            f"{stop - h.start:.1f}s (> {hold:g}s) while its pod {name} (gang "
                            f"{p.gang}) was not bound ({state})"))
            if p.node and h.node and p.node != h.node and (p.bound_at or 0) >= h.start:
                out.append((h.namespace, h.claim,
                            f"claim {h.claim} allocated on {h.node}, its pod {name} bound "
                            f"to {p.node}"))
        return out

    @staticmethod
    def _overlaps(holds: list[Hold]) -> list[tuple[str, str, str]]:
        by_device: dict[str, list[Hold]] = {}
        for h in holds:
            for d in h.devices:
                by_device.setdefault(d, []).append(h)
        out = []
        for device, hs in sorted(by_device.items()):
            hs.sort(key=lambda h: h.start)
            for a, b in itertools.pairwise(hs):
                if a.end is None or a.end > b.start:
                    out.append((b.namespace, b.claim,
                                f"device {device} allocated to claim {b.claim} while claim "
                                f"{a.namespace}/{a.claim} still held it"))
        return out
