"""What one pod's claims ask for, resolved against the inventory: per claim, its requests
with the selectors each must satisfy (the class's and the request's), or the devices it
already holds; or why it cannot be planned, naming the field.

A claim made from a template that the resourceclaim controller has not created yet is
planned from the template, under a key of its own pod (it is that pod's alone); a claim
named by several pods is one key, so the joint plan gives it devices once.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..records import PodRecord
from .inventory import DeviceInventory
from .model import ClaimKey, ClaimSpec, DeviceId, Request

__all__ = ["CLAIMS_FIELD", "ClaimNeed", "Need", "pod_demand"]

CLAIMS_FIELD = "spec.resourceClaims"
"""The pod field an invalid claim is named by (a gang's reason, and what device events look
for to nudge its members)."""


@dataclass(frozen=True, slots=True)
class Need:
    request: Request
    selectors: tuple[str, ...]
    """The class's selectors, then the request's: all must hold."""
    alternatives: tuple[Need, ...] = ()
    """``firstAvailable``: one of these, the first that can be had by preference."""


@dataclass(frozen=True, slots=True)
class ClaimNeed:
    key: ClaimKey
    needs: tuple[Need, ...] = ()
    allocated: tuple[DeviceId, ...] | None = None
    """The claim is allocated already: these devices, nothing more to choose."""


def _needs(inv: DeviceInventory, spec: ClaimSpec, what: str) -> tuple[Need, ...] | str:
    if spec.problem is not None:
        return f"{what}: {spec.problem}"
    out = []
    for i, r in enumerate(spec.requests):
        if r.alternatives:
            subs = []
            for j, sub in enumerate(r.alternatives):
                got = _need(inv, sub, f"{what}: spec.devices.requests[{i}].firstAvailable[{j}]")
                if isinstance(got, str):
                    return got
                subs.append(got)
            out.append(Need(r, (), tuple(subs)))
            continue
        one = _need(inv, r, f"{what}: spec.devices.requests[{i}].exactly")
        if isinstance(one, str):
            return one
        out.append(one)
    return tuple(out)


def _need(inv: DeviceInventory, r: Request, path: str) -> Need | str:
    cls = inv.classes.get(r.device_class)
    if cls is None:
        return f"{path}.deviceClassName: DeviceClass {r.device_class!r} not found"
    for j, e in enumerate(cls.selectors):
        if isinstance(why := inv.selectors.program(e), str):
            return f"DeviceClass {cls.name}: spec.selectors[{j}].cel.expression: {why}"
    for j, e in enumerate(r.selectors):
        if isinstance(why := inv.selectors.program(e), str):
            return f"{path}.selectors[{j}].cel.expression: {why}"
    return Need(r, cls.selectors + r.selectors)


def pod_demand(inv: DeviceInventory, pod: PodRecord) -> tuple[ClaimNeed, ...] | str:
    """``pod``'s claims as the planner needs them, or why they cannot be planned."""
    out: list[ClaimNeed] = []
    for pc in pod.claims:
        where = f"spec.resourceClaims[{pc.name}]"
        name = pc.claim or pc.generated
        if name is not None:
            key = f"{pod.namespace}/{name}"
            claim = inv.claims.get(key)
            if claim is None and pc.claim is not None:
                return f"{where}: ResourceClaim {key} not found"
            if claim is not None:
                if claim.allocated is not None:
                    out.append(ClaimNeed(key, (), claim.allocated))
                    continue
                got = _needs(inv, claim.spec, f"ResourceClaim {key}")
                if isinstance(got, str):
                    return got
                out.append(ClaimNeed(key, got))
                continue
        if pc.template is None:
            return f"{where}: names neither a claim nor a template"
        tkey = f"{pod.namespace}/{pc.template}"
        tmpl = inv.templates.get(tkey)
        if tmpl is None:
            return f"{where}: ResourceClaimTemplate {tkey} not found"
        got = _needs(inv, tmpl.spec, f"ResourceClaimTemplate {tkey}")
        if isinstance(got, str):
            return got
        out.append(ClaimNeed(f"{pod.namespace}/{pod.name}#{pc.name}", got))
    return tuple(out)
