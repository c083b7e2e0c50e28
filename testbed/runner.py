"""Start and stop a real control plane: etcd -> kube-apiserver -> kwok (+ schedulers, Lockstep).

Everything listens on free 127.0.0.1 ports and logs into one run directory, so two test beds
can run side by side and a failing test can print the tail of every log. Processes are
started in their own process groups and stopped by PID; ``restart`` keeps ports, certificates
and data, so tests can restart the API server or Lockstep under load.

The Kubernetes version is selectable (``TestBed(k8s="v1.37.2")``, or ``LOCKSTEP_K8S_VERSION``
for every bed): any version in ``testbed.bins.K8S_VERSIONS``, 1.34 by default. From 1.35 on,
the API server serves the upstream gang API (``scheduling.k8s.io`` Workload/PodGroup, see
``UPSTREAM_GANG_API``) while kube-scheduler runs with ``GenericWorkload`` off, so its native
gang plugin stays out of the way and Lockstep does the gang scheduling.

``start_lockstep()`` runs the default install: Lockstep with its gang-gate admission webhook
over TLS, ``deploy/webhook/webhook.yaml``'s MutatingWebhookConfiguration registered with the
webhook's URL (``webhook_configuration``), and the call returns once the API server calls it.
Lockstep issues its own certificate and sets the ``caBundle``, as deployed, or
(``webhook_certs="files"``) serves a certificate for 127.0.0.1 from ``testbed.certs`` given as
``caBundle`` here. ``webhook=False`` is the extender-only install, an explicit opt-out: what
users get is what the tests run.
"""

from __future__ import annotations

import base64
import compileall
import contextlib
import copy
import functools
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from coscheduling.gang.gating import GANG_GATE

from .bins import K8S_NAMES, K8S_VERSIONS, REPO, bin_path
from .certs import make_certs
from .http import get
from .kube import Kube

__all__ = ["ADMIN_TOKEN", "APISERVER_ONLY_GATES", "KCM_CONTROLLERS", "KCM_TOKEN",
           "KCM_WORKLOAD_CONTROLLERS",
           "UPSTREAM_GANG_API", "WEBHOOK_CONFIG", "Proc", "StartupError", "TestBed",
           "default_k8s", "free_port", "scheduler_config", "webhook_configuration"]

log = logging.getLogger("testbed")

ADMIN_TOKEN = "lockstep-admin-token"
KCM_TOKEN = "lockstep-kcm-token"
"""kube-controller-manager's own identity (``system:kube-controller-manager``, in
``system:masters``: its controllers run under it, no per-controller service accounts)."""
KCM_CONTROLLERS = ("resourceclaim-controller", "garbage-collector-controller")
"""The controllers the test bed runs: DRA's resourceclaim controller (a pod's claim from its
ResourceClaimTemplate, ``status.resourceClaimStatuses``, releasing a claim whose pods are
gone) and the garbage collector (deleting the claims a deleted pod owned, a deleted node's
ResourceSlices)."""
KCM_WORKLOAD_CONTROLLERS = (*KCM_CONTROLLERS, "job-controller", "deployment-controller",
                            "replicaset-controller")
"""``KCM_CONTROLLERS`` plus the controllers that turn a Job or a Deployment into pods (names
as kube-controller-manager v1.34's ``--controllers`` lists them): for tests that compare
``lockstep explain --what-if`` on such an object with the pods its controllers create."""
STAGES = Path(__file__).with_name("stages") / "stages.yaml"
CRDS = (REPO / "deploy" / "podgroup-crd.yaml",)
NRT_CRD = Path(__file__).with_name("crds") / "noderesourcetopology-crd.yaml"
VOLCANO_CRD = Path(__file__).with_name("crds") / "volcano-podgroup-crd.yaml"
VOLCANO_QUEUE_CRD = Path(__file__).with_name("crds") / "volcano-queue-crd.yaml"
WEBHOOK_CONFIG = REPO / "deploy" / "webhook" / "webhook.yaml"

