"""What one pod's claims ask for, resolved against the inventory: per claim, its requests
with the selectors each must satisfy (the class's and the request's), or the devices it
already holds; or why it cannot be planned, naming the field.

A claim made from a template that the resourceclaim controller has not created yet is
planned from the template, under a key of its own pod (it is that pod's alone); a claim
named by several pods is one key, so the joint plan gives it devices once.

Resolving compiles the selectors (once per expression: ``Selectors`` keeps the programs),
about 0.1 ms a token on the event loop, and a gang may name many templates: each selector
compiled is charged to the caller's :class:`~coscheduling.devices.budget.Budget`, and once it
is spent the rest wait for the next call (:data:`DEFERRED`), which finds the ones already
compiled kept and goes further.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Final, Literal

from ..records import PodRecord
from .budget import Budget
from .inventory import DeviceInventory
from .model import ClaimKey, ClaimSpec, DeviceId, Request
from .selectors import Program

__all__ = ["CLAIMS_FIELD", "DEFERRED", "DEFERRED_REASON", "ClaimNeed", "Deferred", "Need",
           "pod_demand"]

CLAIMS_FIELD = "spec.resourceClaims"
"""The pod field an invalid claim is named by (a gang's reason, and what device events look
for to nudge its members)."""


class Deferred(Enum):
    """The claims are not resolved yet: compiling their selectors would go past the call's
    work budget. Not a problem with the claims; the next call resumes."""

    DEFERRED = "deferred"


DEFERRED: Final = Deferred.DEFERRED
DEFERRED_REASON = ("DRA claims not resolved yet: their selectors are compiled a few at a "
                   "time within each planning call's work budget; planned again on the next try")


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


def _needs(inv: DeviceInventory, spec: ClaimSpec, what: str, budget: Budget
           ) -> tuple[Need, ...] | str | Deferred:
    if spec.problem is not None:
        return f"{what}: {spec.problem}"
    out = []
    for i, r in enumerate(spec.requests):
        if r.alternatives:
            subs = []
            for j, sub in enumerate(r.alternatives):
                got = _need(inv, sub, f"{what}: spec.devices.requests[{i}].firstAvailable[{j}]",
                            budget)
                if not isinstance(got, Need):
                    return got
                subs.append(got)
            out.append(Need(r, (), tuple(subs)))
            continue
        one = _need(inv, r, f"{what}: spec.devices.requests[{i}].exactly", budget)
        if not isinstance(one, Need):
            return one
        out.append(one)
    return tuple(out)


def _compiled(inv: DeviceInventory, expression: str, budget: Budget
              ) -> Program | str | Literal[Deferred.DEFERRED]:
    """``expression``'s program or why it is refused; compiled (and charged) only while
    ``budget`` lasts."""
    sel = inv.selectors
    got = sel.compiled(expression)
    if got is None:
        if budget.spent:
            return DEFERRED
        compiles, tokens = sel.compiles, sel.tokens
        got = sel.program(expression)
        budget.compiled(sel.compiles - compiles, sel.tokens - tokens)
    return got


def _need(inv: DeviceInventory, r: Request, path: str, budget: Budget) -> Need | str | Deferred:
    cls = inv.classes.get(r.device_class)
    if cls is None:
        return f"{path}.deviceClassName: DeviceClass {r.device_class!r} not found"
    if cls.problem is not None:
        return f"DeviceClass {cls.name}: {cls.problem}"
    for j, e in enumerate(cls.selectors):
        got = _compiled(inv, e, budget)
        if isinstance(got, str):
            return f"DeviceClass {cls.name}: spec.selectors[{j}].cel.expression: {got}"
        if got is DEFERRED:
            return got
    for j, e in enumerate(r.selectors):
        got = _compiled(inv, e, budget)
        if isinstance(got, str):
            return f"{path}.selectors[{j}].cel.expression: {got}"
        if got is DEFERRED:
            return got
    return Need(r, cls.selectors + r.selectors)


def pod_demand(inv: DeviceInventory, pod: PodRecord, budget: Budget | None = None
               ) -> tuple[ClaimNeed, ...] | str | Deferred:
    """``pod``'s claims as the planner needs them, or why they cannot be planned, or
    :data:`DEFERRED` when compiling their selectors would go past ``budget`` (a caller's
    call-wide budget; without one, a budget of this call's own)."""
    budget = budget if budget is not None else Budget()
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
                got = _needs(inv, claim.spec, f"ResourceClaim {key}", budget)
                if not isinstance(got, tuple):
                    return got
                out.append(ClaimNeed(key, got))
                continue
        if pc.template is None:
            return f"{where}: names neither a claim nor a template"
        tkey = f"{pod.namespace}/{pc.template}"
        tmpl = inv.templates.get(tkey)
        if tmpl is None:
            return f"{where}: ResourceClaimTemplate {tkey} not found"
        got = _needs(inv, tmpl.spec, f"ResourceClaimTemplate {tkey}", budget)
        if not isinstance(got, tuple):
            return got
        out.append(ClaimNeed(f"{pod.namespace}/{pod.name}#{pc.name}", got))
    return tuple(out)
