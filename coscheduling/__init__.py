"""Lockstep's pure core: gangs, reservations, placement and the waiting map.

No network, no framework, no clock: callers pass ``now`` and Kubernetes objects as plain
dicts, and get typed decisions and reasons back. ``app`` adapts HTTP and Kubernetes to it.

This package's names are the core's public surface, with three modules of values the
adapter renders or writes: ``coscheduling.reasons`` (why Lockstep said no),
``coscheduling.topology.domains`` and ``coscheduling.topology.gpus`` (the labels and
levels it reads), and ``coscheduling.conventions`` (each convention's objects and how their
status is written). ``app`` imports nothing else (an import-linter contract in ``pyproject.toml``).
The facade, :class:`Coscheduler`, takes commands (events and verbs in, decisions out, and one
``drain()`` of what the app must act on); every read goes through its ``queries``
(:class:`Queries`), which changes nothing.

Modules are named for what they hold, and no two alike for different things. The cluster as
the API server showed it is ``state.cluster`` (``ClusterStore``); the core's own state around it,
the one object the rule modules share, is ``corestate`` (``CoreState``, private to the
facade); the record types both hold, with the names and keys every module shares, are
``records``. What the app carries out is ``actions``; why Lockstep said no is ``reasons``.
A gang let into reserved capacity is ``gang.admission``; Kubernetes' admission webhook is the
placement-at-creation wing, ``creation/``. Preemption is one wing, ``preemption/``: its pure
part and the part that carries a preemption out (``preemption.carry``).
"""

from .actions import (
    Answer,
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
from .conventions.scheduler_plugins import podgroup_from_json
from .core import Coscheduler, Drained
from .corestate import PlainVerdict, Settings
from .devices.selectors import warm as warm_selectors
from .events.ingest import PODS, Kind
from .events.watched import Watched
from .events.watched import table as watched_table
from .gang.gating import (
    GANG_GATE,
    declares_gang,
    lift_patch,
    pinned_node,
    pinned_terms,
    unpinned_terms,
)
from .placement.planner import NoFit, Plan
from .podgroup import GangDefaults, GangKey, GangSpec, InvalidGang, MissingPodGroup, gang_key
from .queries import Queries
from .ranks import format_rank
from .readmodel import STATES as GANG_STATES
from .readmodel import GangView
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
from .state.gang import GangPhase
from .topology.domains import DEFAULT_LEVELS, Level
from .topology.eligibility import affinity_problem, eligible
from .whatif import DryRun, Offload, Outcome, Placed, Proposal, Verdict, VictimSet, WhatIfError

__all__ = [
    "DEFAULT_LEVELS",
    "GANG_GATE",
    "GANG_STATES",
    "PODS",
    "Answer",
    "AwaitQuorum",
    "BindFailed",
    "BindGroup",
    "BindNow",
    "BindOutcome",
    "Bound",
    "Coscheduler",
    "Drained",
    "DryRun",
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
    "Offload",
    "Outcome",
    "Park",
    "PinAtCreation",
    "Placed",
    "PlainVerdict",
    "Plan",
    "PodKey",
    "PodRecord",
    "Proposal",
    "QuantityError",
    "Queries",
    "RecordError",
    "Reject",
    "Resources",
    "Settings",
    "Unparked",
    "Verdict",
    "VictimSet",
    "Watched",
    "WhatIfError",
    "affinity_problem",
    "declares_gang",
    "eligible",
    "format_rank",
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
    "watched_table",
]
