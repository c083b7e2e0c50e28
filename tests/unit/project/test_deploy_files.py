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
        ("", "pods", "get"), ("", "pods", "list"), ("", "pods", "watch"),
        ("", "pods", "patch"), ("", "pods", "delete"), ("", "pods/status", "patch"),
        ("", "pods/eviction", "create"),
        ("policy", "poddisruptionbudgets", "list"), ("policy", "poddisruptionbudgets", "watch"),
        ("scheduling.k8s.io", "priorityclasses", "list"),
        ("scheduling.k8s.io", "priorityclasses", "watch"),
        ("", "pods/binding", "create"), ("", "events", "create"),
        ("scheduling.x-k8s.io", "podgroups", "list"), ("scheduling.x-k8s.io", "podgroups", "watch"),
        ("scheduling.x-k8s.io", "podgroups/status", "patch"),
        ("scheduling.volcano.sh", "podgroups", "list"),
        ("scheduling.volcano.sh", "podgroups", "watch"),
        ("scheduling.volcano.sh", "podgroups/status", "patch"),
        ("scheduling.volcano.sh", "queues", "list"), ("scheduling.volcano.sh", "queues", "watch"),
        ("topology.node.k8s.io", "noderesourcetopologies", "list"),
        ("topology.node.k8s.io", "noderesourcetopologies", "watch"),
        ("jobset.x-k8s.io", "jobsets", "list"), ("jobset.x-k8s.io", "jobsets", "watch"),
        ("leaderworkerset.x-k8s.io", "leaderworkersets", "list"),
        ("leaderworkerset.x-k8s.io", "leaderworkersets", "watch"),
        ("scheduling.k8s.io", "podgroups", "list"), ("scheduling.k8s.io", "podgroups", "watch"),
        ("scheduling.k8s.io", "workloads", "list"), ("scheduling.k8s.io", "workloads", "watch"),
        ("scheduling.k8s.io", "compositepodgroups", "list"),
        ("scheduling.k8s.io", "compositepodgroups", "watch"),
        ("scheduling.k8s.io", "podgroups/status", "patch"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
        *{("resource.k8s.io", r, v) for r in ("deviceclasses", "resourceslices",
                                              "resourceclaims", "resourceclaimtemplates")
          for v in ("list", "watch")},
        ("resource.k8s.io", "resourceclaims/status", "patch"),
    }


def webhook_docs() -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in docs(DEPLOY / "webhook" / "webhook.yaml")}


def test_webhook_never_blocks_pod_creation_and_sees_only_lockstep_pods() -> None:
    hook, claims = webhook_docs()["MutatingWebhookConfiguration"]["webhooks"]
    assert claims["failurePolicy"] == "Ignore" and claims["sideEffects"] == "None"
    assert claims["rules"] == [{"operations": ["CREATE"], "apiGroups": ["resource.k8s.io"],
                                "apiVersions": ["v1"], "resources": ["resourceclaims"],
                                "scope": "Namespaced"}]
    assert claims["clientConfig"]["service"]["path"] == "/mutate/resourceclaims"
    assert hook["failurePolicy"] == "Ignore"
    assert hook["sideEffects"] == "NoneOnDryRun"  # a pin reserves; a dry run does not
    assert hook["timeoutSeconds"] == 2
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["rules"] == [{"operations": ["CREATE"], "apiGroups": [""],
                              "apiVersions": ["v1"], "resources": ["pods"],
                              "scope": "Namespaced"}]
    assert [c["name"] for c in hook["matchConditions"]] == ["lockstep-scheduler",
                                                            "declares-a-gang"]
    assert hook["matchConditions"][0]["expression"] == "object.spec.schedulerName == 'lockstep'"
    (excluded,) = hook["namespaceSelector"]["matchExpressions"]
    assert excluded["key"] == "kubernetes.io/metadata.name"
    assert excluded["operator"] == "NotIn"
    assert set(excluded["values"]) == {"kube-system", "lockstep-system"}


def _serve_args(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], *,
                checked: bool = True) -> Any:
    """What `lockstep serve` makes of the container's environment (``checked``: and that it
    accepts it; files that exist only in the cluster cannot be checked here)."""
    from app import cli

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    parser = cli.argparse.ArgumentParser()
    cli._serve_parser(parser.add_subparsers())
    args = parser.parse_args(["serve"])
    if checked:
        assert cli._webhook_problem(args) is None
    return args


