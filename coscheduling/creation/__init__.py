"""Placement at creation: the webhook's question "pin this member now, hold its review, or gate
it?", and the gated members lifted once their gang is admitted.

* :mod:`~coscheduling.creation.placer`: a member being created is pinned (its gang's quorum
  exists and fits), held (:class:`~coscheduling.actions.AwaitQuorum`: sibling reviews may
  complete the quorum) or gated; pins the watch does not show in time are taken back.
* :mod:`~coscheduling.creation.gated`: gangs behind Lockstep's gate, admitted by a sweep
  without a filter call, and which gated pods lose the gate, pinned to which node.
* :mod:`~coscheduling.creation.state`: what the wing remembers (:class:`~coscheduling.creation.
  state.CreationState`): reviews **held** for their quorum, gangs created slowly, answers
  not yet collected, members **pinned** the watch has not shown, and the **gated** gangs'
  sweep. "Held" means only a review waiting for its quorum; a gang behind the gate is
  "gated".

The placer and the gated sweep are independent of each other (a contract); both are rules over
:class:`~coscheduling.corestate.CoreState`, which composes this wing's state beside the
others'.
"""
