"""Hostile DRA objects through the real API server, on the default install: no DeviceClass,
ResourceClaim, ResourceClaimTemplate or ResourceSlice stops, freezes or crashes Lockstep.

The same suite as ``test_hostile`` (Lockstep as deployed, its webhook on; what the API server
refuses is counted, not failed; every failed check collected and reported once), on DRA GPUs
(``dra-tiny-3x2``: 3 nodes x 2 GPUs of the fake NVIDIA driver, kube-controller-manager's
resourceclaim controller making each pod's claims). Every hostile claim is used by the two
members of a gang, both created, so Lockstep must plan it: at the webhook, when it lifts
gates, at kube-scheduler's filter. The batches, in this order:

* **classes** and **requests**: CEL selectors (:data:`SELECTORS`) in DeviceClasses and in the
  requests of templates, a shared claim, a prioritized list of 8 and a request of 32
  selectors: three nested ``all`` macros over literal lists of 15 and 40 items, five nested
  macros hidden from a text scan by comments (``.all//c\\n(``), a 10 KiB literal list, a
  10 KiB ``1+1+...`` chain, nesting 240 deep, selectors that match nothing or fail at run
  time;
* **slices**: ResourceSlices of a driver of their own with odd attributes (int64 extremes,
  64-character strings, 32 attributes, unparseable versions), odd capacities (int64, exa,
  nano, negative) and huge counts (a pool generation of 2^63-1, a pool of 2^31-1 slices,
  1,024 network-attached devices reaching every node, a node selector of 100 terms), and
  gangs claiming them (an int64 attribute, a capacity, ``allocationMode: All`` over every
  device);
* **claims**: pods of 16 claims x 32 requests (1,024 devices a gang) over the network
  devices, and a request of 32 devices 32 times.

After each batch the checks of ``test_hostile`` (``/healthz`` within 1 s, a normal gang of 2
DRA GPUs bound within 20 s, the webhook answered, Lockstep alive) and: each gang whose
selector costs more than Lockstep evaluates (:data:`SELECTORS`' second field) is reported
invalid naming ``cel.expression``. Then the batch's pods are deleted (its other objects
stay): kube-scheduler evaluates the selectors of every pod it schedules itself, in Go, per
device reaching each node, and a pod the webhook failed open on (not gated) costs it minutes
per cycle over the 1,024 network devices (153 s for one pod of ``nested-15x40x40``
measured), which no fix in Lockstep can help; hence also the CEL batches before the network
devices.
"""

from __future__ import annotations

from typing import Any

import pytest

from testbed.dra import API, claim, claim_template, device_class

from .conftest import Cluster, ClusterFactory
from .test_hostile import Hostile, create_pod, create_raw, default_install, run_batches, small

NORMAL = "one-gpu"
"""The normal gang's template: one GPU of the driver's class."""
NOBODY = "device.driver == 'nobody.example.com'"
"""Appended (``&& ...``) to costly selectors, so what they match holds no GPU the normal gang
needs, whatever the cost of the left side."""
DRIVER = "hostile.example.com"
MAX_CHARS = 10 * 1024
"""The API's ``CELSelectorExpressionMaxLength``."""


def literal(n: int) -> str:
    return "[" + ", ".join(str(i) for i in range(n)) + "]"


def nested(sizes: list[int], *, hide: bool = False) -> str:
    """``[0..a].all(v0, [0..b].all(v1, ... v0 + v1 + ... >= 0))``: each level multiplies
    the iterations (a x b x ...). ``hide`` writes each macro as ``.all//c\\n(``: a comment
    between the name and its parenthesis, which CEL's grammar skips and a scan of the text
    for ``.all(`` does not."""
    call = ".all//c\n(" if hide else ".all("
    names = [f"v{i}" for i in range(len(sizes))]
    body = " + ".join(names) + " >= 0"
    for v, n in reversed(list(zip(names, sizes, strict=True))):
        body = f"{literal(n)}{call}{v}, {body})"
    return f"{body} && {NOBODY}"


def _long_list() -> str:
    tail = f"].size() > 0 && {NOBODY}"
    n = (MAX_CHARS - len(tail)) // 2
    return "[" + ",".join(["7"] * n) + tail


