"""LeaderWorkerSet's controller on a running test bed.

The real manager, built from its Go module (``hack/gomod/lws``: ``sigs.k8s.io/lws/cmd``,
version in ``testbed/versions.env``), run out of a cluster against the bed's API server. What
v0.7.0 needs there, read from its source (``cmd/main.go``, ``pkg/config``, ``pkg/controllers``,
``pkg/webhooks``):

- the LeaderWorkerSet CRD (``leaderworkerset.x-k8s.io/v1``) from the module itself
  (``config/crd``), with the conversion webhook its kustomization patches in pointed at the
  manager;
- its webhook configurations (``config/webhook``: LWS defaulting and validation, and the pod
  webhooks on CREATE and UPDATE of pods labelled ``leaderworkerset.sigs.k8s.io/name``),
  named as ``config/default`` names them (``lws-`` prefix), each calling
  ``https://127.0.0.1:<port>`` with the bed's CA (``testbed.controllers``). The pod webhook
  is what labels each pod with its group and worker index and writes the exclusive-topology
  affinities, so it is served, not turned off (``ENABLE_WEBHOOKS=false`` would);
- a ``Configuration`` (``config.lws.x-k8s.io/v1alpha1``): ``internalCertManagement.enable:
  false`` (the documented switch; the webhook server then reads ``webhook.certDir``, where the
  bed's pair for 127.0.0.1 is), 127.0.0.1 ports for the webhook and health-probe servers;
  ``--leader-elect=false`` (its flag defaults to true) and ``--metrics-bind-address=0``;
- kube-controller-manager's StatefulSet controller: LWS creates StatefulSets, one of leaders
  and one of workers per group, and only that controller creates their pods (``start_lws``
  starts it, with the garbage collector, unless asked not to).

What LWS writes that a gang scheduler reads: the leaders' StatefulSet is named after the
LWS, so group ``i``'s leader is pod ``<lws>-<i>``; its workers' StatefulSet is named after the
leader, so its workers are ``<lws>-<i>-<j>`` (``j`` from 1). Every pod carries
``leaderworkerset.sigs.k8s.io/name``, ``group-index``, ``worker-index`` (0 for the leader) and
``group-key`` (a hash, the same on one group's pods) labels, and the annotation
``leaderworkerset.sigs.k8s.io/size`` (leader plus workers). The worker StatefulSet of a group
is created only once its leader pod exists, and, when the LWS has the annotation
``leaderworkerset.sigs.k8s.io/exclusive-topology: <node label>``, only once the leader is
bound: the workers' template then gets a ``nodeSelector`` for the leader's domain, and the pod
webhook gives every pod of the group affinity to its group (``group-key``) and anti-affinity
to other groups on that label. So under exclusive topology a group's pods never all exist
before its leader is bound. ``leaderworkerset.sigs.k8s.io/subgroup-exclusive-topology`` with
``subgroup-size`` does the same per subgroup. With the default
``restartPolicy: RecreateGroupOnPodRestart``, a container restart or a deletion of any pod of a
group makes the pod controller delete the group's leader (foreground), which takes its
worker StatefulSet and pods with it: the group is recreated whole, the other groups untouched.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml

from .bins import bin_path, go_module_dir
from .controllers import apply, crds, serving_certs, webhook_configurations
from .kube import Kube
from .runner import KCM_CONTROLLERS, Proc, TestBed, free_port

__all__ = ["API", "EXCLUSIVE_TOPOLOGY", "GROUP_INDEX_LABEL", "LWS", "MODULE", "NAME_LABEL",
           "SUBGROUP_EXCLUSIVE_TOPOLOGY", "SUBGROUP_SIZE", "WORKER_INDEX_LABEL",
           "configuration", "leader_worker_set", "lws_pods", "module_dir", "start_lws"]

MODULE = "sigs.k8s.io/lws"
API = "leaderworkerset.x-k8s.io/v1"
LWS = "/apis/leaderworkerset.x-k8s.io/v1/namespaces/{ns}/leaderworkersets"
NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
EXCLUSIVE_TOPOLOGY = "leaderworkerset.sigs.k8s.io/exclusive-topology"
SUBGROUP_EXCLUSIVE_TOPOLOGY = "leaderworkerset.sigs.k8s.io/subgroup-exclusive-topology"
SUBGROUP_SIZE = "leaderworkerset.sigs.k8s.io/subgroup-size"
NAME_PREFIX = "lws-"
"""``config/default``'s ``namePrefix``."""
STATEFULSET_CONTROLLERS = (*KCM_CONTROLLERS, "statefulset-controller")
"""kube-controller-manager's controllers an LWS needs: StatefulSets into pods, and the
garbage collector (a deleted leader's worker StatefulSet and pods, a deleted LWS's)."""


