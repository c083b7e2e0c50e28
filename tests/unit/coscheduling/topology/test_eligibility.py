"""Required node affinity is bounded before any matching: a pod over a limit is unplaceable
with a reason that names the field and the limit, and checking it costs no more than the
limits allow, whatever the pod carries."""

from __future__ import annotations

import time
from typing import Any

import pytest

from coscheduling import Coscheduler, Settings, gang_key, node_from_json, pod_from_json, pod_key
from coscheduling.events import ingest
from coscheduling.reasons import DoesNotFit
from coscheduling.records import PodRecord
from coscheduling.topology.eligibility import (
    AFFINITY_FIELD,
    MAX_AFFINITY_ITEMS,
    MAX_AFFINITY_TERMS,
    MAX_REQUIREMENT_VALUES,
    MAX_TERM_REQUIREMENTS,
    affinity_problem,
    eligible,
    match_expression,
)
from tests.builders import node, pod
from tests.internals import state_of


def _with_terms(obj: dict[str, Any], terms: list[Any]) -> dict[str, Any]:
    obj["spec"]["affinity"] = {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}
    return obj


def _expr(values: list[str]) -> dict[str, Any]:
    return {"key": "zone", "operator": "In", "values": values}


ZONE_A = [_expr(["a"])]


@pytest.mark.parametrize(("terms", "names"), [
    ([{"matchExpressions": ZONE_A}] * (MAX_AFFINITY_TERMS + 1), f"at most {MAX_AFFINITY_TERMS}"),
    ([{"matchExpressions": ZONE_A * (MAX_TERM_REQUIREMENTS + 1)}],
     f"at most {MAX_TERM_REQUIREMENTS} per term"),
    ([{"matchExpressions": [_expr([str(i) for i in range(MAX_REQUIREMENT_VALUES + 1)])]}],
     f"at most {MAX_REQUIREMENT_VALUES} are evaluated"),
    ([{"matchExpressions": [_expr([str(i) for i in range(200)])] * 8}],
     f"more than {MAX_AFFINITY_ITEMS}"),
    ([{"matchExpressions": ZONE_A}] * 100_000, "100000 terms"),
])
def test_an_affinity_over_a_limit_is_named_with_its_limit(terms: list[Any], names: str) -> None:
    t = time.perf_counter()
    problem = affinity_problem(terms)
    assert time.perf_counter() - t < 0.05  # bounded by the limits, not by the list
    assert problem is not None and AFFINITY_FIELD in problem and names in problem


def test_an_affinity_within_the_limits_is_evaluated_as_before() -> None:
    terms = [{"matchExpressions": [_expr([str(i) for i in range(MAX_REQUIREMENT_VALUES)])]}]
    assert affinity_problem(terms) is None
    rec = pod_from_json(_with_terms(pod("p").gpu(1).build(), [
        {"matchExpressions": [_expr(["x", "a"])]}]))
    assert eligible(rec, node_from_json(node("n").gpus(8).label("zone", "a").build()))
    assert not eligible(rec, node_from_json(node("m").gpus(8).label("zone", "b").build()))


def test_malformed_requirements_match_nothing_and_never_raise() -> None:
    """What no API server accepts, but a filter request may carry: before, a term whose
    matchExpressions was an object raised AttributeError ('str' has no 'get') on every
    node, and an unhashable key a TypeError."""
    n = node_from_json(node("n").gpus(8).label("zone", "a").build())
    for terms in ([{"matchExpressions": {"key": "zone"}}],
                  [{"matchExpressions": ["zone"]}],
                  [{"matchExpressions": [{"key": ["zone"], "operator": "In",
                                          "values": ["a"]}]}],
                  [{"matchExpressions": [{"key": "zone", "operator": "In", "values": "a"}]}]):
        rec = PodRecord(namespace="d", name="p", uid="u", requests={}, labels={},
                        annotations={}, scheduler_name="lockstep",
                        required_affinity=tuple(terms))
        assert eligible(rec, n) is False


