"""deploy/ stays consistent with scheduler-config/, the pinned versions and the code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
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


def webhook_docs() -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in docs(DEPLOY / "webhook" / "webhook.yaml")}


def test_webhook_never_blocks_pod_creation_and_sees_only_lockstep_pods() -> None:
    (hook,) = webhook_docs()["MutatingWebhookConfiguration"]["webhooks"]
    assert hook["failurePolicy"] == "Ignore"
    assert hook["sideEffects"] == "None"
    assert hook["timeoutSeconds"] == 2
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["rules"] == [{"operations": ["CREATE"], "apiGroups": [""],
                              "apiVersions": ["v1"], "resources": ["pods"],
                              "scope": "Namespaced"}]
    assert [c["expression"] for c in hook["matchConditions"]] == [
        "object.spec.schedulerName == 'lockstep'"]
    (excluded,) = hook["namespaceSelector"]["matchExpressions"]
    assert excluded["key"] == "kubernetes.io/metadata.name"
    assert excluded["operator"] == "NotIn"
    assert set(excluded["values"]) == {"kube-system", "lockstep-system"}


def test_webhook_service_certificate_and_sidecar_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    from app.admission import WEBHOOK_PATH

    objs = webhook_docs()
    mwc, svc, cert = (objs[k] for k in ("MutatingWebhookConfiguration", "Service",
                                         "Certificate"))
    service = mwc["webhooks"][0]["clientConfig"]["service"]
    assert service["path"] == WEBHOOK_PATH
    assert (service["name"], service["namespace"]) == (svc["metadata"]["name"],
                                                       svc["metadata"]["namespace"])
    assert service["port"] == svc["spec"]["ports"][0]["port"]
    # cert-manager injects the Certificate's CA; the certificate names the Service.
    assert mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        f"{cert['metadata']['namespace']}/{cert['metadata']['name']}")
    assert f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc" in (
        cert["spec"]["dnsNames"])
    # The sidecar serves it on the Service's target port with the Certificate's Secret.
    (patch,) = docs(DEPLOY / "webhook" / "deployment-patch.yaml")
    pod = patch["spec"]["template"]["spec"]
    (lockstep,) = pod["containers"]
    env = {e["name"]: e["value"] for e in lockstep["env"]}
    (port,) = lockstep["ports"]
    assert port["name"] == svc["spec"]["ports"][0]["targetPort"]
    assert str(port["containerPort"]) == env["LOCKSTEP_WEBHOOK_PORT"]
    (mount,) = lockstep["volumeMounts"]
    assert env["LOCKSTEP_WEBHOOK_CERT"] == mount["mountPath"] + "/tls.crt"
    assert env["LOCKSTEP_WEBHOOK_KEY"] == mount["mountPath"] + "/tls.key"
    (volume,) = pod["volumes"]
    assert volume["name"] == mount["name"]
    assert volume["secret"]["secretName"] == cert["spec"]["secretName"]
    # `lockstep serve` reads those variables as its webhook flags.
    from app import cli

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    parser = cli.argparse.ArgumentParser()
    cli._serve_parser(parser.add_subparsers())
    args = parser.parse_args(["serve"])
    assert (str(args.webhook_port), args.webhook_cert, args.webhook_key) == (
        env["LOCKSTEP_WEBHOOK_PORT"], env["LOCKSTEP_WEBHOOK_CERT"], env["LOCKSTEP_WEBHOOK_KEY"])
    # deploy/ names the base's labels and namespace in the same way.
    (deploy,) = docs(DEPLOY / "deployment.yaml")
    assert svc["spec"]["selector"] == deploy["spec"]["selector"]["matchLabels"]
    assert patch["metadata"]["name"] == deploy["metadata"]["name"]