def _chain() -> str:
    """``1+1+...`` over 10 KiB, as 49 parenthesised runs of 100: one run of 5,000 is past
    the API server's parser depth (250), this shape is not."""
    run = "(" + "+".join(["1"] * 100) + ")"
    return "+".join([run] * 49) + f" > 0 && {NOBODY}"


L40 = literal(40)
SELECTORS: dict[str, tuple[str, bool]] = {
    "nested-15x40x40": (nested([15, 40, 40]), True),
    "nested-40x40x40": (nested([40, 40, 40]), True),
    "hidden-5x8": (nested([8] * 5, hide=True), True),
    "hidden-5x15": (nested([15] * 5, hide=True), True),
    "map-40x40x40": (f"{L40}.map(a, {L40}.map(b, {L40}.map(c, a + b + c))).size() > 0 && "
                     f"{NOBODY}", True),
    "map-15x40x40": (f"{literal(15)}.map(a, {L40}.map(b, {L40}.map(c, a + b + c))).size() > 0"
                     f" && {NOBODY}", True),
    "list-10k": (_long_list(), True),
    "chain-10k": (_chain(), True),
    "parens-40": ("(" * 40 + NOBODY + ")" * 40, False),
    "parens-240": ("(" * 240 + NOBODY + ")" * 240, True),
    "not-240": ("!" * 240 + f"({NOBODY})", True),
    "lists-120": ("[" * 120 + "1" + "]" * 120 + f".size() == 1 && {NOBODY}", True),
    "ternary-240": ("false ? true : " * 240 + NOBODY, True),
    "nothing": (NOBODY, False),
    "false": ("false", False),
    "missing-attribute": ("device.attributes['gpu.nvidia.com'].noSuchAttribute == 'x'", False),
    "division-by-zero": ("1 / (size(device.driver) - size(device.driver)) == 1", False),
    "overflow": ("9223372036854775807 + size(device.driver) > 0", False),
    "missing-capacity": ("device.capacity['nobody.example.com'].memory"
                         ".isGreaterThan(quantity('1'))", False),
    "regex": ("device.attributes['gpu.nvidia.com'].productName.matches('^(a+)+$')", False),
}
"""Case -> (selector, whether it is over what Lockstep evaluates: its gang must be reported
invalid naming ``cel.expression``). cel-python on this machine, before Lockstep's cost
limits: ``nested-15x40x40`` 4.9 s per device (24,000 iterations), 40 x 40 0.3 s, the 10 KiB
list 0.4 s to compile and 0.16 s per device; nesting 240 deep compiles and then fails on
Python's recursion limit, selecting nothing without a word. kube-apiserver v1.34.10 refuses
``hidden-5x15`` and ``map-40x40x40`` ("too complex, exceeds cost limit": its estimate against
``CELSelectorExpressionMaxCost``) and accepts the rest (a ``1+1`` chain of 5,000 in one run
is past its parser's depth; :func:`_chain`'s shape is not); a refusal is counted."""
OVER = "cel.expression"


def gang_of(c: Cluster, h: Hostile, name: str, must_name: str | None, *,
            template: str | None = None, shared: str | None = None, claims: int = 1) -> None:
    """Both members of gang ``name``, each with ``claims`` claims from ``template`` (or the
    ``shared`` claim): the gang has its quorum, so Lockstep plans it."""
    for i in range(2):
        b = small(f"{name}-{i}").gang(name, 2)
        for k in range(claims):
            b.claim(template=template, claim=shared, name=f"c{k}")
        create_pod(c, h, b.build(), must_name if i == 0 else None)


def create_dra(c: Cluster, h: Hostile, kind: str, body: dict[str, Any]) -> bool:
    """Create a ``resource.k8s.io/v1`` object of ``kind`` (plural); True when created."""
    namespaced = kind in ("resourceclaims", "resourceclaimtemplates")
    if namespaced:
        body["metadata"]["namespace"] = c.ns
    path = f"{API}/namespaces/{c.ns}/{kind}" if namespaced else f"{API}/{kind}"
    return create_raw(c, h, path, body)