def _lockstep_container(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    (patch,) = docs(path)
    pod = patch["spec"]["template"]["spec"]
    (lockstep,) = pod["containers"]
    return pod, lockstep


def test_webhook_is_installed_by_default_with_a_certificate_lockstep_keeps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from app import cli
    from app.http.webhook import WEBHOOK_PATH

    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert kustomization["components"] == ["webhook"]
    objs = webhook_docs()
    mwc, svc = objs["MutatingWebhookConfiguration"], objs["Service"]
    assert "Certificate" not in objs and "annotations" not in mwc["metadata"]
    service = mwc["webhooks"][0]["clientConfig"]["service"]
    assert service["path"] == WEBHOOK_PATH
    assert "caBundle" not in mwc["webhooks"][0]["clientConfig"]  # Lockstep writes it
    assert (service["name"], service["namespace"]) == (svc["metadata"]["name"],
                                                       svc["metadata"]["namespace"])
    assert service["port"] == svc["spec"]["ports"][0]["port"]
    # The sidecar serves it on the Service's target port, with its own certificate for the
    # Service's names, and keeps that configuration's caBundle.
    pod, lockstep = _lockstep_container(DEPLOY / "webhook" / "deployment-patch.yaml")
    assert "volumes" not in pod
    env = {e["name"]: e["value"] for e in lockstep["env"]}
    (port,) = lockstep["ports"]
    assert port["name"] == svc["spec"]["ports"][0]["targetPort"]
    args = _serve_args(monkeypatch, env)
    assert str(args.webhook_port) == str(port["containerPort"])
    assert args.webhook_cert is None and args.webhook_key is None
    assert args.webhook_configuration == mwc["metadata"]["name"]
    secret_ns, _, secret_name = args.webhook_cert_secret.partition("/")
    assert secret_ns == svc["metadata"]["namespace"]
    assert f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc" in (
        cli._webhook_hosts(args))
    # RBAC: exactly that Secret (create cannot be narrowed by name) and that configuration.
    rbac = {(d["kind"], d["metadata"]["name"]): d
            for d in docs(DEPLOY / "webhook" / "rbac.yaml")}
    role = rbac[("Role", "lockstep-webhook-cert")]
    assert role["metadata"]["namespace"] == secret_ns
    assert [(r["verbs"], r.get("resourceNames")) for r in role["rules"]] == [
        (["create"], None), (["get", "update"], [secret_name])]
    (rule,) = rbac[("ClusterRole", "lockstep-webhook-ca-bundle")]["rules"]
    assert (rule["resources"], rule["resourceNames"], rule["verbs"]) == (
        ["mutatingwebhookconfigurations"], [mwc["metadata"]["name"]], ["get", "patch"])
    (deploy,) = docs(DEPLOY / "deployment.yaml")
    sa = deploy["spec"]["template"]["spec"]["serviceAccountName"]
    for kind in ("RoleBinding", "ClusterRoleBinding"):
        (binding,) = [d for (k, _), d in rbac.items() if k == kind]
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa,
                                        "namespace": deploy["metadata"]["namespace"]}]
    # deploy/ names the base's labels and namespace in the same way.
    assert svc["spec"]["selector"] == deploy["spec"]["selector"]["matchLabels"]
    assert docs(DEPLOY / "webhook" / "deployment-patch.yaml")[0]["metadata"]["name"] == (
        deploy["metadata"]["name"])


