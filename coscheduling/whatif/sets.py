"""A what-if's JobSets, LeaderWorkerSets and Kubeflow Trainer v2 TrainJobs, read as the pods
their controllers would create, labelled as those controllers label them.

* **JobSet** (v0.10.1): child Jobs ``<jobset>-<replicatedJob>-<index>``, each creating
  min(parallelism, completions) pods carrying ``labelAndAnnotateObject``'s keys (as labels
  and annotations) and the exclusive-topology annotation; the JobSet itself is laid beside
  the groups, so its pods resolve as they would once it exists (opt-in, ``dependsOn``
  stages). Every stage's pods are listed: the dry plan decides which stage is admitted.
* **LeaderWorkerSet** (v0.7.0): ``replicas`` groups of ``size`` pods, the leader
  ``<lws>-<group>`` and workers ``<lws>-<group>-<worker>``, with the labels and annotations
  LWS's controllers and pod webhook write; the set itself laid beside the groups.
* **TrainJob** (v2.1.0) with its TrainingRuntime or ClusterTrainingRuntime in the manifest:
  the JobSet Trainer builds from the runtime's template (the trainer replicatedJob's
  parallelism set to ``numNodes``, ``resourcesPerNode`` on its ``node`` container) and the
  PodGroup its ``podGroupPolicy`` creates (scheduler-plugins' or Volcano's, ``minMember``
  every pod), unless the manifest has one of the TrainJob's name.

Nothing here imports the rest of the what-if: it returns plain pods and records, which
``whatif.expand`` wraps. Every count is bounded (the JobSet parser's limits, then the
manifest's pod budget) before a pod is built.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..conventions import jobset as js
from ..conventions import lws
from ..conventions.base import PodGroupRecord, Source
from ..conventions.scheduler_plugins import GROUP_LABEL, podgroup_from_json
from ..conventions.volcano import GROUP as VOLCANO_GROUP
from ..conventions.volcano import volcano_podgroup_from_json
from .answer import WhatIfError

__all__ = ["RUNTIME_KINDS", "SetPods", "jobset_pods", "lws_pods", "trainjob_pods"]

RUNTIME_KINDS = ("TrainingRuntime", "ClusterTrainingRuntime")
TRAINER_ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
"""The label on a runtime's replicatedJob template that says which step it is."""


@dataclass(slots=True)
class SetPods:
    """What one object would create: pods (``named``: their names are known at creation),
    the group records its controller adds, and notes for the answer."""

    source: str
    """The object, as messages name it (``JobSet default/train``)."""
    pods: list[tuple[dict[str, Any], bool]] = field(default_factory=list)
    groups: list[tuple[Source, str, PodGroupRecord]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _mapping(raw: object) -> Mapping[str, Any]:
    return raw if isinstance(raw, Mapping) else {}


def _meta(obj: Mapping[str, Any], kind: str) -> tuple[str, str, Mapping[str, Any]]:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        raise WhatIfError(f"{kind}.metadata", "missing or not an object")
    name, ns = meta.get("name"), meta.get("namespace") or "default"
    if not isinstance(name, str) or not name or len(name) > 63:
        raise WhatIfError(f"{kind}.metadata.name", "missing, or not a name of at most 63 "
                                                   "characters")
    if not isinstance(ns, str) or len(ns) > 63:
        raise WhatIfError(f"{kind}.metadata.namespace", "not a namespace name")
    return ns, name, meta


def _pod(tpl: Mapping[str, Any], where: str, ns: str, name: str, labels: Mapping[str, str],
         annotations: Mapping[str, str]) -> dict[str, Any]:
    spec = tpl.get("spec")
    if not isinstance(spec, Mapping):
        raise WhatIfError(where, "missing, or without a pod spec")
    meta = _mapping(tpl.get("metadata"))
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns,
                         "labels": {**_mapping(meta.get("labels")), **labels},
                         "annotations": {**_mapping(meta.get("annotations")), **annotations}},
            "spec": dict(spec)}


def _within(pods: int, limit: int, where: str) -> None:
    if pods > limit:
        raise WhatIfError(where, f"{pods} pods, more than {limit} (--max-gang-size, which "
                                 "bounds the pods of the whole manifest)")


# ---------------------------------------------------------------------------- JobSet


