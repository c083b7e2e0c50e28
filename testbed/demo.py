"""``make demo``: the deadlock the stock kube-scheduler walks into, and Lockstep avoiding it.

A real control plane with 3 simulated nodes x 2 GPUs (6 GPUs). Two training jobs of 4 x 1-GPU
workers are submitted with their pods interleaved, first to the stock kube-scheduler alone,
then to the stock kube-scheduler calling Lockstep, installed as deployed: its admission webhook
on, with the certificate it issues itself. The webhook holds a job's members behind its
scheduling gate until the job's quorum exists, pins the job that fits to its planned nodes
and keeps the other behind the gate, so its pods never take a GPU. Then the same jobs with
their GPUs as DRA ResourceClaims, on 3 more nodes whose 2 GPUs each are ResourceSlices of
NVIDIA's DRA driver (``testbed.dra``): one job runs holding its 4 devices, the other holds
none. A live timeline shows every binding.
"""

from __future__ import annotations

import sys
import time

import httpx

from coscheduling.gang.gating import GANG_GATE

from .bins import REPO, ensure_bins
from .cluster import create_nodes, load_topology, nodes_from_topology
from .dra import API, claim_template
from .kube import Kube
from .runner import TestBed
from .workloads import gang

BOLD, DIM, GREEN, RED, YELLOW, RESET = (
    ("\033[1m", "\033[2m", "\033[32m", "\033[31m", "\033[33m", "\033[0m")
    if sys.stdout.isatty() else ("",) * 6
)


