"""What a planning call is charged for selectors (after ``cel`` and ``draplan``
met): a verdict ``Selectors`` already knows is a look-up, an evaluation is charged the steps
it took, the steps left are handed to the evaluator (running out is being over budget), and
compiling a gang's selectors is charged by tokens, a few per call. Work is counted (programs
evaluated and compiled), not timed.
"""

from __future__ import annotations

from typing import Any

import pytest

from app.render import render, render_nofit
from coscheduling import Coscheduler, pod_from_json, pod_key
from coscheduling.devices.celcost import MAX_STEPS
from coscheduling.devices.selectors import Selectors
from coscheduling.devices.wire import class_from_json, template_from_json
from coscheduling.events import ingest
from coscheduling.placement.planner import NoFit, Plan
from coscheduling.reasons import DoesNotFit, InvalidDeclaration
from tests.internals import state_of
from tests.unit.coscheduling.devices.test_budget import NEVER, Work, gpus, member, plan, requests
from tests.unit.coscheduling.devices.test_devices import (
    DRIVER,
    cluster,
    device_class,
    gang_pod,
    template,
)

BUDGET_UNITS = 200_000
UNITS_PER_STEP = 10
UNITS_PER_TOKEN = 200

COSTLY = ("[1,2,3,4,5,6,7,8,9,10].all(x, [1,2,3,4,5,6,7,8,9,10].all(y, x + y > 0)) && "
          f'device.attributes["{DRIVER}"].uuid != ""')
"""About 5,700 steps per device (100 macro iterations), and it reads each GPU's ``uuid``:
no two GPUs share its verdict."""


def selectors_of(core: Coscheduler) -> Selectors:
    return state_of(core).devices.selectors


# ------------------------------------------------- one cache: what a selector reads


def test_gpus_differing_only_in_uuid_share_one_verdict_and_the_plan_is_answered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """300 nodes x 8 GPUs, each with its own ``uuid``, and a selector that reads only the
    product name. Before: the inventory kept verdicts per full signature (uuid included),
    so each of 2,400 devices was charged an evaluation (500 units) though ``Selectors``
    evaluated 2 and answered the rest from its cache: the call stopped at its budget after
    about 400 and the gang was told to wait. After: one cache, keyed by what the selector
    reads; two evaluations, the rest look-ups, and the honest answer in one call."""
    core = gpus(300, distinct=True)
    core.upsert(ingest.RESOURCE_CLAIM_TEMPLATES, template_from_json(requests("t", 1, NEVER)))
    m = member(core, "m", "g", 1, ["t"])
    work = Work(monkeypatch)
    work.watch(core, monkeypatch)
    got = plan(core, [m])
    assert isinstance(got, NoFit)
    text = render_nofit(got)
    assert "work budget" not in text and "DRA claims ask for 1 devices" in text, text
    assert work.evaluations <= 2, work.evaluations
    budget = work.rooms[0].budget
    assert budget.evaluations <= 2 and not budget.spent, budget


# ------------------------------------------------------------- steps, not a flat fee


def test_costly_evaluations_are_charged_their_steps_and_spread_over_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """16 GPUs that differ in what a 5,700-step selector reads: 16 evaluations, about
    91,000 steps (0.4-0.7 s of cel-python). Before: each was charged a flat 500 units, so
    one call ran all 16. After: each is charged its steps, the evaluator is handed only the
    steps the call has left (running out is the call over budget, the partial evaluation
    not kept), and the verdicts are gathered over a few calls, each bounded."""
    core = gpus(2, distinct=True)
    core.upsert(ingest.RESOURCE_CLAIM_TEMPLATES, template_from_json(requests("t", 1, COSTLY)))
    m = member(core, "m", "g", 1, ["t"])
    work = Work(monkeypatch)
    work.watch(core, monkeypatch)
    sel = selectors_of(core)
    answers = []
    for _ in range(12):
        steps = sel.steps
        answers.append(plan(core, [m]))
        assert sel.steps - steps <= BUDGET_UNITS // UNITS_PER_STEP + MAX_STEPS, sel.steps
        room = work.rooms[-1].budget
        assert BUDGET_UNITS - room.left >= UNITS_PER_STEP * (sel.steps - steps), room
        if isinstance(answers[-1], Plan):
            break
    first = answers[0]
    assert isinstance(first, NoFit)
    assert "DRA device planning stopped at its work budget" in render_nofit(first)
    assert "planned again on the next try" in render_nofit(first)
    assert isinstance(answers[-1], Plan), render_nofit(answers[-1])  # type: ignore[arg-type]
    assert len(answers) >= 3
    assert sel.overruns == 0  # the call's budget stopped them, not the selector's limit


# ----------------------------------------------------------- compiles, by tokens


def long_selector(tag: int) -> str:
    """About 400 tokens (40 comparisons), true of every H100, one of its own per ``tag``."""
    return " && ".join(f'device.attributes["{DRIVER}"].productName != "X{tag}-{i}"'
                       for i in range(40))


