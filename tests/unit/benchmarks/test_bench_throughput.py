"""The throughput benchmark's pure parts: workloads, pods per scheduler, aggregation, table."""

from __future__ import annotations

import pytest

from benchmarks.throughput import (
    NODE_GPUS,
    GangSpec,
    build_pods,
    cpu_breakdown,
    format_ratios,
    format_table,
    median_ratios,
    mixed,
    parse_prometheus,
    percentile,
    ratios,
    request_delta,
    round_orders,
    summarize,
    summarize_arrivals,
    uniform,
    watchers_terminated,
)


def test_uniform_is_the_issue_workload() -> None:
    wl = uniform(100, 8, 1, arrivals=20)
    assert len(wl.groups) == 100 and wl.pods == 800 and wl.gpus == 800
    assert all(g.gang and g.size == 8 and g.gpus == 1 for g in wl.groups)
    assert len({g.name for g in (*wl.groups, *wl.arrivals)}) == 120
    with pytest.raises(ValueError):
        uniform(10, 8, NODE_GPUS + 1)


def test_mixed_is_seeded_and_fits() -> None:
    capacity = 1000 * NODE_GPUS
    a, b = mixed(7, 100, capacity, arrivals=10), mixed(7, 100, capacity, arrivals=10)
    assert a == b
    assert a != mixed(8, 100, capacity, arrivals=10)
    gangs = [g for g in a.groups if g.gang]
    plain = [g for g in a.groups if not g.gang]
    assert all(2 <= g.size <= 64 and 1 <= g.gpus <= 8 for g in gangs)
    assert plain and all(g.size == 1 for g in plain)
    assert 0.05 <= sum(g.size for g in plain) / a.pods <= 0.15
    assert a.gpus <= 0.6 * capacity
    assert sum(g.total_gpus for g in a.arrivals) <= 0.15 * capacity


@pytest.mark.parametrize(("scheduler", "want_scheduler", "want_gang_keys", "want_pg"), [
    pytest.param("stock", "default-scheduler", set(), False, id="stock-plain"),
    pytest.param("lockstep", "lockstep", {"lockstep.dev/pod-group", "lockstep.dev/min-member",
                                          "lockstep.dev/timeout-seconds"}, False, id="lockstep"),
    pytest.param("sp", "scheduler-plugins-scheduler", {"scheduling.x-k8s.io/pod-group"}, True,
                 id="scheduler-plugins"),
])
def test_same_pods_for_every_scheduler(scheduler: str, want_scheduler: str,
                                       want_gang_keys: set[str], want_pg: bool) -> None:
    pods, pg = build_pods(GangSpec("g1", 3, 2), scheduler)
    assert [p["metadata"]["name"] for p in pods] == ["g1-0", "g1-1", "g1-2"]
    for p in pods:
        assert p["spec"]["schedulerName"] == want_scheduler
        keys = set(p["metadata"]["annotations"]) | set(p["metadata"]["labels"])
        assert keys - {"bench/group"} == want_gang_keys
        assert p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert (pg is not None) == want_pg
    if pg is not None:
        assert pg["spec"] == {"minMember": 3, "scheduleTimeoutSeconds": 60}


def test_plain_pod_never_joins_a_gang() -> None:
    pods, pg = build_pods(GangSpec("p1", 1, 4, gang=False), "sp")
    assert pg is None and [p["metadata"]["name"] for p in pods] == ["p1"]
    assert "scheduling.x-k8s.io/pod-group" not in pods[0]["metadata"]["labels"]


def test_percentile_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 95) == 3.0
    assert percentile([float(i) for i in range(1, 101)], 50) == 50.0
    assert percentile([float(i) for i in range(1, 101)], 95) == 95.0


