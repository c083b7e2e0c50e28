"""DRA planning is bounded by one work budget per planning call, whatever the claims ask.

A 1-member gang with 16 claims x 32 requests (each within the API's limits) on 200 nodes of
8 GPUs built 512 units on every node it tried (0.7-1.3 s per filter call); a selector that
matches nothing was evaluated on every device of 300 nodes (1.0-1.6 s, again for each new
selector). Work is counted here, not timed: selector evaluations (runs of a program in
``Selectors``, each test with its caches cold), units built (``JointTrial._add_units``) and
the budget's own counters.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from app.render import render, render_nofit
from coscheduling import Coscheduler, Settings, node_from_json, pod_from_json, pod_key
from coscheduling.devices import budget as budget_module
from coscheduling.devices import selectors as selectors_module
from coscheduling.devices.budget import BUDGET, COMPILE, EVALUATION, STEP, TOKEN
from coscheduling.devices.inventory import DeviceInventory
from coscheduling.devices.matching import JointTrial
from coscheduling.devices.room import DeviceRoom
from coscheduling.devices.selectors import Selectors
from coscheduling.devices.wire import class_from_json, slice_from_json, template_from_json
from coscheduling.events import ingest
from coscheduling.placement.planner import Member, NoFit, Plan, plan_gang
from coscheduling.reasons import DoesNotFit
from tests.builders import node, pod
from tests.internals import state_of
from tests.unit.coscheduling.devices.test_devices import DRIVER, device_class, gpu_slice

NEVER = f'device.attributes["{DRIVER}"].productName == "B200"'
UUID = f'device.attributes["{DRIVER}"].uuid == "none"'
"""Matches no GPU, and reads each one's own ``uuid``."""


def gpus(nodes: int, *, distinct: bool = False, models: list[str] | None = None,
         preemption: bool = True) -> Coscheduler:
    """``nodes`` nodes of 8 H100s (or ``models``). ``distinct``: each device carries its own
    ``uuid`` attribute, as NVIDIA's driver publishes, so no two share a signature."""
    core = Coscheduler(Settings(backoff_seconds=10, preemption=preemption))
    for i in range(nodes):
        core.upsert(ingest.NODES, node_from_json(node(f"n{i}").build()))
        s = gpu_slice(f"n{i}", models or ["H100"] * 8)
        if distinct:
            for d in s["spec"]["devices"]:
                d["attributes"]["uuid"] = {"string": f"GPU-n{i}-{d['name']}"}
        core.upsert(ingest.RESOURCE_SLICES, slice_from_json(s))
    core.upsert(ingest.DEVICE_CLASSES, class_from_json(device_class()))
    return core


def requests(name: str, n: int, selector: str | None = None, count: int = 1
             ) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "gpu.nvidia.com", "count": count}
    if selector is not None:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {"metadata": {"name": name, "namespace": "default"},
            "spec": {"spec": {"devices": {"requests": [
                {"name": f"r{r}", "exactly": exactly} for r in range(n)]}}}}


def member(core: Coscheduler, name: str, gang: str, size: int, templates: list[str]
           ) -> Member:
    p = pod(name).gang(gang, min_member=size).build()
    p["spec"]["resourceClaims"] = [{"name": f"c{i}", "resourceClaimTemplateName": t}
                                   for i, t in enumerate(templates)]
    core.upsert_pod(pod_from_json(p))
    return Member(core.queries.pods[pod_key("default", name)])


class Work:
    """What planning calls did: selector evaluations, units built, each call's budget."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.evaluations = 0
        self.unit_builds = 0
        self.rooms: list[DeviceRoom] = []
        evaluate, add_units = Selectors._evaluate, JointTrial._add_units

        def counting_evaluate(sel: Selectors, *args: Any) -> Any:
            self.evaluations += 1
            return evaluate(sel, *args)

        def counting_add_units(trial: JointTrial, *args: Any) -> bool:
            self.unit_builds += 1
            return add_units(trial, *args)

        monkeypatch.setattr(Selectors, "_evaluate", counting_evaluate)
        monkeypatch.setattr(JointTrial, "_add_units", counting_add_units)

    def watch(self, core: Coscheduler, monkeypatch: pytest.MonkeyPatch) -> None:
        """Keep every planning call's room (its budget), through a counting wrapper around
        the capacity's ``device_room`` (written through ``state_of``, as said there)."""
        cap = state_of(core).capacity
        make = cap.device_room

        def keeping() -> DeviceRoom:
            room = make()
            self.rooms.append(room)
            return room

        monkeypatch.setattr(cap, "device_room", keeping)

    def spent(self) -> int:
        return max(BUDGET - r.budget.left for r in self.rooms)


