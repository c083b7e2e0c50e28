"""Kueue (queues and quotas in front of Lockstep) on a running test bed.

The real manager, built from its Go module (``hack/gomod/kueue``, version in
``testbed/versions.env``), run out of a cluster against the test bed's API server. What
v0.17.0 needs there, read from its source (``cmd/kueue/main.go``, ``pkg/util/cert/cert.go``,
``apis/config/v1beta2/defaults.go`` and open-policy-agent/cert-controller v0.16.0's rotator):

- its 11 CRDs, taken from the module itself (``config/components/crd/bases``), with the
  conversion webhook ``config/components/crd/kustomization.yaml`` patches into five of them
  (LocalQueue, ClusterQueue, Cohort, Workload, MultiKueueCluster: v1beta1 and v1beta2 are
  both served) pointed at the manager's ``/convert``;
- its webhook configurations (``config/components/webhook``: ``manifests.yaml`` plus the
  kustomization's namespace selectors), under the names ``config/default`` gives them
  (``kueue-`` prefix), each ``clientConfig`` a URL on the manager's webhook port instead of
  the in-cluster Service. Pod creation calls them with ``failurePolicy: Fail``;
- internal certificate management (Kueue's default): its rotator keeps the Secret
  ``kueue-system/kueue-webhook-server-cert`` (it only updates it, never creates it) and
  injects the Secret's CA into those webhook configurations and CRDs. Out of a cluster two
  things differ, so the bed does them: nothing mounts the Secret into the webhook server's
  certificate directory (the rotator waits for ``<certDir>/tls.crt`` to appear), so the same
  pair is written there; and the API server calls ``https://127.0.0.1:<port>``, so the pair is
  the bed's own (``testbed.certs``) for ``127.0.0.1`` as well as the Service's DNS name. The
  rotator keeps a pair it finds valid 90 days ahead whose CA verifies for the name
  ``kueue-ca`` and whose CA key is PKCS#1, and otherwise replaces it with one for the DNS
  name alone, which the API server would then refuse;
- a ``Configuration`` (``config.kueue.x-k8s.io/v1beta2``, what v0.17.0 ships): no leader
  election, 127.0.0.1 ports for its webhook, health-probe and metrics servers, a per-bed
  certificate directory (the default ``/tmp/k8s-webhook-server/serving-certs`` would be shared
  by every bed), the ``pod`` integration listed explicitly (``batch/job`` is the default), the
  namespace selector excluding ``kube-system`` and ``kueue-system``, and the
  ``VisibilityOnDemand`` feature off: its aggregated API server writes certificates to
  ``/visibility`` and binds :8082 on every bed.

Kueue's pod integration: a pod labelled ``kueue.x-k8s.io/queue-name`` is created with the
scheduling gates ``kueue.x-k8s.io/admission`` and (TopologyAwareScheduling is on by default)
``kueue.x-k8s.io/topology``, the finalizer ``kueue.x-k8s.io/managed`` and the label
``kueue.x-k8s.io/managed: "true"``. Once ``pod-group-total-count`` pods of a group exist,
one Workload (``kueue.x-k8s.io/v1beta2``) stands for the group; when Kueue admits it, both
gates come off every pod at once and kube-scheduler (Lockstep's profile) takes over.

Kubeflow's PyTorchJob (``kubeflow.org/v1``) is one of v0.17.0's integrations
(``pkg/controller/jobs/kubeflow/jobs/pytorchjob``, framework ``kubeflow.org/pytorchjob``):
``start_kueue(bed, frameworks=("pod", PYTORCHJOB))`` turns it on. Kueue's webhook suspends a
job labelled with a queue name (``runPolicy.suspend``) and admission unsuspends it; the
training-operator creates no pod (and no PodGroup) while a job is suspended.

Fair sharing: ``start_kueue(bed, fair_sharing=FAIR_SHARING_STRATEGIES)``. In v1beta2 the
Configuration's ``fairSharing`` has no ``enable``: the section being there turns it on
(``pkg/scheduler/preemption/fairsharing/strategy.go``, ``Enabled``; v1beta1's
``enable: true`` converts to it). ``cluster_queue(..., weight=...)`` is
``spec.fairSharing.weight``.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from .bins import bin_path, go_module_dir
from .certs import Certs, make_certs
from .kube import Conflict, Kube, KubeError, NotFound
from .runner import Proc, TestBed, free_port
from .workloads import RUNTIME_ANNOTATION  # a running pod Succeeds that many seconds later

__all__ = ["ADMISSION_GATE", "API", "FAIR_SHARING_STRATEGIES", "GROUP_LABEL", "NAMESPACE",
           "PYTORCHJOB", "QUEUE_LABEL", "RUNTIME_ANNOTATION", "TOPOLOGY_GATE",
           "TOTAL_ANNOTATION", "WORKLOADS", "cluster_queue", "configuration", "crd_docs",
           "create", "group_pods", "local_queue", "module_dir", "resource_flavor",
           "start_kueue", "webhook_configurations", "workload_admitted", "workloads"]

MODULE = "sigs.k8s.io/kueue"
NAMESPACE = "kueue-system"
"""``Configuration.namespace``'s default outside a cluster: where the rotator's Secret is."""
SERVICE = "kueue-webhook-service"
SECRET = "kueue-webhook-server-cert"
CA_NAME = "kueue-ca"
"""The name the rotator verifies a CA for (``caName`` in pkg/util/cert/cert.go)."""
NAME_PREFIX = "kueue-"
"""config/default's ``namePrefix``: the rotator injects into ``kueue-mutating-webhook-
configuration`` and ``kueue-validating-webhook-configuration``."""
CERT_DAYS = 365
"""Longer than the rotator's 90-day lookahead, or it replaces the pair at once."""

