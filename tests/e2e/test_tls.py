"""The verbs over TLS: scheduler-config/lockstep-https.yaml with a CA kube-scheduler verifies."""

from __future__ import annotations

from pathlib import Path

import yaml

from testbed.bins import REPO
from testbed.certs import make_certs
from testbed.workloads import gang

from .conftest import ClusterFactory


def test_gang_binds_end_to_end_over_https(cluster: ClusterFactory, tmp_path: Path) -> None:
    c = cluster("tiny-3x2", lockstep=False)
    certs = make_certs(tmp_path)
    ca, crt, key = certs.ca, certs.cert, certs.key
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
