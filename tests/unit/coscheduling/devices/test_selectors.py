"""CEL selectors are bounded by what they cost, not by their text: tokens before
the parse, macros and an estimated worst case on the parse tree, steps while they run, and
caches bounded by memory and keyed by what a selector can read of a device."""

from __future__ import annotations

import gc
import time
import tracemalloc
from typing import Any

import pytest

from coscheduling.devices import selectors as sel
from coscheduling.devices.demand import pod_demand
from coscheduling.devices.inventory import DeviceInventory
from coscheduling.devices.model import Device
from coscheduling.devices.selectors import Selectors
from coscheduling.devices.wire import class_from_json, template_from_json
from coscheduling.records import PodRecord, pod_from_json
from tests.builders import pod

DRIVER = "gpu.nvidia.com"
GPU = Device(DRIVER, "n0", "gpu-0", ((DRIVER, "productName", "H100"),),
             ((DRIVER, "memory", 80 * 2**30 * 1000),))


def literal_list(n: int) -> str:
    return "[" + ",".join(str(i) for i in range(n)) + "]"


def nested_all(n: int) -> str:
    """The stall once found: three nested ``all`` over a literal list of ``n`` items (149
    characters at 15 items: about 2.6 s for one device on the old code)."""
    xs = literal_list(n)
    return f"{xs}.all(x, {xs}.all(y, {xs}.all(z, x + y + z >= 0)))"


