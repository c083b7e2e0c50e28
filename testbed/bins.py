"""Where the Go-built binaries live: ``$LOCKSTEP_CACHE/bin/<name>-<version>/<name>``."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

__all__ = ["REPO", "VERSIONS", "BinaryMissing", "bin_path", "ensure_bins"]

REPO = Path(__file__).resolve().parent.parent
_ENV = Path(__file__).with_name("versions.env")


def _versions() -> dict[str, str]:
    out = {}
    for line in _ENV.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k] = v
    return out


VERSIONS = _versions()
_VERSION_OF = {
    "etcd": VERSIONS["ETCD_VERSION"],
    "kube-apiserver": VERSIONS["K8S_VERSION"],
    "kube-scheduler": VERSIONS["K8S_VERSION"],
    "kubectl": VERSIONS["K8S_VERSION"],
    "kwok": VERSIONS["KWOK_VERSION"],
    "scheduler-plugins": VERSIONS["SCHEDULER_PLUGINS_VERSION"],
}


class BinaryMissing(FileNotFoundError):
    pass


def cache_dir() -> Path:
    return Path(os.environ.get("LOCKSTEP_CACHE", Path.home() / ".cache" / "lockstep"))


def bin_path(name: str) -> Path:
    p = cache_dir() / "bin" / f"{name}-{_VERSION_OF[name]}" / name
    if not p.exists():
        raise BinaryMissing(f"{p} is missing: run `make bins` (builds it from the Go module proxy)")
    return p


def ensure_bins() -> None:
    """Build whatever is missing (a no-op when all are present)."""
    subprocess.run(["bash", str(REPO / "hack" / "build-bins.sh")], check=True)
