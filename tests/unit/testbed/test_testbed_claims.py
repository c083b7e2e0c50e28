"""The binding recorder's DRA checks (testbed.claims), fed claim and pod events by hand."""

from __future__ import annotations

from typing import Any

import pytest

from testbed.kube import NotFound
from testbed.recorder import BindingRecorder


class NoPodGroups:
    def get(self, path: str) -> Any:
        raise NotFound(404, "not found", path)


def member(name: str, node: str | None = None, gang: str = "g") -> dict[str, Any]:
    return {"metadata": {"namespace": "e2e", "name": name, "uid": f"pod-{name}",
                         "annotations": {"lockstep.dev/pod-group": gang,
                                         "lockstep.dev/min-member": "2"}},
            "spec": {"nodeName": node} if node else {}}


def claim(name: str, pod: str | None, devices: list[str] | None, node: str = "n0",
          reserved: tuple[str, ...] = ()) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": "e2e", "name": name, "uid": f"claim-{name}"}
    if pod:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": pod,
                                    "uid": f"pod-{pod}", "controller": True}]
    status: dict[str, Any] = {}
    if devices is not None:
        status["allocation"] = {
            "devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com",
                                     "pool": node, "device": d} for d in devices]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": p, "uid": f"pod-{p}"}
                                 for p in reserved]
    return {"metadata": meta, "spec": {}, "status": status}


def rec() -> BindingRecorder:
    return BindingRecorder(NoPodGroups())  # type: ignore[arg-type]


def problems(r: BindingRecorder, at: float, hold: float = 10.0) -> list[str]:
    return [p for _, _, p in r.claim_problems("e2e", hold, now=at)]


def test_a_member_bound_soon_after_its_devices_were_allocated_passes() -> None:
    r = rec()
    r._observe("ADDED", member("g-0"), 10.0)
    r.claims.observe("ADDED", claim("g-0-gpu", "g-0", None), 10.1)
    r.claims.observe("MODIFIED", claim("g-0-gpu", "g-0", ["gpu-0"], reserved=("g-0",)), 11.0)
    r._observe("MODIFIED", member("g-0", "n0"), 12.0)
    assert problems(r, at=100.0) == []
    assert r.allocated("e2e") == {"g-0": ("gpu.nvidia.com/n0/gpu-0",)}


def test_devices_held_by_a_parked_member_until_its_gang_times_out_fail() -> None:
    """The seed's failure: each parked member held a device until its gang's timeout; when
    kube-scheduler gives the devices back the hold ends, unbound."""
    r = rec()
    r._observe("ADDED", member("a-0"), 10.0)
    r.claims.observe("MODIFIED", claim("a-0-gpu", "a-0", ["gpu-0"]), 11.0)
    assert problems(r, at=20.0) == []  # 9 s so far
    assert problems(r, at=31.0) == [
        "claim a-0-gpu held gpu.nvidia.com/n0/gpu-0 for 20.0s (> 10s) while its pod a-0 "
        "(gang g) was not bound (never bound)"]
    r.claims.observe("MODIFIED", claim("a-0-gpu", "a-0", None), 51.0)  # released at timeout
    assert "for 40.0s" in problems(r, at=100.0)[0]
    assert r.allocated("e2e") == {}


def test_a_late_binding_after_a_long_hold_still_fails_and_a_deletion_ends_the_hold() -> None:
    r = rec()
    r._observe("ADDED", member("a-0"), 10.0)
    r._observe("ADDED", member("b-0"), 10.0)
    r.claims.observe("MODIFIED", claim("a-0-gpu", "a-0", ["gpu-0"]), 10.0)
    r.claims.observe("MODIFIED", claim("b-0-gpu", "b-0", ["gpu-1"]), 10.0)
    r._observe("MODIFIED", member("a-0", "n0"), 25.0)
    r._observe("DELETED", member("b-0"), 12.0)
    assert problems(r, at=100.0) == [
        "claim a-0-gpu held gpu.nvidia.com/n0/gpu-0 for 15.0s (> 10s) while its pod a-0 "
        "(gang g) was not bound (bound 15.0s later)"]
    assert problems(r, at=100.0, hold=20.0) == []


