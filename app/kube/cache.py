"""List/watch of nodes, pods and PodGroups into the core, kopf-style.

Each resource: list (paginated), hand the whole set to the core as a *replacement* (so objects
deleted while we were not watching disappear too, which kopf's re-listing does not need but a
cache does), then watch from the list's resourceVersion with bookmarks. A 410 Gone or a broken
stream that cannot resume means: list again. Readiness is reported only after the first full
list of every resource.

The upstream gang API (``scheduling.k8s.io`` PodGroups and 1.35 Workloads) is found by API
discovery: whichever of its versions the server serves
(``coscheduling.conventions.upstream``), or none (Kubernetes before 1.35, or the
``GenericWorkload`` gate off), which counts as synced and empty and is looked for again
every 30 s. Its absence never fails Lockstep.

An optional CRD (scheduler-plugins' or Volcano's PodGroup, NodeResourceTopology) installed
after Lockstep started is noticed at once: a watch of CustomResourceDefinitions
(:meth:`ClusterCache.watch_crds`) wakes the sleeping loop of the resource whose CRD became
Established, so a training operator that creates its Volcano PodGroups right after
installing Volcano's CRDs does not wait out the 30 s poll. The poll stays as the fallback
(when RBAC denies the CRD watch, and for ``scheduling.k8s.io``, which is built in and found
by discovery, not by a CRD).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from coscheduling import (
    PODS,
    Coscheduler,
    Kind,
    QuantityError,
    RecordError,
    pod_key,
    watched_table,
)

from .client import KubeClient
from .errors import APIError, APIUnreachable, Gone, NotFound
from .nodeproto import decode_node_list

__all__ = ["ClusterCache", "Resource"]

log = logging.getLogger("lockstep.cache")

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
MISSING_POLL_SECONDS = 30.0
"""How long an optional resource that is not served waits before looking again, unless its
CRD's watch event wakes it first."""


@dataclass(slots=True)
class Resource:
    """One kind the cache lists and watches: where, how each object is parsed, and the
    core's table entry (``coscheduling.events.ingest``) its events go to."""

    name: str
    path: str
    kind: Kind[Any, Any]
    parse: Callable[[dict[str, Any], str], Any]
    """Raw JSON (and the served version) to the core's record."""
    key_of: Callable[[str, str], Any]
    """(namespace, name) of a deleted object to the core's key for it."""
    optional: bool = False
    """A CRD that may not be installed: a 404 counts as an empty, synced list."""
    synced: bool = False
    """Its first list (or the latest relist) has arrived, or its CRD is not served."""
    last_sync: float = 0.0
    """Monotonic time of the last list, event or bookmark."""
    relists: int = 0
    failed: int = 0
    """Objects whose ingestion raised (logged and skipped, the watch going on): a bug in
    Lockstep's parsing or rules that one object set off, never a reason to stop."""
    resource_version: str = ""
    discover: tuple[str, str, tuple[str, ...]] | None = None
    """(API group, plural, versions by preference): ``path`` is found by API discovery."""
    version: str = ""
    """The discovered version ("" when not served)."""
    protobuf: Callable[[bytes], dict[str, Any]] | None = None
    """Lists ask for protobuf and decode it with this (only built-in kinds have it)."""
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when this resource's CRD becomes Established: ends the wait for a missing CRD."""
    eager: int = 0
    """Quick retries left after a wake (a list may 404 for a moment after Established)."""
    first_from_cache: bool = False
    """The first list is served by the API server's watch cache (``resourceVersion=0``), as
    client-go's first list is: at 5,000 nodes 0.16-0.26 s and 0.2-0.3 s of API server CPU,
    against 0.43-0.47 s and 0.4 s paging through consistent reads. The cache
    answers whole, so only for kinds whose whole list is small: nodes, not 50,000 pods (the
    RSS the pager avoids). Relists stay consistent: after a watch error, a cache behind what
    was already seen must not take the cache back in time."""