def test_cert_manager_component_swaps_in_its_certificate_and_drops_locksteps_rbac(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cm = DEPLOY / "webhook" / "cert-manager"
    objs = {d["kind"]: d for d in docs(cm / "certificate.yaml")}
    cert = objs["Certificate"]
    svc = webhook_docs()["Service"]
    (inject,) = docs(cm / "inject-ca.yaml")
    assert inject["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        f"{cert['metadata']['namespace']}/{cert['metadata']['name']}")
    assert f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc" in (
        cert["spec"]["dnsNames"])
    pod, lockstep = _lockstep_container(cm / "deployment-patch.yaml")
    base_env = {e["name"]: e["value"] for e in _lockstep_container(
        DEPLOY / "webhook" / "deployment-patch.yaml")[1]["env"]}
    env = {**base_env, **{e["name"]: e["value"] for e in lockstep["env"]}}
    args = _serve_args(monkeypatch, env, checked=False)
    assert args.webhook_cert_secret is None
    (mount,) = lockstep["volumeMounts"]
    assert args.webhook_cert == mount["mountPath"] + "/tls.crt"
    assert args.webhook_key == mount["mountPath"] + "/tls.key"
    (volume,) = pod["volumes"]
    assert volume["name"] == mount["name"]
    assert volume["secret"]["secretName"] == cert["spec"]["secretName"]
    own = {(d["kind"], d["metadata"]["name"]) for d in docs(DEPLOY / "webhook" / "rbac.yaml")}
    dropped = {(d["kind"], d["metadata"]["name"]) for d in docs(cm / "drop-own-cert-rbac.yaml")
               if d.get("$patch") == "delete"}
    assert dropped == own


def test_two_replicas_rolled_one_at_a_time_spread_and_kept_by_a_budget() -> None:
    """Two replicas (docs/failover.md): a new pod is Ready before an old one goes, the two
    prefer two nodes, and a drain keeps one."""
    (deploy,) = docs(DEPLOY / "deployment.yaml")
    spec = deploy["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {"type": "RollingUpdate",
                                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    anti = spec["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in anti
    (term,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    labels = spec["template"]["metadata"]["labels"]
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= labels.items()
    (pdb,) = docs(DEPLOY / "pdb.yaml")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["metadata"]["namespace"] == deploy["metadata"]["namespace"]
    assert "pdb.yaml" in yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"]


def test_lockstep_follows_the_lease_its_sidecar_holds_with_the_same_timing() -> None:
    from app.kube.lease import LeaseTiming

    (deploy,) = docs(DEPLOY / "deployment.yaml")
    containers = {c["name"]: c for c in deploy["spec"]["template"]["spec"]["containers"]}
    env = {e["name"]: e["value"] for e in containers["lockstep"]["env"]}
    election = yaml.safe_load((DEPLOY / "scheduler-config.yaml").read_text())["leaderElection"]
    assert election["leaderElect"] is True
    assert env["LOCKSTEP_LEADER_ELECT_LEASE"] == (
        f"{election['resourceNamespace']}/{election['resourceName']}")
    # Lockstep's defaults are the durations the sidecar is given (no env overrides them).
    timing = LeaseTiming()
    assert [float(election[k].rstrip("s")) for k in
            ("leaseDuration", "renewDeadline", "retryPeriod")] == [
        timing.lease_duration, timing.renew_deadline, timing.retry_period]
    assert not {"LOCKSTEP_LEASE_DURATION", "LOCKSTEP_RENEW_DEADLINE",
                "LOCKSTEP_RETRY_PERIOD"} & env.keys()


def test_the_lease_rbac_is_the_one_lease_and_nothing_more() -> None:
    """The sidecar creates, reads and renews the Lease; Lockstep only reads it: get and
    update are limited to its name, create cannot be (RBAC cannot name an object not yet
    created)."""
    role = next(d for d in docs(DEPLOY / "rbac.yaml")
                if d["kind"] == "Role" and d["metadata"]["name"]
                == "lockstep-scheduler-leader-election")
    rules = {(tuple(r["verbs"]), tuple(r.get("resourceNames") or ())) for r in role["rules"]}
    assert rules == {(("create",), ()), (("get", "update"), ("lockstep-scheduler",))}
    assert all(r["apiGroups"] == ["coordination.k8s.io"] and r["resources"] == ["leases"]
               for r in role["rules"])


def _gang_condition() -> Any:
    import celpy

    hook = webhook_docs()["MutatingWebhookConfiguration"]["webhooks"][0]
    (expr,) = [c["expression"] for c in hook["matchConditions"] if c["name"] == "declares-a-gang"]
    env = celpy.Environment()
    prog = env.program(env.compile(expr))
    return lambda obj: bool(prog.evaluate({"object": celpy.json_to_cel(obj)}))


def _pods_declaring() -> list[tuple[str, dict[str, Any]]]:
    """A pod per key and path every convention declares a gang by, each with the value set,
    empty, and absent; plus pods with no metadata maps at all."""
    from coscheduling.gang.gating import declaring_keys

    annotations, labels, paths = declaring_keys()
    out: list[tuple[str, dict[str, Any]]] = [
        ("bare", {"metadata": {}, "spec": {}}),
        ("other keys", {"metadata": {"labels": {"app": "x"}, "annotations": {"a": "b"}},
                        "spec": {"schedulerName": "lockstep"}}),
    ]
    for field, keys in (("annotations", annotations), ("labels", labels)):
        for k in keys:
            for v in ("g", ""):
                out.append((f"{field} {k}={v!r}", {"metadata": {field: {k: v}}, "spec": {}}))
    for path in paths:
        for v in ("g", ""):
            obj: dict[str, Any] = {"metadata": {}}
            node = obj
            for step in path[:-1]:
                node = node.setdefault(step, {})
            node[path[-1]] = v
            out.append((f"{'.'.join(path)}={v!r}", obj))
        out.append((f"{'.'.join(path[:-1])} without {path[-1]}",
                    {"metadata": {}, "spec": {path[1]: {}}}))
    return out


def test_the_webhook_is_sent_exactly_the_pods_that_declare_a_gang() -> None:
    """The API server asks the webhook only about pods its CEL condition picks: exactly the
    pods ``declares_gang`` says name a gang, by every convention's keys (a convention added
    without its key here would have its pods created ungated, never pinned)."""
    from coscheduling.gang.gating import declares_gang

    condition = _gang_condition()
    cases = _pods_declaring()
    assert sum(declares_gang(obj) for _, obj in cases) >= 10
    for name, obj in cases:
        assert condition(obj) == declares_gang(obj), name


def test_the_image_installs_every_package_and_subpackage() -> None:
    """The image is built with ``pip install .`` (deploy/Dockerfile): every package with an
    ``__init__.py`` under app/, coscheduling/ and testbed/ must be in what setuptools installs,
    or the image fails at its first import of a subpackage (a list of the top packages alone
    left out every wing of the core)."""
    import warnings

    from setuptools.config.pyprojecttoml import read_configuration

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = read_configuration(REPO / "pyproject.toml", expand=True)
    installed = set(config["tool"]["setuptools"]["packages"])
    present = {".".join(d.relative_to(REPO).parts)
               for top in ("app", "coscheduling", "testbed")
               for d in [REPO / top, *(REPO / top).rglob("*")]
               if (d / "__init__.py").is_file() and "__pycache__" not in d.parts}
    assert present - installed == set()
