"""Certificates for the test bed's TLS servers, made with ``openssl`` (the bed needs it anyway).

``make_certs`` writes a CA and a serving certificate it signed: what a client that verifies
needs (kube-scheduler calling Lockstep over HTTPS, the API server calling Lockstep's admission
webhook with the CA as ``caBundle``, or a webhook server that only has to present some
certificate, like the training-operator's).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Certs", "make_certs"]


@dataclass(frozen=True)
class Certs:
    ca: Path
    """The CA certificate (PEM): a client's trust root, a webhook's ``caBundle``."""
    cert: Path
    key: Path


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def make_certs(d: Path, *, cn: str = "127.0.0.1", ips: tuple[str, ...] = ("127.0.0.1",),
               dns: tuple[str, ...] = (), days: int = 2, ca_cn: str = "lockstep-test-ca",
               ca_dns: tuple[str, ...] = ()) -> Certs:
    """A CA and a serving certificate for ``ips`` and ``dns`` names, in ``d``.

    ``ca_cn`` and ``ca_dns``: the CA's common name and DNS names (open-policy-agent's
    cert-controller, which Kueue runs, keeps a CA only if it verifies for its CA name).

    Files already there are kept (a restarted server keeps its certificate and the clients
    that trust its CA keep working)."""
    d.mkdir(parents=True, exist_ok=True)
    certs = Certs(d / "ca.crt", d / "tls.crt", d / "tls.key")
    if certs.ca.exists() and certs.cert.exists() and certs.key.exists():
        return certs
    ca_key, csr, ext = d / "ca.key", d / "tls.csr", d / "san.ext"
    sans = ",".join([*(f"IP:{ip}" for ip in ips), *(f"DNS:{n}" for n in dns)])
    ext.write_text(f"subjectAltName={sans}\nextendedKeyUsage=serverAuth\n")
    ca_ext = ("-addext", "subjectAltName=" + ",".join(f"DNS:{n}" for n in ca_dns)) \
        if ca_dns else ()
    _run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key),
         "-out", str(certs.ca), "-days", str(days), "-subj", f"/CN={ca_cn}", *ca_ext)
    _run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(certs.key),
         "-out", str(csr), "-subj", f"/CN={cn}")
    _run("openssl", "x509", "-req", "-in", str(csr), "-CA", str(certs.ca), "-CAkey",
         str(ca_key), "-CAcreateserial", "-out", str(certs.cert), "-days", str(days),
         "-extfile", str(ext))
    return certs
