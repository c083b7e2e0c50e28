"""benchmarks/ui.py at a small scale: the synthetic core has the shape the page is measured
on, and the answers stay bounded (aggregates per rack, at most 200 gang rows)."""

from __future__ import annotations

from benchmarks.ui import build_core, measure


def test_the_ui_benchmark_runs_and_its_answers_stay_bounded() -> None:
    core = build_core(64, 1800)
    assert len(core.queries.nodes) == 64 and len(core.queries.pods) == 1800
    out = measure(core, rounds=1)
    assert out["racks"] == 4  # 16 nodes a rack
    assert out["gangs"] == len(core.queries.gang_views()) > 200
    ep = out["endpoints"]
    assert ep["gangs (200 rows)"]["bytes"] < 80_000  # 200 rows, not every gang
    assert ep["racks (aggregates)"]["bytes"] < 4 * 300  # ~140 bytes a rack, no node list
    assert ep["one rack (16 nodes)"]["bytes"] < 16 * 600  # ~400 bytes a node
    assert set(out["compute_ms"]) == {"gangs (200 rows)", "racks (aggregates)",
                                      "one rack (16 nodes)", "one gang"}
