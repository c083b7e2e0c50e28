"""Every number, list and string a user writes is parsed against an explicit limit before
any work: out of range, the gang is invalid with a reason naming the field and the
limit; never an exception, never work or memory that grows with the value.

Each convention gets the same hostile values: huge, negative, zero, non-numeric, 4,301+
digits (past Python's ``int()`` limit), other scripts' digits (which ``int()`` accepts),
floats, objects and lists where a scalar is expected, and very long strings.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.effects.status_writer import StatusWriter
from app.http.explain import explain_pod
from app.kube.cache import ClusterCache
from app.kube.client import KubeClient, KubeConfig
from app.process import extender_app
from app.render import render, render_notice
from app.service import Lockstep
from coscheduling import Coscheduler, Settings, node_from_json, pod_from_json, pod_key
from coscheduling.actions import NoticeKind
from coscheduling.conventions import resolve, scheduler_plugins, upstream, volcano
from coscheduling.conventions.base import Convention, StatusModel, StatusWrite
from coscheduling.conventions.koordinator import GROUPS, MAX_GROUP_GANGS
from coscheduling.conventions.scheduler_plugins import podgroup_from_json
from coscheduling.conventions.upstream import (
    resolve_upstream,
    upstream_podgroup_from_json,
    upstream_workload_from_json,
)
from coscheduling.conventions.volcano import volcano_podgroup_from_json, volcano_statuses
from coscheduling.conventions.volcano_queues import demand, queue_from_json
from coscheduling.events import ingest
from coscheduling.podgroup import (
    DEFAULT_MAX_GANG_SIZE,
    GangDefaults,
    GangSpec,
    InvalidGang,
    MissingPodGroup,
    Source,
    gang_key,
    int_field,
    seconds_field,
    shown,
)
from coscheduling.reasons import InvalidDeclaration
from coscheduling.records import RecordError, Toleration, priority_class_from_json
from coscheduling.records import pod_from_json as record_of
from coscheduling.resources import QuantityError, parse_quantity, resource_list
from coscheduling.topology.domains import DEFAULT_LEVELS
from tests.builders import node, pod, podgroup
from tests.fakeapi import Wire

DEFAULTS = GangDefaults(timeout_seconds=60, max_timeout_seconds=240)
LIMIT = f"above the limit of {DEFAULT_MAX_GANG_SIZE} (--max-gang-size)"
FAST = 0.05
"""Seconds any one hostile value may cost (well above what a bounded parse takes)."""
HUGE_DIGITS = "9" * 5000
ARABIC_THREE = "\u0663"  # '٣': int() reads it as 3; Kubernetes' ParseInt does not

SIZE_KEYS = [
    pytest.param({"lockstep.dev/pod-group": "g"}, "lockstep.dev/min-member", id="lockstep"),
    pytest.param({"scheduling.k8s.io/group-name": "g"}, "scheduling.volcano.sh/group-min-member",
                 id="volcano-pod"),
    pytest.param({"gang.scheduling.koordinator.sh/name": "g"},
                 "gang.scheduling.koordinator.sh/min-available", id="koordinator"),
    pytest.param({"kueue.x-k8s.io/pod-group-name": "g"}, "kueue.x-k8s.io/pod-group-total-count",
                 id="kueue"),
]
"""(annotations naming the gang, the size key) of every convention that sizes on the pod."""

BAD_SIZES = [
    pytest.param("10000000", LIMIT, id="ten-million"),
    pytest.param(str(2**31 - 1), LIMIT, id="int32-max"),
    pytest.param(str(2**63), LIMIT, id="beyond-int64"),
    pytest.param(HUGE_DIGITS, LIMIT, id="5000-digits"),
    pytest.param("0" * 40 + "7", "characters long, above the limit of 32", id="padded"),
    pytest.param("-3", "must be at least 1", id="negative"),
    pytest.param("-" + HUGE_DIGITS, "must be at least 1", id="negative-5000-digits"),
    pytest.param("0", "must be at least 1", id="zero"),
    pytest.param("three", "not a whole number", id="word"),
    pytest.param(ARABIC_THREE, "not a whole number", id="arabic-indic-digit"),
    pytest.param("\uff13", "not a whole number", id="fullwidth-digit"),
    pytest.param("2.5", "not a whole number", id="float"),
    pytest.param("1e3", "not a whole number", id="exponent"),
    pytest.param('{"n": 3}', "not a whole number", id="json-object"),
    pytest.param("[" * 50000, "not a whole number", id="deep-list-text"),
    pytest.param("x" * 200_000, "not a whole number", id="200k-characters"),
]


def timed(fn: Callable[[], Any]) -> Any:
    """``fn()``, asserting it took less than :data:`FAST`."""
    t0 = time.perf_counter()
    out = fn()
    took = time.perf_counter() - t0
    assert took < FAST, f"took {took * 1000:.1f} ms"
    return out


def gang_pod(annotations: dict[str, str], name: str = "p") -> dict[str, Any]:
    b = pod(name).gpu(1)
    for k, v in annotations.items():
        b.annotate(k, v)
    return b.build()


def invalid(got: object, fld: str, problem: str) -> InvalidGang:
    """``got`` is an InvalidGang naming ``fld`` with ``problem``, and its reason is short."""
    assert isinstance(got, InvalidGang), got
    assert got.field == fld and problem in got.problem, got
    assert len(render(InvalidDeclaration(got))) < 400
    return got


# ---------------------------------------------------------------------------- sizes on pods


@pytest.mark.parametrize(("declares", "size_key"), SIZE_KEYS)
@pytest.mark.parametrize(("value", "problem"), BAD_SIZES)
def test_a_bad_size_on_a_pod_is_invalid_naming_field_and_limit(
        declares: dict[str, str], size_key: str, value: str, problem: str) -> None:
    rec = timed(lambda: record_of(gang_pod({**declares, size_key: value})))
    invalid(timed(lambda: resolve(rec, {}, DEFAULTS)), size_key, problem)


@pytest.mark.parametrize(("declares", "size_key"), SIZE_KEYS)
def test_a_size_at_the_limit_is_a_gang(declares: dict[str, str], size_key: str) -> None:
    rec = record_of(gang_pod({**declares, size_key: str(DEFAULT_MAX_GANG_SIZE)}))
    got = resolve(rec, {}, DEFAULTS)
    assert isinstance(got, GangSpec) and got.min_member == DEFAULT_MAX_GANG_SIZE


def test_the_limit_is_the_settings() -> None:
    rec = record_of(gang_pod({"lockstep.dev/pod-group": "g", "lockstep.dev/min-member": "50"}))
    small = GangDefaults(max_gang_size=10)
    invalid(resolve(rec, {}, small), "lockstep.dev/min-member",
            "above the limit of 10 (--max-gang-size)")
    assert isinstance(resolve(rec, {}, GangDefaults(max_gang_size=50)), GangSpec)


def test_the_shown_value_is_cut_short() -> None:
    got = int_field("7" * 5000, "f", None, limit=10, limit_name="x")
    assert isinstance(got, InvalidGang)
    assert len(got.value) < 80 and "5000 characters" in got.value


@pytest.mark.parametrize("raw", [
    pytest.param(True, id="bool"), pytest.param(2.0, id="float"),
    pytest.param({"a": 1}, id="object"), pytest.param([1], id="list"),
    pytest.param(None, id="null"), pytest.param(10**5000, id="5000-digit-int"),
])
def test_int_field_takes_any_json_value(raw: object) -> None:
    got = timed(lambda: int_field(raw, "f", None))
    assert isinstance(got, InvalidGang)
    assert len(got.value) < 80


def test_a_gang_name_longer_than_an_object_name_is_invalid() -> None:
    rec = record_of(gang_pod({"lockstep.dev/pod-group": "g" * 300,
                              "lockstep.dev/min-member": "2"}))
    invalid(resolve(rec, {}, DEFAULTS), "lockstep.dev/pod-group",
            "above the limit of 253")


def test_conflicting_long_names_are_shown_short() -> None:
    rec = record_of(gang_pod({"lockstep.dev/pod-group": "a" * 100_000,
                              "scheduling.k8s.io/group-name": "b" * 100_000}))
    got = timed(lambda: resolve(rec, {}, DEFAULTS))
    assert isinstance(got, InvalidGang) and len(got.value) < 400


# ---------------------------------------------------------------------------- timeouts


@pytest.mark.parametrize("key", ["lockstep.dev/timeout-seconds",
                                 "gang.scheduling.koordinator.sh/waiting-time"])
@pytest.mark.parametrize(("value", "problem"), [
    pytest.param(HUGE_DIGITS, "above the limit of 2147483647 seconds", id="5000-digits"),
    pytest.param("9" * 30 + "h", "above the limit of 2147483647 seconds", id="huge-duration"),
    pytest.param("3000000000", "above the limit of 2147483647 seconds", id="beyond-int32"),
    pytest.param("0", "greater than 0", id="zero"),
    pytest.param("-5", "not a number of seconds", id="negative"),
    pytest.param(ARABIC_THREE + "s", "not a number of seconds", id="arabic-indic"),
    pytest.param("nan", "not a number of seconds", id="nan"),
    pytest.param("inf", "not a number of seconds", id="inf"),
    pytest.param("1s" * 100_000, "not a number of seconds", id="200k-characters"),
])
def test_a_bad_timeout_is_invalid(key: str, value: str, problem: str) -> None:
    size = ("lockstep.dev/min-member" if key.startswith("lockstep")
            else "gang.scheduling.koordinator.sh/min-available")
    name = ("lockstep.dev/pod-group" if key.startswith("lockstep")
            else "gang.scheduling.koordinator.sh/name")
    rec = record_of(gang_pod({name: "g", size: "2", key: value}))
    invalid(timed(lambda: resolve(rec, {}, DEFAULTS)), key, problem)


def test_a_long_timeout_within_the_limit_is_still_capped_and_reported() -> None:
    rec = record_of(gang_pod({"lockstep.dev/pod-group": "g", "lockstep.dev/min-member": "2",
                              "lockstep.dev/timeout-seconds": "86400"}))
    got = resolve(rec, {}, DEFAULTS)
    assert isinstance(got, GangSpec)
    assert (got.timeout_seconds, got.capped_from) == (240, 86400)


@pytest.mark.parametrize("raw", [10**5000, float("nan"), -1, {"s": 1}, [1], True], ids=shown)
def test_seconds_field_takes_any_json_value(raw: object) -> None:
    assert isinstance(timed(lambda: seconds_field(raw, "f", None)), InvalidGang)


# ---------------------------------------------------------------------------- PodGroup objects

HOSTILE_JSON = [
    pytest.param(10**7, LIMIT, id="ten-million"),
    pytest.param(2**31 - 1, LIMIT, id="int32-max"),
    pytest.param(2**31, "above the limit of 2147483647 (int32)", id="beyond-int32"),
    pytest.param(10**5000, "above the limit of 2147483647 (int32)", id="5000-digit-int"),
    pytest.param(HUGE_DIGITS, "above the limit of 2147483647 (int32)", id="5000-digit-text"),
    pytest.param(-1, "must be at least 1", id="negative"),
    pytest.param(0, "must be at least 1", id="zero"),
    pytest.param(2.5, "not a whole number", id="float"),
    pytest.param(ARABIC_THREE, "not a whole number", id="arabic-indic"),
    pytest.param({"n": 3}, "not a whole number", id="object"),
    pytest.param([[[[3]]]], "not a whole number", id="nested-list"),
    pytest.param("x" * 200_000, "not a whole number", id="200k-characters"),
]


@pytest.mark.parametrize(("parse", "fld", "declares"), [
    pytest.param(podgroup_from_json, "PodGroup.spec.minMember",
                 ("label", "scheduling.x-k8s.io/pod-group"), id="scheduler-plugins"),
    pytest.param(volcano_podgroup_from_json, "PodGroup (scheduling.volcano.sh).spec.minMember",
                 ("annotation", "scheduling.k8s.io/group-name"), id="volcano"),
])
@pytest.mark.parametrize(("value", "problem"), HOSTILE_JSON)
def test_a_bad_podgroup_size_is_invalid(parse: Callable[[dict[str, Any]], Any], fld: str,
                                        declares: tuple[str, str], value: object,
                                        problem: str) -> None:
    rec = timed(lambda: parse(podgroup("pg", value)))
    where, key = declares
    b = pod("p").gpu(1)
    (b.label if where == "label" else b.annotate)(key, "pg")
    member = record_of(b.build())
    both = {Source.SCHEDULER_PLUGINS: {rec.key: rec}, Source.VOLCANO: {rec.key: rec}}
    got = timed(lambda: resolve(member, both, DEFAULTS))
    invalid(got, fld, problem)


@pytest.mark.parametrize("spec", [
    pytest.param({"minMember": 2, "scheduleTimeoutSeconds": 10**40}, id="timeout-huge"),
    pytest.param({"minMember": 2, "scheduleTimeoutSeconds": HUGE_DIGITS}, id="timeout-digits"),
    pytest.param({"minMember": 2, "scheduleTimeoutSeconds": {"s": 1}}, id="timeout-object"),
    pytest.param({"minMember": 2, "minResources": {"cpu": "1e999999999"}}, id="exponent"),
    pytest.param({"minMember": 2, "minResources": {"cpu": HUGE_DIGITS}}, id="quantity-digits"),
    pytest.param({"minMember": 2, "minResources": {"cpu": ARABIC_THREE}}, id="quantity-arabic"),
    pytest.param({"minMember": 2, "minResources": [{"cpu": "1"}]}, id="resources-a-list"),
    pytest.param({"minMember": 2, "minResources": {f"r{i}": "1" for i in range(1000)}},
                 id="1000-resources"),
])
def test_every_podgroup_field_is_bounded(spec: dict[str, Any]) -> None:
    obj = podgroup("pg", 2)
    obj["spec"] = spec
    rec = timed(lambda: podgroup_from_json(obj))
    assert rec.error is not None and rec.error.field.startswith("PodGroup.spec.")
    assert len(render(InvalidDeclaration(rec.error))) < 400


@pytest.mark.parametrize("spec", ["a string", [1, 2], 7])
def test_a_podgroup_spec_that_is_not_an_object_is_invalid(spec: object) -> None:
    obj = podgroup("pg", 2)
    obj["spec"] = spec
    rec = podgroup_from_json(obj)
    assert rec.error is not None and rec.error.field == "PodGroup.spec"


@pytest.mark.parametrize(("fld", "value"), [
    pytest.param("queue", {"name": "q"}, id="queue-object"),
    pytest.param("queue", "q" * 1000, id="queue-long"),
    pytest.param("priorityClassName", ["high"], id="class-list"),
])
def test_volcano_podgroup_names_are_bounded(fld: str, value: object) -> None:
    obj = podgroup("pg", 2)
    obj["spec"][fld] = value
    rec = volcano_podgroup_from_json(obj)
    assert rec.error is not None and rec.error.field.endswith(f".spec.{fld}")


# ---------------------------------------------------------------------------- Koordinator


def koord(**options: str) -> Any:
    return record_of(gang_pod({"gang.scheduling.koordinator.sh/name": "g",
                               "gang.scheduling.koordinator.sh/min-available": "2",
                               **options}))


@pytest.mark.parametrize(("value", "problem"), [
    pytest.param("[" * 100_000, "characters long", id="deep-nesting-long"),
    pytest.param("[" * 5000 + "]" * 5000, "not a JSON list", id="deep-nesting"),
    pytest.param(str([f"default/g{i}" for i in range(MAX_GROUP_GANGS + 1)]).replace("'", '"'),
                 f"above the limit of {MAX_GROUP_GANGS}", id="too-many-gangs"),
    pytest.param('["default/g", "default/' + "x" * 300 + '"]', "is not", id="long-name"),
    pytest.param('{"a": 1}', "not a JSON list", id="object"),
])
def test_koordinator_groups_are_bounded(value: str, problem: str) -> None:
    got = timed(lambda: resolve(koord(**{GROUPS: value}), {}, DEFAULTS))
    invalid(got, GROUPS, problem)


@pytest.mark.parametrize(("value", "problem"), [
    pytest.param("10000000", LIMIT, id="ten-million"),
    pytest.param(HUGE_DIGITS, "above the limit of 2147483647 (int32)", id="5000-digits"),
    pytest.param(ARABIC_THREE, "not a whole number", id="arabic-indic"),
])
def test_koordinator_total_number_is_bounded(value: str, problem: str) -> None:
    got = timed(lambda: resolve(koord(**{"gang.scheduling.koordinator.sh/total-number": value}),
                                {}, DEFAULTS))
    invalid(got, "gang.scheduling.koordinator.sh/total-number", problem)


@pytest.mark.parametrize("key", ["gang.scheduling.koordinator.sh/mode",
                                 "gang.scheduling.koordinator.sh/match-policy"])
def test_koordinator_options_shown_short(key: str) -> None:
    got = resolve(koord(**{key: "z" * 100_000}), {}, DEFAULTS)
    assert isinstance(got, InvalidGang) and len(got.value) < 80


# ---------------------------------------------------------------------------- upstream


def upstream_pg(min_count: object = 4, **spec: object) -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
            "metadata": {"name": "train", "namespace": "default", "generation": 1},
            "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}, **spec}}


def upstream_member() -> Any:
    obj = pod("w0").gpu(1).build()
    obj["spec"]["schedulingGroup"] = {"podGroupName": "train"}
    return record_of(obj)


UP = "PodGroup (scheduling.k8s.io/v1beta1).spec"


@pytest.mark.parametrize(("value", "problem"), [
    p for p in HOSTILE_JSON
    if p.id not in ("5000-digit-text", "arabic-indic", "200k-characters")  # text: its own case
] + [pytest.param("5", "not a whole number", id="text")])
def test_upstream_min_count_is_bounded(value: object, problem: str) -> None:
    rec = timed(lambda: upstream_podgroup_from_json(upstream_pg(value), "v1beta1"))
    got = timed(lambda: resolve_upstream(upstream_member(), {rec.key: rec}, {}, DEFAULTS,
                                         DEFAULT_LEVELS))
    invalid(got, f"{UP}.schedulingPolicy.gang.minCount", problem)


@pytest.mark.parametrize(("spec", "fld", "problem"), [
    pytest.param({"priority": 2**31}, "priority", "int32", id="priority-beyond-int32"),
    pytest.param({"priority": -(2**31) - 1}, "priority", "int32", id="priority-below-int32"),
    pytest.param({"priority": 10**5000}, "priority", "int32", id="priority-5000-digits"),
    pytest.param({"priority": "high"}, "priority", "not a whole number", id="priority-text"),
    pytest.param({"priorityClassName": {"n": 1}}, "priorityClassName", "not a PriorityClass",
                 id="class-object"),
    pytest.param({"schedulingConstraints": {"topology": [{"key": "k" * 10_000}]}},
                 "schedulingConstraints.topology[0].key", "above the limit of 317",
                 id="topology-key-long"),
    pytest.param({"schedulingConstraints": {"topology": [{"key": "a"}] * 10_000}},
                 "schedulingConstraints.topology", "exactly one", id="topology-list-long"),
])
def test_upstream_fields_are_bounded(spec: dict[str, Any], fld: str, problem: str) -> None:
    rec = timed(lambda: upstream_podgroup_from_json(upstream_pg(4, **spec), "v1beta1"))
    assert rec.error is not None
    invalid(rec.error, f"{UP}.{fld}", problem)


def test_upstream_workload_groups_are_bounded() -> None:
    obj = {"metadata": {"name": "job", "namespace": "default"},
           "spec": {"podGroups": [{"name": f"g{i}", "policy": {"gang": {"minCount": 2}}}
                                  for i in range(100_000)]
                    + [{"name": {"x": 1}, "policy": {}}, {"name": "n" * 1000}]}}
    wl = timed(lambda: upstream_workload_from_json(obj, "v1alpha1"))
    assert 0 < len(wl.groups) <= 64


# ---------------------------------------------------------------------------- records


@pytest.mark.parametrize("priority", [2**31, -(2**31) - 1, 10**5000, "5", 1.5, {"v": 1}],
                         ids=shown)
def test_a_pod_priority_outside_int32_is_refused(priority: object) -> None:
    obj = pod("p").build()
    obj["spec"]["priority"] = priority
    with pytest.raises(RecordError, match="int32"):
        timed(lambda: record_of(obj))


def test_a_pod_priority_at_the_edges_is_kept() -> None:
    for value in (2**31 - 1, -(2**31), 1_000_000_000):
        obj = pod("p").build()
        obj["spec"]["priority"] = value
        assert record_of(obj).priority == value


@pytest.mark.parametrize("value", [2**31, 10**5000, "1000", None], ids=shown)
def test_a_priority_class_value_outside_int32_is_refused(value: object) -> None:
    with pytest.raises(RecordError):
        priority_class_from_json({"metadata": {"name": "c"}, "value": value})


@pytest.mark.parametrize("quantity", [
    "1e999999999", "1E999999999", HUGE_DIGITS, "9" * 30 + "Ei", "9e18", 10**5000, 1e308,
    ARABIC_THREE, "\uff13Gi", "NaN", "-Infinity", [1], {"v": 1},
], ids=shown)
def test_a_hostile_quantity_is_refused_fast(quantity: object) -> None:
    with pytest.raises(QuantityError):
        timed(lambda: parse_quantity(quantity, milli=True))


def test_quantities_kubernetes_writes_still_parse() -> None:
    assert parse_quantity("500m", milli=True) == 500
    assert parse_quantity("2Ti") == 2 * 2**40
    assert parse_quantity("1e3") == 1000
    assert parse_quantity(str(2**62)) == 2**62
    assert resource_list({"nvidia.com/gpu": "8", "cpu": "64"}) == {"nvidia.com/gpu": 8,
                                                                   "cpu": 64000}


def test_a_pod_with_a_hostile_request_is_refused_by_its_parse() -> None:
    obj = pod("p").build()
    obj["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1e999999999"}}
    with pytest.raises(QuantityError):
        timed(lambda: record_of(obj))


# ---------------------------------------------------------------------------- Volcano queues


def test_demand_is_constant_in_min_member() -> None:
    one = {"nvidia.com/gpu": 1, "cpu": 1000}
    got = timed(lambda: demand({}, 2**31 - 1, [one]))
    assert got == {"nvidia.com/gpu": 2**31 - 1, "cpu": 1000 * (2**31 - 1)}
    assert timed(lambda: demand({}, 2**31 - 1, [])) == {}
    assert demand({}, 3, [one, {"nvidia.com/gpu": 2}]) == {"nvidia.com/gpu": 5, "cpu": 1000}


def test_volcano_enqueue_of_a_huge_group_with_no_pods_is_quick() -> None:
    rec = volcano_podgroup_from_json(podgroup("pg", 2**31 - 1))
    model = StatusModel(objects={Source.VOLCANO: {rec.key: rec}}, queues={},
                        free={"nvidia.com/gpu": 8})
    got = timed(lambda: volcano_statuses(model))
    assert got[rec.key].phase in ("Pending", "Inqueue")


def test_a_queue_with_a_hostile_capability_is_refused() -> None:
    obj = {"metadata": {"name": "q"}, "spec": {"capability": {"cpu": "1e999999999"}},
           "status": {"state": {"deep": [1]}}}
    with pytest.raises(QuantityError):
        timed(lambda: queue_from_json(obj))
    obj["spec"] = {"capability": {"cpu": "4"}}
    assert queue_from_json(obj).state == ""


# ---------------------------------------------------------------------------- in the core


def core_with_node(max_gang_size: int = DEFAULT_MAX_GANG_SIZE) -> Coscheduler:
    core = Coscheduler(Settings(defaults=GangDefaults(max_gang_size=max_gang_size)))
    core.upsert(ingest.NODES, node_from_json(node("n0").gpus(8).build()))
    return core


def test_a_huge_gang_in_the_core_is_invalid_and_says_why_everywhere() -> None:
    """The reason reaches the Event (a notice), ``lockstep explain`` and /debug/gangs."""
    core = core_with_node()
    p = gang_pod({"lockstep.dev/pod-group": "g", "lockstep.dev/min-member": str(2**31 - 1)})
    timed(lambda: core.upsert_pod(pod_from_json(p)))
    key = pod_key("default", "p")
    invalid(core.queries.membership(key), "lockstep.dev/min-member", LIMIT)
    notices = [n for n in core.drain().notices if n.kind is NoticeKind.INVALID]
    assert notices and LIMIT in render_notice(notices[0])
    service = Lockstep(core, KubeClient(KubeConfig("http://api.test"),
                                        connect=Wire(lambda _: httpx.Response(201, json={}))))
    assert LIMIT in explain_pod(service, key)["explanation"]


async def test_debug_gangs_shows_the_limit() -> None:
    core = core_with_node()
    core.upsert_pod(pod_from_json(gang_pod({"lockstep.dev/pod-group": "g",
                                            "lockstep.dev/min-member": "10000000"})))
    service = Lockstep(core, KubeClient(KubeConfig("http://api.test"),
                                        connect=Wire(lambda _: httpx.Response(201, json={}))))
    app = extender_app(service, ui=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=("127.0.0.1", 1)),
                                 base_url="http://lockstep.test") as c:
        gangs = (await c.get("/debug/gangs")).json()["gangs"]
        explained = (await c.get("/debug/pods/default/p")).json()
    assert any(LIMIT in (g["reason"] or "") for g in gangs), gangs
    assert LIMIT in explained["explanation"]


def test_a_volcano_group_over_the_limit_says_so_in_its_condition() -> None:
    core = core_with_node(max_gang_size=100)
    core.upsert(ingest.VOLCANO_PODGROUPS, volcano_podgroup_from_json(podgroup("pg", 5000)))
    b = pod("m").gpu(1).annotate("scheduling.k8s.io/group-name", "pg")
    core.upsert_pod(pod_from_json(b.build()))
    status = volcano_statuses(core.queries.status_model())[gang_key("default", "pg")]
    assert status.waiting is not None
    assert "above the limit of 100 (--max-gang-size)" in render(status.waiting)
    invalid(core.queries.membership(pod_key("default", "m")),
            "PodGroup (scheduling.volcano.sh).spec.minMember", "above the limit of 100")


def test_a_scheduler_plugins_group_over_the_limit_is_invalid_for_its_members() -> None:
    core = core_with_node(max_gang_size=100)
    core.upsert(ingest.SP_PODGROUPS, podgroup_from_json(podgroup("pg", 101)))
    core.upsert_pod(pod_from_json(pod("m").gpu(1).label("scheduling.x-k8s.io/pod-group", "pg")
                                  .build()))
    invalid(core.queries.membership(pod_key("default", "m")), "PodGroup.spec.minMember",
            "above the limit of 100 (--max-gang-size)")
    core.upsert(ingest.SP_PODGROUPS, podgroup_from_json(podgroup("pg", 100)))
    m = core.queries.membership(pod_key("default", "m"))
    assert not isinstance(m, InvalidGang | MissingPodGroup)


# ---------------------------------------------------------------------------- the watch


def cache_for(core: Coscheduler) -> ClusterCache:
    return ClusterCache(core, KubeClient(KubeConfig("http://api.test"),
                                         connect=Wire(lambda _: httpx.Response(404))))


def test_the_5000_digit_pod_through_the_watch() -> None:
    """The issue's pod: it used to raise out of the pod watch task (Lockstep exited)."""
    core = core_with_node()
    cache = cache_for(core)
    obj = gang_pod({"lockstep.dev/pod-group": "g", "lockstep.dev/min-member": HUGE_DIGITS})
    timed(lambda: cache._apply("pods", "ADDED", obj))
    invalid(core.queries.membership(pod_key("default", "p")), "lockstep.dev/min-member", LIMIT)
    assert cache.resources["pods"].failed == 0


