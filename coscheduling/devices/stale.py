"""Allocations nobody will use: a claim kube-scheduler allocated for a gang member and then
let go of (Unreserve after a refused or failed bind, a gang that timed out), left allocated.

kube-scheduler's Unreserve removes the pod from ``status.reservedFor`` but keeps
``status.allocation`` (v1.34 source): the member then holds its devices while its gang waits,
and they are lost to every other gang (KAI-Scheduler #1217 is that, until a restart). Lockstep
clears such an allocation, as the DynamicResources plugin's own PostFilter does for a claim
that keeps its pod from every node, when:

* the claim was made for one pod (from a template: owned by the pod), reserved for nobody,
  not being deleted;
* that pod is an unbound gang member;
* its gang's plan no longer holds it, or the allocation takes devices another member's plan
  holds.

The write is a merge patch of ``status.allocation`` to null, preconditioned on the claim's
uid and resourceVersion: if kube-scheduler reserved it meanwhile, the write fails and nothing
is lost.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..records import PodKey, PodRecord
from ..state.ledger import Reservation
from .inventory import DeviceInventory
from .model import Claim
from .room import held_devices

__all__ = ["stale"]


def stale(inv: DeviceInventory, claim: Claim, pods: Mapping[PodKey, PodRecord],
          member: Callable[[PodKey], bool],
          reservation: Callable[[PodKey], Reservation | None]) -> bool:
    """Whether ``claim``'s allocation is one nobody will use (see the module)."""
    if claim.allocated is None or claim.reserved_for or claim.deleting or claim.owner is None:
        return False
    key = PodKey(f"{claim.namespace}/{claim.owner}")
    pod = pods.get(key)
    if pod is None or pod.node_name is not None or not member(key):
        return False
    held_devices(inv, reservation)  # drops plans whose slot is gone
    mine = inv.planned.get(key)
    if mine is None:
        return True
    others = {d for p, pd in inv.planned.items() if p != key
              for c, d in pd.devices if c != claim.key}
    return any(d in others for d in claim.allocated)
