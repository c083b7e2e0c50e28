"""DRA devices in the core: parsing at the wire, CEL selection, the joint plan of a gang
(with backtracking across members), reservations between gangs, and preemption's freed
devices."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from app.render import render
from coscheduling import (
    BindGroup,
    Coscheduler,
    FilterDecision,
    GangKey,
    NodeName,
    Park,
    Reject,
    Settings,
    node_from_json,
    pod_from_json,
    pod_key,
)
from coscheduling.devices.demand import pod_demand
from coscheduling.devices.inventory import DeviceInventory
from coscheduling.devices.model import Device
from coscheduling.devices.selectors import MAX_EXPRESSION_CHARS, Selectors
from coscheduling.devices.wire import (
    claim_from_json,
    class_from_json,
    slice_from_json,
    template_from_json,
)
from coscheduling.events import ingest
from coscheduling.placement.planner import Member, Plan, plan_gang
from coscheduling.preemption.freed import freed_view
from coscheduling.preemption.units import Candidate
from coscheduling.reasons import DevicesNotReady, DoesNotFit, InvalidDeclaration, WaitingForMembers
from coscheduling.records import RecordError
from coscheduling.resources import MAX_QUANTITY
from tests.builders import node, pod
from tests.internals import state_of
from tests.invariants import InvariantBroken, check_invariants

DRIVER = "gpu.nvidia.com"


def gpu_slice(node_name: str, models: list[str], roots: list[str] | None = None,
              generation: int = 1) -> dict[str, Any]:
    roots = roots or ["pci0"] * len(models)
    return {"metadata": {"name": f"{node_name}-gpus"},
            "spec": {"driver": DRIVER, "nodeName": node_name,
                     "pool": {"name": node_name, "generation": generation,
                              "resourceSliceCount": 1},
                     "devices": [{"name": f"gpu-{i}",
                                  "attributes": {"productName": {"string": m},
                                                 "resource.kubernetes.io/pcieRoot":
                                                     {"string": r}},
                                  "capacity": {"memory": {"value": "80Gi"}}}
                                 for i, (m, r) in enumerate(zip(models, roots, strict=True))]}}


def device_class(name: str = "gpu.nvidia.com", expr: str | None = None) -> dict[str, Any]:
    e = expr or f'device.driver == "{DRIVER}"'
    return {"metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression": e}}]}}


def template(name: str, selector: str | None = None, count: int = 1,
             cls: str = "gpu.nvidia.com", ns: str = "default") -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls, "count": count}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {"metadata": {"name": name, "namespace": ns},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}}


def claimed(p: dict[str, Any], tmpl: str) -> dict[str, Any]:
    p["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": tmpl}]
    return p


def cluster(nodes: int, models: list[list[str]]) -> Coscheduler:
    core = Coscheduler(Settings(backoff_seconds=10))
    for i in range(nodes):
        core.upsert(ingest.NODES, node_from_json(node(f"n{i}").build()))
        core.upsert(ingest.RESOURCE_SLICES, slice_from_json(gpu_slice(f"n{i}", models[i])))
    core.upsert(ingest.DEVICE_CLASSES, class_from_json(device_class()))
    return core


# ----------------------------------------------------------------------------- wire


def test_slice_attributes_are_qualified_by_the_driver_and_capacity_is_a_quantity() -> None:
    s = slice_from_json(gpu_slice("n0", ["H100"]))
    d = s.devices[0]
    assert s.node == "n0" and d.id == (DRIVER, "n0", "gpu-0")
    assert d.attribute("productName") == "H100"
    assert d.attribute("resource.kubernetes.io/pcieRoot") == "pci0"
    assert dict(((dom, i), v) for dom, i, v in d.capacity)[(DRIVER, "memory")] \
        == 80 * 2**30 * 1000


@pytest.mark.parametrize(("value", "milli"), [
    ("9223372036854775807", MAX_QUANTITY), ("8Ei", MAX_QUANTITY),
    ("9223372036854775808", MAX_QUANTITY), (2**63 - 1, MAX_QUANTITY), ("-1", -1000),
    (-2, -2000), ("-8Ei", -MAX_QUANTITY),
])
def test_a_capacity_the_api_server_accepts_beyond_int64_or_negative_keeps_its_slice(
        value: object, milli: int) -> None:
    """The API server accepts these capacities (the hostile DRA suite); refusing them
    dropped the whole slice, so kube-scheduler saw devices Lockstep never planned. Beyond
    int64 millis the value saturates (comparisons with any real quantity keep their sign)."""
    obj = gpu_slice("n0", ["H100", "H100"])
    obj["spec"]["devices"][0]["capacity"]["odd"] = {"value": value}
    s = slice_from_json(obj)
    assert len(s.devices) == 2
    caps = dict(((dom, i), v) for dom, i, v in s.devices[0].capacity)
    assert caps[(DRIVER, "odd")] == milli
    assert caps[(DRIVER, "memory")] == 80 * 2**30 * 1000
    sel = Selectors()
    op = ">" if milli > 0 else "<"
    expr = f'device.capacity["{DRIVER}"].odd.compareTo(quantity("1Ti")) {op} 0'
    assert sel.matches(expr, s.devices[0])


@pytest.mark.parametrize(("count", "problem"), [
    (0, "spec.devices.requests[0].exactly.count: 0, must be 1..32"),
    (33, "spec.devices.requests[0].exactly.count: 33, must be 1..32"),
    (10**30, "must be 1..32"),
])
def test_a_count_over_the_limit_is_a_problem_naming_the_field(count: int, problem: str) -> None:
    t = template_from_json(template("t", count=count))
    assert t.spec.problem is not None and problem in t.spec.problem


def test_an_expression_over_the_length_limit_is_refused_before_compiling() -> None:
    long = "true && " * (MAX_EXPRESSION_CHARS // 8 + 1) + "true"
    t = template_from_json(template("t", selector=long))
    assert t.spec.problem is not None
    assert "selectors[0].cel.expression" in t.spec.problem and "at most 10240" in t.spec.problem


def test_a_malformed_slice_is_a_record_error() -> None:
    with pytest.raises(RecordError, match=r"ResourceSlice\.spec"):
        slice_from_json({"metadata": {"name": "s"}, "spec": {"pool": {"name": "p"}}})


def test_an_allocated_claim_lists_its_devices_and_pods() -> None:
    c = claim_from_json({
        "metadata": {"name": "c", "namespace": "ns", "uid": "u"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com"}}]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": "n0", "device": "gpu-1"}]}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "pu"}]}})
    assert c.allocated == ((DRIVER, "n0", "gpu-1"),) and c.reserved_for == ("ns/p",)


# ----------------------------------------------------------------------------- CEL


def test_cel_reads_attributes_capacity_and_an_unknown_domain_as_empty() -> None:
    s = Selectors()
    d = Device(DRIVER, "n0", "gpu-0", ((DRIVER, "productName", "H100"),),
               ((DRIVER, "memory", 80 * 2**30 * 1000),))
    assert s.matches(f'device.attributes["{DRIVER}"].productName == "H100"', d)
    assert s.matches(f'device.capacity["{DRIVER}"].memory.compareTo(quantity("40Gi")) >= 0', d)
    assert not s.matches(f'device.capacity["{DRIVER}"].memory.isGreaterThan(quantity("1Ti"))',
                         d)
    assert not s.matches('has(device.attributes["other.example.com"].x)', d)
    assert not s.matches('"not a bool"', d)
    assert isinstance(s.program("device.driver =="), str)


def test_a_selector_that_does_not_compile_names_the_field() -> None:
    inv = DeviceInventory()
    inv.put_class(class_from_json(device_class()))
    inv.put_template(template_from_json(template("t", selector="device.driver ==")))
    p = pod_from_json(claimed(pod("p").build(), "t"))
    got = pod_demand(inv, p)
    assert isinstance(got, str)
    assert "ResourceClaimTemplate default/t: spec.devices.requests[0].exactly.selectors[0]" \
        ".cel.expression: does not compile" in got


def test_a_claim_naming_an_unknown_class_names_it() -> None:
    inv = DeviceInventory()
    inv.put_template(template_from_json(template("t", cls="nope")))
    got = pod_demand(inv, pod_from_json(claimed(pod("p").build(), "t")))
    assert got == ("ResourceClaimTemplate default/t: spec.devices.requests[0].exactly"
                   ".deviceClassName: DeviceClass 'nope' not found")


# ----------------------------------------------------------------------------- plans


def gang_pod(name: str, gang: str, size: int, tmpl: str) -> dict[str, Any]:
    return claimed(pod(name).gang(gang, min_member=size).build(), tmpl)


def test_first_fit_blocking_another_member_is_planned_jointly() -> None:
    """kubernetes/kubernetes#138765's shape: one node, an H100 and an A100; member a takes
    any GPU, member b only an H100. First fit gives a the H100 and b nothing; the joint plan
    gives a the A100, and the filter orders the members so kube-scheduler's first fit
    allocates exactly that: a waits until b has its H100, then first fit gives a the A100."""
    core = cluster(1, [["H100", "A100"]])
    core.upsert(ingest.RESOURCE_CLAIM_TEMPLATES, template_from_json(template("any")))
    core.upsert(ingest.RESOURCE_CLAIM_TEMPLATES, template_from_json(template(
        "h100", selector=f'device.attributes["{DRIVER}"].productName == "H100"')))
    core.upsert_pod(pod_from_json(gang_pod("a", "g", 2, "any")))
    core.upsert_pod(pod_from_json(gang_pod("b", "g", 2, "h100")))
    d = core.filter(core.queries.pods[pod_key("default", "a")], ["n0"], 0.0)
    assert d.passed == [] and isinstance(d.unresolvable, DevicesNotReady)
    assert "first fit on n0 would give it gpu-0" in render(d.unresolvable)
    assert core.filter(core.queries.pods[pod_key("default", "b")], ["n0"], 0.0).passed == ["n0"]
    assert core.filter(core.queries.pods[pod_key("default", "a")], ["n0"], 0.0).passed == ["n0"]
    held = state_of(core).devices.planned
    assert {pd.devices[0][1][2] for pd in held.values()} == {"gpu-0", "gpu-1"}
    assert held[pod_key("default", "b")].devices[0][1] == (DRIVER, "n0", "gpu-0")
    assert held[pod_key("default", "a")].devices[0][1] == (DRIVER, "n0", "gpu-1")


def test_two_gangs_never_hold_the_same_devices() -> None:
    """The seed case: 3 nodes x 2 GPUs, two gangs of 4 one-GPU members. One is admitted
    with 4 devices; the other does not fit (2 left), holding none."""
    core = cluster(3, [["H100", "H100"]] * 3)
    core.upsert(ingest.RESOURCE_CLAIM_TEMPLATES, template_from_json(template("one")))
    for g in ("x", "y"):
        for i in range(4):
            core.upsert_pod(pod_from_json(gang_pod(f"{g}-{i}", g, 4, "one")))
    assert core.filter(core.queries.pods[pod_key("default", "x-0")], ["n0", "n1", "n2"], 0.0).passed
    d = core.filter(core.queries.pods[pod_key("default", "y-0")], ["n0", "n1", "n2"], 0.0)
    assert d.passed == [] and isinstance(d.unresolvable, DoesNotFit)
    held = state_of(core).devices.planned
    assert sorted(held) == [pod_key("default", f"x-{i}") for i in range(4)]
    devices = [d for pd in held.values() for _, d in pd.devices]
    assert len(set(devices)) == 4


def test_a_gang_whose_claims_cannot_be_met_anywhere_does_not_fit() -> None:
    core = cluster(2, [["A100"], ["A100"]])
    core.upsert(ingest.RESOURCE_CLAIM_TEMPLATES, template_from_json(template(
        "h100", selector=f'device.attributes["{DRIVER}"].productName == "H100"')))
    core.upsert_pod(pod_from_json(gang_pod("a", "g", 1, "h100")))
    d = core.filter(core.queries.pods[pod_key("default", "a")], ["n0", "n1"], 0.0)
    assert d.passed == [] and isinstance(d.unresolvable, DoesNotFit)


def test_allocated_devices_are_not_planned_again() -> None:
    core = cluster(1, [["H100", "H100"]])
    core.upsert(ingest.RESOURCE_CLAIM_TEMPLATES, template_from_json(template("two", count=2)))
    core.upsert(ingest.RESOURCE_CLAIMS, claim_from_json({
        "metadata": {"name": "other", "namespace": "default", "uid": "u"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com"}}]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": "n0", "device": "gpu-0"}]}}}}))
    core.upsert_pod(pod_from_json(gang_pod("a", "g", 1, "two")))
    d = core.filter(core.queries.pods[pod_key("default", "a")], ["n0"], 0.0)
    assert d.passed == []


def test_the_plan_fills_one_pcie_root_per_member_first() -> None:
    core = cluster(1, [["H100"] * 4])
    core.upsert(ingest.RESOURCE_SLICES, slice_from_json(gpu_slice(
        "n0", ["H100"] * 4, roots=["pci1", "pci0", "pci1", "pci0"])))
    core.upsert(ingest.RESOURCE_CLAIM_TEMPLATES, template_from_json(template("two", count=2)))
    core.upsert_pod(pod_from_json(gang_pod("a", "g", 1, "two")))
    plan = plan_gang([Member(core.queries.pods[pod_key("default", "a")])], state_of(core).capacity,
                     core.settings.levels)
    assert isinstance(plan, Plan)
    got = {d[2] for _, d in plan.devices[pod_key("default", "a")].devices}
    assert got == {"gpu-1", "gpu-3"}  # both on pci0


def two_gangs_on_mixed_node() -> Coscheduler:
    """n0 has an H100 (gpu-0) and an A100 (gpu-1), n1 an H100. Gang y (two H100-only
    members) is admitted by y-1's filter on n1, so y-0 holds n0's H100 without having passed
    its filter yet; gang x (one member, any GPU) can then only hold n0's A100."""
    core = cluster(2, [["H100", "A100"], ["H100"]])
    core.upsert(ingest.RESOURCE_CLAIM_TEMPLATES, template_from_json(template("any")))
    core.upsert(ingest.RESOURCE_CLAIM_TEMPLATES, template_from_json(template(
        "h100", selector=f'device.attributes["{DRIVER}"].productName == "H100"')))
    for name, gang, size, tmpl in (("y-0", "y", 2, "h100"), ("y-1", "y", 2, "h100"),
                                   ("x-0", "x", 1, "any")):
        obj = gang_pod(name, gang, size, tmpl)
        obj["status"]["resourceClaimStatuses"] = [{"name": "gpu",
                                                   "resourceClaimName": f"{name}-gpu"}]
        core.upsert_pod(pod_from_json(obj))
        core.upsert(ingest.RESOURCE_CLAIMS, claim_from_json(generated(name)))
    return core