def test_an_error_ingesting_one_object_is_logged_counted_and_skipped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    core = core_with_node()
    cache = cache_for(core)
    real = core.upsert

    def upsert(kind: Any, rec: Any) -> None:
        if getattr(rec, "name", "") == "bad":
            raise RuntimeError("a bug set off by one object")
        real(kind, rec)

    monkeypatch.setattr(core, "upsert", upsert)
    cache._apply("pods", "ADDED", pod("bad").build())
    cache._apply("pods", "ADDED", pod("good").build())
    assert cache.resources["pods"].failed == 1
    assert pod_key("default", "good") in core.queries.pods
    assert pod_key("default", "bad") not in core.queries.pods


def test_an_error_in_a_relist_applies_the_rest_one_by_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    core = core_with_node()
    cache = cache_for(core)
    real = core.upsert

    def replace(kind: Any, records: Any) -> None:
        raise RuntimeError("a bug in the relist")

    def upsert(kind: Any, rec: Any) -> None:
        if rec.name == "bad":
            raise RuntimeError("a bug set off by one object")
        real(kind, rec)

    monkeypatch.setattr(core, "replace", replace)
    monkeypatch.setattr(core, "upsert", upsert)
    recs = [record_of(pod(n).build()) for n in ("a", "bad", "b")]
    cache._apply_all("pods", recs)
    assert {pod_key("default", "a"), pod_key("default", "b")} <= set(core.queries.pods)
    assert cache.resources["pods"].failed == 2


