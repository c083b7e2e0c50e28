"""GPUs (and any device) from Dynamic Resource Allocation (``resource.k8s.io/v1``).

The wing's modules, each one concern: ``model`` (the records), ``wire`` (the API's JSON to
records, bounded), ``selectors`` (CEL, cached), ``inventory`` (what the watches said, indexed
per node), ``demand`` (a pod's claims resolved), ``matching`` (the gang's joint device plan),
``book`` (devices admitted gangs hold, and the planner's read of what is free). Watch events
come in through ``coscheduling.dra_events``. The design is argued in ``docs/dra.md``.
"""
