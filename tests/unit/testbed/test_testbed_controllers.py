"""The kubebuilder manifests the bed applies for JobSet, LWS and Trainer v2
(``testbed.controllers``), read from a kustomization laid out as theirs are (no cluster)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from testbed.controllers import _json_patch, crds, webhook_configurations

MANIFESTS = """\
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: mutating-webhook-configuration
webhooks:
- name: mset.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /mutate-set}}
- name: mpod.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /mutate--v1-pod}}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: validating-webhook-configuration
webhooks:
- name: vset.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /validate-set}}
"""
# JobSet's and LWS's patch: the pod webhook replaced by one with an objectSelector.
PATCH = """\
- op: replace
  path: /webhooks/1
  value:
    name: mpod.kb.io
    clientConfig: {service: {name: webhook-service, namespace: system, path: /mutate--v1-pod}}
    objectSelector: {matchExpressions: [{key: set-name, operator: Exists}]}
"""
KUSTOMIZATION = """\
resources: [manifests.yaml]
patches:
- path: patch.yaml
  target: {group: admissionregistration.k8s.io, version: v1,
           kind: MutatingWebhookConfiguration, name: mutating-webhook-configuration}
"""


def test_webhooks_patched_renamed_and_pointed_at_the_manager(tmp_path: Path) -> None:
    (tmp_path / "manifests.yaml").write_text(MANIFESTS)
    (tmp_path / "patch.yaml").write_text(PATCH)
    (tmp_path / "kustomization.yaml").write_text(KUSTOMIZATION)
    docs = webhook_configurations(tmp_path, "https://127.0.0.1:9443/", b"CA", "set-")
    by_name = {d["metadata"]["name"]: d for d in docs}
    assert sorted(by_name) == ["set-mutating-webhook-configuration",
                               "set-validating-webhook-configuration"]
    hooks = by_name["set-mutating-webhook-configuration"]["webhooks"]
    assert hooks[1]["objectSelector"] == {"matchExpressions": [
        {"key": "set-name", "operator": "Exists"}]}
    assert [h["clientConfig"] for h in hooks] == [
        {"url": "https://127.0.0.1:9443/mutate-set",
         "caBundle": base64.b64encode(b"CA").decode()},
        {"url": "https://127.0.0.1:9443/mutate--v1-pod",
         "caBundle": base64.b64encode(b"CA").decode()}]
    # The validating configuration was not the patch's target.
    assert "objectSelector" not in by_name["set-validating-webhook-configuration"]["webhooks"][0]


def test_crd_conversion_webhook_from_its_strategic_patch(tmp_path: Path) -> None:
    (tmp_path / "crd.yaml").write_text(
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n"
        "metadata: {name: sets.example.io}\nspec: {group: example.io}\n")
    (tmp_path / "conv.yaml").write_text(
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n"
        "metadata: {name: sets.example.io}\nspec:\n  conversion:\n    strategy: Webhook\n"
        "    webhook:\n      clientConfig: {service: {name: webhook-service, namespace: system,"
        " path: /convert}}\n      conversionReviewVersions: [v1]\n")
    (tmp_path / "kustomization.yaml").write_text(
        "resources: [crd.yaml]\npatches:\n- path: conv.yaml\n")
    (doc,) = crds(tmp_path, "https://127.0.0.1:1", b"CA")
    hook = doc["spec"]["conversion"]["webhook"]
    assert hook["clientConfig"]["url"] == "https://127.0.0.1:1/convert"
    assert doc["spec"]["group"] == "example.io"


def test_json_patch_add_replace_and_refusal() -> None:
    doc = {"a": [1, 2], "m": {"x~/y": 1}}
    _json_patch(doc, [{"op": "add", "path": "/a/-", "value": 3},
                      {"op": "add", "path": "/a/0", "value": 0},
                      {"op": "replace", "path": "/m/x~0~1y", "value": 2}])
    assert doc == {"a": [0, 1, 2, 3], "m": {"x~/y": 2}}
    with pytest.raises(ValueError, match="unsupported JSON patch op"):
        _json_patch(doc, [{"op": "remove", "path": "/a/0"}])
