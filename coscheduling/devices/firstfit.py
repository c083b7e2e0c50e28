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

from .demand import ClaimNeed, Need
from .inventory import DeviceInventory
from .model import ClaimKey, Device, DeviceId

__all__ = ["first_fit"]


def first_fit(inv: DeviceInventory, claims: Sequence[ClaimNeed], node: str,
              labels: Mapping[str, str], taken: Collection[DeviceId]
              ) -> tuple[tuple[ClaimKey, DeviceId], ...] | None:
    """The devices first fit gives ``claims`` on ``node`` (claims already allocated keep
    theirs and are left out), or None when it finds none (kube-scheduler's own filter then
    refuses the node). ``taken``: devices allocated in kube-scheduler's memory but not yet
    in the API (other members that passed the filter). A ``firstAvailable`` request gets
    its first subrequest that can be had; partitions whose shared counters are spent are
    passed over."""
    devices = inv.reachable(node, labels)
    allocated = inv.allocated()
    used = set(taken)
    counters = _Counters(inv, {*allocated, *used})
    out: list[tuple[ClaimKey, DeviceId]] = []
    for c in claims:
        if c.allocated is not None:
            continue
        for need in c.needs:
            for option in need.alternatives or (need,):
                pick = _pick(inv, option, devices, allocated, used, counters)
                if pick is not None:
                    break
            else:
                return None
            used.update(pick)
            for d in pick:
                counters.take(d)
            out.extend((c.key, d) for d in pick)
    return tuple(out)


class _Counters:
    """Shared counters of partitionable devices, as devices are taken."""

    def __init__(self, inv: DeviceInventory, taken: Collection[DeviceId]) -> None:
        self.inv = inv
        self.have = inv.counters()
        self.used: dict[tuple[str, str, str, str], int] = {}
        if self.have:
            for d in taken:
                self.take(d)

    def take(self, d: DeviceId) -> None:
        dev = self.inv.device(d)
        if dev is None:
            return
        for cs, c, v in dev.consumes:
            k = (dev.driver, dev.pool, cs, c)
            self.used[k] = self.used.get(k, 0) + v

    def allow(self, picks: Sequence[DeviceId]) -> bool:
        extra: dict[tuple[str, str, str, str], int] = {}
        for d in picks:
            dev = self.inv.device(d)
            if dev is None:
                continue
            for cs, c, v in dev.consumes:
                k = (dev.driver, dev.pool, cs, c)
                extra[k] = extra.get(k, 0) + v
        return all(self.used.get(k, 0) + v <= self.have.get(k, 0) for k, v in extra.items())


def _pick(inv: DeviceInventory, need: Need, devices: Sequence[Device],
          allocated: Mapping[DeviceId, str], used: Collection[DeviceId], counters: _Counters
          ) -> list[DeviceId] | None:
    matching = [d.id for d in devices if inv.selects(d, need.selectors)]
    if need.request.mode == "All":
        if not matching or any(d in used or d in allocated for d in matching):
            return None
        return matching if counters.allow(matching) else None
    pick: list[DeviceId] = []
    for d in matching:
        if d not in used and d not in allocated and counters.allow([*pick, d]):
            pick.append(d)
            if len(pick) == need.request.count:
                return pick
    return None
