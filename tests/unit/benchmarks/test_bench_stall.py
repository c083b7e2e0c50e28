"""The stall benchmark runs end to end on a tiny cluster: a real victim search and every
hostile shape, with the probes answered throughout."""

from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer

from benchmarks import stall


def test_the_probes_answer_through_a_victim_search_hostile_pods_and_big_gangs() -> None:
    got = stall.run(nodes=64, gangs=1, hostile=15, idle_seconds=0.3, big=10, dra_nodes=4,
                    dra_list=2)
    rows = {(r["phase"], r["probe"]): r for r in got["rows"]}
    big = [f"{kind} gang {via} {gpus}gpu" for kind in ("big", "all-different")
           for via, gpus in stall.BIG_GANGS]
    dra = [f"dra {case}" for case in stall.DRA_CASES]
    assert set(rows) == {(ph, p) for ph in ("idle", "preemption", "hostile", *big, *dra)
                         for p in stall.PROBES}
    for (phase, probe), r in rows.items():
        assert r["n"] >= 1 and r["errors"] == 0 and r["failed"] == [], (phase, probe, r)
    assert rows[("preemption", "healthz")]["load_calls"] >= 1
    # The one gang asked until its victim search ended, with a set or a reason.
    (search,) = got["searches"]
    assert search[0] > 0 and search[1] and "searching for victims" not in search[1]
    assert all(isinstance(r["loop_held_max_s"], float) for r in rows.values())
    assert rows[("hostile", "healthz")]["load_calls"] == 15
    # No hostile pod makes the webhook or the filter verb fail, and the server lives on.
    assert got["hostile_5xx"] == [] and got["alive_after"]
    # Each big gang was planned whole by its one call: admitted, or its last member pinned.
    outcomes = {(b["gang"], b["via"], b["gpus"]): b["outcome"] for b in got["big_outcomes"]}
    assert {k[1:] for k in outcomes} == set(stall.BIG_GANGS) and len(outcomes) == 8
    for (_, via, _), text in outcomes.items():
        assert text.startswith("admitted onto" if via == "filter" else "pinned to"), text
    # Each DRA gang was answered: the nested selector's fits (its expression is true), the
    # other two do not fit anywhere.
    dra_out = {d["case"]: d["outcome"] for d in got["dra_outcomes"]}
    assert list(dra_out) == list(stall.DRA_CASES)
    assert dra_out["nested all"].startswith("admitted onto"), dra_out
    assert not dra_out["16 claims x 32 requests"].startswith("admitted"), dra_out
    assert not dra_out["selector matches nothing"].startswith("admitted"), dra_out


def test_the_all_different_gangs_ask_each_their_own_cpu_and_the_dra_gangs_their_claims(
) -> None:
    name, members = stall.big_gang("filter", 1, 5, different=True)
    assert name == "diff-filter-1"
    cpus = [m["spec"]["containers"][0]["resources"]["requests"]["cpu"] for m in members]
    assert cpus == ["1000m", "1001m", "1002m", "1003m", "1004m"]
    templates, pods = stall.dra_objects(15)
    assert stall.nested_selector(15).count(".all(") == 3
    assert templates[0]["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"] == [
        {"cel": {"expression": stall.nested_selector(15)}}]
    assert len(templates[1]["spec"]["spec"]["devices"]["requests"]) == 32
    assert [len(p["spec"]["resourceClaims"]) for p in pods] == [1, 16, 1]
    assert all(p["metadata"]["annotations"]["lockstep.dev/min-member"] == "1" for p in pods)


def test_every_hostile_shape_is_distinct_and_named_uniquely() -> None:
    pods = stall.hostile_pods(30)
    assert len({p["metadata"]["name"] for p in pods}) == 30
    shapes = {repr((p["metadata"]["annotations"], p["metadata"]["labels"],
                    "affinity" in p["spec"])) for p in pods}
    assert len(shapes) == 15  # the cycle covers every shape twice


def test_a_failed_probe_keeps_what_the_server_answered() -> None:
    """A probe's errors come with the first answers that made them errors (before: only a
    count, so failed binds could not be told apart from anything else)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), stall._StubAPI)  # 404 to every GET
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        probes = stall._Probes(f"http://127.0.0.1:{server.server_address[1]}", ["n0"], ["n0"])
        stopper = threading.Timer(0.2, probes.stop.set)
        stopper.start()
        probes._loop("healthz")  # until stopped: every answer a 404
        stopper.join()
    finally:
        server.shutdown()
        server.server_close()
    assert probes.errors["healthz"] >= 1
    assert len(probes.failed["healthz"]) == min(3, probes.errors["healthz"])
    assert probes.failed["healthz"][0].startswith('404 {"kind":"Status","code":404')
    assert probes.failed["bind"] == [] and probes.errors["bind"] == 0
