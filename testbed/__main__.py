"""``python -m testbed up|down``: a test bed for people (``make cluster-up`` / ``cluster-down``).

``up`` starts the control plane (and the stock scheduler), creates the nodes of a topology
file, optionally starts Lockstep with its kube-scheduler, prints how to reach it, and leaves
the processes running; their PIDs go to ``run/state.json`` for ``down``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
from pathlib import Path

from .bins import REPO, bin_path, ensure_bins
from .cluster import create_nodes, load_topology, nodes_from_topology
from .kube import Kube
from .runner import TestBed

STATE = REPO / "run" / "state.json"


def up(args: argparse.Namespace) -> int:
    if STATE.exists():
        print(f"a test bed is already up ({STATE}); run `make cluster-down` first",
              file=sys.stderr)
        return 1
    ensure_bins()
    run_dir = Path(args.run_dir or REPO / "run" / "bed").resolve()
    if not args.run_dir:
        shutil.rmtree(run_dir, ignore_errors=True)  # a fresh cluster each time
    bed = TestBed(run_dir=run_dir)
    bed.start()
    try:
        kube = Kube(bed.api_url, bed.token)
        nodes = nodes_from_topology(load_topology(args.topology))
        create_nodes(kube, nodes)
        bed.start_scheduler(None, name="kube-scheduler")
        url = None
        if args.lockstep:
            url = bed.start_lockstep(port=args.port)
            bed.start_scheduler(REPO / "scheduler-config" / "lockstep.yaml",
                                name="lockstep-scheduler", extender_url=url)
    except BaseException:
        bed.stop()
        raise
    STATE.parent.mkdir(exist_ok=True)
    STATE.write_text(json.dumps({"run_dir": str(run_dir),
                                 "pids": {n: p.pid for n, p in bed.procs.items()}}))
    kubectl = bin_path("kubectl")
    print(f"test bed up in {bed.startup_seconds['control-plane']:.1f}s: {len(nodes)} nodes "
          f"from {args.topology}")
    print(f"  kubeconfig: {bed.kubeconfig}")
    print(f"  logs:       {run_dir}/*.log")
    if url:
        print(f"  lockstep:   {url}  (schedulerName: lockstep; try {url}/debug/gangs)")
    print("\nPaste this to use it:")
    print(f"  alias k='{kubectl} --kubeconfig={bed.kubeconfig}'; k get nodes")
    print("\nStop it with: make cluster-down")
    return 0


def down(_: argparse.Namespace) -> int:
    if not STATE.exists():
        print("no test bed is up")
        return 0
    state = json.loads(STATE.read_text())
    for name, pid in reversed(list(state["pids"].items())):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
            print(f"stopped {name} (pid {pid})")
    STATE.unlink()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m testbed")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("up", help="start a test bed and leave it running")
    p.add_argument("--topology", default="tiny-3x2",
                   help="topology file or name in testbed/topologies (default tiny-3x2)")
    p.add_argument("--lockstep", action="store_true", help="also run Lockstep and its scheduler")
    p.add_argument("--port", type=int, default=8888, help="Lockstep's port (default 8888)")
    p.add_argument("--run-dir", help="where logs, certs and etcd data go (default run/bed)")
    sub.add_parser("down", help="stop the test bed started by `up`")
    args = ap.parse_args()
    return up(args) if args.cmd == "up" else down(args)


if __name__ == "__main__":
    sys.exit(main())