def generated(pod_name: str, device: str | None = None) -> dict[str, Any]:
    tmpl = "h100" if pod_name.startswith("y") else "any"
    exactly: dict[str, Any] = {"deviceClassName": "gpu.nvidia.com", "count": 1}
    if tmpl == "h100":
        exactly["selectors"] = [{"cel": {"expression":
                                         f'device.attributes["{DRIVER}"].productName == "H100"'}}]
    obj: dict[str, Any] = {
        "metadata": {"name": f"{pod_name}-gpu", "namespace": "default", "uid": pod_name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
        "status": {}}
    if device is not None:
        obj["status"] = {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": "n0", "device": device}]}},
            "reservedFor": [{"resource": "pods", "name": pod_name, "uid": pod_name}]}
    return obj


def admit_both(core: Coscheduler) -> FilterDecision:
    """y is admitted (y-1 passes on n1), then x by its member's filter on n0, whose answer
    is returned."""
    assert core.filter(core.queries.pods[pod_key("default", "y-1")], ["n1"], 0.0).passed == ["n1"]
    d = core.filter(core.queries.pods[pod_key("default", "x-0")], ["n0"], 0.0)
    held = state_of(core).devices.planned
    assert held[pod_key("default", "y-0")].devices[0][1] == (DRIVER, "n0", "gpu-0")
    assert held[pod_key("default", "x-0")].devices[0][1] == (DRIVER, "n0", "gpu-1")
    return d


def test_a_member_waits_rather_than_take_a_device_another_gang_cannot_spare() -> None:
    core = two_gangs_on_mixed_node()
    d = admit_both(core)
    assert isinstance(d.unresolvable, DevicesNotReady)
    assert "held by gang default/y" in render(d.unresolvable)
    y0 = core.queries.pods[pod_key("default", "y-0")]
    assert core.filter(y0, ["n0", "n1"], 1.0).passed == ["n0"]
    # y's claim allocated (PreBind): x is nudged, and first fit now gives it the A100.
    core.upsert(ingest.RESOURCE_CLAIMS, claim_from_json(generated("y-0", "gpu-0")))
    assert pod_key("default", "x-0") in state_of(core).outbox.requeue
    assert core.filter(core.queries.pods[pod_key("default", "x-0")], ["n0"], 2.0).passed == ["n0"]


def test_a_bind_whose_allocation_took_another_gangs_device_is_refused() -> None:
    """kube-scheduler allocated gpu-0 to x-0 (say its first fit was not the one predicted):
    the bind is refused, so kube-scheduler's Unreserve drops the pod from reservedFor."""
    core = two_gangs_on_mixed_node()
    admit_both(core)
    core.upsert(ingest.RESOURCE_CLAIMS, claim_from_json(generated("x-0", "gpu-0")))
    got = core.bind(pod_key("default", "x-0"), NodeName("n0"), 3.0)
    assert isinstance(got, Reject) and isinstance(got.reason, DevicesNotReady)
    assert "gpu.nvidia.com/n0/gpu-0" in render(got.reason)


def test_an_allocation_of_interchangeable_devices_moves_the_plans_not_the_gang() -> None:
    """Two one-GPU members of one gang on a node of two H100s; a passed the filter with
    gpu-0 predicted, but kube-scheduler allocated it gpu-1 (a prediction can miss: several
    pools). The plans follow the allocation: a holds gpu-1, b is matched to gpu-0."""
    core = cluster(1, [["H100", "H100"]])
    core.upsert(ingest.RESOURCE_CLAIM_TEMPLATES, template_from_json(template("any")))
    for name in ("a", "b"):
        obj = gang_pod(name, "g", 2, "any")
        obj["status"]["resourceClaimStatuses"] = [{"name": "gpu",
                                                   "resourceClaimName": f"{name}-gpu"}]
        core.upsert_pod(pod_from_json(obj))
    assert core.filter(core.queries.pods[pod_key("default", "a")], ["n0"], 0.0).passed == ["n0"]
    held = state_of(core).devices.planned
    assert held[pod_key("default", "a")].devices[0][1][2] == "gpu-0"
    assert held[pod_key("default", "b")].devices[0][1][2] == "gpu-1"
    alloc = generated("x")
    alloc["metadata"]["name"] = "a-gpu"
    alloc["status"] = {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": "n0", "device": "gpu-1"}]}}}
    core.upsert(ingest.RESOURCE_CLAIMS, claim_from_json(alloc))
    assert held[pod_key("default", "a")].devices[0][1][2] == "gpu-1"
    assert held[pod_key("default", "b")].devices[0][1][2] == "gpu-0"


def test_preemption_counts_a_victims_claims_as_freed_devices() -> None:
    core = cluster(1, [["H100"]])
    core.upsert(ingest.RESOURCE_CLAIM_TEMPLATES, template_from_json(template("any")))
    core.upsert(ingest.RESOURCE_CLAIMS, claim_from_json({
        "metadata": {"name": "v-gpu", "namespace": "default", "uid": "v"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com"}}]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": "n0", "device": "gpu-0"}]}},
            "reservedFor": [{"resource": "pods", "name": "v", "uid": "v"}]}}))
    core.upsert_pod(pod_from_json(gang_pod("a", "g", 1, "any")))
    a = Member(core.queries.pods[pod_key("default", "a")])
    levels = core.settings.levels
    assert not isinstance(plan_gang([a], state_of(core).capacity, levels), Plan)
    victim = Candidate(pod_key("default", "v"), NodeName("n0"), {}, 0, None, 0.0)
    freed = freed_view(state_of(core).capacity, levels, [victim])
    plan = plan_gang([a], freed, levels)
    assert isinstance(plan, Plan)
    assert plan.devices[a.key].devices[0][1] == (DRIVER, "n0", "gpu-0")


