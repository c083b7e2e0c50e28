"""--topology-levels (app/kube/levels.py): a site's own rack labels, or a clear refusal."""

from __future__ import annotations

import pytest

from app import cli
from app.kube.levels import LevelsError, parse_levels
from coscheduling.records import NodeName, NodeRecord
from coscheduling.topology.domains import domain_of


def test_levels_are_read_coarse_to_fine_with_every_key() -> None:
    levels = parse_levels(" zone=topology.kubernetes.io/zone; rack=example.com/rack, "
                          "lockstep.dev/rack ;hostname=kubernetes.io/hostname;")
    assert [(lv.name, lv.keys) for lv in levels] == [
        ("zone", ("topology.kubernetes.io/zone",)),
        ("rack", ("example.com/rack", "lockstep.dev/rack")),
        ("hostname", ("kubernetes.io/hostname",)),
    ]


def test_a_sites_own_rack_label_makes_the_rack_domain() -> None:
    levels = parse_levels("rack=example.com/rack,lockstep.dev/rack;"
                          "hostname=kubernetes.io/hostname")
    node = NodeRecord(name=NodeName("n1"), allocatable={}, labels={"example.com/rack": "r7"})
    assert domain_of(levels, 0, node) == ("r7",)
    assert domain_of(levels, 1, node) == ("r7", "n1")
    # the second key, where the first is missing
    other = NodeRecord(name=NodeName("n2"), allocatable={}, labels={"lockstep.dev/rack": "r8"})
    assert domain_of(levels, 0, other) == ("r8",)


@pytest.mark.parametrize(("text", "says"), [
    ("", "no levels"),
    ("rack", "expected name=label-key"),
    ("Rack=a/b;hostname=kubernetes.io/hostname", "expected name=label-key"),
    ("rack=;hostname=kubernetes.io/hostname", "has no label key"),
    ("rack=not a key;hostname=kubernetes.io/hostname", "is not a label key"),
    ("rack=a/b;rack=c/d;hostname=kubernetes.io/hostname", "named twice"),
    ("rack=example.com/rack", "the last level must be the node"),
])
def test_bad_levels_are_refused_naming_the_part(text: str, says: str) -> None:
    with pytest.raises(LevelsError, match=says):
        parse_levels(text)


def test_serve_refuses_bad_levels_before_it_starts(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", "--topology-levels", "rack=example.com/rack"]) == 2
    assert "--topology-levels: the last level must be the node" in capsys.readouterr().err


def test_levels_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKSTEP_TOPOLOGY_LEVELS", "hostname=kubernetes.io/hostname")
    parser = cli.argparse.ArgumentParser()
    cli._serve_parser(parser.add_subparsers())
    assert parser.parse_args(["serve"]).topology_levels == "hostname=kubernetes.io/hostname"