def test_summarize_batch() -> None:
    groups = [GangSpec("a", 2, 4), GangSpec("b", 2, 8), GangSpec("c", 2, 1),
              GangSpec("p", 1, 1, gang=False)]
    bound = {
        "a-0": ("n1", 11.0), "a-1": ("n1", 11.5),   # one node: the fewest possible
        "b-0": ("n2", 12.0), "b-1": ("n3", 12.1),   # 16 GPUs need two nodes: fewest too
        "c-0": ("n4", 13.0),                        # c-1 never bound
        "p": ("n5", 10.5),
    }
    s = summarize(groups, bound, t0=10.0)
    assert (s["pods"], s["bound"], s["unbound"]) == (7, 6, 1)
    assert s["span_s"] == 3.0 and s["pods_per_s"] == 2.0
    assert s["pods_per_s_after_first"] == round(5 / 2.5, 1)
    assert s["first_bind_s"] == 0.5
    assert (s["gangs"], s["gangs_complete"]) == (3, 2)
    assert s["gang_done_p50_s"] == 1.5 and s["gang_done_p95_s"] == 2.1
    assert s["spread_p95_ms"] == 500.0
    assert s["nodes_per_gang"] == 1.5 and s["gangs_on_fewest_nodes"] == 2


def test_summarize_nothing_bound() -> None:
    s = summarize([GangSpec("a", 2, 1)], {}, t0=0.0)
    assert s["pods_per_s"] is None and s["gang_done_p50_s"] is None and s["unbound"] == 2


def test_arrivals_measured_from_last_member_created() -> None:
    arrivals = [GangSpec("a0", 2, 1), GangSpec("a1", 2, 1)]
    bound = {"a0-0": ("n", 5.2), "a0-1": ("n", 5.4), "a1-0": ("n", 9.0)}
    s = summarize_arrivals(arrivals, bound, {"a0": 5.0, "a1": 8.0})
    assert s["arrival_complete"] == 1 and s["arrival_p95_s"] == 0.4


def test_ratios_and_table() -> None:
    rows = [
        {"key": "stock", "scheduler": "stock", "pods_per_s": 125.0, "gang_done_p50_s": 3.5},
        {"key": "lockstep", "scheduler": "lockstep", "pods_per_s": 27.0,
         "gang_done_p50_s": 14.9, "rss_mb": 80.5},
        {"key": "sp", "scheduler": "sp", "pods_per_s": 148.0, "gang_done_p50_s": 3.0},
    ]
    r = ratios(rows)
    assert r["pods_per_s_lockstep_over_stock"] == 0.22
    assert r["pods_per_s_lockstep_over_sp"] == 0.18
    assert r["gang_done_p50_lockstep_over_sp"] == 4.97
    assert ratios([rows[1]])["pods_per_s_lockstep_over_stock"] is None
    lines = format_table(rows, (("scheduler", "scheduler"), ("pods_per_s", "pods/s"),
                                ("rss_mb", "RSS"))).splitlines()
    assert len(lines) == 4 and lines[0].split() == ["scheduler", "pods/s", "RSS"]
    assert lines[1].split() == ["stock", "125", "-"]
    assert len({len(line) for line in lines}) == 1  # right-aligned columns


def test_cpu_breakdown_counts_processes_started_in_the_batch_from_zero() -> None:
    before = {"kube-apiserver": 10.0, "etcd": 2.0, "harness": 1.0}
    after = {"kube-apiserver": 13.5, "etcd": 2.5, "harness": 1.25, "scheduler": 2.0,
             "lockstep": 1.5}
    cpu = cpu_breakdown(before, after, machine=9.0, pods=800, steal=0.5)
    assert cpu["kube-apiserver"] == 3.5 and cpu["etcd"] == 0.5 and cpu["harness"] == 0.25
    assert cpu["scheduler"] == 2.0 and cpu["lockstep"] == 1.5
    assert cpu["machine"] == 9.0 and cpu["other"] == 1.25
    assert cpu["machine_ms_per_pod"] == 11.2 and cpu["steal"] == 0.5


