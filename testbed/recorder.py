"""The binding recorder: watches every pod and records when and where it was bound.

It checks design invariant 1 on the real cluster: no gang is ever partially bound. Binding N
pods is N API calls, so a watch sees a gang's count climb over a few milliseconds; what is
asserted is that a gang's first binding comes after its min-member-th member was created,
that from its first binding the gang reaches min-member bound within a short window, and
that no gang rests partially bound.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .kube import Kube, KubeError

__all__ = ["BindingRecorder", "PodRecord"]

GANG_KEYS = ("lockstep.dev/pod-group", "scheduling.x-k8s.io/pod-group")


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


@dataclass
class BindingRecorder:
    kube: Kube
    pods: dict[tuple[str, str], PodRecord] = field(default_factory=dict)
    relists: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._thread = threading.Thread(target=self._run, name="binding-recorder", daemon=True)
        self.min_member_of: dict[str, int] = {}
        """gang (ns/name) -> min-member for gangs declared by PodGroup objects."""

    def start(self) -> BindingRecorder:
        self._thread.start()
        if not self._synced.wait(30):
            raise RuntimeError("binding recorder did not sync")
        return self

    def stop(self) -> None:
        self._stop.set()

    def _observe(self, etype: str, obj: dict[str, Any], now: float) -> None:
        meta = obj.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        ann = meta.get("annotations") or {}
        labels = meta.get("labels") or {}
        with self._lock:
            rec = self.pods.get(key)
            if rec is None or rec.uid != meta.get("uid"):
                gang = next((v for k in GANG_KEYS for v in (ann.get(k), labels.get(k)) if v),
                            None)
                mm = ann.get("lockstep.dev/min-member")
                rec = PodRecord(key[0], key[1], str(meta.get("uid")), gang,
                                int(mm) if mm and mm.isdigit() else None, now)
                self.pods[key] = rec
            node = (obj.get("spec") or {}).get("nodeName")
            if node and rec.bound_at is None:
                rec.bound_at, rec.node = now, node
            if etype == "DELETED":
                rec.deleted_at = now

    def _run(self) -> None:
        rv = ""
        while not self._stop.is_set():
            try:
                if not rv:
                    data = self.kube.request("GET", "/api/v1/pods")
                    now = time.monotonic()
                    for obj in data.get("items") or ():
                        self._observe("ADDED", obj, now)
                    rv = data["metadata"]["resourceVersion"]
                    self.relists += 1
                    self._synced.set()
                for ev in self.kube.watch("/api/v1/pods", rv, timeout=30):
                    if self._stop.is_set():
                        return
                    obj = ev.get("object") or {}
                    if ev.get("type") == "ERROR":
                        rv = ""  # 410 Gone or similar: relist
                        break
                    rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                    if ev.get("type") != "BOOKMARK":
                        self._observe(str(ev.get("type")), obj, time.monotonic())
            except (KubeError, OSError, Exception):
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

    def timeline(self, ns: str) -> str:
        with self._lock:
            recs = sorted((r for r in self.pods.values() if r.namespace == ns),
                          key=lambda r: r.first_seen)
            t0 = recs[0].first_seen if recs else 0.0
            return "\n".join(
                f"  {r.name:<20} gang={r.gang} seen=+{r.first_seen - t0:.3f}s "
                + (f"bound=+{r.bound_at - t0:.3f}s on {r.node}" if r.bound_at else "unbound")
                for r in recs
            )

    def assert_gang_invariants(self, ns: str, window: float = 1.0) -> None:
        """Invariant 1 for every gang in ``ns`` (raises AssertionError with a timeline)."""
        with self._lock:
            gangs: dict[str, list[PodRecord]] = {}
            for r in self.pods.values():
                if r.namespace == ns and r.gang:
                    gangs.setdefault(r.gang, []).append(r)
        problems = []
        for g, members in sorted(gangs.items()):
            mm = self.min_member_of.get(f"{ns}/{g}") or max(
                (m.min_member or 0 for m in members), default=0) or len(members)
            bound = sorted(m.bound_at for m in members if m.bound_at is not None)
            if not bound:
                continue
            seen = sorted(m.first_seen for m in members)
            if len(seen) < mm:
                problems.append(f"gang {g}: bound with only {len(seen)} of {mm} members created")
            elif bound[0] < seen[mm - 1]:
                problems.append(f"gang {g}: first binding before its {mm}th member existed")
            if len(bound) < mm:
                live_bound = sum(1 for m in members if m.bound_at and m.deleted_at is None)
                if live_bound:
                    problems.append(f"gang {g}: rests partially bound ({len(bound)}/{mm})")
            elif bound[mm - 1] - bound[0] > window:
                problems.append(
                    f"gang {g}: took {bound[mm - 1] - bound[0]:.2f}s (> {window}s) to reach "
                    f"{mm} bound")
        if problems:
            raise AssertionError("; ".join(problems) + "\n" + self.timeline(ns))