@dataclass(slots=True)
class ClusterCache:
    core: Coscheduler
    kube: KubeClient
    on_change: Callable[[], None] = lambda: None
    watch_timeout: int = 300
    resources: dict[str, Resource] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for w in watched_table():
            r = Resource(w.watch.name, w.watch.path, w.kind, w.watch.parse, w.watch.key_of,
                         optional=w.watch.optional, discover=w.watch.discover,
                         protobuf=decode_node_list if w.protobuf else None,
                         first_from_cache=w.first_from_cache)
            self.resources[r.name] = r

    def crd_names(self) -> dict[str, Resource]:
        """The optional resources a CRD serves, by the CRD's name (``plural.group``); those
        found by discovery (built into the API server) have none."""
        out: dict[str, Resource] = {}
        for r in self.resources.values():
            parts = r.path.split("/")
            if r.optional and r.discover is None and len(parts) == 5 and parts[1] == "apis":
                out[f"{parts[4]}.{parts[2]}"] = r
        return out

    @property
    def synced(self) -> bool:
        return all(r.synced for r in self.resources.values())

    def failures(self) -> dict[str, int]:
        """Objects each resource's loop could not take in (``Resource.failed``)."""
        return {n: r.failed for n, r in self.resources.items()}

    def sync_age(self, now: float) -> dict[str, float]:
        return {n: (now - r.last_sync) if r.synced else -1.0 for n, r in self.resources.items()}

    # -------------------------------------------------------------- applying objects

    def _parse(self, kind: str, obj: dict[str, Any]) -> Any:
        res = self.resources[kind]
        try:
            return res.parse(obj, res.version)
        except (RecordError, QuantityError, ValueError, TypeError) as e:
            # One malformed object must not stop the cache; it is simply not scheduled around.
            log.warning("skipping unparsable %s %s: %s", kind, _name(obj), str(e)[:512])
            return None
        except Exception:
            res.failed += 1
            log.exception("skipping %s %s: parsing raised", kind, _name(obj))
            return None

    def _apply_all(self, kind: str, records: list[Any]) -> None:
        """Make the core's set of ``kind`` exactly ``records`` (after a list). Should the
        core raise on one of them, the list is applied again one object at a time, so the
        rest still arrive and only the culprit is left out."""
        res = self.resources[kind]
        try:
            self.core.replace(res.kind, records)
        except Exception:
            res.failed += 1
            log.exception("%s: applying the list failed; applying it object by object", kind)
            for rec in records:
                try:
                    self.core.upsert(res.kind, rec)
                except Exception:
                    res.failed += 1
                    log.exception("%s: skipping an object the core could not take", kind)

    def _apply(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        """One watch event into the core. Anything it raises is logged and counted
        (``Resource.failed``) and the object skipped: one pod, however written, must never
        end the watch task (the service would exit, and the relist meet the pod again)."""
        try:
            self._apply_event(kind, event_type, obj)
        except Exception:
            self.resources[kind].failed += 1
            log.exception("%s: skipping %s %s after an error", kind, event_type, _name(obj))

    def _apply_event(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        res = self.resources[kind]
        if event_type == "DELETED":
            meta = obj.get("metadata") or {}
            name = str(meta.get("name") or "")
            ns = str(meta.get("namespace") or "default")
            if res.kind is PODS:  # the UID tells a stale event from a recreated pod
                self.core.delete_pod(pod_key(ns, name), str(meta.get("uid") or ""))
            else:
                self.core.delete(res.kind, res.key_of(ns, name))
            return
        rec = self._parse(kind, obj)
        if rec is not None:
            self.core.upsert(res.kind, rec)

    # -------------------------------------------------------------- the loops

    async def run(self, kind: str) -> None:
        """List then watch ``kind`` forever; never returns except by cancellation."""
        res = self.resources[kind]
        delay = 0.5
        while True:
            res.wake.clear()  # a CRD event from here on ends the wait below
            try:
                if res.discover is not None:
                    await self._discover(res)
                await self._list(res)
                delay = 0.5
                await self._watch(res)
            except Gone:
                log.info("%s: resourceVersion expired (410), relisting", kind)
            except NotFound:
                if not res.optional:
                    raise
                # CRD not installed: synced-empty; look again when its CRD comes, or later.
                self.core.unserved(res.kind)
                res.synced, res.last_sync = True, time.monotonic()
                await self._wait_for_crd(res)
            except (APIUnreachable, APIError) as e:
                log.warning("%s: %s; retrying in %.1fs", kind, e, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
            except ValueError as e:
                # A list or watch line that does not decode (JSON nested deeper than the
                # decoder goes, in a CRD field that keeps unknown fields): this kind is
                # listed again after a pause; the service and every other kind go on.
                res.failed += 1
                log.error("%s: undecodable response (%s); listing again in %.1fs", kind,
                          str(e)[:200], delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)

    async def _wait_for_crd(self, res: Resource) -> None:
        """Sleep until the resource's CRD is Established (:meth:`watch_crds` sets
        ``res.wake``) or the poll comes round. Just after a wake the API server may still
        answer 404 for a moment: a few quick retries cover that."""
        if res.eager > 0:
            res.eager -= 1
            await asyncio.sleep(0.2)
            return
        try:
            await asyncio.wait_for(res.wake.wait(), MISSING_POLL_SECONDS)
        except TimeoutError:
            return
        res.eager = 5
        log.info("%s: its CRD is established; listing now", res.name)

    async def watch_crds(self) -> None:
        """List then watch CustomResourceDefinitions forever, waking the loop of each
        optional resource whose CRD is Established. Only the CRDs of :meth:`crd_names`
        matter (the API server cannot select CRDs by group, so the rest are ignored here).
        A refusal (RBAC without the CRD rule) is logged once; the 30 s poll then stands."""
        wanted = self.crd_names()
        rv = ""
        delay = 0.5
        refused = False
        while True:
            try:
                if not rv:
                    names, rv = await self.kube.list_parsed(
                        CRDS, lambda o: _established(o, wanted))
                    for name in names:
                        wanted[name].wake.set()
                    delay = 0.5
                async for ev in self.kube.watch(CRDS, rv, timeout_seconds=self.watch_timeout):
                    obj = ev.get("object") or {}
                    if ev.get("type") == "ERROR":
                        if obj.get("code") == 410:
                            raise Gone(410, "Expired", str(obj.get("message")), path=CRDS)
                        raise APIError(_code(obj), str(obj.get("reason") or ""),
                                       str(obj.get("message") or ""), path=CRDS)
                    rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                    if ev.get("type") in ("ADDED", "MODIFIED") \
                            and (ready := _established(obj, wanted)) is not None:
                        wanted[ready].wake.set()
                await asyncio.sleep(0.2)  # a watch that ends at once must not spin
            except Gone:
                rv = ""
            except APIError as e:
                if e.status in (401, 403, 404):
                    if not refused:
                        log.warning("CustomResourceDefinitions cannot be watched (%s); optional "
                                    "resources installed later are looked for every %.0fs",
                                    e.status, MISSING_POLL_SECONDS)
                        refused = True
                    rv = ""
                    await asyncio.sleep(300)
                    continue
                log.warning("customresourcedefinitions: %s; retrying in %.1fs", e, delay)
                rv = ""
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
            except APIUnreachable as e:
                log.warning("customresourcedefinitions watch broken: %s", e)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
            except ValueError as e:  # an undecodable response: list again, never stop
                log.error("customresourcedefinitions: undecodable response (%s)", str(e)[:200])
                rv = ""
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)

    async def _discover(self, res: Resource) -> None:
        """Point ``res.path`` at the most preferred served version, or raise NotFound."""
        assert res.discover is not None
        group, plural, versions = res.discover
        found = ""
        try:
            served = await self.kube.request("GET", f"/apis/{group}")
            have = {str(v.get("version")) for v in served.get("versions") or ()
                    if isinstance(v, dict)}
            for v in (v for v in versions if v in have):
                listing = await self.kube.request("GET", f"/apis/{group}/{v}")
                if any(isinstance(r, dict) and r.get("name") == plural
                       for r in listing.get("resources") or ()):
                    found = v
                    break
        except NotFound:
            found = ""
        if found != res.version or res.last_sync == 0.0:
            if found:
                log.info("%s: serving %s/%s %s", res.name, group, found, plural)
            else:
                log.info("%s: %s %s not served at %s; looking again every 30s", res.name,
                         group, plural, "/".join(versions))
        res.version = found
        if not found:
            raise NotFound(404, "NotServed", f"{group} {plural} not served", path=f"/apis/{group}")
        res.path = f"/apis/{group}/{found}/{plural}"

    async def _list(self, res: Resource) -> None:
        records, rv = await self.kube.list_parsed(
            res.path, lambda o: self._parse(res.name, o), protobuf=res.protobuf,
            from_cache=res.first_from_cache and res.relists == 0)
        self._apply_all(res.name, records)
        res.resource_version = rv
        self._reached(res, rv)
        res.synced = True
        res.last_sync = time.monotonic()
        res.relists += 1
        self.on_change()

    def _reached(self, res: Resource, rv: str) -> None:
        """Tell the core how far the pod stream has read (a list's or a bookmark's
        revision), so it tells a pod not watched yet from one already gone."""
        if res.kind is PODS and rv.isascii() and rv.isdigit() and len(rv) < 20:
            self.core.pods_listed(int(rv))

    async def _watch(self, res: Resource) -> None:
        while True:
            started = time.monotonic()
            try:
                async for ev in self.kube.watch(
                    res.path, res.resource_version, timeout_seconds=self.watch_timeout
                ):
                    etype = ev.get("type")
                    obj = ev.get("object") or {}
                    if etype == "ERROR":
                        if obj.get("code") == 410:
                            raise Gone(410, "Expired", str(obj.get("message")), path=res.path)
                        raise APIError(
                            _code(obj), str(obj.get("reason") or ""),
                            str(obj.get("message") or ""), path=res.path,
                        )
                    rv = (obj.get("metadata") or {}).get("resourceVersion")
                    if rv:
                        res.resource_version = str(rv)
                    res.last_sync = time.monotonic()
                    if etype == "BOOKMARK":
                        self._reached(res, str(rv or ""))
                        continue
                    if etype not in ("ADDED", "MODIFIED", "DELETED"):
                        log.warning("%s: unknown watch event %r skipped", res.name, etype)
                        continue
                    self._apply(res.name, etype, obj)
                    self.on_change()
            except APIUnreachable as e:
                # Resume from the last resourceVersion; a 410 on resume makes us relist.
                log.warning("%s watch broken: %s", res.name, e)
                await asyncio.sleep(0.5)
                continue
            # A watch that ends at once (a proxy closing idle streams) must not spin.
            await asyncio.sleep(0.2 if time.monotonic() - started < 1.0 else 0)


def _established(obj: dict[str, Any], wanted: Mapping[str, Resource]) -> str | None:
    """The CRD's name when it is one of ``wanted`` and Established (its API is served)."""
    name = str((obj.get("metadata") or {}).get("name") or "")
    if name not in wanted:
        return None
    conds = (obj.get("status") or {}).get("conditions") or ()
    ok = any(isinstance(c, dict) and c.get("type") == "Established" and c.get("status") == "True"
             for c in conds)
    return name if ok else None


def _code(obj: dict[str, Any]) -> int:
    """A watch ERROR's HTTP code (500 when it carries none a person could mean)."""
    code = obj.get("code")
    return code if isinstance(code, int) and not isinstance(code, bool) \
        and 100 <= code <= 599 else 500


def _name(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return "?"
    return f"{str(meta.get('namespace', ''))[:253]}/{str(meta.get('name', '?'))[:253]}"