def test_cpu_breakdown_without_readings() -> None:
    cpu = cpu_breakdown({"kwok": None}, {"kwok": 1.0, "scheduler": None}, machine=None, pods=0)
    assert cpu["kwok"] is None and cpu["scheduler"] is None
    assert cpu["machine"] is None and cpu["other"] is None and cpu["machine_ms_per_pod"] is None
    assert cpu["steal"] is None


def test_rounds_alternate_the_order() -> None:
    assert round_orders(["stock", "lockstep", "sp"], 3) == [
        ["stock", "lockstep", "sp"], ["sp", "lockstep", "stock"], ["stock", "lockstep", "sp"]]
    assert round_orders(["lockstep"], 1) == [["lockstep"]]


def test_ratios_over_rounds_are_medians_with_their_range() -> None:
    k = "pods_per_s_lockstep_over_sp"
    per_round = [{k: 0.72, "gang_done_p50_lockstep_over_sp": None},
                 {k: 0.99, "gang_done_p50_lockstep_over_sp": 1.5},
                 {k: 0.85, "gang_done_p50_lockstep_over_sp": 1.6}]
    r = median_ratios(per_round)
    assert r[k] == 0.85 and r[f"{k}_range"] == [0.72, 0.99]
    assert r["gang_done_p50_lockstep_over_sp"] == 1.55  # the rounds that have one
    assert r["gang_done_p50_lockstep_over_sp_range"] == [1.5, 1.6]
    assert median_ratios([]) == {}
    assert "pods/s 0.85x (0.72-0.99)" in format_ratios(r)
    assert "Lockstep/stock: pods/s -," in format_ratios(r)


def test_prometheus_parsing_and_request_delta() -> None:
    before = parse_prometheus(
        '# HELP apiserver_request_total x\n'
        'apiserver_request_total{code="201",resource="pods",subresource="binding",'
        'verb="POST"} 10\n'
        'apiserver_request_total{code="200",resource="pods",subresource="",verb="PATCH"} 1\n'
        'other_metric 3\n', ("apiserver_request_total",))
    assert len(before) == 2 and before[0][1]["subresource"] == "binding"
    after = parse_prometheus(
        'apiserver_request_total{code="201",resource="pods",subresource="binding",'
        'verb="POST"} 810\n'
        'apiserver_request_total{code="200",resource="pods",subresource="",verb="PATCH"} 1\n'
        'apiserver_request_total{code="201",resource="events",subresource="",verb="POST"} '
        '5e+02\n')
    assert request_delta(before, after) == {"POST events": 500, "POST pods/binding": 800}


def test_watchers_terminated_by_resource() -> None:
    series = ("apiserver_terminated_watchers_total",)
    before = parse_prometheus(
        'apiserver_terminated_watchers_total{group="",resource="pods"} 3\n'
        'apiserver_request_total{code="200",resource="pods",verb="PATCH"} 1\n', series)
    after = parse_prometheus(
        'apiserver_terminated_watchers_total{group="",resource="pods"} 40\n'
        'apiserver_terminated_watchers_total{group="",resource="nodes"} 2\n'
        'apiserver_terminated_watchers_total{group="scheduling.x-k8s.io",resource="podgroups"}'
        ' 0\n', series)
    assert watchers_terminated(before, after) == {"nodes": 2, "pods": 37}
    assert watchers_terminated(after, after) == {}


PPROF_TOP = """File: kube-apiserver
Type: cpu
Duration: 10s, Total samples = 7.24s (72.40%)
Showing nodes accounting for 4.1s, 56.63% of 7.24s total
      flat  flat%   sum%        cum   cum%
         0     0%     0%      2.07s 28.59%  handlers.(*patcher).patchResource.func2
         0     0%     0%      2.06s 28.45%  handlers.(*patcher).patchResource.func3
     0.01s  0.14%  0.14%      950ms 13.12%  core/pod/storage.(*StatusREST).Update
         0     0%  0.14%         1s 13.81%  runtime.gcBgMarkWorker
"""


