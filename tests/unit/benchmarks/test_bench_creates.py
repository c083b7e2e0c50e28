"""The create-latency benchmark's arithmetic: the API server's webhook time read from its
metrics, the quantiles, and its place in ``make bench`` (the creates run on the test bed)."""

from __future__ import annotations

from benchmarks import __main__ as bench
from benchmarks import creates

SERIES = "apiserver_admission_webhook_admission_duration_seconds"
LABELS = 'operation="CREATE",rejected="false"'
EXPOSITION = "\n".join([
    f"# HELP {SERIES} [ALPHA] ...",
    f'{SERIES}_bucket{{name="gang-gate.lockstep.dev",{LABELS},type="admit",le="0.005"}} 3',
    f'{SERIES}_sum{{name="gang-gate.lockstep.dev",{LABELS},type="admit"}} 1.5',
    f'{SERIES}_count{{name="gang-gate.lockstep.dev",{LABELS},type="admit"}} 40',
    f'{SERIES}_sum{{name="claim-narrow.lockstep.dev",{LABELS},type="admit"}} 0.5',
    f'{SERIES}_count{{name="claim-narrow.lockstep.dev",{LABELS},type="admit"}} 10',
    f'{SERIES}_sum{{name="other",{LABELS},type="validating"}} 9',
    f'{SERIES}_count{{name="other",{LABELS},type="validating"}} 9',
]) + "\n"


def test_the_webhook_time_sums_mutating_calls_only() -> None:
    assert creates._webhook_time(EXPOSITION) == (2.0, 50.0)
    assert creates._webhook_time("") == (0.0, 0.0)


def test_quantiles_pick_an_observed_latency() -> None:
    lat = [i / 100 for i in range(1, 101)]  # 0.01 .. 1.00
    assert creates._pct(lat, 0.5) in (0.5, 0.51)
    assert creates._pct(lat, 0.99) == 0.99 and creates._pct(lat, 1.0) == 1.0
    assert creates._pct([0.2], 0.99) == 0.2


def test_creates_is_a_bench_mode_with_its_table() -> None:
    assert "creates" in bench.BENCHMARKS
    heads = [h for _, h in creates.TABLE_COLUMNS]
    assert "p99 ms" in heads and "CPU ms per create" in heads
