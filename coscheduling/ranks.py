"""A member's rank: the index its workload controller gave it, read from its labels.

Distributed training talks most to its neighbours in rank (a ring, a pipeline stage), so
placement keeps adjacent ranks together (``placement.rankorder``). The rank is read once,
with the pod's record (``records.pod_from_json``), from the first of these a pod carries:

1. Lockstep's own annotation ``lockstep.dev/rank`` (a user's word beats a controller's);
2. a JobSet's pod: ``jobset.sigs.k8s.io/job-index`` (label), then its Job's completion index;
3. an Indexed Job's pod: ``batch.kubernetes.io/job-completion-index`` (annotation since
   Kubernetes 1.21, label since 1.28);
4. a PyTorchJob's (Kubeflow training-operator) pod: ``training.kubeflow.org/replica-type``
   (the Master before the Workers) then ``training.kubeflow.org/replica-index``;
5. a LeaderWorkerSet's pod: ``leaderworkerset.sigs.k8s.io/group-index`` (0 when absent),
   then ``leaderworkerset.sigs.k8s.io/worker-index``;
6. a StatefulSet's pod: its ordinal, ``apps.kubernetes.io/pod-index`` (1.28 and later).

A JobSet's pod carries a completion index too, so JobSet is read before the plain Job.
A rank is a tuple compared in order (a JobSet's Job, then the pod in it), so no count of
pods per Job is needed. Each part is a non-negative decimal below :data:`MAX_RANK` (the
largest gang ``--max-gang-size`` allows); a value that is not is no rank at all, read no
further: a bad annotation never raises and never falls through to a lower source.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["MAX_RANK", "RANK_ANNOTATION", "Rank", "format_rank", "rank_of"]

RANK_ANNOTATION = "lockstep.dev/rank"
JOB_INDEX = "batch.kubernetes.io/job-completion-index"
JOBSET_JOB_INDEX = "jobset.sigs.k8s.io/job-index"
PYTORCH_TYPE = "training.kubeflow.org/replica-type"
PYTORCH_INDEX = "training.kubeflow.org/replica-index"
LWS_GROUP = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER = "leaderworkerset.sigs.k8s.io/worker-index"
STATEFULSET_ORDINAL = "apps.kubernetes.io/pod-index"

MAX_RANK = 2**31 - 1
"""Every part of a rank is below this: the largest gang ``--max-gang-size`` accepts (and
Kubernetes' indexes are int32)."""

Rank = tuple[int, ...]
"""Compared in order: the JobSet's Job before the pod in it, the Master before Workers."""

_PYTORCH_ORDER = {"master": 0, "worker": 1}
"""training-operator writes the replica type in lower case; other types (a PS, say) come
after the Workers."""


def _index(raw: str | None) -> int | None:
    """A non-negative decimal below :data:`MAX_RANK`, or None: ASCII digits only (``int()``
    also reads other scripts' digits, signs and spaces), read only when short."""
    if raw is None or not raw.isascii() or not raw.isdigit() or len(raw) > 10:
        return None
    v = int(raw)
    return v if v < MAX_RANK else None


def rank_of(labels: Mapping[str, str], annotations: Mapping[str, str]) -> Rank | None:
    """The pod's rank from the first source it carries (module docstring), or None."""
    if RANK_ANNOTATION in annotations:
        own = _index(annotations[RANK_ANNOTATION])
        return None if own is None else (own,)
    completion = labels.get(JOB_INDEX, annotations.get(JOB_INDEX))
    if JOBSET_JOB_INDEX in labels:
        job, pod = _index(labels[JOBSET_JOB_INDEX]), _index(completion)
        return None if job is None or pod is None else (job, pod)
    if completion is not None:
        got = _index(completion)
        return None if got is None else (got,)
    if PYTORCH_INDEX in labels:
        kind = _PYTORCH_ORDER.get(labels.get(PYTORCH_TYPE, "").lower(), len(_PYTORCH_ORDER))
        got = _index(labels[PYTORCH_INDEX])
        return None if got is None else (kind, got)
    if LWS_WORKER in labels:
        group = _index(labels.get(LWS_GROUP, "0"))
        got = _index(labels[LWS_WORKER])
        return None if group is None or got is None else (group, got)
    if STATEFULSET_ORDINAL in labels:
        got = _index(labels[STATEFULSET_ORDINAL])
        return None if got is None else (got,)
    return None


def format_rank(rank: Rank | None) -> str | None:
    """As explain and the page show it: ``3``, or ``1.3`` for a JobSet's Job 1, pod 3."""
    return None if rank is None else ".".join(map(str, rank))