class Timeline:
    """Prints each pod's transitions as they happen, with seconds since the act started."""

    def __init__(self, kube: Kube, ns: str) -> None:
        self.kube, self.ns = kube, ns
        self.t0 = time.monotonic()
        self.seen: dict[str, str] = {}

    def say(self, text: str) -> None:
        print(f"{DIM}[{time.monotonic() - self.t0:5.1f}s]{RESET} {text}", flush=True)

    def poll(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for p in self.kube.pods(self.ns):
                name = p["metadata"]["name"]
                node = p["spec"].get("nodeName")
                phase = p.get("status", {}).get("phase", "Pending")
                state = f"{phase} on {node}" if node else "Pending"
                if self.seen.get(name) != state:
                    self.seen[name] = state
                    color = GREEN if phase == "Running" else (YELLOW if node else DIM)
                    self.say(f"  {name:<8} {color}{state}{RESET}")
            time.sleep(0.25)

    def summary(self) -> dict[str, int]:
        jobs: dict[str, int] = {}
        for p in self.kube.pods(self.ns):
            job = p["metadata"]["name"].rsplit("-", 1)[0]
            jobs.setdefault(job, 0)
            if p["spec"].get("nodeName"):
                jobs[job] += 1
        return jobs


def submit(kube: Kube, ns: str, scheduler: str, claim_template: str | None = None) -> None:
    a = gang("job-a", 4, namespace=ns, scheduler=scheduler, claim_template=claim_template)
    b = gang("job-b", 4, namespace=ns, scheduler=scheduler, claim_template=claim_template)
    for x, y in zip(a, b, strict=True):  # interleaved, as two controllers would create them
        kube.create_pod(x)
        kube.create_pod(y)


REASONS = ("GangWaiting", "FailedScheduling")
"""The Events that say why a pod waits: Lockstep's on a gang member (a member held behind the
webhook's gate never reaches kube-scheduler), kube-scheduler's on a pod it tried."""


def reason(kube: Kube, ns: str, pod: str) -> str:
    events = sorted(kube.events(ns, pod),
                    key=lambda e: int(e["metadata"].get("resourceVersion", "0")))
    for e in reversed(events):  # the newest first
        if e.get("reason") in REASONS:
            return f"{e['reason']}: {e.get('message', '')}"
    return "(no event yet)"


def held(kube: Kube, ns: str, pod: str) -> bool:
    """The pod waits behind Lockstep's scheduling gate (out of kube-scheduler's queue)."""
    gates = kube.pod(ns, pod)["spec"].get("schedulingGates") or ()
    return any(g.get("name") == GANG_GATE for g in gates)


def act_one(kube: Kube) -> None:
    ns = "without-lockstep"
    kube.ensure_namespace(ns)
    print(f"\n{BOLD}Act 1: the stock kube-scheduler alone{RESET}")
    print("Two jobs, each needs 4 GPUs to start (DDP waits for all ranks). Pods interleaved.")
    tl = Timeline(kube, ns)
    submit(kube, ns, "default-scheduler")
    tl.poll(8)
    jobs = tl.summary()
    print(f"\n  job-a has {jobs['job-a']}/4 workers placed, job-b has {jobs['job-b']}/4.")
    if jobs["job-a"] < 4 and jobs["job-b"] < 4:
        print(f"  {RED}{BOLD}Deadlock:{RESET} all 6 GPUs are held, neither job can start, and "
              "nothing will ever change it.")
    else:
        print(f"  {YELLOW}This time the order let one job through; the deadlock needs only "
              f"unlucky timing.{RESET}")
    for p in kube.pods(ns):
        kube.delete_pod(ns, p["metadata"]["name"])
    kube.wait("act 1 pods gone", lambda: not kube.pods(ns), 30)


def act_two(kube: Kube, lockstep: str) -> None:
    ns = "with-lockstep"
    kube.ensure_namespace(ns)
    print(f"\n{BOLD}Act 2: the same jobs, kube-scheduler calling Lockstep{RESET}")
    print("Same pods, with `schedulerName: lockstep` and the annotations "
          "lockstep.dev/pod-group + lockstep.dev/min-member: 4.")
    tl = Timeline(kube, ns)
    submit(kube, ns, "lockstep")
    tl.poll(6)
    jobs = tl.summary()
    print(f"\n  job-a: {GREEN}{jobs['job-a']}/4 placed{RESET}, job-b: {jobs['job-b']}/4 placed.")
    waiting = "job-b" if jobs["job-a"] == 4 else "job-a"
    running = "job-a" if waiting == "job-b" else "job-b"
    explain = httpx.get(f"{lockstep}/debug/pods/{ns}/{waiting}-0", timeout=10).json()
    print(f"  Why is {waiting}-0 pending? {YELLOW}{explain['explanation']}{RESET}")
    if held(kube, ns, f"{waiting}-0"):
        print(f"  {waiting}'s pods wait behind the gate {GANG_GATE}: no GPU is held for them.")
    print(f"  kubectl describe shows: {DIM}{reason(kube, ns, waiting + '-0')}{RESET}")
    print(f"\n{BOLD}{running} finishes{RESET} (its pods are deleted); "
          f"{waiting} should start at once.")
    tl.say(f"deleting {running}")
    for i in range(4):
        kube.delete_pod(ns, f"{running}-{i}")
    tl.poll(6)
    jobs = tl.summary()
    ok = jobs[waiting] == 4
    verdict = f"{GREEN}all 4 placed together{RESET}" if ok else f"{RED}{jobs[waiting]}/4{RESET}"
    print(f"\n  {waiting}: {verdict}. No GPU was ever held by a job that could not start.")
    gangs = httpx.get(f"{lockstep}/debug/gangs", timeout=10).json()["gangs"]
    for g in gangs:
        print(f"  {DIM}gang {g['gang']}: {g['phase']}, {g['bound']}/{g['minMember']} bound{RESET}")
    if not ok:
        raise SystemExit(1)


def devices(kube: Kube, ns: str) -> dict[str, list[str]]:
    """Pod -> the devices its allocated ResourceClaims hold (``node/device``)."""
    out: dict[str, list[str]] = {}
    for claim in kube.list(f"{API}/namespaces/{ns}/resourceclaims"):
        alloc = (claim.get("status") or {}).get("allocation") or {}
        owners = [o["name"] for o in claim["metadata"].get("ownerReferences") or ()
                  if o.get("kind") == "Pod"]
        for r in (alloc.get("devices") or {}).get("results") or ():
            for pod in owners:
                out.setdefault(pod, []).append(f"{r['pool']}/{r['device']}")
    return out


def act_three(kube: Kube) -> None:
    ns = "with-dra"
    kube.ensure_namespace(ns)
    print(f"\n{BOLD}Act 3: the same jobs, GPUs as DRA ResourceClaims{RESET}")
    print("3 more nodes x 2 GPUs, published as ResourceSlices of NVIDIA's DRA driver "
          "(gpu.nvidia.com), no nvidia.com/gpu capacity.\nEach worker gets a claim of its own "
          "for 1 GPU from a ResourceClaimTemplate; kube-scheduler allocates the devices.")
    kube.create(f"{API}/namespaces/{ns}/resourceclaimtemplates",
                claim_template("one-gpu", namespace=ns))
    tl = Timeline(kube, ns)
    submit(kube, ns, "lockstep", claim_template="one-gpu")
    tl.poll(8)
    jobs, held = tl.summary(), devices(kube, ns)
    running = "job-a" if jobs["job-a"] == 4 else "job-b"
    waiting = "job-b" if running == "job-a" else "job-a"
    print(f"\n  {running}: {GREEN}{jobs[running]}/4 placed{RESET}, holding "
          + ", ".join(sorted(d for p, ds in held.items() if p.startswith(running) for d in ds)))
    print(f"  {waiting}: {jobs[waiting]}/4 placed, devices held: "
          f"{sum(len(ds) for p, ds in held.items() if p.startswith(waiting))} "
          "(without Lockstep's device plan both jobs parked members on devices and timed out)")
    tl.say(f"deleting {running}")
    for i in range(4):
        kube.delete_pod(ns, f"{running}-{i}")
    tl.poll(8)
    jobs, held = tl.summary(), devices(kube, ns)
    ok = jobs[waiting] == 4
    verdict = f"{GREEN}all 4 placed together{RESET}" if ok else f"{RED}{jobs[waiting]}/4{RESET}"
    print(f"\n  {waiting}: {verdict}, holding "
          + ", ".join(sorted(d for p, ds in held.items() if p.startswith(waiting) for d in ds)))
    if not ok:
        raise SystemExit(1)


def main() -> int:
    ensure_bins()
    print(f"{BOLD}Lockstep demo{RESET}: starting a real control plane (etcd, kube-apiserver, "
          "kube-scheduler, KWOK) with 3 nodes x 2 GPUs (device plugin) and 3 x 2 DRA GPUs ...")
    with TestBed() as bed:
        kube = Kube(bed.api_url, bed.token)
        create_nodes(kube, nodes_from_topology(load_topology("tiny-3x2")))
        create_nodes(kube, nodes_from_topology(load_topology("dra-tiny-3x2")))  # + slices
        bed.start_controller_manager()  # each pod's claim from its ResourceClaimTemplate
        bed.start_scheduler(None, name="kube-scheduler")
        url = bed.start_lockstep()  # the default install: webhook on, its own certificate
        bed.start_scheduler(REPO / "scheduler-config" / "lockstep.yaml",
                            name="lockstep-scheduler", extender_url=url)
        print(f"ready in {bed.startup_seconds['control-plane']:.1f}s (logs: {bed.dir})")
        act_one(kube)
        act_two(kube, url)
        act_three(kube)
        print(f"\n{BOLD}Done.{RESET} Everything stopped and cleaned up.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
