"""The containers the core's state is made of, each keeping its own invariants: the cluster as
the API server showed it and the watch's bookkeeping (``cluster``), reservations for gangs
(``ledger``) and for plain pods that preempted (``nominations``), each gang's state machine
(``gang``), parked bind calls (``waiting``), pods outside any gang (``plain``) and what the app
must act on (``outbox``).

They import only values, topology and the conventions' records; the rules above them are
handed :class:`~coscheduling.corestate.CoreState`, which composes them with the wings' own
state.
"""