# -------------------------------------------------------------------------- the batches


def _slice(name: str, devices: list[dict[str, Any]], *, node: str | None = None,
           pool: str | None = None, generation: int = 1, count: int = 1,
           **spec: Any) -> dict[str, Any]:
    where: dict[str, Any] = {"nodeName": node} if node else {}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {"driver": DRIVER, **where, **spec,
                     "pool": {"name": pool or name, "generation": generation,
                              "resourceSliceCount": count},
                     "devices": devices}}


def _device(name: str, attributes: dict[str, Any] | None = None,
            capacity: dict[str, str] | None = None) -> dict[str, Any]:
    return {"name": name, "attributes": {"kind": {"string": "odd"}, **(attributes or {})},
            "capacity": {k: {"value": v} for k, v in (capacity or {}).items()}}


ODD_DEVICES: dict[str, dict[str, Any]] = {
    "int-extremes": _device("d", {"max": {"int": 9223372036854775807},
                                  "min": {"int": -9223372036854775808}, "zero": {"int": 0}}),
    "strings": _device("d", {"long": {"string": "a" * 63 + "!"}, "empty": {"string": ""},
                             "unicode": {"string": "三🙂"}}),
    "too-long-string": _device("d", {"long": {"string": "a" * 65}}),
    "versions": _device("d", {"v": {"version": "1.2.3-alpha.1+build.5"}}),
    "bad-version": _device("d", {"v": {"version": "not-a-version"}}),
    "long-domain": _device("d", {("a" * 63) + ".example.com/x": {"bool": True}}),
    "attributes-32": _device("d", {f"a{i}": {"int": i} for i in range(31)}),
    "attributes-33": _device("d", {f"a{i}": {"int": i} for i in range(33)}),
    "capacity-int64": _device("d", capacity={"huge": "9223372036854775807"}),
    "capacity-exa": _device("d", capacity={"huge": "8Ei", "tiny": "1n"}),
    "capacity-overflow": _device("d", capacity={"huge": "9" * 60 + "Ei"}),
    "capacity-negative": _device("d", capacity={"huge": "-1"}),
    "capacity-word": _device("d", capacity={"huge": "lots"}),
    "name-63": _device("d" * 63),
    "name-unicode": _device("gpü"),
}
"""One slice each on the first node (a refusal is one case's): attributes and capacities at
and past the API's limits (64-character strings, 32 attributes and capacities, device names
of 63)."""


