"""JobSet (``jobset.x-k8s.io``, v0.10.1) and the JobSets Kubeflow Trainer v2 creates: one gang
across a JobSet's child Jobs when asked, and ``dependsOn`` read as stages.

Two readings, both from the JobSet object (``spec.replicatedJobs``: replicas, the Job
template's parallelism and completions, ``dependsOn``), watched while its CRD is served:

* **Opt-in.** A JobSet whose pod template says ``lockstep.dev/gang-of: jobset`` (an annotation;
  the JobSet controller copies the template's annotations onto every pod) is one gang across
  all its replicatedJobs, named by the JobSet (``namespace/<jobset>``). JobSet v0.10.1 writes
  no gang declaration of its own (no PodGroup, no Workload: the upstream integration of
  kubernetes-sigs/jobset#1253 is not in it), so nothing else is read for it.
* **Stages.** A pod whose gang another convention declares (Trainer v2's scheduler-plugins
  or Volcano PodGroup, or any other) and whose JobSet has ``dependsOn`` is read by stages
  when the gang counts every pod of the JobSet: the controller creates a replicatedJob only
  after the ones it depends on are Ready or Complete, so those pods never coexist and a flat
  quorum over all of them is never met (Trainer's PodGroup counts the initializers with the
  nodes). This is a deliberate reading of such a PodGroup: each stage is admitted whole, the
  initializers first, then the trainer nodes. A gang that counts fewer pods than the JobSet
  is read as written.

Either way the subgroups are the **child Jobs** (``<jobset>-<replicatedJob>-<index>``, as
the JobSet controller names them), not the replicatedJobs: JobSet's exclusive placement
(``alpha.jobset.sigs.k8s.io/exclusive-topology``, on the JobSet or a replicatedJob's
template, copied onto the pods) gives each child Job a topology domain to itself, and a
child Job is what the controller creates, fails and restarts as one. A member's spec then
carries its child Job (``part``), every child Job (``group``), the Job's pods as its
minimum, its replicatedJob's stage (``stage``: 0 for one without ``dependsOn``, else one
more than the latest it depends on), and the exclusive topology key as ``part_topology``
with ``part_exclusive``.

Every number in a JobSet is bounded when it is parsed (:data:`MAX_REPLICATED_JOBS`,
:data:`MAX_CHILD_JOBS`, int32), before any key is built; a JobSet past a limit is kept with
an error naming the field, which an opted-in member reports (the stage reading then leaves
the gang as its own convention declared it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..podgroup import (
    DEFAULT_MAX_GANG_SIZE,
    INT32_MAX,
    GangKey,
    GangSpec,
    InvalidGang,
    MissingPodGroup,
    Source,
    gang_key,
    int_field,
    shown,
)
from ..records import PodRecord
from .base import Convention, Found, Key, Objects, PodGroupRecord, Watch, lookup

__all__ = [
    "API_GROUP",
    "CONVENTION",
    "EXCLUSIVE",
    "JOBSET",
    "JOBSET_NAME",
    "JOB_INDEX",
    "MAX_CHILD_JOBS",
    "MAX_REPLICATED_JOBS",
    "OPT_IN",
    "OPT_IN_VALUE",
    "OPT_OUT_VALUE",
    "REPLICATED_JOB",
    "WATCHES",
    "JobSetRecord",
    "ReplicatedJob",
    "child_job",
    "jobset_from_json",
    "topology_key_problem",
]

JOBSET = Source("jobset")
API_GROUP = "jobset.x-k8s.io"
OPT_IN = "lockstep.dev/gang-of"
"""The opt-in annotation, on the JobSet's pod template (so on every pod)."""
OPT_IN_VALUE = "jobset"
OPT_OUT_VALUE = "none"
"""``lockstep.dev/gang-of: none``: no gang read from the workload (a LeaderWorkerSet's)."""

JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
"""Labels (and annotations) the JobSet controller puts on every pod of a child Job
(``labelAndAnnotateObject``, pkg/controllers/jobset_controller.go)."""
EXCLUSIVE = "alpha.jobset.sigs.k8s.io/exclusive-topology"
"""A node label key: each child Job gets a domain of it to itself (an annotation)."""

