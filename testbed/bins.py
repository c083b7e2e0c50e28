"""Where the Go-built binaries live: ``$LOCKSTEP_CACHE/bin/<name>-<version>/<name>``.

Versions are pinned in one place, ``testbed/versions.env``, which ``hack/build-bins.sh`` reads
too, so a version bump rebuilds into a new directory and never runs a stale binary.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from pathlib import Path

__all__ = ["EXTRA_VERSIONS", "K8S_NAMES", "K8S_VERSIONS", "NAMES", "REPO", "VERSIONS",
           "BinaryMissing", "bin_path", "ensure_bins", "go_module_dir", "version_of"]

REPO = Path(__file__).resolve().parent.parent
_ENV = Path(__file__).with_name("versions.env")


def _versions() -> dict[str, str]:
    out = {}
    for line in _ENV.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k] = v.strip().strip('"')
    return out


VERSIONS = _versions()
_VERSION_OF = {
    "etcd": VERSIONS["ETCD_VERSION"],
    "kube-apiserver": VERSIONS["K8S_VERSION"],
    "kube-scheduler": VERSIONS["K8S_VERSION"],
    "kube-controller-manager": VERSIONS["K8S_VERSION"],
    "kubectl": VERSIONS["K8S_VERSION"],
    "kwok": VERSIONS["KWOK_VERSION"],
    "scheduler-plugins": VERSIONS["SCHEDULER_PLUGINS_VERSION"],
    "training-operator": VERSIONS["TRAINING_OPERATOR_VERSION"],
    "helm": VERSIONS["HELM_VERSION"],
    "kueue": VERSIONS["KUEUE_VERSION"],
    "jobset": VERSIONS["JOBSET_VERSION"],
    "lws": VERSIONS["LWS_VERSION"],
    "trainer": VERSIONS["TRAINER_VERSION"],
}

NAMES = tuple(_VERSION_OF)
K8S_NAMES = ("kube-apiserver", "kube-scheduler", "kubectl")
"""Built at every Kubernetes version in ``K8S_VERSIONS``."""
K8S_VERSIONS = (VERSIONS["K8S_VERSION"], *VERSIONS.get("K8S_EXTRA_VERSIONS", "").split())
"""The default Kubernetes version first, then the others the test bed can run."""
EXTRA_VERSIONS = {
    "training-operator": tuple(VERSIONS.get("TRAINING_OPERATOR_EXTRA_VERSIONS", "").split())}
"""Other binaries built at more than their pinned version: name -> the other versions."""


class BinaryMissing(FileNotFoundError):
    pass


def version_of(name: str) -> str:
    try:
        return _VERSION_OF[name]
    except KeyError:
        raise ValueError(f"unknown binary {name!r}; the test bed builds {NAMES}") from None


def cache_dir() -> Path:
    return Path(os.environ.get("LOCKSTEP_CACHE", Path.home() / ".cache" / "lockstep"))


def bin_path(name: str, version: str | None = None) -> Path:
    """``name`` at its pinned version, or a Kubernetes binary at ``version`` (one of
    ``K8S_VERSIONS``)."""
    if version is None or version == version_of(name):
        version = version_of(name)
    elif (name not in K8S_NAMES or version not in K8S_VERSIONS) \
            and version not in EXTRA_VERSIONS.get(name, ()):
        raise ValueError(f"{name} {version} is not built by the test bed (Kubernetes binaries "
                         f"{K8S_NAMES} at {K8S_VERSIONS}, {EXTRA_VERSIONS}; see "
                         "testbed/versions.env)")
    p = cache_dir() / "bin" / f"{name}-{version}" / name
    if not p.exists():
        raise BinaryMissing(f"{p} is missing: run `make bins` (builds it from the Go module proxy)")
    return p


def ensure_bins() -> None:
    """Build whatever is missing (a no-op when all are present); BinaryMissing if it fails
    (the script has printed why: no Go, too old a Go, a module the proxy refused)."""
    rc = subprocess.run(["bash", str(REPO / "hack" / "build-bins.sh")], check=False).returncode
    if rc != 0:
        raise BinaryMissing(f"hack/build-bins.sh failed (exit {rc}); see its output above")


def _go() -> str:
    go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists()
                                else None)
    if go is None:
        raise BinaryMissing("Go is needed to locate a Go module's manifests "
                            "(see hack/build-bins.sh)")
    return go


@functools.cache
def go_module_dir(gomod: str, module: str, name: str, version: str | None = None) -> Path:
    """The source of ``module`` in the Go module cache, at the version ``hack/gomod/<gomod>``
    pins (downloaded and checked against its go.sum if absent), for the manifests the binary
    ``name`` was built with (CRDs, webhook configurations): taken from the module itself,
    never copied by hand. BinaryMissing when the pinned version is not ``name``'s in
    ``testbed/versions.env`` (``version``: that one of its versions)."""
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=readonly"}
    out = subprocess.run([_go(), "mod", "download", "-json", module],
                         cwd=REPO / "hack" / "gomod" / gomod, env=env,
                         capture_output=True, text=True, check=False)
    info = json.loads(out.stdout or "{}")
    if out.returncode != 0 or info.get("Error") or not info.get("Dir"):
        raise BinaryMissing(f"go mod download {module} failed: {info.get('Error') or out.stderr}")
    want = version or version_of(name)
    if info.get("Version") != want:
        raise BinaryMissing(f"hack/gomod/{gomod} pins {module} {info.get('Version')}, "
                            f"testbed/versions.env says {want}")
    return Path(info["Dir"])
