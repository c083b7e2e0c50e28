"""Room held for one plain pod that preempted: the freed capacity on one node, until it binds.

A gang's room is held in the :class:`~coscheduling.state.ledger.Ledger`, whose reservations are
proven against the gangs' plans. A plain pod has no plan, so a preemption it made holds its
room here instead, as kube-scheduler holds a preemptor's with ``nominatedNodeName``:
:class:`~coscheduling.placement.capacity.Capacity` counts a nomination as used for every pod but its
own, so no gang is planned into it and no lower-priority pod binds there. A plain pod of
higher priority may take it (kube-scheduler's nominated pods give way the same way); the
nomination is then dropped and its pod tried again.

A nomination ends when its pod binds or goes, when the preemption expires (the victims
outlived their grace period), or ``until`` passes after the victims went (the pod never
came back to bind).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..records import NodeName, PodKey
from ..resources import Resources, add, sub

__all__ = ["BIND_WITHIN", "Nomination", "Nominations"]

BIND_WITHIN = 30.0
"""Seconds a nominated pod has to bind once its victims are gone."""


@dataclass(frozen=True, slots=True)
class Nomination:
    pod: PodKey
    node: NodeName
    requests: Resources
    priority: int
    until: float


@dataclass(slots=True)
class Nominations:
    on_change: Callable[[NodeName], None] = lambda _: None
    by_pod: dict[PodKey, Nomination] = field(default_factory=dict)
    total: dict[NodeName, Resources] = field(default_factory=dict)

    def add(self, n: Nomination) -> None:
        self.remove(n.pod)
        self.by_pod[n.pod] = n
        self.total[n.node] = add(self.total.get(n.node, {}), n.requests)
        self.on_change(n.node)

    def remove(self, pod: PodKey) -> Nomination | None:
        n = self.by_pod.pop(pod, None)
        if n is None:
            return None
        left = sub(self.total[n.node], n.requests)
        if any(v for v in left.values()) and any(m.node == n.node for m in self.by_pod.values()):
            self.total[n.node] = left
        else:
            del self.total[n.node]
        self.on_change(n.node)
        return n

    def get(self, pod: PodKey) -> Nomination | None:
        return self.by_pod.get(pod)

    def on(self, node: NodeName) -> list[Nomination]:
        return sorted((n for n in self.by_pod.values() if n.node == node),
                      key=lambda n: (n.priority, n.pod))

    def held_on(self, node: NodeName) -> Resources:
        return self.total.get(node, {})

    def extend(self, pod: PodKey, until: float) -> None:
        n = self.by_pod.get(pod)
        if n is not None:
            self.by_pod[pod] = Nomination(n.pod, n.node, n.requests, n.priority, until)

    def expired(self, now: float) -> list[Nomination]:
        return sorted((n for n in self.by_pod.values() if n.until <= now),
                      key=lambda n: n.pod)

    def next_deadline(self) -> float | None:
        return min((n.until for n in self.by_pod.values()), default=None)

    def __len__(self) -> int:
        return len(self.by_pod)
