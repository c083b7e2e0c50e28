"""Kubeflow Trainer v2's controller manager on a running test bed.

The real manager, built from its Go module (``hack/gomod/trainer``:
``github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager``, version in
``testbed/versions.env``), run out of a cluster against the bed's API server. What v2.1.0
needs there, read from its source (``cmd/trainer-controller-manager/main.go``,
``pkg/config``, ``pkg/runtime/framework/plugins``, ``manifests/base``):

- its three CRDs (TrainJob, TrainingRuntime, ClusterTrainingRuntime;
  ``trainer.kubeflow.org/v1alpha1``) from the module itself (``manifests/base/crds``);
- its ValidatingWebhookConfiguration (``manifests/base/webhook``, renamed by its patch to
  ``validator.trainer.kubeflow.org``: the runtimes and TrainJobs are validated) calling
  ``https://127.0.0.1:<port>`` with the bed's CA (``testbed.controllers``);
- a ``Configuration`` (``config.trainer.kubeflow.org/v1alpha1``): ``certManagement.enable:
  false`` (the documented switch: "certificates must be provided externally"), so its webhook
  server reads controller-runtime's default directory,
  ``$TMPDIR/k8s-webhook-server/serving-certs`` (a per-bed TMPDIR holding the bed's pair for
  127.0.0.1); ``webhook.host`` must be set (``pkg/config`` dereferences it); no leader
  election; health probes on a 127.0.0.1 port; ``metrics.bindAddress: "0"`` (off);
- JobSet's controller (``testbed.jobset``): a TrainJob becomes a JobSet named after it, and
  ``start_trainer`` starts JobSet first unless asked not to; the scheduler-plugins PodGroup
  CRD (the bed applies it): without it the CoScheduling plugin logs "PodGroup CRDs must be
  installed in advance" and builds no PodGroup. Volcano's PodGroup CRD is optional likewise.

What Trainer writes: the runtime's ``template`` is the JobSet's spec; its replicatedJobs are
told apart by the label ``trainer.kubeflow.org/trainjob-ancestor-step`` (``dataset-
initializer``, ``model-initializer``, ``trainer``), and the trainer step's container must be
named ``node`` (its replicas come from ``mlPolicy.numNodes``, or the TrainJob's
``trainer.numNodes``). With ``podGroupPolicy.coscheduling`` the CoScheduling plugin creates
one ``scheduling.x-k8s.io/v1alpha1`` PodGroup named after the TrainJob, owned by it, with
``minMember`` the sum of every replicatedJob's pod count (initializers included) and
``minResources`` their summed requests, and labels every pod
``scheduling.x-k8s.io/pod-group: <trainjob>``. Trainer writes no ``schedulerName``: the
runtime's pod templates carry it. A replicatedJob's ``dependsOn`` (the trainer step on the
initializers, ``status: Complete``) is JobSet's: the trainer nodes' Job is created only once
every initializer Job has completed, so a PodGroup counting both never sees all its members.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import yaml

from .bins import bin_path, go_module_dir
from .controllers import apply, crds, serving_certs, webhook_configurations
from .jobset import JOBSET_LABEL, REPLICATED_JOB_LABEL, start_jobset
from .kube import Kube
from .runner import Proc, TestBed, free_port
from .workloads import RUNTIME_ANNOTATION

__all__ = ["ANCESTOR_LABEL", "API", "CLUSTER_RUNTIMES", "MODULE", "RUNTIMES", "TRAINJOBS",
           "configuration", "module_dir", "start_trainer", "train_job", "training_runtime",
           "trainjob_pods"]

MODULE = "github.com/kubeflow/trainer/v2"
API = "trainer.kubeflow.org/v1alpha1"
TRAINJOBS = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs"
RUNTIMES = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainingruntimes"
CLUSTER_RUNTIMES = "/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"


def module_dir() -> Path:
    """The Trainer module in the Go module cache, at the pinned version."""
    return go_module_dir("trainer", MODULE, "trainer")


def configuration(*, webhook_port: int, probe_port: int) -> dict[str, Any]:
    """The manager's Configuration for a bed (the module docstring says why each field)."""
    return {
        "apiVersion": "config.trainer.kubeflow.org/v1alpha1", "kind": "Configuration",
        "health": {"healthProbeBindAddress": f"127.0.0.1:{probe_port}"},
        "metrics": {"bindAddress": "0", "secureServing": False},
        "webhook": {"host": "127.0.0.1", "port": webhook_port},
        "leaderElection": {"leaderElect": False, "resourceName": "trainer.kubeflow.org",
                           "leaseDuration": "15s", "renewDeadline": "10s",
                           "retryPeriod": "2s"},
        "certManagement": {"enable": False},
        "clientConnection": {"qps": 50, "burst": 100},
    }


def _wait_webhook(bed: TestBed, timeout: float) -> None:
    """Until the API server calls Trainer's webhook: a dry-run create of a TrainJob naming a
    runtime that does not exist is refused by it (not by the API server's own checks)."""
    probe = train_job("trainer-webhook-probe", "no-such-runtime")

    def answering() -> bool:
        try:
            kube.request("POST", TRAINJOBS.format(ns="default"), probe,
                         params={"dryRun": "All"})
        except Exception as e:  # the refusal's words say who refused
            return "no-such-runtime" in str(e) and "failed calling webhook" not in str(e)
        return True

    with Kube(bed.api_url, bed.token) as kube:
        kube.wait("the API server calling Trainer's webhook", answering, timeout,
                  interval=0.2)


