"""The convention registry is the one list every reader of gang declarations follows: each
registered key makes the webhook gate a pod and the resolver find its gang."""

from __future__ import annotations

from typing import Any

import pytest

from coscheduling import pod_from_json
from coscheduling.conventions import REGISTRY, Key, Source, jobset, lws, resolve
from coscheduling.gang.gating import declares_gang
from coscheduling.podgroup import GangDefaults, GangSpec, Membership, MissingPodGroup
from tests.builders import pod

READ_FROM_WORKLOAD = (jobset.JOBSET, lws.LWS)
"""Conventions whose key's value is not the gang's name as written: they read the pods
their controller made (tests/unit/coscheduling/conventions/test_jobset.py, test_lws.py)."""
KEYS = [pytest.param(c.source, k, id=f"{c.source.value}:{k.name}")
        for c in REGISTRY for k in c.declares if c.source not in READ_FROM_WORKLOAD]


SHIPPED = (Source.LOCKSTEP, Source.SCHEDULER_PLUGINS, Source.VOLCANO, Source.KOORDINATOR,
           Source.KUEUE, Source.UPSTREAM, jobset.JOBSET, lws.LWS)


def test_every_source_is_registered_once() -> None:
    assert sorted(c.source.value for c in REGISTRY) == sorted(s.value for s in SHIPPED)


def with_key(key: Key, value: str) -> dict[str, Any]:
    obj = pod("p-0").gpu(1).build()
    meta = obj["metadata"]
    (meta["labels"] if key.on == "label" else meta["annotations"])[key.name] = value
    return obj


@pytest.mark.parametrize(("source", "key"), KEYS)
def test_each_declaring_key_is_gated_by_the_webhook_and_found_by_the_resolver(
    source: Source, key: Key,
) -> None:
    obj = with_key(key, "train")
    assert declares_gang(obj)
    conv = next(c for c in REGISTRY if c.source is source)
    for size, _ in conv.size[:1]:
        obj["metadata"]["annotations"][size.name] = "2"
    m: Membership = resolve(pod_from_json(obj), {}, GangDefaults())
    # A convention with a PodGroup object waits for it; the others resolve from the pod.
    if conv.podgroup is not None and not conv.size:
        assert isinstance(m, MissingPodGroup) and m.key == "default/train"
    elif conv.podgroup is not None:
        assert isinstance(m, MissingPodGroup | GangSpec)
    else:
        assert isinstance(m, GangSpec) and m.key == "default/train" and m.min_member == 2
        assert m.source is source


@pytest.mark.parametrize("source", READ_FROM_WORKLOAD, ids=lambda s: s.value)
def test_the_workload_conventions_keys_are_gated_by_the_webhook(source: Source) -> None:
    (key,) = next(c for c in REGISTRY if c.source is source).declares
    assert declares_gang(with_key(key, "jobset"))


def test_the_upstream_convention_declares_by_spec_fields() -> None:
    obj = pod("p-0").gpu(1).build()
    assert not declares_gang(obj)
    obj["spec"]["schedulingGroup"] = {"podGroupName": "train"}
    assert declares_gang(obj)
