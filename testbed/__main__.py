"""``python -m testbed up|down``: a test bed for people (``make cluster-up`` / ``cluster-down``).

``up`` starts the control plane (and the stock scheduler), creates the nodes of a topology
file, optionally starts Lockstep with its kube-scheduler, prints how to reach it, and leaves
the processes running; their PIDs go to ``<run dir>/state.json`` (default ``run/bed``) for
``down``, which sends SIGTERM, then SIGKILL to whatever still runs after a grace period, and
says what it stopped. Lockstep listens on 8888, or on a free port (printed) when 8888 is
taken, so two test beds with Lockstep (``--run-dir``, or two checkouts) run side by side.
Lockstep is the default install: its admission webhook on, with the certificate it issues
itself (``TestBed.start_lockstep``); ``--no-webhook`` runs the extender alone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import time
from pathlib import Path

from .bins import REPO, bin_path, ensure_bins
from .cluster import create_nodes, load_topology, nodes_from_topology
from .dra import is_dra_node
from .kube import Kube
from .runner import StartupError, TestBed, free_port

DEFAULT_RUN_DIR = REPO / "run" / "bed"
LEGACY_STATE = REPO / "run" / "state.json"
LOCKSTEP_PORT = 8888
GRACE_SECONDS = 10.0


def state_path(run_dir: Path) -> Path:
    """Each test bed keeps its PIDs in its own run directory, so several can be up at once
    (``--run-dir``) and ``down --run-dir`` stops exactly one of them."""
    return run_dir / "state.json"


def pick_port(preferred: int) -> int:
    """``preferred`` when nothing listens on it (127.0.0.1), else a free port."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            s.bind(("127.0.0.1", preferred))
        except OSError:
            return free_port()
    return preferred


def up(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir).resolve() if args.run_dir else DEFAULT_RUN_DIR
    for state in (state_path(run_dir), LEGACY_STATE):
        if state.exists():
            print(f"a test bed is already up ({state}); run `make cluster-down` first"
                  + (f" (python -m testbed down --run-dir {run_dir})" if args.run_dir else ""),
                  file=sys.stderr)
            return 1
    ensure_bins()
    if not args.run_dir:
        shutil.rmtree(run_dir, ignore_errors=True)  # a fresh cluster each time
    bed = TestBed(run_dir=run_dir)
    bed.start()
    try:
        kube = Kube(bed.api_url, bed.token)
        nodes = nodes_from_topology(load_topology(args.topology), nodes=args.nodes)
        t0 = time.monotonic()
        create_nodes(kube, nodes)  # and a DRA node's ResourceSlice
        nodes_seconds = time.monotonic() - t0
        if any(map(is_dra_node, nodes)):  # claims from ResourceClaimTemplates
            bed.start_controller_manager()
        bed.start_scheduler(None, name="kube-scheduler")
        url = None
        port_note = ""
        if args.lockstep:
            url, port_note = _start_lockstep(bed, args.port, webhook=args.webhook)
            bed.start_scheduler(REPO / "scheduler-config" / "lockstep.yaml",
                                name="lockstep-scheduler", extender_url=url)
    except BaseException:
        bed.stop()
        raise
    state_path(run_dir).write_text(json.dumps({
        "run_dir": str(run_dir), "pids": bed.pids(), "api_url": bed.api_url,
        "kubeconfig": str(bed.kubeconfig), "lockstep_url": url}))
    kubectl = bin_path("kubectl")
    print(f"test bed up in {bed.startup_seconds['control-plane']:.1f}s; {len(nodes)} nodes "
          f"from {args.topology} created in {nodes_seconds:.1f}s")
    print(f"  kubeconfig: {bed.kubeconfig}")
    print(f"  logs:       {run_dir}/*.log")
    if url:
        print(f"  lockstep:   {url}  (schedulerName: lockstep; try {url}/debug/gangs)"
              f"{port_note}")
        print(f"  lockstep port: {url.rsplit(':', 1)[1]}")
        hook = bed.webhooks.get("lockstep")
        print(f"  webhook:    {hook}  (pins or gates gang pods at creation; certificate in "
              "Secret lockstep-system/lockstep-webhook-cert)" if hook else
              "  webhook:    off (--no-webhook: the extender alone)")
    print("\nPaste this to use it:")
    print(f"  alias k='{kubectl} --kubeconfig={bed.kubeconfig}'; k get nodes")
    if url:
        print(f"  export LOCKSTEP_URL={url}  # for .venv/bin/lockstep status / explain")
    down = "make cluster-down" if not args.run_dir else (
        f"python -m testbed down --run-dir {run_dir}")
    print(f"\nStop it with: {down}")
    return 0


