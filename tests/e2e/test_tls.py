"""The verbs over TLS: scheduler-config/lockstep-https.yaml with a CA kube-scheduler verifies."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from testbed.bins import REPO
from testbed.workloads import gang

from .conftest import ClusterFactory


def make_certs(d: Path) -> tuple[Path, Path, Path]:
    """A CA and a serving certificate for 127.0.0.1 signed by it."""
    ca_key, ca, key, csr, crt = (d / n for n in ("ca.key", "ca.crt", "tls.key", "tls.csr",
                                                  "tls.crt"))
    ext = d / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    run = lambda *a: subprocess.run(a, check=True, capture_output=True)  # noqa: E731
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key),
        "-out", str(ca), "-days", "1", "-subj", "/CN=lockstep-test-ca")
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
        "-subj", "/CN=127.0.0.1")
    run("openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
        "-CAcreateserial", "-out", str(crt), "-days", "1", "-extfile", str(ext))
    return ca, crt, key


def test_gang_binds_end_to_end_over_https(cluster: ClusterFactory, tmp_path: Path) -> None:
    c = cluster("tiny-3x2", lockstep=False)
    ca, crt, key = make_certs(tmp_path)
    url = c.bed.start_lockstep(tls=(crt, key))
    assert url.startswith("https://")
    c.lockstep_url = url
    config = yaml.safe_load((REPO / "scheduler-config" / "lockstep-https.yaml").read_text())
    ext = config["extenders"][0]
    assert ext["enableHTTPS"] is True and ext["urlPrefix"].startswith("https://")
    ext["tlsConfig"]["caFile"] = str(ca)  # the only site-specific value besides addresses
    path = tmp_path / "lockstep-https.yaml"
    path.write_text(yaml.safe_dump(config))
    c.bed.start_scheduler(path, name="lockstep-scheduler", extender_url=url)
    c.create(*gang("secure", 2))
    c.wait_bound(c.names("secure", 2), 30)
    c.recorder.assert_gang_invariants(c.ns)
    log = (c.bed.dir / "lockstep-scheduler.log").read_text()
    assert "x509:" not in log and "tls: " not in log  # no verification errors
