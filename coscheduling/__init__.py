"""Lockstep's pure core: gangs, reservations, placement and the waiting map.

No network, no framework, no clock: callers pass ``now`` and Kubernetes objects as plain
dicts, and get typed decisions and reasons back. ``app`` adapts HTTP and Kubernetes to it.
"""

from .conventions.scheduler_plugins import podgroup_from_json
from .core import Coscheduler
from .creation import AwaitQuorum, GateAtCreation, PinAtCreation
from .decisions import (
    BindFailed,
    BindGroup,
    BindNow,
    BindOutcome,
    Bound,
    Eviction,
    FilterDecision,
    GangExpired,
    Lift,
    Notice,
    NoticeKind,
    Park,
    Reject,
    Unparked,
)
from .gang import GangPhase
from .planner import NoFit, Plan
from .podgroup import GangDefaults, GangKey, GangSpec, InvalidGang, gang_key
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
from .state import Settings
from .topology import DEFAULT_LEVELS, Level
from .views import STATES as GANG_STATES
from .views import GangView

__all__ = [
    "DEFAULT_LEVELS",
    "GANG_STATES",
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
    "Level",
    "Lift",
    "NoFit",
    "NodeName",
    "NodeRecord",
    "Notice",
    "NoticeKind",
    "Park",
    "PinAtCreation",
    "Plan",
    "PodKey",
    "PodRecord",
    "QuantityError",
    "RecordError",
    "Reject",
    "Resources",
    "Settings",
    "Unparked",
    "format_resources",
    "gang_key",
    "node_from_json",
    "pod_from_json",
    "pod_key",
    "podgroup_from_json",
    "priority_class_from_json",
]