def test_a_gang_with_a_selector_that_does_not_compile_is_invalid_naming_the_field() -> None:
    core = cluster(1, [["H100"]])
    core.upsert(ingest.RESOURCE_CLAIM_TEMPLATES,
                template_from_json(template("bad", selector="device.driver ==")))
    core.upsert_pod(pod_from_json(gang_pod("a", "g", 1, "bad")))
    d = core.filter(core.queries.pods[pod_key("default", "a")], ["n0"], 0.0)
    assert isinstance(d.unresolvable, InvalidDeclaration)
    assert render(d.unresolvable).startswith(
        "gang default/g: invalid default/a spec.resourceClaims: ResourceClaimTemplate "
        "default/bad: spec.devices.requests[0].exactly.selectors[0].cel.expression: "
        "does not compile")
    # Fixed: the turned-away member is nudged, and the gang is planned.
    core.upsert(ingest.RESOURCE_CLAIM_TEMPLATES, template_from_json(template("bad")))
    assert pod_key("default", "a") in state_of(core).outbox.requeue
    assert core.filter(core.queries.pods[pod_key("default", "a")], ["n0"], 1.0).passed == ["n0"]


def test_a_plain_pod_is_kept_off_a_node_where_first_fit_takes_a_gangs_device() -> None:
    """y-0 holds n0's H100 (not chosen yet); a plain pod asking for any GPU would get the H100
    by first fit on n0, so n0 is refused; on n2 it is free to go."""
    core = two_gangs_on_mixed_node()
    admit_both(core)
    core.upsert(ingest.NODES, node_from_json(node("n2").build()))
    core.upsert(ingest.RESOURCE_SLICES, slice_from_json(gpu_slice("n2", ["A100"])))
    core.upsert_pod(pod_from_json(claimed(pod("plain").build(), "any")))
    d = core.filter(core.queries.pods[pod_key("default", "plain")], ["n0", "n2"], 1.0)
    assert d.passed == ["n2"]
    assert render(d.failed[NodeName("n0")]).startswith("node n0: short of")


