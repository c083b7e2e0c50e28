"""The what-if benchmark runs end to end on a tiny cluster: every shape gets the verdict it
is built for, and the probes answer throughout."""

from __future__ import annotations

from benchmarks import stall, whatif


def test_every_shape_gets_its_verdict_and_the_probes_answer() -> None:
    got = whatif.run(nodes=64, pods=2000, rounds=2, idle_seconds=0.3)
    rows = {r["shape"]: r for r in got["rows"]}
    assert set(rows) == set(whatif.SHAPES)
    for shape, r in rows.items():
        assert r["verdict"] == whatif.SHAPES[shape][1] == r["expected"], (shape, r)
        assert r["n"] == 2 and 0 < r["p50_ms"] <= r["p95_ms"] <= r["max_ms"]
    probes = {(r["phase"], r["probe"]): r for r in got["probes"]}
    assert set(probes) == {(ph, p) for ph in ("idle", "what-if") for p in stall.PROBES}
    for key, r in probes.items():
        assert r["n"] >= 1 and r["errors"] == 0, (key, r)
        assert isinstance(r["loop_held_max_s"], float)
    assert probes[("what-if", "healthz")]["load_calls"] == 2 * len(whatif.SHAPES)
    assert got["alive_after"]
