"""The failover benchmark's shape: its row, its goal read from the deployed configuration,
and its place in ``make bench`` (the kills themselves run on the test bed)."""

from __future__ import annotations

import pytest

from benchmarks import __main__ as bench
from benchmarks import failover


def test_the_row_reports_quantiles_against_the_deployed_lease() -> None:
    samples = [16.0 + i / 10 for i in range(20)]  # 16.0 .. 17.9
    row = failover.summarize(samples, [15.5] * 20, failover.lease_duration())
    assert set(row) == {k for k, _ in failover.TABLE_COLUMNS}
    assert row["kills"] == 20 and row["lease_duration_s"] == 15.0 and row["goal_s"] == 17.0
    assert row["p50_s"] == pytest.approx(16.95) and row["p95_s"] == 17.8
    assert row["max_s"] == 17.9 and row["takeover_p50_s"] == 15.5
    assert row["met"] is False  # p95 over lease + 2 s
    assert failover.summarize([3.0, 4.0], [], 15.0)["met"] is True


def test_failover_is_a_bench_mode_and_renders_as_a_table() -> None:
    assert "failover" in bench.BENCHMARKS
    row = failover.summarize([16.2], [15.1], 15.0)
    text = bench.table([row], failover.TABLE_COLUMNS)
    assert "p95 s" in text.splitlines()[0] and "16.2" in text.splitlines()[1]