def owned(obj: dict[str, Any], pod_name: str, rv: str = "7") -> dict[str, Any]:
    obj["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": pod_name,
                                           "uid": pod_name, "controller": True}]
    obj["metadata"]["resourceVersion"] = rv
    return obj


def test_an_allocation_kube_scheduler_left_behind_for_a_refused_member_is_cleared() -> None:
    """The bind of x-0 was refused (its allocation took y-0's H100); Unreserve dropped it
    from reservedFor and kept the allocation: Lockstep clears it, under the claim's uid and
    resourceVersion."""
    core = two_gangs_on_mixed_node()
    admit_both(core)
    taken = owned(generated("x-0", "gpu-0"), "x-0", rv="8")
    core.upsert(ingest.RESOURCE_CLAIMS, claim_from_json(taken))
    assert core.drain().deallocate == []  # still reserved for x-0: kube-scheduler's
    taken["status"].pop("reservedFor")
    taken["metadata"]["resourceVersion"] = "9"
    core.upsert(ingest.RESOURCE_CLAIMS, claim_from_json(taken))
    assert core.drain().deallocate == [("default/x-0-gpu", "x-0", "9")]


def test_an_allocation_within_the_plan_is_kept_while_the_gang_holds_it() -> None:
    core = two_gangs_on_mixed_node()
    admit_both(core)
    y0 = core.queries.pods[pod_key("default", "y-0")]
    assert core.filter(y0, ["n0", "n1"], 1.0).passed == ["n0"]
    mine = owned(generated("y-0", "gpu-0"), "y-0")
    mine["status"].pop("reservedFor")
    core.upsert(ingest.RESOURCE_CLAIMS, claim_from_json(mine))
    assert core.drain().deallocate == []