def plan(core: Coscheduler, members: list[Member]) -> Plan | NoFit:
    return plan_gang(members, state_of(core).capacity, core.settings.levels)


def test_a_member_asking_more_devices_than_any_node_has_builds_no_units(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """16 claims x 32 requests is 512 devices; no node has more than 8. Before: 512 units
    built on each of the 200 nodes (102,400 ``_add_units`` calls per filter); after: each
    node is counted out before a unit is built."""
    core = gpus(200)
    for c in range(16):
        core.upsert(ingest.RESOURCE_CLAIM_TEMPLATES, template_from_json(requests(f"t{c}", 32)))
    m = member(core, "m", "g", 1, [f"t{c}" for c in range(16)])
    work = Work(monkeypatch)
    work.watch(core, monkeypatch)
    got = plan(core, [m])
    assert isinstance(got, NoFit)
    assert "DRA claims ask for 512 devices" in render_nofit(got)
    assert work.unit_builds == 0, work.unit_builds
    assert work.evaluations <= 2, work.evaluations  # the class's selector, one signature
    # 512 requests read once for the member, the 1,600 devices listed once.
    assert work.spent() <= 4 * 512 + 2 * 1_600 + 2 * EVALUATION, work.rooms[0].budget


def test_a_selector_matching_nothing_is_evaluated_once_per_device_signature(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """300 nodes x 8 identical GPUs: the selector is evaluated for one device signature,
    not 2,400 devices, even with every cache cold, and no node gets as far as a trial."""
    core = gpus(300)
    core.upsert(ingest.RESOURCE_CLAIM_TEMPLATES, template_from_json(requests("t", 1, NEVER)))
    m = member(core, "m", "g", 1, ["t"])
    work = Work(monkeypatch)
    work.watch(core, monkeypatch)
    got = plan(core, [m])
    assert isinstance(got, NoFit) and "DRA claims ask for 1 devices" in render_nofit(got)
    assert work.evaluations <= 2, work.evaluations  # class and request, one signature
    assert work.unit_builds == 0, work.unit_builds
    # 2,400 devices listed and walked, each verdict looked up (class, request), the two
    # selectors compiled and evaluated once.
    assert work.spent() <= 4 * 2_400 + 2 * (COMPILE + 20 * TOKEN) + 2 * (
        EVALUATION + 100 * STEP), work.rooms[0].budget
    assert not any(r.budget.spent for r in work.rooms)


def test_selectors_on_devices_that_all_differ_stop_at_the_budget_and_say_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a ``uuid`` per device, read by the selector, no two devices share a verdict:
    2,400 evaluations cost more than one call's budget. Each call evaluates at most its
    budget's worth, says so on the gang, and the verdicts it paid for are kept: a few calls
    later the honest answer (no device matches) is given, each call bounded. (A selector
    that does not read the ``uuid`` is answered for all of them at once:
    ``test_device_charges``.)"""
    core = gpus(300, distinct=True)
    core.upsert(ingest.RESOURCE_CLAIM_TEMPLATES, template_from_json(requests("t", 1, UUID)))
    m = member(core, "m", "g", 1, ["t"])
    work = Work(monkeypatch)
    calls = 0
    texts = []
    while calls < 20:
        before = work.evaluations
        got = plan(core, [m])
        calls += 1
        assert isinstance(got, NoFit)
        assert work.evaluations - before <= BUDGET // (EVALUATION + 10 * STEP) + 1, \
            work.evaluations
        texts.append(render_nofit(got))
        if "work budget" not in texts[-1]:
            break
    assert "DRA device planning stopped at its work budget" in texts[0]
    assert "planned again on the next try" in texts[0]
    assert "work budget" not in texts[-1] and "DRA claims ask for 1 devices" in texts[-1]
    assert calls <= 2_400 // (BUDGET // (EVALUATION + 100 * STEP)) + 2, calls


def test_a_plan_over_budget_is_a_reason_on_the_gang_not_a_stall(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """When one evaluation spends the whole budget, the filter still answers at once, with
    a reason that says why, and the gang is planned again on the next try."""
    core = gpus(4)
    core.upsert(ingest.RESOURCE_CLAIM_TEMPLATES, template_from_json(requests("t", 1)))
    member(core, "m", "g", 1, ["t"])
    monkeypatch.setattr(budget_module, "EVALUATION", BUDGET)
    d = core.filter(core.queries.pods[pod_key("default", "m")], [f"n{i}" for i in range(4)], 0.0)
    assert d.passed == [] and isinstance(d.unresolvable, DoesNotFit)
    assert "DRA device planning stopped at its work budget" in render(d.unresolvable)
    monkeypatch.setattr(budget_module, "EVALUATION", 500)
    d = core.filter(core.queries.pods[pod_key("default", "m")], [f"n{i}" for i in range(4)], 11.0)
    assert d.passed  # the verdict paid for is kept: the next try fits


# --------------------------------------------------------------------- the same answer


def _random_case(rng: random.Random) -> tuple[Coscheduler, list[Member]]:
    nodes = rng.randint(1, 4)
    models = [[rng.choice(["H100", "A100"]) for _ in range(rng.randint(1, 4))]
              for _ in range(nodes)]
    core = Coscheduler(Settings(backoff_seconds=10))
    for i in range(nodes):
        core.upsert(ingest.NODES, node_from_json(node(f"n{i}").build()))
        core.upsert(ingest.RESOURCE_SLICES, slice_from_json(gpu_slice(f"n{i}", models[i])))
    core.upsert(ingest.DEVICE_CLASSES, class_from_json(device_class()))
    selectors = [None, f'device.attributes["{DRIVER}"].productName == "H100"',
                 f'device.attributes["{DRIVER}"].productName == "A100"']
    for t in range(3):
        core.upsert(ingest.RESOURCE_CLAIM_TEMPLATES, template_from_json(requests(
            f"t{t}", rng.randint(1, 2), rng.choice(selectors), rng.randint(1, 2))))
    size = rng.randint(1, 3)
    members = [member(core, f"m{i}", "g", size,
                      [f"t{rng.randrange(3)}" for _ in range(rng.randint(1, 2))])
               for i in range(size)]
    return core, members


def test_the_pre_checks_never_change_a_plan_that_fits_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The per-node and per-domain pre-checks are necessary conditions only: with them
    switched off (every node tried in full, as before) every plan is the same."""
    rng = random.Random(41)
    cases = [_random_case(rng) for _ in range(150)]
    with_checks = [plan(core, ms) for core, ms in cases]
    monkeypatch.setattr(JointTrial, "_could", lambda *_: True)
    monkeypatch.setattr(DeviceRoom, "could", lambda *_: True)
    without = [plan(core, ms) for core, ms in cases]
    assert with_checks == without
    fits = sum(isinstance(p, Plan) for p in with_checks)
    assert 20 <= fits <= 130, fits  # both outcomes are exercised


def test_verdicts_stay_right_when_the_kept_ones_are_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Verdicts are kept per (expression, what it reads of a device) up to a bound, the
    least recently used dropped first: a selection straddling drops is still exact."""
    monkeypatch.setattr(selectors_module, "RESULTS_CACHED", 3)
    inv = DeviceInventory()
    models = ["H100", "A100", "B200", "H100", "L40", "A100", "B200", "H100"]
    inv.put_slice(slice_from_json(gpu_slice("n0", models)))
    devices = list(inv.local("n0"))
    for expr in (NEVER, f'device.attributes["{DRIVER}"].productName == "H100"',
                 f'device.attributes["{DRIVER}"].productName != "A100"'):
        for _ in range(2):
            got = [d.name for d in inv.select(devices, (expr,))]
            assert got == [d.name for d in devices if inv.matches(d, (expr,))], expr


def test_a_signature_tells_a_boolean_attribute_from_an_integer_one() -> None:
    """``True == 1`` in Python, not in CEL: two devices alike but for that never share a
    verdict."""
    inv = DeviceInventory()
    s = gpu_slice("n0", ["H100", "H100"])
    s["spec"]["devices"][0]["attributes"]["x"] = {"bool": True}
    s["spec"]["devices"][1]["attributes"]["x"] = {"int": 1}
    inv.put_slice(slice_from_json(s))
    devices = list(inv.local("n0"))
    expr = f'device.attributes["{DRIVER}"].x == true'
    assert [d.name for d in inv.select(devices, (expr,))] == ["gpu-0"]
    assert [d.name for d in inv.select(devices[::-1], (expr,))] == ["gpu-0"]
