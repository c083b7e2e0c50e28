"""The status each convention's PodGroup object shows, written as the core decides it.

Once a second, one loop over the convention registry: the core is asked once for its status
model (``Coscheduler.status_model``, a snapshot), each convention computes from it how its
status is written (``Convention.status``, a :class:`~coscheduling.conventions.base.StatusWrite`:
which objects, with what status, by which kind of patch), and this module only sends the
patches. scheduler-plugins PodGroups get their phase and counts (and a
``GangPartiallyBound`` condition that is never hidden), Volcano PodGroups their phase
(Lockstep plays Volcano's enqueue step), and upstream ``scheduling.k8s.io`` PodGroups the
scheduling condition in the native gang plugin's vocabulary. A status already written is not
written again; a failed write is logged and tried on the next pass.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any

from coscheduling import Coscheduler, conventions
from coscheduling.conventions.base import FIELD_MANAGER, StatusModel, StatusWrite

from ..kube.client import KubeClient
from ..kube.errors import APIError, APIUnreachable
from ..render import render

__all__ = ["FIELD_MANAGER", "StatusWriter"]

log = logging.getLogger("lockstep")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class StatusWriter:
    def __init__(self, core: Coscheduler, kube: KubeClient) -> None:
        self.core, self.kube = core, kube
        self._written: dict[str, dict[str, Any]] = {}
        """The status last written to each object, by its status path (a Volcano and a
        scheduler-plugins PodGroup may share a name, never a path)."""
        self.failed = 0
        """Passes that raised (logged, then tried again)."""

    async def run(self) -> None:
        """Once a second, every registered convention's statuses, all from one status model.
        A convention whose pass raises is logged and counted (``failed``) and the others
        still written: a status no one could write must never stop Lockstep (the service
        stops when any of its loops ends)."""
        while True:
            await asyncio.sleep(1.0)
            if self.kube.may_write is not None and not self.kube.may_write():
                continue  # a standby writes no status (``app.kube.lease``)
            try:
                model = self.core.queries.status_model()
            except Exception:
                self.failed += 1
                log.exception("reading the status model failed; trying again next pass")
                continue
            for conv in conventions.REGISTRY:
                if conv.status is None:
                    continue
                try:
                    await self.write(conv.status, model)
                except Exception:
                    self.failed += 1
                    log.exception("writing PodGroup statuses failed; trying again next pass")

    async def write(self, how: StatusWrite, model: StatusModel) -> None:
        """One convention's statuses from ``model``: each patch it asks for that differs
        from what was last written to its object (condition timestamps aside), unless the
        convention compares with the object as watched itself (``remembered`` false)."""
        for patch in how.patches(model, render, _now()):
            status = dict(patch.status)
            if patch.remembered and _same(self._written.get(patch.path), status):
                continue
            try:
                if patch.strategic:
                    await self.kube.request(
                        "PATCH", patch.path, json={"status": status},
                        params={"fieldManager": FIELD_MANAGER},
                        content_type="application/strategic-merge-patch+json")
                else:
                    await self.kube.merge_patch(patch.path, {"status": status})
                if patch.remembered:
                    self._written[patch.path] = status
            except (APIError, APIUnreachable) as e:
                log.info("PodGroup %s (%s) status not written: %s", patch.key, how.group, e)


def _same(old: dict[str, Any] | None, new: dict[str, Any]) -> bool:
    """Equal but for condition timestamps (which would otherwise make every write new)."""
    if old is None:
        return False

    def strip(d: dict[str, Any]) -> dict[str, Any]:
        conds = [{k: v for k, v in c.items() if k != "lastTransitionTime"}
                 for c in d.get("conditions", ())]
        return {**d, "conditions": conds}

    return strip(old) == strip(new)
