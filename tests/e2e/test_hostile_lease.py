"""Hostile edits of the kube-scheduler Lease that Lockstep follows, through the real API server,
on the default install: two Lockstep + kube-scheduler pairs (``testbed.replicas``, as
``deploy/`` runs them: leader election on ``lockstep-system/lockstep-scheduler`` at 15/10/0.5 s,
each Lockstep following it with ``--leader-elect-lease``), the webhook behind the forwarder.

The edits (:data:`EDITS`): metadata only (a label; 100 annotations and one of 200 KiB), a
``renewTime`` in the year 9999 and in 1970, garbage ``leaseDurationSeconds`` (2^31-1 and 1
accepted; 0, -1, a word, 2^63 and 1e99 refused by the API server, counted), the Lease
deleted, and ``holderIdentity`` set to another pod: the standby's hostname with a made-up
uuid, and the leader's own hostname with a made-up uuid (what the Lease says of a
kube-scheduler whose container restarted) while something keeps stamping the Lease's
annotations once a second.

A process that exits is started again at once, as the kubelet restarts a container: a
kube-scheduler that cannot renew for ``renewDeadline`` exits ("leaderelection lost"), and a
Lockstep that loses the lead exits to start again as a standby (``app.service.LostLease``);
the count is printed.

After each edit:

* every Lockstep answers ``/healthz`` at once (no answer within 1 s fails; a replica exiting
  after losing the lead, or starting again, may refuse);
* the system recovers: the Lease is held by a live replica's kube-scheduler (not by an
  identity the test wrote) and that replica's Lockstep acts (``lockstep_leading`` 1). What
  that takes is the real system's: an edit the leader's kube-scheduler writes over (metadata,
  ``renewTime``, the duration) is renewed within ``retryPeriod`` (0.5 s); a deleted Lease is
  created again within 0.5 s, and the leading Lockstep, which read it gone, starts again (a
  few seconds); a Lease held by an identity no kube-scheduler has passes only once
  ``leaseDuration`` (15 s) has gone by since each candidate saw it, plus up to two jittered
  retry periods and the new leader's rebuild. :data:`RECOVERY` (15 + 2 + 10 s for restarts
  on a loaded machine) bounds them all; the time taken is printed;
* then, once every process runs again and both Locksteps are ready (a Lockstep that lost the
  lead comes back as a standby: a few seconds), both answer ``/healthz`` within 1 s, a normal
  gang binds within 20 s, and the API server called the webhook without failing open;

and, for the edit to the leader's own hostname: from ``renewDeadline`` + 1 s after it (and
before the Lease can pass, at 15 s), that replica's Lockstep does not act, however often the
Lease's metadata changes: its kube-scheduler stopped renewing at the edit, so the fence
(``app.kube.lease``) must have closed at ``renewDeadline``. At the end no gang was ever partially
bound. Failures are collected and reported once, as in ``test_hostile``.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import orjson
import pytest
import yaml

from testbed.replicas import LEASE, SCHEDULER_CONFIG, Replicas
from testbed.runner import StartupError
from testbed.workloads import pod

from .conftest import Cluster, ClusterFactory
from .test_hostile import Hostile
from .test_webhook import fail_open

PATH = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE[0]}/leases/{LEASE[1]}"
_ELECTION = yaml.safe_load(SCHEDULER_CONFIG.read_text())["leaderElection"]
LEASE_DURATION = float(_ELECTION["leaseDuration"].rstrip("s"))
RENEW_DEADLINE = float(_ELECTION["renewDeadline"].rstrip("s"))
RECOVERY = LEASE_DURATION + 2.0 + 10.0
"""Seconds the real system may take to have a leader acting again after an edit."""


@dataclass
class Kubelet:
    """Starts again, at once, any process of the replicas that exits (as the kubelet restarts
    a pod's container; its back-off is left out to keep the suite short)."""

    c: Cluster
    names: list[str]
    restarts: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Kubelet:
        self._thread = threading.Thread(target=self._run, daemon=True, name="kubelet")
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            for name in self.names:
                if not self.c.bed.procs[name].alive() and not self._stop.is_set():
                    self.restarts[name] = self.restarts.get(name, 0) + 1
                    try:
                        self.c.bed.restart(name)
                    except StartupError as e:
                        self.errors.append(f"{name} did not start again: {str(e)[:300]}")
            self._stop.wait(0.2)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(90)


@dataclass
class Bed:
    c: Cluster
    r: Replicas
    h: Hostile
    written: set[str] = field(default_factory=set)
    """Holder identities the test wrote: no kube-scheduler has them."""

    def lockstep(self, name: str, path: str, timeout: float = 1.0) -> httpx.Response | None:
        """GET ``path`` of replica ``name``'s Lockstep; None when it refuses (not running)."""
        try:
            return httpx.get(self.r.replicas[name].url + path, timeout=timeout)
        except httpx.ConnectError:
            return None

    def acts(self, name: str) -> bool:
        try:
            got = self.lockstep(name, "/metrics", timeout=2.0)
        except httpx.HTTPError:
            return False
        return got is not None and any(line == "lockstep_leading 1.0"
                                       for line in got.text.splitlines())

    def holder(self) -> str:
        try:
            return str(self.c.kube.get(PATH).get("spec", {}).get("holderIdentity") or "")
        except Exception:
            return ""

    def leader(self) -> str:
        host = self.holder().rpartition("_")[0]
        return host if host in self.r.replicas else sorted(self.r.replicas)[0]

    def standby(self) -> str:
        return next(n for n in sorted(self.r.replicas) if n != self.leader())

    def patch(self, edit: str, body: dict[str, object] | bytes) -> bool:
        """A merge patch of the Lease (``bytes``: written as is); True when applied."""
        data = body if isinstance(body, bytes) else orjson.dumps(body)
        r = httpx.patch(self.c.bed.api_url + PATH, content=data, verify=False, timeout=30,
                        headers={"Authorization": f"Bearer {self.c.bed.token}",
                                 "Content-Type": "application/merge-patch+json"})
        if r.status_code >= 500:
            self.h.failures.append(f"{edit}: API server answered {r.status_code}: "
                                   f"{r.text[:200]}")
        if r.status_code == 200:
            self.h.created += 1
            return True
        self.h.refused += 1
        self.h.refusals.append(f"{edit} {data[:60]!r}: {r.status_code} {r.text[:200]}")
        return False

    def healthz_answers(self, edit: str) -> None:
        """No Lockstep takes over 1 s to answer (one exiting or restarting may refuse)."""
        for name in self.r.replicas:
            t = time.monotonic()
            try:
                self.lockstep(name, "/healthz")
                ok = time.monotonic() - t < 1.0
            except httpx.HTTPError:
                ok = False
            self.h.check(ok, f"{edit}: {name}'s /healthz did not answer within 1 s")

    def recovered(self, edit: str) -> float | None:
        """Seconds until a live replica's kube-scheduler holds the Lease and its Lockstep acts
        (None: not within :data:`RECOVERY`)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < RECOVERY:
            holder = self.holder()
            name = holder.rpartition("_")[0]
            if holder not in self.written and name in self.r.replicas and all(
                    self.c.bed.procs[p].alive() for p in (name, f"{name}-scheduler")) \
                    and self.acts(name):
                return time.monotonic() - t0
            time.sleep(0.2)
        self.h.failures.append(f"{edit}: no replica leads and acts {RECOVERY:.0f} s after "
                               f"it (Lease holder {self.holder()!r})")
        return None

    def settled(self) -> None:
        """Until every process runs and every Lockstep is ready: one that lost the lead exits
        and is started again (up to the readiness of a fresh start, ~5 s here)."""
        def up() -> bool:
            for name in self.r.replicas:
                if not all(self.c.bed.procs[p].alive() for p in (name, f"{name}-scheduler")):
                    return False
                try:
                    got = self.lockstep(name, "/readyz", timeout=2.0)
                except httpx.HTTPError:
                    return False
                if got is None or got.status_code != 200:
                    return False
            return True
        try:
            self.c.kube.wait("every replica running and ready", up, timeout=60)
        except TimeoutError as e:
            self.h.failures.append(str(e))

    def normal_gang_binds(self, edit: str) -> None:
        self.settled()
        for name in self.r.replicas:
            got = None
            t = time.monotonic()
            with contextlib.suppress(httpx.HTTPError):
                got = self.lockstep(name, "/healthz")
            self.h.check(got is not None and got.status_code == 200
                         and time.monotonic() - t < 1.0,
                         f"{edit}: {name}'s /healthz did not answer 200 within 1 s after "
                         f"recovery ({got.status_code if got is not None else 'refused'})")
        names = [f"ok-{edit}-0", f"ok-{edit}-1"]
        self.c.create(*(pod(n).gang(f"ok-{edit}", 2).gpu(1).build() for n in names))
        try:
            self.c.wait_bound(names, 20)
            self.h.check(True, "")
        except TimeoutError:
            self.h.failures.append(f"{edit}: a normal gang of 2 did not bind within 20 s")
        self.c.delete(*names)
        moved = fail_open(self.c) - self.c.extra["fail_open"]
        self.h.check(moved == 0, f"{edit}: the API server ignored {moved:g} failed webhook "
                                 "call(s)")
        self.c.extra["fail_open"] = fail_open(self.c)


# ------------------------------------------------------------------------------ the edits


def edit_label(b: Bed, edit: str) -> None:
    b.patch(edit, {"metadata": {"labels": {"hostile.example.com/edited": "yes"}}})


def edit_annotations(b: Bed, edit: str) -> None:
    many: dict[str, object] = {f"hostile.example.com/a{i}": "x" * 100 for i in range(100)}
    b.patch(edit, {"metadata": {"annotations": {**many, "hostile.example.com/big":
                                                "y" * 200_000}}})


def edit_renew_far_future(b: Bed, edit: str) -> None:
    b.patch(edit, {"spec": {"renewTime": "9999-12-31T23:59:59.999999Z"}})


def edit_renew_far_past(b: Bed, edit: str) -> None:
    b.patch(edit, {"spec": {"renewTime": "1970-01-01T00:00:00.000000Z"}})


def edit_garbage_duration(b: Bed, edit: str) -> None:
    for raw in ("0", "-1", '"abc"', "9223372036854775808", "1e99", "1", "2147483647"):
        b.patch(edit, b'{"spec": {"leaseDurationSeconds": ' + raw.encode() + b"}}")


def edit_delete(b: Bed, edit: str) -> None:
    b.c.kube.request("DELETE", PATH)


def edit_holder_standby(b: Bed, edit: str) -> None:
    fake = f"{b.standby()}_{uuid.uuid4()}"
    b.written.add(fake)
    b.patch(edit, {"spec": {"holderIdentity": fake}})


def edit_holder_stale_while_stamped(b: Bed, edit: str) -> None:
    """The leader's hostname with another uuid, then an annotation edit once a second; from
    ``renewDeadline`` + 1 s on, the leader's Lockstep must not act."""
    leader = b.leader()
    fake = f"{leader}_{uuid.uuid4()}"
    b.written.add(fake)
    b.patch(edit, {"spec": {"holderIdentity": fake}})
    t0 = time.monotonic()
    acted: list[float] = []
    i = 0
    while (now := time.monotonic() - t0) < LEASE_DURATION - 1.5:
        b.patch(edit, {"metadata": {"annotations": {"hostile.example.com/stamp": str(i)}}})
        if now > RENEW_DEADLINE + 1.0 and b.acts(leader):
            acted.append(round(now, 1))
        i += 1
        time.sleep(max(0.0, t0 + i - time.monotonic()))
    b.h.check(not acted, f"{edit}: {leader}'s Lockstep still acted {acted} s after its "
                         f"kube-scheduler stopped renewing (holder {fake}): metadata-only "
                         "edits were taken for renewals")


EDITS: dict[str, Callable[[Bed, str], None]] = {
    "label": edit_label, "annotations": edit_annotations,
    "renew-far-future": edit_renew_far_future, "renew-far-past": edit_renew_far_past,
    "garbage-duration": edit_garbage_duration, "delete": edit_delete,
    "holder-stale-stamped": edit_holder_stale_while_stamped,
    "holder-standby": edit_holder_standby,
}


def test_hostile_lease_edits_never_stop_lockstep(
    cluster: ClusterFactory, capsys: pytest.CaptureFixture[str],
) -> None:
    c = cluster("tiny-3x2", lockstep=False)
    r = Replicas(c.bed).start()
    kubelet = Kubelet(c, [p for n in sorted(r.replicas) for p in (n, f"{n}-scheduler")])
    b = Bed(c, r, Hostile())
    try:
        r.wait_leader(c.kube)
        c.extra["fail_open"] = fail_open(c)
        kubelet.start()
        for edit, apply in EDITS.items():
            before = len(b.h.failures)
            t0 = time.monotonic()
            apply(b, edit)
            applied = time.monotonic() - t0
            time.sleep(0.5)
            b.healthz_answers(edit)
            took = b.recovered(edit)
            b.normal_gang_binds(edit)
            with capsys.disabled():
                print(f"\n  lease edit {edit}: applied in {applied:.1f} s, recovered in "
                      f"{'-' if took is None else f'{took:.1f}'} s; restarts so far "
                      f"{kubelet.restarts}; {len(b.h.failures) - before} failed check(s)",
                      flush=True)
    finally:
        kubelet.stop()
        r.stop()
    b.h.failures += kubelet.errors
    try:
        c.recorder.assert_gang_invariants(c.ns)
    except AssertionError as e:
        b.h.failures.append(f"a gang was partially bound: {e}")
    with capsys.disabled():
        print(f"\nhostile lease edits: {b.h.created} applied, {b.h.refused} refused by the API "
              f"server, {b.h.checks} checks passed, {len(b.h.failures)} failed; "
              "refused:\n    " + "\n    ".join(b.h.refusals), flush=True)
    assert not b.h.failures, "\n".join(b.h.failures)
