"""Who leads: the Lease the sidecar kube-scheduler holds, read and fenced by the clock.

Lockstep runs as a sidecar of a stock kube-scheduler that elects its leader on a
``coordination.k8s.io/v1`` Lease (``leaderElection`` in ``scheduler-config.yaml``; the
profile's ``lockstep-scheduler``). Only the leading kube-scheduler schedules, and it calls the
Lockstep beside it (``127.0.0.1``). So Lockstep does not elect a leader of its own: it
*follows* that Lease, and leads exactly while its own sidecar holds it. The leading
kube-scheduler then always calls the leading Lockstep, by construction; two Leases kept
consistent could disagree for a lease period (``docs/failover.md``).

kube-scheduler's holder identity is ``os.Hostname() + "_" + uuid`` (cmd/kube-scheduler
``makeLeaderElectionConfig``). Both containers of a pod share its hostname (the pod's name),
so the sidecar's is the holder whose part before the last ``_`` is this pod's hostname.

**Fencing, by the clock alone.** A renewal the follower sees for the first time was written
after the previous read was *sent* (that read still showed the old record). Another replica
can take the Lease only ``lease_duration`` after it saw that renewal, so no earlier than
``write + lease_duration``. The follower leads until ``previous send + renew_deadline``,
which is before the write plus the renew deadline, so at least ``lease_duration -
renew_deadline`` (5 s by default) before anyone else may act. When reads fail or the holder
stops renewing, :attr:`LeaseFollower.leading` turns false at that instant, checked on every
use: nothing waits for the API server. The first read proves nothing about when the record
was written, so leading starts with the first renewal seen after it (kube-scheduler renews
every ``retry_period``).

**What counts as a renewal: what the standby sees change.** client-go's candidate restarts
its ``lease_duration`` wait only when the election record it reads differs from the last one
(``tryAcquireOrRenew``: ``observedRawRecord``, the JSON of the record
``LeaseSpecToLeaderElectionRecord`` builds from the Lease's *spec*: holder, lease duration,
acquire and renew times, transitions; no metadata). So only a change of ``holderIdentity``,
``renewTime`` or ``leaseTransitions`` extends the lead here: a label, annotation or any other
metadata-only write (a new ``resourceVersion``) changes nothing the standby compares, and
counting it would let this replica lead past the instant the standby takes the Lease.

**Writes are fenced where they leave.** A write checked against :attr:`leading` may still
wait for a connection (a slow API server both costs the Lease and fills the client's
slots), so the client checks the fence again right before the bytes go out and waits for a
connection no longer than :meth:`LeaseFollower.remaining` (``app.kube.client``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .client import KubeClient
from .errors import APIError, APIUnreachable, NotFound

__all__ = ["LeaseFollower", "LeaseTiming", "holder_host", "pod_identity"]

log = logging.getLogger("lockstep.lease")


@dataclass(frozen=True, slots=True)
class LeaseTiming:
    """kube-scheduler's ``leaderElection`` durations as deployed: 15/10/0.5 s (client-go's
    defaults are 15/10/2 s; the shorter retry period is why, docs/failover.md).

    Lockstep must be told the sidecar's own values: it fences itself at ``renew_deadline``
    and reads the Lease every ``poll`` seconds (half the retry period)."""

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 0.5

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration <= 3600:
            raise ValueError(
                "lease timing: need 0 < retry period < renew deadline < lease duration "
                f"<= 3600 s, got {self.retry_period}/{self.renew_deadline}/"
                f"{self.lease_duration}")

    @property
    def poll(self) -> float:
        return self.retry_period / 2


def pod_identity() -> str:
    """This pod's hostname, as kube-scheduler's ``os.Hostname()`` reads it."""
    return socket.gethostname()


def holder_host(holder: str) -> str:
    """The hostname part of a kube-scheduler holder identity (``host_uuid``)."""
    return holder.rpartition("_")[0] if "_" in holder else holder


class LeaseFollower:
    """Reads ``namespace/name`` every ``timing.poll`` seconds and says whether the sidecar
    holding it is this pod's (``identity``), fenced as the module says.

    ``term`` counts the times leading began: the service rebuilds once per term before it
    acts (:meth:`app.service.Lockstep.rebuild`)."""

    def __init__(self, kube: KubeClient, namespace: str, name: str, identity: str, *,
                 timing: LeaseTiming | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.timing = timing or LeaseTiming()
        self.clock = clock
        self.holder = ""
        """The holder identity last read ("" before the first read or with no Lease)."""
        self.term = 0
        self._seen: tuple[str, str, str] | None = None
        """(holderIdentity, renewTime, leaseTransitions) of the last read: what client-go's
        standby compares, and nothing else (the module docstring)."""
        self._last_sent: float | None = None
        self._until = float("-inf")
        """Monotonic instant this replica stops leading unless a fresh renewal is seen."""
        self.changed = asyncio.Event()
        """Set on every gain or loss of the lead (the service's transitions wait on it)."""
        self.wake = asyncio.Event()
        """Set to read the Lease now rather than at the next poll: a verb came from the
        sidecar, which calls only once it leads (:meth:`app.service.Lockstep.await_acting`)."""
        self._was = False

    @property
    def path(self) -> str:
        return (f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/"
                f"{self.name}")

    @property
    def leading(self) -> bool:
        """True while the sidecar holds the Lease and its last renewal is fresh enough."""
        return self.clock() < self._until

    def remaining(self) -> float:
        """Seconds until the fence, unless a fresh renewal is seen first (0 when not
        leading): how long a write may still wait before it is sent."""
        return max(0.0, self._until - self.clock())

    def observe(self, lease: dict[str, Any] | None, sent: float) -> None:
        """One read of the Lease (None: there is none), sent at monotonic ``sent``."""
        spec = (lease or {}).get("spec") or {}
        record = (str(spec.get("holderIdentity") or ""), str(spec.get("renewTime") or ""),
                  str(spec.get("leaseTransitions") or ""))
        self.holder = record[0]
        mine = bool(record[0]) and holder_host(record[0]) == self.identity
        if not mine:
            self._until = float("-inf")
        elif self._seen is not None and record != self._seen and self._last_sent is not None:
            # Renewed (or taken) by our sidecar after the previous read was sent.
            self._until = max(self._until, self._last_sent + self.timing.renew_deadline)
        self._seen, self._last_sent = record, sent
        self.note_transition()

    def note_transition(self) -> bool:
        """Log and signal a gain or loss of the lead; returns whether it leads now."""
        now = self.leading
        if now != self._was:
            self._was = now
            if now:
                self.term += 1
            log.warning("lease %s/%s: %s (holder %s)", self.namespace, self.name,
                        "this replica leads" if now else "this replica does not lead",
                        self.holder or "none")
            self.changed.set()
        return now

    async def read(self) -> None:
        sent = self.clock()
        try:
            lease = await self.kube.request("GET", self.path)
        except NotFound:
            lease = None
        except (APIError, APIUnreachable) as e:
            log.info("lease %s/%s unreadable: %s", self.namespace, self.name, e)
            self.note_transition()
            return
        self.observe(lease if isinstance(lease, dict) else None, sent)

    async def run(self) -> None:
        """Read forever; wake at the fence too, so a loss is signalled on time."""
        while True:
            await self.read()
            wait = self.timing.poll
            if self.leading:
                wait = max(0.0, min(wait, self._until - self.clock()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), wait)
            self.wake.clear()
            self.note_transition()
