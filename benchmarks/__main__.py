"""``make bench``: run every benchmark, print readable tables, write JSON.

``python -m benchmarks [verbs] [placement] [throughput] [memory] [client] [preemption]
[victims] [stall] [whatif] [failover] [creates]
[--quick]``; results go
to bench-results/. ``throughput`` takes its own options (``--nodes``, ``--gangs``, ``--size``,
``--gpus``, ``--shape mixed``, ``--profile``; see ``--help``), and so does ``memory``
(``--mem-nodes``, ``--mem-pods``).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from . import (
    client,
    creates,
    failover,
    memory,
    placement,
    preemption,
    stall,
    throughput,
    verbs,
    victims,
    whatif,
)

BENCHMARKS = ("verbs", "placement", "throughput", "memory", "client", "preemption", "victims",
              "stall", "whatif", "failover", "creates")


def table(rows: list[dict[str, Any]], columns: tuple[tuple[str, str], ...]) -> str:
    heads = [h for _, h in columns]
    cells = [[str(r.get(k, "")) for k, _ in columns] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(heads, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks")
    ap.add_argument("which", nargs="*", default=list(BENCHMARKS),
                    help=f"any of {', '.join(BENCHMARKS)} (default: all)")
    ap.add_argument("--quick", action="store_true", help="fewer requests and sizes")
    ap.add_argument("--out", default="bench-results")
    tp = ap.add_argument_group("throughput (stock vs Lockstep vs scheduler-plugins)")
    tp.add_argument("--nodes", type=int, default=None,
                    help="KWOK nodes x 8 GPUs (default 1000; 200 with --quick; try 5000)")
    tp.add_argument("--gangs", type=int, default=None, help="gangs (default 100; 20 quick)")
    tp.add_argument("--size", type=int, default=8, help="pods per gang (uniform shape)")
    tp.add_argument("--gpus", type=int, default=1, help="GPUs per pod (uniform shape)")
    tp.add_argument("--shape", choices=["uniform", "mixed"], default="uniform",
                    help="mixed: seeded gangs of 2-64 pods x 1-8 GPUs plus ~10%% plain pods")
    tp.add_argument("--seed", type=int, default=12, help="seed of the mixed shape")
    tp.add_argument("--arrivals", type=int, default=None,
                    help="gangs created one by one while the scheduler runs (default 20; 10 "
                         "quick)")
    tp.add_argument("--schedulers", default=",".join(throughput.SCHEDULERS),
                    help="comma-separated subset of stock,lockstep,sp (default: all three), "
                         "plus lockstep-ungated (gang pods without Lockstep's gate)")
    tp.add_argument("--timeout", type=float, default=None,
                    help="seconds each scheduler gets for the batch (default 300; 120 quick)")
    ap.add_argument("--big", type=int, default=stall.BIG,
                    help=f"stall: members of the big gang (default {stall.BIG}; 0 leaves "
                         "the big-gang phases out)")
    ap.add_argument("--dra-nodes", type=int, default=stall.DRA_NODES,
                    help=f"stall: nodes x 8 DRA GPUs of the DRA phases (default "
                         f"{stall.DRA_NODES}; 0 leaves them out)")
    ap.add_argument("--dra-list", type=int, default=stall.DRA_LIST,
                    help=f"stall: items of the list the nested-macro selector iterates three "
                         f"deep (default {stall.DRA_LIST}; 0 leaves that phase out)")
    ap.add_argument("--stall-phases", default="baseline,big,different,dra",
                    help="stall: which groups of phases run (comma-separated subset of "
                         "baseline (idle, preemption, hostile), big, different, dra)")
    tp.add_argument("--stall", type=float, default=45.0,
                    help="give up on a scheduler's batch after this many seconds without a "
                         "new binding (default 45)")
    tp.add_argument("--mode", choices=list(throughput.MODES), default="burst",
                    help="burst (the headline): every scheduler runs, then every pod is "
                         "created at once, t0 at the first create; steady: gangs arrive at "
                         "--rate per second while every scheduler runs; backlog: every pod "
                         "created before the scheduler starts (Lockstep's webhook works "
                         "before t0: never a headline)")
    tp.add_argument("--rate", type=float, default=5.0,
                    help="gangs (and plain pods) created per second in steady mode")
    tp.add_argument("--pin", action="store_true",
                    help="etcd, kube-apiserver and KWOK on CPU 0, the scheduler and Lockstep "
                         "on CPU 1 (a control plane on machines of its own)")
    tp.add_argument("--rounds", type=int, default=1,
                    help="run every scheduler this many times, alternating their order; the "
                         "ratios are then medians over the rounds (default 1)")
    tp.add_argument("--profile", action="store_true",
                    help="also sample kube-scheduler's pending pods, run py-spy on Lockstep and "
                         "take Go CPU profiles of kube-apiserver and the scheduler")
    tp.add_argument("--pprof-seconds", type=int, default=10,
                    help="with --profile: length of the Go CPU profiles from t0; choose more "
                         "than the batch's span (default 10)")
    tp.add_argument("--lockstep-override", action="append", default=[], metavar="KEY=VALUE",
                    help="experiment: override a top-level KubeSchedulerConfiguration key of "
                         "the Lockstep run (e.g. percentageOfNodesToScore=0); repeatable")
    ap.add_argument("--kills", type=int, default=None,
                    help="failover: leaders killed (default 20; 3 with --quick)")
    mem = ap.add_argument_group("memory (goal: Lockstep RSS <= 300 MB at 5,000 nodes and "
                                "50,000 pods cached)")
    mem.add_argument("--mem-nodes", type=int, default=None,
                     help="KWOK nodes x 8 GPUs (default 5000; 1000 with --quick)")
    mem.add_argument("--mem-pods", type=int, default=None,
                     help="pods in all: ~10%% bound, 100 gangs x 8 behind Lockstep's gate, the "
                          "rest pending for a scheduler that does not run (default 50000; "
                          "5000 with --quick)")
    mem.add_argument("--mem-settle", type=float, default=5.0,
                     help="seconds between all cached and the RSS reading (default 5)")
    args = ap.parse_args()
    # (argparse's choices= rejects a list default with nargs="*", so check here)
    unknown = [w for w in args.which if w not in BENCHMARKS]
    if unknown:
        ap.error(f"unknown benchmark(s) {unknown}; choose from {', '.join(BENCHMARKS)}")
    out = Path(args.out)
    out.mkdir(exist_ok=True)
    meta = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "python": platform.python_version(), "machine": platform.machine()}
    if "verbs" in args.which:
        rows = verbs.run(requests=100 if args.quick else 300,
                         sizes=(500, 5000) if args.quick else verbs.SIZES)
        (out / "verbs.json").write_text(json.dumps({**meta, "rows": rows}, indent=2))
        print("\nVerb latency (ms, client round trip; goal: filter p99 < 5 ms at 5,000 nodes "
              "and within 2x of no-op)")
        print(table(rows, verbs.TABLE_COLUMNS))
    if "placement" in args.which:
        result = placement.run(quick=args.quick)
        (out / "placement.json").write_text(json.dumps({**meta, **result}, indent=2))
        print("\nPlacement quality (stock kube-scheduler vs Lockstep, same seeded workload)")
        print(table(result["rows"], placement.TABLE_COLUMNS))
    runners = {"throughput": _throughput, "memory": _memory, "client": _client,
               "preemption": _preemption, "victims": _victims, "stall": _stall,
               "whatif": _whatif, "failover": _failover, "creates": _creates}
    for name, run in runners.items():  # in this order, whatever order they were named in
        if name in args.which:
            run(args, out, meta)
    print(f"\nJSON written to {out}/")


def _commit() -> dict[str, Any]:
    """What was measured: the commit and whether the work tree differed from it."""
    def git(*a: str) -> str:
        r = subprocess.run(["git", *a], capture_output=True, text=True, check=False)
        return r.stdout.strip()
    return {"commit": git("rev-parse", "--short", "HEAD"),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
            "product_diff": git("diff", "HEAD", "--shortstat", "--", "app", "coscheduling")}


def _throughput(args: argparse.Namespace, out: Path, meta: dict[str, Any]) -> None:
    from testbed.bins import ensure_bins

    ensure_bins()
    nodes = args.nodes or (200 if args.quick else 1000)
    gangs = args.gangs or (20 if args.quick else 100)
    arrivals = args.arrivals if args.arrivals is not None else (10 if args.quick else 20)
    if args.shape == "mixed":
        wl = throughput.mixed(args.seed, gangs, nodes * throughput.NODE_GPUS, arrivals)
    else:
        wl = throughput.uniform(gangs, args.size, args.gpus, arrivals)
    overrides = {}
    for kv in args.lockstep_override:
        k, _, v = kv.partition("=")
        overrides[k] = int(v) if v.lstrip("-").isdigit() else v
    opts = throughput.RunOptions(
        nodes=nodes, timeout=args.timeout or (120.0 if args.quick else 300.0),
        profile=args.profile, pprof_seconds=args.pprof_seconds, out=out,
        lockstep_overrides=overrides, stall=args.stall,
        tag=",".join(args.lockstep_override), mode=args.mode, rate=args.rate, pin=args.pin)
    schedulers = [s for s in args.schedulers.split(",") if s]
    if args.rounds < 1 or (args.profile and args.rounds > 1):
        sys.exit("benchmarks: --rounds must be at least 1, and 1 with --profile")
    print(f"\nThroughput: {nodes} nodes x {throughput.NODE_GPUS} GPUs, workload "
          f"{wl.describe()}", flush=True)

    def progress(row: dict[str, Any]) -> None:
        print(f"  {row['scheduler']}: {row['pods_per_s']} pods/s, {row['unbound']} unbound, "
              f"gang done p50 {row['gang_done_p50_s']} s", flush=True)

    measured = _commit()  # at the start: the product code Lockstep runs is read now
    result = throughput.run(wl, opts, schedulers, on_row=progress, rounds=args.rounds)
    name = "throughput.json" if not args.profile else "throughput-profile.json"
    if args.mode != "burst" or args.pin:
        name = name.replace(".json", f"-{args.mode}{'-pinned' if args.pin else ''}.json")
    (out / name).write_text(json.dumps({**meta, **measured, "argv": sys.argv[1:], **result},
                                       indent=2))
    rounds = "one run" if args.rounds == 1 else f"{args.rounds} rounds, median ratios (range)"
    how = {"backlog": "all created before the scheduler starts (backlog: not a headline)",
           "burst": "all created at once while it runs, t0 at the first create"}.get(
        args.mode, f"gangs arriving at {args.rate:g}/s while it runs")
    pinned = "; control plane on CPU 0, scheduler on CPU 1" if args.pin else ""
    print(f"\nGang throughput ({nodes} nodes, {wl.describe()['pods']} pods, {how}{pinned}; "
          f"{rounds}, compare ratios)")
    columns = throughput.TABLE_COLUMNS if args.rounds == 1 else (
        ("round", "round"), *throughput.TABLE_COLUMNS)
    print(throughput.format_table(result["rows"], columns))
    print(throughput.format_ratios(result["ratios"]))


def _client(args: argparse.Namespace, out: Path, meta: dict[str, Any]) -> None:
    print("\nAPI client: event-loop CPU per request (per event for a watch), app.kube.fasthttp "
          "against aiohttp", flush=True)
    measured = _commit()
    result = client.run(requests=1000 if args.quick else 3000,
                        events=5000 if args.quick else 20000, rounds=3 if args.quick else 5,
                        log=lambda s: print(s, flush=True))
    (out / "client.json").write_text(json.dumps({**meta, **measured, "argv": sys.argv[1:],
                                                 **result}, indent=2))
    print(table(result["rows"], client.TABLE_COLUMNS))


def _preemption(args: argparse.Namespace, out: Path, meta: dict[str, Any]) -> None:
    from testbed.bins import ensure_bins

    ensure_bins()
    nodes = args.nodes or (200 if args.quick else 1000)
    rounds = 5 if args.quick else 20
    print(f"\nPreemption latency: {nodes} nodes x 8 GPUs full of low-priority 2 x 8-GPU gangs; "
          f"{rounds} high-priority 2 x 8-GPU gangs, one at a time", flush=True)
    measured = _commit()
    result = preemption.run(nodes, rounds, log=lambda s: print(s, flush=True))
    (out / "preemption.json").write_text(json.dumps({**meta, **measured, "argv": sys.argv[1:],
                                                     **result}, indent=2))
    print("\nPreemption latency (last member created to all bound, victims' grace 0)")
    print(table(result["rows"], preemption.TABLE_COLUMNS))


def _victims(args: argparse.Namespace, out: Path, meta: dict[str, Any]) -> None:
    nodes = 1000 if args.quick else 5000
    print(f"\nPreemption decision: {nodes} synthetic nodes x 8 GPUs full of bound pods, "
          "one choose_victims call per preemptor", flush=True)
    measured = _commit()
    result = victims.run(nodes)
    (out / "victims.json").write_text(json.dumps({**meta, **measured, "argv": sys.argv[1:],
                                                  **result}, indent=2))
    print(f"\nPreemption decision ({result['candidates']} candidate pods; event-loop time)")
    print(table(result["rows"], victims.TABLE_COLUMNS))


def _stall(args: argparse.Namespace, out: Path, meta: dict[str, Any]) -> None:
    nodes = 1000 if args.quick else 5000
    groups = set(args.stall_phases.split(","))
    print(f"\nEvent-loop stalls ({', '.join(sorted(groups))}): verbs and /healthz while a "
          f"{stall.GANG} x {stall.GANG_GPUS}-GPU gang searches for victims over {nodes} full "
          f"nodes, then while {stall.HOSTILE} hostile pods arrive, then while {args.big}-member "
          f"gangs are planned, then while DRA gangs are planned", flush=True)
    measured = _commit()
    result = stall.run(nodes, gangs=1 if args.quick else 3, log=lambda s: print(s, flush=True),
                       big=args.big if groups & {"big", "different"} else 0,
                       different="different" in groups,
                       dra_nodes=args.dra_nodes if "dra" in groups else 0,
                       dra_list=args.dra_list, baseline="baseline" in groups,
                       alike="big" in groups)
    (out / "stall.json").write_text(json.dumps({**meta, **measured, "argv": sys.argv[1:],
                                                **result}, indent=2))
    print(f"\nLatency while the worst cases run ({nodes} nodes; one request at a time per "
          "probe; goal: p99 near idle)")
    print(table(result["rows"], stall.TABLE_COLUMNS))
    if result["hostile_5xx"]:
        print("hostile pods answered with a 5xx or a hang-up:\n  "
              + "\n  ".join(result["hostile_5xx"]))
    print(f"slowest hostile pods (s): {result['hostile_slowest_s']}")
    for got in result["big_outcomes"]:
        print(f"big gang: {got}")
    for got in result["dra_outcomes"]:
        print(f"dra: {got}")


def _whatif(args: argparse.Namespace, out: Path, meta: dict[str, Any]) -> None:
    nodes, pods = (1000, 10000) if args.quick else (5000, 50000)
    print(f"\nWhat-if: POST /debug/what-if at {nodes} synthetic nodes and {pods} pods, "
          "and the verbs while it runs", flush=True)
    measured = _commit()
    result = whatif.run(nodes, pods, rounds=5 if args.quick else 20,
                        log=lambda s: print(s, flush=True))
    (out / "whatif.json").write_text(json.dumps({**meta, **measured, "argv": sys.argv[1:],
                                                 **result}, indent=2))
    print(f"\nWhat-if round trip ({nodes} nodes, {pods} pods; goal: p95 <= "
          f"{whatif.GOAL_P95_MS:g} ms)")
    print(table(result["rows"], whatif.TABLE_COLUMNS))
    print("\nThe verbs idle and while the what-ifs run (one request at a time per probe)")
    print(table(result["probes"], stall.TABLE_COLUMNS[:-3] + stall.TABLE_COLUMNS[-1:]))
def _failover(args: argparse.Namespace, out: Path, meta: dict[str, Any]) -> None:
    from testbed.bins import ensure_bins

    ensure_bins()
    kills = args.kills or (3 if args.quick else 20)
    if not 1 <= kills <= 200:
        sys.exit("benchmarks: --kills must be between 1 and 200")
    print(f"\nFailover: two Lockstep + kube-scheduler pairs, the leader killed (SIGKILL) "
          f"{kills} times, deployed lease durations", flush=True)
    measured = _commit()
    result = failover.run(kills, log=lambda s: print(s, flush=True))
    (out / "failover.json").write_text(json.dumps({**meta, **measured, "argv": sys.argv[1:],
                                                   **result}, indent=2))
    print("\nFrom the leader killed to the next gang bound (goal: p95 <= lease duration + 2 s)")
    print(table(result["rows"], failover.TABLE_COLUMNS))


def _creates(args: argparse.Namespace, out: Path, meta: dict[str, Any]) -> None:
    from testbed.bins import ensure_bins

    ensure_bins()
    nodes = args.nodes or (200 if args.quick else 1000)
    gangs = args.gangs or (20 if args.quick else 100)
    print(f"\nCreate latency: {gangs} gangs x {args.size} pods through Lockstep's webhook and "
          f"without it, {nodes} nodes", flush=True)
    measured = _commit()
    result = creates.run(nodes, gangs, args.size, serial_gangs=5 if args.quick else 20)
    (out / "creates.json").write_text(json.dumps({**meta, **measured, "argv": sys.argv[1:],
                                                  **result}, indent=2))
    print("\nPod creates through the webhook and without it (client latency; the webhook's "
          "time per create from the API server's metrics)")
    print(table(result["rows"], creates.TABLE_COLUMNS))


def _memory(args: argparse.Namespace, out: Path, meta: dict[str, Any]) -> None:
    from testbed.bins import ensure_bins

    ensure_bins()
    nodes = args.mem_nodes or (1000 if args.quick else 5000)
    pods = args.mem_pods or (5000 if args.quick else 50000)
    print(f"\nMemory: {nodes} nodes x {throughput.NODE_GPUS} GPUs, {pods} pods, all created "
          "before Lockstep starts", flush=True)
    measured = _commit()  # at the start: the product code Lockstep runs is read now
    result = memory.run(nodes, pods, settle=args.mem_settle,
                        log=lambda s: print(s, flush=True))
    (out / "memory.json").write_text(json.dumps({**meta, **measured, "argv": sys.argv[1:],
                                                 **result}, indent=2))
    print(f"\nLockstep memory ({nodes} nodes, {pods} pods cached; goal: RSS <= "
          f"{memory.GOAL_MB:g} MB at 5,000 nodes and 50,000 pods)")
    print(memory.format_result(result))


if __name__ == "__main__":
    main()