def test_an_allocation_of_a_gang_that_lost_its_reservation_is_cleared() -> None:
    core = two_gangs_on_mixed_node()
    admit_both(core)
    state_of(core).gangs[GangKey("default/y")].fall_back(WaitingForMembers(GangKey("default/y"),
                                                                       1, 2))
    mine = owned(generated("y-0", "gpu-0"), "y-0")
    mine["status"].pop("reservedFor")
    core.upsert(ingest.RESOURCE_CLAIMS, claim_from_json(mine))
    assert core.drain().deallocate == [("default/y-0-gpu", "y-0", "7")]


def test_every_scenario_keeps_the_device_invariants() -> None:
    """Rules 15 and 16 of tests/invariants.py over the scenarios above."""
    core = two_gangs_on_mixed_node()
    admit_both(core)
    check_invariants(core)
    taken = owned(generated("x-0", "gpu-0"), "x-0", rv="8")
    core.upsert(ingest.RESOURCE_CLAIMS, claim_from_json(taken))  # PreBind, then the bind call
    assert isinstance(core.bind(pod_key("default", "x-0"), NodeName("n0"), 1.0), Reject)
    check_invariants(core)
    taken["status"].pop("reservedFor")  # Unreserve
    core.upsert(ingest.RESOURCE_CLAIMS, claim_from_json(taken))
    check_invariants(core)
    assert core.drain().deallocate == [("default/x-0-gpu", "x-0", "8")]
    with pytest.raises(InvariantBroken, match="rule 16: default/x-0's unreserved claim"):
        check_invariants(core)  # once drained, the app's write is what clears it


