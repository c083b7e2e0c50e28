"""Gangs behind Lockstep's scheduling gate, on the real API server and kube-scheduler.

kube-scheduler never cycles a gated member. Lockstep admits the gang from its own cache and
lifts each gate with a pin to the planned node; the binding recorder checks every gang binds
whole, and the pods' specs show what the API server accepted.
"""

from __future__ import annotations

from typing import Any

from coscheduling.gang.gating import GANG_GATE, pinned_node
from coscheduling.records import pod_from_json
from testbed.workloads import pod

from .conftest import ClusterFactory, settle


def held_gang(name: str, size: int, gpus: int = 1) -> list[dict[str, Any]]:
    return [pod(f"{name}-{i}").gang(name, size, timeout=30).gpu(gpus).gated().build()
            for i in range(size)]


def test_held_gangs_seed_case_pinned_whole_and_the_second_after_the_first(
    cluster: ClusterFactory,
) -> None:
    c = cluster("tiny-3x2")
    a, b = held_gang("a", 4), held_gang("b", 4)
    for x, y in zip(a, b, strict=True):  # interleaved: the classic deadlock
        c.create(x, y)
    first = c.wait_bound(c.names("a", 4), 30)
    settle(3)
    assert not any(n.startswith("b-") for n in c.bound())
    c.recorder.assert_gang_invariants(c.ns)
    for name, node_name in first.items():
        spec = c.kube.get(f"/api/v1/namespaces/{c.ns}/pods/{name}")
        rec = pod_from_json(spec)
        assert not rec.gated and pinned_node(rec.required_affinity) == node_name
    for name in c.names("b", 4):  # still behind the gate: no scheduling cycle spent on them
        rec = pod_from_json(c.kube.get(f"/api/v1/namespaces/{c.ns}/pods/{name}"))
        assert rec.gated
    c.wait_event("b-0", "GangWaiting", "free outside reservations")
    assert c.metric("lockstep_gate_lifts_total") == 4
    c.delete(*c.names("a", 4))
    c.wait_bound(c.names("b", 4), 15)
    c.recorder.assert_gang_invariants(c.ns)
    assert c.metric("lockstep_gang_timeouts_total") == 0


def test_a_held_gang_completes_when_its_last_member_arrives_and_keeps_other_gates(
    cluster: ClusterFactory,
) -> None:
    c = cluster("racks-2x4-h100")
    pods = held_gang("train", 4, gpus=2)
    pods[0]["spec"]["schedulingGates"].append({"name": "example.com/other"})
    pods[1]["spec"]["affinity"] = {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "Exists"}]}]}}}
    c.create(*pods[:3])
    settle(2)
    assert c.bound() == {}
    c.create(pods[3])
    # train-0 keeps somebody else's gate, so it does not count: 3 of 4 are not a gang.
    settle(3)
    assert c.bound() == {}
    obj = c.kube.get(f"/api/v1/namespaces/{c.ns}/pods/train-0")
    obj["spec"]["schedulingGates"] = [{"name": GANG_GATE}]
    c.kube.request("PUT", f"/api/v1/namespaces/{c.ns}/pods/train-0", obj)
    bound = c.wait_bound(c.names("train", 4), 30)
    c.recorder.assert_gang_invariants(c.ns)
    assert len(set(bound.values())) == 1  # 8 GPUs on one node
    rec = pod_from_json(c.kube.get(f"/api/v1/namespaces/{c.ns}/pods/train-1"))
    assert rec.required_affinity[0]["matchExpressions"][0]["key"] == "nvidia.com/gpu.product"
    assert pinned_node(rec.required_affinity) == bound["train-1"]
