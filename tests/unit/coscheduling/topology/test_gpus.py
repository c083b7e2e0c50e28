"""Parsing recorded ``nvidia-smi topo -m`` outputs and NVML-style matrices into GPU topologies."""

from __future__ import annotations

import pytest

from coscheduling.records import node_from_json
from coscheduling.topology.domains import gpu_layout
from coscheduling.topology.gpus import (
    NVML_LEVEL_CODES,
    GpuTopology,
    Interconnect,
    TopologyParseError,
    from_matrix,
    labels,
    parse_nvidia_smi_topo,
)
from testbed.bins import REPO
from tests.builders import node

FIXTURES = REPO / "tests" / "fixtures" / "topo"
ALL8 = ((0, 1, 2, 3, 4, 5, 6, 7),)


def lbl(kind: str, island: int, numa: int, per: int) -> dict[str, str]:
    return {
        "lockstep.dev/gpu-interconnect": kind,
        "lockstep.dev/nvlink-island-size": str(island),
        "lockstep.dev/numa-nodes": str(numa),
        "lockstep.dev/gpus-per-numa": str(per),
    }


@pytest.mark.parametrize(
    ("fixture", "want_topo", "want_labels"),
    [
        pytest.param(
            "hgx-h100-8gpu.txt",
            GpuTopology(8, Interconnect.NVSWITCH, ALL8, (0, 0, 0, 0, 1, 1, 1, 1), 2, 4),
            lbl("nvswitch", 8, 2, 4),
            id="hgx-h100",
        ),
        pytest.param(
            "dgx-a100.txt",
            GpuTopology(8, Interconnect.NVSWITCH, ALL8, (3, 3, 1, 1, 7, 7, 5, 5), 4, 2),
            lbl("nvswitch", 8, 4, 2),
            id="dgx-a100-nps4-mlx5-columns",
        ),
        pytest.param(
            "pcie-a100-nvlink-pairs.txt",
            GpuTopology(4, Interconnect.NVLINK_PAIRS, ((0, 1), (2, 3)), (0, 0, 1, 1), 2, 2),
            lbl("nvlink-pairs", 2, 2, 2),
            id="pcie-a100-bridged-pairs",
        ),
        pytest.param(
            "pcie-l4-ansi.txt",
            GpuTopology(4, Interconnect.PCIE, ((0,), (1,), (2,), (3,)), (0, 0, 1, 1), 2, 2),
            lbl("pcie", 1, 2, 2),
            id="pcie-l4-ansi-tabs",
        ),
        pytest.param(
            "gb200-4gpu.txt",
            GpuTopology(4, Interconnect.NVSWITCH, ((0, 1, 2, 3),), (0, 0, 1, 1), 2, 2),
            lbl("nvswitch", 4, 2, 2),
            id="gb200-grace-numa-sets",
        ),
        pytest.param(
            "pcie-legacy-no-numa.txt",
            GpuTopology(8, Interconnect.PCIE, tuple((i,) for i in range(8)), (None,) * 8, 1, 8),
            lbl("pcie", 1, 1, 8),
            id="legacy-driver-soc-no-numa-column",
        ),
    ],
)
def test_fixtures(fixture: str, want_topo: GpuTopology, want_labels: dict[str, str]) -> None:
    topo = parse_nvidia_smi_topo((FIXTURES / fixture).read_text())
    assert topo == want_topo
    assert labels(topo) == want_labels


def test_labels_read_back_by_gpu_layout() -> None:
    """The labeller and the scheduler's locality score agree on what the labels mean."""
    topo = parse_nvidia_smi_topo((FIXTURES / "pcie-a100-nvlink-pairs.txt").read_text())
    b = node("n1").gpus(4)
    for k, v in labels(topo).items():
        b = b.label(k, v)
    layout = gpu_layout(node_from_json(b.build()))
    assert (layout.islands, layout.numa, layout.labelled) == ((2, 2), (2, 2), True)


def nv(n: int, pairs: list[tuple[int, int]], *, other: str = "SYS") -> list[list[str]]:
    m = [["X" if i == j else other for j in range(n)] for i in range(n)]
    for a, b in pairs:
        m[a][b] = m[b][a] = "NV4"
    return m


@pytest.mark.parametrize(
    ("links", "numa", "want_topo"),
    [
        pytest.param(
            nv(8, [(0, 1), (0, 2), (1, 3), (2, 3), (4, 5), (4, 6), (5, 7), (6, 7)]),
            [0, 0, 0, 0, 1, 1, 1, 1],
            GpuTopology(
                8,
                Interconnect.NVLINK_ISLANDS,
                ((0, 1, 2, 3), (4, 5, 6, 7)),
                (0, 0, 0, 0, 1, 1, 1, 1),
                2,
                4,
            ),
            id="two-rings-of-four",
        ),
        pytest.param(
            nv(3, [(0, 1)], other="PHB"),
            None,
            GpuTopology(3, Interconnect.NVLINK_ISLANDS, ((0, 1), (2,)), (None,) * 3, 1, 3),
            id="pair-plus-unbridged-gpu",
        ),
        pytest.param(
            nv(2, [(0, 1)]),
            [0, 0],
            GpuTopology(2, Interconnect.NVLINK_PAIRS, ((0, 1),), (0, 0), 1, 2),
            id="two-gpus-one-bridge-is-a-pair",
        ),
        pytest.param(
            [["X"]],
            [None],
            GpuTopology(1, Interconnect.PCIE, ((0,),), (None,), 1, 1),
            id="single-gpu",
        ),
        pytest.param(
            nv(5, [], other="NODE"),
            [0, 0, 0, 0, 1],
            GpuTopology(5, Interconnect.PCIE, tuple((i,) for i in range(5)), (0, 0, 0, 0, 1), 2, 4),
            id="uneven-numa-takes-fullest-node",
        ),
    ],
)
def test_from_matrix(
    links: list[list[str]], numa: list[int | None] | None, want_topo: GpuTopology
) -> None:
    assert from_matrix(links, numa) == want_topo


