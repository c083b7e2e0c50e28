"""Lockstep's own annotations (or labels): the gang's name, size and timeout on each pod."""

from __future__ import annotations

from .base import Convention, Key, Source

__all__ = ["CONVENTION", "GROUP", "MIN_MEMBER", "TIMEOUT"]

GROUP = "lockstep.dev/pod-group"
MIN_MEMBER = "lockstep.dev/min-member"
TIMEOUT = "lockstep.dev/timeout-seconds"

CONVENTION = Convention(
    Source.LOCKSTEP,
    declares=(Key(GROUP, "either"),),
    size=((Key(MIN_MEMBER, "either"), Key(TIMEOUT, "either")),),
)