API = "kueue.x-k8s.io/v1beta2"
WORKLOADS = "/apis/kueue.x-k8s.io/v1beta2/namespaces/{ns}/workloads"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
TOTAL_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
ADMISSION_GATE = "kueue.x-k8s.io/admission"
PYTORCHJOB = "kubeflow.org/pytorchjob"
"""The PyTorchJob integration's framework name (``integrations.frameworks``)."""
FAIR_SHARING_STRATEGIES = ("LessThanOrEqualToFinalShare", "LessThanInitialShare")
"""The preemption strategies Kueue's fair-sharing docs configure (``site/content/en/docs/
concepts/preemption.md``, "Fair Sharing"), also what v1beta1's ``enable: true`` defaults to."""

TOPOLOGY_GATE = "kueue.x-k8s.io/topology"

_PATHS = {"ResourceFlavor": "/apis/kueue.x-k8s.io/v1beta2/resourceflavors",
          "ClusterQueue": "/apis/kueue.x-k8s.io/v1beta2/clusterqueues",
          "LocalQueue": "/apis/kueue.x-k8s.io/v1beta2/namespaces/{ns}/localqueues"}


def module_dir() -> Path:
    """The Kueue module in the Go module cache, at the pinned version (downloaded and checked
    against hack/gomod/kueue/go.sum if absent)."""
    return go_module_dir("kueue", MODULE, "kueue")


_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's loader when PyYAML has it: the CRDs are ~1 MB of YAML, 1 s for the pure one."""


def _load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.load_all(path.read_text(), Loader=_Loader) if d]


def _kustomization(component: str) -> tuple[Path, dict[str, Any]]:
    d = module_dir() / "config" / "components" / component
    return d, _load(d / "kustomization.yaml")[0]


def _url(base: str, service: dict[str, Any]) -> dict[str, Any]:
    """A ``clientConfig`` calling ``base`` at the in-cluster Service's path."""
    return {"url": base.rstrip("/") + str(service.get("path") or "/")}


def crd_docs(webhook_url: str) -> list[dict[str, Any]]:
    """The CRDs as ``config/components/crd`` builds them: the bases, with the conversion
    webhook its kustomization patches in (uncommented patches only) calling ``webhook_url``."""
    d, kust = _kustomization("crd")
    docs = {doc["metadata"]["name"]: doc
            for f in kust["resources"] for doc in _load(d / f)}
    for patch in kust.get("patches") or ():
        for p in _load(d / patch["path"]):
            conversion = copy.deepcopy(p["spec"]["conversion"])
            hook = conversion["webhook"]
            hook["clientConfig"] = _url(webhook_url, hook["clientConfig"]["service"])
            docs[p["metadata"]["name"]]["spec"]["conversion"] = conversion
    return list(docs.values())