def test_a_parser_that_raises_anything_skips_the_object(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    core = core_with_node()
    cache = cache_for(core)

    def boom(obj: Any, version: str) -> Any:
        raise KeyError("a parser bug")

    monkeypatch.setattr(cache.resources["pods"], "parse", boom)
    cache._apply("pods", "ADDED", pod("p").build())
    assert cache.resources["pods"].failed == 1


# ---------------------------------------------------------------------------- the webhook


def review(obj: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "namespace": "default", "operation": "CREATE", "object": obj, "dryRun": False}}


@pytest.mark.parametrize(("declares", "size_key"), SIZE_KEYS)
@pytest.mark.parametrize("value", [HUGE_DIGITS, "10000000", str(2**31 - 1), ARABIC_THREE],
                         ids=["5000-digits", "ten-million", "int32-max", "arabic-indic"])
async def test_the_webhook_answers_200_for_a_hostile_size(
        declares: dict[str, str], size_key: str, value: str) -> None:
    from app.http.webhook import create_webhook_app

    core = core_with_node()
    service = Lockstep(core, KubeClient(KubeConfig("http://api.test"),
                                        connect=Wire(lambda _: httpx.Response(404))))
    for res in service.cache.resources.values():
        res.synced = True
    obj = gang_pod({**declares, size_key: value})
    obj["spec"]["schedulerName"] = "lockstep"
    transport = httpx.ASGITransport(app=create_webhook_app(service))
    async with httpx.AsyncClient(transport=transport, base_url="https://lockstep.test") as c:
        t0 = time.perf_counter()
        r = await c.post("/mutate/pods", json=review(obj))
        assert time.perf_counter() - t0 < 1.0
    assert r.status_code == 200, r.text
    assert r.json()["response"]["allowed"] is True


