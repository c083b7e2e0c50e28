"""What the API server says about devices: classes, slices, claims and claim templates, with
the indexes the planner reads (devices a node reaches, devices already allocated).

Kept apart from ``ClusterStore`` so nodes and pods stay as they were: one more table the
watches feed (``coscheduling.devices.ingest``). Derived indexes are dropped in exactly one
place per kind (``put_*`` / ``drop_*``), so a relist never leaves yesterday's devices behind.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..records import PodKey
from ..topology.eligibility import match_expression
from .budget import Budget
from .model import Claim, ClaimKey, ClaimTemplate, Device, DeviceClass, DeviceId, DeviceSlice
from .selectors import Budget as CelBudget
from .selectors import Selectors

__all__ = ["DeviceInventory", "PlannedDevices"]


@dataclass(frozen=True, slots=True)
class PlannedDevices:
    """The devices a gang's plan gave one member: held while the member's slot is in the
    ledger on ``node`` (the reservation is the slot; these are its devices)."""

    node: str
    devices: tuple[tuple[ClaimKey, DeviceId], ...]
    choices: tuple[tuple[ClaimKey, str, int], ...] = ()
    """``(claim, request, subrequest index)``: the ``firstAvailable`` subrequest planned."""
    chosen: bool = False
    """kube-scheduler chose these (predicted first fit of a member that passed the filter,
    or an allocation the watch showed): no longer moved when others are matched again."""


def _term_matches(term: Mapping[str, Any], name: str, labels: Mapping[str, str]) -> bool:
    exprs = term.get("matchExpressions") or ()
    fields = term.get("matchFields") or ()
    if not exprs and not fields:
        return False
    for e in exprs:
        if not isinstance(e, Mapping) or not match_expression(e, labels):
            return False
    for f in fields:
        if not isinstance(f, Mapping) or f.get("key") != "metadata.name" \
                or not match_expression(f, {"metadata.name": name}):
            return False
    return True


@dataclass(slots=True)
class DeviceInventory:
    classes: dict[str, DeviceClass] = field(default_factory=dict)
    slices: dict[str, DeviceSlice] = field(default_factory=dict)
    claims: dict[ClaimKey, Claim] = field(default_factory=dict)
    templates: dict[str, ClaimTemplate] = field(default_factory=dict)
    planned: dict[PodKey, PlannedDevices] = field(default_factory=dict)
    """Devices each planned member holds, by pod key (``coscheduling.devices.room``)."""
    selectors: Selectors = field(default_factory=Selectors)
    epoch: int = 0
    """Bumped on every change a plan reads (slices, claims, classes, templates)."""
    _by_id: dict[DeviceId, Device] | None = None
    _counters: dict[tuple[str, str, str, str], int] | None = None
    _local: dict[str, list[Device]] | None = None
    _network: list[DeviceSlice] | None = None
    _allocated: dict[DeviceId, ClaimKey] | None = None

    # ------------------------------------------------------------------ writes

    def put_slice(self, s: DeviceSlice) -> None:
        if self.slices.get(s.name) != s:
            self.slices[s.name] = s
            self._slices_changed()

    def drop_slice(self, name: str) -> None:
        if self.slices.pop(name, None) is not None:
            self._slices_changed()

    def put_claim(self, c: Claim) -> None:
        if self.claims.get(c.key) != c:
            self.claims[c.key] = c
            self._allocated = None
            self.epoch += 1

    def drop_claim(self, key: ClaimKey) -> None:
        if self.claims.pop(key, None) is not None:
            self._allocated = None
            self.epoch += 1

    def put_class(self, c: DeviceClass) -> None:
        self.classes[c.name] = c
        self.epoch += 1

    def drop_class(self, name: str) -> None:
        self.classes.pop(name, None)
        self.epoch += 1

    def put_template(self, t: ClaimTemplate) -> None:
        self.templates[t.key] = t
        self.epoch += 1

    def drop_template(self, key: str) -> None:
        self.templates.pop(key, None)
        self.epoch += 1

    def _slices_changed(self) -> None:
        self._local = None
        self._network = None
        self._by_id = None
        self._counters = None
        self.epoch += 1

    # ------------------------------------------------------------------ reads

    @property
    def served(self) -> bool:
        """Any device is published: without one, no pod's claim can be planned."""
        return bool(self.slices)

    def _index(self) -> tuple[dict[str, list[Device]], list[DeviceSlice]]:
        if self._local is None or self._network is None:
            newest: dict[tuple[str, str], int] = {}
            for s in self.slices.values():
                k = (s.driver, s.pool)
                newest[k] = max(newest.get(k, s.generation), s.generation)
            local: dict[str, list[Device]] = {}
            network: list[DeviceSlice] = []
            # Slices of an outdated pool generation are being replaced: upstream's allocator
            # ignores them, so must the plan.
            for s in sorted(self.slices.values(), key=lambda s: s.name):
                if s.generation < newest[(s.driver, s.pool)]:
                    continue
                if s.node is not None:
                    local.setdefault(s.node, []).extend(s.devices)
                elif s.all_nodes or s.node_selector is not None:
                    network.append(s)
            self._local, self._network = local, network
        return self._local, self._network

    def local(self, node: str) -> Sequence[Device]:
        return self._index()[0].get(node, ())

    def has_network(self) -> bool:
        return bool(self._index()[1])

    def reachable(self, node: str, labels: Mapping[str, str]) -> Sequence[Device]:
        """Devices a pod on ``node`` could be given: the node's own, then network-attached
        slices whose ``allNodes`` or ``nodeSelector`` takes the node."""
        local, network = self._index()
        out: list[Device] = list(local.get(node, ()))
        for s in network:
            if s.all_nodes or any(_term_matches(t, node, labels) for t in s.node_selector or ()):
                out.extend(s.devices)
        return out

    def device(self, d: DeviceId) -> Device | None:
        if self._by_id is None:
            local, network = self._index()
            self._by_id = {x.id: x for devs in local.values() for x in devs}
            self._by_id.update((x.id, x) for s in network for x in s.devices)
        return self._by_id.get(d)

    def counters(self) -> Mapping[tuple[str, str, str, str], int]:
        """Shared counters of partitionable devices: ``(driver, pool, set, counter)`` to
        what the pool has (milli-units)."""
        if self._counters is None:
            self._index()
            self._counters = {(s.driver, s.pool, cs, c): v for s in self.slices.values()
                              for cs, c, v in s.counters}
        return self._counters

    def selects(self, device: Device, expressions: Sequence[str],
                budget: Budget | None = None) -> bool:
        """:meth:`matches`, charged to a planning call's ``budget`` (:meth:`select`)."""
        if budget is None:
            return self.matches(device, expressions)
        return bool(self.select((device,), tuple(expressions), budget))

    def select(self, devices: Sequence[Device], expressions: tuple[str, ...],
               budget: Budget | None = None) -> list[Device]:
        """The ``devices`` every one of ``expressions`` takes, in order, charged to a
        planning call's ``budget``: a result ``Selectors`` keeps (per expression and what it
        reads of a device, ``Program.key``: the GPUs of one model share it whatever their
        ``uuid``) is a look-up, an evaluation is charged its steps, a compile its tokens.
        The evaluator is handed the steps the call has left; once they are spent a device
        whose result is not known counts as not selected (nothing is kept; the plan is over
        budget and says so)."""
        if budget is None:
            return [d for d in devices if self.matches(d, expressions)]
        sel = self.selectors
        progs = []
        for e in expressions:
            compiles, tokens = sel.compiles, sel.tokens
            prog = sel.program(e)  # compiled already unless dropped from the cache since
            budget.compiled(sel.compiles - compiles, sel.tokens - tokens)
            if isinstance(prog, str):
                return []  # refused: selects nothing (the claim says why)
            progs.append((e, prog))
        out: list[Device] = []
        hits = 0
        for d in devices:
            for e, prog in progs:
                got = sel.known(e, prog, d)
                if got is None:
                    budget.looked_up(hits)
                    hits = 0
                    evaluations, steps = sel.evaluations, sel.steps
                    got = sel.matches(e, d, budget=budget.cel_steps())
                    budget.evaluated(sel.evaluations - evaluations, sel.steps - steps)
                else:
                    hits += 1
                if not got:
                    break
            else:
                out.append(d)
        budget.looked_up(hits)
        return out

    def allocated(self) -> Mapping[DeviceId, ClaimKey]:
        """Every device some claim's ``status.allocation`` holds, with the claim."""
        if self._allocated is None:
            self._allocated = {d: c.key for c in self.claims.values()
                               for d in c.allocated or ()}
        return self._allocated

    def matches(self, device: Device, expressions: Iterable[str], *,
                budget: CelBudget | None = None) -> bool:
        """All ``expressions`` hold for ``device``; ``budget``: steps a plan lets all of its
        evaluations take together (``selectors.Budget``)."""
        return all(self.selectors.matches(e, device, budget=budget) for e in expressions)
