"""Gangs whose GPUs are DRA ResourceClaims, on the default install (Lockstep with its webhook
and its own certificate) and the real control plane: kube-apiserver serving
``resource.k8s.io/v1``, the stock kube-scheduler with its DynamicResources plugin,
kube-controller-manager's resourceclaim controller making each pod's claim from its
ResourceClaimTemplate, and the fake NVIDIA driver's ResourceSlices on KWOK nodes
(``testbed.dra``).

Besides what each test asserts, the binding recorder checks every claim allocation it saw when
the test ends (``testbed.claims``): no member parked with devices for long, no device held by
two claims, no claim on another node than its pod.
"""

from __future__ import annotations

from testbed.dra import API, claim_template
from testbed.workloads import gang

from .conftest import Cluster, ClusterFactory, settle


def templates(c: Cluster, *objs: dict[str, object]) -> None:
    for obj in objs:
        c.kube.create(f"{API}/namespaces/{c.ns}/resourceclaimtemplates",
                      {**obj, "metadata": {**obj["metadata"], "namespace": c.ns}})  # type: ignore[dict-item]


def whole(c: Cluster, names: list[str]) -> bool:
    bound = c.bound()
    return all(n in bound for n in names)


def devices_of(c: Cluster, names: list[str]) -> dict[str, tuple[str, ...]]:
    held = c.recorder.allocated(c.ns)
    return {n: held[n] for n in names if n in held}


def test_seed_case_with_dra_gpus_one_gang_runs_whole_the_other_holds_no_device(
        cluster: ClusterFactory) -> None:
    """3 nodes x 2 DRA GPUs, two 4-pod gangs of 1-GPU claims created interleaved: one runs
    4/4 holding its 4 devices, the other has 0 bound and 0 devices; it runs 4/4 once the
    first is deleted. (Before Lockstep saw devices, neither bound: each parked member held a
    device the other gang needed, and both timed out.)"""
    c = cluster("dra-tiny-3x2")
    templates(c, claim_template("one-gpu"))
    a = gang("a", 4, claim_template="one-gpu")
    b = gang("b", 4, claim_template="one-gpu")
    for x, y in zip(a, b, strict=True):
        c.create(x, y)
    names = {g: c.names(g, 4) for g in ("a", "b")}
    winner = c.kube.wait("one gang bound whole", lambda: next(
        (g for g, n in names.items() if whole(c, n)), None), timeout=45)
    loser = "b" if winner == "a" else "a"
    settle(3)
    held = devices_of(c, names[winner])
    assert len(held) == 4 and len({d for ds in held.values() for d in ds}) == 4, held
    assert not any(n in c.bound() for n in names[loser]), c.bound()
    assert devices_of(c, names[loser]) == {}
    c.recorder.assert_gang_invariants(c.ns)

    c.delete(*names[winner])
    c.wait_bound(names[loser], timeout=45)
    c.kube.wait("the second gang's 4 devices", lambda: len(devices_of(c, names[loser])) == 4,
                timeout=10)
    c.recorder.assert_gang_invariants(c.ns)