def module_dir() -> Path:
    """The LWS module in the Go module cache, at the pinned version."""
    return go_module_dir("lws", MODULE, "lws")


def configuration(*, webhook_port: int, probe_port: int, cert_dir: Path) -> dict[str, Any]:
    """The manager's Configuration for a bed (the module docstring says why each field)."""
    return {
        "apiVersion": "config.lws.x-k8s.io/v1alpha1", "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{probe_port}"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "clientConnection": {"qps": 50, "burst": 100},
    }


def _wait_webhook(bed: TestBed, timeout: float) -> None:
    """Until the API server calls LWS's defaulting webhook: a dry-run create of an LWS comes
    back defaulted (``restartPolicy`` set)."""
    probe = leader_worker_set("lws-webhook-probe", replicas=1, size=1)

    def defaulted() -> bool:
        try:
            got = kube.request("POST", LWS.format(ns="default"), probe,
                               params={"dryRun": "All"})
        except Exception:  # the webhook not answering yet (failurePolicy: Fail)
            return False
        tmpl = (got.get("spec") or {}).get("leaderWorkerTemplate") or {}
        return bool(tmpl.get("restartPolicy"))

    with Kube(bed.api_url, bed.token) as kube:
        kube.wait("the API server calling LWS's webhook", defaulted, timeout, interval=0.2)


def start_lws(bed: TestBed, *, name: str = "lws", timeout: float = 60.0,
              statefulset_controller: bool = True, extra_args: tuple[str, ...] = ()) -> Proc:
    """Run LWS's manager against ``bed`` and wait until it is ready and the API server calls
    its webhook. ``statefulset_controller``: start kube-controller-manager with
    ``STATEFULSET_CONTROLLERS`` first, unless the test already runs it. ``bed.stop()`` stops
    it with the rest; its log is ``<bed dir>/<name>.log``."""
    t0 = time.monotonic()
    if statefulset_controller and "kube-controller-manager" not in bed.procs:
        bed.start_controller_manager(STATEFULSET_CONTROLLERS)
    webhook, probe = free_port(), free_port()
    url = f"https://127.0.0.1:{webhook}"
    cert_dir = bed.dir / f"{name}-certs"
    ca = serving_certs(cert_dir).ca.read_bytes()
    root = module_dir() / "config"
    apply(bed, name, [*crds(root / "crd", url, ca),
                      *webhook_configurations(root / "webhook", url, ca, NAME_PREFIX)])
    config = bed.dir / f"{name}.config.yaml"
    config.write_text(yaml.safe_dump(configuration(webhook_port=webhook, probe_port=probe,
                                                   cert_dir=cert_dir)))
    bed.startup_seconds[f"{name}-prerequisites"] = time.monotonic() - t0
    proc = bed._spawn(name, [
        str(bin_path("lws")), f"--config={config}", f"--kubeconfig={bed.kubeconfig}",
        "--leader-elect=false", "--metrics-bind-address=0", "--zap-log-level=2", *extra_args,
    ], ready_url=f"http://127.0.0.1:{probe}/readyz", timeout=timeout, stop_timeout=5.0)
    t1 = time.monotonic()
    _wait_webhook(bed, timeout)
    bed.startup_seconds[f"{name}-webhook"] = time.monotonic() - t1
    return proc


def _template(gpus: int, scheduler_name: str | None, priority_class: str | None
              ) -> dict[str, Any]:
    limits = {"cpu": "1", "memory": "1Gi", **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "main", "image": "registry.invalid/serve:latest",
                        "resources": {"limits": limits}}]}
    if scheduler_name:
        spec["schedulerName"] = scheduler_name
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {"spec": spec}


def leader_worker_set(name: str, *, replicas: int, size: int, gpus: int = 0,
                      scheduler_name: str | None = "lockstep",
                      annotations: dict[str, str] | None = None,
                      labels: dict[str, str] | None = None,
                      priority_class: str | None = None) -> dict[str, Any]:
    """An LWS as users write it: ``replicas`` groups of ``size`` pods (one leader, the rest
    workers), every pod from one template asking for 1 CPU, 1 Gi and ``gpus`` GPUs;
    ``annotations``: the LWS's own (``EXCLUSIVE_TOPOLOGY`` and the like)."""
    meta: dict[str, Any] = {"name": name}
    if annotations:
        meta["annotations"] = dict(annotations)
    if labels:
        meta["labels"] = dict(labels)
    return {"apiVersion": API, "kind": "LeaderWorkerSet", "metadata": meta, "spec": {
        "replicas": replicas,
        "leaderWorkerTemplate": {
            "size": size,
            "workerTemplate": _template(gpus, scheduler_name, priority_class)}}}


def lws_pods(kube: Kube, ns: str, name: str) -> list[dict[str, Any]]:
    return kube.pods(ns, labelSelector=f"{NAME_LABEL}={name}")
