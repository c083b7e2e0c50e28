"""The status each convention's PodGroup object shows, written as the core decides it.

Once a second: scheduler-plugins PodGroups get their phase and counts (and a
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

from coscheduling import Coscheduler, GangKey, InvalidGang
from coscheduling.conventions import scheduler_plugins, volcano
from coscheduling.conventions.base import PodGroupAPI
from coscheduling.conventions.upstream import GROUP, GangProgress, condition_updates
from coscheduling.reasons import InvalidDeclaration, QueueFull, QueueNotFound, QueueNotOpen

from .errors import APIError, APIUnreachable
from .kube import KubeClient
from .render import render

__all__ = ["FIELD_MANAGER", "StatusWriter"]

log = logging.getLogger("lockstep")

FIELD_MANAGER = "lockstep"
"""Lockstep's name in managedFields: a PodGroup condition another manager wrote (the native
gang plugin) is not Lockstep's to change."""


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class StatusWriter:
    def __init__(self, core: Coscheduler, kube: KubeClient) -> None:
        self.core, self.kube = core, kube
        self._written: dict[tuple[str, GangKey], dict[str, Any]] = {}
        self.failed = 0
        """Passes that raised (logged, then tried again)."""

    async def run(self) -> None:
        """Once a second, every convention's statuses. A pass that raises is logged and
        counted (``failed``) and the next one tried: a status no one could write must never
        stop Lockstep (the service stops when any of its loops ends)."""
        while True:
            await asyncio.sleep(1.0)
            if self.kube.may_write is not None and not self.kube.may_write():
                continue  # a standby writes no status (``app.lease``)
            for write in (self.write_volcano, self.write_upstream,
                          self.write_scheduler_plugins):
                try:
                    await write()
                except Exception:
                    self.failed += 1
                    log.exception("writing PodGroup statuses failed; trying again next pass")

    def scheduler_plugins_statuses(self) -> dict[GangKey, dict[str, Any]]:
        """The status each scheduler-plugins PodGroup should show: the core's phases and
        counts, and for a group Lockstep cannot honour (a field out of range, say) phase
        ``Pending`` with a ``GangInvalid`` condition naming the field and its limit."""
        out: dict[GangKey, dict[str, Any]] = {}
        for key, st in self.core.podgroup_statuses().items():
            status: dict[str, Any] = {
                "phase": st.phase, "scheduled": st.scheduled, "running": st.running,
                "succeeded": st.succeeded, "failed": st.failed}
            if st.partial is not None:
                status["conditions"] = [{
                    "type": "GangPartiallyBound", "status": "True",
                    "reason": "BindingFailed", "message": render(st.partial)[:1024],
                    "lastTransitionTime": _now(),
                }]
            out[key] = status
        for key, error in self.core.invalid_podgroups().items():
            if key not in out:
                out[key] = {"phase": "Pending", "conditions": [{
                    "type": "GangInvalid", "status": "True", "reason": "InvalidDeclaration",
                    "message": render(InvalidDeclaration(error))[:1024],
                    "lastTransitionTime": _now()}]}
        return out

    def volcano_statuses(self) -> dict[GangKey, dict[str, Any]]:
        """The status each Volcano PodGroup should show: its phase (Lockstep plays Volcano's
        enqueue step) and counts, and why it waits as an ``Unschedulable`` condition."""
        out: dict[GangKey, dict[str, Any]] = {}
        for key, st in self.core.volcano_statuses().items():
            status: dict[str, Any] = {"phase": st.phase, "running": st.running,
                                      "succeeded": st.succeeded, "failed": st.failed}
            if st.waiting is not None:
                status["conditions"] = [{
                    "type": "Unschedulable", "status": "True", "reason": _reason(st.waiting),
                    "message": render(st.waiting)[:1024], "lastTransitionTime": _now()}]
            elif st.phase != "Pending":
                status["conditions"] = []
            out[key] = status
        return out

    async def write_scheduler_plugins(self) -> None:
        await self._merge(scheduler_plugins.API, self.scheduler_plugins_statuses())

    async def write_volcano(self) -> None:
        await self._merge(volcano.API, self.volcano_statuses())

    async def _merge(self, api: PodGroupAPI, statuses: dict[GangKey, dict[str, Any]]) -> None:
        """Each status that differs from what was last written to its object (condition
        timestamps aside), as a merge patch of the status subresource."""
        for key, status in statuses.items():
            written = (api.path, key)  # a Volcano and an sp PodGroup may share a name
            if _same(self._written.get(written), status):
                continue
            ns, name = key.split("/", 1)
            try:
                await self.kube.merge_patch(api.status_path(ns, name), {"status": status})
                self._written[written] = status
            except (APIError, APIUnreachable) as e:
                log.info("PodGroup %s (%s) status not written: %s", key, api.group, e)

    async def write_upstream(self) -> None:
        """The scheduling condition on upstream PodGroups whose pods are Lockstep's (rules in
        ``coscheduling.conventions.upstream``). A strategic merge patch touches only that
        condition; the watch brings it back."""
        groups = self.core.upstream_podgroups()
        if not groups:
            return
        gangs: dict[GangKey, GangProgress] = {}
        for view in self.core.gang_views():
            if view.key not in groups:
                continue
            why = view.reason
            if view.spec is None:  # an invalid declaration: say which field
                bad = [m for p in self.core.members_of(view.key)
                       if isinstance(m := self.core.membership(p.key), InvalidGang)]
                why = InvalidDeclaration(bad[0]) if bad else why
            gangs[view.key] = GangProgress(view.bound, view.spec.min_member if view.spec
                                           else None, why)
        now = _now()
        for upd in condition_updates(groups, gangs, manager=FIELD_MANAGER):
            status = "True" if upd.scheduled else "False"
            message = (upd.detail or (render(upd.why) if upd.why else ""))[:1024]
            cur = groups[upd.key].condition
            if cur is not None and (cur.status, cur.reason, cur.message) == (
                    status, upd.reason, message):
                continue
            cond = {"type": upd.type, "status": status, "reason": upd.reason,
                    "message": message, "observedGeneration": upd.generation,
                    "lastTransitionTime": cur.last_transition
                    if cur is not None and cur.status == status and cur.last_transition
                    else now}
            ns, name = upd.key.split("/", 1)
            path = f"/apis/{GROUP}/{upd.version}/namespaces/{ns}/podgroups/{name}/status"
            try:
                await self.kube.request(
                    "PATCH", path, json={"status": {"conditions": [cond]}},
                    params={"fieldManager": FIELD_MANAGER},
                    content_type="application/strategic-merge-patch+json")
            except (APIError, APIUnreachable) as e:
                log.info("PodGroup %s (%s) status not written: %s", upd.key, GROUP, e)


def _reason(why: object) -> str:
    """The Unschedulable condition's reason: a Volcano queue that holds the group back is
    named for what the queue says, anything else is short of resources."""
    if isinstance(why, QueueFull | QueueNotFound | QueueNotOpen):
        return type(why).__name__
    return "NotEnoughResources"


def _same(old: dict[str, Any] | None, new: dict[str, Any]) -> bool:
    """Equal but for condition timestamps (which would otherwise make every write new)."""
    if old is None:
        return False

    def strip(d: dict[str, Any]) -> dict[str, Any]:
        conds = [{k: v for k, v in c.items() if k != "lastTransitionTime"}
                 for c in d.get("conditions", ())]
        return {**d, "conditions": conds}

    return strip(old) == strip(new)