def _start_lockstep(bed: TestBed, port: int | None, *, webhook: bool = True
                    ) -> tuple[str, str]:
    """Lockstep on ``port`` if given (it must be free), else on 8888 or, when 8888 is
    taken (another test bed, another service), on a free port. Returns (url, note).
    ``webhook``: the default install, its admission webhook registered and called."""
    if port is not None:
        return bed.start_lockstep(port=port, webhook=webhook), ""
    for _ in range(3):  # another process may take the port between the probe and the bind
        chosen = pick_port(LOCKSTEP_PORT)
        note = "" if chosen == LOCKSTEP_PORT else f"  [{LOCKSTEP_PORT} is busy]"
        try:
            return bed.start_lockstep(port=chosen, webhook=webhook), note
        except StartupError:
            if chosen == LOCKSTEP_PORT or pick_port(chosen) == chosen:
                raise  # the port was free: Lockstep failed for another reason
    raise StartupError("Lockstep could not bind a free port three times in a row")


def _ours(pid: int, run_dir: str) -> bool:
    """The PID is alive and still belongs to this test bed (not reused since): its command
    line names a path inside the run directory."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return False
    return (run_dir.rstrip("/") + "/") in cmdline


def stop_recorded(pids: dict[str, int], run_dir: str, grace: float = GRACE_SECONDS
                  ) -> list[str]:
    """Stop the recorded processes one at a time, newest first (schedulers and Lockstep before
    the API server, the API server before etcd, which it needs to shut down cleanly): SIGTERM
    to the process group, SIGKILL if it still runs ``grace`` seconds later. A PID that no
    longer belongs to the bed is left alone. Returns one line per process, in stop order."""
    report = []
    for name, pid in reversed(list(pids.items())):
        if not _ours(pid, run_dir):
            report.append(f"{name} (pid {pid}) was not running")
            continue
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            report.append(f"{name} (pid {pid}) was not running")
            continue
        t0 = time.monotonic()
        while _ours(pid, run_dir) and time.monotonic() - t0 < grace:
            time.sleep(0.05)
        if not _ours(pid, run_dir):
            report.append(f"stopped {name} (pid {pid}): SIGTERM, exited after "
                          f"{time.monotonic() - t0:.1f}s")
            continue
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        t1 = time.monotonic()
        while _ours(pid, run_dir) and time.monotonic() - t1 < 5:
            time.sleep(0.05)
        report.append(f"killed {name} (pid {pid}): SIGKILL, still running {grace:g}s after "
                      "SIGTERM" + (" -- and STILL RUNNING after SIGKILL"
                                   if _ours(pid, run_dir) else ""))
    return report


def down(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir).resolve() if args.run_dir else DEFAULT_RUN_DIR
    state = state_path(run_dir)
    if not state.exists() and not args.run_dir and LEGACY_STATE.exists():
        state = LEGACY_STATE  # written by an older `up`
    if not state.exists():
        print(f"no test bed is up (no {state})")
        return 0
    doc = json.loads(state.read_text())
    lines = stop_recorded(doc["pids"], doc["run_dir"], args.grace)
    for line in lines:
        print(line)
    state.unlink()
    return 1 if any("STILL RUNNING" in line for line in lines) else 0


def main() -> int:
    args = parser().parse_args()
    return up(args) if args.cmd == "up" else down(args)


def parser() -> argparse.ArgumentParser:
    """``up`` and ``down``'s options (``up --lockstep`` is the default install)."""
    ap = argparse.ArgumentParser(prog="python -m testbed")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("up", help="start a test bed and leave it running")
    p.add_argument("--topology", default="tiny-3x2",
                   help="topology file or name in testbed/topologies (default tiny-3x2)")
    p.add_argument("--nodes", type=int, help="scale the topology to this many nodes")
    p.add_argument("--lockstep", action="store_true", help="also run Lockstep and its scheduler")
    p.add_argument("--no-webhook", dest="webhook", action="store_false",
                   help="run Lockstep without its admission webhook (the extender alone); "
                   "by default it runs as installed, webhook on with its own certificate")
    p.add_argument("--port", type=int,
                   help="Lockstep's port (default 8888, or a free port when 8888 is busy)")
    p.add_argument("--run-dir", help="where logs, certs, etcd data and the state file go "
                   "(default run/bed); one test bed per run directory")
    d = sub.add_parser("down", help="stop the test bed started by `up`")
    d.add_argument("--run-dir", help="the test bed's run directory (default run/bed)")
    d.add_argument("--grace", type=float, default=GRACE_SECONDS,
                   help="seconds between SIGTERM and SIGKILL (default 10)")
    return ap


if __name__ == "__main__":
    sys.exit(main())
