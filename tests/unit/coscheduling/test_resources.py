"""Quantity parsing and pod requests, as kube-scheduler's NodeResourcesFit computes them."""

from __future__ import annotations

from typing import Any

import pytest

from coscheduling.resources import (
    QuantityError,
    fits,
    format_resources,
    parse_quantity,
    pod_requests,
)


@pytest.mark.parametrize(
    ("value", "milli", "want"),
    [
        pytest.param("500m", True, 500, id="millicores"),
        pytest.param("2", True, 2000, id="cores"),
        pytest.param("1.5", True, 1500, id="fractional-cores"),
        pytest.param("4Gi", False, 4 * 2**30, id="binary"),
        pytest.param("1G", False, 10**9, id="decimal"),
        pytest.param("1e3", False, 1000, id="exponent"),
        pytest.param("100m", False, 1, id="rounds-up"),
        pytest.param(8, False, 8, id="int"),
    ],
)
def test_parse_quantity(value: Any, milli: bool, want: int) -> None:
    assert parse_quantity(value, milli=milli) == want


@pytest.mark.parametrize("value", ["", "lots", "-1", "1Zi", None, True, "inf"])
def test_bad_quantities_raise_naming_the_value(value: Any) -> None:
    with pytest.raises(QuantityError) as e:
        parse_quantity(value)
    assert repr(value) in str(e.value)


def test_pod_requests_sum_containers_max_init_add_sidecars_and_overhead() -> None:
    spec = {
        "containers": [
            {"resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
            {"resources": {"limits": {"nvidia.com/gpu": "2"}}},  # requests default to limits
        ],
        "initContainers": [
            {"resources": {"requests": {"cpu": "4"}}},
            {"restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}},
        ],
        "overhead": {"cpu": "100m"},
    }
    assert pod_requests(spec) == {"cpu": 4100, "memory": 2**30, "nvidia.com/gpu": 2, "pods": 1}


def test_fits_ignores_unrequested_resources() -> None:
    assert fits({"nvidia.com/gpu": 1}, {"nvidia.com/gpu": 1, "cpu": 0})
    assert not fits({"nvidia.com/gpu": 2}, {"nvidia.com/gpu": 1})
    text = format_resources({"cpu": 1500, "memory": 2**31, "pods": 1})
    assert text == "{cpu: 1500m, memory: 2Gi}"