def test_nvml_level_codes_are_pcie_cells() -> None:
    links = [["X", NVML_LEVEL_CODES[40]], [NVML_LEVEL_CODES[40], "X"]]
    assert from_matrix(links).interconnect is Interconnect.PCIE


HEADER = "\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"
GPU1_OK = "GPU1\tNV12\t X \tSYS\t0-7\t0\t\tN/A\n"


@pytest.mark.parametrize(
    ("text", "want_line", "want_reason"),
    [
        pytest.param("", 1, "no header row starting with GPU0", id="empty"),
        pytest.param("\n\nNo devices were found\n", 3, "no header row", id="no-devices"),
        pytest.param(
            f"{HEADER}\nGPU0\t X \tNV12\tSYS\t0-7\t0\t\tN/A\nGPU1\tNV12\t X \tSYS\t0-7\n",
            3,
            "GPU1 has 4 fields, expected 6",
            id="ragged-row",
        ),
        pytest.param(
            f"{HEADER}\nGPU0\t X \tNV12\tSYS\t0-7\t0\t\tN/A\nGPU1\tNV12\t X \tFOO\t0-7\t0\t\tN/A\n",
            3,
            "column NIC0: unknown cell 'FOO'",
            id="unknown-cell",
        ),
        pytest.param(
            f"{HEADER}\nGPU0\t X \tNV12\tSYS\t0-7\t0\t\tN/A\nGPU1\tNV12\tPIX\tSYS\t0-7\t0\t\tN/A\n",
            3,
            "column GPU1: expected X on the diagonal, got 'PIX'",
            id="diagonal-not-x",
        ),
        pytest.param(
            f"{HEADER}\nGPU0\t X \tNV12\tSYS\t0-7\t0\t\tN/A\n\nLegend:\n",
            3,
            "matrix ends after 1 GPU rows, header has 2",
            id="missing-gpu-row",
        ),
        pytest.param(
            f"{HEADER}\nGPU1\tNV12\t X \tSYS\t0-7\t0\t\tN/A\nGPU0\t X \tNV12\tSYS\t0-7\t0\t\tN/A\n",
            2,
            "expected row GPU0, got GPU1",
            id="rows-out-of-order",
        ),
        pytest.param(
            f"{HEADER}\nGPU0\t X \tNV12\tSYS\t0-7\t0\t\tN/A\nGPU1\tSYS\t X \tSYS\t0-7\t0\t\tN/A\n",
            3,
            "GPU1 to GPU0 is SYS but GPU0 to GPU1 is NVLink",
            id="asymmetric-nvlink",
        ),
        pytest.param(
            f"{HEADER}\nGPU0\t X \tNV12\tSYS\t0-7\tzero\t\tN/A\n{GPU1_OK}",
            2,
            "bad NUMA affinity 'zero'",
            id="bad-numa",
        ),
        pytest.param(
            f"{HEADER}\nGPU0\t X \tNV12\tSYS\t0-7\t0\t\tN/A\nmlx5_9\tSYS\tSYS\t X\n",
            3,
            "row 'mlx5_9' is not a device of the header",
            id="row-not-in-header",
        ),
        pytest.param(
            "\tGPU1\tGPU0\tCPU Affinity\nGPU1\t X \tPHB\t0-7\nGPU0\tPHB\t X \t0-7\n",
            1,
            "GPU columns are not GPU0, GPU1, … in order",
            id="header-out-of-order",
        ),
    ],
)
def test_malformed(text: str, want_line: int, want_reason: str) -> None:
    with pytest.raises(TopologyParseError) as err:
        parse_nvidia_smi_topo(text)
    assert err.value.line == want_line
    assert want_reason in err.value.reason
    assert str(err.value).startswith(f"line {want_line}: ")


@pytest.mark.parametrize(
    ("links", "numa", "want_line", "want_reason"),
    [
        pytest.param([], None, 1, "no GPUs", id="empty"),
        pytest.param([["X", "SYS"], ["SYS"]], None, 2, "GPU1 row has 1 cells", id="ragged"),
        pytest.param([["X", "NVL"], ["NVL", "X"]], None, 1, "unknown cell 'NVL'", id="unknown"),
        pytest.param([["X"]], [0, 1], 1, "2 NUMA entries for 1 GPUs", id="numa-length"),
    ],
)
def test_from_matrix_malformed(
    links: list[list[str]], numa: list[int | None] | None, want_line: int, want_reason: str
) -> None:
    with pytest.raises(TopologyParseError) as err:
        from_matrix(links, numa)
    assert (err.value.line, want_reason in err.value.reason) == (want_line, True)
