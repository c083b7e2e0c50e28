"""The GPU layout inside one node, read from ``nvidia-smi topo -m`` or from NVML link types.

Why this lives in the pure core: the scheduler's locality score (``topology.gpu_layout``) reads
four ``lockstep.dev/`` node labels, and no Kubernetes component publishes anything like them
(see ``reference/conventions.md``: "Intra-node NVLink / NVSwitch: no label exists anywhere").
``lockstep label-node`` (``app/kube/labeller.py``) runs on each GPU node, gathers the connection
matrix and writes the labels. Everything between "text or matrix in" and "labels out" is here,
free of subprocesses, NVML and HTTP, so recorded outputs of real boards are enough to test it.

The matrix printed by ``nvidia-smi topo -m`` has a header row of devices (``GPU0 … NIC0 …`` or
older ``mlx5_0 …``) followed by ``CPU Affinity``, ``NUMA Affinity`` and ``GPU NUMA ID``; one row
per device; then a legend. A cell is ``X`` (self), ``NV#`` (# bonded NVLinks) or a PCIe path:
``PIX`` < ``PXB`` < ``PHB`` < ``NODE`` < ``SYS`` (``SOC`` on old drivers). NIC rows and columns
are read only to check alignment. Terminals get ANSI underline codes and tabs; both are fine.

Classification (``Interconnect``), on the graph whose edges are NV cells:
- every pair of GPUs NV-connected, more than two GPUs: ``NVSWITCH`` (HGX/DGX, GB200);
- every GPU in an NVLink group of exactly two: ``NVLINK_PAIRS`` (PCIe cards with bridges);
- any other NVLink groups: ``NVLINK_ISLANDS`` (e.g. hybrid cube-mesh, partial bridging);
- no NV cell at all: ``PCIE``.

NUMA: a GPU's node is the lowest id in its ``NUMA Affinity`` set. On Grace systems (GB200) that
set also lists the GPU-memory NUMA nodes (``0,3-9,11-17``); the CPU node has the lowest id. The
``GPU NUMA ID`` column (the GPU's own memory node on Grace) is not a CPU NUMA node and is ignored.
``numa_nodes`` counts NUMA nodes that hold GPUs, the only ones this matrix can show.

Errors: ``TopologyError`` is the base; ``TopologyParseError(line, reason)`` names the 1-based
input line (or, from ``from_matrix``, the matrix row) that is wrong.
"""

from __future__ import annotations

import enum
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .domains import GPUS_PER_NUMA_LABEL, INTERCONNECT_LABEL, ISLAND_SIZE_LABEL, NUMA_NODES_LABEL

__all__ = [
    "NVML_LEVEL_CODES",
    "GpuTopology",
    "Interconnect",
    "TopologyError",
    "TopologyParseError",
    "from_matrix",
    "labels",
    "parse_nvidia_smi_topo",
]


class TopologyError(ValueError):
    """Base of the errors of this module."""


