"""A member's rank read from each source a workload controller writes, in precedence order;
bad values are no rank (never an exception, never a lower source's index instead)."""

from __future__ import annotations

import pytest

from coscheduling.ranks import MAX_RANK, format_rank, rank_of
from coscheduling.records import pod_from_json
from tests.builders import pod

JOB = "batch.kubernetes.io/job-completion-index"


@pytest.mark.parametrize(("labels", "annotations", "rank"), [
    ({}, {"lockstep.dev/rank": "7"}, (7,)),
    ({}, {JOB: "3"}, (3,)),                                      # Indexed Job (annotation)
    ({JOB: "4"}, {}, (4,)),                                      # Indexed Job (label, 1.28+)
    ({"jobset.sigs.k8s.io/job-index": "2", JOB: "5"}, {JOB: "5"}, (2, 5)),
    ({"training.kubeflow.org/replica-type": "master",
      "training.kubeflow.org/replica-index": "0"}, {}, (0, 0)),
    ({"training.kubeflow.org/replica-type": "worker",
      "training.kubeflow.org/replica-index": "3"}, {}, (1, 3)),
    ({"training.kubeflow.org/replica-type": "Worker",
      "training.kubeflow.org/replica-index": "1"}, {}, (1, 1)),
    ({"leaderworkerset.sigs.k8s.io/group-index": "1",
      "leaderworkerset.sigs.k8s.io/worker-index": "2"}, {}, (1, 2)),
    ({"leaderworkerset.sigs.k8s.io/worker-index": "2"}, {}, (0, 2)),
    ({"apps.kubernetes.io/pod-index": "6"}, {}, (6,)),
    ({"app": "x"}, {}, None),
])
def test_each_source_is_read(labels: dict[str, str], annotations: dict[str, str],
                             rank: tuple[int, ...] | None) -> None:
    assert rank_of(labels, annotations) == rank


def test_precedence_own_annotation_then_jobset_then_job_then_the_rest() -> None:
    every = {"jobset.sigs.k8s.io/job-index": "1", JOB: "2",
             "training.kubeflow.org/replica-index": "3",
             "leaderworkerset.sigs.k8s.io/worker-index": "4", "apps.kubernetes.io/pod-index": "5"}
    assert rank_of(every, {"lockstep.dev/rank": "9"}) == (9,)
    assert rank_of(every, {}) == (1, 2)
    del every["jobset.sigs.k8s.io/job-index"]
    assert rank_of(every, {}) == (2,)
    del every[JOB]
    assert rank_of(every, {}) == (2, 3)  # no replica type: after Master and Workers
    del every["training.kubeflow.org/replica-index"]
    assert rank_of(every, {}) == (0, 4)
    del every["leaderworkerset.sigs.k8s.io/worker-index"]
    assert rank_of(every, {}) == (5,)


@pytest.mark.parametrize("bad", ["-1", "+1", " 1", "1.0", "", "x", "\u0661", "\u00b2",
                                 str(MAX_RANK), "9" * 11, "9" * 5000])
def test_a_bad_value_is_no_rank_and_no_fall_through(bad: str) -> None:
    assert rank_of({}, {"lockstep.dev/rank": bad}) is None
    assert rank_of({"apps.kubernetes.io/pod-index": "1"}, {"lockstep.dev/rank": bad}) is None
    assert rank_of({JOB: bad}, {}) is None
    assert rank_of({"jobset.sigs.k8s.io/job-index": "0", JOB: bad}, {}) is None
    assert rank_of({"jobset.sigs.k8s.io/job-index": bad, JOB: "0"}, {}) is None
    assert rank_of({"training.kubeflow.org/replica-index": bad}, {}) is None
    assert rank_of({"leaderworkerset.sigs.k8s.io/worker-index": "0",
                    "leaderworkerset.sigs.k8s.io/group-index": bad}, {}) is None
    assert rank_of({"apps.kubernetes.io/pod-index": bad}, {}) is None


def test_the_largest_rank_is_below_the_largest_gang() -> None:
    assert rank_of({}, {"lockstep.dev/rank": str(MAX_RANK - 1)}) == (MAX_RANK - 1,)


def test_the_record_parses_it_once() -> None:
    rec = pod_from_json(pod("p").annotate("lockstep.dev/rank", "12").build())
    assert rec.rank == (12,)
    assert pod_from_json(pod("q").annotate("lockstep.dev/rank", "-3").build()).rank is None
    assert pod_from_json(pod("r").build()).rank is None


def test_shown_as_dotted_parts() -> None:
    assert format_rank((3,)) == "3"
    assert format_rank((1, 3)) == "1.3"
    assert format_rank(None) is None
