"""A Lockstep HTTP server whose cache is pre-filled with a synthetic cluster (no API server).

Runs in its own process so the benchmark client and server do not share an event loop, as
kube-scheduler and Lockstep do not.
"""

from __future__ import annotations

import argparse
import asyncio

import uvicorn

from app.kube.client import KubeClient, KubeConfig
from app.process import extender_app
from app.service import Lockstep
from coscheduling import pod_from_json

from .synthetic import loaded_core, waiting_gang


def build(nodes: int) -> Lockstep:
    core = loaded_core(nodes)
    for p in waiting_gang("admitted", 8):
        core.upsert_pod(pod_from_json(p))
    return Lockstep(core, KubeClient(KubeConfig("http://127.0.0.1:9")))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    service = build(args.nodes)
    # Admit one gang so reservations exist, as in a busy cluster.
    names = sorted(service.core.queries.nodes)
    for i in range(8):
        service.core.filter(service.core.queries.pods[f"bench/admitted-{i}"], names, 0.0)  # type: ignore[index]
    app = extender_app(service)
    config = uvicorn.Config(app, host="127.0.0.1", port=args.port, log_level="warning",
                            access_log=False)
    asyncio.run(uvicorn.Server(config).serve())


if __name__ == "__main__":
    main()
