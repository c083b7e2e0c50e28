"""Members of one family (same constraints, candidates and GPUs) share one ranking of the
nodes: the planner ranks the nodes once per family, not once per member, whatever CPU or
memory each member asks. A 1,000-member gang spread over 5,000 nodes was 5 million node
rankings (~20 s on the event loop when alike, ~60 s when each asked its own CPU: every verb,
the webhook and /healthz waited; benchmarks/stall.py's big-gang and all-different phases).
The answer must not change: the old placement (a scan of every node for every member) is
kept here as the oracle."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest

from coscheduling.placement import planner
from coscheduling.placement.capacity import Capacity
from coscheduling.placement.planner import Member, plan_gang
from coscheduling.records import NodeName, PodKey, node_from_json, pod_from_json
from coscheduling.resources import Resources, fits, sub
from coscheduling.state.cluster import ClusterStore
from coscheduling.state.ledger import Ledger
from coscheduling.topology.domains import DEFAULT_LEVELS, GPU, explain_score
from coscheduling.topology.eligibility import eligible
from tests.builders import node, pod


def _place_by_scan(ctx: Any, nodes: Sequence[NodeName], floor: int = 0
                   ) -> tuple[dict[PodKey, NodeName], dict[PodKey, Any]] | None:
    """The placement before shapes: every member tries every node (these gangs claim no DRA
    devices, so no member's devices are planned: ``floor`` is unused). Eligibility is asked
    of :func:`eligible` afresh, not of the planner's memo shared by members alike, so a
    signature that makes members alike wrongly shows."""
    free: dict[NodeName, Resources] = {}
    extra_gpu: dict[NodeName, list[int]] = {}
    out: dict[PodKey, NodeName] = {}
    view = ctx.view
    for i, m in enumerate(ctx.todo):
        req = m.pod.requests
        gpus = req.get(GPU, 0)
        best: tuple[tuple[float, ...], NodeName] | None = None
        for n in nodes:
            if ctx.problems[i] is not None or (m.candidates is not None
                                               and n not in m.candidates) \
                    or not eligible(m.pod, view.nodes[n]):
                continue
            f = free.get(n)
            if f is None:
                f = free[n] = ctx.free(n)
            if not fits(req, f):
                continue
            if gpus:
                used = [*view.gpu_pods_on(n), *extra_gpu.get(n, ())]
                score = explain_score(view.nodes[n], gpus, f.get(GPU, 0), used,
                                      ctx.layout(n)).total
                rank: tuple[float, ...] = (f.get(GPU, 0) - gpus, -score)
            else:
                rank = (view.nodes[n].allocatable.get(GPU, 0),
                        f.get("cpu", 0) - req.get("cpu", 0))
            if best is None or (rank, n) < (best[0], best[1]):
                best = (rank, n)
        if best is None:
            return None
        n = best[1]
        free[n] = sub(free[n], req)
        if gpus:
            extra_gpu.setdefault(n, []).append(gpus)
        out[ctx.keys[i]] = n
    return out, {}


def _cluster(rng: random.Random, nodes: int, per_rack: int, odd: bool = False) -> Capacity:
    """``nodes`` 8-GPU nodes (a few CPU-only, a few labelled or tainted), partly used;
    ``odd``: a few more taints (one with a value, one NoExecute, one PreferNoSchedule, one
    whose key is not a string) and a few cordoned nodes."""
    store = ClusterStore(levels=DEFAULT_LEVELS)
    for i in range(nodes):
        b = node(f"n{i:04d}").rack(f"r{i // per_rack}", f"b{i // (per_rack * 4)}")
        b.gpus(0 if i % 17 == 5 else 8)
        if rng.random() < 0.3:
            b.label("pool", "a")
        if rng.random() < 0.1:
            b.taint("dedicated")
        if odd and rng.random() < 0.2:
            taints = b._obj["spec"].setdefault("taints", [])
            taints.append(rng.choice([
                {"key": "team", "value": "red", "effect": "NoSchedule"},
                {"key": "team", "value": "blue", "effect": "NoExecute"},
                {"key": "soft", "effect": "PreferNoSchedule"},
                {"key": 7, "effect": "NoSchedule"}]))
        if odd and rng.random() < 0.05:
            b._obj["spec"]["unschedulable"] = True
        if rng.random() < 0.3:
            b.interconnect("nvlink-islands", 4)
        store.put_node(node_from_json(b.build()))
        for j in range(rng.choice([0, 0, 1, 2])):
            store.put_pod(pod_from_json(pod(f"busy-{i}-{j}").gpu(rng.choice([1, 2, 4]))
                                        .cpu(str(rng.choice([1, 8, 30]))).on(f"n{i:04d}")
                                        .build()))
    return Capacity(store, Ledger())


def _gang(rng: random.Random, size: int, different: float = 0.0) -> list[Member]:
    """Mostly alike workers, a few other shapes: 8-GPU, a selector, CPU-only launchers;
    ``different``: the share of members that each ask their own CPU and memory (1, 2 or 4
    GPUs or none, up to more CPU than a busy node has left)."""
    out = []
    for i in range(size):
        b = pod(f"g-{i}").gang("g", size)
        kind = rng.random()
        if rng.random() < different:
            b.gpu(rng.choice([0, 1, 1, 2, 4])).cpu(f"{rng.randint(100, 60000)}m")
            b.memory(f"{rng.randint(1, 400)}Gi")
        elif kind < 0.7:
            b.gpu(1).cpu("2")
        elif kind < 0.8:
            b.gpu(8).cpu("16")
        elif kind < 0.9:
            b.gpu(2).cpu("2").node_selector(pool="a")
        else:
            b.cpu(str(rng.choice([1, 4])))
        out.append(Member(pod_from_json(b.build())))
    return out


def _both(members: list[Member], view: Capacity, monkeypatch: pytest.MonkeyPatch,
          **kw: Any) -> tuple[object, object]:
    got = plan_gang(members, view, DEFAULT_LEVELS, **kw)
    with monkeypatch.context() as m:
        m.setattr(planner, "_place", _place_by_scan)
        want = plan_gang(members, view, DEFAULT_LEVELS, **kw)
    return got, want


def _count_work(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the planner's eligibility checks (``ok``) and node scores (``score``) from now
    on: the work bounds below are on these, not on time."""
    calls = {"ok": 0, "score": 0}
    ok = planner._Context.ok

    def counting_ok(self: Any, i: int, n: Any) -> bool:
        calls["ok"] += 1
        return ok(self, i, n)

    def counting_score(*args: Any, **kw: Any) -> Any:
        calls["score"] += 1
        return explain_score(*args, **kw)

    monkeypatch.setattr(planner._Context, "ok", counting_ok)
    monkeypatch.setattr(planner, "explain_score", counting_score)
    return calls


@pytest.mark.parametrize("seed", range(40))
def test_shapes_place_every_member_where_the_scan_did(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    view = _cluster(rng, rng.choice([12, 40, 90]), rng.choice([4, 10]))
    members = _gang(rng, rng.choice([3, 20, 60, 150]))
    if rng.random() < 0.5:  # the asking member carries kube-scheduler's candidates
        cands = frozenset(n for n in view.nodes if rng.random() < 0.8)
        members[0] = Member(members[0].pod, cands)
    got, want = _both(members, view, monkeypatch)
    assert got == want


def _pinned(rng: random.Random, b: Any, hosts: Sequence[str], odd: bool) -> Any:
    """Pin a member by name as Lockstep's pin does (to one of ``hosts``, or several, in one
    term or two); when
    ``odd``, sometimes in a way the planner must read as eligibility does: a name no node
    has, a term that matches nothing, a second term without a name (then any node may
    match), an expression beside the name."""
    name = {"key": "metadata.name", "operator": "In",
            "values": [rng.choice(hosts) for _ in range(rng.choice([1, 1, 1, 2, 3]))]}
    terms: list[Any] = [{"matchFields": [name]}]
    kind = rng.random() if odd else 1.0
    if kind < 0.1:
        name["values"] = ["no-such-node"]
    elif kind < 0.2:
        terms.append({"matchExpressions": [{"key": "pool", "operator": "In",
                                            "values": ["a"]}]})
    elif kind < 0.3:
        terms.append("not a term")
    elif kind < 0.4:
        terms[0]["matchExpressions"] = [{"key": "pool", "operator": "Exists"}]
    if rng.random() < 0.3:  # terms are ORed: a second one naming another node
        terms.append({"matchFields": [{"key": "metadata.name", "operator": "In",
                                       "values": [rng.choice(hosts)]}]})
    b._obj["spec"]["affinity"] = {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}
    return b


def _by_expression(rng: random.Random, b: Any, hosts: Sequence[str], odd: bool) -> Any:
    """Constrain a member by a required affinity expression on labels: its hostname In one
    or two of ``hosts``, NotIn one, a pool In or Exists, or a second term on a rack; when
    ``odd``, also a key that is not a string, values that are not a list, an empty term."""
    host = rng.choice(hosts)
    expr: dict[str, Any] = rng.choice([
        {"key": "kubernetes.io/hostname", "operator": "In",
         "values": [host, *([rng.choice(hosts)] if rng.random() < 0.3 else [])]},
        {"key": "kubernetes.io/hostname", "operator": "In", "values": [host]},
        {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [host]},
        {"key": "pool", "operator": "In", "values": ["a", "c"]},
        {"key": "pool", "operator": "Exists"}])
    terms: list[Any] = [{"matchExpressions": [expr]}]
    if rng.random() < 0.2:
        terms.append({"matchExpressions": [{"key": "lockstep.dev/rack", "operator": "In",
                                            "values": ["r0", "r1"]}]})
    kind = rng.random() if odd else 1.0
    if kind < 0.1:
        expr["key"] = 7
    elif kind < 0.2:
        expr["values"] = "a"
    elif kind < 0.3:
        terms.append({})
    b._obj["spec"]["affinity"] = {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}
    return b


@pytest.mark.parametrize("seed", range(40))
def test_members_pinned_by_name_or_selecting_few_nodes_land_where_the_scan_put_them(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A member pinned by name is ranked on its named nodes alone, and so is one whose node
    selector or affinity picks out few nodes by label (in a gang of several constraints); the
    answer is the scan's, and so is the explanation when the gang does not fit. Half the
    seeds pin and select only nodes with room (so the gang mostly fits), half anything,
    oddly too."""
    rng = random.Random(2000 + seed)
    size, count = rng.choice([12, 40, 90]), rng.choice([3, 20, 60])
    odd = seed % 2 == 1
    view = _cluster(rng, size, rng.choice([4, 10]), odd=seed % 4 >= 2)
    hosts = sorted(view.nodes) if odd else sorted(
        n for n, rec in view.nodes.items()
        if view.free_gpus(n) >= 4 and not rec.blocking_taints())
    members = []
    for i in range(count):
        b = pod(f"p-{i}").gang("p", count).gpu(rng.choice([1, 1, 2])).cpu("1")
        kind = rng.random()
        if kind < 0.25:
            _pinned(rng, b, hosts, odd)
        elif kind < 0.5:
            _by_expression(rng, b, hosts, odd)
        if rng.random() < 0.3:  # tolerations: of a taint there, of one nowhere, of all
            b._obj["spec"]["tolerations"] = rng.sample([
                {"key": "dedicated", "operator": "Exists"},
                {"key": "team", "operator": "Equal", "value": "red"},
                {"key": "team", "operator": "Exists", "effect": "NoExecute"},
                {"key": f"nowhere-{i}", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/unschedulable", "operator": "Exists"},
                {"operator": "Exists"}], rng.choice([1, 1, 2]))
        if 0.5 <= kind < 0.75:
            host = rng.choice(hosts)
            choices: list[dict[str, str]] = [{"kubernetes.io/hostname": host}, {"pool": "a"},
                                             {"kubernetes.io/hostname": host},
                                             {"pool": "b"} if odd else {}]
            b.node_selector(rng.choice(choices))
        members.append(Member(pod_from_json(b.build())))
    if rng.random() < 0.3:
        members[0] = Member(members[0].pod, frozenset(n for n in view.nodes
                                                      if rng.random() < 0.8))
    got, want = _both(members, view, monkeypatch)
    assert got == want


@pytest.mark.parametrize("by", ["pin", "selector", "expression"])
def test_a_thousand_pinned_members_are_each_checked_on_their_node_alone(
    by: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A restarted Lockstep re-admits a gang from its members' pins: 1,000 members, each
    pinned to its own node, were 1,000 families each checking every node (5 million checks
    at 5,000 nodes, 16 s in one call); each selecting its own node by its hostname label, 4
    to 6 s, or by an affinity expression on it, 18 s."""
    nodes, size = 1200, 1000
    view = _cluster(random.Random(13), nodes, 20)
    roomy = sorted(n for n, rec in view.nodes.items()
                   if view.free_gpus(n) >= 1 and not rec.blocking_taints())
    members = []
    for i in range(size):
        b = pod(f"w-{i}").gang("w", size).gpu(1).cpu("1")
        if by == "selector":
            b.node_selector({"kubernetes.io/hostname": roomy[i % len(roomy)]})
        elif by == "expression":
            b._obj["spec"]["affinity"] = {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                           "values": [roomy[i % len(roomy)]]}]}]}}}
        else:
            b._obj["spec"]["affinity"] = {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In",
                                      "values": [roomy[i % len(roomy)]]}]}]}}}
        members.append(Member(pod_from_json(b.build())))
    calls = _count_work(monkeypatch)
    got = plan_gang(members, view, DEFAULT_LEVELS)
    assert isinstance(got, planner.Plan) and len(got.assignments) == size
    assert all(got.assignments[m.key] == roomy[i % len(roomy)]
               for i, m in enumerate(members))
    # Before: at least one pass over the nodes per member, 1,200,000 checks.
    assert calls["ok"] <= 4 * nodes + 20 * size, calls