def test_compiling_a_selector_leaves_the_processs_recursion_limit_alone() -> None:
    """cel-python's Environment raises it to 2500 for every program (hypothesis refused the
    model's run when it found it changed)."""
    before = sys.getrecursionlimit()
    assert not isinstance(Selectors().program("device.driver == 'x'"), str)
    assert sys.getrecursionlimit() == before


def partitionable(name: str = "n0") -> dict[str, Any]:
    """#138765's device: one GPU, whole (2 counters) or two halves (1 each)."""
    def consumes(n: int) -> list[dict[str, Any]]:
        return [{"counterSet": "set", "counters": {"slices": {"value": str(n)}}}]
    return {"metadata": {"name": f"{name}-gpus"},
            "spec": {"driver": DRIVER, "nodeName": name,
                     "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                     "sharedCounters": [{"name": "set", "counters": {"slices": {"value": "2"}}}],
                     "devices": [
                         {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}},
                          "consumesCounters": consumes(2)},
                         *({"name": f"gpu-0-mig-{i}", "attributes": {"type": {"string": "mig"}},
                            "consumesCounters": consumes(1)} for i in range(2))]}}


def whole_or_half() -> dict[str, Any]:
    return {"metadata": {"name": "whole-or-half", "namespace": "default"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": [
                {"name": "whole", "deviceClassName": "gpu"},
                {"name": "half", "deviceClassName": "mig"}]}]}}}}


def test_138765_exactly_whole_or_half_plans_two_halves() -> None:
    """kubernetes/kubernetes#138765 as filed: each member's claim prefers the whole GPU,
    then a half (firstAvailable); first fit gives the first member the whole GPU and the
    second nothing. The gang is planned on the two halves."""
    core = Coscheduler(Settings(backoff_seconds=10))
    core.upsert(ingest.NODES, node_from_json(node("n0").build()))
    core.upsert(ingest.RESOURCE_SLICES, slice_from_json(partitionable()))
    for cls, kind in (("gpu", "gpu"), ("mig", "mig")):
        core.upsert(ingest.DEVICE_CLASSES, class_from_json(device_class(
            cls, f'device.attributes["{DRIVER}"].type == "{kind}"')))
    core.upsert(ingest.RESOURCE_CLAIM_TEMPLATES, template_from_json(whole_or_half()))
    members = []
    for i in range(2):
        core.upsert_pod(pod_from_json(gang_pod(f"g-{i}", "g", 2, "whole-or-half")))
        members.append(Member(core.queries.pods[pod_key("default", f"g-{i}")]))
    plan = plan_gang(members, state_of(core).capacity, core.settings.levels)
    assert isinstance(plan, Plan)
    got = sorted(d[2] for pd in plan.devices.values() for _, d in pd.devices)
    assert got == ["gpu-0-mig-0", "gpu-0-mig-1"]
    assert {c[1:] for pd in plan.devices.values() for c in pd.choices} == {("gpu", 1)}


def test_a_whole_gpu_is_planned_when_one_member_asks() -> None:
    core = Coscheduler(Settings(backoff_seconds=10))
    core.upsert(ingest.NODES, node_from_json(node("n0").build()))
    core.upsert(ingest.RESOURCE_SLICES, slice_from_json(partitionable()))
    for cls, kind in (("gpu", "gpu"), ("mig", "mig")):
        core.upsert(ingest.DEVICE_CLASSES, class_from_json(device_class(
            cls, f'device.attributes["{DRIVER}"].type == "{kind}"')))
    core.upsert(ingest.RESOURCE_CLAIM_TEMPLATES, template_from_json(whole_or_half()))
    core.upsert_pod(pod_from_json(gang_pod("g-0", "g", 1, "whole-or-half")))
    g0 = core.queries.pods[pod_key("default", "g-0")]
    plan = plan_gang([Member(g0)], state_of(core).capacity,
                     core.settings.levels)
    assert isinstance(plan, Plan)
    assert [d[2] for pd in plan.devices.values() for _, d in pd.devices] == ["gpu-0"]


def generated_whole_or_half(pod_name: str) -> dict[str, Any]:
    """The claim the resourceclaim controller makes for ``pod_name`` from whole-or-half."""
    return {"metadata": {"name": f"{pod_name}-gpu-x7k2p", "namespace": "default",
                         "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod",
                                              "name": pod_name, "uid": "u",
                                              "controller": True}]},
            "spec": whole_or_half()["spec"]["spec"]}


