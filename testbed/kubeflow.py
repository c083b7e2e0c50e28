"""Kubeflow's training-operator v1 (the PyTorchJob controller) on a running test bed.

The real controller, built from its Go module (``hack/gomod/kubeflow``, version in
``testbed/versions.env``), run out of a cluster against the test bed's API server. What
v1.8.1 needs there, read from its source (``cmd/training-operator.v1/main.go``,
``pkg/cert/cert.go`` and open-policy-agent/cert-controller v0.10.1's rotator):

- the PyTorchJob CRD: taken from the module itself (``manifests/base/crds/``, the very
  version the binary was built from), never copied by hand;
- its webhook Secret (``training-operator-webhook-cert`` in ``kubeflow``; the rotator only
  updates it, never creates it) and a ValidatingWebhookConfiguration named
  ``validator.training-operator.kubeflow.org`` (the rotator injects its CA there). The
  configuration is left without webhooks, so the API server never calls the operator;
- serving certificates on disk: controller-runtime's webhook server reads
  ``$TMPDIR/k8s-webhook-server/serving-certs/tls.{crt,key}`` (a per-bed TMPDIR here, with a
  pair from ``testbed.certs``: ``openssl``, which the test bed already needs), while the rotator
  waits for the hard-coded ``/tmp/k8s-webhook-server/serving-certs/tls.crt`` to exist
  (it only ``stat``s it; written once if absent, never overwritten);
- free ports for its metrics, health-probe and webhook servers (defaults :8080, :8081,
  :9443), and ``--enable-scheme=pytorchjob``.

Its gang modes (``--gang-scheduler-name``): ``volcano`` writes ``scheduling.volcano.sh/v1beta1``
PodGroups and the pod annotation ``scheduling.k8s.io/group-name``, and creates no pod until
the PodGroup leaves ``Pending``; any other name writes ``scheduling.x-k8s.io/v1alpha1``
PodGroups and the pod label ``scheduling.x-k8s.io/pod-group``, and puts that name in
``schedulerName`` of every pod template that has none (a template's own ``schedulerName`` is
never overwritten; the job gets a ``SetPodTemplateSchedulerName`` warning event instead).

The test bed starts kube-controller-manager only where a test asks for it (DRA claims, Jobs,
Deployments), so in the training-operator's tests nothing garbage-collects a deleted job's
pods, services and PodGroup; ``delete_job`` deletes them by owner reference as the garbage
collector would.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any

from .bins import bin_path, go_module_dir, version_of
from .certs import make_certs
from .kube import Conflict, Kube, NotFound
from .runner import Proc, TestBed, free_port

__all__ = ["JOBS", "MODULE", "NAMESPACE", "crd_path", "delete_job", "module_dir",
           "pytorchjob", "start_training_operator"]

MODULE = "github.com/kubeflow/training-operator"
NAMESPACE = "kubeflow"
"""The operator's namespace outside a cluster (``MY_POD_NAMESPACE`` unset): where it looks for
its webhook Secret."""
SECRET = "training-operator-webhook-cert"
WEBHOOK_CONFIG = "validator.training-operator.kubeflow.org"
ROTATOR_CERT = Path("/tmp/k8s-webhook-server/serving-certs/tls.crt")

JOBS = "/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs"
DEPENDENTS = ("/api/v1/namespaces/{ns}/pods", "/api/v1/namespaces/{ns}/services",
              "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups",
              "/apis/scheduling.volcano.sh/v1beta1/namespaces/{ns}/podgroups")
"""What the operator creates with the job as controller owner."""


def module_dir(version: str | None = None) -> Path:
    """The training-operator module in the Go module cache, at the pinned version or
    ``version`` (one of ``EXTRA_VERSIONS``), downloaded and checked against
    hack/gomod/kubeflow[-<major.minor>]/go.sum if absent."""
    gomod = "kubeflow" if version in (None, version_of("training-operator")) else \
        "kubeflow-" + ".".join(str(version).lstrip("v").split(".")[:2])
    return go_module_dir(gomod, MODULE, "training-operator", version)


def crd_path(plural: str = "pytorchjobs", version: str | None = None) -> Path:
    return module_dir(version) / "manifests" / "base" / "crds" / f"kubeflow.org_{plural}.yaml"


def _prerequisites(bed: TestBed, version: str | None) -> None:
    """CRD, namespace, webhook Secret and an empty ValidatingWebhookConfiguration."""
    bed.kubectl("apply", "--server-side", "-f", str(crd_path(version=version)))
    with Kube(bed.api_url, bed.token) as kube:
        for path, obj in (
            ("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}}),
            (f"/api/v1/namespaces/{NAMESPACE}/secrets",
             {"metadata": {"name": SECRET}, "type": "Opaque"}),
            ("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
             {"metadata": {"name": WEBHOOK_CONFIG}}),
        ):
            with contextlib.suppress(Conflict):  # already there (a second operator)
                kube.create(path, obj)
        crd = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/pytorchjobs.kubeflow.org"
        kube.wait("the PyTorchJob CRD Established", lambda: any(
            c.get("type") == "Established" and c.get("status") == "True"
            for c in (kube.get(crd).get("status") or {}).get("conditions") or ()), 30)


def _serving_certs(tmpdir: Path) -> None:
    # tls.crt and tls.key, the names controller-runtime reads (kept if already there).
    crt = make_certs(tmpdir / "k8s-webhook-server" / "serving-certs",
                     cn=f"training-operator.{NAMESPACE}.svc",
                     dns=(f"training-operator.{NAMESPACE}.svc",)).cert
    if not ROTATOR_CERT.exists():  # only stat()ed by the rotator; shared by every bed
        ROTATOR_CERT.parent.mkdir(parents=True, exist_ok=True)
        tmp = ROTATOR_CERT.with_name(f".tls.crt.{os.getpid()}")
        shutil.copyfile(crt, tmp)
        with contextlib.suppress(OSError):
            os.replace(tmp, ROTATOR_CERT)


def start_training_operator(bed: TestBed, gang_scheduler_name: str | None, *,
                            name: str = "training-operator",
                            extra_args: tuple[str, ...] = (),
                            version: str | None = None) -> Proc:
    """Run the operator (PyTorchJob only) against ``bed`` and wait for its /readyz (certs
    ready, webhook server listening); ``bed.stop()`` stops it with the rest. Its log is
    ``<bed dir>/<name>.log``. ``version``: another built version than the pinned one
    (``EXTRA_VERSIONS``; v1.9.3 reads the same Secret, configuration and certificate paths,
    and its CRD is applied instead)."""
    _prerequisites(bed, version)
    tmpdir = bed.dir / f"{name}-tmp"
    _serving_certs(tmpdir)
    probe, metrics, webhook = free_port(), free_port(), free_port()
    gang = (f"--gang-scheduler-name={gang_scheduler_name}",) if gang_scheduler_name else ()
    return bed._spawn(name, [
        str(bin_path("training-operator", version)), f"--kubeconfig={bed.kubeconfig}",
        "--enable-scheme=pytorchjob", *gang,
        f"--metrics-bind-address=127.0.0.1:{metrics}",
        f"--health-probe-bind-address=127.0.0.1:{probe}",
        f"--webhook-server-port={webhook}", "--zap-log-level=info", *extra_args,
    ], ready_url=f"http://127.0.0.1:{probe}/readyz", timeout=60.0,
       env={**os.environ, "TMPDIR": str(tmpdir)}, stop_timeout=5.0)


def pytorchjob(name: str, *, workers: int, master: bool = False, gpus: int = 1,
               scheduler_name: str | None = "lockstep", limits_only: bool = True,
               priority_class: str | None = None, claim_template: str | None = None
               ) -> dict[str, Any]:
    """A PyTorchJob as users write it: ``Master`` (one replica, when ``master``) and
    ``Worker`` replicas, each pod asking for ``gpus`` GPUs and 1 CPU, 1 Gi;
    ``schedulerName`` in every pod template unless ``scheduler_name`` is None.

    ``limits_only``: resources as ``limits`` only (Kubeflow's examples; the API server
    defaults the pods' requests to them), else CPU and memory as ``requests`` and the GPUs
    as ``limits``. v1.8.1 computes a PodGroup's ``minResources`` from requests alone when a
    container has any (``AddResourceList`` in pkg/controller.v1/common/util.go), so the
    second form gives PodGroups without GPUs in ``minResources``. ``priority_class``: the
    pods' ``priorityClassName`` (admission resolves it to their priority).
    ``claim_template``: GPUs as a DRA claim of each pod's own from that ResourceClaimTemplate
    instead of ``nvidia.com/gpu`` (needs training-operator v1.9.3: see ``versions.env``)."""
    gpu = {} if claim_template else {"nvidia.com/gpu": str(gpus)}

    def replicas(n: int) -> dict[str, Any]:
        spec: dict[str, Any] = {"containers": [{
            "name": "pytorch",  # the operator's default container name
            "image": "docker.io/kubeflowkatib/pytorch-mnist:v1beta1-45c5727",
            "command": ["python3", "/opt/pytorch-mnist/mnist.py", "--epochs=1"],
            "resources": (
                {"limits": {"cpu": "1", "memory": "1Gi", **gpu}}
                if limits_only else {"requests": {"cpu": "1", "memory": "1Gi"},
                                     "limits": gpu}),
        }]}
        if claim_template:
            spec["resourceClaims"] = [{"name": "gpu",
                                       "resourceClaimTemplateName": claim_template}]
            spec["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
        if scheduler_name:
            spec["schedulerName"] = scheduler_name
        if priority_class:
            spec["priorityClassName"] = priority_class
        return {"replicas": n, "restartPolicy": "OnFailure", "template": {"spec": spec}}

    specs = {"Master": replicas(1)} if master else {}
    specs["Worker"] = replicas(workers)
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": name}, "spec": {"pytorchReplicaSpecs": specs}}


def delete_job(kube: Kube, ns: str, name: str) -> None:
    """``kubectl delete pytorchjob``, then what the garbage collector does next: delete
    every pod, service and PodGroup the job owns."""
    try:
        uid = kube.get(f"{JOBS.format(ns=ns)}/{name}")["metadata"]["uid"]
    except NotFound:
        return
    kube.delete(f"{JOBS.format(ns=ns)}/{name}", grace=None)
    for path in DEPENDENTS:
        try:
            items = kube.list(path.format(ns=ns))
        except NotFound:  # that PodGroup API is not installed
            continue
        for obj in items:
            meta = obj.get("metadata") or {}
            if any(o.get("uid") == uid for o in meta.get("ownerReferences") or ()):
                kube.delete(f"{path.format(ns=ns)}/{meta['name']}", grace=None)
