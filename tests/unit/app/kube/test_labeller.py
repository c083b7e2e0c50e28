"""``lockstep label-node`` against a fake API server (``tests.fakeapi.Wire``) and saved outputs."""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.kube import labeller
from app.kube.labeller import main
from testbed.bins import REPO
from testbed.certs import make_certs
from tests.fakeapi import Wire

FIXTURES = REPO / "tests" / "fixtures" / "topo"
H100 = str(FIXTURES / "hgx-h100-8gpu.txt")
PAIRS = str(FIXTURES / "pcie-a100-nvlink-pairs.txt")
H100_LABELS = {
    "lockstep.dev/gpu-interconnect": "nvswitch",
    "lockstep.dev/gpus-per-numa": "4",
    "lockstep.dev/nvlink-island-size": "8",
    "lockstep.dev/numa-nodes": "2",
}


class FakeAPI:
    """Records requests; GET returns a node with ``labels``, PATCH answers ``patch_status``."""

    def __init__(self, labels: dict[str, str] | None = None, patch_status: int = 200) -> None:
        self.labels = labels or {"kubernetes.io/hostname": "gpu-1"}
        self.patch_status = patch_status
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.method == "GET":
            return httpx.Response(200, json={"metadata": {"name": "gpu-1", "labels": self.labels}})
        if request.method == "PATCH":
            return httpx.Response(self.patch_status, json={"kind": "Status"})
        return httpx.Response(405)

    @property
    def connect(self) -> Wire:
        return Wire(self)

    @property
    def patches(self) -> list[httpx.Request]:
        return [r for r in self.requests if r.method == "PATCH"]


@pytest.fixture
def kubeconfig(tmp_path: Path) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(
        """
apiVersion: v1
kind: Config
current-context: test
contexts: [{name: test, context: {cluster: c, user: u}}]
clusters: [{name: c, cluster: {server: "https://api.test:6443", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: s3cret}}]
"""
    )
    return str(path)


def no_subprocess(cmd: Sequence[str]) -> str:
    raise AssertionError(f"unexpected command {cmd}")


def test_patches_only_the_lockstep_labels(kubeconfig: str) -> None:
    api = FakeAPI()
    rc = main(
        ["--node-name", "gpu-1", "--topo-file", H100, "--kubeconfig", kubeconfig],
        connect=api.connect,
        run=no_subprocess,
    )
    assert rc == 0
    assert [(r.method, r.url.path) for r in api.requests] == [
        ("GET", "/api/v1/nodes/gpu-1"),
        ("PATCH", "/api/v1/nodes/gpu-1"),
    ]
    patch = api.patches[0]
    assert str(patch.url) == "https://api.test:6443/api/v1/nodes/gpu-1"
    assert patch.headers["content-type"] == "application/merge-patch+json"
    assert patch.headers["authorization"] == "Bearer s3cret"
    assert json.loads(patch.content) == {"metadata": {"labels": H100_LABELS}}


def test_node_name_from_env(kubeconfig: str) -> None:
    api = FakeAPI()
    rc = main(
        ["--source", "file", "--topo-file", PAIRS, "--kubeconfig", kubeconfig],
        connect=api.connect,
        environ={"NODE_NAME": "node-a.example"},
    )
    assert rc == 0
    assert json.loads(api.patches[0].content) == {
        "metadata": {
            "labels": {
                "lockstep.dev/gpu-interconnect": "nvlink-pairs",
                "lockstep.dev/gpus-per-numa": "2",
                "lockstep.dev/nvlink-island-size": "2",
                "lockstep.dev/numa-nodes": "2",
            }
        }
    }
    assert api.patches[0].url.path == "/api/v1/nodes/node-a.example"


def test_no_write_when_labels_already_set(kubeconfig: str) -> None:
    api = FakeAPI(labels={"other": "kept", **H100_LABELS})
    rc = main(
        ["--node-name", "gpu-1", "--topo-file", H100, "--kubeconfig", kubeconfig],
        connect=api.connect,
    )
    assert (rc, [r.method for r in api.requests]) == (0, ["GET"])