class TopologyParseError(TopologyError):
    """The input is not a GPU connection matrix; ``line`` is 1-based."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: {reason}")
        self.line = line
        self.reason = reason


class Interconnect(enum.Enum):
    NVSWITCH = "nvswitch"
    """All GPUs reach each other over NVLink (through NVSwitch, or a full mesh)."""
    NVLINK_PAIRS = "nvlink-pairs"
    """GPUs are NVLink-bridged two by two, PCIe between pairs."""
    NVLINK_ISLANDS = "nvlink-islands"
    """NVLink joins some groups of GPUs that are neither pairs nor the whole node."""
    PCIE = "pcie"
    """No NVLink: GPUs talk over PCIe (and the CPU interconnect)."""


@dataclass(frozen=True, slots=True)
class GpuTopology:
    gpu_count: int
    interconnect: Interconnect
    nvlink_islands: tuple[tuple[int, ...], ...]
    """Connected components of the NVLink graph, every GPU in exactly one (singletons on PCIe),
    each sorted, ordered by their lowest GPU index."""
    numa_of_gpu: tuple[int | None, ...]
    """CPU NUMA node of each GPU, None when not reported (``N/A``)."""
    numa_nodes: int
    """NUMA nodes holding GPUs; 1 when none is known."""
    gpus_per_numa: int
    """GPUs on the fullest NUMA node; ``gpu_count`` when none is known."""


# nvmlGpuTopologyLevel_t values (nvml.h) to the cell codes nvidia-smi prints for them.
NVML_LEVEL_CODES: Mapping[int, str] = {
    0: "PIX",  # NVML_TOPOLOGY_INTERNAL: two GPUs on one board
    10: "PIX",  # NVML_TOPOLOGY_SINGLE
    20: "PXB",  # NVML_TOPOLOGY_MULTIPLE
    30: "PHB",  # NVML_TOPOLOGY_HOSTBRIDGE
    40: "NODE",  # NVML_TOPOLOGY_NODE
    50: "SYS",  # NVML_TOPOLOGY_SYSTEM
}

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_GPU = re.compile(r"GPU([0-9]{1,6})")
_NV = re.compile(r"NV([0-9]{1,6})")
_SMALL = re.compile(r"[0-9]{1,6}")
"""A GPU or NUMA id: ASCII digits (``int()`` reads other scripts' too), never a long run."""
_PCIE_CODES = frozenset({"PIX", "PXB", "PHB", "NODE", "SYS", "SOC"})
_TRAILING = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_NA = frozenset({"N/A", "n/a", "-"})


def _check_cell(cell: str, diagonal: bool) -> str | None:
    """None when ``cell`` is valid where it sits, else why not."""
    if diagonal:
        return None if cell == "X" else f"expected X on the diagonal, got {cell!r}"
    if cell in _PCIE_CODES or _NV.fullmatch(cell):
        return None
    return f"unknown cell {cell!r}"


def from_matrix(
    links: Sequence[Sequence[str]],
    numa_of_gpu: Sequence[int | None] | None = None,
    *,
    lines: Sequence[int] | None = None,
) -> GpuTopology:
    """A topology from a square GPU-by-GPU matrix of nvidia-smi cell codes.

    ``links[i][j]`` is ``"X"`` on the diagonal, ``"NV<n>"`` for n bonded NVLinks, else a PCIe
    code (``NVML_LEVEL_CODES`` maps NVML's common-ancestor levels to them). ``lines`` gives the
    input line of each row for error messages; without it errors name the 1-based row.
    """
    n = len(links)
    where = list(lines) if lines is not None else list(range(1, n + 1))
    if n == 0:
        raise TopologyParseError(1, "no GPUs in the matrix")
    numa = tuple(numa_of_gpu) if numa_of_gpu is not None else (None,) * n
    if len(numa) != n:
        raise TopologyParseError(where[0], f"{len(numa)} NUMA entries for {n} GPUs")
    adj: list[set[int]] = [set() for _ in range(n)]
    for i, row in enumerate(links):
        if len(row) != n:
            raise TopologyParseError(where[i], f"GPU{i} row has {len(row)} cells, expected {n}")
        for j, cell in enumerate(row):
            why = _check_cell(cell, i == j)
            if why:
                raise TopologyParseError(where[i], f"GPU{i} to GPU{j}: {why}")
            m = _NV.fullmatch(cell)
            if m and int(m.group(1)) > 0:
                adj[i].add(j)
    for i in range(n):
        for j in adj[i]:
            if i not in adj[j]:
                raise TopologyParseError(
                    where[j], f"GPU{j} to GPU{i} is {links[j][i]} but GPU{i} to GPU{j} is NVLink"
                )
    islands = _components(adj)
    return GpuTopology(
        gpu_count=n,
        interconnect=_classify(adj, islands),
        nvlink_islands=islands,
        numa_of_gpu=numa,
        numa_nodes=len({x for x in numa if x is not None}) or 1,
        gpus_per_numa=max(Counter(x for x in numa if x is not None).values(), default=n),
    )


def _components(adj: Sequence[set[int]]) -> tuple[tuple[int, ...], ...]:
    seen: set[int] = set()
    out: list[tuple[int, ...]] = []
    for start in range(len(adj)):
        if start in seen:
            continue
        stack, comp = [start], {start}
        while stack:
            for nb in adj[stack.pop()] - comp:
                comp.add(nb)
                stack.append(nb)
        seen |= comp
        out.append(tuple(sorted(comp)))
    return tuple(out)


def _classify(adj: Sequence[set[int]], islands: tuple[tuple[int, ...], ...]) -> Interconnect:
    n = len(adj)
    if not any(adj):
        return Interconnect.PCIE
    if n > 2 and all(len(nb) == n - 1 for nb in adj):
        return Interconnect.NVSWITCH
    if all(len(isl) == 2 for isl in islands):
        return Interconnect.NVLINK_PAIRS
    return Interconnect.NVLINK_ISLANDS


def _parse_numa(token: str, line: int) -> int | None:
    """Lowest NUMA node of an affinity such as ``0``, ``0-1`` or ``0,3-9,11-17``."""
    if token in _NA:
        return None
    ids: list[int] = []
    for part in token.split(","):
        lo, sep, hi = part.partition("-")
        if not _SMALL.fullmatch(lo) or (sep and not _SMALL.fullmatch(hi)):
            raise TopologyParseError(line, f"bad NUMA affinity {token!r}")
        ids.append(int(lo))
    return min(ids)


def parse_nvidia_smi_topo(text: str) -> GpuTopology:
    """Parse the output of ``nvidia-smi topo -m`` (``--matrix``)."""
    rows = [_ANSI.sub("", raw).rstrip("\r") for raw in text.splitlines()]
    header_at = next(
        (k for k, r in enumerate(rows) if r.split() and _GPU.fullmatch(r.split()[0])), None
    )
    if header_at is None:
        first = next((k for k, r in enumerate(rows) if r.strip()), 0)
        raise TopologyParseError(first + 1, "no header row starting with GPU0")
    header_line = header_at + 1
    tokens = rows[header_at].split()
    tail_at = next((k for k, t in enumerate(tokens) if t in ("CPU", "NUMA")), len(tokens))
    devices, tail = tokens[:tail_at], " ".join(tokens[tail_at:])
    trailing = [name for name in _TRAILING if name in tail]
    gpu_cols = [k for k, d in enumerate(devices) if _GPU.fullmatch(d)]
    if [devices[k] for k in gpu_cols] != [f"GPU{k}" for k in range(len(gpu_cols))]:
        raise TopologyParseError(header_line, "GPU columns are not GPU0, GPU1, … in order")
    known = set(devices)
    links: list[list[str]] = []
    numa: list[int | None] = []
    lines: list[int] = []
    end_line = len(rows) + 1
    for k in range(header_at + 1, len(rows)):
        line, cells = k + 1, rows[k].split()
        if not cells or cells[0].rstrip(":") == "Legend":
            end_line = line
            break
        name = cells[0]
        if name not in known:
            raise TopologyParseError(line, f"row {name!r} is not a device of the header")
        if not _GPU.fullmatch(name):
            continue  # a NIC row: its cells mirror the NIC columns of the GPU rows
        want = len(devices) + len(trailing)
        if len(cells) - 1 != want:
            raise TopologyParseError(line, f"{name} has {len(cells) - 1} fields, expected {want}")
        if name != f"GPU{len(links)}":
            raise TopologyParseError(line, f"expected row GPU{len(links)}, got {name}")
        for col, cell in enumerate(cells[1 : len(devices) + 1]):
            why = _check_cell(cell, devices[col] == name)
            if why:
                raise TopologyParseError(line, f"column {devices[col]}: {why}")
        links.append([cells[1 + c] for c in gpu_cols])
        extra = dict(zip(trailing, cells[len(devices) + 1 :], strict=True))
        numa.append(_parse_numa(extra["NUMA Affinity"], line) if "NUMA Affinity" in extra else None)
        lines.append(line)
    if len(links) != len(gpu_cols):
        raise TopologyParseError(
            end_line, f"matrix ends after {len(links)} GPU rows, header has {len(gpu_cols)}"
        )
    return from_matrix(links, numa, lines=lines)


def labels(topo: GpuTopology) -> dict[str, str]:
    """The ``lockstep.dev/`` node labels that ``topology.gpu_layout`` reads back."""
    return {
        INTERCONNECT_LABEL: topo.interconnect.value,
        ISLAND_SIZE_LABEL: str(max(len(isl) for isl in topo.nvlink_islands)),
        NUMA_NODES_LABEL: str(topo.numa_nodes),
        GPUS_PER_NUMA_LABEL: str(topo.gpus_per_numa),
    }
