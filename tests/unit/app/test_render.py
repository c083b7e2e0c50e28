"""Every reason the core can give has words: ``app.render.render`` answers each variant of
``coscheduling.reasons.Reason`` (an Event, a condition or a bind answer would otherwise end
in an AssertionError at the edge)."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from app.render import render
from coscheduling.podgroup import InvalidGang
from coscheduling.reasons import NoFit, Reason, TimedOut

SAMPLES: dict[str, object] = {
    "int": 3, "float": 1.5, "str": "default/p", "GangKey": "default/g", "PodKey": "default/p",
    "NodeName": "n0", "Resources": {"nvidia.com/gpu": 8},
    "NoFit": NoFit(members=4, shape={"nvidia.com/gpu": 8}, free_units=2, eligible_nodes=3),
    "InvalidGang": InvalidGang("default/g", "lockstep.dev/min-member", "0", "must be >= 1"),
    "TimedOut": TimedOut("default/g", 1, 4, 30.0, ("default/p",)),
}


def _sample(annotation: str) -> object:
    """A value of the field's type: the first member of a union, one item of a tuple."""
    first = annotation.split("|")[0].strip()
    if first.startswith("tuple["):
        return (_sample(first[len("tuple["):].split(",")[0].rstrip("]")),)
    return SAMPLES[first]


def _instance(cls: type) -> object:
    fields = dataclasses.fields(cls)
    return cls(**{f.name: _sample(str(f.type)) for f in fields if f.init})


@pytest.mark.parametrize("cls", typing.get_args(Reason), ids=lambda c: c.__name__)
def test_every_reason_renders_with_its_gang_or_node_named(cls: type) -> None:
    reason = _instance(cls)
    text = render(reason)  # type: ignore[arg-type]
    assert text and ("default/g" in text or "n0" in text or "default/p" in text), text