class Compiles:
    """Long selectors compiled (``long_selector``'s, not the class's)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        compile_ = Selectors._compile

        def counting(sel: Selectors, expression: str) -> Any:
            self.count += len(expression) > 1_000
            return compile_(sel, expression)

        monkeypatch.setattr(Selectors, "_compile", counting)


def test_a_member_naming_many_templates_compiles_them_a_few_per_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """8 claims from 8 templates, each with its own 400-token selector (about 35 ms of
    parsing each, on the event loop). Before: the first plan compiled all 8 (and a gang of
    many members, all of theirs). After: compiles are charged by tokens (80,000 units for
    one of 400 tokens), so a plan compiles 3 at most, says it stopped at its budget, and the
    next plans, finding those kept, go on until the gang is planned."""
    core = gpus(1)
    for c in range(8):
        core.upsert(ingest.RESOURCE_CLAIM_TEMPLATES,
                    template_from_json(requests(f"t{c}", 1, long_selector(c))))
    m = member(core, "m", "g", 1, [f"t{c}" for c in range(8)])
    compiles = Compiles(monkeypatch)
    per_call, answers = [], []
    for _ in range(8):
        before = compiles.count
        answers.append(plan(core, [m]))
        per_call.append(compiles.count - before)
        if isinstance(answers[-1], Plan):
            break
    assert max(per_call) <= BUDGET_UNITS // (400 * UNITS_PER_TOKEN) + 1, per_call
    assert len(per_call) >= 3, per_call
    assert isinstance(answers[0], NoFit)
    text = render_nofit(answers[0])
    assert "DRA device planning stopped at its work budget" in text, text
    assert "planned again on the next try" in text
    assert isinstance(answers[-1], Plan), per_call
    assert sum(per_call) == 8, per_call  # each compiled once: the next calls find it kept


def test_the_filter_compiles_a_gangs_selectors_within_its_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same through ``filter``: the claims are checked (``claims_problem``) and then
    planned, each within one budget, so one filter call compiles at most a few of the
    member's 8 selectors, the gang is told to wait (not that it is invalid), and a few
    tries later it passes. (Preemption is off: its victim search plans again, each plan
    with a budget of its own.)"""
    core = gpus(1, preemption=False)
    for c in range(8):
        core.upsert(ingest.RESOURCE_CLAIM_TEMPLATES,
                    template_from_json(requests(f"t{c}", 1, long_selector(c))))
    member(core, "m", "g", 1, [f"t{c}" for c in range(8)])
    compiles = Compiles(monkeypatch)
    per_call, now = [], 0.0
    for _ in range(8):
        before = compiles.count
        d = core.filter(core.queries.pods[pod_key("default", "m")], ["n0"], now)
        per_call.append(compiles.count - before)
        if d.passed:
            break
        assert isinstance(d.unresolvable, DoesNotFit), render(d.unresolvable)  # type: ignore[arg-type]
        assert "planned again on the next try" in render(d.unresolvable)
        now += 11.0  # past the gang's backoff
    assert d.passed == ["n0"], per_call
    assert max(per_call) <= 2 * (BUDGET_UNITS // (400 * UNITS_PER_TOKEN) + 1), per_call
    assert sum(per_call) == 8, per_call


# ------------------------------------------------- a class over a limit is named


@pytest.mark.parametrize(("selectors", "says"), [
    (["device.driver == 'x' || " + "true || " * 3400 + "true"],
     "spec.selectors[0].cel.expression: 27228 characters, at most 10240"),
    ([" || ".join(["true"] * 200)] * 6,
     "spec.selectors: more than 2048 CEL tokens in all selectors, at most 2048"),
    ([" || ".join(["true"] * 300)],
     "spec.selectors[0].cel.expression: more than 512 tokens, at most 512"),
])
def test_a_claim_asking_for_a_class_over_a_limit_is_invalid_naming_the_class(
    selectors: list[str], says: str,
) -> None:
    """Before: a class over the character or the 2,048-token limit was read as ``false``
    and selected nothing, silently (the gang waited for devices forever); only one over
    the 512-token limit per expression was named. After: every limit names the class and
    the field, and fixing the class plans the gang."""
    core = cluster(1, [["H100"]])
    bad = device_class()
    bad["spec"]["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    core.upsert(ingest.DEVICE_CLASSES, class_from_json(bad))
    core.upsert(ingest.RESOURCE_CLAIM_TEMPLATES, template_from_json(template("t")))
    core.upsert_pod(pod_from_json(gang_pod("a", "g", 1, "t")))
    d = core.filter(core.queries.pods[pod_key("default", "a")], ["n0"], 0.0)
    assert isinstance(d.unresolvable, InvalidDeclaration), d
    assert f"DeviceClass gpu.nvidia.com: {says}" in render(d.unresolvable), \
        render(d.unresolvable)
    core.upsert(ingest.DEVICE_CLASSES, class_from_json(device_class()))
    assert core.filter(core.queries.pods[pod_key("default", "a")], ["n0"], 1.0).passed == ["n0"]


def test_a_call_too_poor_for_an_evaluation_still_keeps_one_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by the device model starved of budget: when what a call has left buys fewer
    steps than an evaluation takes, the evaluation was cut at the same point on every try
    and nothing was kept, so the gang was stopped at its budget for ever. Now a call's
    first evaluation runs in full (at most one evaluation over the budget), so every try
    keeps one more result."""
    monkeypatch.setattr("coscheduling.devices.budget.STEP", 4_000)  # 50 steps a call
    core = gpus(1)
    core.upsert(ingest.RESOURCE_CLAIM_TEMPLATES, template_from_json(requests(
        "t", 1, f'device.attributes["{DRIVER}"].productName == "H100"')))
    m = member(core, "m", "g", 1, ["t"])
    answers = [plan(core, [m]) for _ in range(4)]
    assert isinstance(answers[0], NoFit)
    assert "planned again on the next try" in render_nofit(answers[0])
    assert isinstance(answers[-1], Plan), [render_nofit(a) for a in answers
                                            if isinstance(a, NoFit)]