def test_dry_run_prints_json_and_calls_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeAPI()
    rc = main(["--dry-run", "--source", "file", "--topo-file", H100], connect=api.connect)
    assert rc == 0
    assert json.loads(capsys.readouterr().out) == H100_LABELS
    assert api.requests == []


def test_nvidia_smi_source_runs_topo_matrix(kubeconfig: str) -> None:
    seen: list[list[str]] = []

    def run(cmd: Sequence[str]) -> str:
        seen.append(list(cmd))
        return Path(H100).read_text()

    api = FakeAPI()
    rc = main(
        ["--node-name", "gpu-1", "--source", "nvidia-smi", "--kubeconfig", kubeconfig],
        connect=api.connect,
        run=run,
    )
    assert (rc, seen) == (0, [["nvidia-smi", "topo", "-m"]])
    assert json.loads(api.patches[0].content) == {"metadata": {"labels": H100_LABELS}}


def failing_run(cmd: Sequence[str]) -> str:
    raise FileNotFoundError(2, "No such file or directory", cmd[0])


def bad_output(cmd: Sequence[str]) -> str:
    return "\tGPU0\tGPU1\nGPU0\t X \tWAT\nGPU1\tWAT\t X \n"


@pytest.mark.parametrize(
    ("args", "run", "patch_status", "want_warning"),
    [
        pytest.param(
            ["--source", "nvidia-smi"], failing_run, 200, "nvidia-smi: ", id="no-nvidia-smi"
        ),
        pytest.param(
            ["--source", "nvidia-smi"], bad_output, 200, "unknown cell 'WAT'", id="parse-error"
        ),
        pytest.param(
            ["--topo-file", "/nonexistent/topo.txt"], no_subprocess, 200, "reading", id="no-file"
        ),
        pytest.param(["--topo-file", H100], no_subprocess, 403, "HTTP 403", id="forbidden"),
    ],
)
@pytest.mark.parametrize(("strict", "want_rc"), [(False, 0), (True, 1)], ids=["lenient", "strict"])
def test_failures_warn_and_leave_labels(
    kubeconfig: str,
    caplog: pytest.LogCaptureFixture,
    args: list[str],
    run: Callable[[Sequence[str]], str],
    patch_status: int,
    want_warning: str,
    strict: bool,
    want_rc: int,
) -> None:
    api = FakeAPI(patch_status=patch_status)
    argv = ["--node-name", "gpu-1", "--kubeconfig", kubeconfig, *args]
    rc = main(argv + (["--strict"] if strict else []), connect=api.connect, run=run)
    assert rc == want_rc
    assert any(want_warning in r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    if patch_status == 200:
        assert api.requests == []


def test_missing_node_name_is_a_warning(kubeconfig: str, caplog: pytest.LogCaptureFixture) -> None:
    api = FakeAPI()
    rc = main(
        ["--topo-file", H100, "--kubeconfig", kubeconfig], connect=api.connect, environ={}
    )
    assert (rc, api.requests) == (0, [])
    assert "no node name" in caplog.text


def test_auto_without_any_source(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("PATH", "")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    rc = main(["--dry-run"])
    assert rc == 0
    assert "nvidia-smi not on PATH" in caplog.text
    assert "nvidia-ml-py" in caplog.text


def test_in_cluster_service_account(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "token").write_text("sa-token\n")
    make_certs(tmp_path)  # the service account's ca.crt, which the client loads
    monkeypatch.setattr("app.kube.client.SA_DIR", tmp_path)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    api = FakeAPI()
    rc = main(["--node-name", "gpu-1", "--topo-file", H100], connect=api.connect)
    assert rc == 0
    assert str(api.patches[0].url) == "https://10.96.0.1:6443/api/v1/nodes/gpu-1"
    assert api.patches[0].headers["authorization"] == "Bearer sa-token"


def test_interval_repeats_until_stopped(kubeconfig: str) -> None:
    api = FakeAPI()
    waits: list[float] = []

    def wait(seconds: float) -> bool:
        waits.append(seconds)
        return len(waits) == 3  # stop after the third round

    rc = main(
        ["--node-name", "gpu-1", "--topo-file", H100, "--kubeconfig", kubeconfig],
        connect=api.connect,
        wait=wait,
    )
    # --interval defaults to 0: one round, no wait.
    assert (rc, waits, len(api.patches)) == (0, [], 1)
    rc = main(
        [
            "--node-name",
            "gpu-1",
            "--topo-file",
            H100,
            "--kubeconfig",
            kubeconfig,
            "--interval",
            "300",
        ],
        connect=api.connect,
        wait=wait,
    )
    assert (rc, waits, len(api.patches)) == (0, [300.0, 300.0, 300.0], 4)


# --- NVML -------------------------------------------------------------------------------------


class FakeNVMLError(Exception):
    pass


def fake_pynvml(bus: list[str], nvlinks: dict[int, list[str]], level: int = 50) -> types.ModuleType:
    """A pynvml stand-in: GPU i has PCI ``bus[i]`` and NVLinks to the PCI ids ``nvlinks[i]``."""
    m = types.ModuleType("pynvml")
    pci = types.SimpleNamespace
    calls: dict[str, Any] = {"shutdown": 0}

    def link_state(h: int, link: int) -> int:
        if link >= len(nvlinks.get(h, [])):
            raise FakeNVMLError("not supported")
        return 1

    m.__dict__.update(
        NVMLError=FakeNVMLError,
        NVML_FEATURE_ENABLED=1,
        NVML_NVLINK_MAX_LINKS=18,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: calls.__setitem__("shutdown", calls["shutdown"] + 1),
        nvmlDeviceGetCount=lambda: len(bus),
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetPciInfo=lambda h: pci(busId=bus[h].encode()),
        nvmlDeviceGetNvLinkState=link_state,
        nvmlDeviceGetNvLinkRemotePciInfo=lambda h, link: pci(busId=nvlinks[h][link]),
        nvmlDeviceGetTopologyCommonAncestor=lambda a, b: level,
        calls=calls,
    )
    return m


GPU_BUS = ["00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0", "00000000:5D:00.0"]
SWITCH = "00000000:C1:00.0"


@pytest.mark.parametrize(
    ("nvlinks", "want_labels"),
    [
        pytest.param(
            {i: [SWITCH] * 18 for i in range(4)},
            {"lockstep.dev/gpu-interconnect": "nvswitch", "lockstep.dev/nvlink-island-size": "4"},
            id="all-to-switch",
        ),
        pytest.param(
            {
                0: [GPU_BUS[1]] * 12,
                1: [GPU_BUS[0]] * 12,
                2: [GPU_BUS[3]] * 12,
                3: [GPU_BUS[2]] * 12,
            },
            {
                "lockstep.dev/gpu-interconnect": "nvlink-pairs",
                "lockstep.dev/nvlink-island-size": "2",
            },
            id="bridged-pairs",
        ),
        pytest.param(
            {},
            {"lockstep.dev/gpu-interconnect": "pcie", "lockstep.dev/nvlink-island-size": "1"},
            id="no-nvlink",
        ),
    ],
)
def test_nvml_source(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    nvlinks: dict[int, list[str]],
    want_labels: dict[str, str],
) -> None:
    fake = fake_pynvml(GPU_BUS, nvlinks)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(labeller, "_sysfs_numa", lambda bus: 0 if bus < "00000000:3A" else 1)
    assert main(["--dry-run", "--source", "nvml"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got == {**want_labels, "lockstep.dev/numa-nodes": "2", "lockstep.dev/gpus-per-numa": "2"}
    assert fake.calls["shutdown"] == 1
