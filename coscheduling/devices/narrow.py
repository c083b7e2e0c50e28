"""Narrowing a claim made from a template to the subrequests its gang's plan chose.

kube-scheduler's allocator takes a ``firstAvailable`` request's first subrequest that can be
had, one pod at a time: #138765's first member gets the whole GPU and the second nothing,
whatever Lockstep planned. No filter answer can change which subrequest it takes. But a
claim made for a pod from a template is created by the resourceclaim controller *after* the
pod, and a gang admitted at creation (the webhook's placement, the default install) has its
plan by then: the webhook on ``resourceclaims`` CREATE keeps, of each ``firstAvailable``
request, only the subrequest the plan chose. kube-scheduler's first fit then allocates that.

Only claims made for one pod (owned by it, named by the controller's
``resource.kubernetes.io/pod-claim-name`` annotation) are narrowed, only when the plan holds
that pod, and only the choice between subrequests: devices stay the allocator's to pick
(specific devices pinned in a claim could not follow a gang planned again elsewhere).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..records import PodKey
from .inventory import DeviceInventory

__all__ = ["POD_CLAIM_NAME", "narrow"]

POD_CLAIM_NAME = "resource.kubernetes.io/pod-claim-name"
"""The annotation the resourceclaim controller puts on a claim it made for a pod: the
entry of ``spec.resourceClaims`` it is for."""


def _owner(meta: Mapping[str, Any]) -> str | None:
    refs = meta.get("ownerReferences")
    for r in refs if isinstance(refs, list) else ():
        if isinstance(r, Mapping) and r.get("kind") == "Pod" and r.get("controller") \
                and isinstance(r.get("name"), str):
            return str(r["name"])
    return None


def narrow(inv: DeviceInventory, namespace: str, obj: Mapping[str, Any]
           ) -> list[dict[str, Any]]:
    """JSONPatch operations keeping, of each ``firstAvailable`` request of the claim
    ``obj``, the subrequest its pod's plan chose; [] when there is nothing to narrow."""
    meta = obj.get("metadata")
    spec = obj.get("spec")
    if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
        return []
    annotations = meta.get("annotations")
    pod_claim = annotations.get(POD_CLAIM_NAME) if isinstance(annotations, Mapping) else None
    owner = _owner(meta)
    if not isinstance(pod_claim, str) or owner is None:
        return []
    planned = inv.planned.get(PodKey(f"{namespace}/{owner}"))
    if planned is None:
        return []
    key = f"{namespace}/{owner}#{pod_claim}"
    chose = {r: j for c, r, j in planned.choices if c == key}
    devices = spec.get("devices")
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    ops: list[dict[str, Any]] = []
    for i, r in enumerate(requests if isinstance(requests, list) else ()):
        subs = r.get("firstAvailable") if isinstance(r, Mapping) else None
        j = chose.get(str(r.get("name"))) if isinstance(r, Mapping) else None
        if isinstance(subs, list) and j is not None and 0 <= j < len(subs) and len(subs) > 1:
            ops.append({"op": "replace", "path": f"/spec/devices/requests/{i}/firstAvailable",
                        "value": [subs[j]]})
    return ops
