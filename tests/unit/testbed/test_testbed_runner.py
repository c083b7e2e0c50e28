"""Scheduler configuration for the test bed: only the site-specific fields change."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from testbed import bins
from testbed.bins import REPO
from testbed.runner import WEBHOOK_CONFIG, TestBed, scheduler_config, webhook_configuration


def test_repo_config_keeps_everything_but_addresses() -> None:
    src = yaml.safe_load((REPO / "scheduler-config" / "lockstep.yaml").read_text())
    out = scheduler_config(src, Path("/run/kubeconfig"), "http://127.0.0.1:45678")
    assert out["clientConnection"]["kubeconfig"] == "/run/kubeconfig"
    assert out["leaderElection"]["leaderElect"] is False
    assert [e["urlPrefix"] for e in out["extenders"]] == ["http://127.0.0.1:45678/"]
    for key in ("profiles", "percentageOfNodesToScore", "podInitialBackoffSeconds"):
        assert out[key] == src[key]
    assert {k: v for k, v in out["extenders"][0].items() if k != "urlPrefix"} == {
        k: v for k, v in src["extenders"][0].items() if k != "urlPrefix"}
    assert src["extenders"][0]["urlPrefix"] == "http://127.0.0.1:8888/"  # input untouched


def test_extender_path_and_scheme() -> None:
    src = {"extenders": [{"urlPrefix": "http://lockstep.lockstep-system:8888/verbs/"}]}
    out = scheduler_config(src, Path("k"), "https://127.0.0.1:9999")
    assert out["extenders"][0]["urlPrefix"] == "https://127.0.0.1:9999/verbs/"
    assert scheduler_config(src, Path("k"))["extenders"] == src["extenders"]


def test_default_profile_raises_qps() -> None:
    out = scheduler_config(None, Path("k"))
    assert out["profiles"] == [{"schedulerName": "default-scheduler"}]
    assert out["clientConnection"]["qps"] > 50
    assert out["clientConnection"]["burst"] > 100


def test_missing_binary_says_run_make_bins(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    monkeypatch.setenv("LOCKSTEP_CACHE", str(tmp_path))
    with pytest.raises(bins.BinaryMissing, match="run `make bins`"):
        bins.bin_path("kube-apiserver")
    with pytest.raises(ValueError, match="unknown binary 'kubelet'"):
        bins.bin_path("kubelet")


def test_webhook_configuration_keeps_everything_but_where_to_call() -> None:
    src = next(d for d in yaml.safe_load_all(WEBHOOK_CONFIG.read_text())
               if d and d["kind"] == "MutatingWebhookConfiguration")
    out = webhook_configuration(src, "https://127.0.0.1:4443/", b"PEM", name="lockstep-2")
    assert out["metadata"] == {"name": "lockstep-2"}  # no cert-manager annotation
    hook, claims = out["webhooks"]  # the pod gate, and claim narrowing (docs/dra.md)
    assert hook["clientConfig"] == {"url": "https://127.0.0.1:4443/mutate/pods",
                                    "caBundle": "UEVN"}
    assert claims["clientConfig"]["url"] == "https://127.0.0.1:4443/mutate/resourceclaims"
    assert {k: v for k, v in hook.items() if k != "clientConfig"} == {
        k: v for k, v in src["webhooks"][0].items() if k != "clientConfig"}
    assert "service" in src["webhooks"][0]["clientConfig"]  # input untouched


def test_a_bed_removes_the_directory_it_made_unless_asked_to_keep_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOCKSTEP_KEEP_BED", raising=False)
    with TestBed() as bed:  # never started: only the directory is at stake
        made = bed.dir
        (made / "etcd.log").write_text("x")
    assert not made.exists()
    given = tmp_path / "bed"
    with TestBed(run_dir=given):
        pass
    assert given.is_dir()  # the caller's directory is the caller's
    monkeypatch.setenv("LOCKSTEP_KEEP_BED", "1")
    with TestBed() as bed:
        kept = bed.dir
    assert kept.is_dir()
    shutil.rmtree(kept)


def test_lockstep_is_byte_compiled_before_a_bed_starts_it(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util
    import sys

    from testbed import runner

    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path))  # leave the tree's bytecode be
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # as this machine runs Python
    runner.compile_lockstep.__wrapped__()
    for module in ("app/http/verbs.py", "app/service.py", "coscheduling/core.py"):
        assert Path(importlib.util.cache_from_source(str(runner.REPO / module))).is_file()


def test_composite_pod_group_gate_goes_to_the_api_server_alone(tmp_path: Path) -> None:
    """1.37's kube-scheduler refuses ``CompositePodGroup`` with ``GenericWorkload`` off (the
    bed's), so the gate reaches kube-apiserver only; other gates reach every component."""
    bed = TestBed(run_dir=tmp_path / "bed", k8s="v1.37.2",
                  feature_gates=("CompositePodGroup=true", "DRAPartitionableDevices=true"))
    gates = next(a for a in bed._gate_args() if a.startswith("--feature-gates="))
    assert "CompositePodGroup=true" in gates and "DRAPartitionableDevices=true" in gates
    assert bed._component_gates() == ("DRAPartitionableDevices=true",)
