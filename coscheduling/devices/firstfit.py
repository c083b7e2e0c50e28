"""What kube-scheduler's DynamicResources plugin will allocate a pod on one node, predicted.

Facts from the Kubernetes v1.34 source (``pkg/scheduler/framework/plugins/dynamicresources``
and ``staging/src/k8s.io/dynamic-resource-allocation/structured``): the plugin allocates one
pod at a time, at Filter, per node, keeps the result in memory at Reserve and writes
``status.allocation`` in PreBind, before it calls the extender's bind. The allocator walks the
pools that reach the node (``GatherPools``: built from a Go map, so the order of *several*
pools is not fixed), each pool's slices, each slice's devices in order, and takes the first
devices that match and are not allocated (in the API, or in flight in its own memory).

So on a node whose devices come from one pool (NVIDIA's driver publishes one pool per node),
first fit is predictable: for each claim in the pod's order, each request in order, the first
``count`` matching devices not taken. With several pools the prediction may differ from the
allocation; the bind-time check (``coscheduling.devices.align.outside``) catches that.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from .demand import ClaimNeed
from .inventory import DeviceInventory
from .model import ClaimKey, DeviceId

__all__ = ["first_fit"]


def first_fit(inv: DeviceInventory, claims: Sequence[ClaimNeed], node: str,
              labels: Mapping[str, str], taken: Collection[DeviceId]
              ) -> tuple[tuple[ClaimKey, DeviceId], ...] | None:
    """The devices first fit gives ``claims`` on ``node`` (claims already allocated keep
    theirs and are left out), or None when it finds none (kube-scheduler's own filter then
    refuses the node). ``taken``: devices allocated in kube-scheduler's memory but not yet
    in the API (other members that passed the filter)."""
    devices = inv.reachable(node, labels)
    allocated = inv.allocated()
    used = set(taken)
    out: list[tuple[ClaimKey, DeviceId]] = []
    for c in claims:
        if c.allocated is not None:
            continue
        for need in c.needs:
            matching = [d.id for d in devices if inv.matches(d, need.selectors)]
            if need.request.mode == "All":
                if not matching or any(d in used or d in allocated for d in matching):
                    return None
                pick = matching
            else:
                pick = [d for d in matching if d not in used and d not in allocated
                        ][:need.request.count]
                if len(pick) < need.request.count:
                    return None
            used.update(pick)
            out.extend((c.key, d) for d in pick)
    return tuple(out)
