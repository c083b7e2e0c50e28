"""Preemption: its pure parts (which victims, what is in flight, what they free, what may be
disrupted, and who was promised the room), what the wing remembers, and carrying one out in
the core's state.

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

What the wing remembers between events is its own, in
:mod:`~coscheduling.preemption.state` (:class:`~coscheduling.preemption.state.PreemptionState`:
the preemptions in flight, the nominations, the budgets and who tried in vain), which the core's
state composes. The carry part, :mod:`~coscheduling.preemption.carry`, carries a preemption out
over the core's state (``try_preempt``, evictions, victims gone, expiry), asked by admission,
the creation wing and the timers. The pure parts above never see the state at all (a contract
in ``pyproject.toml``).
"""