MAX_REPLICATED_JOBS = 64
"""The most replicatedJobs a JobSet read here may have (JobSet sets no limit; Trainer's have
at most four)."""
MAX_CHILD_JOBS = DEFAULT_MAX_GANG_SIZE
"""The most child Jobs (the sum of ``replicas``) a JobSet read here may have: each is a
subgroup, and every child Job has at least one pod, so more could never be one gang."""
MAX_DEPENDS_ON = 5
"""``dependsOn`` items per replicatedJob (the JobSet CRD's own MaxItems)."""
MAX_LABEL_KEY_CHARS = 317
"""A label key: a 253-character DNS prefix, a slash and a 63-character name."""
_LABEL_KEY = re.compile(
    r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


@dataclass(frozen=True, slots=True)
class ReplicatedJob:
    """One ``spec.replicatedJobs[]`` entry, as much as the gang needs."""

    name: str
    replicas: int
    pods: int
    """Pods of each child Job: its template's parallelism, at most its completions."""
    stage: int


@dataclass(frozen=True, slots=True)
class JobSetRecord(PodGroupRecord):
    """A JobSet as the store keeps it (beside the conventions' PodGroups, by its key)."""

    jobs: tuple[ReplicatedJob, ...] = ()
    children: tuple[GangKey, ...] = ()
    """Every child Job with pods, as a subgroup key, sorted: one tuple shared by every
    member's spec."""
    total: int = 0
    """Pods of all child Jobs together."""
    stages: tuple[tuple[GangKey, int], ...] = ()
    """Each child Job of a later stage, with its stage: the group declares them before any
    of their pods exist (they come only once the earlier stage finished)."""

    @property
    def staged(self) -> bool:
        return any(j.stage for j in self.jobs)


def topology_key_problem(raw: str) -> str | None:
    """Why ``raw`` cannot be a node label key, or None (checked by length first)."""
    if len(raw) > MAX_LABEL_KEY_CHARS:
        return f"is {len(raw)} characters long, above the limit of {MAX_LABEL_KEY_CHARS}"
    if not _LABEL_KEY.fullmatch(raw):
        return "not a node label key"
    return None


def _mapping(raw: object) -> Mapping[str, Any]:
    return raw if isinstance(raw, Mapping) else {}


def jobset_from_json(obj: Mapping[str, Any]) -> JobSetRecord:
    """A served JobSet; a bad or too large field becomes the record's ``error``, naming it."""
    meta = _mapping(obj.get("metadata"))
    key = gang_key(str(meta.get("namespace") or "default"), str(meta.get("name") or ""))
    parsed = _jobs(key, _mapping(obj.get("spec")).get("replicatedJobs"))
    if isinstance(parsed, InvalidGang):
        return JobSetRecord(key, None, None, {}, parsed)
    name = key.split("/", 1)[1]
    children = tuple(sorted(child_job(key, name, j.name, i)
                            for j in parsed if j.pods for i in range(j.replicas)))
    total = sum(j.replicas * j.pods for j in parsed)
    stages = tuple(sorted((child_job(key, name, j.name, i), j.stage)
                          for j in parsed if j.pods and j.stage for i in range(j.replicas)))
    return JobSetRecord(key, None, None, {}, jobs=parsed, children=children, total=total,
                        stages=stages)


def _jobs(key: GangKey, raw: object) -> tuple[ReplicatedJob, ...] | InvalidGang:
    fld = "JobSet.spec.replicatedJobs"
    if not isinstance(raw, list):
        return InvalidGang(key, fld, shown(raw), "not a list")
    if len(raw) > MAX_REPLICATED_JOBS:
        return InvalidGang(key, fld, shown(raw), f"has {len(raw)} items, above the limit "
                           f"of {MAX_REPLICATED_JOBS}")
    out: list[ReplicatedJob] = []
    stages: dict[str, int] = {}
    children = 0
    for i, item in enumerate(raw):
        where = f"{fld}[{i}]"
        rj = _mapping(item)
        name = rj.get("name")
        if not isinstance(name, str) or not name or len(name) > 63:
            return InvalidGang(key, f"{where}.name", shown(name), "not a name of at most 63 "
                               "characters")
        replicas = _count(rj.get("replicas", 1), f"{where}.replicas", key)
        if isinstance(replicas, InvalidGang):
            return replicas
        children += replicas
        if children > MAX_CHILD_JOBS:
            return InvalidGang(key, f"{where}.replicas", str(replicas),
                               f"makes {children} child Jobs, above the limit of "
                               f"{MAX_CHILD_JOBS}")
        job_spec = _mapping(_mapping(rj.get("template")).get("spec"))
        pods = _count(job_spec.get("parallelism", 1), f"{where}.template.spec.parallelism",
                      key)
        if isinstance(pods, InvalidGang):
            return pods
        if job_spec.get("completions") is not None:
            done = _count(job_spec["completions"], f"{where}.template.spec.completions", key)
            if isinstance(done, InvalidGang):
                return done
            pods = min(pods, done)
        stage = _stage(key, where, rj.get("dependsOn"), stages)
        if isinstance(stage, InvalidGang):
            return stage
        stages[name] = stage
        out.append(ReplicatedJob(name, replicas, pods, stage))
    return tuple(out)


def _count(raw: object, fld: str, key: GangKey) -> int | InvalidGang:
    """A count that may be 0 (an int32, as the API has it)."""
    if raw == 0 and not isinstance(raw, bool):
        return 0
    return int_field(raw, fld, key, limit=INT32_MAX)


def _stage(key: GangKey, where: str, raw: object, stages: Mapping[str, int]
           ) -> int | InvalidGang:
    """One more than the latest stage ``dependsOn`` names (each an earlier replicatedJob,
    as JobSet's webhook requires); 0 without it."""
    if raw is None:
        return 0
    fld = f"{where}.dependsOn"
    if not isinstance(raw, list) or len(raw) > MAX_DEPENDS_ON:
        return InvalidGang(key, fld, shown(raw),
                           f"not a list of at most {MAX_DEPENDS_ON} items")
    stage = 0
    for j, dep in enumerate(raw):
        name = _mapping(dep).get("name")
        if not isinstance(name, str) or name not in stages:
            return InvalidGang(key, f"{fld}[{j}].name", shown(name),
                               "names no earlier replicatedJob")
        stage = max(stage, stages[name] + 1)
    return stage


def child_job(key: GangKey, jobset: str, replicated_job: str, index: int) -> GangKey:
    """A child Job's subgroup key: its name as the JobSet controller makes it
    (``GenJobName``: ``<jobset>-<replicatedJob>-<index>``)."""
    return gang_key(key.split("/", 1)[0], f"{jobset}-{replicated_job}-{index}")


API_PATH = f"/apis/{API_GROUP}/v1alpha2/jobsets"
WATCHES = (Watch("jobsets", lambda obj, _: jobset_from_json(obj), API_PATH),)
"""The JobSets, kept with the PodGroups (``into="groups"``) while the CRD is served."""


# ---------------------------------------------------------------------------- resolving


@dataclass(frozen=True, slots=True)
class _OptIn(Key):
    """``lockstep.dev/gang-of: jobset`` names the pod's JobSet as its gang. Any other value
    names itself, so the resolver reaches :func:`_from_object`, which says what is wrong;
    an empty one, or ``none``, declares nothing."""

    def value(self, pod: PodRecord) -> str | None:
        raw = pod.annotations.get(self.name)
        if not raw or raw.strip() == OPT_OUT_VALUE:
            return None
        if raw.strip() == OPT_IN_VALUE:
            return lookup(pod, JOBSET_NAME) or raw
        return raw


def _jobset_of(pod: PodRecord, objects: Objects) -> JobSetRecord | None:
    name = lookup(pod, JOBSET_NAME)
    if not name:
        return None
    js = objects.get(JOBSET, {}).get(gang_key(pod.namespace, name))
    return js if isinstance(js, JobSetRecord) else None


def _from_object(pod: PodRecord, key: GangKey, found: Found, objects: Objects
                 ) -> Found | InvalidGang | MissingPodGroup:
    """An opted-in pod: its gang is its JobSet's pods, all of them."""
    raw = pod.annotations.get(OPT_IN, "")
    if raw.strip() != OPT_IN_VALUE:
        return InvalidGang(key, OPT_IN, shown(raw), f"must be {OPT_IN_VALUE}")
    if not lookup(pod, JOBSET_NAME):
        return InvalidGang(key, OPT_IN, raw, f"the pod is no JobSet's (no {JOBSET_NAME})")
    js = objects.get(JOBSET, {}).get(key)
    if not isinstance(js, JobSetRecord):
        return MissingPodGroup(key, f"a JobSet, {API_GROUP}")
    if js.error is not None:
        return js.error
    if found.min_member is not None and found.min_member != js.total:
        return InvalidGang(key, found.size_field or OPT_IN, str(found.min_member),
                           f"conflicts with the {js.total} pods of JobSet {key}")
    return replace(found, min_member=js.total, size_field=f"JobSet {key} (its pods)")


def _refine(spec: GangSpec, pod: PodRecord, sources: frozenset[Source], objects: Objects
            ) -> GangSpec | InvalidGang:
    """Subgroups by child Job, for an opted-in JobSet, or for a gang declared otherwise that
    counts every pod of a JobSet with stages or exclusive placement."""
    if spec.group:
        return spec  # a Koordinator gang group is read as Koordinator says
    js = _jobset_of(pod, objects)
    if js is None or js.error is not None:
        return spec
    exclusive = pod.annotations.get(EXCLUSIVE)
    if JOBSET not in sources and (spec.min_member != js.total or not js.staged
                                  or exclusive is not None):
        return spec
    if exclusive is not None:
        # JobSet's pod webhook admits a child Job's followers only once its leader pod is
        # scheduled: the Job is never whole before it is admitted.
        return InvalidGang(spec.key, EXCLUSIVE, shown(exclusive),
                           f"cannot be read with {OPT_IN}: {JOBSET.value}: JobSet creates a "
                           "child Job's followers only once its leader is scheduled, so "
                           "the Job is never whole before it is admitted")
    where = _child_of(pod, js)
    if isinstance(where, InvalidGang):
        return replace(where, key=spec.key)
    part, job = where
    return replace(spec, part=part, group=js.children, min_member=job.pods, stage=job.stage,
                   part_stages=js.stages, min_parts=None)


def _child_of(pod: PodRecord, js: JobSetRecord
              ) -> tuple[GangKey, ReplicatedJob] | InvalidGang:
    """The pod's child Job and its replicatedJob, from the labels the controller wrote."""
    name = lookup(pod, REPLICATED_JOB) or ""
    job = next((j for j in js.jobs if j.name == name), None)
    if job is None or not job.pods:
        return InvalidGang(js.key, REPLICATED_JOB, shown(name),
                           f"names no replicatedJob of JobSet {js.key} with pods")
    raw = lookup(pod, JOB_INDEX) or ""
    text = raw.strip()
    if not (text.isascii() and text.isdigit() and len(text) <= 10) \
            or int(text) >= job.replicas:
        return InvalidGang(js.key, JOB_INDEX, shown(raw),
                           f"not an index below {name}'s {job.replicas} replicas")
    index = int(text)
    return child_job(js.key, js.key.split("/", 1)[1], name, index), job


def names_jobset(pod: PodRecord) -> str | None:
    """The JobSet whose object a pod's resolution reads: its pods are resolved again when
    it comes, changes or goes."""
    return lookup(pod, JOBSET_NAME)


CONVENTION = Convention(
    JOBSET,
    declares=(_OptIn(OPT_IN, "annotation"),),
    from_object=_from_object,
    refine=_refine,
    watches=WATCHES,
    reads_object=names_jobset,
)