def test_a_claim_made_for_a_planned_member_is_narrowed_to_the_planned_subrequest() -> None:
    """The gang is admitted (planned on two halves) before the resourceclaim controller
    makes the claims: each claim keeps only the "half" subrequest, so kube-scheduler's first
    fit cannot give the first member the whole GPU."""
    core = Coscheduler(Settings(backoff_seconds=10))
    core.upsert(ingest.NODES, node_from_json(node("n0").build()))
    core.upsert(ingest.RESOURCE_SLICES, slice_from_json(partitionable()))
    for cls, kind in (("gpu", "gpu"), ("mig", "mig")):
        core.upsert(ingest.DEVICE_CLASSES, class_from_json(device_class(
            cls, f'device.attributes["{DRIVER}"].type == "{kind}"')))
    core.upsert(ingest.RESOURCE_CLAIM_TEMPLATES, template_from_json(whole_or_half()))
    for i in range(2):
        core.upsert_pod(pod_from_json(gang_pod(f"g-{i}", "g", 2, "whole-or-half")))
    # Admitted; g-0 waits: unnarrowed, first fit would give it the whole GPU.
    d = core.filter(core.queries.pods[pod_key("default", "g-0")], ["n0"], 0.0)
    assert isinstance(d.unresolvable, DevicesNotReady)
    assert sorted(state_of(core).devices.planned) == [pod_key("default", f"g-{i}") for i in (0, 1)]
    unowned = generated_whole_or_half("g-1")
    del unowned["metadata"]["ownerReferences"]
    assert core.narrow_claim("default", unowned) == []
    assert core.narrow_claim("default", generated_whole_or_half("not-planned")) == []
    for i in range(2):
        claim = generated_whole_or_half(f"g-{i}")
        ops = core.narrow_claim("default", claim)
        assert ops == [{"op": "replace", "path": "/spec/devices/requests/0/firstAvailable",
                        "value": [{"name": "half", "deviceClassName": "mig"}]}]
        claim["spec"]["devices"]["requests"][0]["firstAvailable"] = ops[0]["value"]
        core.upsert(ingest.RESOURCE_CLAIMS, claim_from_json(claim))
        obj = gang_pod(f"g-{i}", "g", 2, "whole-or-half")
        obj["metadata"]["uid"] = core.queries.pods[pod_key("default", f"g-{i}")].uid
        obj["status"]["resourceClaimStatuses"] = [
            {"name": "gpu", "resourceClaimName": claim["metadata"]["name"]}]
        core.upsert_pod(pod_from_json(obj))
    # Narrowed, first fit gives each member a half: both pass.
    assert core.filter(core.queries.pods[pod_key("default", "g-0")], ["n0"], 1.0).passed == ["n0"]
    assert core.filter(core.queries.pods[pod_key("default", "g-1")], ["n0"], 1.0).passed == ["n0"]


def test_a_gang_short_of_devices_says_how_many_it_asks_for_and_how_many_are_free() -> None:
    core = cluster(2, [["H100", "H100"], ["H100"]])
    core.upsert(ingest.RESOURCE_CLAIM_TEMPLATES, template_from_json(template("two", count=2)))
    for i in range(2):
        core.upsert_pod(pod_from_json(gang_pod(f"a-{i}", "g", 2, "two")))
    d = core.filter(core.queries.pods[pod_key("default", "a-0")], ["n0", "n1"], 0.0)
    assert isinstance(d.unresolvable, DoesNotFit)
    assert "DRA claims ask for 4 devices; 3 free on the eligible nodes" in render(d.unresolvable)


