"""Node lists in the API server's protobuf encoding, decoded into the JSON shape Lockstep reads.

Why: at start-up Lockstep lists every node while kube-scheduler starts on the same cores.
A node as JSON is ~3.7 KB (managed fields, conditions, images), and on a 5,000-node test
bed the JSON list cost the API server 0.72-0.87 s of CPU and Lockstep 0.41-0.54 s to parse;
as protobuf 0.34-0.50 s and 0.24-0.31 s. kube-scheduler and every Go controller
list nodes this way.

Only the fields ``coscheduling.node_from_json`` reads are declared; protobuf skips the rest
(managed fields, images, addresses) in C. The numbers are those of ``k8s.io/api/core/v1``
and ``k8s.io/apimachinery`` ``generated.proto``, which Kubernetes never renumbers. The
answer is ``k8s\\x00`` followed by a ``runtime.Unknown`` whose ``raw`` holds the list
(``apimachinery/pkg/runtime/serializer/protobuf``); errors come as a ``meta/v1.Status``.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["ACCEPT", "PREFIX", "decode_node_list", "decode_status"]

PREFIX = b"k8s\x00"
ACCEPT = "application/vnd.kubernetes.protobuf, application/json"
"""As client-go asks: an API server (or proxy) that cannot answer protobuf answers JSON."""

# (message, [(field, number, type, repeated, message type)], map entries)
_S, _B, _M, _BY, _I32 = "string", "bool", "message", "bytes", "int32"
_SCHEMA: tuple[tuple[str, tuple[tuple[str, int, str, bool, str], ...],
                     tuple[tuple[str, str, str], ...]], ...] = (
    ("TypeMeta", (("apiVersion", 1, _S, False, ""), ("kind", 2, _S, False, "")), ()),
    ("Unknown", (("typeMeta", 1, _M, False, "TypeMeta"), ("raw", 2, _BY, False, "")), ()),
    ("Quantity", (("string", 1, _S, False, ""),), ()),
    ("ListMeta", (("resourceVersion", 2, _S, False, ""), ("continue", 3, _S, False, "")), ()),
    ("Status", (("status", 2, _S, False, ""), ("message", 3, _S, False, ""),
                ("reason", 4, _S, False, ""), ("code", 6, _I32, False, "")), ()),
    ("ObjectMeta", (("name", 1, _S, False, ""), ("uid", 5, _S, False, ""),
                    ("resourceVersion", 6, _S, False, ""),
                    ("labels", 11, _M, True, "ObjectMeta.LabelsEntry")),
     (("LabelsEntry", _S, ""),)),
    ("Taint", (("key", 1, _S, False, ""), ("value", 2, _S, False, ""),
               ("effect", 3, _S, False, "")), ()),
    ("NodeSpec", (("unschedulable", 4, _B, False, ""), ("taints", 5, _M, True, "Taint")), ()),
    ("NodeStatus", (("capacity", 1, _M, True, "NodeStatus.CapacityEntry"),
                    ("allocatable", 2, _M, True, "NodeStatus.AllocatableEntry")),
     (("CapacityEntry", _M, "Quantity"), ("AllocatableEntry", _M, "Quantity"))),
    ("Node", (("metadata", 1, _M, False, "ObjectMeta"), ("spec", 2, _M, False, "NodeSpec"),
              ("status", 3, _M, False, "NodeStatus")), ()),
    ("NodeList", (("metadata", 1, _M, False, "ListMeta"), ("items", 2, _M, True, "Node")), ()),
)


@functools.cache
def _classes() -> dict[str, Any]:
    """The message classes, built once from ``_SCHEMA`` (no generated code to vendor)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    types = {_S: field.TYPE_STRING, _B: field.TYPE_BOOL, _M: field.TYPE_MESSAGE,
             _BY: field.TYPE_BYTES, _I32: field.TYPE_INT32}
    fd = descriptor_pb2.FileDescriptorProto(name="lockstep/k8s_min.proto", package="lk",
                                            syntax="proto2")
    for name, fields, entries in _SCHEMA:
        msg = fd.message_type.add(name=name)
        for entry, value_type, value_msg in entries:
            e = msg.nested_type.add(name=entry)
            e.options.map_entry = True
            e.field.add(name="key", number=1, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
            v = e.field.add(name="value", number=2, type=types[value_type],
                            label=field.LABEL_OPTIONAL)
            if value_msg:
                v.type_name = f".lk.{value_msg}"
        for fname, number, ftype, repeated, type_name in fields:
            f = msg.field.add(name=fname, number=number, type=types[ftype],
                              label=field.LABEL_REPEATED if repeated else field.LABEL_OPTIONAL)
            if type_name:
                f.type_name = f".lk.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"lk.{name}"))
            for name in ("Unknown", "NodeList", "Status")}


def _unwrap(data: bytes) -> bytes:
    if not data.startswith(PREFIX):
        raise ValueError("not a Kubernetes protobuf answer (no k8s\\x00 prefix)")
    from google.protobuf.message import DecodeError

    unknown = _classes()["Unknown"]()
    try:
        unknown.ParseFromString(data[len(PREFIX):])
    except DecodeError as e:
        raise ValueError(f"malformed protobuf answer: {e}") from None
    return bytes(unknown.raw)


def decode_node_list(data: bytes) -> dict[str, Any]:
    """A protobuf ``NodeList`` as the JSON list ``node_from_json`` and the pager read:
    ``metadata.resourceVersion``/``continue`` and, per node, name, uid, resourceVersion,
    labels, unschedulable, taints, capacity and allocatable. Raises ``ValueError``."""
    from google.protobuf.message import DecodeError

    nodes = _classes()["NodeList"]()
    try:
        nodes.ParseFromString(_unwrap(data))
    except DecodeError as e:
        raise ValueError(f"malformed NodeList: {e}") from None
    items = []
    for n in nodes.items:
        m, spec, status = n.metadata, n.spec, n.status
        node: dict[str, Any] = {
            "metadata": {"name": m.name, "uid": m.uid, "resourceVersion": m.resourceVersion,
                         "labels": dict(m.labels)},
            "spec": {"unschedulable": spec.unschedulable,
                     "taints": [{"key": t.key, "value": t.value, "effect": t.effect}
                                if t.value else {"key": t.key, "effect": t.effect}
                                for t in spec.taints]},
            "status": {"capacity": {k: q.string for k, q in status.capacity.items()},
                       "allocatable": {k: q.string for k, q in status.allocatable.items()}},
        }
        items.append(node)
    meta = nodes.metadata
    return {"metadata": {"resourceVersion": meta.resourceVersion,
                         "continue": getattr(meta, "continue")},
            "items": items}


def decode_status(data: bytes) -> dict[str, Any]:
    """A protobuf ``meta/v1.Status`` (an error answer) as its JSON keys."""
    from google.protobuf.message import DecodeError

    status = _classes()["Status"]()
    try:
        status.ParseFromString(_unwrap(data))
    except DecodeError as e:
        raise ValueError(f"malformed Status: {e}") from None
    return {"kind": "Status", "status": status.status, "message": status.message,
            "reason": status.reason, "code": status.code}
