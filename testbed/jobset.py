"""JobSet's controller on a running test bed.

The real manager, built from its Go module (``hack/gomod/jobset``: ``sigs.k8s.io/jobset``'s
root package, version in ``testbed/versions.env``), run out of a cluster against the bed's API
server. What v0.10.1 needs there, read from its source (``main.go``, ``pkg/config``,
``pkg/util/cert/cert.go``, ``pkg/webhooks``):

- the JobSet CRD (``jobset.x-k8s.io/v1alpha2``, the one version) from the module itself
  (``config/components/crd``), with the conversion webhook its kustomization patches in
  pointed at the manager (one version: the API server never calls it);
- its webhook configurations (``config/components/webhook``: the JobSet defaulting and
  validation webhooks, and the pod webhooks, which the kustomization's patches restrict to
  pods labelled ``jobset.sigs.k8s.io/jobset-name``), named as ``config/default`` names them
  (``jobset-`` prefix), each calling ``https://127.0.0.1:<port>`` with the bed's CA
  (``testbed.controllers``); ``failurePolicy: Fail``;
- a ``Configuration`` (``config.jobset.x-k8s.io/v1alpha1``): no leader election,
  ``internalCertManagement.enable: false`` (the documented switch: ``main.go`` then closes
  ``certsReady`` at once and the webhook server reads ``webhook.certDir``, where the bed's
  pair for 127.0.0.1 is), 127.0.0.1 ports for the webhook and health-probe servers;
  ``--metrics-bind-address=0`` turns the metrics server off (it serves TLS from
  ``/tmp/k8s-metrics-server/serving-certs``, shared by every bed);
- kube-controller-manager's Job controller: JobSet creates batch Jobs, and only the Job
  controller creates their pods (``start_jobset`` starts it unless asked not to).

What JobSet writes that a gang scheduler reads: every pod carries the labels
``jobset.sigs.k8s.io/jobset-name``, ``jobset.sigs.k8s.io/replicatedjob-name``,
``jobset.sigs.k8s.io/job-index`` and the Job's ``batch.kubernetes.io/job-completion-index``,
and the Job is named ``<jobset>-<replicatedJob>-<job index>``. A replicatedJob's
``dependsOn`` (``[{name, status: Ready|Complete}]``) keeps its Jobs uncreated until every Job
of the named replicatedJob is Ready or Complete. The annotation
``alpha.jobset.sigs.k8s.io/exclusive-topology: <node label>`` places each child Job in one
domain of that label: the pod webhook gives the Job's leader pod (completion index 0)
anti-affinity to other Jobs' pods and affinity to its own Job's pods on that key, gives each
follower a ``nodeSelector`` for the leader's domain, and the validating pod webhook refuses a
follower until its leader is bound ("leader pod not yet scheduled ... an expected, transient
error"; the Job controller retries). So a Job under exclusive topology never has all its pods
at once until its leader is bound: a gang over such a Job's pods waits on JobSet, by design.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml

from .bins import bin_path, go_module_dir
from .controllers import apply, crds, serving_certs, webhook_configurations
from .kube import Kube, NotFound
from .runner import KCM_WORKLOAD_CONTROLLERS, Proc, TestBed, free_port

__all__ = ["API", "EXCLUSIVE_TOPOLOGY", "JOBSETS", "JOBSET_LABEL", "JOB_INDEX_LABEL",
           "MODULE", "REPLICATED_JOB_LABEL", "configuration", "jobset", "jobset_pods",
           "module_dir", "pod_template", "replicated_job", "start_jobset"]

MODULE = "sigs.k8s.io/jobset"
API = "jobset.x-k8s.io/v1alpha2"
JOBSETS = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets"
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
NAME_PREFIX = "jobset-"
"""``config/default``'s ``namePrefix``."""


def module_dir() -> Path:
    """The JobSet module in the Go module cache, at the pinned version."""
    return go_module_dir("jobset", MODULE, "jobset")


def configuration(*, webhook_port: int, probe_port: int, cert_dir: Path) -> dict[str, Any]:
    """The manager's Configuration for a bed (the module docstring says why each field)."""
    return {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1", "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{probe_port}"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "clientConnection": {"qps": 50, "burst": 100},
    }


def _wait_webhook(bed: TestBed, timeout: float) -> None:
    """Until the API server calls JobSet's defaulting webhook: a dry-run create of a JobSet
    comes back defaulted (``successPolicy`` set)."""
    probe = jobset("jobset-webhook-probe", [replicated_job("w", pods=1)])

    def defaulted() -> bool:
        try:
            got = kube.request("POST", JOBSETS.format(ns="default"), probe,
                               params={"dryRun": "All"})
        except Exception:  # the webhook not answering yet (failurePolicy: Fail)
            return False
        return bool((got.get("spec") or {}).get("successPolicy"))

    with Kube(bed.api_url, bed.token) as kube:
        kube.wait("the API server calling JobSet's webhook", defaulted, timeout, interval=0.2)


