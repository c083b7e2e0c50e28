"""deploy/ stays consistent with scheduler-config/, the pinned versions and the code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from testbed.bins import REPO, VERSIONS

DEPLOY = REPO / "deploy"


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_configmap_source_is_the_scheduler_config_users_copy() -> None:
    assert (DEPLOY / "scheduler-config.yaml").read_text() == (
        REPO / "scheduler-config" / "lockstep.yaml").read_text()


def test_https_example_differs_only_in_tls() -> None:
    plain = yaml.safe_load((REPO / "scheduler-config" / "lockstep.yaml").read_text())
    https = yaml.safe_load((REPO / "scheduler-config" / "lockstep-https.yaml").read_text())
    ext = https["extenders"][0]
    assert ext.pop("enableHTTPS") is True and ext.pop("tlsConfig")["caFile"]
    ext["urlPrefix"] = ext["urlPrefix"].replace("https://", "http://")
    assert https == plain


def test_deployment_images_probes_and_timeouts() -> None:
    (deploy,) = docs(DEPLOY / "deployment.yaml")
    containers = {c["name"]: c for c in deploy["spec"]["template"]["spec"]["containers"]}
    assert containers["kube-scheduler"]["image"].endswith(":" + VERSIONS["K8S_VERSION"])
    lockstep = containers["lockstep"]
    assert lockstep["livenessProbe"]["exec"]["command"] == ["lockstep", "probe", "/healthz"]
    assert lockstep["readinessProbe"]["exec"]["command"] == ["lockstep", "probe", "/readyz"]
    assert "--host=127.0.0.1" in lockstep["args"]
    env = {e["name"]: e["value"] for e in lockstep["env"]}
    config = yaml.safe_load((DEPLOY / "scheduler-config.yaml").read_text())
    http_timeout = float(config["extenders"][0]["httpTimeout"].rstrip("s"))
    assert float(env["LOCKSTEP_MAX_TIMEOUT"]) < http_timeout


def test_cluster_role_is_exactly_what_lockstep_calls() -> None:
    role = next(d for d in docs(DEPLOY / "rbac.yaml")
                if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "lockstep")
    got = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
           for r in rule["resources"] for v in rule["verbs"]}
    assert got == {
        ("", "nodes", "list"), ("", "nodes", "watch"),
        ("", "pods", "list"), ("", "pods", "watch"), ("", "pods", "patch"),
        ("", "pods/binding", "create"), ("", "events", "create"),
        ("scheduling.x-k8s.io", "podgroups", "list"), ("scheduling.x-k8s.io", "podgroups", "watch"),
        ("scheduling.x-k8s.io", "podgroups/status", "patch"),
        ("scheduling.volcano.sh", "podgroups", "list"),
        ("scheduling.volcano.sh", "podgroups", "watch"),
        ("scheduling.volcano.sh", "podgroups/status", "patch"),
        ("topology.node.k8s.io", "noderesourcetopologies", "list"),
        ("topology.node.k8s.io", "noderesourcetopologies", "watch"),
        ("scheduling.k8s.io", "podgroups", "list"), ("scheduling.k8s.io", "podgroups", "watch"),
        ("scheduling.k8s.io", "workloads", "list"), ("scheduling.k8s.io", "workloads", "watch"),
        ("scheduling.k8s.io", "podgroups/status", "patch"),
    }