def start_trainer(bed: TestBed, *, name: str = "trainer", timeout: float = 60.0,
                  jobset: bool = True, extra_args: tuple[str, ...] = ()) -> Proc:
    """Run Trainer's controller manager against ``bed`` (``jobset``: JobSet's controller and
    kube-controller-manager's Job controller first, ``testbed.jobset.start_jobset``) and wait
    until it is ready and the API server calls its webhook. ``bed.stop()`` stops it with the
    rest; its log is ``<bed dir>/<name>.log``."""
    if jobset and "jobset" not in bed.procs:
        start_jobset(bed)
    t0 = time.monotonic()
    webhook, probe = free_port(), free_port()
    url = f"https://127.0.0.1:{webhook}"
    tmpdir = bed.dir / f"{name}-tmp"
    ca = serving_certs(tmpdir / "k8s-webhook-server" / "serving-certs").ca.read_bytes()
    root = module_dir() / "manifests" / "base"
    apply(bed, name, [*crds(root / "crds", url, ca),
                      *webhook_configurations(root / "webhook", url, ca)])
    config = bed.dir / f"{name}.config.yaml"
    config.write_text(yaml.safe_dump(configuration(webhook_port=webhook, probe_port=probe)))
    bed.startup_seconds[f"{name}-prerequisites"] = time.monotonic() - t0
    proc = bed._spawn(name, [
        str(bin_path("trainer")), f"--config={config}", f"--kubeconfig={bed.kubeconfig}",
        "--zap-log-level=2", *extra_args,
    ], ready_url=f"http://127.0.0.1:{probe}/readyz", timeout=timeout,
       env={**os.environ, "TMPDIR": str(tmpdir)}, stop_timeout=5.0)
    t1 = time.monotonic()
    _wait_webhook(bed, timeout)
    bed.startup_seconds[f"{name}-webhook"] = time.monotonic() - t1
    return proc


# ------------------------------------------------------------------------------ objects


def _job(name: str, step: str, container: str, *, pods: int, gpus: int,
         scheduler_name: str | None, runtime_seconds: int | None,
         priority_class: str | None) -> dict[str, Any]:
    limits = {"cpu": "1", "memory": "1Gi", **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    spec: dict[str, Any] = {
        "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
        "containers": [{"name": container, "image": "registry.invalid/train:latest",
                        "resources": {"limits": limits}}]}
    if scheduler_name:
        spec["schedulerName"] = scheduler_name
    if priority_class:
        spec["priorityClassName"] = priority_class
    pod_meta = {"annotations": {RUNTIME_ANNOTATION: str(runtime_seconds)}} \
        if runtime_seconds else {}
    return {"name": name, "template": {
        "metadata": {"labels": {ANCESTOR_LABEL: step}},
        "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0,
                 "template": {"metadata": pod_meta, "spec": spec}}}}


def training_runtime(name: str, *, nodes: int, gpus: int = 1,
                     scheduler_name: str | None = "lockstep", coscheduling: bool = True,
                     initializer_seconds: int | None = None,
                     schedule_timeout: int = 120,
                     priority_class: str | None = None) -> dict[str, Any]:
    """A namespaced TrainingRuntime as users write one: a torch ``mlPolicy`` of ``nodes``
    nodes, a ``node`` replicatedJob (the trainer step: container ``node``, ``gpus`` GPUs a
    node) and, with ``coscheduling``, ``podGroupPolicy.coscheduling``. Every pod template
    says ``schedulerName``. ``initializer_seconds``: a ``dataset-initializer`` replicatedJob
    of one pod (no GPU) that Succeeds that many seconds after it runs (the bed's kwok stage),
    with the trainer step's ``dependsOn`` it ``Complete``, as Trainer's torchtune runtimes
    have it."""
    jobs = []
    if initializer_seconds is not None:
        jobs.append(_job("dataset-initializer", "dataset-initializer", "dataset-initializer",
                         pods=1, gpus=0, scheduler_name=scheduler_name,
                         runtime_seconds=initializer_seconds, priority_class=priority_class))
    node = _job("node", "trainer", "node", pods=1, gpus=gpus, scheduler_name=scheduler_name,
                runtime_seconds=None, priority_class=priority_class)
    if initializer_seconds is not None:
        node["dependsOn"] = [{"name": "dataset-initializer", "status": "Complete"}]
    jobs.append(node)
    spec: dict[str, Any] = {
        "mlPolicy": {"numNodes": nodes, "torch": {"numProcPerNode": 1}},
        "template": {"spec": {"replicatedJobs": jobs}}}
    if coscheduling:
        spec["podGroupPolicy"] = {"coscheduling": {"scheduleTimeoutSeconds": schedule_timeout}}
    return {"apiVersion": API, "kind": "TrainingRuntime", "metadata": {"name": name},
            "spec": spec}


def train_job(name: str, runtime: str, *, nodes: int | None = None,
              kind: str = "TrainingRuntime") -> dict[str, Any]:
    """A TrainJob as users write it: a reference to ``runtime`` and, if given, its node
    count; nothing about scheduling."""
    spec: dict[str, Any] = {"runtimeRef": {"name": runtime, "apiGroup": "trainer.kubeflow.org",
                                           "kind": kind}}
    if nodes is not None:
        spec["trainer"] = {"numNodes": nodes}
    return {"apiVersion": API, "kind": "TrainJob", "metadata": {"name": name}, "spec": spec}


def trainjob_pods(kube: Kube, ns: str, name: str, replicated_job: str | None = None
                  ) -> list[dict[str, Any]]:
    """The pods of TrainJob ``name`` (its JobSet's), of one replicatedJob (``node``,
    ``dataset-initializer``) if asked: JobSet labels every pod with both names."""
    sel = f"{JOBSET_LABEL}={name}"
    if replicated_job:
        sel += f",{REPLICATED_JOB_LABEL}={replicated_job}"
    return kube.pods(ns, labelSelector=sel)
