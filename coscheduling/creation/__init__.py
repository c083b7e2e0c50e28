"""Placement at creation: the webhook's question "pin this member now, or gate it?", and the
gated members lifted once their gang is admitted.

* :mod:`~coscheduling.creation.placer`: a member being created is pinned (its gang's quorum
  exists and fits), held (:class:`~coscheduling.actions.AwaitQuorum`: sibling reviews may
  complete the quorum) or gated; pins not seen in the watch are taken back.
* :mod:`~coscheduling.creation.gated`: gangs behind Lockstep's gate, admitted without a filter
  call, and which held pods lose the gate, pinned to which node.

The two are independent of each other; both are rules over
:class:`~coscheduling.corestate.CoreState` (admission, membership) and nothing below the facade
imports them but ``core`` and ``deadlines``. What stays outside, and why:

* the webhook's answers (``PinAtCreation``, ``AwaitQuorum``, ``GateAtCreation``) are
  :mod:`coscheduling.actions`, beside the other decisions the app acts on, and the reviews
  being held are :class:`~coscheduling.corestate.HeldReviews`: the core's state names both, so
  in this package they would close an import circle (the state imports them, the placer
  imports the state);
* the gate itself is :mod:`coscheduling.gang.gating`: the records, ingest and admission read it,
  as the lifter and the placer do, so it is shared, not this wing's.
"""
