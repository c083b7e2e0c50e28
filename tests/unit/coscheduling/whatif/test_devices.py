"""The what-if of gangs whose members ask for DRA devices: its capacity views (the live one
with earlier units taken, the empty cluster) give the planner the devices too, so a DRA gang
is answered by its devices, not its zero ``nvidia.com/gpu`` requests (before the views had
``device_room``, planning such a unit raised AttributeError)."""

from __future__ import annotations

from typing import Any

from coscheduling import GateAtCreation, PinAtCreation, Verdict, gang_key, pod_from_json, pod_key
from coscheduling.devices.wire import claim_from_json, template_from_json
from coscheduling.events import ingest
from coscheduling.reasons import DoesNotFit
from tests.builders import pod
from tests.internals import state_of
from tests.unit.coscheduling.creation.test_placer import burst, land_all
from tests.unit.coscheduling.devices.test_devices import (
    DRIVER,
    claimed,
    cluster,
    gang_pod,
    generated,
    template,
)


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
    assert core.filter(core.queries.pods[pod_key("default", "x-0")], ["n0", "n1", "n2"], 0.0).passed
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


def test_a_later_gang_of_the_manifest_sees_the_devices_an_earlier_one_was_planned() -> None:
    """Two 4-member gangs of one-device members on 3 nodes x 2 DRA GPUs, in one manifest.
    Created, the first is pinned at creation and holds 4 devices; the second does not fit
    on the 2 left and waits, the first named as holding the room. The what-if says the same
    (before, each unit saw the live devices: both "fits now", 8 members on 6 devices)."""
    core = seed()
    objs = [creating(f"{g}-{i}", g, 4) for g in ("a", "b") for i in range(4)]
    answer = core.what_if(objs, 0.0).run()
    first, second = answer.outcomes
    assert [first.verdict, second.verdict] == [Verdict.FITS, Verdict.WAITS], answer
    assert answer.verdict is Verdict.WAITS and not second.placed
    assert isinstance(second.reason, DoesNotFit)
    assert second.reason.reserved_by == (gang_key("default", "a"),)
    assert "DRA claims ask for 4 devices; 2 free" in " ".join(second.reason.nofit.notes)
    assert state_of(core).devices.planned == {}  # the what-if held nothing
    # The same objects created: the core pins the first gang there and gates the second,
    # then its held-gang sweep gives the second the reason the what-if gave.
    placed = burst(core, objs)
    assert {k: a.node for k, a in placed.items() if isinstance(a, PinAtCreation)} == {
        p.pod.split("/")[1]: p.node for p in first.placed}
    assert all(isinstance(placed[f"b-{i}"], GateAtCreation) for i in range(4))
    land_all(core, objs, placed)
    core.admit_gated(1.0)
    assert core.queries.gangs[gang_key("default", "b")].reason == second.reason



def test_a_later_gang_that_must_preempt_gets_only_what_its_victims_free() -> None:
    """A low-priority pod holds gpu-0 of n2 (its claim allocated); the manifest's first gang
    (5 one-device members) takes the five devices left, n2's gpu-1 among them. The second,
    one member of two devices, could only go to n2 by evicting the low pod: that frees gpu-0
    alone, gpu-1 stays held for the first gang, so it waits. (Held in the planner's view but
    not in the victim search's, it would "fit after preemption" on devices the first holds.)"""
    core = seed()
    core.upsert(ingest.RESOURCE_CLAIM_TEMPLATES, template_from_json(template("two", count=2)))
    obj = claimed(pod("low").gang("low", 1).priority(10).on("n2").build(), "one")
    obj["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": "low-gpu"}]
    core.upsert_pod(pod_from_json(obj))
    claim = generated("low", "gpu-0")
    claim["spec"]["devices"]["requests"][0]["exactly"].pop("selectors", None)
    claim["status"]["allocation"]["devices"]["results"][0]["pool"] = "n2"
    core.upsert(ingest.RESOURCE_CLAIMS, claim_from_json(claim))

    def high(name: str, gang: str, size: int, tmpl: str) -> dict[str, Any]:
        obj = claimed(pod(name).gang(gang, size).priority(100).build(), tmpl)
        obj["metadata"].pop("uid", None)
        obj.pop("status", None)
        return obj
    objs = [high(f"a-{i}", "a", 5, "one") for i in range(5)] + [high("b-0", "b", 1, "two")]
    first, second = core.what_if(objs, 0.0).run().outcomes
    assert first.verdict is Verdict.FITS
    held = {d for _, pd in first.devices for _, d in pd.devices}
    assert len(held) == 5 and (DRIVER, "n2", "gpu-1") in held
    assert second.verdict is Verdict.WAITS, second
    assert isinstance(second.reason, DoesNotFit)
    assert second.reason.reserved_by == (gang_key("default", "a"),)
