"""Defragmentation: moving pods to make room for a waiting gang (issue 45), preemption's
sibling.

A gang that fits the free capacity overall, but no node it needs has room for it, may have
one node freed by *moving* pods: evicting pods their controllers recreate, each with room
reserved elsewhere now, so a move never turns into a loss. One module per concern, each
importing only those above it:

* :mod:`~coscheduling.defrag.movable`: which pods may move (and why not), as values.
* :mod:`~coscheduling.defrag.search`: the bounded search for the fewest pods to move (then
  the fewest GPU-seconds lost), and where each moved pod goes. Pure: a capacity view in,
  :class:`~coscheduling.defrag.search.Moves` or a sentence out.
* :mod:`~coscheduling.defrag.state`: what the wing remembers (gangs waiting since when,
  moves in the last minute, room reserved for each moved pod's replacement, pods moved
  once).
* :mod:`~coscheduling.defrag.carry`: carrying a move out over the core's state: the gang is
  admitted into the freed node through the preemption book (so the freed room is held
  exactly as a preemption holds it), the moved pods go through the Eviction API, and
  their replacements are steered to the room reserved for them in the filter.
"""
