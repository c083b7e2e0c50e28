"""deploy/grafana/lockstep.json against a Lockstep running on the test bed: every metric name
its PromQL reads is in what `/metrics` really exports, and the GPU and latency series it
draws carry the numbers the cluster shows."""

from __future__ import annotations

import httpx

from testbed.workloads import gang
from tests.promql import dashboard, exported_names, expressions, metric_names

from .conftest import ClusterFactory


def test_every_dashboard_query_reads_an_exported_metric(cluster: ClusterFactory) -> None:
    c = cluster("tiny-3x2")  # 3 nodes x 2 GPUs
    c.create(*gang("dash", 2, gpus=1))
    c.wait_bound(c.names("dash", 2), 30)
    assert c.lockstep_url
    text = httpx.get(c.lockstep_url + "/metrics", timeout=10).text
    exported = exported_names(text)
    read = set()
    for title, expr in expressions(dashboard()):
        names = metric_names(expr)
        assert names <= exported, f"{title}: {sorted(names - exported)} not exported: {expr}"
        read |= names
    assert len(read) >= 15
    # The series the panels draw hold what happened: a 2-pod gang bound on 6 GPUs.
    assert c.metric("lockstep_allocatable_gpus") == 6
    c.kube.wait("used GPUs counted", lambda: c.metric("lockstep_used_gpus") == 2, 15)
    assert c.metric("lockstep_gang_arrival_to_bound_seconds_count") == 1
    assert c.metric("lockstep_gang_admission_wait_seconds_count") == 1
    assert c.metric('lockstep_verb_duration_seconds_count{verb="bind"}') >= 2
    assert c.metric("lockstep_partial_gangs_total") == 0
