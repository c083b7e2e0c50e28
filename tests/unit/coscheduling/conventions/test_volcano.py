"""Volcano's enqueue step as Lockstep plays it: which phase each Volcano PodGroup shows."""

from __future__ import annotations

from typing import Any

import pytest

from coscheduling.conventions.base import GangStatusModel, MemberCounts, StatusModel
from coscheduling.conventions.volcano import volcano_podgroup_from_json, volcano_statuses
from coscheduling.podgroup import GangKey, Source, gang_key
from coscheduling.reasons import InvalidDeclaration, NotEnoughMinResources


def pg(name: str, min_member: Any, gpus: int, phase: str = "") -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"minMember": min_member, "queue": "default",
                 "minResources": {"nvidia.com/gpu": str(gpus)}}}
    if phase:
        obj["status"] = {"phase": phase}
    return obj


def run(groups: list[dict[str, Any]], free_gpus: int,
        pods: dict[str, MemberCounts] | None = None) -> dict[str, tuple[str, type | None]]:
    """The enqueue step over a status model built by hand: no core."""
    recs = {r.key: r for r in map(volcano_podgroup_from_json, groups)}
    keys = {name: gang_key("default", name) for name in pods or {}}
    gangs = {keys[name]: GangStatusModel(keys[name], Source.VOLCANO, 1, counts)
             for name, counts in (pods or {}).items()}
    model = StatusModel(gangs, {Source.VOLCANO: recs}, free={"nvidia.com/gpu": free_gpus})
    out = volcano_statuses(model)
    return {k.split("/")[1]: (v.phase, type(v.waiting) if v.waiting else None)
            for k, v in out.items()}


def running(n: int, phase: str = "Running") -> MemberCounts:
    """``n`` members on nodes in ``phase`` (Running, or finished)."""
    live = 0 if phase in ("Succeeded", "Failed") else n
    return MemberCounts(total=n, scheduled=n, placed=live, bound=live,
                        running=n if phase == "Running" else 0,
                        succeeded=n if phase == "Succeeded" else 0,
                        failed=n if phase == "Failed" else 0)


@pytest.mark.parametrize(
    ("groups", "free", "pods", "want"),
    [
        pytest.param([pg("a", 4, 4)], 6, None, {"a": ("Inqueue", None)}, id="fits-enqueued"),
        pytest.param([pg("a", 4, 8)], 6, None,
                     {"a": ("Pending", NotEnoughMinResources)}, id="too-big-stays-pending"),
        pytest.param([pg("a", 4, 4), pg("b", 4, 4)], 6, None,
                     {"a": ("Inqueue", None), "b": ("Pending", NotEnoughMinResources)},
                     id="never-two-against-the-same-gpus"),
        pytest.param([pg("a", 4, 4, "Inqueue"), pg("b", 4, 4)], 6, None,
                     {"a": ("Inqueue", None), "b": ("Pending", NotEnoughMinResources)},
                     id="enqueued-group-keeps-its-share"),
        pytest.param([pg("a", 2, 2, "Inqueue")], 6, {"a": running(2)},
                     {"a": ("Running", None)}, id="running"),
        pytest.param([pg("a", 2, 2, "Running")], 6, {"a": running(2, "Succeeded")},
                     {"a": ("Completed", None)}, id="completed"),
        pytest.param([pg("a", 0, 2)], 6, None,
                     {"a": ("Pending", InvalidDeclaration)}, id="invalid-min-member"),
    ],
)
def test_volcano_enqueue(groups: list[dict[str, Any]], free: int,
                         pods: dict[str, MemberCounts] | None,
                         want: dict[str, tuple[str, type | None]]) -> None:
    assert run(groups, free, pods) == want


def test_keys_are_namespaced() -> None:
    key: GangKey = gang_key("default", "a")
    assert volcano_podgroup_from_json(pg("a", 1, 1, "Inqueue")).key == key
    assert volcano_podgroup_from_json(pg("a", 1, 1, "Inqueue")).phase == "Inqueue"
