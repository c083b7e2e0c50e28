"""The webhook's own certificates: issued, kept, renewed, adopted from another replica, and
served (a real TLS handshake checks what the API server would check)."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import ssl
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from app.kube.certs import (
    CA_VALIDITY,
    RENEW_BEFORE,
    SERVING_VALIDITY,
    CertBundle,
    WebhookCerts,
    ca_bundle_patch,
    issue,
    plan_secret,
    read_secret,
    secret_data,
)
from app.kube.errors import Conflict, NotFound

NOW = dt.datetime(2026, 11, 25, tzinfo=dt.UTC)
HOSTS = ["lockstep-webhook.lockstep-system.svc", "127.0.0.1"]
MWC = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/lockstep"
SECRET = "/api/v1/namespaces/lockstep-system/secrets/lockstep-webhook-cert"


def cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def secret(bundle: CertBundle, rv: str = "1") -> dict[str, Any]:
    return {"metadata": {"name": "lockstep-webhook-cert", "namespace": "lockstep-system",
                         "resourceVersion": rv}, "type": "kubernetes.io/tls",
            "data": secret_data(bundle)}


def test_issued_certificate_names_the_hosts_and_chains_to_its_ca() -> None:
    b = issue(HOSTS, NOW)
    leaf, ca = cert(b.cert), cert(b.ca_cert)
    leaf.verify_directly_issued_by(ca)
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [HOSTS[0]]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == [HOSTS[1]]
    assert leaf.not_valid_after_utc == NOW + SERVING_VALIDITY
    assert ca.not_valid_after_utc == NOW + CA_VALIDITY
    assert leaf.not_valid_before_utc < NOW  # an API server whose clock lags accepts it
    assert b.ca_bundle == b.ca_cert


def test_a_bundle_round_trips_through_a_secret() -> None:
    b = issue(HOSTS, NOW)
    assert read_secret(secret(b)) == b


@pytest.mark.parametrize(("obj", "hosts", "at", "want_write", "want_why", "want_same_ca"), [
    pytest.param(None, HOSTS, NOW, True, "missing", False, id="no-secret"),
    pytest.param({"metadata": {}}, HOSTS, NOW, True, "holds no certificate", False,
                 id="empty-secret-made-by-hand"),
    pytest.param("fresh", HOSTS, NOW + dt.timedelta(days=100), False, "", True,
                 id="fresh-is-kept"),
    pytest.param("fresh", HOSTS, NOW + SERVING_VALIDITY - RENEW_BEFORE + dt.timedelta(days=1),
                 True, "expires", True, id="near-its-end-renewed-under-the-same-ca"),
    pytest.param("fresh", [*HOSTS, "lockstep-webhook.other.svc"], NOW, True,
                 "does not name lockstep-webhook.other.svc", True, id="new-host-renewed"),
    pytest.param("garbage", HOSTS, NOW, True, "unreadable", False, id="garbage-replaced"),
])
def test_plan_secret(obj: Any, hosts: list[str], at: dt.datetime, want_write: bool,
                     want_why: str, want_same_ca: bool) -> None:
    fresh = issue(HOSTS, NOW)
    if obj == "fresh":
        obj = secret(fresh)
    elif obj == "garbage":
        obj = {"data": {k: base64.b64encode(b"not a pem").decode()
                        for k in ("ca.crt", "ca.key", "tls.crt", "tls.key")}}
    plan = plan_secret(obj, hosts, at)
    assert plan.write is want_write
    assert plan.why.startswith(want_why)
    assert (plan.bundle.ca_cert == fresh.ca_cert) is want_same_ca
    if want_write:
        leaf = cert(plan.bundle.cert)
        leaf.verify_directly_issued_by(cert(plan.bundle.ca_cert))
        assert leaf.not_valid_after_utc - at > RENEW_BEFORE


def test_a_ca_near_its_end_is_replaced_and_the_old_one_stays_trusted_until_it_expires() -> None:
    old = issue(HOSTS, NOW)
    later = NOW + CA_VALIDITY - dt.timedelta(days=200)
    # The serving certificate is renewed at this point anyway (it was issued a year long).
    plan = plan_secret(secret(old), HOSTS, later)
    assert plan.write and plan.bundle.ca_cert != old.ca_cert
    assert plan.bundle.previous_ca == old.ca_cert
    assert plan.bundle.ca_bundle == plan.bundle.ca_cert + old.ca_cert
    # Once the old CA has expired, the next renewal drops it.
    after = NOW + CA_VALIDITY + dt.timedelta(days=1) + SERVING_VALIDITY
    again = plan_secret(secret(plan.bundle), HOSTS, after - RENEW_BEFORE)
    assert again.write and again.bundle.previous_ca == b""


def test_ca_bundle_patch_sets_only_the_webhooks_that_lack_it_guarded_by_name() -> None:
    want = b"-----CA-----"
    enc = base64.b64encode(want).decode()
    config = {"webhooks": [
        {"name": "a.lockstep.dev", "clientConfig": {"service": {"name": "s"}}},
        {"name": "b.lockstep.dev", "clientConfig": {"caBundle": enc}},
        {"name": "c.lockstep.dev", "clientConfig": {"caBundle": "c3RhbGU="}},
    ]}
    assert ca_bundle_patch(config, want) == [
        {"op": "test", "path": "/webhooks/0/name", "value": "a.lockstep.dev"},
        {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": enc},
        {"op": "test", "path": "/webhooks/2/name", "value": "c.lockstep.dev"},
        {"op": "add", "path": "/webhooks/2/clientConfig/caBundle", "value": enc},
    ]
    config["webhooks"][0]["clientConfig"]["caBundle"] = enc
    config["webhooks"][2]["clientConfig"]["caBundle"] = enc
    assert ca_bundle_patch(config, want) == []


class FakeAPI:
    """The Secret and the webhook configuration, as the API server would keep them."""

    def __init__(self, *, webhook: bool = True) -> None:
        self.secret: dict[str, Any] | None = None
        self.rv = 0
        self.mwc: dict[str, Any] | None = {"webhooks": [
            {"name": "gang-gate.lockstep.dev", "clientConfig": {"service": {}}}]} \
            if webhook else None
        self.calls: list[tuple[str, str]] = []
        self.race: dict[str, Any] | None = None  # written "by another replica" before ours

    async def request(self, method: str, path: str, *, json: Any = None,
                      content_type: str = "application/json") -> Any:
        self.calls.append((method, path))
        if path == MWC:
            if self.mwc is None:
                raise NotFound(404, "NotFound", "no", path=path)
            if method == "GET":
                return self.mwc
            assert content_type == "application/json-patch+json"
            for op in json:
                i = int(op["path"].split("/")[2])
                if op["op"] == "test":
                    assert self.mwc["webhooks"][i]["name"] == op["value"]
                else:
                    self.mwc["webhooks"][i]["clientConfig"]["caBundle"] = op["value"]
            return self.mwc
        if method == "GET":
            if self.secret is None:
                raise NotFound(404, "NotFound", "no", path=path)
            return self.secret
        if self.race is not None:  # another replica wrote between our read and our write
            self.rv += 1
            self.secret, self.race = {**self.race, "metadata": {
                **self.race["metadata"], "resourceVersion": str(self.rv)}}, None
            raise Conflict(409, "AlreadyExists" if method == "POST" else "Conflict", "x",
                           path=path)
        if method == "PUT":
            assert json["metadata"]["resourceVersion"] == self.secret["metadata"][
                "resourceVersion"], "an update must carry the resourceVersion it read"
        self.rv += 1
        self.secret = {**json, "metadata": {**json["metadata"], "resourceVersion": str(self.rv)}}
        return self.secret


def make(api: FakeAPI, tmp_path: Path, clock: list[dt.datetime]) -> WebhookCerts:
    return WebhookCerts(api, namespace="lockstep-system", secret="lockstep-webhook-cert",
                        webhook_config="lockstep", hosts=HOSTS, directory=tmp_path,
                        clock=lambda: clock[0])


async def test_first_start_creates_the_secret_writes_the_files_and_sets_the_ca_bundle(
    tmp_path: Path,
) -> None:
    api, clock = FakeAPI(), [NOW]
    certs = make(api, tmp_path, clock)
    assert await certs.ensure() is True
    stored = read_secret(api.secret)
    assert stored is not None and stored == certs.bundle
    assert certs.cert_file.read_bytes() == stored.cert
    assert certs.key_file.read_bytes() == stored.key
    assert oct(certs.key_file.stat().st_mode & 0o777) == "0o600"
    assert api.mwc is not None
    assert base64.b64decode(api.mwc["webhooks"][0]["clientConfig"]["caBundle"]) == stored.ca_cert
    # A second pass writes nothing.
    api.calls.clear()
    assert await certs.ensure() is False
    assert [m for m, _ in api.calls] == ["GET", "GET"]


async def test_a_restart_serves_the_certificate_already_in_the_secret(tmp_path: Path) -> None:
    api, clock = FakeAPI(), [NOW]
    await make(api, tmp_path / "a", clock).ensure()
    first = read_secret(api.secret)
    second = make(api, tmp_path / "b", clock)
    await second.ensure()
    assert second.bundle == first
    assert ("PUT", SECRET) not in api.calls


async def test_a_replica_that_loses_the_race_adopts_the_winners_certificate(
    tmp_path: Path,
) -> None:
    api, clock = FakeAPI(), [NOW]
    theirs = issue(HOSTS, NOW)
    api.race = secret(theirs)
    certs = make(api, tmp_path, clock)
    await certs.ensure()
    assert certs.bundle == theirs
    assert certs.cert_file.read_bytes() == theirs.cert


async def test_renewal_updates_the_secret_at_the_version_read_and_reports_the_change(
    tmp_path: Path,
) -> None:
    api, clock = FakeAPI(), [NOW]
    certs = make(api, tmp_path, clock)
    await certs.ensure()
    old = certs.bundle
    assert old is not None
    clock[0] = NOW + SERVING_VALIDITY - dt.timedelta(days=10)
    assert await certs.ensure() is True
    assert ("PUT", SECRET) in api.calls
    assert certs.bundle is not None and certs.bundle.cert != old.cert
    assert certs.bundle.ca_cert == old.ca_cert  # the caBundle need not change
    assert api.secret is not None and api.secret["type"] == "kubernetes.io/tls"


async def test_a_wiped_ca_bundle_is_put_back_and_a_missing_configuration_is_no_error(
    tmp_path: Path,
) -> None:
    api, clock = FakeAPI(), [NOW]
    certs = make(api, tmp_path, clock)
    await certs.ensure()
    assert api.mwc is not None
    del api.mwc["webhooks"][0]["clientConfig"]["caBundle"]  # kubectl apply of the original
    assert await certs.ensure() is False
    assert "caBundle" in api.mwc["webhooks"][0]["clientConfig"]
    nohook = FakeAPI(webhook=False)
    assert await make(nohook, tmp_path / "n", clock).ensure() is True


async def test_the_loop_reloads_on_rotation_and_survives_api_failures(tmp_path: Path) -> None:
    api, clock = FakeAPI(), [NOW]
    certs = make(api, tmp_path, clock)
    await certs.ensure()
    changes: list[bytes] = []
    real = api.request
    failures = [1]

    async def flaky(method: str, path: str, **kw: Any) -> Any:
        if failures[0]:
            failures[0] -= 1
            from app.kube.errors import APIUnreachable
            raise APIUnreachable(path, OSError("connection refused"))
        return await real(method, path, **kw)

    api.request = flaky  # type: ignore[method-assign]
    clock[0] = NOW + SERVING_VALIDITY
    task = asyncio.create_task(certs.run(lambda: changes.append(certs.cert_file.read_bytes()),
                                         period=0.01))
    for _ in range(200):
        await asyncio.sleep(0.01)
        if changes:
            break
    task.cancel()
    assert len(changes) == 1 and certs.bundle is not None and changes[0] == certs.bundle.cert


async def _peer_serial(port: int, ca: bytes, host: str) -> int:
    ctx = ssl.create_default_context(cadata=ca.decode())
    _reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx,
                                                   server_hostname=host)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    return x509.load_der_x509_certificate(der).serial_number


async def test_served_over_tls_as_the_api_server_checks_it_and_reloaded_in_place(
    tmp_path: Path,
) -> None:
    real_now = dt.datetime.now(dt.UTC)
    # Issued long ago: ten days left, so the check at the real time renews it.
    api, clock = FakeAPI(), [real_now - SERVING_VALIDITY + dt.timedelta(days=10)]
    certs = make(api, tmp_path, clock)
    await certs.ensure()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(certs.cert_file, certs.key_file)

    async def hello(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.close()

    server = await asyncio.start_server(hello, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    try:
        assert certs.bundle is not None
        first = certs.bundle
        for host in HOSTS:  # the Service's DNS name and the test bed's IP both verify
            assert await _peer_serial(port, first.ca_bundle, host) == cert(
                first.cert).serial_number
        with pytest.raises(ssl.SSLCertVerificationError):
            await _peer_serial(port, first.ca_bundle, "lockstep-webhook.elsewhere.svc")
        clock[0] = real_now
        assert await certs.ensure() is True
        server_ctx.load_cert_chain(certs.cert_file, certs.key_file)  # what the reload does
        assert await _peer_serial(port, first.ca_bundle, HOSTS[0]) == cert(
            certs.bundle.cert).serial_number
    finally:
        server.close()
        await server.wait_closed()
