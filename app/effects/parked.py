"""Bind calls held open until their gang's quorum: one future per pod.

kube-scheduler keeps a pod assumed on its node while its bind call is open, exactly the state
a Permit wait holds; the answer is the error text ("" for success) the call returns.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

from coscheduling import PodKey

__all__ = ["ParkedCalls"]


class ParkedCalls:
    def __init__(self) -> None:
        self._futures: dict[PodKey, asyncio.Future[str]] = {}

    def __len__(self) -> int:
        return len(self._futures)

    def __iter__(self) -> Iterator[PodKey]:
        return iter(list(self._futures))

    def answer(self, key: PodKey, text: str) -> bool:
        """Answer ``key``'s open call with ``text``; False when none is open."""
        fut = self._futures.get(key)
        if fut is None or fut.done():
            return False
        fut.set_result(text)
        return True

    def open(self, key: PodKey) -> asyncio.Future[str]:
        """Open ``key``'s call for answers, before anything that may answer it runs (the
        core may let a parked call go in the same step that parked it: its answer must find
        the call open, or the call would hang until its deadline).

        A newer call for the same pod supersedes the older one, which is answered at once."""
        self.answer(key, "superseded by a newer bind call for the same pod")
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._futures[key] = fut
        return fut

    async def wait(self, key: PodKey, fut: asyncio.Future[str], timeout: float) -> str | None:
        """Hold ``key``'s opened call until it is answered; None after ``timeout`` seconds."""
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            return None
        finally:
            if self._futures.get(key) is fut:
                del self._futures[key]
