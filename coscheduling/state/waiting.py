"""The permit-style waiting map: bind calls parked until their gang has a quorum.

kube-scheduler keeps a pod *assumed* on its node while the bind call is in flight, which is
the state a Permit wait holds. Lockstep parks the call here instead of answering it; the app
keeps the matching future, the core only records who is parked where. Pure data: when the
quorum arrives the whole set is popped and bound together; on the deadline it is popped and
every call is answered with an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..records import GangKey, NodeName, PodKey

__all__ = ["WaitingMap"]


@dataclass(slots=True)
class WaitingMap:
    _by_gang: dict[GangKey, dict[PodKey, NodeName]] = field(default_factory=dict)
    _gang_of: dict[PodKey, GangKey] = field(default_factory=dict)
    _uid: dict[PodKey, str] = field(default_factory=dict)
    """The UID each parked call was made for, checked again before the group binds."""

    def park(self, gang: GangKey, pod: PodKey, node: NodeName, uid: str = "") -> int:
        """Park ``pod``'s bind; returns how many of the gang are now parked."""
        self.remove(pod)
        self._by_gang.setdefault(gang, {})[pod] = node
        self._gang_of[pod] = gang
        self._uid[pod] = uid
        return len(self._by_gang[gang])

    def uid(self, pod: PodKey) -> str:
        return self._uid.get(pod, "")

    def node(self, pod: PodKey) -> NodeName | None:
        gang = self._gang_of.get(pod)
        return self._by_gang[gang].get(pod) if gang is not None else None

    def parked(self, gang: GangKey) -> dict[PodKey, NodeName]:
        return dict(self._by_gang.get(gang, {}))

    def count(self, gang: GangKey) -> int:
        return len(self._by_gang.get(gang, ()))

    def is_parked(self, pod: PodKey) -> bool:
        return pod in self._gang_of

    def pop_gang(self, gang: GangKey) -> dict[PodKey, NodeName]:
        out = self._by_gang.pop(gang, {})
        for pod in out:
            self._gang_of.pop(pod, None)
            self._uid.pop(pod, None)
        return out

    def remove(self, pod: PodKey) -> GangKey | None:
        gang = self._gang_of.pop(pod, None)
        self._uid.pop(pod, None)
        if gang is not None:
            members = self._by_gang.get(gang, {})
            members.pop(pod, None)
            if not members:
                self._by_gang.pop(gang, None)
        return gang

    def total(self) -> int:
        return len(self._gang_of)

    def gangs(self) -> list[GangKey]:
        return sorted(self._by_gang)
