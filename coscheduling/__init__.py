"""Lockstep's pure core: gangs, reservations, placement and the waiting map.

No network, no framework, no clock: callers pass ``now`` and Kubernetes objects as plain
dicts, and get typed decisions and reasons back. ``app`` adapts HTTP and Kubernetes to it.

This package's names are the core's public surface, with three modules of values the
adapter renders or writes: ``coscheduling.reasons`` (why Lockstep said no),
``coscheduling.topology`` and ``coscheduling.gputopo`` (the labels and levels it reads),
and ``coscheduling.conventions`` (each convention's objects and how their status is
written). ``app`` imports nothing else (an import-linter contract in ``pyproject.toml``).
"""

from .conventions.scheduler_plugins import podgroup_from_json
from .core import Coscheduler
from .decisions import (
    AwaitQuorum,
    BindFailed,
    BindGroup,
    BindNow,
    BindOutcome,
    Bound,
    Eviction,
    FilterDecision,
    GangExpired,
    GateAtCreation,
    Lift,
    Notice,
    NoticeKind,
    Park,
    PinAtCreation,
    Reject,
    Unparked,
)
from .devices.selectors import warm as warm_selectors
from .eligibility import affinity_problem, eligible
from .gang import GangPhase
from .gating import (
    GANG_GATE,
    declares_gang,
    lift_patch,
    pinned_node,
    pinned_terms,
    unpinned_terms,
)
from .ingest import PODS, Kind
from .planner import NoFit, Plan
from .podgroup import GangDefaults, GangKey, GangSpec, InvalidGang, MissingPodGroup, gang_key
from .records import (
    NodeName,
    NodeRecord,
    PodKey,
    PodRecord,
    RecordError,
    node_from_json,
    pod_from_json,
    pod_key,
    priority_class_from_json,
)
from .resources import QuantityError, Resources, format_resources
from .state import PlainVerdict, Settings
from .topology import DEFAULT_LEVELS, Level
from .views import STATES as GANG_STATES
from .views import GangView
from .watched import WATCHED, Watched

__all__ = [
    "DEFAULT_LEVELS",
    "GANG_GATE",
    "GANG_STATES",
    "PODS",
    "WATCHED",
    "AwaitQuorum",
    "BindFailed",
    "BindGroup",
    "BindNow",
    "BindOutcome",
    "Bound",
    "Coscheduler",
    "Eviction",
    "FilterDecision",
    "GangDefaults",
    "GangExpired",
    "GangKey",
    "GangPhase",
    "GangSpec",
    "GangView",
    "GateAtCreation",
    "InvalidGang",
    "Kind",
    "Level",
    "Lift",
    "MissingPodGroup",
    "NoFit",
    "NodeName",
    "NodeRecord",
    "Notice",
    "NoticeKind",
    "Park",
    "PinAtCreation",
    "PlainVerdict",
    "Plan",
    "PodKey",
    "PodRecord",
    "QuantityError",
    "RecordError",
    "Reject",
    "Resources",
    "Settings",
    "Unparked",
    "Watched",
    "affinity_problem",
    "declares_gang",
    "eligible",
    "format_resources",
    "gang_key",
    "lift_patch",
    "node_from_json",
    "pinned_node",
    "pinned_terms",
    "pod_from_json",
    "pod_key",
    "podgroup_from_json",
    "priority_class_from_json",
    "unpinned_terms",
    "warm_selectors",
]
