"""Preemption's pure parts: which victims, what is in flight, what they free, what may be
disrupted, and who was promised the room. Nothing here reads the core's state.

One module per concern, listed in the order they depend on each other (each imports only
those above it, and the core's values: records, resources, topology, the planner):

* :mod:`~coscheduling.preemption.nominations`: room promised to plain pods that preempted,
  kept out of capacity until they bind or the promise lapses.
* :mod:`~coscheduling.preemption.budgets`: PodDisruptionBudgets as the victim search reads
  them (how many pods each may still lose).
* :mod:`~coscheduling.preemption.freed`: the capacity view with candidate victims' room
  given back, and the regions (domains) a search walks.
* :mod:`~coscheduling.preemption.victims`: victim choice (:class:`VictimSearch`, in bounded
  slices) over that view.
* :mod:`~coscheduling.preemption.book`: the book of preemptions in flight (searching,
  evicting, waiting for victims to go; :class:`PreemptionExpired` when a deadline passes).

Carrying a preemption out in the core's state (``try_preempt``, evictions, victims gone,
expiry) is :mod:`coscheduling.preempting`, at the rules level beside ``gang_admission``: the
core's state holds the book, the budgets and the nominations, so a module here that read
:class:`~coscheduling.corestate.CoreState` would close an import circle (the acyclic contract).
"""