UPSTREAM_GANG_API: dict[int, tuple[str, str]] = {
    35: ("GenericWorkload=true", "scheduling.k8s.io/v1alpha1=true"),
    36: ("GenericWorkload=true,TopologyAwareWorkloadScheduling=true",
         "scheduling.k8s.io/v1alpha2=true"),
    37: ("GenericWorkload=true,TopologyAwareWorkloadScheduling=true",
         "scheduling.k8s.io/v1beta1=true,scheduling.k8s.io/v1alpha3=true"),
}
"""Kubernetes minor -> the API server's ``--feature-gates`` and ``--runtime-config`` that serve
the upstream gang API (read from each release's pkg/features and pkg/controlplane): every
version is off by default (alpha, and from 1.37 beta, group versions are disabled, and their
storage needs ``GenericWorkload``, which also keeps ``spec.schedulingGroup`` on pods).
``TopologyAwareWorkloadScheduling`` admits ``schedulingConstraints.topology``. Only 1.37 is
built and run here; 1.35 and 1.36 are from the sources."""


APISERVER_ONLY_GATES = ("CompositePodGroup",)
"""Gates given to kube-apiserver only: it serves the objects Lockstep reads, while
kube-scheduler runs with ``GenericWorkload`` off, which 1.37's ``CompositePodGroup`` depends on
(kube-scheduler refuses to start with it on), and kube-controller-manager 1.34 does not know it."""


def default_k8s() -> str:
    """``LOCKSTEP_K8S_VERSION`` if set, else the pinned default (1.34)."""
    return os.environ.get("LOCKSTEP_K8S_VERSION") or K8S_VERSIONS[0]


class StartupError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Proc:
    name: str
    argv: list[str]
    log: Path
    env: dict[str, str] | None = None
    popen: subprocess.Popen[bytes] | None = None
    ready_url: str | None = None
    ready_token: str | None = None
    stop_timeout: float = 10.0
    """SIGTERM, then SIGKILL after this many seconds."""

    def start(self) -> None:
        out = self.log.open("ab")
        self.popen = subprocess.Popen(
            self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env=self.env,
        )
        out.close()

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, timeout: float | None = None) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        timeout = self.stop_timeout if timeout is None else timeout
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(5)


def scheduler_config(
    doc: Mapping[str, Any] | None, kubeconfig: Path, extender_url: str | None = None,
) -> dict[str, Any]:
    """A KubeSchedulerConfiguration for the test bed.

    ``doc`` is a repo file as loaded (``scheduler-config/*.yaml``); only what is site-specific
    changes: ``clientConnection.kubeconfig``, ``leaderElection.leaderElect: false`` and, when
    ``extender_url`` is given, the scheme and host:port of every extender's ``urlPrefix`` (its
    path stays). ``None`` is the stock default profile (``default-scheduler``) with qps/burst
    raised above the 50/100 defaults that would cap binding at ~50 pods/s.
    """
    if doc is None:
        out: dict[str, Any] = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "profiles": [{"schedulerName": "default-scheduler"}],
        }
    else:
        out = copy.deepcopy(dict(doc))
    conn = out.setdefault("clientConnection", {})
    conn["kubeconfig"] = str(kubeconfig)
    conn.setdefault("qps", 200)
    conn.setdefault("burst", 400)
    out.setdefault("leaderElection", {})["leaderElect"] = False
    if extender_url is not None:
        new = urllib.parse.urlsplit(extender_url)
        for ext in out.get("extenders") or ():
            old = urllib.parse.urlsplit(str(ext.get("urlPrefix") or "/"))
            ext["urlPrefix"] = urllib.parse.urlunsplit(
                (new.scheme, new.netloc, old.path or "/", "", ""))
    return out


def webhook_configuration(doc: Mapping[str, Any], url: str, ca_bundle: bytes | None,
                          name: str = "lockstep") -> dict[str, Any]:
    """``deploy/webhook``'s MutatingWebhookConfiguration for a Lockstep out of the cluster.

    ``doc`` is the file's MutatingWebhookConfiguration as loaded; only what is site-specific
    changes: ``metadata.name``, the cert-manager annotation (dropped: ``ca_bundle`` is given),
    and each webhook's ``clientConfig``: ``url`` (scheme and host:port) plus the in-cluster
    Service's path, instead of the Service. Rules, match conditions, namespace selector,
    failure policy and timeout are the deployed ones."""
    out = copy.deepcopy(dict(doc))
    out["metadata"] = {"name": name}
    for hook in out.get("webhooks") or ():
        path = str((hook.get("clientConfig") or {}).get("service", {}).get("path") or "/")
        hook["clientConfig"] = {"url": url.rstrip("/") + path}
        if ca_bundle is not None:
            hook["clientConfig"]["caBundle"] = base64.b64encode(ca_bundle).decode("ascii")
    return out