def test_pprof_cum_takes_the_outermost_frame_naming_each_needle() -> None:
    from benchmarks.profile_report import pprof_cum

    total, cum = pprof_cum(PPROF_TOP, ["patchResource", "pod/storage.(*StatusREST).Update",
                                       "runtime.gcBgMarkWorker", "BindingREST"])
    assert total == 7.24
    assert cum == {"patchResource": 2.07, "pod/storage.(*StatusREST).Update": 0.95,
                   "runtime.gcBgMarkWorker": 1.0, "BindingREST": 0.0}
    assert pprof_cum("no profile here", ["x"]) == (None, {"x": 0.0})


def test_ready_nodes_counts_only_ready_true() -> None:
    from benchmarks.throughput import _ready_nodes

    def node(status: str | None) -> dict[str, object]:
        conds = [] if status is None else [{"type": "MemoryPressure", "status": "False"},
                                           {"type": "Ready", "status": status}]
        return {"status": {"conditions": conds}}

    class Nodes:
        def list(self, path: str) -> list[dict[str, object]]:
            assert path == "/api/v1/nodes"
            return [node("True"), node("False"), node(None), {}, node("True")]

    assert _ready_nodes(Nodes()) == 2  # type: ignore[arg-type]


def test_pyspy_shares_counts_stacks_containing_each_needle() -> None:
    from benchmarks.profile_report import pyspy_shares

    lines = ["main (a.py:1);Lockstep._bind_one (app/service.py:9);send (x.py:2) 30",
             "main (a.py:1);Lockstep._post_events (app/service.py:5) 10",
             "main (a.py:1);VerbsApp._filter (app/http/verbs.py:3) 5", "", "garbage"]
    total, hits = pyspy_shares(lines, ["Lockstep._bind_one", "main (", "nothing"])
    assert total == 45
    assert hits == {"Lockstep._bind_one": 30, "main (": 45, "nothing": 0}


def test_scheduling_budget_splits_the_algorithm_time() -> None:
    from benchmarks.profile_report import scheduling_budget

    row = {"span_s": 40.0,
           "kube_scheduler": {"algorithm_count": 800.0, "algorithm_sum": 32.0,
                              "ext_Filter_Success_sum": 4.0, "ext_PreFilter_Success_sum": 0.8},
           "lockstep": {"verb_filter_sum": 1.6, "verb_filter_count": 800.0}}
    b = scheduling_budget(row)
    assert b["algorithm_ms_per_pod"] == 40.0
    assert b["intree_prefilter_filter_ms_per_pod"] == 6.0
    assert b["lockstep_filter_handler_ms_per_pod"] == 2.0
    assert b["extender_wait_outside_handler_ms_per_pod"] == 32.0
    assert b["algorithm_share_of_span"] == 0.8
    assert b["pods_per_s_if_bound_by_algorithm"] == 25.0
    assert scheduling_budget({}) == {}


def test_report_finds_profiles_copied_beside_the_json(tmp_path: object) -> None:
    from pathlib import Path

    from benchmarks.profile_report import report

    base = Path(str(tmp_path))
    (base / "pyspy-lockstep.txt").write_text(
        "main (a.py:1);Binder._bind_one (app/effects/binder.py:9) 3\n"
        "main (a.py:1);ClusterCache.run (app/kube/cache.py:2) 1\n")
    row = {"scheduler": "Lockstep", "batch_wall_s": 1.0, "pods_per_s": 100.0,
           "pyspy_file": "/gone/elsewhere/pyspy-lockstep.txt",
           "watchers_terminated": {"pods": 31},
           "pprof_errors": {"scheduler": "URLError('refused')"}}
    text = report({"rows": [row]}, base)
    assert "py-spy: 4 non-idle samples" in text
    assert " 75.0%  binding POSTs" in text
    assert "watches the API server cut off (client too slow): {'pods': 31}" in text
    assert "Go CPU profile of scheduler failed: URLError('refused')" in text