def jobset_pods(obj: Mapping[str, Any], limit: int, labels: Mapping[str, str] = {},
                annotations: Mapping[str, str] = {}, kind: str = "JobSet") -> SetPods:
    """The pods of a JobSet's child Jobs; ``labels`` and ``annotations`` are added to every
    pod (a TrainJob's gang)."""
    ns, name, meta = _meta(obj, kind)
    rec = js.jobset_from_json({**obj, "metadata": {**meta, "namespace": ns}})
    if rec.error is not None:
        raise WhatIfError(rec.error.field, f"{rec.error.value}: {rec.error.problem}")
    _within(rec.total, limit, f"{kind} {ns}/{name}")
    out = SetPods(f"{kind} {ns}/{name}", groups=[(js.JOBSET, rec.key, rec)])
    own_exclusive = _mapping(meta.get("annotations")).get(js.EXCLUSIVE)
    raw_jobs = _mapping(obj.get("spec")).get("replicatedJobs")
    assert isinstance(raw_jobs, list)  # the parser said so
    index = 0
    for i, (raw, job) in enumerate(zip(raw_jobs, rec.jobs, strict=True)):
        where = f"{kind}.spec.replicatedJobs[{i}].template.spec.template"
        job_tpl = _mapping(_mapping(raw).get("template"))
        tpl = _mapping(_mapping(job_tpl.get("spec")).get("template"))
        exclusive = _mapping(_mapping(job_tpl.get("metadata")).get("annotations")).get(
            js.EXCLUSIVE) or own_exclusive
        for r in range(job.replicas):
            keys = {js.JOBSET_NAME: name, js.REPLICATED_JOB: job.name, js.JOB_INDEX: str(r),
                    "jobset.sigs.k8s.io/replicatedjob-replicas": str(job.replicas),
                    "jobset.sigs.k8s.io/job-global-index": str(index)}
            index += 1
            ann = {**keys, **({js.EXCLUSIVE: str(exclusive)} if exclusive else {})}
            for n in range(job.pods):
                pod = _pod(tpl, where, ns, f"{name}-{job.name}-{r}-{n}",
                           {**keys, **labels}, {**ann, **annotations})
                out.pods.append((pod, False))
    staged = [j.name for j in rec.jobs if j.stage]
    out.notes.append(f"{kind} {ns}/{name}: {rec.total} pod(s) in {len(rec.children)} child "
                     "Job(s), named by the Job controller at creation, so gated, not pinned"
                     + (f"; {', '.join(staged)} wait(s) for dependsOn, a later stage"
                        if staged else ""))
    return out


# ---------------------------------------------------------------------------- LWS


def _group_key(ns: str, leader: str) -> str:
    """LWS's ``group-key``: a SHA-1 of ``namespace/leader`` (``genGroupUniqueKey``)."""
    return hashlib.sha1(f"{ns}/{leader}".encode()).hexdigest()


def lws_pods(obj: Mapping[str, Any], limit: int) -> SetPods:
    ns, name, meta = _meta(obj, "LeaderWorkerSet")
    spec = _mapping(obj.get("spec"))
    lwt = _mapping(spec.get("leaderWorkerTemplate"))
    replicas = _number(spec.get("replicas"), "LeaderWorkerSet.spec.replicas", 1, limit)
    size = _number(lwt.get("size"), "LeaderWorkerSet.spec.leaderWorkerTemplate.size", 1,
                   limit)
    if size < 1:
        raise WhatIfError("LeaderWorkerSet.spec.leaderWorkerTemplate.size", "must be at least 1")
    _within(replicas * size, limit, f"LeaderWorkerSet {ns}/{name}")
    worker_tpl = _mapping(lwt.get("workerTemplate"))
    leader_tpl = _mapping(lwt.get("leaderTemplate")) or worker_tpl
    own = _mapping(meta.get("annotations"))
    ann = {lws.SIZE: str(size), **{k: str(own[k]) for k in (lws.EXCLUSIVE,) if own.get(k)}}
    policy = _mapping(lwt.get("subGroupPolicy"))
    if policy.get("subGroupSize") is not None:
        sub = _number(policy["subGroupSize"],
                      "LeaderWorkerSet.spec.leaderWorkerTemplate.subGroupPolicy.subGroupSize",
                      1, size)
        ann[lws.SUBGROUP_SIZE] = str(sub)
        if own.get(lws.SUBGROUP_EXCLUSIVE):
            ann[lws.SUBGROUP_EXCLUSIVE] = str(own[lws.SUBGROUP_EXCLUSIVE])
    rec = lws.lws_from_json({**obj, "metadata": {**meta, "namespace": ns}})
    out = SetPods(f"LeaderWorkerSet {ns}/{name}", groups=[(lws.LWS, rec.key, rec)])
    for g in range(replicas):
        leader = f"{name}-{g}"
        labels = {lws.NAME: name, lws.GROUP_INDEX: str(g),
                  "leaderworkerset.sigs.k8s.io/group-key": _group_key(ns, leader)}
        policy_ann = ({"leaderworkerset.sigs.k8s.io/subgroup-policy-type":
                       str(policy.get("subGroupPolicyType") or "LeaderWorker")}
                      if lws.SUBGROUP_SIZE in ann else {})
        out.pods.append((_pod(leader_tpl, "LeaderWorkerSet.spec.leaderWorkerTemplate."
                              "leaderTemplate", ns, leader, {**labels, lws.WORKER_INDEX: "0"},
                              {**ann, **policy_ann}), True))
        for w in range(1, size):
            out.pods.append((_pod(worker_tpl, "LeaderWorkerSet.spec.leaderWorkerTemplate."
                                  "workerTemplate", ns, f"{leader}-{w}",
                                  {**labels, lws.WORKER_INDEX: str(w)},
                                  {**ann, "leaderworkerset.sigs.k8s.io/leader-name": leader}),
                             True))
    note = f"LeaderWorkerSet {ns}/{name}: {replicas} group(s) of {size}"
    if rec.leader_ready:
        note += ("; startupPolicy LeaderReady creates each group's workers once its leader "
                 "runs, so each pod is admitted alone")
    out.notes.append(note)
    return out


