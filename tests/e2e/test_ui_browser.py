"""The web page (/ui) in a real browser: headless Chromium against Lockstep on the test bed,
with gangs waiting, binding (parked, capacity reserved), running and timed out on a GB200
NVL72 topology (2 racks x 18 nodes x 4 GPUs, one NVSwitch domain per rack).

Screenshots are kept under run/ui-browser/ as artifacts.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from playwright.sync_api import Browser, Page, expect, sync_playwright

from testbed.bins import REPO
from testbed.browser import BrowserMissing, ensure_chromium
from testbed.workloads import gang, pod

from .conftest import ClusterFactory

SHOTS = REPO / "run" / "ui-browser"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    try:
        chromium = ensure_chromium()
    except BrowserMissing as e:
        pytest.fail(str(e), pytrace=False)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(chromium),
                              args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield b
        b.close()


def chip(page: Page, state: str) -> int:
    return int(page.locator(f'#state-chips [data-state="{state}"]').get_attribute(
        "data-count") or -1)


def shot(page: Page, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def test_the_page_shows_gangs_capacity_and_a_plan(cluster: ClusterFactory,
                                                  browser: Browser) -> None:
    c = cluster("gb200-nvl72", lockstep_args=("--backoff=300",))
    assert c.lockstep_url
    c.create(*gang("run", 2, gpus=4))
    c.wait_bound(c.names("run", 2), 30)
    park = gang("park", 3, gpus=4, timeout=200)
    park[2] = pod("park-2", c.ns).gang("park", 3, 200).gpu(4).unplaceable().build()
    late = gang("late", 3, gpus=2)[:2]
    slow = gang("slow", 2, gpus=1, timeout=3)
    slow[1] = pod("slow-1", c.ns).gang("slow", 2, 3).gpu(1).unplaceable().build()
    c.create(*park, *late, *slow)
    c.wait_event(None, "GangTimedOut", "gang e2e/slow timed out", 30)
    state = {g["gang"]: g for g in c.lockstep("/debug/gangs")["gangs"]}
    c.kube.wait("park parked", lambda: {g["gang"]: g for g in c.lockstep("/debug/gangs")[
        "gangs"]}["e2e/park"]["parked"] == 2, 30)

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(c.lockstep_url + "/ui")
    page.wait_for_selector("#state-chips")
    expect(page.locator('#gang-rows tr[data-gang="e2e/park"]')).to_have_attribute(
        "data-state", "binding")
    assert {s: chip(page, s) for s in ("waiting", "binding", "running", "timed out",
                                       "partial")} == {
        "waiting": 1, "binding": 1, "running": 1, "timed out": 1, "partial": 0}
    row = page.locator('#gang-rows tr[data-gang="e2e/park"]')
    assert row.locator('[data-col="parked"]').inner_text() == "2"
    assert row.locator('[data-col="pending"]').inner_text() == "1"
    assert "capacity reserved on 3 node(s): 2 member(s) parked" in row.locator(
        ".reason").inner_text()
    # The reason in the same words as `lockstep explain`.
    late_row = page.locator('#gang-rows tr[data-gang="e2e/late"]')
    explained = c.lockstep("/debug/pods/e2e/late-0")["explanation"]
    assert late_row.locator(".reason").inner_text() == explained
    assert "2/3 members exist" in explained
    assert "e2e/slow timed out" in page.locator(
        '#gang-rows tr[data-gang="e2e/slow"] .reason').inner_text()
    shot(page, "gangs")

    # Capacity: two racks; open the one holding park's reservation, whose GPUs name it.
    racks = page.locator(".rack")
    expect(racks).to_have_count(2)
    reserved = page.locator('.rack[title*="e2e/park"]')
    reserved.click()
    slots = page.locator('#rack-detail .gpu.reserved[data-owner="e2e/park"]')
    expect(slots.first).to_be_visible()
    api = httpx.get(c.lockstep_url + "/ui/api/racks", timeout=10).json()
    want = sum(r["reservedFor"].get("e2e/park", 0) for r in api["racks"])
    assert want > 0 and slots.count() == want
    assert "reserved for gang e2e/park" in (slots.first.get_attribute("title") or "")
    expect(page.locator("#rack-detail .clique").first).to_contain_text("NVSwitch domain")
    expect(page.locator('#rack-detail .gpu.used[data-owner="e2e/run"]')).not_to_have_count(0)
    shot(page, "capacity")

    # Filters: one state, then one namespace.
    page.locator('#state-chips [data-state="waiting"]').click()
    expect(page.locator("#gang-rows tr")).to_have_count(1)
    assert page.locator("#gang-rows tr").get_attribute("data-gang") == "e2e/late"
    page.locator('#state-chips [data-state=""]').click()
    expect(page.locator("#gang-rows tr")).to_have_count(4)
    page.select_option("#ns-filter", "e2e")
    expect(page.locator("#gang-rows tr")).to_have_count(4)

    # Live: the missing member arrives; the page shows the gang running without a reload.
    c.create(gang("late", 3, gpus=2)[2])
    expect(page.locator('#gang-rows tr[data-gang="e2e/late"]')).to_have_attribute(
        "data-state", "running", timeout=30_000)

    # One gang's page: its plan, its members, its Events.
    page.goto(c.lockstep_url + "/ui#/gang/e2e/park")
    expect(page.locator("#gang-page")).to_have_attribute("data-gang", "e2e/park")
    expect(page.locator("#plan tbody tr")).to_have_count(3)
    planned = {page.locator("#plan tbody tr").nth(i).locator("td").nth(1).inner_text()
               for i in range(3)}
    assert planned <= {n["metadata"]["name"] for n in c.kube.list("/api/v1/nodes")}
    assert "all members placed within one" in page.locator("#plan-why").inner_text()
    states = sorted(page.locator("#members tbody tr").nth(i).get_attribute("data-state") or ""
                    for i in range(3))
    assert states == ["parked", "parked", "pending"]
    expect(page.locator("#events")).to_contain_text("GangAdmitted")
    shot(page, "gang")
    assert state["e2e/run"]["phase"] == "Released"


def test_ui_false_serves_no_page(cluster: ClusterFactory) -> None:
    c = cluster("tiny-3x2", lockstep_args=("--ui=false",))
    assert c.lockstep_url
    assert httpx.get(c.lockstep_url + "/ui", timeout=10).status_code == 404
    assert httpx.get(c.lockstep_url + "/ui/api/gangs", timeout=10).status_code == 404
    assert httpx.get(c.lockstep_url + "/debug/gangs", timeout=10).status_code == 200


def test_would_it_fit_takes_a_pasted_or_uploaded_manifest_and_gives_the_clis_answer(
        cluster: ClusterFactory, browser: Browser, tmp_path: Path) -> None:
    c = cluster("tiny-3x2")
    assert c.lockstep_url
    c.create(*gang("busy", 2, gpus=2))
    c.wait_bound(["busy-0", "busy-1"], 30)

    def manifest(name: str, size: int, gpus: int) -> str:
        objs = gang(name, size, gpus=gpus)
        for o in objs:
            o["metadata"]["namespace"] = c.ns
        return yaml.safe_dump_all(objs)
    fits = manifest("next", 2, 1)
    api = httpx.post(c.lockstep_url + "/debug/what-if", content=fits, timeout=30).json()
    assert api["verdict"] == "fits-now"

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(c.lockstep_url + "/ui")
    page.wait_for_selector("#state-chips")
    page.click("#whatif-link")
    page.fill("#whatif-manifest", fits)
    page.click("#whatif-ask")
    expect(page.locator("body")).to_have_attribute("data-whatif", "fits-now")
    rows = page.locator(".whatif-placed tbody tr")
    expect(rows).to_have_count(2)
    shown = {rows.nth(i).get_attribute("data-pod"): rows.nth(i).get_attribute("data-node")
             for i in range(2)}
    assert shown == {p["pod"]: p["node"] for p in api["outcomes"][0]["placed"]}
    assert page.locator("#whatif-text").text_content() == api["text"]
    shot(page, "whatif")

    # Uploaded: a gang the 2 GPUs left cannot hold waits, and the page says why.
    f = tmp_path / "big.yaml"
    f.write_text(manifest("big", 2, 2))
    page.set_input_files("#whatif-file", str(f))
    expect(page.locator("#whatif-manifest")).to_have_value(f.read_text())
    page.click("#whatif-ask")
    expect(page.locator("body")).to_have_attribute("data-whatif", "waits")
    expect(page.locator('.whatif-unit[data-unit="e2e/big"] .reason').first).to_contain_text(
        "does not fit")

    # Bad input: the message names what is wrong.
    page.fill("#whatif-manifest", "kind: [")
    page.click("#whatif-ask")
    expect(page.locator("#whatif-error")).to_contain_text("malformed YAML")
    assert sorted(p["metadata"]["name"] for p in c.kube.pods(c.ns)) == ["busy-0", "busy-1"]
