"""Every gang convention Lockstep reads: one module each, registered here.

A new convention is a new module defining its keys and its :class:`Convention`, plus its
entry in :data:`REGISTRY`. The resolver (``coscheduling.podgroup``) looks at each
registered convention's keys in this order; the webhook (``coscheduling.gating``) gates every
pod that names a gang by any of them; the adapter watches each convention's PodGroup API and
writes its status there.
"""

from __future__ import annotations

from . import koordinator, kueue, lockstep, scheduler_plugins, upstream, volcano
from .base import Convention, Key, PodGroupAPI, Source

__all__ = ["REGISTRY", "Convention", "Key", "PodGroupAPI", "Source", "declaring_keys"]

REGISTRY: tuple[Convention, ...] = (
    lockstep.CONVENTION,
    scheduler_plugins.CONVENTION,
    volcano.CONVENTION,
    koordinator.CONVENTION,
    kueue.CONVENTION,
    upstream.CONVENTION,
)


def declaring_keys() -> tuple[tuple[str, ...], tuple[str, ...], tuple[tuple[str, ...], ...]]:
    """(annotation keys, label keys, spec paths) by which a pod names a gang."""
    keys = [k for c in REGISTRY for k in c.declares]
    return (tuple(k.name for k in keys if k.on in ("annotation", "either")),
            tuple(k.name for k in keys if k.on in ("label", "either")),
            tuple(p for c in REGISTRY for p in c.spec_fields))
