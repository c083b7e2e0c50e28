"""Lockstep's shutdown with bind calls parked: SIGTERM must not wait for the gang deadline.

A parked bind is an in-flight HTTP request that lasts until its gang's quorum or deadline; a
server that drains in-flight requests before exiting would hang a rolling update for the
whole deadline. Lockstep answers parked calls at once on SIGTERM (kube-scheduler retries
them), exits, and a new Lockstep binds the gang once it is complete.

Parking binds: Lockstep's filter holds every member back while fewer than min-member exist
("2/3 members exist, waiting for 1 more"), so a gang with only 2 of its 3 members has nothing
parked. The third member is created but unplaceable by kube-scheduler's own filter (required
pod affinity to pods that never exist): the other two pass filter and their bind calls park.
"The last member exists" is then that member deleted and created placeable, same name.
"""

from __future__ import annotations

import signal
import time

from testbed.workloads import gang, pod

from .conftest import ClusterFactory

GANG_TIMEOUT = 120  # far beyond the 5 s the shutdown may take
EXIT_WITHIN = 5.0


def test_sigterm_with_parked_binds_exits_at_once_and_the_gang_binds_after_restart(
    cluster: ClusterFactory,
) -> None:
    c = cluster("tiny-3x2")
    pods = gang("s", 3, timeout=GANG_TIMEOUT)
    c.create(*pods[:2],
             pod("s-2").gang("s", 3, timeout=GANG_TIMEOUT).gpu(1).unplaceable().build())

    def parked() -> int:
        gangs = c.lockstep("/debug/gangs")["gangs"]
        return sum(int(g["parked"]) for g in gangs if str(g["gang"]) in (f"{c.ns}/s", "s"))

    c.kube.wait("two binds parked", lambda: parked() == 2, 30)
    pid = c.bed.procs["lockstep"].pid
    t0 = time.monotonic()
    c.bed.signal("lockstep", signal.SIGTERM)
    code = c.bed.wait_exit("lockstep", EXIT_WITHIN)
    took = time.monotonic() - t0
    print(f"\nlockstep (pid {pid}) exit code {code} {took:.2f}s after SIGTERM "
          f"with 2 binds parked (gang timeout {GANG_TIMEOUT}s)")
    assert code is not None, (
        f"Lockstep still running {EXIT_WITHIN:.0f}s after SIGTERM with 2 bind calls parked "
        f"(it would wait for the {GANG_TIMEOUT}s gang deadline)\n"
        + c.bed.tail("lockstep", 30))
    # uvicorn re-raises a captured SIGTERM once its shutdown has run, so a clean exit is
    # "killed by SIGTERM" (-15) as often as 0.
    assert code in (0, -signal.SIGTERM), (
        f"exit code {code} after SIGTERM\n" + c.bed.tail("lockstep", 30))
    assert c.bound() == {}, "the shutdown bound part of the gang"

    c.bed.restart("lockstep")
    c.delete("s-2")
    c.kube.wait("s-2 gone", lambda: "s-2" not in {
        p["metadata"]["name"] for p in c.kube.list(f"/api/v1/namespaces/{c.ns}/pods")}, 30)
    c.create(pods[2])
    c.wait_bound(c.names("s", 3), 60)
    c.recorder.assert_gang_invariants(c.ns)
