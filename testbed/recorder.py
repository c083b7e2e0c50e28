"""The binding recorder: watches every pod and records when and where it was bound.

It checks design invariant 1 on the real cluster: no gang is ever partially bound. Binding N
pods is N API calls, so a watch sees a gang's count climb over a few milliseconds; what is
asserted is that a gang's first binding comes after its min-member-th member was created,
that from its first binding the gang reaches min-member bound within a short window, and
that no gang rests partially bound.

Times are local ``time.monotonic()`` readings taken when the watch delivered the event:
``metadata.creationTimestamp`` has 1 s resolution, too coarse to order a gang's members
against its first binding (it is kept as ``created`` for reports only).

It also watches every ResourceClaim (``testbed.claims``): a gang member parked at bind holds
the devices kube-scheduler allocated it, so ``claim_problems`` checks those allocations
against the pods (``assert_gang_invariants`` checks both).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .claims import ClaimLedger, PodView
from .kube import Kube, KubeError

__all__ = ["BindingRecorder", "PodRecord"]

GANG_KEYS = ("lockstep.dev/pod-group", "scheduling.x-k8s.io/pod-group",
             "kueue.x-k8s.io/pod-group-name", "scheduling.k8s.io/group-name",
             "gang.scheduling.koordinator.sh/name")
SIZE_KEYS = ("lockstep.dev/min-member", "kueue.x-k8s.io/pod-group-total-count",
             "scheduling.volcano.sh/group-min-member",
             "gang.scheduling.koordinator.sh/min-available")
"""Every convention's gang name and size keys, so the invariant is checked for all of them."""
UPSTREAM_VERSIONS = ("v1beta1", "v1alpha3", "v1alpha2")
"""Kubernetes' own gang API: a pod's ``spec.schedulingGroup.podGroupName`` names a
``scheduling.k8s.io`` PodGroup whose ``spec.schedulingPolicy.gang.minCount`` is the size."""
CLAIMS = "/apis/resource.k8s.io/v1/resourceclaims"
GROUPS_KEY = "gang.scheduling.koordinator.sh/groups"
"""Koordinator's gang groups: every gang listed binds together or none does."""


@dataclass
class PodRecord:
    namespace: str
    name: str
    uid: str
    gang: str | None
    min_member: int | None
    first_seen: float
    bound_at: float | None = None
    node: str | None = None
    deleted_at: float | None = None
    created: str | None = None
    """metadata.creationTimestamp (1 s resolution)."""
    group: str | None = None
    """The Koordinator gang-group annotation, as written."""