def test_a_device_allocated_twice_at_once_fails() -> None:
    r = rec()
    for p in ("a-0", "b-0"):
        r._observe("ADDED", member(p), 10.0)
    r.claims.observe("MODIFIED", claim("a-0-gpu", "a-0", ["gpu-0"]), 10.0)
    r._observe("MODIFIED", member("a-0", "n0"), 10.5)
    r.claims.observe("MODIFIED", claim("b-0-gpu", "b-0", ["gpu-0"]), 11.0)
    r._observe("MODIFIED", member("b-0", "n0"), 11.5)
    assert problems(r, at=20.0) == [
        "device gpu.nvidia.com/n0/gpu-0 allocated to claim b-0-gpu while claim e2e/a-0-gpu "
        "still held it"]


def test_a_device_handed_over_after_its_claim_let_go_passes() -> None:
    """A victim's claim released before the preemptor's claim takes its device."""
    r = rec()
    for p in ("a-0", "b-0"):
        r._observe("ADDED", member(p), 10.0)
    r.claims.observe("MODIFIED", claim("a-0-gpu", "a-0", ["gpu-0"]), 10.0)
    r._observe("MODIFIED", member("a-0", "n0"), 10.5)
    r._observe("DELETED", member("a-0", "n0"), 12.0)
    r.claims.observe("DELETED", claim("a-0-gpu", "a-0", ["gpu-0"]), 12.5)
    r.claims.observe("MODIFIED", claim("b-0-gpu", "b-0", ["gpu-0"]), 13.0)
    r._observe("MODIFIED", member("b-0", "n0"), 13.5)
    assert problems(r, at=20.0) == []


def test_a_claim_on_another_node_than_its_pod_fails() -> None:
    r = rec()
    r._observe("ADDED", member("a-0"), 10.0)
    r.claims.observe("MODIFIED", claim("a-0-gpu", "a-0", ["gpu-0"], node="n1"), 10.0)
    r._observe("MODIFIED", member("a-0", "n0"), 10.5)
    assert problems(r, at=20.0) == ["claim a-0-gpu allocated on n1, its pod a-0 bound to n0"]


def test_a_shared_claim_counts_every_pod_reserved_for_it() -> None:
    r = rec()
    r._observe("ADDED", member("a-0", "n0"), 10.0)
    r._observe("ADDED", member("a-1"), 10.0)
    r.claims.observe("MODIFIED", claim("shared", None, ["gpu-0"], reserved=("a-0",)), 11.0)
    r.claims.observe("MODIFIED", claim("shared", None, ["gpu-0"], reserved=("a-0", "a-1")),
                     12.0)
    assert r.allocated("e2e") == {"a-0": ("gpu.nvidia.com/n0/gpu-0",),
                                  "a-1": ("gpu.nvidia.com/n0/gpu-0",)}
    assert [p.split(" while")[1] for p in problems(r, at=30.0)] == [
        " its pod a-1 (gang g) was not bound (never bound)"]


def test_a_claim_gone_while_the_watch_was_down_lets_its_devices_go() -> None:
    r = rec()
    r._observe("ADDED", member("a-0"), 10.0)
    r.claims.observe("ADDED", claim("a-0-gpu", "a-0", ["gpu-0"]), 10.0)
    r.claims.relisted([], 12.0)
    assert r.allocated("e2e") == {}
    assert problems(r, at=100.0) == []


def test_assert_gang_invariants_reports_claims_too() -> None:
    r = rec()
    r._observe("ADDED", member("a-0"), 10.0)
    r.claims.observe("ADDED", claim("a-0-gpu", "a-0", ["gpu-0"]), 10.0)
    r.claims.observe("MODIFIED", claim("a-0-gpu", "a-0", None), 35.0)
    with pytest.raises(AssertionError, match=r"claim a-0-gpu held .* for 25.0s \(> 20s\)"):
        r.assert_gang_invariants("e2e")  # 20 s by default
    r.assert_gang_invariants("e2e", hold=30.0)