def start_jobset(bed: TestBed, *, name: str = "jobset", timeout: float = 60.0,
                 job_controller: bool = True, extra_args: tuple[str, ...] = ()) -> Proc:
    """Run JobSet's manager against ``bed`` and wait until it is ready (webhook server
    listening: its ``/readyz``) and the API server calls its webhook. ``job_controller``:
    start kube-controller-manager with the Job controller and the garbage collector first
    (``KCM_WORKLOAD_CONTROLLERS``), unless the test already runs it. ``bed.stop()`` stops it
    with the rest; its log is ``<bed dir>/<name>.log``."""
    t0 = time.monotonic()
    if job_controller and "kube-controller-manager" not in bed.procs:
        bed.start_controller_manager(KCM_WORKLOAD_CONTROLLERS)
    webhook, probe = free_port(), free_port()
    url = f"https://127.0.0.1:{webhook}"
    cert_dir = bed.dir / f"{name}-certs"
    ca = serving_certs(cert_dir).ca.read_bytes()
    root = module_dir() / "config" / "components"
    apply(bed, name, [*crds(root / "crd", url, ca),
                      *webhook_configurations(root / "webhook", url, ca, NAME_PREFIX)])
    config = bed.dir / f"{name}.config.yaml"
    config.write_text(yaml.safe_dump(configuration(webhook_port=webhook, probe_port=probe,
                                                   cert_dir=cert_dir)))
    bed.startup_seconds[f"{name}-prerequisites"] = time.monotonic() - t0
    proc = bed._spawn(name, [
        str(bin_path("jobset")), f"--config={config}", f"--kubeconfig={bed.kubeconfig}",
        "--metrics-bind-address=0", "--zap-log-level=2", *extra_args,
    ], ready_url=f"http://127.0.0.1:{probe}/readyz", timeout=timeout, stop_timeout=5.0)
    t1 = time.monotonic()
    _wait_webhook(bed, timeout)
    bed.startup_seconds[f"{name}-webhook"] = time.monotonic() - t1
    return proc


# ------------------------------------------------------------------------------ objects


def pod_template(*, gpus: int = 0, scheduler_name: str | None = "lockstep",
                 labels: dict[str, str] | None = None,
                 annotations: dict[str, str] | None = None,
                 priority_class: str | None = None,
                 container: str = "main") -> dict[str, Any]:
    """A pod template as users write it: one container asking for 1 CPU, 1 Gi and ``gpus``
    GPUs (as limits), ``schedulerName`` unless None."""
    limits = {"cpu": "1", "memory": "1Gi", **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    spec: dict[str, Any] = {
        "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
        "containers": [{"name": container, "image": "registry.invalid/train:latest",
                        "resources": {"limits": limits}}]}
    if scheduler_name:
        spec["schedulerName"] = scheduler_name
    if priority_class:
        spec["priorityClassName"] = priority_class
    meta = {k: v for k, v in (("labels", labels), ("annotations", annotations)) if v}
    return {"metadata": meta, "spec": spec}


def replicated_job(name: str, *, pods: int, replicas: int = 1, gpus: int = 0,
                   depends_on: tuple[tuple[str, str], ...] = (), **template: Any
                   ) -> dict[str, Any]:
    """A replicatedJob of ``replicas`` Jobs of ``pods`` pods each (parallelism and
    completions, indexed); ``depends_on``: ``(replicatedJob, "Ready"|"Complete")`` pairs;
    ``template``: ``pod_template``'s keywords."""
    out: dict[str, Any] = {"name": name, "replicas": replicas, "template": {"spec": {
        "parallelism": pods, "completions": pods, "completionMode": "Indexed",
        "backoffLimit": 0, "template": pod_template(gpus=gpus, **template)}}}
    if depends_on:
        out["dependsOn"] = [{"name": n, "status": s} for n, s in depends_on]
    return out


def jobset(name: str, replicated_jobs: list[dict[str, Any]], *,
           annotations: dict[str, str] | None = None,
           labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if annotations:
        meta["annotations"] = dict(annotations)
    if labels:
        meta["labels"] = dict(labels)
    return {"apiVersion": API, "kind": "JobSet", "metadata": meta,
            "spec": {"replicatedJobs": replicated_jobs}}


def jobset_pods(kube: Kube, ns: str, name: str) -> list[dict[str, Any]]:
    try:
        return kube.pods(ns, labelSelector=f"{JOBSET_LABEL}={name}")
    except NotFound:
        return []
