"""The one place tests reach inside the facade: the core's private state.

``Coscheduler`` keeps its state (the cluster as watched, the ledger, the waiting map,
preemptions in flight, ...) private, so ``app`` and the tests read the core through
``Coscheduler.queries`` wherever it answers. The model checker (``tests/invariants.py``)
and a few unit tests must look further: an invariant is about the ledger and the book
themselves, not what the facade chooses to show. They read through :func:`state_of`, never
``core._state`` at each use, so a change of the state's shape is one grep away.

It is a view for reading. The few tests that set up a situation the API cannot produce (a
smaller search budget, a cleared queue of pending plain pods, a counting wrapper around a
capacity method) write through it and say so where they do.
"""

from __future__ import annotations

from coscheduling.core import Coscheduler
from coscheduling.corestate import CoreState

__all__ = ["state_of"]


def state_of(core: Coscheduler) -> CoreState:
    """``core``'s state: the store (``.store``), the ledger (``.ledger``), the waiting map,
    capacity, the outbox, gangs, memberships and the preemption book."""
    return core._state
