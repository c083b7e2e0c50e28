"""A fake DRA GPU driver: the ResourceSlices and DeviceClass NVIDIA's k8s-dra-driver-gpu
publishes, on KWOK nodes that have no kubelet and so no kubelet plugin.

Shapes follow the driver's ``cmd/gpu-kubelet-plugin/deviceinfo.go`` (``GpuInfo.GetDevice``):
one device ``gpu-<minor>`` per GPU with the attributes ``type`` ("gpu"), ``uuid``,
``productName`` (NVML's name, "NVIDIA H100 80GB HBM3"), ``brand``, ``architecture``
("Hopper"), ``cudaComputeCapability``, ``driverVersion``, ``cudaDriverVersion`` and
``pcieBusID``, the standard ``resource.kubernetes.io/pcieRoot`` (k8s.io/dynamic-resource-
allocation's ``deviceattribute``: the ``pciDDDD:BB`` directory under /sys/devices), and the
capacity ``memory`` in bytes. Attributes without a domain are the driver's
(``device.attributes['gpu.nvidia.com'].productName`` in CEL). One slice per node, its pool
named after the node, owned by the Node so the garbage collector removes it with the node, as
the kubelet plugin's slices are. The DeviceClass ``gpu.nvidia.com`` is the driver chart's:
``device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'``.
NVLink cliques (GB200 NVL72) are the node label ``nvidia.com/gpu.clique``, not a device
attribute.

A node declares its fake GPUs in annotations (``DRA_GPUS``, ``PCIE_ROOTS``), written by a
topology group with ``dra: true`` (``testbed.cluster``); its model comes from the GPU Feature
Discovery labels it carries like every GPU node. Such a node has no ``nvidia.com/gpu``
capacity: only its slice offers GPUs.
"""

from __future__ import annotations

import concurrent.futures
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .kube import Kube, KubeError

__all__ = ["API", "DEVICE_CLASS", "DRA_GPUS", "DRIVER", "PCIE_ROOTS", "claim",
           "claim_template", "device_class", "is_dra_node", "partitionable_slice", "publish",
           "slice_for_node"]

DRIVER = "gpu.nvidia.com"
DEVICE_CLASS = "gpu.nvidia.com"
API = "/apis/resource.k8s.io/v1"
DRA_GPUS = "testbed.lockstep.dev/dra-gpus"
"""Node annotation: this many GPUs are published by the fake driver as a ResourceSlice."""
PCIE_ROOTS = "testbed.lockstep.dev/pcie-roots"
"""Node annotation: how many PCIe root complexes the GPUs are spread over (in order)."""

_ARCH = {"hopper": ("Hopper", "9.0.0"), "ampere": ("Ampere", "8.0.0"),
         "blackwell": ("Blackwell", "10.0.0"), "ada-lovelace": ("Ada Lovelace", "8.9.0")}
"""GPU Feature Discovery's family label -> (NVML's architecture name, compute capability)."""
_DRIVER_VERSION = "570.124.6"
_CUDA_VERSION = "12.8.0"


def is_dra_node(node: Mapping[str, Any]) -> bool:
    return DRA_GPUS in ((node.get("metadata") or {}).get("annotations") or {})


def _string(v: str) -> dict[str, str]:
    return {"string": v}


def _device(node: str, i: int, gpus: int, roots: int, labels: Mapping[str, str]
            ) -> dict[str, Any]:
    """GPU ``i`` of ``gpus`` on ``node``; GPUs fill the PCIe roots in order, as GPU minors
    follow bus order on a real board."""
    family = labels.get("nvidia.com/gpu.family", "hopper")
    arch, cc = _ARCH.get(family, ("Unknown", "0.0.0"))
    root = i * roots // max(gpus, 1)
    bus = 0x18 + 0x20 * i
    return {
        "name": f"gpu-{i}",
        "attributes": {
            "type": _string("gpu"),
            "uuid": _string("GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}/gpu-{i}"))),
            "productName": _string(labels.get("nvidia.com/gpu.product",
                                              "NVIDIA-H100-80GB-HBM3").replace("-", " ")),
            "brand": _string("Nvidia"),
            "architecture": _string(arch),
            "cudaComputeCapability": {"version": cc},
            "driverVersion": {"version": _DRIVER_VERSION},
            "cudaDriverVersion": {"version": _CUDA_VERSION},
            "pcieBusID": _string(f"0000:{bus:02x}:00.0"),
            "resource.kubernetes.io/pcieRoot": _string(f"pci0000:{0x10 + 0x40 * root:02x}"),
        },
        "capacity": {"memory": {"value": f"{labels.get('nvidia.com/gpu.memory', '81559')}Mi"}},
    }


