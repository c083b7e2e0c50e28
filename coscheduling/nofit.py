"""Why a whole gang has no placement: the planner's negative answer, in a leaf module so the
reasons that render it need not import the planner."""

from __future__ import annotations

from dataclasses import dataclass, field

from .resources import Resources

__all__ = ["NoFit"]


@dataclass(frozen=True, slots=True)
class NoFit:
    members: int
    shape: Resources
    """The largest member's request (all members when they are alike)."""
    free_units: int
    """How many members of that shape fit in the free capacity, ignoring topology."""
    eligible_nodes: int
    required_level: str | None = None
    widest_domain_fit: int = 0
    """With a required level: the most members any single domain could hold."""
    notes: tuple[str, ...] = field(default_factory=tuple)
