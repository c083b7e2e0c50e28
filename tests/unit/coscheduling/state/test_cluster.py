"""The store's derived caches: what planning a gang reads must not grow with the cluster."""

from __future__ import annotations

from coscheduling import Coscheduler, Settings, gang_key, node_from_json, pod_from_json
from coscheduling.events import ingest
from tests.builders import node, pod
from tests.internals import state_of


def racks(count: int) -> Coscheduler:
    core = Coscheduler(Settings())
    for r in range(count):
        for i in range(4):
            core.upsert(ingest.NODES,
                        node_from_json(node(f"r{r}-n{i}").gpus(8).rack(f"r{r}").build()))
    return core


def admit(core: Coscheduler, gang: str, size: int, gpus: int) -> None:
    for i in range(size):
        core.upsert_pod(pod_from_json(
            pod(f"{gang}-{i}").gang(gang, size, timeout=30).gpu(gpus).gated().build()))
    core.admit_gated(0.0)


def test_planning_asks_only_touched_nodes_for_their_free_gpus() -> None:
    core = racks(50)  # 200 nodes
    admit(core, "a", 2, 8)  # builds the per-domain totals: every node asked once
    asked: list[str] = []
    real = state_of(core).capacity.free_gpus

    def counting(n: str, own: object = None) -> int:
        asked.append(n)
        return real(n, own)  # type: ignore[arg-type]

    state_of(core).capacity.free_gpus = counting  # type: ignore[method-assign]
    admit(core, "b", 2, 8)
    plan_a = set(core.queries.gangs[gang_key("default", "a")].plan.values())
    assert len(asked) < 20, f"{len(asked)} nodes asked; only the {plan_a} reserved changed"
    plan_b = set(core.queries.gangs[gang_key("default", "b")].plan.values())
    assert len(plan_b) == 2 and not plan_b & plan_a


def test_the_tightest_domain_follows_reservations_and_releases() -> None:
    core = racks(3)
    admit(core, "a", 3, 8)  # rack r0: 3 of 4 nodes reserved, 8 GPUs left
    a = core.queries.gangs[gang_key("default", "a")]
    assert {n.split("-")[0] for n in a.plan.values()} == {"r0"}
    admit(core, "b", 1, 8)  # the tightest rack that fits is r0's last node
    b = core.queries.gangs[gang_key("default", "b")]
    assert set(b.plan.values()) == {"r0-n3"}


def test_an_unchanged_node_is_a_heartbeat_and_bumps_nothing() -> None:
    core = racks(1)
    epoch = state_of(core).store.epoch
    core.upsert(ingest.NODES, node_from_json(node("r0-n0").gpus(8).rack("r0").build()))
    assert state_of(core).store.epoch == epoch
    core.upsert(ingest.NODES, node_from_json(node("r0-n0").gpus(4).rack("r0").build()))
    assert state_of(core).store.epoch > epoch
    assert state_of(core).capacity.free_gpus("r0-n0") == 4  # type: ignore[arg-type]