def slice_for_node(node: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ResourceSlice the driver's kubelet plugin would publish for ``node`` (None: not a
    DRA node). An owner reference to the Node is added when the node has a ``uid`` (as
    returned by the API server)."""
    meta = node.get("metadata") or {}
    ann = meta.get("annotations") or {}
    if DRA_GPUS not in ann:
        return None
    name = str(meta["name"])
    gpus = int(ann[DRA_GPUS])
    roots = max(1, min(int(ann.get(PCIE_ROOTS, "1")), max(gpus, 1)))
    labels = meta.get("labels") or {}
    out: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"{name}-{DRIVER}"},
        "spec": {
            "driver": DRIVER, "nodeName": name,
            "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
            "devices": [_device(name, i, gpus, roots, labels) for i in range(gpus)],
        },
    }
    if meta.get("uid"):
        out["metadata"]["ownerReferences"] = [{
            "apiVersion": "v1", "kind": "Node", "name": name, "uid": meta["uid"]}]
    return out


def partitionable_slice(node: Mapping[str, Any]) -> dict[str, Any]:
    """kubernetes/kubernetes#138765's device on ``node``: one GPU that is either whole
    (``gpu-0``, type ``gpu``) or two halves (``gpu-0-mig-0``, ``gpu-0-mig-1``, type ``mig``,
    profile ``half``), not both: the whole device consumes both of the counter set's
    ``memory-slices``, each half one (DRAPartitionableDevices, alpha in 1.34: the bed needs
    ``feature_gates=("DRAPartitionableDevices=true",)``). MIG devices carry ``parentUUID``
    and ``profile`` as NVIDIA's do."""
    meta = node.get("metadata") or {}
    name = str(meta["name"])
    parent = "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{name}/gpu-0"))
    counters = "gpu-0-counter-set"

    def consumes(n: int) -> list[dict[str, Any]]:
        return [{"counterSet": counters, "counters": {"memory-slices": {"value": str(n)}}}]

    whole = {"name": "gpu-0", "attributes": {"type": _string("gpu"), "uuid": _string(parent)},
             "consumesCounters": consumes(2)}
    halves = [{"name": f"gpu-0-mig-{i}", "attributes": {
        "type": _string("mig"), "profile": _string("half"), "parentUUID": _string(parent),
        "uuid": _string("MIG-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{name}/mig-{i}")))},
        "consumesCounters": consumes(1)} for i in range(2)]
    out: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"{name}-{DRIVER}"},
        "spec": {"driver": DRIVER, "nodeName": name,
                 "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                 "sharedCounters": [{"name": counters,
                                     "counters": {"memory-slices": {"value": "2"}}}],
                 "devices": [whole, *halves]},
    }
    if meta.get("uid"):
        out["metadata"]["ownerReferences"] = [{
            "apiVersion": "v1", "kind": "Node", "name": name, "uid": meta["uid"]}]
    return out


def device_class(name: str = DEVICE_CLASS, product: str | None = None,
                 device_type: str = "gpu") -> dict[str, Any]:
    """The driver chart's GPU DeviceClass (``device_type="mig"``: its ``mig.nvidia.com``);
    ``product`` narrows it to one model (its NVML productName, e.g. "NVIDIA A100 SXM4 40GB"),
    as a cluster admin would for two models."""
    expr = (f"device.driver == '{DRIVER}' && "
            f"device.attributes['{DRIVER}'].type == '{device_type}'")
    if product is not None:
        expr += f" && device.attributes['{DRIVER}'].productName == '{product}'"
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression": expr}}]}}


def _devices_spec(count: int, device_class_name: str, selectors: Sequence[str],
                  all_devices: bool) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class_name}
    if all_devices:
        exactly["allocationMode"] = "All"
    else:
        exactly.update({"allocationMode": "ExactCount", "count": count})
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


def claim_template(name: str, *, namespace: str = "default", count: int = 1,
                   device_class_name: str = DEVICE_CLASS, selectors: Sequence[str] = (),
                   all_devices: bool = False) -> dict[str, Any]:
    """A ResourceClaimTemplate whose claims ask for ``count`` devices of the class (one
    request named ``gpu``); each pod naming it gets a claim of its own."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"spec": _devices_spec(count, device_class_name, selectors, all_devices)}}


def claim(name: str, *, namespace: str = "default", count: int = 1,
          device_class_name: str = DEVICE_CLASS, selectors: Sequence[str] = (),
          all_devices: bool = False) -> dict[str, Any]:
    """A ResourceClaim (shared by every pod naming it)."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": _devices_spec(count, device_class_name, selectors, all_devices)}


def _create_or_keep(kube: Kube, path: str, obj: Mapping[str, Any]) -> None:
    try:
        kube.create(path, obj)
    except KubeError as e:
        if e.status != 409:
            raise


def publish(kube: Kube, nodes: Iterable[Mapping[str, Any]], workers: int = 16) -> int:
    """Create the DeviceClass (kept if present) and the slice of every DRA node among
    ``nodes`` (as the API server returned them: the slice is owned by its node); returns how
    many slices were created."""
    slices = [s for s in map(slice_for_node, nodes) if s is not None]
    if slices:
        _create_or_keep(kube, f"{API}/deviceclasses", device_class())
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda s: kube.create(f"{API}/resourceslices", s), slices))
    return len(slices)
