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
    r.assert_gang_invariants("e2e")  # cut short by the deletion within the window
    assert r.bound("e2e") == {}


def test_partial_gang_deleted_later_than_the_window_fails() -> None:
    r = recorder()
    r._observe("ADDED", member("g-0", "g", 2), 10.0)
    r._observe("ADDED", member("g-1", "g", 2), 10.0)
    r._observe("MODIFIED", member("g-0", "g", 2, node="n0"), 11.0)
    r._observe("DELETED", member("g-1", "g", 2), 15.0)
    r._observe("DELETED", member("g-0", "g", 2, node="n0"), 15.0)
    with pytest.raises(AssertionError, match=r"was partially bound \(1/2\) for 4.00s"):
        r.assert_gang_invariants("e2e")
    r.assert_gang_invariants("e2e", window=5.0)


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


def rerun(name: str, gang: str, mm: int, run: int, node: str | None = None) -> dict[str, Any]:
    """A pod of the same name in a later run of the job: a new UID."""
    obj = member(name, gang, mm, node=node)
    obj["metadata"]["uid"] += f"-run{run}"
    return obj


def test_rerun_under_the_same_names_is_checked_run_by_run() -> None:
    r = recorder()
    for i in range(2):
        r._observe("ADDED", member(f"g-{i}", "g", 2), 10.0)
    for i in range(2):
        r._observe("MODIFIED", member(f"g-{i}", "g", 2, node="n0"), 11.0)
    for i in range(2):
        r._observe("DELETED", member(f"g-{i}", "g", 2, node="n0"), 12.0)
    r._observe("ADDED", rerun("g-0", "g", 2, 2), 13.0)
    r._observe("ADDED", rerun("g-1", "g", 2, 2), 13.1)
    r.assert_gang_invariants()  # second run waiting, nothing of it bound
    assert len(r.records("e2e", "g")) == 4 and len(r.retired) == 2
    assert [len(run) for run in r.incarnations(r.records("e2e", "g"))] == [2, 2]
    r._observe("MODIFIED", rerun("g-0", "g", 2, 2, node="n1"), 14.0)
    with pytest.raises(AssertionError, match=r"gang g \(run 2 of 2\): rests partially bound "
                                             r"\(1/2\)") as e:
        r.assert_gang_invariants("e2e")
    assert "(run 1" not in str(e.value).splitlines()[0]
    r._observe("MODIFIED", rerun("g-1", "g", 2, 2, node="n1"), 14.1)
    r.assert_gang_invariants()
    assert r.bound("e2e") == {"g-0": "n1", "g-1": "n1"}


def test_member_deleted_and_replaced_mid_admission_is_the_same_run() -> None:
    r = recorder()
    r._observe("ADDED", member("g-0", "g", 3), 10.0)
    r._observe("ADDED", member("g-1", "g", 3), 10.1)
    r._observe("DELETED", member("g-1", "g", 3), 10.5)
    r._observe("ADDED", rerun("g-1", "g", 3, 2), 10.6)
    r._observe("ADDED", member("g-2", "g", 3), 11.0)
    assert len(r.incarnations(r.records("e2e", "g"))) == 1
    for i in range(3):
        obj = member(f"g-{i}", "g", 3, node="n0") if i != 1 else rerun("g-1", "g", 3, 2, "n0")
        r._observe("MODIFIED", obj, 12.0)
    r.assert_gang_invariants()


def test_binding_counted_against_live_members_not_every_member_ever_created() -> None:
    r = recorder()
    r._observe("ADDED", member("g-0", "g", 2), 10.0)
    r._observe("ADDED", member("g-1", "g", 2), 10.1)
    r._observe("DELETED", member("g-1", "g", 2), 10.2)  # g-0 stays: same run
    r._observe("MODIFIED", member("g-0", "g", 2, node="n0"), 10.5)
    r._observe("ADDED", member("g-2", "g", 2, node="n0"), 10.6)
    problems = r.gang_problems("e2e")
    assert [p for _, _, p in problems] == [
        "gang g: first binding before min-member (2) members existed (1 did)"]
    assert problems[0][:2] == ("e2e", "g")


def test_timeline_of_one_gang_against_a_fixed_origin() -> None:
    r = recorder()
    r._observe("ADDED", member("a-0", "a", 1), 10.0)
    r._observe("ADDED", member("b-0", "b", 1, node="n0"), 12.0)
    line = r.timeline("e2e", gang="b", t0=10.0)
    assert line.startswith("  e2e/b-0") and "seen=+2.000s bound=+2.000s on n0" in line
    assert "a-0" not in line


def test_gang_of_names_gangs_no_pod_key_names() -> None:
    """A test's reading (``gang_of``): two stages of one JobSet checked as two gangs, each
    whole in turn; without it the pods are in no gang (nothing is checked)."""
    def pod_of(name: str, stage: str, node: str | None = None) -> dict[str, Any]:
        obj = member(name, None, node=node)
        obj["metadata"]["labels"] = {"stage": stage}
        return obj

    r = recorder()
    r.gang_of = lambda obj: "job/" + obj["metadata"]["labels"]["stage"]
    r.min_member_of.update({"e2e/job/init": 1, "e2e/job/node": 2})
    r._observe("ADDED", pod_of("i-0", "init"), 1.0)
    r._observe("MODIFIED", pod_of("i-0", "init", "n0"), 2.0)
    for i in range(2):
        r._observe("ADDED", pod_of(f"n-{i}", "node"), 5.0 + i)
    r._observe("MODIFIED", pod_of("n-0", "node", "n0"), 7.0)
    problems = [p for _, _, p in r.gang_problems("e2e")]
    assert problems == ["gang job/node: rests partially bound (1/2)"], problems
    r._observe("MODIFIED", pod_of("n-1", "node", "n1"), 7.1)
    r.assert_gang_invariants("e2e")


def test_created_late_gang_is_timed_from_its_quorum_existing() -> None:
    """A leader bound before its workers exist (LWS exclusive topology) passes when the gang
    is declared ``created_late`` and its workers bind within the window of being created;
    it fails without the declaration, and fails when a worker binds late."""
    def run(late: bool, last_bind: float) -> list[str]:
        r = recorder()
        if late:
            r.created_late.add("e2e/g")
        r._observe("ADDED", member("g-0", "g", 3), 1.0)
        r._observe("MODIFIED", member("g-0", "g", 3, node="n0"), 2.0)
        for i in (1, 2):
            r._observe("ADDED", member(f"g-{i}", "g", 3), 5.0)
        r._observe("MODIFIED", member("g-1", "g", 3, node="n0"), 5.5)
        r._observe("MODIFIED", member("g-2", "g", 3, node="n1"), last_bind)
        return [p for _, _, p in r.gang_problems("e2e")]

    assert run(late=True, last_bind=5.6) == []
    assert any("first binding before min-member" in p for p in run(False, 5.6))
    assert run(late=True, last_bind=8.0) == ["gang g: took 3.00s (> 1.0s) to reach 3 bound"]
