"""``--topology-levels``: the topology levels between nodes, from one flag or env variable.

Sites label racks and blocks their own way; the core's defaults (``DEFAULT_LEVELS``) read the
common vendors' spellings. The value is ``name=key[,key...]`` per level, coarse to fine,
levels separated by ``;``, e.g. ``zone=topology.kubernetes.io/zone;rack=example.com/rack,
lockstep.dev/rack;hostname=kubernetes.io/hostname`` (the Helm chart's ``topologyLevels``).
"""

from __future__ import annotations

import re

from coscheduling.topology.domains import HOSTNAME, Level

__all__ = ["LevelsError", "parse_levels"]

_NAME = re.compile(r"^[a-z][a-z0-9-]*$")
# A label key: an optional DNS prefix and a name (the API server's own rule, loosely).
_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class LevelsError(ValueError):
    """What is wrong with the value, naming the part."""


def parse_levels(text: str) -> tuple[Level, ...]:
    """The levels ``text`` names, or :class:`LevelsError`. The finest level must be the node
    itself (``kubernetes.io/hostname``): a gang's members are placed node by node."""
    levels: list[Level] = []
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        name, eq, keys_text = part.partition("=")
        name = name.strip()
        if not eq or not _NAME.match(name):
            raise LevelsError(f"{part!r}: expected name=label-key[,label-key...] with a "
                              f"lower-case name")
        keys = tuple(k.strip() for k in keys_text.split(",") if k.strip())
        if not keys:
            raise LevelsError(f"level {name!r} has no label key")
        for k in keys:
            if not _KEY.match(k):
                raise LevelsError(f"level {name!r}: {k!r} is not a label key")
        if any(lv.name == name for lv in levels):
            raise LevelsError(f"level {name!r} is named twice")
        levels.append(Level(name, keys))
    if not levels:
        raise LevelsError("no levels given")
    if levels[-1].keys != (HOSTNAME,):
        raise LevelsError(f"the last level must be the node: hostname={HOSTNAME}")
    return tuple(levels)
