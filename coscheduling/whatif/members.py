"""The proposal's pods as the core would hold them, and the units they form: each gang
whole, each pod outside any gang alone.

Membership is resolved exactly as for a pod that arrives (``conventions.resolve`` and the
upstream resolver), over the groups the store holds with the manifest's own laid on top: a
PyTorchJob's PodGroup that does not exist yet counts, and nothing is written anywhere.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..conventions import resolve
from ..conventions.base import PodGroupRecord, Source
from ..conventions.upstream import combine, resolve_upstream
from ..corestate import CoreState
from ..podgroup import GangSpec, InvalidGang, Membership, MissingPodGroup
from ..records import GangKey, PodRecord, RecordError, pod_from_json
from ..resources import QuantityError
from .answer import WhatIfError
from .expand import Expanded, Manifest

__all__ = ["Unit", "units_of"]


@dataclass(slots=True)
class Unit:
    """One gang of the proposal (``gang`` set), or one pod outside any gang."""

    name: str
    membership: Membership
    pods: list[PodRecord] = field(default_factory=list)
    named: dict[str, bool] = field(default_factory=dict)
    """Per pod key: its name is known at creation (the webhook may pin it)."""
    specs: dict[str, GangSpec] = field(default_factory=dict)
    """Per pod key of a group of groups' member: its own spec (its subgroup, ``part``)."""

    @property
    def gang(self) -> GangKey | None:
        m = self.membership
        return m.key if isinstance(m, GangSpec | InvalidGang | MissingPodGroup) else None


def _record(st: CoreState, m: Manifest) -> PodRecord:
    """The pod's record, its priority resolved from its class as the API server would."""
    obj: dict[str, Any] = m.obj
    spec = obj["spec"]
    where = f"{m.source}: pod {obj['metadata']['name']}"
    cls = spec.get("priorityClassName")
    if cls and spec.get("priority") is None:
        pc = st.store.priority_classes.get(str(cls))
        if pc is None:
            raise WhatIfError(f"{where}.spec.priorityClassName",
                              f"{str(cls)[:253]!r} is not a PriorityClass of the cluster")
        obj = {**obj, "spec": {**spec, "priority": pc.value}}
    try:
        pod = pod_from_json(obj)
    except RecordError as e:
        raise WhatIfError(f"{where}: {e.field_path}", e.reason) from None
    except QuantityError as e:
        raise WhatIfError(f"{where}.spec", str(e)) from None
    names = st.settings.scheduler_names
    if pod.scheduler_name not in names:
        raise WhatIfError(f"{where}.spec.schedulerName",
                          f"{pod.scheduler_name[:253]!r} is not Lockstep's (it schedules "
                          f"{', '.join(sorted(names))}): another scheduler places this pod")
    if pod.node_name is not None:
        raise WhatIfError(f"{where}.spec.nodeName", "set: the pod is placed already")
    if pod.key in st.store.pods:
        raise WhatIfError(f"{where}.metadata.name",
                          f"a pod named {pod.key} exists already: a what-if is for pods "
                          "not created yet")
    return replace(pod, gated=False)


def _resolve(st: CoreState, pod: PodRecord, groups: Mapping[Source, Mapping[str, PodGroupRecord]]
             ) -> Membership:
    """``membership.resolve_pod`` over the store's groups with the manifest's on top."""
    store, settings = st.store, st.settings
    # store.groups read, never groups_of (which adds an empty table: a what-if changes nothing).
    objects = {source: ChainMap({GangKey(k): v for k, v in groups.get(source, {}).items()},
                                store.groups.get(source, {}))
               for source in {*store.groups, *groups}}
    m = resolve(pod, objects, settings.defaults)
    if pod.scheduling_group is None and pod.workload_ref is None:
        return m
    return combine(m, resolve_upstream(pod, store.upstream, store.workloads,
                                       settings.defaults, settings.levels,
                                       store.composites, store.children))


def units_of(st: CoreState, found: Expanded) -> list[Unit]:
    """The proposal's units in the order their first pod appears in the manifest. A gang
    that exists already is refused: a what-if answers for new work."""
    units: dict[str, Unit] = {}
    seen: set[str] = set()
    for m in found.pods:
        pod = _record(st, m)
        if pod.key in seen:
            raise WhatIfError(f"{m.source}.metadata.name", f"pod {pod.key} appears twice")
        seen.add(pod.key)
        ms = _resolve(st, pod, found.groups)
        gang = ms.key if isinstance(ms, GangSpec | InvalidGang | MissingPodGroup) else None
        if gang is not None and (g := st.gangs.get(gang)) is not None and g.members:
            raise WhatIfError(f"{m.source}", f"gang {gang} exists already ({len(g.members)} "
                              "member(s)): a what-if is for gangs not created yet")
        name = str(gang) if gang is not None else str(pod.key)
        unit = units.get(name)
        if unit is None:
            unit = units[name] = Unit(name, ms)
        elif isinstance(unit.membership, GangSpec) and isinstance(ms, GangSpec) \
                and ms.part == unit.membership.part \
                and ms.min_member != unit.membership.min_member:
            raise WhatIfError(f"{m.source}", f"members of gang {gang} disagree on minMember "
                              f"({unit.membership.min_member} and {ms.min_member})")
        unit.pods.append(pod)
        unit.named[str(pod.key)] = m.named
        if isinstance(ms, GangSpec) and ms.part is not None:
            unit.specs[str(pod.key)] = ms
    return list(units.values())


def ordered(pods: Sequence[PodRecord]) -> list[PodRecord]:
    """Members in name order, as the core lists a gang's live members."""
    return sorted(pods, key=lambda p: p.key)
