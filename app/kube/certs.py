"""Lockstep's own serving certificate for its admission webhook, so the webhook needs no
cert-manager.

The API server calls a webhook only over TLS and trusts exactly the ``caBundle`` of its
``MutatingWebhookConfiguration``. Kueue, the training-operator and Gatekeeper each manage that
themselves (Gatekeeper's ``cert-controller``: a CA for ten years, a serving certificate for one,
renewed within 30 days of its end); Lockstep does the same:

* a CA and a serving certificate live in one Secret Lockstep owns (``ca.crt``, ``ca.key``,
  ``tls.crt``, ``tls.key``), so every replica and every restart serves the same certificate;
* the Secret is created when missing and renewed when its serving certificate nears its end,
  names other hosts, or cannot be read, with optimistic concurrency (create, or update at the
  resourceVersion read), so replicas that race agree on one winner and adopt it;
* every webhook of the named ``MutatingWebhookConfiguration`` gets the CA as its
  ``caBundle``, and is put back when something (a re-apply, a Helm upgrade) wiped it.

When the CA itself nears its end a new CA signs the new serving certificate and the
``caBundle`` carries both CAs until the old one expires, so an API server holding either
trusts the served certificate throughout.

The decisions (:func:`plan_secret`, :func:`ca_bundle_patch`) are pure and take ``now``;
:class:`WebhookCerts` is the small loop that reads and writes the two objects.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import ipaddress
import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .errors import APIError, APIUnreachable, Conflict, NotFound

__all__ = [
    "CA_VALIDITY",
    "RENEW_BEFORE",
    "SERVING_VALIDITY",
    "CertBundle",
    "WebhookCerts",
    "ca_bundle_patch",
    "issue",
    "plan_secret",
    "read_secret",
    "secret_data",
]

log = logging.getLogger("lockstep.certs")

CA_VALIDITY = dt.timedelta(days=10 * 365)
SERVING_VALIDITY = dt.timedelta(days=365)
RENEW_BEFORE = dt.timedelta(days=30)
"""A certificate with less than this left is replaced (as Gatekeeper's cert-controller)."""
CLOCK_SKEW = dt.timedelta(hours=1)
"""Certificates start an hour back, so an API server whose clock is behind still accepts them."""

CA_CERT, CA_KEY, TLS_CERT, TLS_KEY = "ca.crt", "ca.key", "tls.crt", "tls.key"
OLD_CA_CERT = "ca-previous.crt"
"""The CA a renewal replaced, still trusted in the caBundle until it expires."""


@dataclass(frozen=True)
class CertBundle:
    """PEM bytes of a CA, the serving certificate it signed, and the CAs to trust."""

    ca_cert: bytes
    ca_key: bytes
    cert: bytes
    key: bytes
    previous_ca: bytes = b""

    @property
    def ca_bundle(self) -> bytes:
        """What the webhook configuration's ``caBundle`` holds: this CA and the one before it
        while that one is still valid."""
        return self.ca_cert + self.previous_ca


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _san(hosts: Sequence[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    return x509.SubjectAlternativeName(names)


def _new_ca(now: dt.datetime) -> tuple[bytes, bytes]:
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "lockstep-webhook-ca")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW).not_valid_after(now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True,
            content_commitment=False, key_encipherment=False, data_encipherment=False,
            key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def _new_serving(ca_cert_pem: bytes, ca_key_pem: bytes, hosts: Sequence[str],
                 now: dt.datetime) -> tuple[bytes, bytes]:
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key is not an EC key")
    key = _key()
    end = min(now + SERVING_VALIDITY, ca_cert.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW).not_valid_after(end)
        .add_extension(_san(hosts), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def issue(hosts: Sequence[str], now: dt.datetime,
          keep_ca: CertBundle | None = None) -> CertBundle:
    """A serving certificate for ``hosts`` (DNS names or IPs), signed by ``keep_ca``'s CA when
    given and that CA outlives the new certificate's renewal, else by a new CA (the old one is
    then kept in the bundle while still valid)."""
    if not hosts:
        raise ValueError("a serving certificate needs at least one host name")
    previous = b""
    if keep_ca is not None and _remaining(keep_ca.ca_cert, now) > SERVING_VALIDITY + RENEW_BEFORE:
        ca_cert, ca_key = keep_ca.ca_cert, keep_ca.ca_key
        previous = keep_ca.previous_ca if _remaining(keep_ca.previous_ca, now) > dt.timedelta(
            0) else b""
    else:
        ca_cert, ca_key = _new_ca(now)
        if keep_ca is not None and _remaining(keep_ca.ca_cert, now) > dt.timedelta(0):
            previous = keep_ca.ca_cert
    cert, key = _new_serving(ca_cert, ca_key, hosts, now)
    return CertBundle(ca_cert=ca_cert, ca_key=ca_key, cert=cert, key=key, previous_ca=previous)


def _remaining(pem: bytes, now: dt.datetime) -> dt.timedelta:
    """How long the first certificate in ``pem`` stays valid (zero or less: expired or none)."""
    if not pem:
        return dt.timedelta(0)
    try:
        return x509.load_pem_x509_certificate(pem).not_valid_after_utc - now
    except ValueError:
        return dt.timedelta(0)


def _problem(bundle: CertBundle, hosts: Sequence[str], now: dt.datetime) -> str | None:
    """Why ``bundle`` cannot keep serving ``hosts``, or None."""
    try:
        cert = x509.load_pem_x509_certificate(bundle.cert)
        ca = x509.load_pem_x509_certificate(bundle.ca_cert)
        key = serialization.load_pem_private_key(bundle.key, password=None)
        serialization.load_pem_private_key(bundle.ca_key, password=None)
    except (ValueError, TypeError) as e:
        return f"unreadable: {e}"
    if cert.not_valid_after_utc - now < RENEW_BEFORE:
        return f"expires {cert.not_valid_after_utc:%Y-%m-%d}"
    if ca.not_valid_after_utc - now < RENEW_BEFORE:
        return f"its CA expires {ca.not_valid_after_utc:%Y-%m-%d}"
    if cert.issuer != ca.subject:
        return "not signed by the CA beside it"
    if key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) != cert.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo):
        return "the key does not match the certificate"
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return "no subject alternative names"
    have = {str(n) for n in san.get_values_for_type(x509.DNSName)} | {
        str(n) for n in san.get_values_for_type(x509.IPAddress)}
    if missing := [h for h in hosts if h not in have]:
        return f"does not name {', '.join(missing)}"
    return None


def read_secret(obj: dict[str, Any] | None) -> CertBundle | None:
    """The bundle a Secret holds, or None when it holds none (empty, or missing a key)."""
    data = (obj or {}).get("data") or {}
    try:
        parts = {k: base64.b64decode(data[k], validate=True)
                 for k in (CA_CERT, CA_KEY, TLS_CERT, TLS_KEY)}
        previous = base64.b64decode(data.get(OLD_CA_CERT) or "", validate=True)
    except (KeyError, ValueError, TypeError):
        return None
    return CertBundle(ca_cert=parts[CA_CERT], ca_key=parts[CA_KEY], cert=parts[TLS_CERT],
                      key=parts[TLS_KEY], previous_ca=previous)


def secret_data(bundle: CertBundle) -> dict[str, str]:
    out = {CA_CERT: bundle.ca_cert, CA_KEY: bundle.ca_key, TLS_CERT: bundle.cert,
           TLS_KEY: bundle.key}
    if bundle.previous_ca:
        out[OLD_CA_CERT] = bundle.previous_ca
    return {k: base64.b64encode(v).decode() for k, v in out.items()}


@dataclass(frozen=True)
class SecretPlan:
    """What to do with the Secret: keep ``bundle`` as read, or write it (``why`` says why)."""

    bundle: CertBundle
    write: bool
    why: str = ""


def plan_secret(obj: dict[str, Any] | None, hosts: Sequence[str],
                now: dt.datetime) -> SecretPlan:
    """Keep the Secret's certificate while it can serve ``hosts`` for ``RENEW_BEFORE`` more;
    otherwise a new one, under the same CA while that CA lasts."""
    current = read_secret(obj)
    if current is None:
        why = "missing" if obj is None else "holds no certificate"
        return SecretPlan(issue(hosts, now), write=True, why=why)
    if (problem := _problem(current, hosts, now)) is None:
        return SecretPlan(current, write=False)
    return SecretPlan(issue(hosts, now, keep_ca=current if _ca_usable(current) else None),
                      write=True, why=problem)


def _ca_usable(bundle: CertBundle) -> bool:
    """Whether the bundle's CA can sign again (else a new CA replaces it)."""
    try:
        key = serialization.load_pem_private_key(bundle.ca_key, password=None)
        x509.load_pem_x509_certificate(bundle.ca_cert)
    except (ValueError, TypeError):
        return False
    return isinstance(key, ec.EllipticCurvePrivateKey)


def ca_bundle_patch(config: dict[str, Any], ca_bundle: bytes) -> list[dict[str, Any]]:
    """A JSON patch setting ``caBundle`` on every webhook of ``config`` that lacks it; empty
    when all carry it. Each change is guarded by a ``test`` of the webhook's name, so a patch
    computed from a configuration that changed since it was read fails instead of writing the
    wrong webhook."""
    want = base64.b64encode(ca_bundle).decode()
    ops: list[dict[str, Any]] = []
    for i, hook in enumerate(config.get("webhooks") or ()):
        client = hook.get("clientConfig") or {}
        if client.get("caBundle") == want:
            continue
        ops.append({"op": "test", "path": f"/webhooks/{i}/name", "value": hook.get("name")})
        ops.append({"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": want})
    return ops


class Requester(Protocol):
    """The one call :class:`WebhookCerts` needs of the API client."""

    async def request(self, method: str, path: str, *, json: Any = None,
                      content_type: str = "application/json") -> Any: ...


class WebhookCerts:
    """Keeps the Secret, the files the webhook server reads, and the ``caBundle`` in step.

    :meth:`ensure` runs once before the webhook listens; :meth:`run` then repeats it every
    ``period`` seconds and calls ``on_change`` when the files changed (the server reloads its
    TLS context: handshakes after that use the new certificate).
    """

    def __init__(self, api: Requester, *, namespace: str, secret: str, webhook_config: str,
                 hosts: Sequence[str], directory: Path | None = None,
                 clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)) -> None:
        self.api = api
        self.namespace, self.secret, self.webhook_config = namespace, secret, webhook_config
        self.hosts = list(hosts)
        self.dir = directory or Path(tempfile.mkdtemp(prefix="lockstep-webhook-"))
        self.clock = clock
        self.bundle: CertBundle | None = None

    @property
    def cert_file(self) -> Path:
        return self.dir / TLS_CERT

    @property
    def key_file(self) -> Path:
        return self.dir / TLS_KEY

    @property
    def _secret_path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/secrets/{self.secret}"

    async def ensure(self) -> bool:
        """Bring the Secret, the files and the webhook configuration up to date; True when
        the files changed."""
        bundle = await self._settle_secret()
        changed = self.bundle is None or bundle.cert != self.bundle.cert \
            or bundle.key != self.bundle.key
        if changed:
            self._write_files(bundle)
        self.bundle = bundle
        await self._settle_ca_bundle(bundle)
        return changed

    async def _settle_secret(self) -> CertBundle:
        for _ in range(5):  # a conflict means another replica wrote first: read theirs
            try:
                obj = await self.api.request("GET", self._secret_path)
            except NotFound:
                obj = None
            plan = plan_secret(obj, self.hosts, self.clock())
            if not plan.write:
                return plan.bundle
            log.info("webhook certificate in Secret %s/%s: writing a new one (%s)",
                     self.namespace, self.secret, plan.why)
            body: dict[str, Any] = {
                "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                "metadata": {"name": self.secret, "namespace": self.namespace,
                             "labels": {"app.kubernetes.io/managed-by": "lockstep"}},
                "data": secret_data(plan.bundle)}
            try:
                if obj is None:
                    await self.api.request(
                        "POST", f"/api/v1/namespaces/{self.namespace}/secrets", json=body)
                else:
                    meta = obj.get("metadata") or {}
                    body["metadata"] = {**meta, **body["metadata"],
                                        "labels": {**(meta.get("labels") or {}),
                                                   **body["metadata"]["labels"]}}
                    body["type"] = obj.get("type") or body["type"]
                    await self.api.request("PUT", self._secret_path, json=body)
            except Conflict:
                continue
            return plan.bundle
        raise RuntimeError(f"Secret {self.namespace}/{self.secret} kept changing under "
                           "Lockstep while it wrote the webhook certificate")

    def _write_files(self, bundle: CertBundle) -> None:
        """Write key then certificate, each by rename, so a reader never sees half a file."""
        self.dir.mkdir(parents=True, exist_ok=True)
        for path, data in ((self.key_file, bundle.key), (self.cert_file, bundle.cert)):
            tmp = path.with_suffix(".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            tmp.replace(path)

    async def _settle_ca_bundle(self, bundle: CertBundle) -> None:
        path = ("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/"
                f"{self.webhook_config}")
        for _ in range(5):
            try:
                config = await self.api.request("GET", path)
            except NotFound:
                log.warning("MutatingWebhookConfiguration %s not found: its caBundle is set "
                            "when it appears", self.webhook_config)
                return
            ops = ca_bundle_patch(config, bundle.ca_bundle)
            if not ops:
                return
            try:
                await self.api.request("PATCH", path, json=ops,
                                       content_type="application/json-patch+json")
                log.info("caBundle set on %d webhook(s) of %s", len(ops) // 2,
                         self.webhook_config)
                return
            except (Conflict, APIError) as e:
                if isinstance(e, Conflict) or e.status == 422:  # changed since read: again
                    continue
                raise

    async def run(self, on_change: Callable[[], None], period: float = 60.0) -> None:
        """Check every ``period`` seconds: the Secret may near its end or be rotated by
        another replica, and the caBundle may be wiped by a re-apply. API failures are
        logged and retried next period (the current certificate keeps serving)."""
        while True:
            await asyncio.sleep(period)
            try:
                if await self.ensure():
                    on_change()
            except (APIError, APIUnreachable, RuntimeError) as e:
                log.warning("webhook certificate check failed, retried in %.0f s: %s",
                            period, e)