@pytest.mark.parametrize("seed", range(40))
def test_members_that_each_ask_their_own_cpu_land_where_the_scan_put_them(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Members of one family (same constraints and GPUs) share one order of the nodes but
    differ in what fits: each takes the first node of the order that holds it, nodes too
    short for it kept for the members after it. Busy nodes have 34 to 63 CPUs left, and
    members ask up to 60, so members walk past nodes the scan would have skipped."""
    rng = random.Random(1000 + seed)
    view = _cluster(rng, rng.choice([12, 40, 90]), rng.choice([4, 10]))
    members = _gang(rng, rng.choice([3, 20, 60, 150]), different=rng.choice([0.5, 1.0]))
    if rng.random() < 0.3:
        cands = frozenset(n for n in view.nodes if rng.random() < 0.8)
        members[0] = Member(members[0].pod, cands)
    got, want = _both(members, view, monkeypatch)
    assert got == want


def test_a_thousand_alike_members_land_where_the_scan_put_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    view = _cluster(random.Random(7), 200, 16)
    members = [Member(pod_from_json(pod(f"w-{i}").gang("w", 1000).gpu(1).cpu("1").build()))
               for i in range(1000)]
    got, want = _both(members, view, monkeypatch)
    assert got == want and isinstance(got, planner.Plan) and len(got.assignments) == 1000


def test_the_work_for_a_thousand_alike_members_does_not_grow_as_members_x_nodes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nodes, size = 400, 1000
    view = _cluster(random.Random(3), nodes, 20)
    members = [Member(pod_from_json(pod(f"w-{i}").gang("w", size).gpu(1).cpu("1").build()))
               for i in range(size)]
    calls = _count_work(monkeypatch)
    got = plan_gang(members, view, DEFAULT_LEVELS)
    assert isinstance(got, planner.Plan) and len(got.assignments) == size
    # Before: every member ranked every node of each domain tried, 400,000 checks and
    # scores and more; now one pass per shape and domain tried, then one node per member.
    assert calls["ok"] <= 4 * nodes + 2 * size, calls
    assert calls["score"] <= 4 * nodes + 2 * size, calls


@pytest.mark.parametrize("differ_in", ["cpu", "selector"])
def test_a_gang_of_all_different_members_costs_no_more_than_the_scan(
    differ_in: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A family with no member left is ranked no more: without that, every placement
    ranked its node again for every family seen so far (members x families on top of the
    scan). Members each with its own selector are a family each; members each asking its
    own CPU are one family."""
    nodes, size = 100, 120
    view = _cluster(random.Random(5), nodes, 100)
    roomy = sorted(n for n, rec in view.nodes.items()
                   if view.free_gpus(n) >= 2 and not rec.blocking_taints())
    members = []
    for i in range(size):
        b = pod(f"w-{i}").gang("w", size).gpu(1)
        if differ_in == "cpu":
            b.cpu(f"{1000 + i}m")
        else:  # two members at most on a node with room for two
            b.node_selector({"kubernetes.io/hostname": roomy[i % len(roomy)]})
        members.append(Member(pod_from_json(b.build())))
    calls = _count_work(monkeypatch)
    got = plan_gang(members, view, DEFAULT_LEVELS)
    shapes, calls["ok"] = calls["ok"], 0
    monkeypatch.setattr(planner, "_place", _place_by_scan)

    real = eligible

    def counting_eligible(*args: Any, **kw: Any) -> bool:  # the scan asks it afresh
        calls["ok"] += 1
        return real(*args, **kw)

    monkeypatch.setitem(globals(), "eligible", counting_eligible)
    want = plan_gang(members, view, DEFAULT_LEVELS)
    assert got == want and isinstance(got, planner.Plan)
    assert shapes <= calls["ok"] + size, (shapes, calls["ok"])


def test_a_thousand_members_each_asking_its_own_cpu_cost_a_pass_per_family(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Members that differ only in what they ask besides GPUs rank the nodes alike: one
    family, one pass over the nodes. Before, each such member was a shape of its own, and
    1,000 of them at 5,000 nodes ranked 5 million (member, node) pairs in one call, 20-60 s
    on the event loop (benchmarks/stall.py's all-different phases)."""
    nodes, size = 400, 1000
    view = _cluster(random.Random(11), nodes, 20)
    members = [Member(pod_from_json(pod(f"w-{i}").gang("w", size).gpu(1 + i % 2)
                                    .cpu(f"{1000 + i}m").memory(f"{1 + i % 7}Gi").build()))
               for i in range(size)]
    calls = _count_work(monkeypatch)
    got = plan_gang(members, view, DEFAULT_LEVELS)
    assert isinstance(got, planner.Plan) and len(got.assignments) == size
    # Two families (1 and 2 GPUs); before: 1,000 shapes, each ranking every node of each
    # domain tried, 400,000 checks and more.
    assert calls["ok"] <= 4 * nodes + 4 * size, calls
    assert calls["score"] <= 4 * nodes + 4 * size, calls
    monkeypatch.setattr(planner, "_place", _place_by_scan)
    assert got == plan_gang(members, view, DEFAULT_LEVELS)


@pytest.mark.parametrize("first", ["tolerating", "not"])
def test_members_tolerating_differently_are_alike_only_where_the_nodes_taints_say(
    first: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Tolerations count by which of the nodes' taints (and the cordon) they tolerate: members
    each tolerating its own taint that no node has are alike, but one tolerating the taint a
    node has is not alike one that does not, whichever is planned first."""
    store = ClusterStore(levels=DEFAULT_LEVELS)
    for i in range(6):
        nb = node(f"n{i}").gpus(8)
        if i < 2:
            nb.taint("dedicated")
        if i == 5:
            nb._obj["spec"]["unschedulable"] = True
        store.put_node(node_from_json(nb.build()))
        # The tainted nodes are the tightest: a member wrongly thought to tolerate them
        # would go there.
        store.put_pod(pod_from_json(pod(f"busy-{i}").gpu(5 if i in (0, 1, 5) else 4).on(f"n{i}")
                                    .build()))
    view = Capacity(store, Ledger())
    members = []
    for i in range(6):
        b = pod(f"m-{i}").gang("m", 6).gpu(2 if (i < 3) == (first == "tolerating") else 1)
        tolerations: list[dict[str, str]] = [
            {"key": f"nowhere-{i}", "operator": "Exists", "effect": "NoSchedule"}]
        if i < 3:
            tolerations.append({"key": "dedicated", "operator": "Exists"})
        if i == 5:
            tolerations.append({"key": "node.kubernetes.io/unschedulable",
                                "operator": "Exists"})
        b._obj["spec"]["tolerations"] = tolerations
        members.append(Member(pod_from_json(b.build())))
    got, want = _both(members, view, monkeypatch)
    assert got == want and isinstance(got, planner.Plan)
    on = {k.split("/")[1]: n for k, n in got.assignments.items()}
    assert all(on[f"m-{i}"] not in ("n0", "n1") for i in range(3, 6)), on
    assert on["m-3"] != "n5" and on["m-4"] != "n5" and on["m-5"] == "n5", on
