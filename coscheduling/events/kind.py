"""One resource kind's events as data (:class:`Kind`): how an object that came, changed or
went, or a whole relist, changes the core's state.

Every kind has the same three events: an object came or changed (``upsert``), went
(``delete``), or the whole set was listed again after a watch expired (``replace``, which must
work out the deletions). The entries themselves are ``coscheduling.events.ingest``'s (the
cluster's and the conventions' kinds) and ``coscheduling.events.dra``'s (DRA's four kinds).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from ..corestate import CoreState

__all__ = ["Kind"]

K = TypeVar("K")
R = TypeVar("R")


@dataclass(frozen=True)
class Kind(Generic[K, R]):
    """How one resource kind's events change the core.

    ``replace`` defaults to: delete what is not listed, upsert what is new or changed; a kind
    whose store keeps derived caches gives its own."""

    name: str
    current: Callable[[CoreState], Mapping[K, R]]
    key: Callable[[R], K]
    upsert: Callable[[CoreState, R], None]
    delete: Callable[[CoreState, K], None]
    replace_all: Callable[[CoreState, Iterable[R]], None] | None = None
    unserved: Callable[[CoreState], None] | None = None
    """The kind's CRD is not installed, when that means more than an empty set (Volcano's
    Queues: no CRD, no gating; an empty set: every queue but ``default`` is missing)."""

    def replace(self, st: CoreState, records: Iterable[R]) -> None:
        if self.replace_all is not None:
            self.replace_all(st, records)
            return
        fresh = {self.key(r): r for r in records}
        have = self.current(st)
        for key in [k for k in have if k not in fresh]:
            self.delete(st, key)
        for r in fresh.values():
            if self.current(st).get(self.key(r)) != r:
                self.upsert(st, r)
