"""deploy/grafana/lockstep.json: a well-formed dashboard whose every query reads a metric
Lockstep exports (here the in-process registry; tests/e2e/test_grafana_dashboard.py scrapes a
Lockstep running on the test bed)."""

from __future__ import annotations

import itertools

import pytest
from prometheus_client import generate_latest

from app.metrics import Metrics
from coscheduling import Coscheduler
from tests.promql import dashboard, exported_names, expressions, metric_names

DASH = dashboard()
PANELS = [p for p in DASH["panels"] if p["type"] != "row"]


def test_dashboard_is_importable_grafana_json() -> None:
    assert DASH["uid"] == "lockstep-overview" and DASH["title"] == "Lockstep"
    assert isinstance(DASH["schemaVersion"], int) and DASH["schemaVersion"] >= 36
    ids = [p["id"] for p in DASH["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"]: v for v in DASH["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for p in PANELS:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], f"{p['title']}: no query"
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), f"{p['title']}: duplicate refId"
        for t in p["targets"]:
            assert '{job=~"$job"}' in t["expr"], f"{p['title']}: not filtered by $job"


def test_panels_tile_the_grid_without_overlap() -> None:
    cells = {}
    for p in DASH["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        for x, y in itertools.product(range(g["x"], g["x"] + g["w"]),
                                      range(g["y"], g["y"] + g["h"])):
            assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
            cells[(x, y)] = p["title"]


def test_the_panels_an_operator_asks_for_are_there() -> None:
    titles = " | ".join(p["title"] for p in PANELS).lower()
    for want in ("gangs by state", "admission wait", "arrival to bound", "verb latency",
                 "bind errors by reason", "reserved vs used", "partial gangs",
                 "preemptions started", "preemption victims by kind"):
        assert want in titles, want


def test_partial_gangs_turns_red_above_zero() -> None:
    (panel,) = [p for p in PANELS if p["title"].startswith("Partial gangs")]
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["color"] for s in steps] == ["green", "red"] and steps[1]["value"] == 1


def test_every_query_reads_a_metric_lockstep_exports() -> None:
    exposition = generate_latest(Metrics(Coscheduler().queries, lambda _: {}).registry).decode()
    exported = exported_names(exposition)
    for title, expr in expressions(DASH):
        names = metric_names(expr)
        assert names, f"{title}: no metric in {expr!r}"
        assert names <= exported, f"{title}: {sorted(names - exported)} not exported"


@pytest.mark.parametrize(("expr", "names"), [
    ('histogram_quantile(0.99, sum by (le, verb) (rate(a_bucket{job=~"$job"}[5m])))',
     {"a_bucket"}),
    ("sum(b_total) / sum(c) > bool 1e3", {"b_total", "c"}),
    ('count without (x) (d{l="sum(e)"}) or on (y) f offset 5m', {"d", "f"}),
])
def test_metric_names_are_read_from_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_exported_names_know_the_suffixes() -> None:
    text = ("# TYPE h histogram\n# TYPE c_total counter\n# TYPE g gauge\ng 1\n"
            'c_total{x="1"} 2\n')
    assert exported_names(text) >= {"h_bucket", "h_sum", "h_count", "c_total", "g"}
    assert "h" not in exported_names(text) and "c" not in exported_names(text)
