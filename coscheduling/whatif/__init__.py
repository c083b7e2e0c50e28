"""The what-if wing: would objects not created yet fit, where, whom would they preempt, or
why not (``lockstep explain --what-if``).

``expand`` reads the manifest's objects as the pods they would create; ``dryrun`` plans
them against the live state through read-only views, by the core's own rules, and returns
an :class:`~.answer.Proposal`. Nothing here writes to the core's state.
"""

from .answer import Earliest, Outcome, Placed, Proposal, Verdict, VictimSet, WhatIfError
from .dryrun import DryRun, Offload
from .expand import MAX_OBJECTS, expand

__all__ = ["MAX_OBJECTS", "DryRun", "Earliest", "Offload", "Outcome", "Placed", "Proposal",
           "Verdict", "VictimSet", "WhatIfError", "expand"]
