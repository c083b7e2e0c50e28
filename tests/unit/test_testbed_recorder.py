"""The binding recorder's invariant check, fed watch events by hand (no cluster)."""

from __future__ import annotations

from typing import Any

import pytest

from testbed.kube import NotFound
from testbed.recorder import BindingRecorder


class NoPodGroups:
    def get(self, path: str) -> Any:
        raise NotFound(404, "not found", path)


class PodGroups:
    def __init__(self, min_member: int) -> None:
        self.min_member = min_member
        self.calls = 0

    def get(self, path: str) -> Any:
        self.calls += 1
        return {"spec": {"minMember": self.min_member}}


def member(name: str, gang: str | None, mm: int | None = None, node: str | None = None,
           ns: str = "e2e", label: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": ns, "name": name, "uid": f"uid-{ns}-{name}",
                            "annotations": {}, "labels": {},
                            "creationTimestamp": "2026-01-01T00:00:00Z"}
    if gang and label:
        meta["labels"]["scheduling.x-k8s.io/pod-group"] = gang
    elif gang:
        meta["annotations"]["lockstep.dev/pod-group"] = gang
        if mm is not None:
            meta["annotations"]["lockstep.dev/min-member"] = str(mm)
    return {"metadata": meta, "spec": {"nodeName": node} if node else {}}


def recorder(kube: Any = None) -> BindingRecorder:
    return BindingRecorder(kube or NoPodGroups())


def test_whole_gang_bound_together_passes() -> None:
    r = recorder()
    for i in range(3):
        r._observe("ADDED", member(f"g-{i}", "g", 3), 10.0 + i)
    for i in range(3):
        r._observe("MODIFIED", member(f"g-{i}", "g", 3, node=f"n{i}"), 13.0 + i / 100)
    r.assert_gang_invariants("e2e")
    r.assert_gang_invariants()  # every namespace
    assert r.bound("e2e") == {"g-0": "n0", "g-1": "n1", "g-2": "n2"}
    assert r.pods[("e2e", "g-0")].created == "2026-01-01T00:00:00Z"


def test_partially_bound_gang_fails_with_a_timeline() -> None:
    r = recorder()
    for i in range(3):
        r._observe("ADDED", member(f"g-{i}", "g", 3), 10.0)
    r._observe("MODIFIED", member("g-0", "g", 3, node="n0"), 11.0)
    with pytest.raises(AssertionError, match=r"rests partially bound \(1/3\)") as e:
        r.assert_gang_invariants("e2e")
    assert "g-0" in str(e.value) and "bound=+1.000s on n0" in str(e.value)


def test_binding_before_the_quorum_existed_fails() -> None:
    r = recorder()
    r._observe("ADDED", member("g-0", "g", 2), 10.0)
    r._observe("MODIFIED", member("g-0", "g", 2, node="n0"), 10.5)
    r._observe("ADDED", member("g-1", "g", 2, node="n1"), 11.0)
    with pytest.raises(AssertionError, match=r"first binding before min-member \(2\)"):
        r.assert_gang_invariants("e2e")


def test_slow_gang_fails_the_window() -> None:
    r = recorder()
    r._observe("ADDED", member("g-0", "g", 2), 10.0)
    r._observe("ADDED", member("g-1", "g", 2), 10.0)
    r._observe("MODIFIED", member("g-0", "g", 2, node="n0"), 11.0)
    r._observe("MODIFIED", member("g-1", "g", 2, node="n1"), 13.0)
    with pytest.raises(AssertionError, match=r"took 2.00s \(> 1.0s\)"):
        r.assert_gang_invariants("e2e")
    r.assert_gang_invariants("e2e", window=3.0)


def test_min_member_below_size_allows_the_rest_to_wait() -> None:
    r = recorder()
    for i in range(4):
        r._observe("ADDED", member(f"g-{i}", "g", 2), 10.0)
    r._observe("MODIFIED", member("g-0", "g", 2, node="n0"), 11.0)
    r._observe("MODIFIED", member("g-1", "g", 2, node="n1"), 11.1)
    r.assert_gang_invariants("e2e")


def test_deleted_partial_gang_does_not_rest_partially_bound() -> None:
    r = recorder()
    r._observe("ADDED", member("g-0", "g", 2), 10.0)
    r._observe("ADDED", member("g-1", "g", 2), 10.0)
    r._observe("MODIFIED", member("g-0", "g", 2, node="n0"), 11.0)
    r._observe("DELETED", member("g-0", "g", 2, node="n0"), 12.0)
    r.assert_gang_invariants("e2e")
    assert r.bound("e2e") == {}


def test_scheduler_plugins_gang_reads_min_member_from_its_podgroup() -> None:
    kube = PodGroups(min_member=2)
    r = recorder(kube)
    for i in range(3):
        r._observe("ADDED", member(f"p-{i}", "pg", label=True), 10.0)
    r._observe("MODIFIED", member("p-0", "pg", node="n0", label=True), 11.0)
    r._observe("MODIFIED", member("p-1", "pg", node="n1", label=True), 11.1)
    r.assert_gang_invariants("e2e")  # 2 of 3 bound is the quorum
    assert kube.calls == 1
    r.assert_gang_invariants("e2e")
    assert kube.calls == 1  # remembered


def test_without_podgroup_every_member_is_the_quorum() -> None:
    r = recorder()
    for i in range(2):
        r._observe("ADDED", member(f"p-{i}", "pg", label=True), 10.0)
    r._observe("MODIFIED", member("p-0", "pg", node="n0", label=True), 11.0)
    with pytest.raises(AssertionError, match=r"partially bound \(1/2\)"):
        r.assert_gang_invariants("e2e")


def test_namespaces_do_not_mix() -> None:
    r = recorder()
    r._observe("ADDED", member("g-0", "g", 2, ns="a"), 10.0)
    r._observe("ADDED", member("g-0", "g", 2, ns="b"), 10.0)
    r._observe("MODIFIED", member("g-0", "g", 2, ns="a", node="n0"), 11.0)
    with pytest.raises(AssertionError, match="gang a/g: bound with only 1 of 2"):
        r.assert_gang_invariants()
    r.assert_gang_invariants("b")


def test_pods_without_a_gang_are_ignored() -> None:
    r = recorder()
    r._observe("ADDED", member("solo", None, node="n0"), 10.0)
    r.assert_gang_invariants()
    assert r.bound("e2e") == {"solo": "n0"}
