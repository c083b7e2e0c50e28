"""DRA planning work per filter call, in process.

``python -m benchmarks.dra_planning [--case many|never] [--nodes N] [--claims C] [--requests R]``

Two cases, each one filter call of a 1-member gang on N nodes x 8 identical GPUs, first with
the selector caches cold, then warm:

* ``many``: C claims x R requests (16 x 32 by default, within the API's limits), which no
  node holds (512 devices asked, 8 per node);
* ``never``: one request whose selector matches no device.

Prints milliseconds per call. Run one case per process for the cold figure: cel-python's
first evaluations in a process are slower than later ones of another program.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from coscheduling import Coscheduler, NodeName, Settings, node_from_json, pod_from_json, pod_key
from coscheduling.devices import selectors
from coscheduling.devices.wire import class_from_json, slice_from_json, template_from_json
from coscheduling.events import ingest

DRIVER = "gpu.nvidia.com"


def _slice(node: str) -> dict[str, Any]:
    return {"metadata": {"name": f"{node}-gpus"},
            "spec": {"driver": DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": f"gpu-{i}",
                                  "attributes": {"productName": {"string": "H100"}},
                                  "capacity": {"memory": {"value": "80Gi"}}}
                                 for i in range(8)]}}


def _template(name: str, requests: int, selector: str | None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": DRIVER, "count": 1}
    if selector is not None:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {"metadata": {"name": name, "namespace": "default"},
            "spec": {"spec": {"devices": {"requests": [
                {"name": f"r{r}", "exactly": exactly} for r in range(requests)]}}}}


def run(case: str, nodes: int, claims: int, requests: int) -> None:
    core = Coscheduler(Settings(backoff_seconds=0))
    for i in range(nodes):
        core.upsert(ingest.NODES, node_from_json({
            "metadata": {"name": f"n{i}", "labels": {"kubernetes.io/hostname": f"n{i}"}},
            "spec": {},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"}}}))
        core.upsert(ingest.RESOURCE_SLICES, slice_from_json(_slice(f"n{i}")))
    core.upsert(ingest.DEVICE_CLASSES, class_from_json({
        "metadata": {"name": DRIVER},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}}))
    if case == "never":
        claims, requests = 1, 1
        selector: str | None = f'device.attributes["{DRIVER}"].productName == "B200"'
    else:
        selector = None
    for c in range(claims):
        core.upsert(ingest.RESOURCE_CLAIM_TEMPLATES,
                    template_from_json(_template(f"t{c}", requests, selector)))
    core.upsert_pod(pod_from_json({
        "metadata": {"name": "m", "namespace": "default", "uid": "m-uid",
                     "annotations": {"lockstep.dev/pod-group": "g",
                                     "lockstep.dev/min-member": "1"}},
        "status": {"phase": "Pending"},
        "spec": {"schedulerName": "lockstep",
                 "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
                 "resourceClaims": [{"name": f"c{c}", "resourceClaimTemplateName": f"t{c}"}
                                    for c in range(claims)]}}))
    selectors.warm()  # the CEL parser, built at start by the app
    pod = core.queries.pods[pod_key("default", "m")]
    names = [NodeName(f"n{i}") for i in range(nodes)]
    for cache in ("cold", "warm"):
        t = time.perf_counter()
        d = core.filter(pod, names, 0.0)
        ms = (time.perf_counter() - t) * 1000
        print(f"{case:5} {nodes} nodes x 8 GPUs, {claims} claims x {requests} requests, "
              f"{cache}: {ms:7.1f} ms, passed {len(d.passed)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--nodes", type=int, default=0, help="default: 200 (many), 300 (never)")
    ap.add_argument("--claims", type=int, default=16)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--case", choices=("many", "never"), action="append")
    a = ap.parse_args()
    for case in a.case or ("many", "never"):
        run(case, a.nodes or (200 if case == "many" else 300), a.claims, a.requests)


if __name__ == "__main__":
    main()
