"""The work one planning call may spend on devices, counted in one place.

Everything a plan does with devices is charged to the call's one :class:`Budget`: each
device examined (a node's reachable devices listed, a selector set's candidates walked),
each request read, each unit built (one device a request needs, on one node), each edge the
matching visits,
and each CEL selector evaluation, which costs :data:`EVALUATION` units (cel-python takes
0.2-0.8 ms per evaluation here, an edge visit about half a microsecond). The total is
:data:`BUDGET`, a constant: no number a user writes (claims, requests, counts, selectors)
changes it, so a gang that asks for more than a plan can afford is turned away with that
reason (``planner``) in bounded time, never held on the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BUDGET", "EVALUATION", "Budget"]

BUDGET = 200_000
"""Units one planning call may spend on devices (about 0.1 s of Python)."""
EVALUATION = 500
"""Units one CEL selector evaluation costs (one expression on one device signature)."""


@dataclass(slots=True)
class Budget:
    """What is left of one planning call's device work, and what it went on (for the
    reason a gang over budget is given, and for tests that bound the work)."""

    left: int = BUDGET
    examined: int = 0
    """Devices looked at (listing a node's devices, walking a selector set's candidates)."""
    evaluations: int = 0
    """CEL selector evaluations (``DeviceInventory.selects``)."""
    units: int = 0
    """Units built: one per device a request needs, per node tried."""
    visits: int = 0
    """Edges the matching visited (``matching.JointTrial``)."""
    requests: int = 0
    """Requests read (a member's claims summed up: once per member, not per node)."""

    @property
    def spent(self) -> bool:
        return self.left <= 0

    def examine(self, devices: int) -> None:
        self.examined += devices
        self.left -= devices

    def build(self, units: int) -> None:
        self.units += units
        self.left -= units

    def read(self, requests: int) -> None:
        self.requests += requests
        self.left -= requests

    def visit(self) -> bool:
        """One edge visited; False when that spent the budget."""
        self.visits += 1
        self.left -= 1
        return self.left > 0

    def evaluate(self) -> bool:
        """May one selector evaluation run? Charged if so; False once the budget is spent
        (the caller then treats the device as not selected, and the plan as over budget)."""
        if self.left <= 0:
            return False
        self.evaluations += 1
        self.left -= EVALUATION
        return True

    def describe(self) -> str:
        """The work done, for the reason given to a gang over budget."""
        return (f"{BUDGET:,} units: {self.examined:,} devices examined, "
                f"{self.evaluations:,} selector evaluations, {self.requests:,} requests read, "
                f"{self.units:,} units built, {self.visits:,} matching steps")