def test_run_options_reject_an_unknown_mode_and_a_rate_that_is_not_positive() -> None:
    from benchmarks.throughput import RunOptions

    assert RunOptions(nodes=10, mode="steady", rate=2.0).mode == "steady"
    assert RunOptions(nodes=10).mode == "burst"  # the headline is the default
    with pytest.raises(ValueError, match="mode"):
        RunOptions(nodes=10, mode="flood")
    with pytest.raises(ValueError, match="rate"):
        RunOptions(nodes=10, mode="steady", rate=0)


class _RecordingKube:
    def __init__(self) -> None:
        import threading
        import time

        self.lock, self.clock = threading.Lock(), time.monotonic
        self.created: list[tuple[str, float]] = []

    def create(self, path: str, obj: dict) -> dict:
        with self.lock:
            self.created.append((obj["metadata"]["name"], self.clock()))
        return obj


def test_steady_stream_creates_each_group_on_its_tick_and_records_its_last_member() -> None:
    import time

    from benchmarks.throughput import _stream

    kube = _RecordingKube()
    groups = [GangSpec("g0", 3, 1), GangSpec("p0", 1, 2, gang=False), GangSpec("g1", 2, 1)]
    created: dict[str, float] = {}
    t0 = time.monotonic()
    _stream(kube, groups, "sp", t0, 20.0, created)  # type: ignore[arg-type]
    names = [n for n, _ in kube.created]
    # The PodGroup of each scheduler-plugins gang comes before its pods.
    assert sorted(names) == sorted(["g0", "g0-0", "g0-1", "g0-2", "p0", "g1", "g1-0", "g1-1"])
    assert names.index("g1") < min(names.index("g1-0"), names.index("g1-1"))
    first = {g.name: min(t for n, t in kube.created if n == g.name or
                         n.startswith(g.name + "-")) for g in groups}
    for i, g in enumerate(groups):
        assert first[g.name] >= t0 + i / 20.0 - 0.005, g.name  # never ahead of its tick
        last = max(t for n, t in kube.created if n in g.pod_names())
        assert created[g.name] >= last
    assert list(created) == ["g0", "p0", "g1"]


def test_burst_creates_every_podgroup_before_any_pod_with_no_pacing() -> None:
    import math
    import time

    from benchmarks.throughput import _stream

    kube = _RecordingKube()
    groups = [GangSpec(f"g{i}", 3, 1) for i in range(30)]
    created: dict[str, float] = {}
    t0 = time.monotonic()
    _stream(kube, groups, "sp", t0, math.inf, created)  # type: ignore[arg-type]
    names = [n for n, _ in kube.created]
    assert len(names) == 30 * 4
    # PodGroups first, so no pod reaches a scheduler without its group.
    assert max(names.index(f"g{i}") for i in range(30)) < min(
        names.index(p) for g in groups for p in g.pod_names())
    # Nothing paced: a 20/s stream of 30 groups would take 1.45 s.
    assert max(t for _, t in kube.created) - t0 < 1.0
    assert set(created) == {g.name for g in groups}
    assert all(created[g.name] >= max(t for _, t in kube.created) for g in groups)


def test_pin_binds_every_thread_of_a_process() -> None:
    import os
    import threading

    from benchmarks.throughput import _pin

    before = os.sched_getaffinity(0)
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        _pin([os.getpid(), None], 0)
        assert os.sched_getaffinity(0) == {0}
        assert os.sched_getaffinity(worker.native_id or 0) == {0}
    finally:
        for tid in os.listdir(f"/proc/{os.getpid()}/task"):
            os.sched_setaffinity(int(tid), before)
        stop.set()
        worker.join()