def demand_reason(expression: str) -> str:
    inv = DeviceInventory()
    inv.put_class(class_from_json({"metadata": {"name": "gpu.nvidia.com"}, "spec": {
        "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}}))
    inv.put_template(template_from_json({
        "metadata": {"name": "t", "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com",
            "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}},
                          {"cel": {"expression": expression}}]}}]}}}}))
    p: dict[str, Any] = pod("p").build()
    p["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "t"}]
    rec: PodRecord = pod_from_json(p)
    got = pod_demand(inv, rec)
    assert isinstance(got, str), got
    return got


FIELD = "ResourceClaimTemplate default/t: spec.devices.requests[0].exactly.selectors[1]" \
    ".cel.expression: "


# ------------------------------------------------------------------ the stall


def test_nested_macros_over_literal_lists_are_refused_by_their_estimated_cost() -> None:
    e = nested_all(15)
    assert len(e) == 149
    s = Selectors()
    t = time.perf_counter()
    assert not s.matches(e, GPU)
    assert time.perf_counter() - t < 0.5  # 2.6 s measured on the old code
    why = s.program(e)
    assert isinstance(why, str) and "estimated cost" in why and "at most 10000" in why
    assert demand_reason(e).startswith(FIELD + "estimated cost ")


def test_a_small_nested_macro_still_runs() -> None:
    s = Selectors()
    assert not isinstance(s.program(nested_all(3)), str)
    assert s.matches(nested_all(3), GPU)


# ------------------------------------------------------ comments hid macros


def test_macros_are_counted_on_the_parse_tree_a_comment_hides_none() -> None:
    e = "true"
    for v in "abcde":  # five nested macros, each written `.all//c\n(`
        e = f"[1].all//c\n({v}, {e})"
    why = Selectors().program(e)
    assert why == "5 comprehension macros, at most 4"
    assert demand_reason(e) == FIELD + "5 comprehension macros, at most 4"


def test_a_comment_costs_nothing() -> None:
    e = f'device.driver == "{DRIVER}" // ' + "x" * 9000
    assert Selectors().matches(e, GPU)


# --------------------------------------------- a 10 KiB parse on the loop


@pytest.mark.parametrize("expression", [
    "[" + ",".join("1" for _ in range(5110)) + "].size() > 0",  # a literal list
    "1" + "+1" * 5110 + " > 0",  # a chain
])
def test_an_expression_of_too_many_tokens_is_refused_before_the_parse(
        expression: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert len(expression) <= 10 * 1024
    parses: list[str] = []
    env = sel._environment()
    real = env.compile
    monkeypatch.setattr(env, "compile", lambda text: (parses.append(text), real(text))[1])
    why = Selectors().program(expression)
    assert parses == []  # 0.4-2.7 s of lark on the old code
    assert why == "more than 512 tokens, at most 512"
    assert demand_reason(expression) == FIELD + "more than 512 tokens, at most 512"


def test_a_deep_chain_under_the_token_limit_is_refused_as_nested_too_deeply() -> None:
    why = Selectors().program("1" + "+1" * 250 + " > 0")
    assert isinstance(why, str) and why.startswith("nested too deeply: ")


# ------------------------------------------------------ cache by memory


def test_compiled_programs_keep_bounded_memory() -> None:
    """Three distinct 10 KiB literal lists kept about 100 MiB on the old code (34 MiB each,
    so about 50 templates filled the 2 GiB deployment)."""
    s = Selectors()
    sel._environment()
    gc.collect()
    tracemalloc.start()
    try:
        for i in range(3):
            s.program(f"[{i}," + ",".join("1" for _ in range(5100)) + "].size() > 0")
        gc.collect()
        kept, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert kept < 4 * 2**20


def test_the_program_cache_is_bounded_by_estimated_bytes_oldest_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sel, "PROGRAM_BYTES", 1 * 2**20)
    s = Selectors()
    exprs = [f"{literal_list(200)}.size() > {i}" for i in range(8)]
    for e in exprs:
        assert not isinstance(s.program(e), str)
        assert s.program_bytes <= sel.PROGRAM_BYTES
    first = s.program(exprs[0])  # evicted: compiled again, a new program
    last = s.program(exprs[-1])
    assert last is s.program(exprs[-1])
    assert not isinstance(first, str) and first.bytes >= 200 * 10 * sel.NODE_BYTES // 2


def test_a_programs_estimated_bytes_cover_what_it_keeps() -> None:
    s = Selectors()
    sel._environment()
    e = f"{literal_list(250)}.size() > 0"
    gc.collect()
    tracemalloc.start()
    try:
        p = s.program(e)
        gc.collect()
        kept, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not isinstance(p, str) and kept <= p.bytes


# ------------------------------------------------------------ results and budgets


def test_results_are_keyed_by_the_device_signature_identical_devices_evaluate_once() -> None:
    s = Selectors()
    e = f'device.attributes["{DRIVER}"].productName == "H100"'
    gpus = [Device(DRIVER, f"n{i // 8}", f"gpu-{i % 8}", GPU.attributes, GPU.capacity)
            for i in range(40)]
    assert all(s.matches(e, d) for d in gpus)
    assert s.evaluations == 1
    other = Device(DRIVER, "n9", "gpu-0", ((DRIVER, "productName", "A100"),))
    assert not s.matches(e, other) and s.evaluations == 2


def test_the_results_cache_drops_its_least_recently_used_not_everything(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sel, "RESULTS_CACHED", 2)
    s = Selectors()
    devs = [Device(DRIVER, "n0", f"g{i}", ((DRIVER, "i", i),)) for i in range(3)]
    e = f'"{DRIVER}" in device.attributes'  # reads the whole device: keyed by signature
    for d in devs:
        assert s.matches(e, d)
    assert s.evaluations == 3
    s.matches(e, devs[1])
    s.matches(e, devs[2])
    assert s.evaluations == 3  # the two most recent kept
    s.matches(e, devs[0])
    assert s.evaluations == 4


def test_a_selector_reading_named_attributes_is_keyed_by_them_alone() -> None:
    """NVIDIA's driver gives each GPU its own ``uuid``: a selector on the model still
    evaluates once for all GPUs of that model."""
    s = Selectors()
    e = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].productName == "H100"'
    gpus = [Device(DRIVER, f"n{i}", "gpu-0",
                   ((DRIVER, "productName", m), (DRIVER, "uuid", f"u{i}")))
            for i, m in enumerate(["H100"] * 30 + ["A100"] * 30)]
    assert [s.matches(e, d) for d in gpus] == [True] * 30 + [False] * 30
    assert s.evaluations == 2


