"""GPUs (and any device) from Dynamic Resource Allocation (``resource.k8s.io/v1``).

The wing's modules, each one concern: ``model`` (the records), ``wire`` (the API's JSON to
records, bounded), ``selectors`` (CEL, cached), ``inventory`` (what the watches said, indexed
per node), ``demand`` (a pod's claims resolved), ``matching`` (the gang's joint device plan),
``firstfit`` (kube-scheduler's first fit, predicted), ``align`` (its allocation made to equal
the plan), ``room`` (devices admitted gangs hold, and the planner's read of what is free),
``stale`` (allocations left behind, to clear) and ``narrow`` (a claim narrowed at creation to
its planned subrequest).

The core's state holds the wing's inventory and the rules (planner, admission, filter, bind)
call into the wing, so the wing imports only leaves (records, resources, the ledger, the
gang, the outbox, reasons) and never the state or the rules; the four watched kinds' events
are a rule module over the state, ``coscheduling.events.dra``. A pod's
``spec.resourceClaims`` is parsed with the pod (``records.PodClaim``). The design is argued in
``docs/dra.md``.
"""
