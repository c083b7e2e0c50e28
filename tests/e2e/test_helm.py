"""deploy/helm/lockstep against deploy/ (kustomize): `helm lint`, `helm template` rendering the
same objects as `kubectl kustomize` object by object, values that change what they claim to,
and one `helm install` against the test bed's API server.

The two renderings differ only where the tools do: Helm's bookkeeping labels, and how a
changed scheduler configuration rolls the pods (kustomize hashes the ConfigMap's name, the
chart puts a checksum annotation on the pod template). Those are normalised away; everything
else must be equal, the scheduler configuration compared as parsed YAML.
"""

from __future__ import annotations

import copy
import difflib
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.bins import REPO, bin_path

from .conftest import ClusterFactory

DEPLOY = REPO / "deploy"
CHART = DEPLOY / "helm" / "lockstep"
NS = "lockstep-system"
HELM_LABELS = ("app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "helm.sh/chart")
CHECKSUM = "checksum/scheduler-config"
GENERATED = re.compile(r"^(lockstep-scheduler-config)-[a-z0-9]{10}$")

Obj = dict[str, Any]
Key = tuple[str, str, str, str]


def helm(*args: str, kubeconfig: Path | None = None) -> str:
    argv = [str(bin_path("helm")), *args]
    if kubeconfig is not None:
        argv.append(f"--kubeconfig={kubeconfig}")
    r = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    assert r.returncode == 0, f"helm {' '.join(args)}:\n{r.stdout}\n{r.stderr}"
    return r.stdout


def template(*values: str) -> list[Obj]:
    args = ["template", "lockstep", str(CHART), "-n", NS, "--include-crds"]
    for v in ("namespace.create=true", *values):
        args += ["--set", v]
    return [d for d in yaml.safe_load_all(helm(*args)) if d]


def kustomize(path: Path) -> list[Obj]:
    kubectl = bin_path("kubectl")
    out = subprocess.run([str(kubectl), "kustomize", str(path)], capture_output=True,
                         text=True, check=True, timeout=60).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def key(o: Obj) -> Key:
    m = o["metadata"]
    return (o["apiVersion"], o["kind"], m.get("namespace", ""), m["name"])


def normalise(o: Obj) -> Obj:
    o = copy.deepcopy(o)
    meta = o["metadata"]
    meta["name"] = GENERATED.sub(r"\1", meta["name"])
    for k in HELM_LABELS:
        (meta.get("labels") or {}).pop(k, None)
    if o["kind"] == "ConfigMap":
        o["data"] = {k: yaml.safe_load(v) if k.endswith(".yaml") else v
                     for k, v in o.get("data", {}).items()}
    pod = o.get("spec", {}).get("template")
    if pod is not None:
        annotations = pod["metadata"].get("annotations") or {}
        annotations.pop(CHECKSUM, None)
        if not annotations:
            pod["metadata"].pop("annotations", None)
        spec = pod["spec"]
        spec["containers"] = sorted(spec["containers"], key=lambda c: c["name"])
        for c in spec["containers"]:
            # A strategic-merge patch puts its list entries first; their order means nothing.
            if "env" in c:
                c["env"] = sorted(c["env"], key=lambda e: e["name"])
            if "volumeMounts" in c:
                c["volumeMounts"] = sorted(c["volumeMounts"], key=lambda m: m["mountPath"])
        for v in spec.get("volumes", ()):
            if "configMap" in v:
                v["configMap"]["name"] = GENERATED.sub(r"\1", v["configMap"]["name"])
        spec["volumes"] = sorted(spec.get("volumes", ()), key=lambda v: v["name"])
    return o


def by_key(objs: list[Obj]) -> dict[Key, Obj]:
    out = {key(n): n for n in map(normalise, objs)}
    assert len(out) == len(objs), "two objects with the same kind, namespace and name"
    return out


def assert_same(helm_objs: list[Obj], kustomize_objs: list[Obj]) -> None:
    got, want = by_key(helm_objs), by_key(kustomize_objs)
    assert sorted(got) == sorted(want), (
        f"only in helm: {sorted(set(got) - set(want))}; "
        f"only in kustomize: {sorted(set(want) - set(got))}")
    for k in want:
        if got[k] != want[k]:
            diff = difflib.unified_diff(
                yaml.safe_dump(want[k]).splitlines(), yaml.safe_dump(got[k]).splitlines(),
                "kustomize", "helm", lineterm="")
            pytest.fail(f"{k} differs:\n" + "\n".join(diff), pytrace=False)


def test_helm_lint_is_clean_for_default_and_alternative_values() -> None:
    for values in ((), ("webhook.certManager=true",), ("webhook.enabled=false",
                   "labeller.enabled=false", "schedulerName=gangs")):
        args = ["lint", "--strict", str(CHART)]
        for v in values:
            args += ["--set", v]
        out = helm(*args)
        assert "1 chart(s) linted, 0 chart(s) failed" in out, out


def test_template_renders_the_kustomize_objects() -> None:
    assert_same(template(), kustomize(DEPLOY) + kustomize(DEPLOY / "labeller"))


def test_template_with_cert_manager_renders_the_cert_manager_component(tmp_path: Path) -> None:
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        # kustomize takes only relative paths to other kustomizations
        "resources": [os.path.relpath(DEPLOY, overlay)],
        "components": [os.path.relpath(DEPLOY / "webhook" / "cert-manager", overlay)],
        # what deploy/kustomization.yaml gives its own objects, as when it lists the component
        "labels": [{"pairs": {"app.kubernetes.io/part-of": "lockstep"},
                    "includeSelectors": False}]}))
    want = kustomize(overlay)
    assert any(o["kind"] == "Certificate" for o in want)
    assert_same(template("webhook.certManager=true"), want + kustomize(DEPLOY / "labeller"))


