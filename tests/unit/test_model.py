"""Model-based test of the gang core: random interleavings of cluster events and verb calls.

A hypothesis ``RuleBasedStateMachine`` keeps a model of the API server (nodes, pods,
PodGroups) and plays kube-scheduler against ``Coscheduler``: node add / delete / relabel /
relist, pod create / delete / recreate with a new UID / fail, PodGroup create / change /
delete, filter with random candidate subsets (including pods the cache has not seen and pods
already deleted), bind with successful, transiently and permanently failing API calls,
kube-scheduler dropping parked calls, time advancing past deadlines and backoffs, full
relists, members placed by the webhook at creation (pinned with no gate, or gated; their
creation lands at once, late or never) and Lockstep restarting while pinned members are
unbound, and gangs created behind Lockstep's scheduling gate (admitted by the core itself,
their gates lifted with a pin by PATCHes that land late, stale or never; kube-scheduler only
cycles ungated pods, a pinned one on its pin), plain pods of higher priority than some
gangs, a window between a pod's filter and bind calls, and a pod watch that lags: Lockstep's
own bindings and new pods reach the API server before the core hears of them (kube-scheduler
filters and binds such pods; the app reads a pod the core does not know at bind). After every
step it asserts:

* ``check_invariants`` (reservations equal plans, no node over-committed, admitted gangs
  hold whole plans, parked calls on planned nodes, derived caches fresh);
* no gang is told to bind fewer than ``minMember`` members;
* every parked call is answered by its deadline, and the core's parked set is the model's;
* no gang rests partially bound unless the cluster did it (a bound member deleted or
  failed) or a binding failed, which the core must then have reported;
* no capacity is counted twice: on every node, what the API server has bound plus what the
  core reserves for pods not bound there fits the node (a binding the watch has not shown
  yet is assumed at once);
* a plain pod's bind is refused for a reservation only when a gang of its priority or
  higher holds it;
* (in ``check_invariants``) the Volcano gangs of a queue never hold more than its
  capability: two Volcano gangs share a Queue whose capability grows and whose state flips
  between Open, Closed and Closing;
* once the watch has caught up, a core rebuilt from the same API-server state agrees on
  every fact derived from it;
* a member pinned at creation whose pod never reached the API server holds no slot and is
  not counted once ``PROVISIONAL_SECONDS`` have passed.

``make test`` runs a seeded, bounded budget; ``make fuzz`` (``LOCKSTEP_FUZZ_EXAMPLES``) more.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from coscheduling import (
    BindFailed,
    BindGroup,
    BindNow,
    BindOutcome,
    Bound,
    Coscheduler,
    Eviction,
    GangDefaults,
    GangKey,
    GangPhase,
    Lift,
    NodeName,
    Park,
    PinAtCreation,
    PodKey,
    Reject,
    Settings,
    gang_key,
    ingest,
    node_from_json,
    pod_from_json,
    pod_key,
    podgroup_from_json,
)
from coscheduling.conventions.upstream import upstream_podgroup_from_json
from coscheduling.conventions.volcano import volcano_podgroup_from_json
from coscheduling.creation import PROVISIONAL_SECONDS
from coscheduling.gating import GANG_GATE, pinned_node, pinned_terms
from coscheduling.invariants import check_invariants, cluster_facts
from coscheduling.queues import queue_from_json
from coscheduling.reasons import PodNotInCache, ReservedForGangs
from tests.builders import node, pod, podgroup

EXAMPLES = int(os.environ.get("LOCKSTEP_FUZZ_EXAMPLES", "200"))
STEPS = int(os.environ.get("LOCKSTEP_FUZZ_STEPS", "50"))
GANGS = {"a": (2, 1), "b": (3, 1), "c": (2, 2), "d": (4, 1)}
"""Annotation gangs: name -> (minMember, GPUs per member)."""
PRIORITY = {"b": 50, "c": 100, "d": 100}
"""Gangs whose members have a priority (the rest have 0); plain pods get 0, 50 or 100.
Gangs c and d preempt: whole lower-priority gangs and plain pods are evicted for them
(never each other), and the API server lets victims go at once, slowly, or never."""
KOORD = {"k1": (2, 1), "k2": (1, 2), "ko": (2, 1)}
"""Koordinator gangs: name -> (min-available, GPUs per member). k1 and k2 form the gang
group KG (each keeps its own minimum; match-policy once-satisfied, Koordinator's default);
ko is NonStrict with match-policy only-waiting."""
KG = "kg"
KG_GROUPS = '["default/k1", "default/k2"]'
HELD = {"h": (3, 1)}
"""A gang created behind Lockstep's scheduling gate (as its webhook does): kube-scheduler never
cycles a held member, Lockstep admits the gang itself and lifts each gate with a pin to the
planned node, which the model's API server applies late, stale or never."""
WEBHOOK = {"w": (3, 1)}
"""A gang whose members the webhook places at creation: the first one's creation admits the
gang whole (expected members hold the rest of the plan) and is pinned without a gate, later
ones take the expected slots; a member of another shape, or one of a gang that cannot run, is
gated. A creation may land at once, late, or never (its slot must then go back within
``PROVISIONAL_SECONDS``), and Lockstep may restart while pinned members are unbound."""
PG = "pg"
"""A scheduler-plugins gang whose PodGroup the model creates, changes and deletes."""
UP = "up"
"""A gang of Kubernetes' own API: pods name it in ``spec.schedulingGroup``, and its
``scheduling.k8s.io/v1beta1`` PodGroup (gang.minCount, or a basic policy) comes and goes."""
VOLCANO = {"v1": (2, 1), "v2": (2, 1)}
"""Volcano gangs (name -> minMember, GPUs per member), both in the Queue ``VQ``."""
VQ = "vq"
NODES = [f"n{i}" for i in range(5)]
RACKS = ["r0", "r1"]
SETTINGS = Settings(defaults=GangDefaults(timeout_seconds=20, max_timeout_seconds=60),
                    backoff_seconds=5)

steps_run = 0
seen: dict[str, int] = {}
"""Decisions and events reached, printed at the end (a checker that never reaches an
admitted gang proves nothing)."""


def saw(what: str) -> None:
    seen[what] = seen.get(what, 0) + 1


def gpu(obj: dict[str, Any]) -> int:
    containers = obj["spec"]["containers"]
    return sum(int((c.get("resources") or {}).get("requests", {}).get("nvidia.com/gpu", 0))
               for c in containers)


class _First:
    """A stand-in for ``st.data()`` that always draws the first queued lift."""

    @staticmethod
    def draw(_strategy: Any) -> int:
        return 0


class GangModel(RuleBasedStateMachine):
    QUEUES_ON = True
    """Volcano gangs and their Queue take part (off in :class:`PreemptionModel`)."""
    FIRST_NODES = 3
    """Nodes of 4 GPUs at the start (more come and go by rule)."""

    @initialize()
    def start(self) -> None:
        self.core = Coscheduler(SETTINGS)
        self.now = 0.0
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[PodKey, dict[str, Any]] = {}
        self.podgroup: dict[str, Any] | None = None
        self.upstream: dict[str, Any] | None = None
        self.graveyard: list[dict[str, Any]] = []
        """Pods deleted from the API server: kube-scheduler may still ask about them."""
        self.parked: dict[PodKey, tuple[str, float]] = {}
        self.disrupted: set[str] = set()
        self.lifts: list[Lift] = []
        """Gate lifts the app has drained and not yet sent (kube-scheduler cannot see them)."""
        self.lagging: list[tuple[dict[str, Any], bool]] = []
        """Pod events the core's watch has not delivered yet: (pod, deleted)."""
        self.behind = False
        """The pod watch is behind: every pod event waits for ``watch_catches_up``."""
        self.revision = 0
        self.evicting: list[Eviction] = []
        """Victims the app was told to evict and the API server has not deleted yet."""
        self.never_landed: dict[PodKey, float] = {}
        """Pods the webhook pinned whose creation never reached the API server (when)."""
        self.inflight: list[tuple[PodKey, NodeName, str, int, bool]] = []
        """Pods kube-scheduler filtered and has not bound yet: (pod, node, uid, fate, lag)."""
        """Gangs the cluster itself left short (a bound member deleted/failed, a bind failed)."""
        for name in NODES[:self.FIRST_NODES]:
            self._put_node(name, 4, RACKS[0])
        self.queue: dict[str, Any] = {
            "metadata": {"name": VQ}, "spec": {"capability": {"nvidia.com/gpu": "2"}},
            "status": {"state": "Open"}}
        self.core.replace(ingest.QUEUES, [queue_from_json(self.queue)])
        self.volcano = [self._volcano_pg(g) for g in sorted(VOLCANO)]
        self.core.replace(ingest.VOLCANO_PODGROUPS,
                          [volcano_podgroup_from_json(o) for o in self.volcano])
        for gang in sorted(VOLCANO):  # their quorum exists from the start: any two cycles of
            self.create_volcano_members(gang, VOLCANO[gang][0] - 1, True)  # them test the queue

    # ------------------------------------------------------------------ helpers

    def _put_node(self, name: str, gpus: int, rack: str) -> None:
        obj = node(name).gpus(gpus).rack(rack).build()
        self.nodes[name] = obj
        self.core.upsert_node(node_from_json(obj))

    def _put_pod(self, obj: dict[str, Any], lag: bool = False) -> None:
        """The API server stores ``obj``; the core hears of it now, or (``lag``) when the
        watch catches up. Events stay in order: a pod event that does not lag delivers the
        lagging ones first."""
        key = pod_key("default", obj["metadata"]["name"])
        self.revision += 1  # every write is a new resourceVersion, as etcd's revision
        obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self.revision)}}
        self.pods[key] = obj
        if lag or self.behind:
            self.lagging.append((obj, False))
            return
        self._deliver()
        self.core.upsert_pod(pod_from_json(obj))

    def _deliver(self) -> None:
        events, self.lagging = self.lagging, []
        for obj, deleted in events:
            if deleted:
                self.core.delete_pod(pod_key("default", obj["metadata"]["name"]),
                                     obj["metadata"]["uid"])
            else:
                self.core.upsert_pod(pod_from_json(obj))

    def _delete_pod(self, key: PodKey) -> None:
        obj = self.pods.pop(key)
        self.graveyard.append(obj)
        if obj["spec"].get("nodeName"):
            self.disrupted.add(self._gang(obj))
        if self.behind:  # its parked call, if any, is let go when the core hears of it
            self.revision += 1
            self.lagging.append((obj, True))
            return
        self.parked.pop(key, None)
        self._deliver()
        self.core.delete_pod(key, obj["metadata"]["uid"])

    @staticmethod
    def _volcano_pg(name: str) -> dict[str, Any]:
        mm, gpus = VOLCANO[name]
        return {"metadata": {"name": name, "namespace": "default"},
                "spec": {"minMember": mm, "queue": VQ,
                         "minResources": {"nvidia.com/gpu": str(mm * gpus)}}}

    @staticmethod
    def _gang(obj: dict[str, Any]) -> str:
        """The unit that must never rest partial: a gang, or a whole gang group."""
        part = GangModel._part(obj)
        return KG if part in ("k1", "k2") else part

    @staticmethod
    def _part(obj: dict[str, Any]) -> str:
        meta = obj["metadata"]
        ann = meta.get("annotations") or {}
        return str(ann.get("lockstep.dev/pod-group")
                   or ann.get("gang.scheduling.koordinator.sh/name")
                   or (meta.get("labels") or {}).get("scheduling.x-k8s.io/pod-group")
                   or (obj["spec"].get("schedulingGroup") or {}).get("podGroupName")
                   or ann.get("scheduling.k8s.io/group-name") or "")

    def _partial(self, gang: str, binding: frozenset[PodKey] = frozenset()) -> str | None:
        """Why ``gang`` is partially bound (counting ``binding`` as bound), or None: some
        members bound, but fewer than minMember (for the gang group: than some gang's own
        minimum)."""
        bound: dict[str, int] = {}
        for k, p in self.pods.items():
            if self._gang(p) != gang or p["status"]["phase"] in ("Failed", "Succeeded"):
                continue
            if p["spec"].get("nodeName") or k in binding:
                bound[self._part(p)] = bound.get(self._part(p), 0) + 1
        if not bound:
            return None
        if gang == KG:
            short = {k: bound.get(k, 0) for k in ("k1", "k2") if bound.get(k, 0) < KOORD[k][0]}
            return f"{bound} bound, short in {short}" if short else None
        if gang == PG:
            mm = int(self.podgroup["spec"]["minMember"]) if self.podgroup else None
        elif gang == UP:
            gang_policy = ((self.upstream or {}).get("spec", {}).get("schedulingPolicy")
                           or {}).get("gang")
            mm = int(gang_policy["minCount"]) if gang_policy else None
        else:
            mm = {**GANGS, **KOORD, **HELD, **VOLCANO}[gang][0] \
                if gang in {**GANGS, **KOORD, **HELD, **VOLCANO} else None
        n = sum(bound.values())
        return f"{n}/{mm}" if mm is not None and n < mm else None

    def _raw_free(self, name: str) -> int:
        """GPUs kube-scheduler sees free: allocatable minus bound and assumed (parked)."""
        used = sum(gpu(p) for p in self.pods.values()
                   if p["spec"].get("nodeName") == name
                   and p["status"]["phase"] not in ("Failed", "Succeeded"))
        for k in self.parked:
            at = self.core.waiting.node(k)
            if at == name and k in self.pods:
                used += gpu(self.pods[k])
        return int(self.nodes[name]["status"]["allocatable"].get("nvidia.com/gpu", 0)) - used

    def _answered(self) -> None:
        self.core.admit_held(self.now)
        for u in self.core.drain_unparked():
            saw(f"Unparked:{type(u.reason).__name__}")
            for k in u.pods:
                self.parked.pop(k, None)
        self.core.drain_notices()
        self.core.drain_requeue()
        self.lifts.extend(self.core.drain_lift())
        evictions = self.core.drain_evictions()
        if evictions:
            self._check_evictions(evictions)
            self.evicting.extend(evictions)

    def _check_evictions(self, batch: list[Eviction]) -> None:
        """One preemption's victims, as decided: strictly lower priority, victim gangs
        whole (every member bound at the API server), and the preemptor admitted whole."""
        saw(f"Preempted:{len(batch)}")
        keys = {e.pod for e in batch}
        for e in batch:
            obj = self.pods.get(e.pod)
            if obj is None or obj["metadata"]["uid"] != e.uid:
                continue  # gone already, the core's watch behind: the delete finds nothing
            prio = int(obj["spec"].get("priority") or 0)
            if prio >= e.priority:
                raise AssertionError(f"{e.pod} (priority {prio}) evicted for {e.preemptor} "
                                     f"(priority {e.priority})")
            if e.gang is not None:
                for k, p in self.pods.items():
                    if p["spec"].get("nodeName") and self.core.gang_of(k) == e.gang \
                            and k not in keys and not p["metadata"].get("deletionTimestamp") \
                            and p["status"]["phase"] not in ("Failed", "Succeeded"):
                        raise AssertionError(f"gang {e.gang} evicted in part: {k} stays")
        plain = PodKey(batch[0].preemptor)
        if plain in self.pods and self.core.gang_of(plain) is None:
            saw("Preempted:for-plain-pod")
            nominated = self.core.state.nominations.get(plain)
            if nominated is None or self.pods[plain]["spec"].get("nodeName"):
                raise AssertionError(f"evicted for plain pod {plain}, which holds no room")
            freed = sum(gpu(self.pods[k]) for k in keys if k in self.pods
                        and self.pods[k]["spec"].get("nodeName") == nominated.node)
            if self._raw_free(nominated.node) + freed < gpu(self.pods[plain]):
                raise AssertionError(f"{plain} nominated to {nominated.node}, where its "
                                     f"victims would not make room")
            return
        preemptor = self.core.gangs().get(GangKey(batch[0].preemptor))
        if preemptor is None or preemptor.phase is not GangPhase.ADMITTED:
            raise AssertionError(f"evicted for {batch[0].preemptor}, which was not admitted "
                                 f"into the freed room")

    def _feasible(self, obj: dict[str, Any]) -> list[NodeName]:
        """kube-scheduler's own filters: free GPUs, and a pin narrows the cycle to its node."""
        pin = pinned_node(pod_from_json(obj).required_affinity)
        return [NodeName(n) for n in sorted(self.nodes)
                if self._raw_free(n) >= gpu(obj) and pin in (None, n)]

    @staticmethod
    def _held(obj: dict[str, Any]) -> bool:
        return any(g.get("name") == GANG_GATE for g in obj["spec"].get("schedulingGates") or ())

    def _api_bind(self, key: PodKey, node_name: NodeName, fate: int, lag: bool = False
                  ) -> BindOutcome:
        """0..7 succeed, 8 fails for now, 9 fails for good (a 403, say)."""
        obj = self.pods.get(key)
        if obj is None or node_name not in self.nodes:
            return BindFailed(key, node_name, "gone", permanent=True)
        if fate == 8:
            return BindFailed(key, node_name, "503", permanent=False)
        if fate == 9:
            return BindFailed(key, node_name, "403", permanent=True)
        obj = {**obj, "spec": {**obj["spec"], "nodeName": node_name},
               "status": {"phase": "Running"}}
        self._put_pod(obj, lag=lag)
        return Bound(key, node_name)

    # ------------------------------------------------------------------ nodes

    @rule(i=st.integers(0, len(NODES) - 1), gpus=st.sampled_from([2, 4]),
          rack=st.sampled_from(RACKS))
    def add_or_relabel_node(self, i: int, gpus: int, rack: str) -> None:
        name = NODES[i]
        if name in self.nodes:  # allocatable stays; labels move
            gpus = int(self.nodes[name]["status"]["allocatable"]["nvidia.com/gpu"])
        self._put_node(name, gpus, rack)

    @precondition(lambda self: len(self.nodes) > 1)
    @rule(data=st.data())
    def delete_node(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.nodes)))
        del self.nodes[name]
        self.core.delete_node(NodeName(name))
        for key in [k for k, p in self.pods.items() if p["spec"].get("nodeName") == name]:
            self._delete_pod(key)  # the pod GC deletes pods bound to a deleted node
        self._answered()

    @rule()
    def relist_nodes(self) -> None:
        self.core.replace_nodes([node_from_json(n) for n in self.nodes.values()])
        self._answered()

    # ------------------------------------------------------------------ pods

    @rule(gang=st.sampled_from(sorted(GANGS)), k=st.integers(0, 4))
    def create_member(self, gang: str, k: int) -> None:
        key = pod_key("default", f"{gang}-{k}")
        if key in self.pods:
            return
        mm, gpus = GANGS[gang]
        b = pod(f"{gang}-{k}").gang(gang, min_member=mm, timeout=20).gpu(gpus)
        self._put_pod(b.priority(PRIORITY.get(gang, 0)).build())

    @rule(gang=st.sampled_from(sorted(GANGS)), extra=st.booleans())
    def create_whole_gang(self, gang: str, extra: bool) -> None:
        for k in range(GANGS[gang][0] + int(extra)):
            self.create_member(gang, k)

    @precondition(lambda self: self.QUEUES_ON)
    @rule(gang=st.sampled_from(sorted(VOLCANO)), k=st.integers(0, 2), whole=st.booleans())
    def create_volcano_members(self, gang: str, k: int, whole: bool) -> None:
        """Member ``k`` of a Volcano gang, or members 0..k (k=2 is an extra beyond
        minMember)."""
        for i in range(k + 1) if whole else (k,):
            key = pod_key("default", f"{gang}-{i}")
            if key not in self.pods:
                self._put_pod(pod(f"{gang}-{i}").annotate("scheduling.k8s.io/group-name", gang)
                              .gpu(VOLCANO[gang][1]).build())

    @precondition(lambda self: self.QUEUES_ON)
    @rule(grow=st.sampled_from([0, 0, 1, 2]),
          state=st.sampled_from(["Open", "Open", "Closed", "Closing"]))
    def change_queue(self, grow: int, state: str) -> None:
        """The Volcano Queue opens or closes, and its capability grows (never shrinks: a
        capability lowered under running gangs is over it by the user's hand)."""
        cap = int(self.queue["spec"]["capability"]["nvidia.com/gpu"]) + grow
        self.queue = {**self.queue, "spec": {"capability": {"nvidia.com/gpu": str(min(cap, 6))}},
                      "status": {"state": state}}
        saw(f"queue:{state}")
        self.core.upsert(ingest.QUEUES, queue_from_json(self.queue))
        self._answered()

    @rule(gang=st.sampled_from([*sorted(GANGS), PG, KG, "ko", UP, *HELD, *sorted(VOLCANO),
                                *WEBHOOK]),
          fate=st.integers(0, 9),
          data=st.data())
    def schedule_gang(self, gang: str, fate: int, data: st.DataObject) -> None:
        """kube-scheduler cycles through a gang's pending members, one after another."""
        for key in sorted(self.pods):
            obj = self.pods.get(key)
            if obj is None or self._gang(obj) != gang or obj["spec"].get("nodeName") \
                    or key in self.parked or obj["status"]["phase"] != "Pending" \
                    or self._held(obj):
                continue
            rec = pod_from_json(obj)
            cand = self._feasible(obj)
            decision = self.core.filter(rec, cand, self.now)
            saw(f"filter:{type(decision.unresolvable).__name__}" if decision.unresolvable
                else "filter:passed")
            self._answered()
            if decision.passed:
                self._bind(rec.key, data.draw(st.sampled_from(decision.passed)), rec.uid,
                           fate if data.draw(st.booleans()) else 0)

    @rule(k=st.integers(0, 4), held=st.sampled_from([True, True, True, False]))
    def create_held_member(self, k: int, held: bool) -> None:
        """Mostly behind the gate; now and then one without it (the webhook was down)."""
        key = pod_key("default", f"h-{k}")
        if key in self.pods:
            return
        mm, gpus = HELD["h"]
        b = pod(f"h-{k}").gang("h", min_member=mm, timeout=20).gpu(gpus)
        self._put_pod((b.held() if held else b).build())

    @rule(k=st.integers(0, 3), land=st.sampled_from(["now", "now", "late", "never"]),
          other_shape=st.sampled_from([False] * 7 + [True]))
    def create_through_webhook(self, k: int, land: str, other_shape: bool) -> None:
        """The API server asks the webhook about a member, then stores it (or fails to)."""
        key = pod_key("default", f"w-{k}")
        if key in self.pods:
            return
        mm, gpus = WEBHOOK["w"]
        obj = pod(f"w-{k}").gang("w", min_member=mm, timeout=20) \
            .gpu(gpus + int(other_shape)).build()
        asked = {**obj, "metadata": {k_: v for k_, v in obj["metadata"].items()
                                     if k_ != "uid"}}
        placed = self.core.place_at_creation(pod_from_json(asked), self.now)
        saw(f"webhook:{type(placed).__name__}" + (":other-shape" if other_shape else ""))
        if isinstance(placed, PinAtCreation):
            obj["spec"]["affinity"] = {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": pinned_terms((), placed.node)}}}
        else:
            obj["spec"]["schedulingGates"] = [{"name": GANG_GATE}]
        if land == "never":
            if isinstance(placed, PinAtCreation):
                self.never_landed[key] = self.now
                saw("webhook:never-landed")
            self._answered()
            return
        self.never_landed.pop(key, None)
        self._put_pod(obj, lag=land == "late")
        self._answered()

    @rule(whole=st.booleans())
    def create_whole_webhook_gang(self, whole: bool) -> None:
        for k in range(WEBHOOK["w"][0] + int(not whole)):
            self.create_through_webhook(k, "now", False)

    @precondition(lambda self: any(pinned_node(pod_from_json(p).required_affinity)
                                   and not p["spec"].get("nodeName")
                                   for p in self.pods.values()))
    @rule(really=st.sampled_from([False, False, False, True]))
    def lockstep_restarts(self, really: bool) -> None:
        """Lockstep is killed while pinned members are unbound: a new process lists
        everything; parked calls fail back to kube-scheduler, reservations, lifts not sent
        and pins given at creation whose pods are not stored yet are lost."""
        if not really:  # rarer than other rules: a restart forgets what others test
            return
        self._deliver()
        self.core = self._rebuilt()
        self.parked.clear()
        self.lifts.clear()
        self.never_landed.clear()
        saw("restart")
        self._answered()

    @rule(extra=st.booleans())
    def create_whole_held_gang(self, extra: bool) -> None:
        for k in range(HELD["h"][0] + int(extra)):
            self.create_held_member(k, True)

    @precondition(lambda self: self.lifts)
    @rule(data=st.data(), stale=st.sampled_from([False, False, False, True]),
          lost=st.sampled_from([False] * 9 + [True]))
    def api_applies_lift(self, data: st.DataObject, stale: bool, lost: bool) -> None:
        """The app's PATCH lands: the gate goes, the pin is added to every required term.

        The app asks the core for the target when it sends; ``stale`` sends what was drained
        earlier (the plan may have moved since), ``lost`` never lands (the app retries on
        the next event)."""
        lift = self.lifts.pop(data.draw(st.integers(0, len(self.lifts) - 1)))
        if not stale:
            fresh = self.core.lift_target(lift.pod)
            if fresh is None:
                return
            lift = fresh
        obj = self.pods.get(lift.pod)
        if lost or obj is None or obj["metadata"]["uid"] != lift.uid or not self._held(obj):
            return  # the UID precondition or the gate's absence makes the PATCH a no-op
        spec = {**obj["spec"], "schedulingGates": [
            g for g in obj["spec"]["schedulingGates"] if g.get("name") != GANG_GATE]}
        if lift.node is not None:
            pin = {"key": "metadata.name", "operator": "In", "values": [lift.node]}
            req = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                   .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
            terms = [{**t, "matchFields": [*(t.get("matchFields") or []), pin]}
                     for t in req.get("nodeSelectorTerms") or []] or [{"matchFields": [pin]}]
            spec["affinity"] = {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}
        saw("lift:" + ("pinned" if lift.node else "unpinned") + (":stale" if stale else ""))
        self._put_pod({**obj, "spec": spec})
        self._answered()

    @precondition(lambda self: self.lifts)
    @rule(data=st.data(), cycle=st.booleans())
    def api_applies_every_lift(self, data: st.DataObject, cycle: bool) -> None:
        """The usual case: every queued PATCH lands, in order, and (``cycle``) kube-scheduler
        then cycles the pods that lost their gate at once."""
        gangs = set()
        while self.lifts:
            lift = self.lifts.pop(0)
            fresh = self.core.lift_target(lift.pod)
            if fresh is not None:
                self.lifts.insert(0, fresh)
                self.api_applies_lift(_First(), False, False)
                if lift.pod in self.pods:
                    gangs.add(self._gang(self.pods[lift.pod]))
        for gang in sorted(gangs - {""}) if cycle else ():
            self.schedule_gang(gang, 0, data)

    @rule(gang=st.sampled_from(sorted(KOORD)), k=st.integers(0, 3))
    def create_koord_member(self, gang: str, k: int) -> None:
        key = pod_key("default", f"{gang}-{k}")
        if key in self.pods:
            return
        mm, gpus = KOORD[gang]
        b = pod(f"{gang}-{k}").gpu(gpus)
        b.annotate("gang.scheduling.koordinator.sh/name", gang)
        b.annotate("gang.scheduling.koordinator.sh/min-available", str(mm))
        b.annotate("gang.scheduling.koordinator.sh/waiting-time", "20s")
        if gang == "ko":
            b.annotate("gang.scheduling.koordinator.sh/mode", "NonStrict")
            b.annotate("gang.scheduling.koordinator.sh/match-policy", "only-waiting")
        else:
            b.annotate("gang.scheduling.koordinator.sh/groups", KG_GROUPS)
        self._put_pod(b.build())

    @rule(k=st.integers(0, 3))
    def create_upstream_member(self, k: int) -> None:
        key = pod_key("default", f"{UP}-{k}")
        if key not in self.pods:
            obj = pod(f"{UP}-{k}").gpu(1).build()
            obj["spec"]["schedulingGroup"] = {"podGroupName": UP}
            self._put_pod(obj)

    @rule(extra=st.booleans())
    def create_whole_upstream_gang(self, extra: bool) -> None:
        if self.upstream is None:
            self.change_upstream_podgroup(2, basic=False, delete=False)
        for k in range(2 + int(extra)):
            self.create_upstream_member(k)

    @rule(group=st.booleans())
    def create_whole_koord_gangs(self, group: bool) -> None:
        for gang in ("k1", "k2") if group else ("ko",):
            for k in range(KOORD[gang][0]):
                self.create_koord_member(gang, k)

    @rule(count=st.integers(1, 3), basic=st.booleans(), delete=st.booleans())
    def change_upstream_podgroup(self, count: int, basic: bool, delete: bool) -> None:
        if any(self._gang(p) == UP and p["spec"].get("nodeName") for p in self.pods.values()):
            self.disrupted.add(UP)  # resized, made basic or deleted under a running gang
        if delete and self.upstream is not None:
            self.upstream = None
            self.core.delete_upstream_podgroup(gang_key("default", UP))
        else:
            policy = {"basic": {}} if basic else {"gang": {"minCount": count}}
            self.upstream = {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
                             "metadata": {"name": UP, "namespace": "default", "generation": 1},
                             "spec": {"schedulingPolicy": policy}}
            self.core.upsert_upstream_podgroup(
                upstream_podgroup_from_json(self.upstream, "v1beta1"))
        self._answered()

    @rule(k=st.integers(0, 3))
    def create_pg_member(self, k: int) -> None:
        key = pod_key("default", f"{PG}-{k}")
        if key not in self.pods:
            self._put_pod(pod(f"{PG}-{k}").sp_group(PG).gpu(1).build())

    @rule(k=st.integers(0, 2), gpus=st.integers(0, 2), priority=st.sampled_from([0, 50, 100]),
          lag=st.booleans(), tried=st.booleans())
    def create_plain(self, k: int, gpus: int, priority: int, lag: bool, tried: bool) -> None:
        """A plain pod; ``tried``: kube-scheduler cycles it at once, and when no node fits
        it is marked Unschedulable (so only Lockstep's sweep can preempt for it)."""
        key = pod_key("default", f"plain-{k}")
        if key not in self.pods:
            self._put_pod(pod(f"plain-{k}").gpu(gpus).priority(priority).build(), lag=lag)
            if tried and not lag and self._unplaceable(key):
                self._mark_unschedulable(key)

    def _unplaceable(self, key: PodKey) -> bool:
        """kube-scheduler's own filters (resources fit, on the API server's usage) find no
        node for this pending pod, and it is not marked so yet."""
        p = self.pods[key]
        if p["spec"].get("nodeName") or p["spec"].get("schedulingGates") \
                or p["metadata"].get("deletionTimestamp") \
                or p["status"].get("phase") in ("Failed", "Succeeded") \
                or any(c.get("reason") == "Unschedulable"
                       for c in p["status"].get("conditions") or ()):
            return False
        need = gpu(p)
        return need > 0 and all(self._raw_free(n) < need for n in self.nodes)

    @precondition(lambda self: any(self._unplaceable(k) for k in self.pods))
    @rule(data=st.data())
    def no_node_fits(self, data: st.DataObject) -> None:
        """kube-scheduler finds no node by its own filters: it marks the pod Unschedulable
        and calls no extender, so only Lockstep's sweep can preempt for it."""
        key = data.draw(st.sampled_from(sorted(k for k in self.pods if self._unplaceable(k))))
        self._mark_unschedulable(key)

    def _mark_unschedulable(self, key: PodKey) -> None:
        obj = self.pods[key]
        cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
        self._put_pod({**obj, "status": {**obj["status"], "conditions": [cond]}})
        saw("unschedulable:plain" if self.core.gang_of(key) is None else "unschedulable:member")
        self._answered()

    @precondition(lambda self: self.pods)
    @rule(data=st.data(), recreate=st.booleans())
    def delete_pod(self, data: st.DataObject, recreate: bool) -> None:
        key = data.draw(st.sampled_from(sorted(self.pods)))
        obj = self.pods[key]
        self._delete_pod(key)
        if recreate:  # a controller recreates it under the same name: a new UID
            fresh = pod_from_json(obj)
            b = pod(fresh.name)
            for k, v in fresh.annotations.items():
                b.annotate(k, v)
            for k, v in fresh.labels.items():
                b.label(k, v)
            if self._part(obj) in HELD:
                b.held()
            self._put_pod(b.gpu(gpu(obj)).build())
        self._answered()

    @precondition(lambda self: any(p["spec"].get("nodeName") for p in self.pods.values()))
    @rule(data=st.data())
    def member_fails(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(
            k for k, p in self.pods.items() if p["spec"].get("nodeName"))))
        obj = self.pods[key]
        self.disrupted.add(self._gang(obj))
        self._put_pod({**obj, "status": {"phase": "Failed"}})
        self._answered()

    @rule()
    def relist_pods(self) -> None:
        self.lagging, self.behind = [], False  # the list is the API server's state now
        self.core.replace_pods([pod_from_json(p) for p in self.pods.values()])
        self.core.pods_listed(self.revision)
        self._answered()

    @rule()
    def watch_falls_behind(self) -> None:
        self.behind = True

    @precondition(lambda self: self.lagging or self.behind)
    @rule()
    def watch_catches_up(self) -> None:
        self.behind = False
        self._deliver()
        self._answered()

    # ------------------------------------------------------------------ PodGroups

    @rule(mm=st.integers(1, 4), delete=st.booleans())
    def change_podgroup(self, mm: int, delete: bool) -> None:
        if any(self._gang(p) == PG and p["spec"].get("nodeName") for p in self.pods.values()):
            # A user resizing a running gang can leave it short: the cluster did that.
            self.disrupted.add(PG)
        if delete and self.podgroup is not None:
            self.podgroup = None
            self.core.delete_podgroup(gang_key("default", PG))
        else:
            self.podgroup = podgroup(PG, mm, timeout=20)
            self.core.upsert_podgroup(podgroup_from_json(self.podgroup))
        self._answered()

    # ------------------------------------------------------------------ kube-scheduler

    @rule(data=st.data(), source=st.sampled_from(["live", "live", "live", "stale", "unseen"]),
          fate=st.integers(0, 9), lag=st.sampled_from([False, False, True]),
          later=st.sampled_from([False, False, True]))
    def schedule(self, data: st.DataObject, source: str, fate: int, lag: bool,
                 later: bool) -> None:
        """One scheduling cycle: filter with kube-scheduler's own feasible nodes, then bind
        (``later``: in a later step, other events in between; ``lag``: the watch shows the
        binding late)."""
        if source == "stale" and self.graveyard:
            obj = data.draw(st.sampled_from(self.graveyard[-6:]))
        elif source == "unseen":  # created, and kube-scheduler's watch showed it first
            key = pod_key("default", f"a-{data.draw(st.integers(5, 6))}")
            if key in self.pods:
                return
            self._put_pod(pod(key.split("/")[1]).gang("a", 2, timeout=20).gpu(1).build(),
                          lag=True)
            obj = self.pods[key]
            source = "live"
        else:
            busy = {k for k, *_ in self.inflight}
            waiting = sorted(k for k, p in self.pods.items()
                             if not p["spec"].get("nodeName") and k not in self.parked
                             and k not in busy
                             and p["status"]["phase"] == "Pending" and not self._held(p))
            if not waiting:
                return
            obj = self.pods[data.draw(st.sampled_from(waiting))]
        rec = pod_from_json(obj)
        feasible = self._feasible(obj)
        cand = [NodeName(n) for n in data.draw(st.lists(st.sampled_from(feasible), unique=True))
                ] if feasible else []
        decision = self.core.filter(rec, cand, self.now)
        saw(f"filter:{type(decision.unresolvable).__name__}" if decision.unresolvable
            else "filter:passed")
        self._never_unknown(rec.key, rec.uid, decision.unresolvable)
        self._answered()
        if source != "live" or not decision.passed:
            return
        if not set(decision.passed) <= set(cand):
            raise AssertionError(f"filter passed {decision.passed} outside candidates {cand}")
        target = data.draw(st.sampled_from(decision.passed))
        if later:
            self.inflight.append((rec.key, target, rec.uid, fate, lag))
            return
        self._bind(rec.key, target, rec.uid, fate, lag)

    @precondition(lambda self: self.inflight)
    @rule(data=st.data())
    def bind_filtered(self, data: st.DataObject) -> None:
        """kube-scheduler's bind call for a pod it filtered some steps ago."""
        i = data.draw(st.integers(0, len(self.inflight) - 1))
        key, target, uid, fate, lag = self.inflight.pop(i)
        if key in self.pods and not self.pods[key]["spec"].get("nodeName") \
                and target in self.nodes:
            self._bind(key, target, uid, fate, lag)

    def _bind(self, key: PodKey, target: NodeName, uid: str, fate: int,
              lag: bool = False) -> None:
        if self.core.pod(key) is None and key in self.pods:
            # The app reads a pod the watch has not shown yet from the API server.
            self.core.upsert_pod(pod_from_json(self.pods[key]))
        d = self.core.bind(key, target, self.now, uid)
        saw(type(d).__name__)
        if isinstance(d, Reject):
            self._never_unknown(key, uid, d.reason)
        if isinstance(d, Reject) and isinstance(d.reason, ReservedForGangs) \
                and self.core.gang_of(key) is None:
            saw("Reject:ReservedForGangs")
            prio = int(self.pods[key]["spec"].get("priority") or 0)
            holders = {g: self.core.state.gang_priority(self.core.state.gangs[g])
                       for g in d.reason.gangs}
            holders.update({n: int(self.pods[n]["spec"].get("priority") or 0)
                            for n in d.reason.nominated if n in self.pods})
            if all(p < prio for p in holders.values()):
                raise AssertionError(f"plain pod {key} (priority {prio}) refused for the "
                                     f"reservations of lower-priority gangs {holders}")
        self._answered()
        if isinstance(d, BindNow):
            outcome = self._api_bind(key, target, fate, lag)
            if isinstance(outcome, BindFailed):
                self.disrupted.add(self._gang(self.pods[key]) if key in self.pods else "")
            self.core.bind_outcomes([outcome])
        elif isinstance(d, Park):
            self.parked[key] = (d.gang, d.deadline)
        elif isinstance(d, BindGroup):
            name = KG if "gang-group[" in d.gang else d.gang.split("/", 1)[1]
            saw(f"BindGroup:{name}")
            why = self._partial(name, frozenset(d.binds))
            if why is not None:
                raise AssertionError(f"gang {d.gang} told to bind too few: {why}")
            outcomes = []
            for i, (k, n) in enumerate(sorted(d.binds.items())):
                self.parked.pop(k, None)
                outcomes.append(self._api_bind(k, n, fate if i == 0 else 0, lag))
            if any(isinstance(o, BindFailed) for o in outcomes):
                self.disrupted.add(name)
            if self.core.bind_outcomes(outcomes) is not None:
                saw("PartiallyBound")
        self._answered()

    @precondition(lambda self: self.evicting)
    @rule(data=st.data(), how=st.sampled_from(["delete", "delete", "terminating", "stuck"]))
    def victim_terminates(self, data: st.DataObject, how: str) -> None:
        """The app's eviction lands: the victim goes now, starts its grace period (goes at
        a later step), or never goes (the preemption expires)."""
        ev = self.evicting.pop(data.draw(st.integers(0, len(self.evicting) - 1)))
        obj = self.pods.get(ev.pod)
        if obj is None or obj["metadata"]["uid"] != ev.uid:
            return
        saw(f"victim:{how}")
        if how == "delete" or obj["metadata"].get("deletionTimestamp"):
            self._delete_pod(ev.pod)
        elif how == "terminating":
            self._put_pod({**obj, "metadata": {**obj["metadata"],
                                               "deletionTimestamp": "2026-01-01T00:00:00Z"}})
            self.evicting.append(ev)
        self._answered()

    @precondition(lambda self: self.parked)
    @rule(data=st.data())
    def scheduler_drops_parked_call(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.parked)))
        self.parked.pop(key)
        self.core.abandon(key)

    @rule(dt=st.sampled_from([0.5, 3.0, 8.0, 25.0]))
    def advance_time(self, dt: float) -> None:
        self.now += dt
        for exp in self.core.expire(self.now):
            saw("Expired")
            for k in exp.parked:
                self.parked.pop(k, None)
        self._answered()

    # ------------------------------------------------------------------ invariants

    @invariant()
    def promises_hold(self) -> None:
        global steps_run
        if not hasattr(self, "core"):
            return
        steps_run += 1
        check_invariants(self.core)
        for k, (_, deadline) in self.parked.items():
            assert self.now < deadline, f"{k} still parked at {self.now} past {deadline}"
            assert self.core.is_parked(k), f"{k}: the model holds a call the core forgot"
        assert self.core.parked_total() == len(self.parked)
        self._counted_once()
        self._given_back()
        for g in {self._gang(p) for p in self.pods.values()} - {""} - self.disrupted:
            why = self._partial(g)
            if why is not None:
                raise AssertionError(f"gang {g} rests partially bound: {why}")

    def _never_unknown(self, key: PodKey, uid: str, reason: object) -> None:
        """A pod the API server has (with that UID) is never answered as unknown: the call
        carries it, or the app reads it."""
        obj = self.pods.get(key)
        if isinstance(reason, PodNotInCache) and reason.cached_uid is None and obj is not None \
                and obj["metadata"]["uid"] == uid:
            raise AssertionError(f"{key} exists at the API server but was answered unknown")

    def _counted_once(self) -> None:
        """The API server's bound pods plus the core's reservations for pods not bound there
        fit every node that holds a reservation: a pod Lockstep bound is never planned over,
        even before the watch shows it."""
        api_bound = {k for k, p in self.pods.items() if p["spec"].get("nodeName")}
        for n in self.core.ledger.nodes():
            if n not in self.nodes:
                continue
            reserved = sum(r.requests.get("nvidia.com/gpu", 0)
                           for r in self.core.ledger.on_node(n) if r.pod not in api_bound)
            # Room a preemption frees is reserved for its preemptor while victims go.
            reserved -= sum(gpu(self.pods[k]) for k in self.core.state.preemptions.terminating()
                            if k in self.pods and self.pods[k]["spec"].get("nodeName") == n)
            if reserved and self._raw_free(n) + sum(
                    gpu(self.pods[k]) for k in self.parked
                    if self.core.waiting.node(k) == n and k in self.pods) < reserved:
                raise AssertionError(
                    f"node {n}: {reserved} GPUs reserved but only {self._raw_free(n)} free at "
                    f"the API server (a binding counted twice, or not at all)")

    def _given_back(self) -> None:
        """A pod pinned at creation that never reached the API server holds nothing once
        ``PROVISIONAL_SECONDS`` have passed (the core's timer has run since)."""
        for key, asked in self.never_landed.items():
            if self.now >= asked + PROVISIONAL_SECONDS and key not in self.pods:
                assert self.core.ledger.get(key) is None, f"{key} never created, still holds"
                assert key not in self.core.pods, f"{key} never created, still counted"

    @invariant()
    def rebuilt_core_agrees(self) -> None:
        if not hasattr(self, "core") or self.lagging:
            return
        fresh = self._rebuilt()
        live, rebuilt = cluster_facts(self.core), cluster_facts(fresh)
        rebuilt["scores"] = {n: s for n, s in rebuilt["scores"].items() if n in live["scores"]}
        assert live == rebuilt

    def _rebuilt(self) -> Coscheduler:
        fresh = Coscheduler(SETTINGS)
        fresh.replace_nodes([node_from_json(n) for n in self.nodes.values()])
        if self.podgroup is not None:
            fresh.replace(ingest.SP_PODGROUPS, [podgroup_from_json(self.podgroup)])
        if self.upstream is not None:
            fresh.replace_upstream_podgroups(
                [upstream_podgroup_from_json(self.upstream, "v1beta1")])
        fresh.replace(ingest.QUEUES, [queue_from_json(self.queue)])
        fresh.replace(ingest.VOLCANO_PODGROUPS,
                      [volcano_podgroup_from_json(o) for o in self.volcano])
        fresh.replace_pods([pod_from_json(p) for p in self.pods.values()])
        return fresh


GangModel.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestGangModel = GangModel.TestCase


class PreemptionModel(GangModel):
    """The same machine and invariants on a smaller cluster (one node at the start) and
    without the Volcano queue's rules, whose steps otherwise crowd out the runs in which a
    high gang meets a full cluster: the seeded budget of ``make test`` must reach
    preemption, not only ``make fuzz``."""

    QUEUES_ON = False
    FIRST_NODES = 1


def test_the_seeded_model_reaches_preemption_and_victims_going() -> None:
    before = dict(seen)
    run_state_machine_as_test(PreemptionModel, settings=settings(
        max_examples=2 * EXAMPLES, stateful_step_count=STEPS, deadline=None,
        derandomize=True, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))
    got = {k: v - before.get(k, 0) for k, v in seen.items() if v > before.get(k, 0)}
    assert any(k.startswith("Preempted:") and k[-1].isdigit() for k in got), got


def teardown_module() -> None:
    print(f"\nmodel test: {steps_run} steps explored ({EXAMPLES} runs x up to {STEPS} steps)")
    print("  reached: " + ", ".join(f"{k} {v}" for k, v in sorted(seen.items())))
