"""Making kube-scheduler's allocation equal the plan: checked at the filter, at the bind, and
when the watch shows an allocation. The design is argued in ``docs/dra.md``.

* **Filter** (:func:`align`): a member is handed its planned node only when kube-scheduler's
  predictable first fit there (``firstfit``) keeps every plan on that node feasible. The
  prediction becomes the member's devices, and the other members planned on the node (of any
  gang) are matched again around it, within their gangs' holds and the free devices: with
  interchangeable GPUs a plan's device names are a witness, not a promise. When first fit
  would take a device another gang's plan cannot do without, the member waits (turned away,
  woken when claims change) instead of taking it.
* **Bind** (:func:`outside`): the allocation is written before the extender's bind. A bind
  whose devices are held by another gang's member is refused; kube-scheduler's Unreserve
  then takes the pod out of ``reservedFor``.
* **Watch** (:func:`observed`): an allocation seen for a planned member becomes its devices.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..records import NodeName, NodeRecord, PodKey, PodRecord
from ..state.ledger import Reservation
from .budget import Budget
from .demand import DEFERRED, DEFERRED_REASON, ClaimNeed, pod_demand
from .firstfit import first_fit
from .inventory import DeviceInventory, PlannedDevices
from .matching import JointTrial
from .model import DeviceId
from .room import held_devices

__all__ = ["align", "observed", "outside", "spared"]


def _chosen(inv: DeviceInventory) -> set[DeviceId]:
    """Devices of members kube-scheduler has chosen for (in flight or allocated)."""
    return {d for pd in inv.planned.values() if pd.chosen for _, d in pd.devices}


def align(inv: DeviceInventory, nodes: Mapping[NodeName, NodeRecord],
          pods: Mapping[PodKey, PodRecord],
          reservation: Callable[[PodKey], Reservation | None],
          gang_of: Callable[[PodKey], str],
          pod: PodRecord, node: NodeName) -> str | None:
    """None when ``pod`` may go to ``node`` (its devices now those first fit will give);
    else why it waits."""
    held = held_devices(inv, reservation)
    mine = inv.planned.get(pod.key)
    if mine is None or mine.chosen or not pod.claims:
        return None
    claims = pod_demand(inv, pod)
    if isinstance(claims, str):
        return claims
    if claims is DEFERRED:
        return DEFERRED_REASON
    shared = _chosen_claims(inv, pod.key)
    claims = _known(claims, shared)
    n = nodes.get(node)
    labels = n.labels if n is not None else {}
    ff = first_fit(inv, claims, node, labels, _chosen(inv) - {d for _, d in mine.devices})
    if ff is not None:  # a shared claim keeps the devices its first member was given
        ff = (*ff, *((c.key, d) for c in claims if c.key in shared for d in shared[c.key]))
    if ff is None:
        return None  # kube-scheduler's own filter refuses the node; nothing is allocated
    blocked = _rematch(inv, nodes, pods, held, pod.key, node, ff)
    if isinstance(blocked, dict):
        for k, pd in blocked.items():
            inv.planned[k] = pd
        inv.epoch += 1
        return None
    holder = held.get(blocked) if blocked is not None else None
    whose = f" (held by gang {gang_of(holder)})" if holder is not None else ""
    return (f"first fit on {node} would give it {', '.join(d[2] for _, d in ff)}, "
            f"which the plans there cannot spare{whose}; it waits for them to be allocated")


def _rematch(inv: DeviceInventory, nodes: Mapping[NodeName, NodeRecord],
             pods: Mapping[PodKey, PodRecord], held: Mapping[DeviceId, PodKey],
             key: PodKey, node: NodeName, ff: tuple[tuple[str, DeviceId], ...]
             ) -> dict[PodKey, PlannedDevices] | DeviceId | None:
    """The plans of the other unchosen members that share devices with ``node``, matched
    again with ``key`` holding ``ff``; or a device of ``ff`` they could not do without."""
    taken = {d for _, d in ff}
    movable = {p: pd for p, pd in inv.planned.items()
               if p != key and not pd.chosen and p in pods
               and (pd.node == node or any(d in taken for _, d in pd.devices))}
    keep = {d: p for d, p in held.items() if p not in movable and p != key}
    budget = Budget()
    trial = JointTrial(inv, nodes, {**keep, **dict.fromkeys(taken, key)}, budget)
    for p, pd in sorted(movable.items()):
        claims = pod_demand(inv, pods[p], budget)
        if isinstance(claims, tuple):
            claims = _known(claims, _by_claim(ff))  # a claim it shares with ``key``
        if not isinstance(claims, tuple) or not trial.add(p, claims, NodeName(pd.node)):
            return next((d for _, d in pd.devices if d in taken), None)
    out = trial.planned()
    out[key] = PlannedDevices(node, ff, chosen=True)
    return out


def _by_claim(devices: tuple[tuple[str, DeviceId], ...]) -> dict[str, tuple[DeviceId, ...]]:
    out: dict[str, list[DeviceId]] = {}
    for c, d in devices:
        out.setdefault(c, []).append(d)
    return {c: tuple(ds) for c, ds in out.items()}


def _known(claims: tuple[ClaimNeed, ...], known: Mapping[str, tuple[DeviceId, ...]]
           ) -> tuple[ClaimNeed, ...]:
    """``claims`` with those another member already has devices for (a shared claim that
    kube-scheduler allocated, or will, for that member) as allocated to those devices."""
    return tuple(ClaimNeed(c.key, (), known[c.key]) if c.allocated is None and c.key in known
                 else c for c in claims)


def _chosen_claims(inv: DeviceInventory, but: PodKey) -> dict[str, tuple[DeviceId, ...]]:
    out: dict[str, tuple[DeviceId, ...]] = {}
    for p, pd in inv.planned.items():
        if p != but and pd.chosen:
            out.update(_by_claim(pd.devices))
    return out


def spared(inv: DeviceInventory, nodes: Mapping[NodeName, NodeRecord],
           pods: Mapping[PodKey, PodRecord],
           reservation: Callable[[PodKey], Reservation | None],
           pod: PodRecord, node: NodeName) -> PodKey | None:
    """For a pod no plan holds (a plain pod with claims): None when kube-scheduler's first
    fit on ``node`` leaves every plan there feasible, else a member whose plan it breaks.
    Nothing is changed: the pod may go elsewhere."""
    held = held_devices(inv, reservation)
    claims = pod_demand(inv, pod)
    if not held or not isinstance(claims, tuple):
        return None
    n = nodes.get(node)
    ff = first_fit(inv, claims, node, n.labels if n is not None else {}, _chosen(inv))
    if ff is None or not any(d in held for _, d in ff):
        return None
    got = _rematch(inv, nodes, pods, held, pod.key, node, ff)
    if isinstance(got, dict):
        return None
    return held.get(got) if got is not None else next(
        (held[d] for _, d in ff if d in held), None)


def outside(inv: DeviceInventory, reservation: Callable[[PodKey], Reservation | None],
            pod: PodRecord) -> tuple[DeviceId, ...]:
    """Devices ``pod``'s allocated claims hold that another member's plan holds (empty
    when none, or when the watch has not shown the allocation yet)."""
    held_devices(inv, reservation)  # drops plans whose slot is gone
    got = _allocated(inv, pod) or ()
    mine = {c for c, _ in got}
    others = {d for p, pd in inv.planned.items() if p != pod.key
              for c, d in pd.devices if c not in mine}
    return tuple(d for _, d in got if d in others)


def _allocated(inv: DeviceInventory, pod: PodRecord
               ) -> tuple[tuple[str, DeviceId], ...] | None:
    """The devices of ``pod``'s claims once every one of them is allocated, else None."""
    out: list[tuple[str, DeviceId]] = []
    for pc in pod.claims:
        name = pc.claim or pc.generated
        c = inv.claims.get(f"{pod.namespace}/{name}") if name else None
        if c is None or c.allocated is None:
            return None
        out.extend((c.key, d) for d in c.allocated)
    return tuple(out)


def observed(inv: DeviceInventory, nodes: Mapping[NodeName, NodeRecord],
             pods: Mapping[PodKey, PodRecord],
             reservation: Callable[[PodKey], Reservation | None]) -> None:
    """Allocations the watch shows become their members' devices (a plan's names were a
    witness; the allocation is the fact), and members whose plans named those devices are
    matched again around them."""
    held = held_devices(inv, reservation)
    for key, pd in list(inv.planned.items()):
        pod = pods.get(key)
        got = _allocated(inv, pod) if pod is not None and pod.claims else None
        if got is None or (pd.chosen and set(got) == set(pd.devices)):
            continue
        fixed = _rematch(inv, nodes, pods, held, key, NodeName(pd.node), got)
        if isinstance(fixed, dict):
            inv.planned.update(fixed)
            inv.epoch += 1
        # Else the allocation took devices other plans cannot spare: the plans stay, the
        # bind is refused (``outside``) and the allocation cleared (``devices.stale``).