def webhook_configurations(webhook_url: str) -> list[dict[str, Any]]:
    """``config/components/webhook``'s Mutating- and ValidatingWebhookConfiguration as
    Kueue's install has them (the kustomization's patches applied, ``kueue-`` names), every
    webhook calling ``webhook_url`` at its Service path. No ``caBundle``: the rotator sets it."""
    d, kust = _kustomization("webhook")
    out = [doc for f in kust["resources"] for doc in _load(d / f)
           if doc["kind"].endswith("WebhookConfiguration")]
    by_kind = {doc["kind"]: doc for doc in out}
    for patch in kust.get("patches") or ():
        for p in yaml.safe_load_all(patch["patch"]):
            hooks = {h["name"]: h for h in by_kind[p["kind"]]["webhooks"]}
            for h in p.get("webhooks") or ():
                hooks[h["name"]].update({k: v for k, v in h.items() if k != "name"})
    for doc in out:
        doc["metadata"]["name"] = NAME_PREFIX + doc["metadata"]["name"]
        for hook in doc["webhooks"]:
            hook["clientConfig"] = _url(webhook_url, hook["clientConfig"]["service"])
    return out


def configuration(*, webhook_port: int, probe_port: int, metrics_port: int, cert_dir: Path,
                  frameworks: tuple[str, ...] = ("pod",),
                  fair_sharing: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The manager's Configuration for a bed (see the module docstring for each choice);
    ``fair_sharing``: turn fair sharing on with these preemption strategies."""
    cfg: dict[str, Any] = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{probe_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": True, "webhookServiceName": SERVICE,
                                   "webhookSecretName": SECRET},
        "clientConnection": {"qps": 50, "burst": 100},
        "integrations": {"frameworks": list(frameworks)},
        "managedJobsNamespaceSelector": {"matchExpressions": [{
            "key": "kubernetes.io/metadata.name", "operator": "NotIn",
            "values": ["kube-system", NAMESPACE]}]},
        "featureGates": {"VisibilityOnDemand": False},
    }
    if fair_sharing is not None:
        cfg["fairSharing"] = {"preemptionStrategies": list(fair_sharing)}
    return cfg


def _pkcs1(key: Path) -> bytes:
    """The key as ``RSA PRIVATE KEY`` (the rotator parses its CA key as PKCS#1 only; OpenSSL 3
    writes PKCS#8, OpenSSL 1.1's ``rsa`` has no ``-traditional`` and writes PKCS#1)."""
    for extra in (("-traditional",), ()):
        out = subprocess.run(["openssl", "rsa", "-in", str(key), *extra], capture_output=True,
                             check=False)
        if out.returncode == 0 and b"BEGIN RSA PRIVATE KEY" in out.stdout:
            return out.stdout
    raise RuntimeError(f"openssl could not write {key} as PKCS#1")


def _serving_certs(cert_dir: Path) -> Certs:
    """The webhook server's pair, for the Service's DNS name (what the rotator checks) and
    127.0.0.1 (what the API server calls), in the certificate directory the manager reads."""
    return make_certs(cert_dir, cn=f"{SERVICE}.{NAMESPACE}.svc",
                      dns=(f"{SERVICE}.{NAMESPACE}.svc",), days=CERT_DAYS,
                      ca_cn=CA_NAME, ca_dns=(CA_NAME,))


def _prerequisites(bed: TestBed, webhook_url: str, certs: Certs) -> None:
    """CRDs, namespace, the rotator's Secret (holding the bed's pair) and the webhook
    configurations."""
    docs = [*crd_docs(webhook_url), *webhook_configurations(webhook_url)]
    bed.kubectl("apply", "--server-side", "-f", "-",
                input=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
    secret = {"metadata": {"name": SECRET}, "type": "Opaque", "data": {
        k: base64.b64encode(v).decode("ascii") for k, v in (
            ("ca.crt", certs.ca.read_bytes()), ("ca.key", _pkcs1(certs.ca.with_name("ca.key"))),
            ("tls.crt", certs.cert.read_bytes()), ("tls.key", certs.key.read_bytes()))}}
    with Kube(bed.api_url, bed.token) as kube:
        for path, obj in (("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}}),
                          (f"/api/v1/namespaces/{NAMESPACE}/secrets", secret)):
            with contextlib.suppress(Conflict):  # already there (a restarted manager)
                kube.create(path, obj)
        names = [d["metadata"]["name"] for d in docs if d["kind"] == "CustomResourceDefinition"]
        kube.wait("Kueue's CRDs Established", lambda: all(any(
            c.get("type") == "Established" and c.get("status") == "True"
            for c in (kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{n}")
                      .get("status") or {}).get("conditions") or ()) for n in names), 30)


def _wait_webhook(bed: TestBed, timeout: float) -> None:
    """Until the API server calls Kueue's pod webhook: a server-side dry-run create of a pod
    with a queue name, in a namespace Kueue manages, comes back gated."""
    probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "kueue-webhook-probe", "labels": {QUEUE_LABEL: "probe"}},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/probe:latest"}]}}

    def gated() -> bool:
        try:
            created = kube.request("POST", "/api/v1/namespaces/default/pods", probe,
                                   params={"dryRun": "All"})
        except KubeError:  # the webhook not answering yet (failurePolicy: Fail)
            return False
        return any(g.get("name") == ADMISSION_GATE
                   for g in created["spec"].get("schedulingGates") or ())

    with Kube(bed.api_url, bed.token) as kube:
        kube.wait("the API server calling Kueue's pod webhook", gated, timeout, interval=0.2)


def start_kueue(bed: TestBed, *, name: str = "kueue", timeout: float = 90.0,
                frameworks: tuple[str, ...] = ("pod",),
                fair_sharing: tuple[str, ...] | None = None,
                extra_args: tuple[str, ...] = ()) -> Proc:
    """Run Kueue's manager against ``bed`` and wait until it is ready (certificates taken,
    CA injected, webhook server listening: its ``/readyz``) and the API server calls its pod
    webhook. ``bed.stop()`` stops it with the rest; its log is ``<bed dir>/<name>.log``.
    ``bed.startup_seconds`` gets ``<name>-prerequisites`` (certificates, CRDs, webhook
    configurations), ``<name>`` (process start to ready) and ``<name>-webhook`` (ready to
    the API server calling it)."""
    t0 = time.monotonic()
    webhook, probe, metrics = free_port(), free_port(), free_port()
    webhook_url = f"https://127.0.0.1:{webhook}"
    cert_dir = bed.dir / f"{name}-certs"
    certs = _serving_certs(cert_dir)
    _prerequisites(bed, webhook_url, certs)
    config = bed.dir / f"{name}.config.yaml"
    config.write_text(yaml.safe_dump(configuration(
        webhook_port=webhook, probe_port=probe, metrics_port=metrics, cert_dir=cert_dir,
        frameworks=frameworks, fair_sharing=fair_sharing)))
    bed.startup_seconds[f"{name}-prerequisites"] = time.monotonic() - t0
    proc = bed._spawn(name, [
        str(bin_path("kueue")), f"--config={config}", f"--kubeconfig={bed.kubeconfig}",
        "--zap-log-level=2", *extra_args,
    ], ready_url=f"http://127.0.0.1:{probe}/readyz", timeout=timeout,
       env={**os.environ, "TMPDIR": str(bed.dir / f"{name}-tmp")}, stop_timeout=5.0)
    t1 = time.monotonic()
    _wait_webhook(bed, timeout)
    bed.startup_seconds[f"{name}-webhook"] = time.monotonic() - t1
    return proc


# ------------------------------------------------------------------------ queues and quotas


def resource_flavor(name: str = "default-flavor",
                    node_labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A ResourceFlavor; without ``node_labels`` it adds nothing to the pods Kueue admits."""
    spec: dict[str, Any] = {"nodeLabels": dict(node_labels)} if node_labels else {}
    return {"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": name},
            "spec": spec}


def cluster_queue(name: str, *, gpus: int, cpu: str = "64", memory: str = "256Gi",
                  flavor: str = "default-flavor", cohort: str | None = None,
                  reclaim_within_cohort: str | None = None,
                  within_cluster_queue: str | None = None,
                  weight: str | None = None) -> dict[str, Any]:
    """A ClusterQueue with nominal quotas of ``nvidia.com/gpu``, cpu and memory in one
    flavor, for every namespace. ``cohort``: its cohort (``cohortName`` in v1beta2, ``cohort``
    in v1beta1), whose members lend each other unused quota (no borrowing or lending limits);
    ``reclaim_within_cohort`` and ``within_cluster_queue``: its preemption policies
    (``Never``, ``LowerPriority``, ``LowerOrNewerEqualPriority``, ``Any``); ``weight``: its
    fair-sharing weight (``spec.fairSharing.weight``, a quantity; 1 when unset)."""
    spec: dict[str, Any] = {
        "namespaceSelector": {},
        "resourceGroups": [{
            "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
            "flavors": [{"name": flavor, "resources": [
                {"name": "cpu", "nominalQuota": cpu},
                {"name": "memory", "nominalQuota": memory},
                {"name": "nvidia.com/gpu", "nominalQuota": gpus},
            ]}],
        }],
    }
    if cohort:
        spec["cohortName"] = cohort
    preemption = {k: v for k, v in (("reclaimWithinCohort", reclaim_within_cohort),
                                    ("withinClusterQueue", within_cluster_queue)) if v}
    if preemption:
        spec["preemption"] = preemption
    if weight is not None:
        spec["fairSharing"] = {"weight": weight}
    return {"apiVersion": API, "kind": "ClusterQueue", "metadata": {"name": name},
            "spec": spec}


def local_queue(name: str, cluster_queue: str) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "LocalQueue", "metadata": {"name": name},
            "spec": {"clusterQueue": cluster_queue}}


def create(kube: Kube, obj: dict[str, Any], ns: str | None = None) -> dict[str, Any]:
    """Create a ResourceFlavor, ClusterQueue or LocalQueue (in ``ns``) and, for the queues,
    wait until Kueue reports it Active (it admits nothing before)."""
    kind = obj["kind"]
    path = _PATHS[kind].format(ns=ns)
    created = dict(kube.create(path, obj))
    if kind != "ResourceFlavor":
        item = f"{path}/{obj['metadata']['name']}"
        kube.wait(f"{kind} {obj['metadata']['name']} Active", lambda: any(
            c.get("type") == "Active" and c.get("status") == "True"
            for c in (kube.get(item).get("status") or {}).get("conditions") or ()), 30)
    return created


def group_pods(group: str, size: int, queue: str, *, gpus: int = 1,
               priority_class: str | None = None,
               runtime_seconds: int | None = None) -> list[dict[str, Any]]:
    """``size`` pods ``<group>-0..`` as users write them for Kueue's pod-group integration:
    the queue and group labels, the total-count annotation, ``schedulerName: lockstep``,
    ``gpus`` GPUs, 1 CPU and 1 Gi each. No gate: Kueue's webhook adds its own.
    ``runtime_seconds``: each pod Succeeds that long after it starts running."""
    out = []
    for i in range(size):
        spec: dict[str, Any] = {
            "schedulerName": "lockstep", "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": "registry.invalid/train:latest",
                            "resources": {"limits": {"cpu": "1", "memory": "1Gi",
                                                     "nvidia.com/gpu": str(gpus)}}}],
        }
        if priority_class:
            spec["priorityClassName"] = priority_class
        out.append({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": f"{group}-{i}", "labels": {QUEUE_LABEL: queue, GROUP_LABEL: group},
            "annotations": {TOTAL_ANNOTATION: str(size), **(
                {RUNTIME_ANNOTATION: str(runtime_seconds)} if runtime_seconds else {})}},
            "spec": spec})
    return out


def workloads(kube: Kube, ns: str) -> list[dict[str, Any]]:
    try:
        return kube.list(WORKLOADS.format(ns=ns))
    except NotFound:
        return []


def workload_admitted(wl: dict[str, Any]) -> bool:
    return any(c.get("type") == "Admitted" and c.get("status") == "True"
               for c in (wl.get("status") or {}).get("conditions") or ())