# ---------------------------------------------------------------------------- the flag


def test_max_gang_size_flag_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from app import cli

    assert cli.MAX_GANG_SIZE == DEFAULT_MAX_GANG_SIZE
    parser = cli.argparse.ArgumentParser()
    cli._serve_parser(parser.add_subparsers())
    assert parser.parse_args(["serve"]).max_gang_size == DEFAULT_MAX_GANG_SIZE
    assert parser.parse_args(["serve", "--max-gang-size", "64"]).max_gang_size == 64
    monkeypatch.setenv("LOCKSTEP_MAX_GANG_SIZE", "5000")
    parser = cli.argparse.ArgumentParser()
    cli._serve_parser(parser.add_subparsers())
    assert parser.parse_args(["serve"]).max_gang_size == 5000


@pytest.mark.parametrize("value", ["0", "-1", str(2**31)])
def test_max_gang_size_out_of_range_stops_lockstep(value: str) -> None:
    from app import cli

    assert cli.main(["serve", "--max-gang-size", value]) == 2


# ---------------------------------------------------------------------------- group conditions


class Recorder:
    """The API server's side of status writes: every request's path and JSON body."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.writes.append((request.url.path, json.loads(request.content or b"null")))
        return httpx.Response(200, json={})


async def test_an_upstream_group_over_the_limit_gets_a_scheduler_error_condition() -> None:
    core = core_with_node(max_gang_size=100)
    core.upsert(ingest.UPSTREAM_PODGROUPS,
                upstream_podgroup_from_json(upstream_pg(500), "v1beta1"))
    core.upsert_pod(upstream_member())
    invalid(core.queries.membership(pod_key("default", "w0")),
            f"{UP}.schedulingPolicy.gang.minCount", "above the limit of 100 (--max-gang-size)")
    api = Recorder()
    writer = StatusWriter(core, KubeClient(KubeConfig("http://api.test"), connect=Wire(api)))
    await writer.write(status_of(upstream.CONVENTION), core.queries.status_model())
    [(path, body)] = api.writes
    assert path.endswith("/podgroups/train/status")
    [cond] = body["status"]["conditions"]
    assert (cond["status"], cond["reason"]) == ("False", "SchedulerError")
    assert "above the limit of 100 (--max-gang-size)" in cond["message"]


async def test_a_scheduler_plugins_group_over_the_limit_gets_a_gang_invalid_condition() -> None:
    core = core_with_node(max_gang_size=100)
    core.upsert(ingest.SP_PODGROUPS, podgroup_from_json(podgroup("pg", 101)))
    api = Recorder()
    writer = StatusWriter(core, KubeClient(KubeConfig("http://api.test"), connect=Wire(api)))
    await writer.write(status_of(scheduler_plugins.CONVENTION), core.queries.status_model())
    [(path, body)] = api.writes
    assert path.endswith("/podgroups/pg/status")
    assert body["status"]["phase"] == "Pending"
    [cond] = body["status"]["conditions"]
    assert (cond["type"], cond["status"]) == ("GangInvalid", "True")
    assert "PodGroup.spec.minMember" in cond["message"]
    assert "above the limit of 100 (--max-gang-size)" in cond["message"]
    await writer.write(status_of(scheduler_plugins.CONVENTION), core.queries.status_model())
    assert len(api.writes) == 1  # written once, not every pass


async def test_a_volcano_and_a_scheduler_plugins_group_of_one_name_are_each_written_once() -> None:
    """Both conventions' PodGroups named default/pg: each status is written once, not on
    every pass (before: one record of what was written per name, so each pass saw the other
    convention's status there and wrote both again)."""
    core = core_with_node(max_gang_size=100)
    core.upsert(ingest.SP_PODGROUPS, podgroup_from_json(podgroup("pg", 101)))
    core.upsert(ingest.VOLCANO_PODGROUPS, volcano_podgroup_from_json(podgroup("pg", 2)))
    api = Recorder()
    writer = StatusWriter(core, KubeClient(KubeConfig("http://api.test"), connect=Wire(api)))
    for _ in range(3):
        await writer.write(status_of(volcano.CONVENTION), core.queries.status_model())
        await writer.write(status_of(scheduler_plugins.CONVENTION), core.queries.status_model())
    paths = sorted(path for path, _ in api.writes)
    assert len(paths) == 2 and paths[0] != paths[1], paths
    assert all(p.endswith("/namespaces/default/podgroups/pg/status") for p in paths)


async def test_a_status_pass_that_raises_is_logged_and_the_writer_goes_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The status writer is one of the service's loops: had it raised, Lockstep would stop.
    One convention's pass raising leaves the others written, pass after pass."""
    import asyncio
    from types import SimpleNamespace

    from app.effects import status_writer

    writer = StatusWriter(core_with_node(), KubeClient(KubeConfig("http://api.test"),
                                                       connect=Wire(Recorder())))
    calls: list[str] = []

    async def write(how: StatusWrite, _: StatusModel) -> None:
        calls.append(how.group)
        if how is volcano.CONVENTION.status:
            raise RuntimeError("a bug in one status")

    passes = 0

    async def sleep(_: float) -> None:
        nonlocal passes
        passes += 1
        if passes > 2:
            raise asyncio.CancelledError

    monkeypatch.setattr(writer, "write", write)
    monkeypatch.setattr(status_writer, "asyncio", SimpleNamespace(sleep=sleep))
    with pytest.raises(asyncio.CancelledError):
        await writer.run()
    groups = ["scheduling.x-k8s.io", "scheduling.volcano.sh", "scheduling.k8s.io"]
    assert calls == groups * 2
    assert writer.failed == 2


def status_of(conv: Convention) -> StatusWrite:
    assert conv.status is not None
    return conv.status


# ---------------------------------------------------------------------------- any JSON at all

WRONG: list[object] = ["text", 7, 10**5000, 2.5, True, None, [1, [2]], {"k": {"k": 1}}]
DEEP: object = []
for _ in range(5000):
    DEEP = [DEEP]
WRONG.append(DEEP)
POD_PATHS = [
    ("metadata",), ("metadata", "labels"), ("metadata", "annotations"),
    ("metadata", "annotations", "lockstep.dev/min-member"), ("metadata", "resourceVersion"),
    ("spec",), ("spec", "containers"), ("spec", "containers", 0),
    ("spec", "containers", 0, "resources"), ("spec", "containers", 0, "resources", "requests"),
    ("spec", "containers", 0, "resources", "requests", "cpu"), ("spec", "affinity"),
    ("spec", "tolerations"), ("spec", "schedulingGates"), ("spec", "priority"),
    ("spec", "nodeSelector"), ("spec", "schedulingGroup"), ("spec", "workloadRef"),
    ("spec", "overhead"), ("spec", "initContainers"), ("status",), ("status", "conditions"),
    ("status", "startTime"), ("spec", "terminationGracePeriodSeconds"),
]


def put(obj: dict[str, Any], path: tuple[Any, ...], value: object) -> None:
    for step in path[:-1]:
        obj = obj[step]
    obj[path[-1]] = value


@pytest.mark.parametrize("path", POD_PATHS, ids=lambda p: ".".join(map(str, p)))
def test_a_pod_with_any_json_in_any_field_is_read_or_refused(path: tuple[Any, ...]) -> None:
    """A record, or RecordError / QuantityError (which every caller handles): never another
    exception, and never slow."""
    core = core_with_node()
    for value in WRONG:
        obj = gang_pod({"lockstep.dev/pod-group": "g", "lockstep.dev/min-member": "2"})
        obj["spec"]["tolerations"] = [{"key": "k", "operator": "Exists"}]
        put(obj, path, value)
        try:
            rec = timed(lambda o=obj: record_of(o))  # type: ignore[misc]
        except (RecordError, QuantityError):
            continue
        timed(lambda r=rec: core.upsert_pod(r))  # type: ignore[misc]


GROUP_PATHS = [
    ("metadata",), ("metadata", "annotations"), ("spec",), ("spec", "minMember"),
    ("spec", "scheduleTimeoutSeconds"), ("spec", "minResources"), ("spec", "queue"),
    ("spec", "priorityClassName"), ("status",), ("status", "phase"),
]


@pytest.mark.parametrize("path", GROUP_PATHS, ids=lambda p: ".".join(map(str, p)))
@pytest.mark.parametrize("parse", [podgroup_from_json, volcano_podgroup_from_json],
                         ids=["scheduler-plugins", "volcano"])
def test_a_podgroup_with_any_json_in_any_field_is_read(
        path: tuple[Any, ...], parse: Callable[[dict[str, Any]], Any]) -> None:
    """A PodGroup object is always a record (its error naming a bad field), never an
    exception: a CRD without a schema lets a user write anything anywhere."""
    for value in WRONG:
        obj = podgroup("pg", 2)
        obj["status"] = {"phase": "Pending"}
        put(obj, path, value)
        rec = timed(lambda o=obj: parse(o))  # type: ignore[misc]
        if rec.error is not None:
            assert len(render(InvalidDeclaration(rec.error))) < 400


UPSTREAM_PATHS = [
    ("spec",), ("spec", "schedulingPolicy"), ("spec", "schedulingPolicy", "gang"),
    ("spec", "schedulingPolicy", "gang", "minCount"), ("spec", "schedulingConstraints"),
    ("spec", "priority"), ("spec", "priorityClassName"), ("spec", "preemptionPolicy"),
    ("spec", "parentCompositePodGroupName"),
]


@pytest.mark.parametrize("path", UPSTREAM_PATHS, ids=lambda p: ".".join(map(str, p)))
def test_an_upstream_podgroup_with_any_json_in_any_field_is_read(path: tuple[Any, ...]
                                                                 ) -> None:
    for value in WRONG:
        obj = upstream_pg(4)
        put(obj, path, value)
        rec = timed(lambda o=obj: upstream_podgroup_from_json(o, "v1beta1"))  # type: ignore[misc]
        if rec.error is not None:
            assert len(render(InvalidDeclaration(rec.error))) < 400


# ---------------------------------------------------------------------------- tolerations

KEYS = st.sampled_from([None, "", "a", "b"])
TOLERATIONS = st.lists(st.builds(
    Toleration, key=KEYS, operator=st.sampled_from(["Exists", "Equal", "Other"]),
    value=st.sampled_from([None, "", "x", "y"]),
    effect=st.sampled_from([None, "", "NoSchedule", "NoExecute"])), max_size=6)
TAINTS = st.lists(st.fixed_dictionaries({}, optional={
    "key": KEYS, "value": st.sampled_from(["", "x", "y"]),
    "effect": st.sampled_from(["NoSchedule", "NoExecute"])}), max_size=3)


@settings(max_examples=400, deadline=None)
@given(tolerations=TOLERATIONS, taints=TAINTS)
def test_tolerations_by_index_decide_as_one_by_one(tolerations: list[Toleration],
                                                   taints: list[dict[str, Any]]) -> None:
    p = record_of(pod("p").build())
    p.tolerations = tuple(tolerations)
    p.__post_init__()
    want = all(any(t.tolerates(taint) for t in tolerations) for taint in taints)
    assert p.tolerates_all(tuple(taints)) is want


def test_a_hundred_thousand_tolerations_cost_nothing_per_node() -> None:
    obj = pod("p").build()
    obj["spec"]["tolerations"] = [{"key": "k", "operator": "Equal", "value": f"v{i}",
                                   "effect": "NoSchedule"} for i in range(100_000)]
    p = record_of(obj)
    taints = ({"key": "k", "value": "other", "effect": "NoSchedule"},)
    t0 = time.perf_counter()
    for _ in range(5000):  # every node of a 5,000-node cluster
        assert not p.tolerates_all(taints)
    assert time.perf_counter() - t0 < 0.5
    assert p.tolerates_all(({"key": "k", "value": "v99999", "effect": "NoSchedule"},))


def test_a_pod_asking_for_too_many_kinds_of_resource_is_refused() -> None:
    """fits() walks a pod's requests on every node: their number is bounded."""
    obj = pod("p").build()
    obj["spec"]["containers"] = [
        {"name": f"c{i}", "image": "i", "resources": {"requests": {
            f"example.com/r{i}-{j}": "1" for j in range(100)}}} for i in range(10)]
    with pytest.raises(QuantityError, match="more than 128 resources"):
        timed(lambda: record_of(obj))


def test_relisting_a_group_stored_as_too_large_resolves_nothing_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Stored with its error, it differs from the listed record: without care every relist
    would re-resolve every pod for every such group."""
    core = core_with_node(max_gang_size=100)
    rec = podgroup_from_json(podgroup("pg", 500))
    core.upsert(ingest.SP_PODGROUPS, rec)
    calls: list[object] = []
    monkeypatch.setattr(ingest, "_reresolve", lambda st, key: calls.append(key))
    core.replace(ingest.SP_PODGROUPS, [rec])
    assert calls == []
    core.upsert(ingest.SP_PODGROUPS, podgroup_from_json(podgroup("pg", 50)))
    assert calls == [rec.key]


async def test_an_undecodable_watch_line_relists_and_the_task_goes_on() -> None:
    """JSON nested deeper than the decoder goes (a CRD field that keeps unknown fields can
    hold it) raised out of the watch task, which stopped the service."""
    import asyncio

    deep = b"[" * 2000 + b"]" * 2000
    lists = [{"metadata": {"resourceVersion": "1"}, "items": []},
             {"metadata": {"resourceVersion": "3"}, "items": [pod("after").build()]}]

    def api(request: httpx.Request) -> httpx.Response:
        if request.url.params.get("watch"):
            if len(lists) == 1:  # the first watch: one undecodable line
                return httpx.Response(200, content=b'{"type": "ADDED", "object": ' + deep
                                      + b"}\n")
            return httpx.Response(200, content=b"")
        return httpx.Response(200, json=lists.pop(0))

    core = core_with_node()
    cache = ClusterCache(core, KubeClient(KubeConfig("http://api.test"), connect=Wire(api)))
    task = asyncio.create_task(cache.run("pods"))
    try:
        for _ in range(300):
            if pod_key("default", "after") in core.queries.pods:
                break
            await asyncio.sleep(0.01)
        assert pod_key("default", "after") in core.queries.pods
        assert not task.done()
        assert cache.resources["pods"].failed == 1
    finally:
        task.cancel()


async def test_the_crd_watch_survives_an_undecodable_line() -> None:
    import asyncio

    asked: list[str] = []

    def api(request: httpx.Request) -> httpx.Response:
        asked.append("watch" if request.url.params.get("watch") else "list")
        if request.url.params.get("watch"):
            if asked.count("watch") == 1:
                return httpx.Response(200, content=b'{"type": "ADDED", "object": '
                                      + b"[" * 2000 + b"]" * 2000 + b"}\n")
            return httpx.Response(200, content=b"")
        return httpx.Response(200, json={"metadata": {"resourceVersion": "5"}, "items": []})

    cache = cache_for(core_with_node())
    cache.kube = KubeClient(KubeConfig("http://api.test"), connect=Wire(api))
    task = asyncio.create_task(cache.watch_crds())
    try:
        for _ in range(300):
            if asked.count("list") >= 2:
                break
            await asyncio.sleep(0.01)
        assert asked.count("list") >= 2  # listed again after the bad line
        assert not task.done()
    finally:
        task.cancel()


def test_objects_the_cache_skipped_are_a_metric() -> None:
    from prometheus_client import generate_latest

    service = Lockstep(core_with_node(), KubeClient(
        KubeConfig("http://api.test"), connect=Wire(lambda _: httpx.Response(404))))
    service.cache.resources["pods"].failed = 3
    text = generate_latest(service.metrics.registry).decode()
    assert 'lockstep_cache_objects_failed_total{resource="pods"} 3.0' in text
