"""The objects of a what-if, read as what they would create: pods, and the groups they name.

A manifest holds what a user would ``kubectl apply``: pods; a PyTorchJob with its PodGroup;
a Volcano or scheduler-plugins PodGroup; a Kueue Workload (its podSets, as a Kueue pod
group); a batch Job or a Deployment, whose pod template is expanded into the pods its
controller would create; a JobSet, a LeaderWorkerSet, or a Trainer v2 TrainJob with its
runtime (``whatif.sets``). Every count is bounded (by ``--max-gang-size``) before a single pod
is built, so nothing here grows with a number the user wrote; every refusal names the field.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..conventions import kueue
from ..conventions.base import PodGroupRecord, Source
from ..conventions.scheduler_plugins import GROUP_LABEL, podgroup_from_json
from ..conventions.volcano import GROUP as VOLCANO_GROUP
from ..conventions.volcano import volcano_podgroup_from_json
from .answer import WhatIfError
from .sets import RUNTIME_KINDS, SetPods, jobset_pods, lws_pods, trainjob_pods

__all__ = ["MAX_OBJECTS", "Expanded", "Manifest", "expand"]

MAX_OBJECTS = 64
"""Objects one what-if reads at most (a job and its group are two)."""

KINDS = ("Pod", "Job", "Deployment", "PyTorchJob", "PodGroup", "Workload", "JobSet",
         "LeaderWorkerSet", "TrainJob", *RUNTIME_KINDS)

_PYTORCH_TYPES = ("Master", "Worker")
"""PyTorchJob replica types in the order training-operator names its pods."""


@dataclass(frozen=True, slots=True)
class Manifest:
    """A pod the objects would create: its JSON as the API server would hold it."""

    obj: dict[str, Any]
    named: bool
    """Its name is known at creation (a pod, a PyTorchJob's): the webhook can pin it. A
    Job's or a Deployment's pods get a generated name, so the webhook gates them."""
    source: str
    """The object it comes from (``Job default/train``), for messages."""


@dataclass(slots=True)
class Expanded:
    pods: list[Manifest] = field(default_factory=list)
    groups: dict[Source, dict[str, PodGroupRecord]] = field(default_factory=dict)
    """PodGroup objects in the manifest, by convention and ``namespace/name``."""
    notes: list[str] = field(default_factory=list)


def _meta(obj: Mapping[str, Any], where: str) -> tuple[str, str]:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        raise WhatIfError(f"{where}.metadata", "missing or not an object")
    name, ns = meta.get("name"), meta.get("namespace") or "default"
    if not isinstance(name, str) or not name or len(name) > 253:
        raise WhatIfError(f"{where}.metadata.name", "missing, or not a name of at most 253 "
                                                    "characters")
    if not isinstance(ns, str) or len(ns) > 63:
        raise WhatIfError(f"{where}.metadata.namespace", "not a namespace name")
    return ns, name


def _count(raw: object, where: str, default: int, limit: int) -> int:
    """A replica count the user wrote, bounded before any pod is built."""
    if raw is None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= limit:
        raise WhatIfError(where, f"{str(raw)[:32]} is not a whole number in 0..{limit} "
                                 "(--max-gang-size, which bounds the pods of the whole "
                                 "manifest)")
    return raw


def _template(spec: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    tpl = spec.get("template")
    if not isinstance(tpl, Mapping) or not isinstance(tpl.get("spec"), Mapping):
        raise WhatIfError(f"{where}.template", "missing, or without a pod spec")
    return tpl


def _pod(tpl: Mapping[str, Any], ns: str, name: str, labels: Mapping[str, str] = {},
         annotations: Mapping[str, str] = {}) -> dict[str, Any]:
    """A pod from a template: its metadata, with ``labels`` and ``annotations`` added."""
    meta = tpl.get("metadata") if isinstance(tpl.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    own_labels = meta.get("labels") if isinstance(meta.get("labels"), Mapping) else {}
    own_ann = meta.get("annotations") if isinstance(meta.get("annotations"), Mapping) else {}
    assert isinstance(own_labels, Mapping) and isinstance(own_ann, Mapping)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": {**own_labels, **labels},
                         "annotations": {**own_ann, **annotations}},
            "spec": dict(tpl["spec"])}


def _job(obj: Mapping[str, Any], out: Expanded, limit: int) -> None:
    ns, name = _meta(obj, "Job")
    spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
    tpl = _template(spec, "Job.spec")
    parallelism = _count(spec.get("parallelism"), "Job.spec.parallelism", 1, limit)
    completions = _count(spec.get("completions"), "Job.spec.completions", parallelism,
                         2**31 - 1)
    indexed = spec.get("completionMode") == "Indexed"
    if spec.get("suspend") is True:
        out.notes.append(f"Job {ns}/{name} is suspended: it creates its pods when resumed "
                         "(by Kueue, say); answered as if resumed now")
    n = min(parallelism, completions)
    for i in range(n):
        ann = {"batch.kubernetes.io/job-completion-index": str(i)} if indexed else {}
        out.pods.append(Manifest(_pod(tpl, ns, f"{name}-{i}", {"job-name": name}, ann),
                                 False, f"Job {ns}/{name}"))
    out.notes.append(f"Job {ns}/{name}: {n} pod(s) at once (parallelism {parallelism}, "
                     f"completions {completions}{', Indexed' if indexed else ''}), named "
                     "by the Job controller at creation, so gated, not pinned")


def _deployment(obj: Mapping[str, Any], out: Expanded, limit: int) -> None:
    ns, name = _meta(obj, "Deployment")
    spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
    tpl = _template(spec, "Deployment.spec")
    n = _count(spec.get("replicas"), "Deployment.spec.replicas", 1, limit)
    for i in range(n):
        out.pods.append(Manifest(_pod(tpl, ns, f"{name}-{i}"), False, f"Deployment {ns}/{name}"))
    out.notes.append(f"Deployment {ns}/{name}: {n} replica(s), named at creation, so gated, "
                     "not pinned")


def _pytorchjob(obj: Mapping[str, Any], out: Expanded, limit: int,
                schedulers: Sequence[str]) -> None:
    """training-operator's pods: ``<job>-master-0``, ``<job>-worker-<i>``, each labelled
    with its gang (a Volcano PodGroup of the job's name in the manifest makes it Volcano's
    annotation, else scheduler-plugins' label, the PodGroup the operator creates with
    ``minMember`` = all replicas, or ``runPolicy.schedulingPolicy.minAvailable``)."""
    ns, name = _meta(obj, "PyTorchJob")
    spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
    replicas = spec.get("pytorchReplicaSpecs")
    if not isinstance(replicas, Mapping) or not replicas:
        raise WhatIfError("PyTorchJob.spec.pytorchReplicaSpecs", "missing or empty")
    unknown = sorted(str(k) for k in replicas if k not in _PYTORCH_TYPES)
    if unknown:
        raise WhatIfError("PyTorchJob.spec.pytorchReplicaSpecs",
                          f"unknown replica type {unknown[0]!r} (known: Master, Worker)")
    key = f"{ns}/{name}"
    volcano = key in out.groups.get(Source.VOLCANO, {})
    gang = ({}, {VOLCANO_GROUP[0]: name}) if volcano else ({GROUP_LABEL: name}, {})
    total = 0
    for rtype in _PYTORCH_TYPES:
        rs = replicas.get(rtype)
        if rs is None:
            continue
        where = f"PyTorchJob.spec.pytorchReplicaSpecs.{rtype}"
        if not isinstance(rs, Mapping):
            raise WhatIfError(where, "not an object")
        n = _count(rs.get("replicas"), f"{where}.replicas", 1, limit - total)
        tpl = _template(rs, where)
        for i in range(n):
            labels = {**gang[0], "training.kubeflow.org/job-name": name,
                      "training.kubeflow.org/replica-type": rtype.lower(),
                      "training.kubeflow.org/replica-index": str(i)}
            pod = _pod(tpl, ns, f"{name}-{rtype.lower()}-{i}", labels, gang[1])
            if not pod["spec"].get("schedulerName") and schedulers:
                pod["spec"]["schedulerName"] = schedulers[0]
            out.pods.append(Manifest(pod, True, f"PyTorchJob {key}"))
        total += n
    _operator_podgroup(spec, key, total, volcano, out, limit)


def _operator_podgroup(spec: Mapping[str, Any], key: str, total: int, volcano: bool,
                       out: Expanded, limit: int) -> None:
    """The PodGroup training-operator creates for the job, unless the manifest has one."""
    source = Source.VOLCANO if volcano else Source.SCHEDULER_PLUGINS
    if key in out.groups.get(source, {}):
        return
    policy = (spec.get("runPolicy") or {}).get("schedulingPolicy") \
        if isinstance(spec.get("runPolicy"), Mapping) else None
    at_least = _count(policy.get("minAvailable") if isinstance(policy, Mapping) else None,
                      "PyTorchJob.spec.runPolicy.schedulingPolicy.minAvailable", total, limit)
    ns, name = key.split("/", 1)
    out.groups.setdefault(source, {})[key] = podgroup_from_json(
        {"metadata": {"namespace": ns, "name": name}, "spec": {"minMember": at_least}})
    out.notes.append(f"PyTorchJob {key}: no PodGroup in the manifest; the one "
                     f"training-operator creates assumed (minMember {at_least})")


def _workload(obj: Mapping[str, Any], out: Expanded, limit: int) -> None:
    """A Kueue Workload: its podSets' pods, as one Kueue pod group of their total count
    (``kueue.x-k8s.io/pod-group-name`` and ``pod-group-total-count``, the convention
    Lockstep reads), under its queue (``spec.queueName``)."""
    ns, name = _meta(obj, "Workload")
    spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
    sets = spec.get("podSets")
    if not isinstance(sets, list) or not sets:
        raise WhatIfError("Workload.spec.podSets", "missing or empty")
    counts: list[tuple[str, int, Mapping[str, Any]]] = []
    total = 0
    for i, ps in enumerate(sets[:8]):  # Kueue allows 8 podSets
        where = f"Workload.spec.podSets[{i}]"
        if not isinstance(ps, Mapping):
            raise WhatIfError(where, "not an object")
        n = _count(ps.get("count"), f"{where}.count", 1, limit - total)
        counts.append((str(ps.get("name") or "main"), n, _template(ps, where)))
        total += n
    if len(sets) > 8:
        raise WhatIfError("Workload.spec.podSets", "more than Kueue's 8 podSets")
    queue = spec.get("queueName")
    labels = {kueue.GROUP: name, **({kueue.QUEUE: str(queue)} if queue else {})}
    # The Workload's own priority (``spec.priorityClassName`` / ``spec.priority``) is its
    # pods' unless a template says otherwise.
    own = {k: spec[k] for k in ("priorityClassName", "priority") if spec.get(k) is not None}
    for set_name, n, tpl in counts:
        for i in range(n):
            pod = _pod(tpl, ns, f"{name}-{set_name}-{i}", labels, {kueue.TOTAL: str(total)})
            if "priority" not in pod["spec"] and "priorityClassName" not in pod["spec"]:
                pod["spec"].update(own)
            out.pods.append(Manifest(pod, True, f"Workload {ns}/{name}"))
    out.notes.append(f"Workload {ns}/{name}: {total} pod(s) in {len(counts)} podSet(s), as "
                     "one Kueue pod group, as if Kueue admitted it now")


def _group(obj: Mapping[str, Any], out: Expanded) -> None:
    api = str(obj.get("apiVersion") or "")
    parse: Callable[[Mapping[str, Any]], PodGroupRecord]
    if api.startswith("scheduling.x-k8s.io/"):
        source, parse = Source.SCHEDULER_PLUGINS, podgroup_from_json
    elif api.startswith("scheduling.volcano.sh/"):
        source, parse = Source.VOLCANO, volcano_podgroup_from_json
    else:
        raise WhatIfError("PodGroup.apiVersion", f"{api!r}: known are scheduling.x-k8s.io "
                                                 "(scheduler-plugins) and scheduling.volcano.sh")
    ns, name = _meta(obj, "PodGroup")
    out.groups.setdefault(source, {})[f"{ns}/{name}"] = parse(obj)


def _add(out: Expanded, found: SetPods) -> None:
    """A set's pods and the records its controller adds (a group already in the manifest
    stays)."""
    for pod, named in found.pods:
        out.pods.append(Manifest(pod, named, found.source))
    for source, key, rec in found.groups:
        out.groups.setdefault(source, {}).setdefault(key, rec)
    out.notes.extend(found.notes)


def expand(objects: Sequence[object], limit: int, schedulers: Sequence[str]) -> Expanded:
    """Every pod ``objects`` would create, and the groups among them. ``limit`` bounds the
    pods of the whole manifest (``--max-gang-size``); refusals name the object and field."""
    if len(objects) > MAX_OBJECTS:
        raise WhatIfError("manifest", f"{len(objects)} objects, more than {MAX_OBJECTS}")
    out = Expanded()
    docs = [o for o in objects if o is not None]
    for i, obj in enumerate(docs):
        if not isinstance(obj, Mapping):
            raise WhatIfError(f"document {i + 1}", "not an object")
        if obj.get("kind") == "PodGroup":  # groups first: a job's pods read them
            _group(obj, out)
    runtimes = [o for o in docs if isinstance(o, Mapping) and o.get("kind") in RUNTIME_KINDS]
    for i, obj in enumerate(docs):
        assert isinstance(obj, Mapping)
        kind = obj.get("kind")
        left = limit - len(out.pods)
        if kind == "Pod":
            ns, name = _meta(obj, "Pod")
            if not isinstance(obj.get("spec"), Mapping):
                raise WhatIfError("Pod.spec", "missing or not an object")
            out.pods.append(Manifest(_pod(obj, ns, name), True, f"Pod {ns}/{name}"))
        elif kind == "Job":
            _job(obj, out, left)
        elif kind == "Deployment":
            _deployment(obj, out, left)
        elif kind == "PyTorchJob":
            _pytorchjob(obj, out, left, schedulers)
        elif kind == "Workload":
            _workload(obj, out, left)
        elif kind == "JobSet":
            _add(out, jobset_pods(obj, left))
        elif kind == "LeaderWorkerSet":
            _add(out, lws_pods(obj, left))
        elif kind == "TrainJob":
            _add(out, trainjob_pods(obj, runtimes, out.groups, left))
        elif kind != "PodGroup" and kind not in RUNTIME_KINDS:
            said = "no kind" if kind is None else f"{str(kind)[:64]!r} is not a kind"
            raise WhatIfError(f"document {i + 1}.kind", f"{said} a what-if reads (known: "
                              f"{', '.join(KINDS)})")
        if len(out.pods) > limit:
            raise WhatIfError("manifest", f"more than {limit} pods (--max-gang-size)")
    if not out.pods:
        raise WhatIfError("manifest", "creates no pod (known kinds: " + ", ".join(KINDS) + ")")
    return out