def test_a_bool_and_an_int_attribute_are_different_devices() -> None:
    s = Selectors()
    one = Device(DRIVER, "n0", "a", ((DRIVER, "x", 1),))
    true = Device(DRIVER, "n0", "b", ((DRIVER, "x", True),))
    for e in (f'device.attributes["{DRIVER}"].x == true',  # 1 == true: no such overload
              f'"{DRIVER}" in device.attributes && device.attributes["{DRIVER}"].x == true'):
        assert not s.matches(e, one) and s.matches(e, true), e


def test_an_evaluation_past_its_steps_does_not_match_and_refuses_its_expression(
        monkeypatch: pytest.MonkeyPatch) -> None:
    s = Selectors()
    e = f"{literal_list(20)}.all(x, x >= 0)"
    assert not isinstance(s.program(e), str)  # estimated within the limit
    monkeypatch.setattr(sel, "MAX_STEPS", 100)  # ... and run past a lower one
    assert not s.matches(e, GPU)
    assert s.overruns == 1
    why = s.program(e)
    assert isinstance(why, str) and "more than 100 steps" in why and "gpu-0" in why
    assert s.steps <= 100 + 40  # stopped within one body of the limit


def test_a_plan_budget_is_shared_and_an_exhausted_one_caches_nothing() -> None:
    s = Selectors()
    e = f"{literal_list(20)}.all(x, x >= 0)"
    budget = sel.Budget(steps=100)
    assert not s.matches(e, GPU, budget=budget)
    assert budget.exhausted and budget.steps <= 0 and s.overruns == 0
    assert s.matches(e, GPU)  # not cached as a non-match; the selector is fine
    assert s.matches(e, GPU, budget=sel.Budget(steps=0))  # cached: costs nothing


def test_static_estimates_bound_the_steps_counted() -> None:
    attrs = tuple((DRIVER, f"a{i}", f"v{i}") for i in range(31)) + GPU.attributes
    d = Device(DRIVER, "n0", "g", attrs, GPU.capacity)
    for e in (f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].productName'
              ' == "H100"',
              f'device.capacity["{DRIVER}"].memory.compareTo(quantity("40Gi")) >= 0',
              f'device.attributes["{DRIVER}"].exists_one(x, x == "productName")',
              f'device.attributes["{DRIVER}"].productName in ["A100", "H100", "B200"]',
              f'{literal_list(30)}.map(x, x * 2).filter(y, y > 10).size() > 3',
              nested_all(4)):
        s = Selectors()
        p = s.program(e)
        assert not isinstance(p, str), (e, p)
        s.matches(e, d)
        assert 0 < s.steps <= p.cost.steps, e


def test_a_claim_whose_selectors_hold_too_many_tokens_in_all_names_the_field() -> None:
    """Each expression under its own limit, but 32 requests x 8 subrequests x 32 selectors
    could make one claim's first plan parse for minutes."""
    from coscheduling.devices.wire import MAX_SELECTOR_TOKENS

    each = f"{literal_list(200)}.size() > 0"  # about 400 tokens
    t = template_from_json({
        "metadata": {"name": "t", "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [{"name": f"r{i}", "exactly": {
            "deviceClassName": "gpu.nvidia.com",
            "selectors": [{"cel": {"expression": each + f" || {i} == 0"}}]}}
            for i in range(6)]}}}})
    assert t.spec.problem == (f"spec.devices.requests: more than {MAX_SELECTOR_TOKENS} CEL "
                              f"tokens in all selectors, at most {MAX_SELECTOR_TOKENS}")
    c = class_from_json({"metadata": {"name": "big"}, "spec": {"selectors": [
        {"cel": {"expression": each + f" || {i} == 0"}} for i in range(6)]}})
    assert c.selectors == ("false",)  # a class over a limit selects nothing
