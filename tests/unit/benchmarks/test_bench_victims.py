"""The preemption-decision benchmark measures a real decision on its synthetic cluster."""

from __future__ import annotations

from benchmarks import victims


def test_a_full_synthetic_cluster_yields_victims_and_a_reason_when_none_fit() -> None:
    got = victims.run(nodes=100, cases=((1, 8, 6, None), (64, 8, 10, "rack")))
    assert got["nodes"] == 100 and got["candidates"] > 100  # every node is full
    one, too_big = got["rows"]
    # One 8-GPU member frees one node: the victims there, all below priority 6.
    assert one["level"] == "hostname" and one["gpus"] >= 8 and one["highest_priority"] < 6
    # 64 x 8 GPUs cannot fit a 20-node rack: no set, and the reason says so.
    assert "no set" in too_big["level"] and "would not fit in one rack" in too_big["why"]
