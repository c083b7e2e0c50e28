"""The lockstep CLI against a fake running instance (httpx.get patched at the seam)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from app import cli

GANGS = {"gangs": [
    {"gang": "ml/train", "phase": "Admitted", "minMember": 4, "members": 4, "bound": 0,
     "parked": 3, "reservation": {"ml/train-0": "n0"}, "deadlineInSeconds": 41.5,
     "reason": None},
    {"gang": "ml/eval", "phase": "Waiting", "minMember": 2, "members": 1, "bound": 0,
     "parked": 0, "reservation": {}, "deadlineInSeconds": None,
     "reason": "gang ml/eval: 1/2 members exist, waiting for 1 more"},
]}


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    asked: list[str] = []

    def fake_get(url: str, **_: Any) -> httpx.Response:
        asked.append(url)
        req = httpx.Request("GET", url)
        if url.endswith("/debug/gangs"):
            return httpx.Response(200, json=GANGS, request=req)
        if url.endswith("/debug/pods/ml/train-0"):
            return httpx.Response(200, request=req, json={
                "pod": "ml/train-0", "explanation": "assumed on n0 and parked",
                "gang": GANGS["gangs"][0]})
        if url.endswith("/readyz"):
            return httpx.Response(503, text="not ready: cache not synced: pods", request=req)
        return httpx.Response(404, json={"error": "pod ml/ghost is not known"}, request=req)

    monkeypatch.setattr(httpx, "get", fake_get)
    return asked


def test_status_prints_a_table_of_gangs(served: list[str], capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    assert cli.main(["status", "--url", "http://x:1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["GANG", "PHASE", "MIN", "MEMBERS"]
    assert lines[1].split()[:6] == ["ml/train", "Admitted", "4", "4", "0", "3"]
    assert lines[2].endswith("gang ml/eval: 1/2 members exist, waiting for 1 more")
    assert served == ["http://x:1/debug/gangs"]


def test_explain_prints_the_reason(served: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["explain", "ml/train-0", "--url", "http://x:1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ml/train-0: assumed on n0 and parked")
    assert "0/4 bound, 3 parked" in out


def test_explain_unknown_pod_exits_with_the_servers_message(served: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["explain", "ml/ghost", "--url", "http://x:1"])
    assert "pod ml/ghost is not known" in str(e.value)


def test_probe_fails_when_not_ready(served: list[str]) -> None:
    assert cli.main(["probe", "/readyz", "--url", "http://x:1"]) == 1


@pytest.mark.parametrize("argv", [
    pytest.param(["serve", "--max-timeout", "0"], id="zero-timeout"),
    pytest.param(["serve", "--tls-cert", "c.pem"], id="cert-without-key"),
    pytest.param(["serve", "--webhook-port", "9443"], id="webhook-without-tls"),
    pytest.param(["serve", "--webhook-cert", "c.pem", "--webhook-key", "k.pem"],
                 id="webhook-tls-without-port"),
    pytest.param(["serve", "--webhook-port", "70000", "--webhook-cert", "c.pem",
                  "--webhook-key", "k.pem"], id="webhook-port-out-of-range"),
    pytest.param(["serve", "--webhook-port", "9443", "--webhook-cert", "/nonexistent/c.pem",
                  "--webhook-key", "/nonexistent/k.pem"], id="webhook-cert-missing"),
    pytest.param(["serve", "--webhook-cert-secret", "lockstep-system/cert"],
                 id="own-cert-without-port"),
    pytest.param(["serve", "--webhook-port", "9443", "--webhook-cert-secret", "cert"],
                 id="own-cert-secret-without-namespace"),
    pytest.param(["serve", "--webhook-port", "9443", "--webhook-cert-secret", "a/b/c"],
                 id="own-cert-secret-with-two-slashes"),
    pytest.param(["serve", "--webhook-port", "9443", "--webhook-cert-secret", "ns/cert",
                  "--webhook-cert", "c.pem", "--webhook-key", "k.pem"],
                 id="own-cert-and-files"),
])
def test_serve_rejects_bad_settings(argv: list[str]) -> None:
    assert cli.main(argv) == 2


def test_serve_reads_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKSTEP_PORT", "9999")
    monkeypatch.setenv("LOCKSTEP_MAX_TIMEOUT", "100")
    parser = cli.argparse.ArgumentParser()
    cli._serve_parser(parser.add_subparsers())
    args = parser.parse_args(["serve"])
    assert args.port == 9999 and args.max_timeout == 100.0


def test_defrag_is_on_by_default_and_off_with_one_flag() -> None:
    parser = cli.argparse.ArgumentParser()
    cli._serve_parser(parser.add_subparsers())
    args = parser.parse_args(["serve"])
    assert (args.defrag, args.defrag_after, args.defrag_rate) == (True, 30.0, 10)
    assert parser.parse_args(["serve", "--defrag=false"]).defrag is False


@pytest.mark.parametrize("flag", ["--defrag-after=-1", "--defrag-after=1e9",
                                  "--defrag-after=nan", "--defrag-rate=1001",
                                  "--defrag-rate=-3", "--defrag-rate=2.5"])
def test_defrag_numbers_are_bounded_before_use(flag: str) -> None:
    parser = cli.argparse.ArgumentParser()
    cli._serve_parser(parser.add_subparsers())
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", flag])


def test_webhook_settings_read_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKSTEP_WEBHOOK_PORT", "9443")
    monkeypatch.setenv("LOCKSTEP_WEBHOOK_CERT", "/certs/tls.crt")
    monkeypatch.setenv("LOCKSTEP_WEBHOOK_KEY", "/certs/tls.key")
    parser = cli.argparse.ArgumentParser()
    cli._serve_parser(parser.add_subparsers())
    args = parser.parse_args(["serve"])
    assert (args.webhook_port, args.webhook_host, args.webhook_cert, args.webhook_key) == (
        9443, "0.0.0.0", "/certs/tls.crt", "/certs/tls.key")
    assert parser.parse_args(["serve", "--webhook-port", "8443"]).webhook_port == 8443


def test_own_certificate_settings_and_the_names_it_covers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOCKSTEP_WEBHOOK_PORT", "9443")
    monkeypatch.setenv("LOCKSTEP_WEBHOOK_CERT_SECRET", "lockstep-system/lockstep-webhook-cert")
    parser = cli.argparse.ArgumentParser()
    cli._serve_parser(parser.add_subparsers())
    args = parser.parse_args(["serve", "--webhook-hosts", "127.0.0.1, ::1"])
    assert cli._webhook_problem(args) is None
    assert args.webhook_configuration == "lockstep"
    assert cli._webhook_hosts(args) == [
        "lockstep-webhook.lockstep-system.svc",
        "lockstep-webhook.lockstep-system.svc.cluster.local", "127.0.0.1", "::1"]