def test_a_gt_operand_of_thousands_of_digits_is_never_parsed() -> None:
    big = "9" * 5000
    labels = {"gpu-memory": big}
    assert match_expression({"key": "gpu-memory", "operator": "Gt", "values": ["1"]},
                            labels) is False
    assert match_expression({"key": "gpu-memory", "operator": "Lt", "values": [big]},
                            {"gpu-memory": "1"}) is False
    assert match_expression({"key": "gpu-memory", "operator": "Gt", "values": ["1"]},
                            {"gpu-memory": "80"}) is True


def test_a_gang_with_thousands_of_affinity_terms_is_unplaceable_with_the_field_named() -> None:
    """Before: every term was matched against every node the planner tried, 4,001 x 200
    here (2.5 s for a gang that does not fit; 5,000 nodes make it a minute), and the
    eligibility memo's key rendered the whole affinity once per member."""
    core = Coscheduler(Settings(backoff_seconds=10))
    for i in range(200):
        core.upsert(ingest.NODES, node_from_json(node(f"n{i}").gpus(8).label("zone", "a").build()))
    terms = [{"matchExpressions": [_expr(["b", "c"])]} for _ in range(4000)] + [
        {"matchExpressions": ZONE_A}]
    for i in range(4):  # 9 GPUs each: no 8-GPU node holds one, so every node is explained
        core.upsert_pod(pod_from_json(_with_terms(
            pod(f"g-{i}").gang("g", 4).gpu(9).build(), terms)))
    t = time.perf_counter()
    d = core.filter(core.queries.pods[pod_key("default", "g-0")], sorted(core.queries.nodes), 0.0)
    assert time.perf_counter() - t < 0.5
    assert d.passed == [] and isinstance(d.unresolvable, DoesNotFit)
    notes = " ".join(d.unresolvable.nofit.notes)
    assert AFFINITY_FIELD in notes and f"at most {MAX_AFFINITY_TERMS}" in notes


def test_a_gang_over_an_affinity_limit_tries_no_placement_and_searches_no_victims(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: its plan tried every domain of every level and then the whole cluster
    (nothing can place a member that is eligible nowhere), and its filter call began a
    victim search, a pass over every pod of the cluster, for evictions that cannot help
    it. Now the plan is the explanation at once, and preemption is not tried."""
    from coscheduling.placement import planner
    from coscheduling.preemption.inflight import PreemptorId

    core = Coscheduler(Settings(backoff_seconds=10))
    for i in range(8):
        core.upsert(ingest.NODES, node_from_json(node(f"n{i}").gpus(8).rack(f"r{i // 4}")
                                        .label("zone", "a").build()))
        low = pod(f"low-{i}").gpu(8).priority(1).on(f"n{i}").build()  # full of victims
        low["metadata"]["uid"] = f"uid-low-{i}"
        core.upsert_pod(pod_from_json(low))
    terms = [{"matchExpressions": ZONE_A}] * (MAX_AFFINITY_TERMS + 1)
    for i in range(2):
        core.upsert_pod(pod_from_json(_with_terms(
            pod(f"g-{i}").gang("g", 2).gpu(8).priority(100).build(), terms)))
    placed = []
    real = planner._place
    monkeypatch.setattr(planner, "_place", lambda ctx, ns: placed.append(1) or real(ctx, ns))
    d = core.filter(core.queries.pods[pod_key("default", "g-0")], sorted(core.queries.nodes), 0.0)
    assert d.passed == [] and isinstance(d.unresolvable, DoesNotFit)
    assert placed == []
    assert AFFINITY_FIELD in " ".join(d.unresolvable.nofit.notes)
    assert "no eviction can place default/g-0" in d.unresolvable.preemption
    assert f"at most {MAX_AFFINITY_TERMS}" in d.unresolvable.preemption
    assert state_of(core).preemption.inflight.searches == {} and core.drain().evictions == []
    assert state_of(core).preemption.inflight.get(
        PreemptorId.of_gang(gang_key("default", "g"))) is None