@dataclass
class BindingRecorder:
    kube: Kube
    pods: dict[tuple[str, str], PodRecord] = field(default_factory=dict)
    """(namespace, name) -> the newest pod of that name."""
    retired: list[PodRecord] = field(default_factory=list)
    """Earlier pods of a name that was reused (deleted and created again: a new UID)."""
    relists: int = 0
    """Lists of pods or of ResourceClaims (the first of each included)."""

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._claims_synced = threading.Event()
        self._thread = threading.Thread(target=self._run, name="binding-recorder", daemon=True)
        self._claims_thread = threading.Thread(target=self._run_claims, name="claim-recorder",
                                               daemon=True)
        self.claims = ClaimLedger()
        """Every ResourceClaim allocation seen (``testbed.claims``)."""
        # The watch gets a client of its own in start(), closed by stop(): an open watch would
        # hold up the API server's graceful shutdown (it waits for every connection to go idle).
        self._watch: Kube | None = None
        self.min_member_of: dict[str, int] = {}
        """gang (ns/name) -> min-member for gangs declared by PodGroup objects."""
        self.gang_of: Callable[[dict[str, Any]], str | None] | None = None
        """A test's own reading of which gang a pod is in (a pod's JSON -> the gang's name in
        its namespace, None: read the conventions' keys), for gangs no pod key names alone:
        a JobSet's opt-in gang, one LWS group, one ``dependsOn`` stage of a TrainJob. Set it
        before the pods are created; give each such gang's size in ``min_member_of``."""
        self.created_late: set[str] = set()
        """Gangs (ns/name) whose controller creates some members only once the first is bound
        (LWS and JobSet exclusive topology: the workers' nodeSelector names the leader's
        domain). Their quorum cannot exist before a binding, so their promise is checked from
        the moment min-member of them exist: min-member bound within the window of that
        moment (or of the first binding, if later), and never resting partially bound."""

    def start(self) -> BindingRecorder:
        self._watch = self.kube.clone()
        self._thread.start()
        self._claims_thread.start()
        if not (self._synced.wait(30) and self._claims_synced.wait(30)):
            raise RuntimeError("binding recorder did not sync")
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.abort_watches()
        for thread in (self._thread, self._claims_thread):
            if thread.is_alive():
                thread.join(5)
        if self._watch is not None:
            self._watch.close()

    def _observe(self, etype: str, obj: dict[str, Any], now: float) -> None:
        meta = obj.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        ann = meta.get("annotations") or {}
        labels = meta.get("labels") or {}
        with self._lock:
            rec = self.pods.get(key)
            if rec is None or rec.uid != meta.get("uid"):
                if rec is not None:  # the name was reused: keep the old pod's history
                    if rec.deleted_at is None:
                        rec.deleted_at = now  # its DELETED event was not seen (relist)
                    self.retired.append(rec)
                gang = (self.gang_of(obj) if self.gang_of is not None else None) or next(
                    (v for k in GANG_KEYS for v in (ann.get(k), labels.get(k)) if v),
                    None) or ((obj.get("spec") or {}).get("schedulingGroup")
                              or {}).get("podGroupName")
                mm = next((ann[k] for k in SIZE_KEYS if ann.get(k)), None)
                rec = PodRecord(key[0], key[1], str(meta.get("uid")), gang,
                                int(mm) if mm and mm.isdigit() else None, now,
                                created=meta.get("creationTimestamp"),
                                group=ann.get(GROUPS_KEY) or None)
                self.pods[key] = rec
            node = (obj.get("spec") or {}).get("nodeName")
            if node and rec.bound_at is None:
                rec.bound_at, rec.node = now, node
            if etype == "DELETED":
                rec.deleted_at = now

    def _run(self) -> None:
        self._run_watch("/api/v1/pods", self._observe, self._pods_relisted, self._synced)

    def _run_claims(self) -> None:
        def observe(etype: str, obj: dict[str, Any], now: float) -> None:
            with self._lock:
                self.claims.observe(etype, obj, now)

        def relisted(keys: set[tuple[str, str, str]], now: float) -> None:
            with self._lock:
                self.claims.relisted((uid for _, _, uid in keys), now)

        self._run_watch(CLAIMS, observe, relisted, self._claims_synced)

    def _pods_relisted(self, listed: set[tuple[str, str, str]], now: float) -> None:
        names = {(ns, name) for ns, name, _ in listed}
        with self._lock:  # deleted while the watch was down
            for key, rec in self.pods.items():
                if key not in names and rec.deleted_at is None:
                    rec.deleted_at = now

    def _run_watch(self, path: str, observe: Callable[[str, dict[str, Any], float], None],
                   relisted: Callable[[set[tuple[str, str, str]], float], None],
                   synced: threading.Event) -> None:
        """List ``path``, then watch it from there; relist on 410 Gone or a broken watch.
        ``relisted`` gets (namespace, name, uid) of every object listed."""
        rv = ""
        while not self._stop.is_set():
            try:
                if not rv:
                    data = self.kube.request("GET", path)
                    now = time.monotonic()
                    listed = set()
                    for obj in data.get("items") or ():
                        observe("ADDED", obj, now)
                        meta = obj.get("metadata") or {}
                        listed.add((meta.get("namespace", ""), meta.get("name", ""),
                                    str(meta.get("uid"))))
                    relisted(listed, now)
                    rv = data["metadata"]["resourceVersion"]
                    self.relists += 1
                    synced.set()
                assert self._watch is not None
                for ev in self._watch.watch(path, rv, timeout=30):
                    if self._stop.is_set():
                        return
                    obj = ev.get("object") or {}
                    if ev.get("type") == "ERROR":
                        rv = ""  # 410 Gone or similar: relist
                        break
                    rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                    if ev.get("type") != "BOOKMARK":
                        observe(str(ev.get("type")), obj, time.monotonic())
            except KubeError as e:
                if e.status == 410:  # resourceVersion too old: relist
                    rv = ""
                if e.status == 404 and not rv:  # not served (no resource.k8s.io/v1)
                    synced.set()
                    return
                time.sleep(0.2)
            except Exception:  # connection refused (API server restarting), read timeout
                if self._stop.is_set():
                    return
                time.sleep(0.2)

    # ------------------------------------------------------------------ queries

    def bound(self, ns: str) -> dict[str, str]:
        with self._lock:
            return {r.name: r.node for r in self.pods.values()
                    if r.namespace == ns and r.node and r.deleted_at is None}

    def wait_bound(self, ns: str, names: list[str], timeout: float = 60.0) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            b = self.bound(ns)
            if all(n in b for n in names):
                return {n: b[n] for n in names}
            time.sleep(0.1)
        b = self.bound(ns)
        missing = [n for n in names if n not in b]
        raise TimeoutError(f"not bound after {timeout:.0f}s: {missing} (bound: {sorted(b)})")

    def records(self, ns: str | None = None, gang: str | None = None) -> list[PodRecord]:
        """Every pod seen (of ``ns``, of ``gang``), earlier pods of a reused name included,
        in the order first seen."""
        with self._lock:
            recs = [r for r in (*self.retired, *self.pods.values())
                    if (ns is None or r.namespace == ns) and (gang is None or r.gang == gang)]
        return sorted(recs, key=lambda r: r.first_seen)

    def timeline(self, ns: str | None = None, gang: str | None = None,
                 t0: float | None = None) -> str:
        """Every pod (of ``ns``, of ``gang``; earlier pods of a reused name included) in the
        order first seen; times relative to ``t0`` (default: the first pod shown)."""
        recs = self.records(ns, gang)
        if t0 is None:
            t0 = recs[0].first_seen if recs else 0.0
        return "\n".join(
            f"  {r.namespace + '/' + r.name:<28} uid={r.uid[:8]} gang={r.gang} "
            f"seen=+{r.first_seen - t0:.3f}s "
            + (f"bound=+{r.bound_at - t0:.3f}s on {r.node}" if r.bound_at else "unbound")
            + (f" deleted=+{r.deleted_at - t0:.3f}s" if r.deleted_at else "")
            for r in recs
        )

    @staticmethod
    def incarnations(members: list[PodRecord]) -> list[list[PodRecord]]:
        """A gang's pods split into runs of the job: a pod created when every earlier member
        was already deleted starts a new run (a job rerun under the same gang name). Members
        deleted and replaced while others live stay in the same run."""
        runs: list[list[PodRecord]] = []
        for r in sorted(members, key=lambda m: m.first_seen):
            if runs and any(m.deleted_at is None or m.deleted_at > r.first_seen
                            for m in runs[-1]):
                runs[-1].append(r)
            else:
                runs.append([r])
        return runs

    def _min_member(self, ns: str, gang: str, members: list[PodRecord]) -> int:
        """min-member: PodGroup given to ``min_member_of``, the annotation, the PodGroup
        object of that name (scheduler-plugins, else upstream ``scheduling.k8s.io``), or
        else every member seen."""
        known = self.min_member_of.get(f"{ns}/{gang}") or max(
            (m.min_member or 0 for m in members), default=0)
        if known:
            return known
        try:
            pg = self.kube.get(
                f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups/{gang}")
            mm = int((pg.get("spec") or {}).get("minMember") or 0)
        except Exception:  # no PodGroup CRD or object, or the API server is gone
            mm = 0
        for version in UPSTREAM_VERSIONS if not mm else ():
            try:
                pg = self.kube.get(f"/apis/scheduling.k8s.io/{version}/namespaces/{ns}/"
                                   f"podgroups/{gang}")
            except Exception:  # not served at this version, no such object
                continue
            policy = (pg.get("spec") or {}).get("schedulingPolicy") or {}
            # A basic policy is no gang: each pod stands alone.
            mm = int((policy.get("gang") or {}).get("minCount") or 0) or 1
            break
        if mm:
            self.min_member_of[f"{ns}/{gang}"] = mm
        return mm or len(members)

    def gang_problems(self, ns: str | None = None, window: float = 1.0
                      ) -> list[tuple[str, str, str]]:
        """(namespace, gang, problem) for every run of every gang (in ``ns``, or in every
        namespace) that breaks invariant 1: its first binding must come when min-member of
        its pods exist (created, not deleted), it must reach min-member bound within
        ``window`` seconds of its first binding, and it must not rest with
        0 < bound < min-member (counting pods bound, then deleted, as bound), neither to the
        end nor for longer than ``window`` before its members were deleted."""
        by_gang: dict[tuple[str, str], list[PodRecord]] = {}
        for r in self.records(ns):
            if r.gang:
                by_gang.setdefault((r.namespace, r.gang), []).append(r)
        problems = []
        for (gns, name), all_members in sorted(by_gang.items()):
            runs = self.incarnations(all_members)
            for i, members in enumerate(runs):
                g = name if ns is not None else f"{gns}/{name}"
                if len(runs) > 1:
                    g += f" (run {i + 1} of {len(runs)})"
                bound = sorted(m.bound_at for m in members if m.bound_at is not None)
                if not bound:
                    continue
                mm = self._min_member(gns, name, members)
                t = bound[0]
                live = sum(1 for m in members if m.first_seen <= t
                           and (m.deleted_at is None or m.deleted_at > t))
                late = f"{gns}/{name}" in self.created_late
                if late and len(members) >= mm:  # timed from its quorum's existence
                    t = max(t, sorted(m.first_seen for m in members)[mm - 1])
                if len(members) < mm:
                    problems.append(
                        (gns, name, f"gang {g}: bound with only {len(members)} of {mm} "
                                    "members created"))
                elif live < mm and not late:
                    problems.append(
                        (gns, name, f"gang {g}: first binding before min-member ({mm}) "
                                    f"members existed ({live} did)"))
                if len(bound) < mm:
                    # Deleting members can cut a gang's binding short (its job failed, its
                    # node went away): allowed within the window, not after.
                    cut = min((m.deleted_at for m in members
                               if m.deleted_at is not None and m.deleted_at >= t), default=None)
                    if cut is None:
                        problems.append(
                            (gns, name, f"gang {g}: rests partially bound "
                                        f"({len(bound)}/{mm})"))
                    elif cut - t > window:
                        problems.append(
                            (gns, name, f"gang {g}: was partially bound ({len(bound)}/{mm}) "
                                        f"for {cut - t:.2f}s until members were deleted"))
                elif bound[mm - 1] - t > window:
                    problems.append(
                        (gns, name, f"gang {g}: took {bound[mm - 1] - t:.2f}s "
                                    f"(> {window}s) to reach {mm} bound"))
        return problems + self._group_problems(by_gang, window)

    def _group_problems(self, by_gang: dict[tuple[str, str], list[PodRecord]], window: float
                        ) -> list[tuple[str, str, str]]:
        """A Koordinator gang group binds as one: once any listed gang has a binding, every
        listed gang must reach its own min-member within ``window`` (groups none of whose
        members were deleted; deletion is judged per gang above)."""
        problems = []
        groups = {r.group for rs in by_gang.values() for r in rs if r.group}
        for raw in sorted(groups):
            try:
                listed = [tuple(x.split("/", 1)) for x in json.loads(raw)]
            except (ValueError, AttributeError):
                continue
            first: list[float] = []
            reached: dict[str, float | None] = {}
            for gns, name in listed:
                members = by_gang.get((gns, name), [])
                if any(m.deleted_at is not None for m in members):
                    break
                times = sorted(m.bound_at for m in members if m.bound_at is not None)
                first += times[:1]
                mm = self._min_member(gns, name, members) if members else 1
                reached[f"{gns}/{name}"] = times[mm - 1] if len(times) >= mm else None
            else:
                if not first:
                    continue
                late = {g: t for g, t in reached.items()
                        if t is None or t - min(first) > window}
                if late:
                    ns0 = listed[0][0]
                    problems.append((ns0, raw, f"gang group {raw}: bound in part; "
                                               f"not whole within {window}s: {sorted(late)}"))
        return problems

    def allocated(self, ns: str) -> dict[str, tuple[str, ...]]:
        """Pod name -> the devices (``driver/pool/device``) its ResourceClaims hold now."""
        with self._lock:
            return self.claims.allocated(ns)

    def claim_problems(self, ns: str | None = None, hold: float = 20.0,
                       now: float | None = None) -> list[tuple[str, str, str]]:
        """(namespace, claim, problem) for every DRA allocation that breaks a rule of
        ``testbed.claims``: a claim held by an unbound gang member for longer than ``hold``
        seconds, a device held by two claims at once, a claim on another node than its pod.
        A hold still open counts until ``now`` (default: this moment)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            pods = {r.uid: PodView(r.name, r.gang, r.bound_at, r.node, r.deleted_at)
                    for r in (*self.retired, *self.pods.values())}
            return self.claims.problems(pods, now, ns, hold)

    def assert_gang_invariants(self, ns: str | None = None, window: float = 1.0,
                               hold: float = 20.0) -> None:
        """``gang_problems`` and ``claim_problems``, raised as one AssertionError with a
        timeline."""
        problems = self.gang_problems(ns, window) + self.claim_problems(ns, hold)
        if problems:
            raise AssertionError("; ".join(p for _, _, p in problems) + "\n"
                                 + self.timeline(ns))