def _number(raw: object, where: str, default: int, limit: int) -> int:
    if raw is None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= limit:
        raise WhatIfError(where, f"{str(raw)[:32]} is not a whole number in 0..{limit} "
                                 "(--max-gang-size, which bounds the pods of the whole "
                                 "manifest)")
    return raw


# ---------------------------------------------------------------------------- TrainJob


def trainjob_pods(obj: Mapping[str, Any], runtimes: Sequence[Mapping[str, Any]],
                  groups: Mapping[Source, Mapping[str, PodGroupRecord]], limit: int
                  ) -> SetPods:
    """The JobSet and PodGroup Trainer v2 makes for a TrainJob from its runtime (which must
    be in the manifest: a what-if reads no object the cluster holds but its groups)."""
    ns, name, _ = _meta(obj, "TrainJob")
    spec = _mapping(obj.get("spec"))
    ref = _mapping(spec.get("runtimeRef"))
    want, kind = ref.get("name"), ref.get("kind") or "ClusterTrainingRuntime"
    runtime = next((r for r in runtimes if _mapping(r.get("metadata")).get("name") == want
                    and r.get("kind") == kind), None)
    if runtime is None:
        raise WhatIfError("TrainJob.spec.runtimeRef", f"{kind} {str(want)[:64]!r} is not in "
                          "the manifest: a what-if reads a TrainJob with its runtime")
    rspec = _mapping(runtime.get("spec"))
    template = copy.deepcopy(dict(_mapping(_mapping(rspec.get("template")).get("spec"))))
    trainer = _mapping(spec.get("trainer"))
    nodes = _number(trainer.get("numNodes", _mapping(rspec.get("mlPolicy")).get("numNodes")),
                    "TrainJob.spec.trainer.numNodes", 1, limit)
    jobs = template.get("replicatedJobs")
    if not isinstance(jobs, list) or len(jobs) > js.MAX_REPLICATED_JOBS:
        raise WhatIfError(f"{kind}.spec.template.spec.replicatedJobs",
                          f"missing, or more than {js.MAX_REPLICATED_JOBS}")
    for rj in jobs:
        if isinstance(rj, dict):
            _shape_trainer_job(rj, nodes, _mapping(trainer.get("resourcesPerNode")))
    policy = _mapping(rspec.get("podGroupPolicy"))
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    if "volcano" in policy:
        source = Source.VOLCANO
        annotations[VOLCANO_GROUP[0]] = name
    elif "coscheduling" in policy:
        source = Source.SCHEDULER_PLUGINS
        labels[GROUP_LABEL] = name
    else:
        source = None
    out = jobset_pods({"metadata": {"name": name, "namespace": ns}, "spec": template}, limit,
                      labels, annotations, kind="TrainJob")
    key = f"{ns}/{name}"
    if source is not None and key not in groups.get(source, {}):
        total = len(out.pods)
        pg_spec: dict[str, Any] = {"minMember": total}
        pg = {"metadata": {"name": name, "namespace": ns}, "spec": pg_spec}
        if source is Source.VOLCANO:
            out.groups.append((source, key, volcano_podgroup_from_json(pg)))
        else:
            pg_spec["scheduleTimeoutSeconds"] = _mapping(policy.get("coscheduling")).get(
                "scheduleTimeoutSeconds", 60)
            out.groups.append((source, key, podgroup_from_json(pg)))
        out.notes.append(f"TrainJob {key}: the {source.value} PodGroup Trainer creates "
                         f"assumed (minMember {total}, every pod of its JobSet)")
    elif source is None:
        out.notes.append(f"TrainJob {key}: its runtime has no podGroupPolicy, so no gang")
    return out


def _shape_trainer_job(rj: dict[str, Any], nodes: int, resources: Mapping[str, Any]) -> None:
    """What Trainer's JobSet builder changes: the trainer step's parallelism (and
    completions) become ``numNodes``, its ``node`` container gets ``resourcesPerNode``;
    initializers run one pod."""
    labels = _mapping(_mapping(_mapping(rj.get("template")).get("metadata")).get("labels"))
    step = labels.get(TRAINER_ANCESTOR)
    job_spec = _mapping(rj.get("template")).get("spec")
    if not isinstance(job_spec, dict):
        return
    if step in ("dataset-initializer", "model-initializer"):
        rj["replicas"] = 1
    if step != "trainer" and rj.get("name") != "node":
        return
    job_spec["parallelism"] = job_spec["completions"] = nodes
    if not resources:
        return
    containers = _mapping(_mapping(job_spec.get("template")).get("spec")).get("containers")
    for c in containers if isinstance(containers, list) else ():
        if isinstance(c, dict) and c.get("name") == "node":
            c["resources"] = dict(resources)
