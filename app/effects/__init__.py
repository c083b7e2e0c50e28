"""What the core decides, carried out: bindings and parked bind calls, admission reviews
held for their gang's quorum, Events, gate lifts, evictions, DRA deallocations and PodGroup
statuses."""
