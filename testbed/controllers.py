"""What JobSet, LeaderWorkerSet and Kubeflow Trainer v2 share on a test bed: kubebuilder
managers run out of a cluster, their manifests read from their own Go modules.

All three are controller-runtime managers laid out by kubebuilder, so the same few steps put
each on a bed (``testbed.jobset``, ``testbed.lws`` and ``testbed.trainer`` say what differs):

- CRDs from the module's ``config`` (or ``manifests``) tree, with the conversion webhook its
  kustomization patches in pointed at the manager;
- the webhook configurations of the module's webhook kustomization, its JSON 6902 patches
  applied (kubebuilder writes them as ``op: replace`` on ``/webhooks/<i>`` or a field), every
  ``clientConfig`` a URL on ``127.0.0.1`` at the Service's path, with the bed's CA as
  ``caBundle``;
- a serving pair for ``127.0.0.1`` from ``testbed.certs`` in the directory the manager's
  webhook server reads (``tls.crt``/``tls.key``, controller-runtime's names), so each
  manager's internal certificate rotation (open-policy-agent's cert-controller) is turned
  off: it writes certificates for the in-cluster Service's DNS name only, which a call to
  127.0.0.1 does not verify for.
"""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import yaml

from .certs import Certs, make_certs
from .runner import TestBed

__all__ = ["apply", "crds", "load", "serving_certs", "webhook_configurations"]

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's loader when PyYAML has it: CRDs are large."""


def load(path: Path) -> list[Any]:
    return [d for d in yaml.load_all(path.read_text(), Loader=_Loader) if d]


def serving_certs(cert_dir: Path) -> Certs:
    """The webhook server's pair for 127.0.0.1, as ``tls.crt``/``tls.key`` in ``cert_dir``."""
    return make_certs(cert_dir, days=30)


def _client_config(base: str, ca: bytes, service: dict[str, Any]) -> dict[str, Any]:
    return {"url": base.rstrip("/") + str(service.get("path") or "/"),
            "caBundle": base64.b64encode(ca).decode("ascii")}


def _json_patch(doc: Any, ops: list[dict[str, Any]]) -> None:
    """JSON 6902 ``add`` and ``replace`` (what kubebuilder's patches use), in place."""
    for op in ops:
        if op.get("op") not in ("add", "replace"):
            raise ValueError(f"unsupported JSON patch op {op!r}")
        *parents, last = [p.replace("~1", "/").replace("~0", "~")
                          for p in str(op["path"]).lstrip("/").split("/")]
        node = doc
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        value = copy.deepcopy(op["value"])
        if isinstance(node, list):
            if last == "-":
                node.append(value)
            elif op["op"] == "add":
                node.insert(int(last), value)
            else:
                node[int(last)] = value
        else:
            node[last] = value


def _patched(d: Path) -> list[dict[str, Any]]:
    """A kustomization's resources with its patches applied: JSON 6902 lists on their
    ``target`` (kind, and name when given), strategic merges of a document by kind and name
    (only ``spec.conversion`` of a CRD, the one kubebuilder's CRD patches set; its
    cert-manager ``inject-ca-from`` patch is left out, the bed sets ``caBundle`` itself)."""
    kust = load(d / "kustomization.yaml")[0]
    docs = [doc for f in kust.get("resources") or () for doc in load(d / f)]
    for patch in kust.get("patches") or ():
        for p in load(d / patch["path"]):
            if isinstance(p, list):
                target = patch.get("target") or {}
                for doc in docs:
                    if doc["kind"] == target.get("kind") and \
                            target.get("name") in (None, doc["metadata"]["name"]):
                        _json_patch(doc, p)
                continue
            conversion = (p.get("spec") or {}).get("conversion")
            if conversion is None:  # cert-manager's CA injection annotation: the bed sets it
                continue
            for doc in docs:
                if (doc["kind"], doc["metadata"]["name"]) == (p["kind"], p["metadata"]["name"]):
                    doc["spec"]["conversion"] = copy.deepcopy(conversion)
    return docs


def crds(d: Path, url: str, ca: bytes) -> list[dict[str, Any]]:
    """The CRDs of the kustomization in ``d``, a conversion webhook calling ``url``."""
    out = []
    for doc in _patched(d):
        hook = ((doc.get("spec") or {}).get("conversion") or {}).get("webhook")
        if hook:
            hook["clientConfig"] = _client_config(url, ca, hook["clientConfig"]["service"])
        out.append(doc)
    return out


def webhook_configurations(d: Path, url: str, ca: bytes, prefix: str = ""
                           ) -> list[dict[str, Any]]:
    """The Mutating- and ValidatingWebhookConfigurations of the kustomization in ``d``, named
    with ``prefix`` (``config/default``'s ``namePrefix``), every webhook calling ``url``."""
    out = [doc for doc in _patched(d) if doc["kind"].endswith("WebhookConfiguration")]
    for doc in out:
        doc["metadata"]["name"] = prefix + doc["metadata"]["name"]
        for hook in doc["webhooks"]:
            hook["clientConfig"] = _client_config(url, ca, hook["clientConfig"]["service"])
    return out


def apply(bed: TestBed, name: str, docs: list[dict[str, Any]]) -> None:
    """Server-side apply ``docs`` (kept as ``<bed dir>/<name>.manifests.json``) and wait for
    their CRDs to be Established (both retried, as the bed's own CRDs are: just after /readyz
    a loaded API server may refuse them)."""
    path = bed.dir / f"{name}.manifests.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
    bed._kubectl_retried("apply", "--server-side", "--force-conflicts", "-f", str(path))
    names = [f"crd/{d['metadata']['name']}" for d in docs
             if d["kind"] == "CustomResourceDefinition"]
    if names:
        bed._kubectl_retried("wait", "--for=condition=Established", "--timeout=30s", *names)
