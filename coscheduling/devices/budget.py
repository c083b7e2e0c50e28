"""The work one planning call may spend on devices, counted in one place.

Everything a plan does with devices is charged to the call's one :class:`Budget`: each
device examined (a node's reachable devices listed, a selector set's candidates walked),
each request read, each unit built (one device a request needs, on one node), each edge the
matching visits, each selector verdict looked up (:data:`LOOKUP`), each CEL evaluation run
(:data:`EVALUATION` plus :data:`STEP` per step it took: cel-python takes about 4-7
microseconds a step) and each selector compiled (:data:`COMPILE` plus :data:`TOKEN` per
token: its parser takes about 0.1 ms a token). The total is :data:`BUDGET`, a constant: no
number a user writes (claims, requests, counts, selectors) changes it, so a gang that asks for
more than a plan can afford is turned away with that reason (``planner``) in bounded time,
never held on the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import selectors
from .celcost import MAX_STEPS

__all__ = ["BUDGET", "COMPILE", "EVALUATION", "LOOKUP", "STEP", "TOKEN", "Budget"]

BUDGET = 200_000
"""Units one planning call may spend on devices (about 0.1 s of Python: a unit is about half
a microsecond)."""
EVALUATION = 100
"""Units one CEL evaluation costs whatever its steps (the device's activation built)."""
STEP = 10
"""Units per step an evaluation took (``Selectors.steps``; 4-7 microseconds each)."""
LOOKUP = 1
"""Units a verdict already known costs (one look-up in ``Selectors``' results)."""
COMPILE = 1_000
"""Units one selector compiled costs whatever its size."""
TOKEN = 200
"""Units per token parsed (about 0.1 ms each): a 512-token selector is half a budget, so a
claim of 2,048 tokens of new selectors is compiled over a few planning calls."""


@dataclass(slots=True)
class Budget:
    """What is left of one planning call's device work, and what it went on (for the
    reason a gang over budget is given, and for tests that bound the work)."""

    left: int = BUDGET
    examined: int = 0
    """Devices looked at (listing a node's devices, walking a selector set's candidates)."""
    evaluations: int = 0
    """CEL selector evaluations run (``Selectors.evaluations`` moved)."""
    steps: int = 0
    """Their steps."""
    lookups: int = 0
    """Verdicts read from ``Selectors``' results (no evaluation)."""
    compiles: int = 0
    """Selectors compiled (``Selectors.compiles`` moved)."""
    tokens: int = 0
    """Their tokens."""
    units: int = 0
    """Units built: one per device a request needs, per node tried."""
    visits: int = 0
    """Edges the matching visited (``matching.JointTrial``)."""
    requests: int = 0
    """Requests read (a member's claims summed up: once per member, not per node)."""
    cel: selectors.Budget = field(default_factory=lambda: selectors.Budget(0))
    """The steps the call's evaluations may still take, given to ``Selectors.matches``
    (:meth:`cel_steps`); its ``exhausted`` is this budget spent."""

    @property
    def spent(self) -> bool:
        return self.left <= 0 or self.cel.exhausted

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

    def cel_steps(self) -> selectors.Budget:
        """The ``selectors.Budget`` for the next evaluation: what is left, in steps, once
        the evaluation's own cost is paid; but the call's first evaluation may take its
        full ``MAX_STEPS`` whatever is left (at most one evaluation over the budget, about
        50 ms), so every call keeps one more result than the last: were it cut short at the
        same point each time, a gang would be stopped at its budget for ever."""
        self.cel.steps = (MAX_STEPS if self.evaluations == 0
                          else max(0, self.left - EVALUATION) // STEP)
        return self.cel

    def evaluated(self, evaluations: int, steps: int) -> None:
        """``evaluations`` CEL evaluations ran (0: the budget's steps were spent before
        one could), taking ``steps`` in all."""
        self.evaluations += evaluations
        self.steps += steps
        self.left -= evaluations * EVALUATION + steps * STEP

    def looked_up(self, verdicts: int) -> None:
        """``verdicts`` results were read from ``Selectors``' cache."""
        self.lookups += verdicts
        self.left -= verdicts * LOOKUP

    def compiled(self, compiles: int, tokens: int) -> None:
        """``compiles`` selectors were parsed, ``tokens`` tokens in all."""
        self.compiles += compiles
        self.tokens += tokens
        self.left -= compiles * COMPILE + tokens * TOKEN

    def describe(self) -> str:
        """The work done, for the reason given to a gang over budget."""
        return (f"{BUDGET:,} units: {self.examined:,} devices examined, "
                f"{self.compiles:,} selectors compiled ({self.tokens:,} tokens), "
                f"{self.evaluations:,} selector evaluations ({self.steps:,} steps), "
                f"{self.lookups:,} verdicts looked up, {self.requests:,} requests read, "
                f"{self.units:,} units built, {self.visits:,} matching steps")
