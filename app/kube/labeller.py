"""``lockstep label-node``: publish this node's GPU interconnect and NUMA layout as labels.

Runs as a DaemonSet on GPU nodes (``deploy/labeller/``). Each round reads the GPU connection
matrix (``nvidia-smi topo -m``, NVML through an optional ``pynvml``, or a file), turns it into
labels with the pure ``coscheduling.topology.gpus`` and merge-patches only those labels onto the
Node, skipping the write when they are already there (each write wakes every Node watcher).
It reaches the API server as the rest of Lockstep does: ``app.kube.client.load_config``
(``--kubeconfig``, else the in-cluster service account) and ``app.kube.client.KubeClient``.

The labels are a hint for scoring, never a gate: when data is missing or wrong (no driver, a
parse error, the API refusing) this logs a warning, removes nothing and exits 0, so a broken
labeller can never keep pods off a node. ``--strict`` turns those failures into exit 1.

Seams for tests: ``main`` takes ``connect`` (``app.kube.fasthttp.Connector``), ``run`` (instead
of the subprocess), ``environ`` (for ``NODE_NAME``) and ``wait`` (the interval sleep; return
True to stop).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import yaml

from coscheduling.topology.gpus import (
    NVML_LEVEL_CODES,
    GpuTopology,
    TopologyError,
    from_matrix,
    labels,
    parse_nvidia_smi_topo,
)

from .client import KubeClient, load_config
from .errors import APIError, APIUnreachable, NotFound
from .fasthttp import Connector

__all__ = ["LabellerError", "api_client", "apply_labels", "main", "read_topology"]

log = logging.getLogger("lockstep.labeller")

NVIDIA_SMI_TIMEOUT_SECONDS = 60.0
API_TIMEOUT_SECONDS = 10.0
SOURCES = ("auto", "nvidia-smi", "nvml", "file")

Runner = Callable[[Sequence[str]], str]
Waiter = Callable[[float], bool]


class LabellerError(Exception):
    """A round could not finish; the message says why. Never raised out of ``main``."""


# --- topology sources ---------------------------------------------------------------------


def _run(cmd: Sequence[str]) -> str:
    done = subprocess.run(
        list(cmd), capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_SECONDS, check=False
    )
    if done.returncode != 0:
        raise LabellerError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def from_nvidia_smi(run: Runner) -> GpuTopology:
    try:
        return parse_nvidia_smi_topo(run(["nvidia-smi", "topo", "-m"]))
    except (OSError, subprocess.SubprocessError) as e:
        raise LabellerError(f"nvidia-smi: {e}") from e


def _bus_id(pci: Any) -> str:
    raw = pci.busId
    return (raw.decode() if isinstance(raw, bytes) else str(raw)).upper()


def _sysfs_numa(bus_id: str) -> int | None:
    """NVML bus ids have an 8-digit domain ("00000000:1B:00.0"); sysfs uses 4 and lower case."""
    domain, _, rest = bus_id.partition(":")
    path = Path("/sys/bus/pci/devices") / f"{domain[-4:]}:{rest}".lower() / "numa_node"
    try:
        value = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def from_nvml() -> GpuTopology:
    """Build the matrix nvidia-smi would print from NVML (``pip install nvidia-ml-py``)."""
    try:
        nvml: Any = importlib.import_module("pynvml")
    except ImportError as e:
        raise LabellerError("NVML source needs the nvidia-ml-py package (import pynvml)") from e
    try:
        nvml.nvmlInit()
    except Exception as e:  # pynvml raises NVMLError subclasses built at runtime
        raise LabellerError(f"nvmlInit: {e}") from e
    try:
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        bus = [_bus_id(nvml.nvmlDeviceGetPciInfo(h)) for h in handles]
        index = {b: i for i, b in enumerate(bus)}
        n = len(handles)
        direct = [[0] * n for _ in range(n)]
        to_switch = [0] * n
        for i, h in enumerate(handles):
            for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
                try:
                    if nvml.nvmlDeviceGetNvLinkState(h, link) != nvml.NVML_FEATURE_ENABLED:
                        continue
                    remote = _bus_id(nvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link))
                except nvml.NVMLError:
                    continue  # link not present on this GPU
                j = index.get(remote)
                if j is None:
                    to_switch[i] += 1  # the far end is an NVSwitch, not a GPU
                elif j != i:
                    direct[i][j] += 1
        links = [["X"] * n for _ in range(n)]
        for i in range(n):
            for j in range(n):
                if i == j:
                    continue
                # GPUs wired to NVSwitches all reach each other, as nvidia-smi shows them.
                nvlinks = direct[i][j] or min(to_switch[i], to_switch[j])
                if nvlinks:
                    links[i][j] = f"NV{nvlinks}"
                else:
                    level = int(nvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j]))
                    links[i][j] = NVML_LEVEL_CODES.get(level, "SYS")
        return from_matrix(links, [_sysfs_numa(b) for b in bus])
    except nvml.NVMLError as e:
        raise LabellerError(f"NVML: {e}") from e
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            log.debug("nvmlShutdown failed", exc_info=True)


def read_topology(source: str, topo_file: str | None, run: Runner) -> GpuTopology:
    try:
        if source == "file" or (source == "auto" and topo_file):
            if not topo_file:
                raise LabellerError("--source file needs --topo-file")
            try:
                return parse_nvidia_smi_topo(Path(topo_file).read_text())
            except OSError as e:
                raise LabellerError(f"reading {topo_file}: {e}") from e
        if source == "nvidia-smi":
            return from_nvidia_smi(run)
        if source == "nvml":
            return from_nvml()
        # auto: nvidia-smi prints NUMA affinity too, so it goes first; NVML is the fallback.
        reasons: list[str] = []
        if run is not _run or shutil.which("nvidia-smi"):
            try:
                return from_nvidia_smi(run)
            except (LabellerError, TopologyError) as e:
                reasons.append(str(e))
        else:
            reasons.append("nvidia-smi not on PATH")
        try:
            return from_nvml()
        except LabellerError as e:
            reasons.append(str(e))
        raise LabellerError("no topology source worked: " + "; ".join(reasons))
    except TopologyError as e:
        raise LabellerError(f"unreadable GPU topology: {e}") from e


# --- API access ---------------------------------------------------------------------------


def api_client(kubeconfig: str | None, connect: Connector | None) -> KubeClient:
    """A client from ``app.kube.client.load_config``: the kubeconfig, else the service account."""
    try:
        return KubeClient(load_config(kubeconfig), connect=connect, timeout=API_TIMEOUT_SECONDS)
    except (OSError, ValueError, KeyError, TypeError, StopIteration, yaml.YAMLError) as e:
        raise LabellerError(f"API configuration: {e!r}") from e


async def apply_labels(kube: KubeClient, node_name: str, want: Mapping[str, str]) -> bool:
    """Merge-patch ``want`` onto the node unless already there. True when a PATCH was sent."""
    path = f"/api/v1/nodes/{quote(node_name, safe='')}"
    try:
        try:
            got = await kube.request("GET", path)
        except NotFound:
            raise LabellerError(f"node {node_name!r} not found") from None
        except APIError as e:
            log.warning("GET %s: HTTP %d; patching anyway", path, e.status)
        else:
            have = ((got or {}).get("metadata") or {}).get("labels") or {}
            if all(have.get(k) == v for k, v in want.items()):
                return False
        try:
            await kube.merge_patch(path, {"metadata": {"labels": dict(sorted(want.items()))}})
        except APIError as e:
            raise LabellerError(f"PATCH {path}: HTTP {e.status}: {e.message[:200]}") from e
    except APIUnreachable as e:
        raise LabellerError(f"API server: {e!r}") from e
    return True


# --- command --------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lockstep label-node",
        description="Label this node with its GPU interconnect (NVLink/NVSwitch/PCIe) and NUMA "
        "layout. Failures log a warning and exit 0 unless --strict.",
    )
    p.add_argument("--node-name", help="Node to label (default: $NODE_NAME)")
    p.add_argument("--source", choices=SOURCES, default="auto")
    p.add_argument("--topo-file", help="saved `nvidia-smi topo -m` output (source file)")
    p.add_argument("--dry-run", action="store_true", help="print the labels as JSON, no API")
    p.add_argument("--kubeconfig", help="else the in-cluster service account")
    p.add_argument("--interval", type=float, default=0.0, help="seconds between rounds; 0: once")
    p.add_argument("--strict", action="store_true", help="exit 1 when a round fails")
    return p


def _stop_on_sigterm() -> Waiter:
    """Interval sleep that SIGTERM/SIGINT ends (PID 1 in a container ignores default SIGTERM)."""
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    return stop.wait


def run_once(
    args: argparse.Namespace,
    node_name: str | None,
    *,
    run: Runner,
    connect: Connector | None,
) -> None:
    want = labels(read_topology(args.source, args.topo_file, run))
    if args.dry_run:
        print(json.dumps(want, indent=2, sort_keys=True))
        return
    if not node_name:
        raise LabellerError("no node name: pass --node-name or set NODE_NAME")

    async def label() -> bool:
        kube = api_client(args.kubeconfig, connect)
        try:
            return await apply_labels(kube, node_name, want)
        finally:
            await kube.aclose()

    if asyncio.run(label()):
        log.info("labelled node %s: %s", node_name, want)
    else:
        log.debug("node %s already labelled", node_name)


def main(
    argv: list[str] | None = None,
    *,
    connect: Connector | None = None,
    run: Runner | None = None,
    environ: Mapping[str, str] | None = None,
    wait: Waiter | None = None,
) -> int:
    args = build_parser().parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    env = os.environ if environ is None else environ
    node_name = args.node_name or env.get("NODE_NAME")
    if args.interval > 0 and wait is None:
        wait = _stop_on_sigterm()
    rc = 0
    while True:
        try:
            run_once(args, node_name, run=run or _run, connect=connect)
            rc = 0
        except LabellerError as e:
            log.warning("node labels left unchanged: %s", e)
            rc = 1 if args.strict else 0
        if args.interval <= 0 or wait is None or wait(args.interval):
            return rc