def shared_claim(name: str, device: str | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "default", "uid": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com"}}]}}, "status": {}}
    if device is not None:
        obj["status"] = {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": device}]}}}
    return obj


def by_claim(p: dict[str, Any], claim: str) -> dict[str, Any]:
    p["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
    return p


def test_one_claim_shared_by_two_members_is_planned_once_on_one_node() -> None:
    """Both members name claim ``shared``: it gets one device, and both go where it is."""
    core = cluster(2, [["H100"], ["H100"]])
    core.upsert(ingest.RESOURCE_CLAIMS, claim_from_json(shared_claim("shared")))
    for i in range(2):
        core.upsert_pod(pod_from_json(by_claim(pod(f"s-{i}").gang("s", min_member=2).build(),
                                               "shared")))
    members = [Member(core.queries.pods[pod_key("default", f"s-{i}")]) for i in range(2)]
    plan = plan_gang(members, state_of(core).capacity, core.settings.levels)
    assert isinstance(plan, Plan)
    assert len(set(plan.assignments.values())) == 1
    devices = {d for pd in plan.devices.values() for _, d in pd.devices}
    assert len(devices) == 1


def test_a_member_whose_claim_is_allocated_goes_where_its_devices_are() -> None:
    core = cluster(2, [["H100"], ["H100"]])
    core.upsert(ingest.RESOURCE_CLAIMS, claim_from_json(shared_claim("mine", device="gpu-0")))
    core.upsert_pod(pod_from_json(by_claim(pod("m-0").gang("m", min_member=1).build(), "mine")))
    m0 = core.queries.pods[pod_key("default", "m-0")]
    plan = plan_gang([Member(m0)], state_of(core).capacity,
                     core.settings.levels)
    assert isinstance(plan, Plan) and plan.assignments == {pod_key("default", "m-0"): "n1"}


def test_network_attached_devices_reach_the_nodes_their_slice_selects() -> None:
    """A pool of two devices reachable from nodes labelled fabric=a (nodeSelector), and one
    reachable from every node (allNodes); the nodes have no devices of their own."""
    core = Coscheduler(Settings(backoff_seconds=10))
    for name, fabric in (("n0", "a"), ("n1", "a"), ("n2", "b")):
        core.upsert(ingest.NODES, node_from_json(node(name).label("fabric", fabric).build()))
    selected = gpu_slice("fabric-a", ["H100", "H100"])
    del selected["spec"]["nodeName"]
    selected["spec"]["nodeSelector"] = {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "fabric", "operator": "In", "values": ["a"]}]}]}
    everywhere = gpu_slice("shared-pool", ["A100"])
    del everywhere["spec"]["nodeName"]
    everywhere["spec"]["allNodes"] = True
    core.upsert(ingest.RESOURCE_SLICES, slice_from_json(selected))
    core.upsert(ingest.RESOURCE_SLICES, slice_from_json(everywhere))
    core.upsert(ingest.DEVICE_CLASSES, class_from_json(device_class()))
    core.upsert(ingest.RESOURCE_CLAIM_TEMPLATES, template_from_json(template(
        "h100", selector=f'device.attributes["{DRIVER}"].productName == "H100"')))
    members = []
    for i in range(2):
        core.upsert_pod(pod_from_json(gang_pod(f"f-{i}", "f", 2, "h100")))
        members.append(Member(core.queries.pods[pod_key("default", f"f-{i}")]))
    plan = plan_gang(members, state_of(core).capacity, core.settings.levels)
    assert isinstance(plan, Plan)
    assert set(plan.assignments.values()) <= {"n0", "n1"}  # never n2 (fabric b)
    assert {d[1] for pd in plan.devices.values() for _, d in pd.devices} == {"fabric-a"}
    core.upsert_pod(pod_from_json(gang_pod("f-2", "f3", 1, "any")))
    core.upsert(ingest.RESOURCE_CLAIM_TEMPLATES, template_from_json(template("any")))
    third = Member(core.queries.pods[pod_key("default", "f-2")], frozenset({NodeName("n2")}))
    plan = plan_gang([third], state_of(core).capacity, core.settings.levels)
    assert isinstance(plan, Plan)  # n2 reaches the allNodes pool
    assert [d[1] for pd in plan.devices.values() for _, d in pd.devices] == ["shared-pool"]


def test_a_shared_claims_device_held_by_both_its_members_keeps_the_invariants() -> None:
    core = cluster(2, [["H100"], ["H100"]])
    core.upsert(ingest.RESOURCE_CLAIMS, claim_from_json(shared_claim("shared")))
    for i in range(2):
        core.upsert_pod(pod_from_json(by_claim(pod(f"s-{i}").gang("s", min_member=2).build(),
                                               "shared")))
    """(Before: s-0 waited for ever, its first fit "taking" the device s-1's plan named, which
    is the same claim's.)"""
    node_s0 = core.filter(core.queries.pods[pod_key("default", "s-0")], ["n0", "n1"], 0.0).passed
    check_invariants(core)
    assert core.filter(core.queries.pods[pod_key("default", "s-1")], ["n0", "n1"], 0.0).passed \
        == node_s0
    check_invariants(core)
    dev = state_of(core).devices.planned[pod_key("default", "s-0")].devices[0][1][2]
    alloc = shared_claim("shared")
    alloc["status"] = {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": node_s0[0], "device": dev}]}},
        "reservedFor": [{"resource": "pods", "name": "s-0", "uid": "x"}]}
    core.upsert(ingest.RESOURCE_CLAIMS, claim_from_json(alloc))
    assert isinstance(core.bind(pod_key("default", "s-0"), NodeName(node_s0[0]), 1.0), Park)
    assert isinstance(core.bind(pod_key("default", "s-1"), NodeName(node_s0[0]), 1.0),
                      BindGroup)
    check_invariants(core)


def test_counters_and_consumers_over_the_apis_limits_are_refused_at_the_wire() -> None:
    s = partitionable()
    s["spec"]["sharedCounters"][0]["counters"] = {f"c{i}": {"value": "1"} for i in range(33)}
    with pytest.raises(RecordError, match=r"sharedCounters"):
        slice_from_json(s)
    c = shared_claim("x", device="gpu-0")
    c["status"]["reservedFor"] = [{"resource": "pods", "name": f"p{i}"} for i in range(257)]
    with pytest.raises(RecordError, match=r"reservedFor"):
        claim_from_json(c)