def find(objs: list[Obj], kind: str, name: str) -> Obj:
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


def lockstep_env(objs: list[Obj]) -> dict[str, str]:
    pod = find(objs, "Deployment", "lockstep-scheduler")["spec"]["template"]["spec"]
    (c,) = [c for c in pod["containers"] if c["name"] == "lockstep"]
    return {e["name"]: e.get("value", "") for e in c["env"]}


def test_values_reach_every_place_they_matter() -> None:
    objs = template("schedulerName=gangs", "lockstep.port=9999",
                    "lockstep.topologyLevels[0].name=rack",
                    "lockstep.topologyLevels[0].keys={example.com/rack,lockstep.dev/rack}",
                    "lockstep.topologyLevels[1].name=hostname",
                    "lockstep.topologyLevels[1].keys={kubernetes.io/hostname}",
                    "lockstep.resources.requests.cpu=2",
                    "kubeScheduler.resources.limits.memory=3Gi")
    config = yaml.safe_load(find(objs, "ConfigMap", "lockstep-scheduler-config")["data"][
        "scheduler-config.yaml"])
    assert [p["schedulerName"] for p in config["profiles"]] == ["gangs"]
    assert config["extenders"][0]["urlPrefix"] == "http://127.0.0.1:9999/"
    env = lockstep_env(objs)
    assert env["LOCKSTEP_SCHEDULER_NAME"] == "gangs"
    assert env["LOCKSTEP_TOPOLOGY_LEVELS"] == (
        "rack=example.com/rack,lockstep.dev/rack;hostname=kubernetes.io/hostname")
    hook = find(objs, "MutatingWebhookConfiguration", "lockstep")["webhooks"][0]
    assert hook["matchConditions"][0]["expression"] == "object.spec.schedulerName == 'gangs'"
    pod = find(objs, "Deployment", "lockstep-scheduler")["spec"]["template"]["spec"]
    res = {c["name"]: c["resources"] for c in pod["containers"]}
    assert res["lockstep"]["requests"]["cpu"] == 2
    assert res["kube-scheduler"]["limits"]["memory"] == "3Gi"
    assert "--port=9999" in next(c for c in pod["containers"] if c["name"] == "lockstep")["args"]


def test_webhook_and_labeller_can_be_left_out() -> None:
    objs = template("webhook.enabled=false", "labeller.enabled=false", "lockstep.ui=false")
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objs}
    assert ("MutatingWebhookConfiguration", "lockstep") not in kinds
    assert ("Role", "lockstep-webhook-cert") not in kinds
    assert ("DaemonSet", "lockstep-labeller") not in kinds
    env = lockstep_env(objs)
    assert not any(k.startswith("LOCKSTEP_WEBHOOK") for k in env)
    assert env["LOCKSTEP_UI"] == "false"


def test_a_max_timeout_at_or_above_the_extender_timeout_is_refused() -> None:
    r = subprocess.run([str(bin_path("helm")), "template", "x", str(CHART),
                        "--set", "lockstep.maxTimeout=300"],
                       capture_output=True, text=True, check=False, timeout=60)
    assert r.returncode != 0
    assert "lockstep.maxTimeout must stay below" in r.stderr


def test_helm_install_creates_the_objects(cluster: ClusterFactory) -> None:
    c = cluster("tiny-3x2", lockstep=False)
    bed = c.bed
    bed.kubectl("apply", "--server-side", "-f", str(DEPLOY / "namespace.yaml"))
    out = helm("install", "lockstep", str(CHART), "-n", NS, kubeconfig=bed.kubeconfig)
    assert "STATUS: deployed" in out, out
    for o in template():
        if o["kind"] in ("Namespace", "CustomResourceDefinition"):
            continue  # the namespace was applied above; the test bed installs the CRD itself
        kind = o["kind"].lower()
        ns = o["metadata"].get("namespace")
        args = ["get", kind, o["metadata"]["name"], "-o", "yaml", *(["-n", ns] if ns else [])]
        live = yaml.safe_load(bed.kubectl(*args).stdout)
        labels = live["metadata"].get("labels") or {}
        assert labels.get("app.kubernetes.io/managed-by") == "Helm", (kind, labels)
    status = helm("status", "lockstep", "-n", NS, kubeconfig=bed.kubeconfig)
    assert "STATUS: deployed" in status
    helm("uninstall", "lockstep", "-n", NS, "--wait", kubeconfig=bed.kubeconfig)
    r = bed.kubectl("get", "clusterrole", "lockstep", check=False)
    assert r.returncode != 0 and "NotFound" in r.stderr
