"""Preemption: its pure parts (which victims, what is in flight, what they free, what may be
disrupted, and who was promised the room), and carrying one out in the core's state. Nothing
here imports the core's state.

One module per concern, listed in the order they depend on each other (each imports only
those above it, and the core's values: records, resources, topology, the planner):

* :mod:`~coscheduling.state.nominations`: room promised to plain pods that preempted,
  kept out of capacity until they bind or the promise lapses.
* :mod:`~coscheduling.preemption.budgets`: PodDisruptionBudgets as the victim search reads
  them (how many pods each may still lose).
* :mod:`~coscheduling.preemption.freed`: the capacity view with candidate victims' room
  given back, and the regions (domains) a search walks.
* :mod:`~coscheduling.preemption.victims`: victim choice (:class:`VictimSearch`, in bounded
  slices) over that view.
* :mod:`~coscheduling.preemption.inflight`: the book of preemptions in flight (searching,
  evicting, waiting for victims to go; :class:`PreemptionExpired` when a deadline passes).

The carry part, :mod:`~coscheduling.preemption.carry`, carries a preemption out in the core's
state (``try_preempt``, evictions, victims gone, expiry), asked by ``gang_admission``, the
creation wing and the timers. The core's state holds this wing's book, budgets and
nominations, so importing :class:`~coscheduling.corestate.CoreState` here would close an
import circle (the acyclic contract): the carry part is handed the state and types it with
its own protocol, :class:`~coscheduling.preemption.carry.CoreView`, which lists every field it
reads or changes. The pure parts above never see the state at all (an import-linter contract
each, in ``pyproject.toml``).
"""
