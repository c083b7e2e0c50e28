"""Two (or more) Lockstep + kube-scheduler pairs on one test bed, as the Deployment runs them.

Each pair is a replica's pod: a stock kube-scheduler with ``deploy/``'s scheduler
configuration (leader election on the Lease ``lockstep-system/lockstep-scheduler``, the
deployed durations) in a UTS namespace whose hostname is the replica's name, and a Lockstep
told to follow that Lease with that name as its identity (``app.kube.lease``). Both Locksteps
serve the webhook with the certificate they keep in one Secret, and the webhook
configuration points at a :class:`~testbed.forwarder.Forwarder` standing in for the Service.

``kill`` is a node failure: SIGKILL to both processes of a pair. ``leader`` reads the Lease.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .bins import REPO
from .forwarder import Forwarder
from .kube import Kube
from .runner import TestBed, free_port

__all__ = ["LEASE", "Replica", "Replicas"]

LEASE = ("lockstep-system", "lockstep-scheduler")
SCHEDULER_CONFIG = REPO / "deploy" / "scheduler-config.yaml"


@dataclass
class Replica:
    name: str
    url: str = ""
    webhook_port: int = 0


@dataclass
class Replicas:
    bed: TestBed
    lockstep_args: tuple[str, ...] = ("--backoff=3",)
    replicas: dict[str, Replica] = field(default_factory=dict)
    forwarder: Forwarder = field(default_factory=Forwarder)

    def start(self, names: tuple[str, ...] = ("lockstep-a", "lockstep-b")) -> Replicas:
        self.bed.kubectl("create", "namespace", LEASE[0], check=False)
        self.forwarder.start()
        # The configuration first, without a caBundle, as deploy/ applies it.
        self.bed.register_webhook(self.forwarder.url, None, name="lockstep", wait=False)
        for name in names:
            self.start_one(name)
        self.bed.wait_webhook_called(self.forwarder.url, timeout=60)
        return self

    def start_one(self, name: str) -> Replica:
        """Start (or start again) replica ``name``: its Lockstep, then its kube-scheduler."""
        r = self.replicas.setdefault(name, Replica(name))
        r.webhook_port = r.webhook_port or free_port()
        port = int(r.url.rsplit(":", 1)[1]) if r.url else free_port()
        r.url = f"http://127.0.0.1:{port}"
        self.bed._spawn(name, [
            sys.executable, "-m", "app", "serve", f"--kubeconfig={self.bed.kubeconfig}",
            "--host=127.0.0.1", f"--port={port}", "--webhook-host=127.0.0.1",
            f"--webhook-port={r.webhook_port}",
            f"--webhook-cert-secret={LEASE[0]}/lockstep-webhook-cert",
            "--webhook-configuration=lockstep", "--webhook-hosts=127.0.0.1",
            f"--leader-elect-lease={LEASE[0]}/{LEASE[1]}", f"--leader-identity={name}",
            *self.lockstep_args,
        ], ready_url=f"{r.url}/readyz", timeout=60.0,
           env={**os.environ, "PYTHONPATH": str(REPO)})
        if r.webhook_port not in self.forwarder.backends:
            self.forwarder.backends.append(r.webhook_port)
        election = yaml.safe_load(SCHEDULER_CONFIG.read_text())["leaderElection"]
        self.bed.start_scheduler(SCHEDULER_CONFIG, name=f"{name}-scheduler",
                                 extender_url=r.url, hostname=name,
                                 overrides={"leaderElection": election})
        return r

    def leader(self, kube: Kube) -> str | None:
        """The replica whose kube-scheduler holds the Lease (None: none, or unknown)."""
        try:
            lease = kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{LEASE[0]}/leases/"
                             f"{LEASE[1]}")
        except Exception:
            return None
        holder = str((lease.get("spec") or {}).get("holderIdentity") or "")
        host = holder.rpartition("_")[0]
        return host if host in self.replicas else None

    def wait_leader(self, kube: Kube, timeout: float = 60.0, not_: str | None = None) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            who = self.leader(kube)
            if who is not None and who != not_ and self.bed.procs[who].alive():
                return who
            time.sleep(0.2)
        raise AssertionError(f"no replica leads after {timeout:.0f}s (not {not_})")

    def kill(self, name: str) -> None:
        """A node failure: SIGKILL to the replica's Lockstep and its kube-scheduler."""
        for proc in (name, f"{name}-scheduler"):
            self.bed.signal(proc, signal.SIGKILL)
        for proc in (name, f"{name}-scheduler"):
            self.bed.wait_exit(proc, 10)

    def stop(self) -> None:
        self.forwarder.stop()

    def log(self, name: str) -> Path:
        return self.bed.dir / f"{name}.log"
