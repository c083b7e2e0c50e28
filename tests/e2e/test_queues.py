"""Volcano on a cluster that gains its CRDs after Lockstep started, and Volcano's queues.

A training operator in Volcano mode is often installed together with Volcano's CRDs, after
the scheduler is up: Lockstep must notice the PodGroup CRD at once (a watch of
CustomResourceDefinitions wakes the PodGroup loop), not at its 30 s poll.
"""

from __future__ import annotations

import time

from testbed.runner import VOLCANO_CRD

from .conftest import ClusterFactory
from .test_conventions import volcano_pod, volcano_podgroup


def test_volcano_crd_installed_after_start_is_noticed_at_once(cluster: ClusterFactory) -> None:
    c = cluster("tiny-3x2")  # no Volcano CRD: Lockstep starts without it
    c.kube.wait("Lockstep ready", lambda: c.lockstep("/debug/gangs") is not None, 10)
    time.sleep(1.0)  # its Volcano PodGroup loop has found nothing and sleeps
    t0 = time.monotonic()
    c.bed.kubectl("apply", "--server-side", "-f", str(VOLCANO_CRD))
    c.bed.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                  "crd/podgroups.scheduling.volcano.sh")
    c.kube.create(f"/apis/scheduling.volcano.sh/v1beta1/namespaces/{c.ns}/podgroups",
                  volcano_podgroup("late", 4))
    c.recorder.min_member_of[f"{c.ns}/late"] = 4
    c.create(*(volcano_pod(f"late-{i}", "late") for i in range(4)))
    c.wait_bound([f"late-{i}" for i in range(4)], 30)
    took = time.monotonic() - t0
    print(f"Volcano CRD applied to the gang bound: {took:.2f}s")
    assert took < 10.0, took
    c.recorder.assert_gang_invariants(c.ns)