def slices_batch(c: Cluster, h: Hostile) -> None:
    node = sorted(n["metadata"]["name"] for n in c.kube.nodes())[0]
    for case, dev in ODD_DEVICES.items():
        create_dra(c, h, "resourceslices", _slice(f"odd-{case}", [dev], node=node))
    create_dra(c, h, "resourceslices", _slice(
        "odd-generation", [_device("d")], node=node, generation=9223372036854775807))
    create_dra(c, h, "resourceslices", _slice(
        "odd-slice-count", [_device("d")], node=node, count=2147483647))
    create_dra(c, h, "resourceslices", _slice(
        "odd-devices-129", [_device(f"d{i}") for i in range(129)], node=node))
    terms = [{"matchExpressions": [{"key": f"k{j}", "operator": "In",
                                    "values": [f"v{v}" for v in range(10)]}
                                   for j in range(10)]} for _ in range(100)]
    create_dra(c, h, "resourceslices", _slice(
        "odd-selector", [_device("d")], nodeSelector={"nodeSelectorTerms": terms}))
    for s in range(8):  # 1,024 devices reaching every node
        create_dra(c, h, "resourceslices", _slice(
            f"net-{s}", [_device(f"n{s}-{i}", {"index": {"int": s * 128 + i}})
                         for i in range(128)], pool="net", count=8, allNodes=True))
    create_dra(c, h, "deviceclasses", {**device_class("hostile-any"), "spec": {
        "selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]}})
    for case, expr in {
            "int": f"device.attributes['{DRIVER}'].max == 9223372036854775807",
            "capacity": f"device.capacity['{DRIVER}'].huge.compareTo(quantity('1')) > 0",
            "unicode": f"device.attributes['{DRIVER}'].unicode == '三🙂'"}.items():
        if create_dra(c, h, "resourceclaimtemplates", claim_template(
                f"odd-{case}", device_class_name="hostile-any", selectors=(expr,))):
            gang_of(c, h, f"odd-{case}", None, template=f"odd-{case}")
    if create_dra(c, h, "resourceclaimtemplates", claim_template(
            "odd-all", device_class_name="hostile-any", all_devices=True)):
        gang_of(c, h, "odd-all", None, template="odd-all")


def classes_batch(c: Cluster, h: Hostile) -> None:
    for case, (expr, over) in SELECTORS.items():
        cls = device_class(f"hx-{case}")
        cls["spec"]["selectors"] = [{"cel": {"expression": expr}}]
        if create_dra(c, h, "deviceclasses", cls) and create_dra(
                c, h, "resourceclaimtemplates",
                claim_template(f"cls-{case}", device_class_name=f"hx-{case}")):
            gang_of(c, h, f"cls-{case}", OVER if over else None, template=f"cls-{case}")


def requests_batch(c: Cluster, h: Hostile) -> None:
    for case, (expr, over) in SELECTORS.items():
        if create_dra(c, h, "resourceclaimtemplates",
                      claim_template(f"req-{case}", selectors=(expr,))):
            gang_of(c, h, f"req-{case}", OVER if over else None, template=f"req-{case}")
    costly = SELECTORS["nested-15x40x40"][0]
    if create_dra(c, h, "resourceclaims", claim("shared-costly", selectors=(costly,))):
        gang_of(c, h, "shared-costly", OVER, shared="shared-costly")
    first = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
             "metadata": {"name": "first-8"}, "spec": {"spec": {"devices": {"requests": [
                 {"name": "gpu", "firstAvailable": [
                     {"name": f"s{i}", "deviceClassName": "gpu.nvidia.com",
                      "selectors": [{"cel": {"expression": costly if i == 7 else NOBODY}}]}
                     for i in range(8)]}]}}}}
    if create_dra(c, h, "resourceclaimtemplates", first):
        gang_of(c, h, "first-8", OVER, template="first-8")
    many = claim_template("selectors-32", selectors=(SELECTORS["nested-15x40x40"][0],) * 32)
    if create_dra(c, h, "resourceclaimtemplates", many):
        # Over a limit on one selector or on all of them together; either names the field.
        gang_of(c, h, "selectors-32", "selectors", template="selectors-32")


def _wide(name: str, requests: int, count: int) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name}, "spec": {"spec": {"devices": {"requests": [
                {"name": f"r{i}", "exactly": {"deviceClassName": "hostile-any",
                                              "allocationMode": "ExactCount",
                                              "count": count}}
                for i in range(requests)]}}}}


def claims_batch(c: Cluster, h: Hostile) -> None:
    if create_dra(c, h, "resourceclaimtemplates", _wide("wide-32", 32, 1)):
        gang_of(c, h, "wide-16x32", None, template="wide-32", claims=16)
    if create_dra(c, h, "resourceclaimtemplates", _wide("wide-32x32", 32, 32)):
        gang_of(c, h, "wide-32x32", None, template="wide-32x32")
    if create_dra(c, h, "resourceclaimtemplates", _wide("wide-33", 33, 1)):
        gang_of(c, h, "wide-33", None, template="wide-33")


def test_hostile_dra_objects_never_stop_lockstep(
    cluster: ClusterFactory, capsys: pytest.CaptureFixture[str],
) -> None:
    c = default_install(cluster, topology="dra-tiny-3x2", volcano=False)
    c.kube.create(f"{API}/namespaces/{c.ns}/resourceclaimtemplates",
                  claim_template(NORMAL, namespace=c.ns))
    h = Hostile()
    try:
        run_batches(c, h, {"classes": classes_batch, "requests": requests_batch,
                           "slices": slices_batch, "claims": claims_batch}, capsys,
                    claim_template=NORMAL, cleanup=True)
    finally:
        with capsys.disabled():
            print("\n  refused by the API server:\n    " + "\n    ".join(h.refusals),
                  flush=True)