@functools.cache
def compile_lockstep() -> None:
    """Byte-compile Lockstep's sources, as ``pip install`` (and so the image) does.

    With ``PYTHONDONTWRITEBYTECODE`` set (this machine sets it) every Lockstep started from
    the source tree compiled its ~30 modules again, inside the time a benchmark measures;
    deployed, the bytecode is there. Python still reads bytecode the flag stops it writing."""
    for package in ("app", "coscheduling"):
        compileall.compile_dir(REPO / package, quiet=1)


@dataclass
class TestBed:
    """One control plane. Use as a context manager, or call ``start()`` / ``stop()``."""

    run_dir: Path | None = None
    extra_tokens: dict[str, tuple[str, list[str]]] = field(default_factory=dict)
    """token -> (user name, groups) added to the API server's static token file."""
    with_crds: bool = True
    """Install the scheduler-plugins PodGroup CRD (scheduling.x-k8s.io/v1alpha1)."""
    with_nrt: bool = False
    """Also install the NodeResourceTopology CRD (topology.node.k8s.io/v1alpha2)."""
    with_volcano: bool = False
    """Also install Volcano's PodGroup and Queue CRDs (scheduling.volcano.sh/v1beta1)."""
    k8s: str = field(default_factory=default_k8s)
    """Kubernetes version of kube-apiserver, kube-scheduler and kubectl (``K8S_VERSIONS``)."""
    feature_gates: tuple[str, ...] = ()
    """Extra Kubernetes feature gates (``"DRAPartitionableDevices=true"``) for kube-apiserver,
    the stock kube-scheduler and kube-controller-manager alike, except ``APISERVER_ONLY_GATES``
    (kube-apiserver's alone)."""
    procs: dict[str, Proc] = field(default_factory=dict)
    startup_seconds: dict[str, float] = field(default_factory=dict)
    webhooks: dict[str, str] = field(default_factory=dict)
    """Lockstep instance name -> the base URL of its webhook server (``webhook=True``)."""
    profiling: bool = False
    """Serve Go's ``/debug/pprof`` on kube-apiserver (admin token) and on every
    kube-scheduler (no token), for ``benchmarks throughput --profile``."""
    _own_dir: bool = field(default=False, init=False, repr=False)

    __test__ = False  # not a pytest test class

    def __post_init__(self) -> None:
        if self.k8s not in K8S_VERSIONS:
            raise ValueError(f"Kubernetes {self.k8s} is not built for the test bed; "
                             f"known: {', '.join(K8S_VERSIONS)} (testbed/versions.env)")
        self._own_dir = self.run_dir is None
        if self.run_dir is None:
            self.run_dir = Path(tempfile.mkdtemp(prefix="lockstep-bed-"))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.etcd_port = free_port()
        self.api_port = free_port()
        self.kubeconfig = self.dir / "kubeconfig"
        self.api_url = f"https://127.0.0.1:{self.api_port}"
        self.token = ADMIN_TOKEN

    @property
    def dir(self) -> Path:
        assert self.run_dir is not None
        return self.run_dir

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> TestBed:
        self.start()
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.stop()
        # A bed's directory (etcd's data, the logs) is ~80 MB: a suite run left gigabytes
        # in /tmp. LOCKSTEP_KEEP_BED=1 keeps it to read the logs afterwards.
        if self._own_dir and not os.environ.get("LOCKSTEP_KEEP_BED"):
            shutil.rmtree(self.dir, ignore_errors=True)

    def start(self) -> None:
        t0 = time.monotonic()
        compile_lockstep()
        try:
            self._start_etcd()
            self._start_apiserver()
            self._write_kubeconfig(self.kubeconfig, self.token)
            self._start_kwok()
            if self.with_crds or self.with_nrt or self.with_volcano:
                t1 = time.monotonic()
                self._apply_crds()
                self.startup_seconds["crds"] = time.monotonic() - t1
        except BaseException:
            self.stop()
            raise
        self.startup_seconds["control-plane"] = time.monotonic() - t0
        log.info("test bed up in %.1fs (%s): %s", self.startup_seconds["control-plane"],
                 ", ".join(f"{k} {v:.1f}s" for k, v in self.startup_seconds.items()
                           if k != "control-plane"), self.dir)

    def stop(self) -> None:
        """Stop every process, newest first (idempotent)."""
        for name in reversed(list(self.procs)):
            self.procs[name].stop()

    def pids(self) -> dict[str, int]:
        return {n: p.pid for n, p in self.procs.items() if p.pid is not None and p.alive()}

    def _spawn(self, name: str, argv: list[str], *, ready_url: str | None = None,
               token: str | None = None, timeout: float = 60.0,
               env: dict[str, str] | None = None, stop_timeout: float = 10.0) -> Proc:
        old = self.procs.get(name)
        if old is not None:
            old.stop()
        proc = Proc(name, argv, self.dir / f"{name}.log", env=env, ready_url=ready_url,
                    ready_token=token, stop_timeout=stop_timeout)
        self.procs[name] = proc
        t0 = time.monotonic()
        proc.start()
        if ready_url:
            self._wait_ready(proc, timeout)
        self.startup_seconds[name] = time.monotonic() - t0
        return proc

    def _wait_ready(self, proc: Proc, timeout: float) -> None:
        assert proc.ready_url is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not proc.alive():
                raise StartupError(f"{proc.name} exited early:\n{self.tail(proc.name)}")
            if get(proc.ready_url, proc.ready_token, timeout=2.0)[0] == 200:
                return
            time.sleep(0.1)
        raise StartupError(f"{proc.name} not ready after {timeout:.0f}s:\n{self.tail(proc.name)}")

    def restart(self, name: str, *, down_seconds: float = 0.0) -> None:
        """Stop ``name`` and start it again with the same arguments (ports, data, certs)."""
        proc = self.procs[name]
        proc.stop()
        time.sleep(down_seconds)
        t0 = time.monotonic()
        proc.start()
        if proc.ready_url:
            self._wait_ready(proc, 60.0)
        self.startup_seconds[f"{name}-restart"] = time.monotonic() - t0
        log.info("%s restarted in %.1fs", name, self.startup_seconds[f"{name}-restart"])

    def stop_process(self, name: str) -> None:
        self.procs[name].stop()

    def signal(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the process itself (``kill -9 <pid>`` by default); see
        ``wait_exit``. ``restart`` starts it again."""
        pid = self.procs[name].pid
        if pid is None:
            raise RuntimeError(f"{name} was never started")
        os.kill(pid, sig)

    def wait_exit(self, name: str, timeout: float) -> int | None:
        """The exit code once ``name`` exits within ``timeout`` seconds, else None."""
        popen = self.procs[name].popen
        if popen is None:
            raise RuntimeError(f"{name} was never started")
        try:
            return popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    # ------------------------------------------------------------------ components

    def _start_etcd(self) -> None:
        peer = free_port()
        data = self.dir / "etcd-data"
        self._spawn("etcd", [
            str(bin_path("etcd")), "--name=default", f"--data-dir={data}",
            f"--listen-client-urls=http://127.0.0.1:{self.etcd_port}",
            f"--advertise-client-urls=http://127.0.0.1:{self.etcd_port}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=default=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync=true", "--quota-backend-bytes=4294967296",
            "--log-level=warn",
        ], ready_url=f"http://127.0.0.1:{self.etcd_port}/health")

    def _start_apiserver(self) -> None:
        certs = self.dir / "certs"
        certs.mkdir(exist_ok=True)
        sa_key = certs / "sa.key"
        if not sa_key.exists():
            subprocess.run(["openssl", "genrsa", "-out", str(sa_key), "2048"], check=True,
                           capture_output=True)
        tokens = self.dir / "tokens.csv"
        lines = [f'{ADMIN_TOKEN},admin,admin,"system:masters"',
                 f'{KCM_TOKEN},system:kube-controller-manager,kcm,"system:masters"']
        for tok, (user, groups) in self.extra_tokens.items():
            lines.append(f'{tok},{user},{user},"{",".join(groups)}"')
        tokens.write_text("\n".join(lines) + "\n")
        self._spawn("kube-apiserver", [
            str(self.bin("kube-apiserver")),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            "--bind-address=127.0.0.1", f"--secure-port={self.api_port}",
            f"--cert-dir={certs}", "--service-cluster-ip-range=10.0.0.0/24",
            "--authorization-mode=RBAC", f"--token-auth-file={tokens}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={sa_key}",
            f"--service-account-signing-key-file={sa_key}",
            "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
            "--max-requests-inflight=0", "--max-mutating-requests-inflight=0",
            "--enable-priority-and-fairness=false", f"--profiling={str(self.profiling).lower()}",
            "--event-ttl=1h", "--v=1", *self._gate_args(),
        ], ready_url=f"{self.api_url}/readyz", token=ADMIN_TOKEN, timeout=90.0,
           # Graceful termination waits for every open watch to end (clients of a test bed
           # rarely hang up first); etcd holds the data, so 3 s then SIGKILL is safe.
           stop_timeout=3.0)

    @property
    def k8s_minor(self) -> int:
        return int(self.k8s.split(".")[1])

    def _gate_args(self) -> list[str]:
        """The API server's ``--feature-gates`` (the upstream gang API's and
        ``feature_gates``) and ``--runtime-config``."""
        gates, runtime = UPSTREAM_GANG_API.get(self.k8s_minor, ("", ""))
        merged = ",".join(g for g in (gates, *self.feature_gates) if g)
        return [*((f"--feature-gates={merged}",) if merged else ()),
                *((f"--runtime-config={runtime}",) if runtime else ())]

    def _component_gates(self) -> tuple[str, ...]:
        """``feature_gates`` for kube-scheduler and kube-controller-manager: all but
        ``APISERVER_ONLY_GATES``."""
        return tuple(g for g in self.feature_gates
                     if g.split("=", 1)[0] not in APISERVER_ONLY_GATES)

    def bin(self, name: str) -> Path:
        """``name`` at this bed's Kubernetes version when it is a Kubernetes binary."""
        return bin_path(name, self.k8s if name in K8S_NAMES else None)

    def _write_kubeconfig(self, path: Path, token: str) -> None:
        doc = {
            "apiVersion": "v1", "kind": "Config", "current-context": "testbed",
            "clusters": [{"name": "testbed", "cluster": {
                "server": self.api_url, "insecure-skip-tls-verify": True}}],
            "users": [{"name": "testbed", "user": {"token": token}}],
            "contexts": [{"name": "testbed", "context": {"cluster": "testbed",
                                                         "user": "testbed"}}],
        }
        path.write_text(yaml.safe_dump(doc))

    def kubeconfig_for(self, token: str, name: str) -> Path:
        """A kubeconfig that authenticates with ``token`` (one of ``extra_tokens``)."""
        path = self.dir / f"kubeconfig-{name}"
        self._write_kubeconfig(path, token)
        return path

    def _start_kwok(self) -> None:
        home = self.dir / "kwok-home"
        home.mkdir(exist_ok=True)
        env = {**os.environ, "HOME": str(home)}
        self._spawn("kwok", [
            str(bin_path("kwok")), f"--kubeconfig={self.kubeconfig}", f"--config={STAGES}",
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            "--cidr=10.0.0.0/16", "--node-lease-duration-seconds=0",
            "--server-address=127.0.0.1:0",
        ], env=env)
        time.sleep(0.2)
        if not self.procs["kwok"].alive():
            raise StartupError(f"kwok exited early:\n{self.tail('kwok')}")

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin("kubectl")), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args],
            input=input, text=True, capture_output=True, check=check,
        )

    def _apply_crds(self) -> None:
        files = [*(CRDS if self.with_crds else ()), *((NRT_CRD,) if self.with_nrt else ()),
                 *((VOLCANO_CRD, VOLCANO_QUEUE_CRD) if self.with_volcano else ())]
        names = [*(("crd/podgroups.scheduling.x-k8s.io",) if self.with_crds else ()),
                 *(("crd/noderesourcetopologies.topology.node.k8s.io",) if self.with_nrt
                   else ()),
                 *(("crd/podgroups.scheduling.volcano.sh", "crd/queues.scheduling.volcano.sh")
                   if self.with_volcano else ())]
        self._kubectl_retried("apply", "--server-side",
                              *(a for f in files for a in ("-f", str(f))))
        self._kubectl_retried("wait", "--for=condition=Established", "--timeout=30s", *names)

    def _kubectl_retried(self, *args: str, within: float = 60.0) -> None:
        """``kubectl`` until it succeeds or ``within`` seconds pass. Just after /readyz the
        API server may still refuse a CRD or take more than 30 s to establish one on a loaded
        machine (CI has seen both); server-side apply and wait are safe to repeat. The last
        failure's output is in the error."""
        deadline = time.monotonic() + within
        while True:
            got = self.kubectl(*args, check=False)
            if got.returncode == 0:
                return
            if time.monotonic() >= deadline:
                raise StartupError(f"kubectl {args[0]} failed for {within:.0f}s: "
                                   f"{(got.stderr or got.stdout).strip()[-2000:]}")
            time.sleep(1.0)

    # ------------------------------------------------------------------ schedulers

    def start_scheduler(
        self,
        config: Path | None = None,
        *,
        name: str = "kube-scheduler",
        extender_url: str | None = None,
        binary: str = "kube-scheduler",
        overrides: dict[str, Any] | None = None,
        hostname: str | None = None,
    ) -> Proc:
        """Run kube-scheduler with ``config`` (a repo file), substituting only addresses.

        See ``scheduler_config`` for what changes. ``binary="scheduler-plugins"`` runs the
        scheduler-plugins build (coscheduling) instead of the stock one. Several schedulers
        may run at once under different ``name``s; each waits for /healthz. ``hostname``: run
        it in a UTS namespace of its own with that hostname, as the pod of a replica has
        (kube-scheduler's lease identity starts with it; ``testbed.replicas``).
        """
        loaded = yaml.safe_load(Path(config).read_text()) if config is not None else None
        doc = scheduler_config(loaded, self.kubeconfig, extender_url)
        for k, v in (overrides or {}).items():
            doc[k] = v
        path = self.dir / f"{name}.config.yaml"
        path.write_text(yaml.safe_dump(doc))
        port = free_port()
        # From 1.35 the stock scheduler's native gang plugin follows GenericWorkload (1.35 and
        # 1.36 also had a GangScheduling gate needing it): off, so Lockstep alone does gangs.
        stock = binary == "kube-scheduler"
        wanted = [*(("GenericWorkload=false",) if stock and self.k8s_minor >= 35 else ()),
                  *(self._component_gates() if stock else ())]
        gates = [f"--feature-gates={','.join(wanted)}"] if wanted else []
        wrap = [] if hostname is None else [
            "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', hostname]
        return self._spawn(name, [
            *wrap, str(self.bin(binary)), f"--config={path}", "--bind-address=127.0.0.1", *gates,
            f"--secure-port={port}",
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics"
            + (",/debug/pprof/*" if self.profiling else ""),
            "--authentication-skip-lookup=true", "--v=2",
        ], ready_url=f"https://127.0.0.1:{port}/healthz", timeout=60.0)

    def start_controller_manager(self, controllers: tuple[str, ...] = KCM_CONTROLLERS
                                 ) -> Proc:
        """Run kube-controller-manager (the default Kubernetes version's, built from the same
        module as the API server) with only ``controllers``, under its own kubeconfig and
        token; waits for /healthz. Its serving certificate is self-signed in memory, like
        kube-scheduler's."""
        kubeconfig = self.kubeconfig_for(KCM_TOKEN, "kube-controller-manager")
        port = free_port()
        return self._spawn("kube-controller-manager", [
            str(bin_path("kube-controller-manager")), f"--kubeconfig={kubeconfig}",
            f"--controllers={','.join(controllers)}", "--leader-elect=false",
            "--use-service-account-credentials=false",
            "--bind-address=127.0.0.1", f"--secure-port={port}",
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
            "--authentication-skip-lookup=true", "--v=2",
            *((f"--feature-gates={','.join(self._component_gates())}",)
              if self._component_gates() else ()),
        ], ready_url=f"https://127.0.0.1:{port}/healthz", timeout=60.0)

    def start_lockstep(
        self,
        *,
        name: str = "lockstep",
        extra_args: tuple[str, ...] = (),
        kubeconfig: Path | None = None,
        port: int | None = None,
        tls: tuple[Path, Path] | None = None,
        env: Mapping[str, str] | None = None,
        webhook: bool = True,
        webhook_certs: str = "own",
    ) -> str:
        """Run Lockstep (``python -m app serve``) and wait for /readyz; returns its URL.

        ``tls`` is (certificate, key): the verbs are then served over HTTPS. ``env`` adds to
        the inherited environment. ``webhook`` (on by default, as deployed): also serve the
        gang-gate admission webhook (``--webhook-port``), register it with the API server
        (``register_webhook``) and wait until the API server calls it; its URL is
        ``webhooks[name]``. ``webhook=False`` runs the extender alone, for a test or a run
        about that path. ``webhook_certs``: ``"own"`` (the default install) has
        Lockstep issue its certificate into the Secret ``lockstep-system/<name>-webhook-cert``
        and set the configuration's ``caBundle`` itself; ``"files"`` gives it a certificate of
        the bed's own CA as files, as cert-manager would.
        """
        port = port or free_port()
        tls_args = (f"--tls-cert={tls[0]}", f"--tls-key={tls[1]}") if tls else ()
        url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
        webhook_args: tuple[str, ...] = ()
        if webhook:
            webhook_port = free_port()
            webhook_url = f"https://127.0.0.1:{webhook_port}"
            webhook_args = ("--webhook-host=127.0.0.1", f"--webhook-port={webhook_port}")
            if webhook_certs == "files":
                certs = make_certs(self.dir / f"{name}-webhook-certs")
                webhook_args += (f"--webhook-cert={certs.cert}", f"--webhook-key={certs.key}")
            elif webhook_certs == "own":
                # The configuration is there first, with no caBundle (as deploy/ applies it):
                # Lockstep fills it in. Until then the API server's calls fail and, with
                # failurePolicy: Ignore, pods are created ungated.
                self.kubectl("create", "namespace", "lockstep-system", check=False)
                self.register_webhook(webhook_url, None, name=name, wait=False)
                webhook_args += (f"--webhook-cert-secret=lockstep-system/{name}-webhook-cert",
                                 f"--webhook-configuration={name}",
                                 "--webhook-hosts=127.0.0.1")
            else:
                raise ValueError(f"webhook_certs={webhook_certs!r}: 'own' or 'files'")
        self._spawn(name, [
            sys.executable, "-m", "app", "serve", f"--kubeconfig={kubeconfig or self.kubeconfig}",
            "--host=127.0.0.1", f"--port={port}", *tls_args, *webhook_args, *extra_args,
        ], ready_url=f"{url}/readyz", timeout=60.0,
           env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})
        if webhook:
            self.webhooks[name] = webhook_url
            if webhook_certs == "files":
                self.register_webhook(webhook_url, certs.ca.read_bytes(), name=name)
            else:
                self.wait_webhook_called(webhook_url)
        return url

    def register_webhook(self, url: str, ca_bundle: bytes | None, *, name: str = "lockstep",
                         wait: bool = True, timeout: float = 30.0) -> dict[str, Any]:
        """Apply ``deploy/webhook``'s MutatingWebhookConfiguration (``webhook_configuration``)
        pointing at ``url``, under ``name``; returns what was applied. ``ca_bundle`` None
        leaves it out, for a Lockstep that sets it itself.

        ``wait``: until the API server calls it (``wait_webhook_called``)."""
        docs = [d for d in yaml.safe_load_all(WEBHOOK_CONFIG.read_text()) if d]
        mwc = next(d for d in docs if d.get("kind") == "MutatingWebhookConfiguration")
        doc = webhook_configuration(mwc, url, ca_bundle, name)
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))
        if wait:
            self.wait_webhook_called(url, timeout)
        return doc

    def wait_webhook_called(self, url: str, timeout: float = 30.0) -> None:
        """Until the API server calls the webhook, which a server-side dry-run create of a gang
        pod in ``default`` shows (the configuration reaches the admission chain through an
        informer, a moment after it is stored)."""
        probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": "lockstep-webhook-probe",
            "annotations": {"lockstep.dev/pod-group": "probe"}},
            "spec": {"schedulerName": "lockstep", "containers": [
                {"name": "c", "image": "registry.invalid/probe:latest"}]}}
        with Kube(self.api_url, self.token) as kube:
            kube.wait(f"the API server calling the webhook at {url}", lambda: any(
                g.get("name") == GANG_GATE for g in kube.request(
                    "POST", "/api/v1/namespaces/default/pods", probe,
                    params={"dryRun": "All"})["spec"].get("schedulingGates") or ()),
                timeout, interval=0.1)

    # ------------------------------------------------------------------ debugging

    def tail(self, name: str, lines: int = 40) -> str:
        path = self.dir / f"{name}.log"
        if not path.exists():
            return f"(no log for {name})"
        text = path.read_text(errors="replace").splitlines()[-lines:]
        return "\n".join(text)

    def tail_logs(self, lines: int = 40) -> str:
        """The last ``lines`` of every process's log, for a failing test's report."""
        return "\n".join(
            f"----- {name} ({self.dir / (name + '.log')}) -----\n{self.tail(name, lines)}"
            for name in self.procs
        )
