"""The upstream gang API's objects as Lockstep keeps them: a ``scheduling.k8s.io`` PodGroup
(its policy, priority and scheduling condition) and a 1.35 Workload.

A leaf of plain records, apart from their parsing and rules in
``coscheduling.conventions.upstream``: the status model every convention's status is made
from (``coscheduling.conventions.base.StatusModel``) carries the PodGroups, and ``base`` sits
below the convention modules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..podgroup import GangKey, InvalidGang

__all__ = ["Condition", "GroupPolicy", "Priority", "UpstreamComposite", "UpstreamPodGroup",
           "UpstreamWorkload"]


@dataclass(frozen=True, slots=True)
class GroupPolicy:
    """A pod group's scheduling policy: ``min_count`` None is ``basic`` (no gang)."""

    min_count: int | None
    topology_key: str | None = None
    """``schedulingConstraints.topology[0].key``: all members in one domain of this label."""
    where: str = ""
    """The object and field path the policy came from, for reasons naming the field."""


@dataclass(frozen=True, slots=True)
class Condition:
    """A PodGroup status condition as the API server holds it."""

    type: str
    status: str
    reason: str
    message: str
    last_transition: str = ""


@dataclass(frozen=True, slots=True)
class UpstreamPodGroup:
    """An upstream ``PodGroup`` (v1alpha2, v1alpha3 or v1beta1), parsed."""

    key: GangKey
    version: str
    policy: GroupPolicy | None
    error: InvalidGang | None = None
    condition: Condition | None = None
    """The version's scheduling condition (``CONDITION_TYPES``), if present."""
    condition_managers: tuple[str, ...] = ()
    """Field managers that have written that condition (``metadata.managedFields``)."""
    generation: int = 0
    priority: Priority | None = None
    """The group's priority fields; None until parsed (or when the spec is invalid)."""
    parent: str | None = None
    """``spec.parentCompositePodGroupName`` (1.37, ``CompositePodGroup`` gate): the
    composite pod group this one is a subgroup of (``conventions.composite``)."""


@dataclass(frozen=True, slots=True)
class Priority:
    """A PodGroup's own priority fields (1.36+): ``priority`` (the 1.37 API server's
    admission fills it from ``priorityClassName``, as the test bed shows) and
    ``preemptionPolicy`` (1.37, behind ``PodGroupPreemptionPolicy``).

    ``disruptionMode`` is not read: the API server defaults it to ``{single: {}}``
    (``pkg/apis/scheduling/v1beta1/zz_generated.defaults.go`` in k8s.io/kubernetes
    v1.37.2) and records the default as the creator's field, so a user's choice cannot be
    told from the default; and a gang evicted in part stops anyway. Lockstep evicts a
    victim gang whole whatever it says (docs/preemption.md)."""

    value: int | None = None
    class_name: str | None = None
    never: bool = False


@dataclass(frozen=True, slots=True)
class UpstreamWorkload:
    """An upstream v1alpha1 ``Workload``: its pod groups' policies by name."""

    key: GangKey
    version: str
    groups: Mapping[str, GroupPolicy | InvalidGang]


@dataclass(frozen=True, slots=True)
class UpstreamComposite:
    """An upstream ``CompositePodGroup`` (``scheduling.k8s.io/v1alpha3``, 1.37), parsed: a
    group of PodGroups (those naming it as their parent)."""

    key: GangKey
    version: str
    min_groups: int | None
    """``spec.schedulingPolicy.gang.minGroupCount``; None for ``basic`` (no gang over the
    children: each PodGroup is its own gang)."""
    topology_key: str | None = None
    """``spec.schedulingConstraints.topology[0].key``: every child in one domain of it."""
    error: InvalidGang | None = None
    priority: Priority | None = None
