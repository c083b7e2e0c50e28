"""A pod's ``spec.resourceClaims``: which ResourceClaims (Dynamic Resource Allocation) it uses.

A leaf the pod record reads (``records.pod_from_json``), so the devices wing
(``coscheduling.devices``) can read pod records without an import circle.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_POD_CLAIMS", "PodClaim", "pod_claims"]

MAX_POD_CLAIMS = 128
"""``spec.resourceClaims`` per pod (the API server's limit)."""


@dataclass(frozen=True, slots=True)
class PodClaim:
    """One ``spec.resourceClaims[]`` entry of a pod, with the claim the resourceclaim
    controller made for it from a template (``status.resourceClaimStatuses``), if any."""

    name: str
    claim: str | None = None
    """``resourceClaimName``: a claim that exists on its own (possibly shared)."""
    template: str | None = None
    """``resourceClaimTemplateName``: a claim made for this pod alone."""
    generated: str | None = None
    """The name of the claim generated from ``template``, once the controller made it."""


def pod_claims(spec: Mapping[str, Any], status: Any) -> tuple[PodClaim, ...]:
    """A pod's claims; malformed entries are left out. More than :data:`MAX_POD_CLAIMS`
    (which the API server never serves) raise ``ValueError``."""
    raw = spec.get("resourceClaims")
    if not isinstance(raw, list) or not raw:
        return ()
    if len(raw) > MAX_POD_CLAIMS:
        raise ValueError(f"{len(raw)} resourceClaims, at most {MAX_POD_CLAIMS}")
    made: dict[str, str] = {}
    statuses = status.get("resourceClaimStatuses") if isinstance(status, Mapping) else None
    for s in statuses if isinstance(statuses, list) else ():
        if isinstance(s, Mapping) and isinstance(s.get("name"), str) \
                and isinstance(s.get("resourceClaimName"), str):
            made[s["name"]] = s["resourceClaimName"]
    out = []
    for c in raw:
        if not isinstance(c, Mapping) or not isinstance(c.get("name"), str):
            continue
        claim, template = c.get("resourceClaimName"), c.get("resourceClaimTemplateName")
        out.append(PodClaim(c["name"], claim if isinstance(claim, str) else None,
                            template if isinstance(template, str) else None,
                            made.get(c["name"])))
    return tuple(out)
