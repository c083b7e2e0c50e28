"""``python -m testbed up|down`` without a cluster: Lockstep's port choice and how ``down``
stops what ``up`` recorded (SIGTERM, SIGKILL after the grace period, a line per process)."""

from __future__ import annotations

import inspect
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.__main__ import _ours, parser, pick_port, stop_recorded
from testbed.runner import TestBed

SLEEPER = "import sys, time; time.sleep(60)"
STUBBORN = ("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(60)")


def test_lockstep_is_the_default_install_and_the_extender_alone_an_opt_out() -> None:
    """``make cluster-up LOCKSTEP=1`` (and every caller of ``start_lockstep``) gets the
    webhook; only ``--no-webhook`` (``WEBHOOK=0``) or ``webhook=False`` leave it out."""
    assert parser().parse_args(["up", "--lockstep"]).webhook is True
    assert parser().parse_args(["up", "--lockstep", "--no-webhook"]).webhook is False
    params = inspect.signature(TestBed.start_lockstep).parameters
    assert params["webhook"].default is True
    assert params["webhook_certs"].default == "own"


def test_preferred_port_when_free() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert pick_port(port) == port


def test_busy_port_gives_another_free_one() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        chosen = pick_port(port)
        assert chosen != port
        with socket.socket() as s:
            s.bind(("127.0.0.1", chosen))  # really free


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(5)
        if p.stdout is not None:
            p.stdout.close()


def _start(procs: list[subprocess.Popen[bytes]], code: str, marker: Path
           ) -> subprocess.Popen[bytes]:
    # The marker argument puts the run directory on the command line, as every test bed
    # process has it (--data-dir, --cert-dir, --kubeconfig, --config).
    p = subprocess.Popen([sys.executable, "-c", code, str(marker)], start_new_session=True,
                         stdout=subprocess.PIPE)
    procs.append(p)
    return p


def test_down_terms_then_kills_and_reports(tmp_path: Path,
                                           spawn: list[subprocess.Popen[bytes]]) -> None:
    run = tmp_path / "bed"
    polite = _start(spawn, SLEEPER, run / "kubeconfig")
    stubborn = _start(spawn, STUBBORN, run / "etcd-data")
    assert stubborn.stdout is not None
    assert stubborn.stdout.readline() == b"ready\n"  # its SIGTERM handler is in place
    pids = {"etcd": stubborn.pid, "lockstep": polite.pid}
    t0 = time.monotonic()
    lines = stop_recorded(pids, str(run), grace=1.0)
    took = time.monotonic() - t0  # (an exited child is a zombie here: no command line)
    assert lines[0].startswith(f"stopped lockstep (pid {polite.pid}): SIGTERM"), lines  # newest
    assert lines[1] == (f"killed etcd (pid {stubborn.pid}): SIGKILL, still running 1s after "
                        "SIGTERM"), lines
    assert 1.0 <= took < 5.0
    assert polite.wait(2) == -15 and stubborn.wait(2) == -9


def test_down_leaves_a_reused_pid_alone(tmp_path: Path,
                                        spawn: list[subprocess.Popen[bytes]]) -> None:
    stranger = _start(spawn, SLEEPER, tmp_path / "elsewhere" / "x")
    other_bed = _start(spawn, SLEEPER, tmp_path / "bed2" / "kubeconfig")
    run = str(tmp_path / "bed")
    assert not _ours(stranger.pid, run) and not _ours(other_bed.pid, run)  # bed2 != bed
    lines = stop_recorded({"kwok": stranger.pid, "kube-scheduler": other_bed.pid}, run, 0.5)
    assert lines == [f"kube-scheduler (pid {other_bed.pid}) was not running",  # newest first
                     f"kwok (pid {stranger.pid}) was not running"]
    assert stranger.poll() is None and other_bed.poll() is None

