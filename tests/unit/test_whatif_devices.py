"""The what-if of gangs whose members ask for DRA devices: its capacity views (the live one
with earlier units taken, the empty cluster) give the planner the devices too, so a DRA gang
is answered by its devices, not its zero ``nvidia.com/gpu`` requests (before the views had
``device_room``, planning such a unit raised AttributeError)."""

from __future__ import annotations

from typing import Any

from coscheduling import Verdict, ingest, pod_from_json, pod_key
from coscheduling.devices.wire import template_from_json
from tests.builders import pod
from tests.internals import state_of
from tests.unit.test_devices import cluster, gang_pod, template


def creating(name: str, gang: str, size: int) -> dict[str, Any]:
    obj = gang_pod(name, gang, size, "one")
    obj["metadata"].pop("uid", None)
    obj.pop("status", None)
    return obj


def seed() -> Any:
    core = cluster(3, [["H100", "H100"]] * 3)
    core.upsert(ingest.RESOURCE_CLAIM_TEMPLATES, template_from_json(template("one")))
    return core


def test_a_dra_gang_within_the_free_devices_fits_now() -> None:
    core = seed()
    answer = core.what_if([creating(f"w{i}", "g", 4) for i in range(4)], 0.0).run()
    assert answer.verdict is Verdict.FITS
    assert len(answer.outcomes[0].placed) == 4


def test_a_dra_gang_larger_than_every_device_never_fits() -> None:
    """Seven one-device members on six devices: never, even on the empty cluster (the
    members ask for no ``nvidia.com/gpu``, so only the devices can say so)."""
    core = seed()
    answer = core.what_if([creating(f"w{i}", "g", 7) for i in range(7)], 0.0).run()
    assert answer.verdict is Verdict.NEVER


def test_a_dra_gang_waits_while_an_admitted_gang_holds_the_devices_it_needs() -> None:
    core = seed()
    for i in range(4):
        core.upsert_pod(pod_from_json(gang_pod(f"x-{i}", "x", 4, "one")))
    assert core.filter(core.pods[pod_key("default", "x-0")], ["n0", "n1", "n2"], 0.0).passed
    held = dict(state_of(core).devices.planned)
    answer = core.what_if([creating(f"w{i}", "g", 4) for i in range(4)], 0.0).run()
    assert answer.verdict is Verdict.WAITS
    assert dict(state_of(core).devices.planned) == held  # the what-if held nothing


def test_plain_pods_without_claims_are_planned_as_before() -> None:
    core = seed()
    obj = pod("p").gang("g", 1, timeout=30).build()
    obj["metadata"].pop("uid", None)
    obj.pop("status", None)
    assert core.what_if([obj], 0.0).run().verdict is Verdict.FITS
