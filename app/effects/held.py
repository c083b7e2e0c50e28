"""Admission reviews held open until their gang's quorum exists: one future per pod.

The webhook holds a member's review when its gang has no quorum yet
(``app.http.pinning.CreationPlacer``); the core answers it later, when a sibling's review
completes the quorum or the window closes, and the service hands those answers here from
the core's drain. One instance per service, so a review held by either server that answers
the webhook (its own port, or the extender's) gets its answer whichever server's review
completed the quorum.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from coscheduling import Answer, PinAtCreation, PodKey, PodRecord, pinned_terms

__all__ = ["HeldReviews"]

Terms = list[dict[str, Any]] | None
"""A held review's answer: the node-selector terms that pin the pod, or None (gate it)."""


class HeldReviews:
    def __init__(self) -> None:
        self._held: dict[PodKey, tuple[asyncio.Future[Terms], PodRecord]] = {}

    def __len__(self) -> int:
        return len(self._held)

    def open(self, rec: PodRecord) -> asyncio.Future[Terms]:
        """Hold ``rec``'s review: the future its request awaits."""
        fut: asyncio.Future[Terms] = asyncio.get_running_loop().create_future()
        self._held[rec.key] = (fut, rec)
        return fut

    def drop(self, key: PodKey) -> bool:
        """``key``'s review is answered without its quorum; False when it was not held."""
        return self._held.pop(key, None) is not None

    def answer(self, answers: Mapping[PodKey, Answer]) -> None:
        """Send held reviews the answers the core decided for them."""
        for key, placed in answers.items():
            fut, rec = self._held.pop(key, (None, None))
            if fut is None or rec is None or fut.done():
                continue
            fut.set_result(pinned_terms(rec.required_affinity, placed.node)
                           if isinstance(placed, PinAtCreation) else None)
