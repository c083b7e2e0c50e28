"""Lockstep's admission webhook on the real test bed: gang members pinned at creation when
their gang's quorum exists and fits, gated otherwise.

Lockstep runs with ``--webhook-port`` (TLS, a CA of the bed's own) and the API server calls it
through ``deploy/webhook/webhook.yaml``'s MutatingWebhookConfiguration, changed only in where
to call (``testbed.runner.webhook_configuration``): its rules, CEL match condition, namespace
selector, ``failurePolicy: Ignore`` and ``timeoutSeconds: 2`` are the deployed ones.

Pods are created as users and controllers write them, without the gate: what the API server
answers a create with is what it stored, so the webhook's patch is checked there. Created one
at a time (a creator that waits for each create), a gang's members before its quorum are
gated and the member that completes it is pinned; created together (``burst``, as a Job's
parallel creates), every member of a gang that fits is pinned.
"""

from __future__ import annotations

import re
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from coscheduling.creation.placer import PIN_LANDING_SECONDS
from coscheduling.gang.gating import GANG_GATE, pinned_node
from testbed.bins import REPO
from testbed.certs import make_certs
from testbed.kube import KubeError
from testbed.workloads import gang, pod

from .conftest import SCHEDULER_CONFIG, Cluster, ClusterFactory, assert_not_forbidden, settle

HOOK = "gang-gate.lockstep.dev"
KUEUE_GATE = "kueue.x-k8s.io/admission"


STARTED_AT: dict[str, float] = {}
"""The API server's fail-open count once the webhook answers, per test namespace: calls made
before Lockstep set the caBundle (and the API server saw it) fail, as in a real install."""


def with_webhook(cluster: ClusterFactory, certs: str = "own") -> Cluster:
    """The default install, as ``cluster`` starts it: Lockstep issues its certificate and
    sets the caBundle itself (``certs="files"``: a certificate given as files, as
    cert-manager would). Notes the API server's fail-open count once the webhook answers."""
    if certs == "own":
        c = cluster("tiny-3x2")
    else:
        c = cluster("tiny-3x2", lockstep=False)
        c.lockstep_url = c.bed.start_lockstep(extra_args=("--backoff=3",),
                                              webhook_certs=certs)
        c.bed.start_scheduler(SCHEDULER_CONFIG, name="lockstep-scheduler",
                              extender_url=c.lockstep_url)
    STARTED_AT[c.ns] = fail_open(c)
    return c


def failed_open_since_start(c: Cluster) -> float:
    return fail_open(c) - STARTED_AT[c.ns]


def create(c: Cluster, obj: dict[str, Any], ns: str | None = None) -> dict[str, Any]:
    """Create ``obj`` and return the pod as the API server stored it (after admission)."""
    obj["metadata"]["namespace"] = ns or c.ns
    return c.kube.create_pod(obj)


def burst(c: Cluster, objs: list[dict[str, Any]]) -> dict[str, dict[str, Any] | Exception]:
    """Create ``objs`` all at once, each on its own connection (as a Job controller's
    parallel creates): name -> the pod as stored, or the error its create raised."""
    out: dict[str, dict[str, Any] | Exception] = {}

    def one(obj: dict[str, Any]) -> None:
        obj["metadata"]["namespace"] = c.ns
        kube = c.kube.clone()
        try:
            out[obj["metadata"]["name"]] = kube.create_pod(obj)
        except Exception as e:
            out[obj["metadata"]["name"]] = e
        finally:
            kube.close()
    threads = [threading.Thread(target=one, args=(o,)) for o in objs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def stored(made: dict[str, dict[str, Any] | Exception]) -> dict[str, dict[str, Any]]:
    """``burst``'s pods, every create having succeeded."""
    bad = {n: e for n, e in made.items() if isinstance(e, Exception)}
    assert not bad, bad
    return {n: m for n, m in made.items() if not isinstance(m, Exception)}


def gates(obj: dict[str, Any]) -> list[str]:
    return [g["name"] for g in obj["spec"].get("schedulingGates") or ()]


def decisions(c: Cluster) -> dict[str, float]:
    """``lockstep_webhook_admissions_total`` by decision."""
    assert c.lockstep_url
    text = httpx.get(c.lockstep_url + "/metrics", timeout=10).text
    return {m[1]: float(m[2]) for m in re.finditer(
        r'^lockstep_webhook_admissions_total\{decision="([^"]+)"\} (\S+)$', text, re.M)}


def lifts(c: Cluster) -> float:
    """``lockstep_gate_lifts_total``, every outcome: the pod writes Lockstep made to lift."""
    assert c.lockstep_url
    text = httpx.get(c.lockstep_url + "/metrics", timeout=10).text
    return sum(float(m[1]) for m in re.finditer(
        r'^lockstep_gate_lifts_total\{[^}]*\} (\S+)$', text, re.M))


def pin(obj: dict[str, Any]) -> str | None:
    """The node the pod's required node affinity pins it to (Lockstep's pin), if any."""
    terms = (((obj["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms")
    return pinned_node(tuple(terms or ()))


def fail_open(c: Cluster) -> float:
    """The API server's count of calls to the webhook that failed and were ignored."""
    text = c.kube.request("GET", "/metrics")
    for line in str(text).splitlines():
        if line.startswith("apiserver_admission_webhook_fail_open_count{") and \
                f'name="{HOOK}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_gang_pods_get_the_gate_plain_pods_and_other_schedulers_do_not(
    cluster: ClusterFactory,
) -> None:
    c = with_webhook(cluster)
    before = decisions(c)
    koord = "gang.scheduling.koordinator.sh/"
    # Every convention, each gang too big for the 6 GPUs (4 x 2), so that it stays gated.
    gang_pods = {
        "lockstep": pod("lockstep-0").gang("lockstep", 4).gpu(2).build(),
        "scheduler-plugins": pod("sp-0").sp_group("sp").gpu(2).build(),  # no PodGroup yet
        "volcano": pod("volcano-0").annotate("scheduling.k8s.io/group-name", "vc")
        .annotate("scheduling.volcano.sh/group-min-member", "4").gpu(2).build(),
        "koordinator": pod("koord-0").annotate(koord + "name", "koord")
        .annotate(koord + "min-available", "4").gpu(2).build(),
    }
    light = pod("light-0").annotate("pod-group.scheduling.sigs.k8s.io/min-available", "4")
    light_obj = light.gpu(2).build()
    light_obj["metadata"]["labels"]["pod-group.scheduling.sigs.k8s.io/name"] = "light"
    gang_pods["koordinator-light"] = light_obj
    for name, obj in gang_pods.items():
        created = create(c, obj)
        assert gates(created) == [GANG_GATE], name

    # Kueue's own gate stays; Lockstep's comes after it.
    kueue = pod("kueue-0").annotate("kueue.x-k8s.io/pod-group-total-count", "4").gpu(1).build()
    kueue["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] = "kq"
    kueue["spec"]["schedulingGates"] = [{"name": KUEUE_GATE}]
    assert gates(create(c, kueue)) == [KUEUE_GATE, GANG_GATE]
    # Already gated by its template: unchanged.
    held = pod("held-0").gang("held", 4).gpu(1).build()
    held["spec"]["schedulingGates"] = [{"name": GANG_GATE}]
    assert gates(create(c, held)) == [GANG_GATE]
    # Bound by its creator: a gate would make the API server reject the pod.
    pinned = pod("pinned-0").gang("pinned", 1).gpu(1).build()
    pinned["spec"]["nodeName"] = "gpu-r0-n2"
    assert gates(create(c, pinned)) == []

    # No gang, another scheduler, or kube-system: no gate.
    plain = create(c, pod("plain").gpu(1).build())
    assert gates(plain) == []
    other = create(c, pod("other-0").gang("other", 1).scheduler("default-scheduler").build())
    assert gates(other) == []
    system = create(c, pod("system-0").gang("system", 1).build(), ns="kube-system")
    assert gates(system) == []

    # The plain pod is scheduled as ever; the gated members stay out of kube-scheduler's queue.
    c.wait_bound(["plain"], 30)
    settle(2)
    for name in [o["metadata"]["name"] for o in gang_pods.values()] + ["kueue-0", "held-0"]:
        live = c.kube.pod(c.ns, name)
        assert GANG_GATE in gates(live), name
        assert not live["spec"].get("nodeName"), name
        assert any(cond.get("reason") == "SchedulingGated"
                   for cond in live["status"].get("conditions") or ()), name
    # What Lockstep was asked: the CEL match conditions and the namespace selector kept the
    # plain pod, the other scheduler's pod and kube-system's away from it.
    after = decisions(c)
    delta = {k: d for k in after if (d := after[k] - before.get(k, 0.0))}
    assert delta == {"gated": len(gang_pods) + 1, "already-gated": 1, "node-name-set": 1}, delta
    assert failed_open_since_start(c) == 0


def test_seed_case_with_the_webhook(cluster: ClusterFactory) -> None:
    """Two 4-pod x 1-GPU gangs on 6 GPUs, created interleaved, one at a time and ungated:
    no member is pinned before its gang's quorum exists, so the first three of each are
    gated; a-3 completes gang a, which fits: it is pinned and a's gated members are lifted
    with pins; b-3 completes gang b, which does not fit: gated. One binds in full, the other
    binds nothing, and it binds in full once the first is deleted. The certificate comes as
    files here, as cert-manager's would."""
    c = with_webhook(cluster, certs="files")
    a, b = gang("a", 4), gang("b", 4)
    created = {}
    for x, y in zip(a, b, strict=True):  # interleaved: the classic deadlock
        for obj in (x, y):
            created[obj["metadata"]["name"]] = create(c, obj)
    for name in [*c.names("a", 3), *c.names("b", 4)]:
        assert gates(created[name]) == [GANG_GATE] and not pin(created[name]), name
    assert gates(created["a-3"]) == [] and pin(created["a-3"]), created["a-3"]["spec"]
    c.kube.wait("one gang bound", lambda: any(
        all(f"{g}-{i}" in c.bound() for i in range(4)) for g in "ab"), 60)
    settle(3)
    bound = c.bound()
    done = [g for g in "ab" if all(f"{g}-{i}" in bound for i in range(4))]
    assert len(done) == 1, bound
    first, other = done[0], "b" if done == ["a"] else "a"
    assert not any(n.startswith(f"{other}-") for n in bound), bound
    c.recorder.assert_gang_invariants(c.ns)
    assert first == "a"
    for i in range(4):
        # The members pinned at creation bound where they were pinned; the waiting gang's
        # members are still held, out of kube-scheduler's queue.
        live = c.kube.pod(c.ns, f"a-{i}")
        assert GANG_GATE not in gates(live)
        assert pin(live) == bound[f"a-{i}"], live["spec"]
        assert GANG_GATE in gates(c.kube.pod(c.ns, f"{other}-{i}"))
    lifted = lifts(c)
    c.delete(*(f"{first}-{i}" for i in range(4)))  # the first job finishes
    c.wait_bound([f"{other}-{i}" for i in range(4)], 30)
    for i in range(4):  # the gated gang's gate came off, pinning each where it bound
        assert pin(c.kube.pod(c.ns, f"b-{i}")) == c.bound()[f"b-{i}"]
    assert lifts(c) >= lifted + 4
    c.recorder.assert_gang_invariants(c.ns)
    assert c.metric("lockstep_gang_timeouts_total") == 0
    assert failed_open_since_start(c) == 0


def test_gangs_that_fit_are_pinned_at_creation_and_bind_with_no_gate_to_lift(
    cluster: ClusterFactory,
) -> None:
    """The fast path: on 3 x 2 GPUs, gang a (2 x 1 GPU) and gang b (4 x 1 GPU), their members
    created together, fit as they are created, so every member is created pinned to its
    planned node, with no gate, and binds there without Lockstep writing to it; gang c (2 x
    1 GPU), created together next, finds nothing left and is gated, then lifted and bound
    when a finishes."""
    c = with_webhook(cluster)
    before, lifted = decisions(c), lifts(c)
    made = stored(burst(c, [*gang("a", 2), *gang("b", 4)]))
    made |= stored(burst(c, gang("c", 2)))
    fit = [*c.names("a", 2), *c.names("b", 4)]
    for name in fit:
        assert gates(made[name]) == [] and pin(made[name]), made[name]["spec"]
    assert len({pin(made[n]) for n in c.names("a", 2)}) == 1  # a small gang on one node
    for name in c.names("c", 2):
        assert gates(made[name]) == [GANG_GATE] and not pin(made[name])
    bound = c.wait_bound(fit, 60)
    assert {n: bound[n] for n in fit} == {n: pin(made[n]) for n in fit}
    c.recorder.assert_gang_invariants(c.ns)
    assert lifts(c) == lifted  # not one gate to lift, not one pod write by Lockstep
    settle(2)
    assert not any(n.startswith("c-") for n in c.bound())
    c.delete(*c.names("a", 2))
    c.wait_bound(c.names("c", 2), 30)
    c.recorder.assert_gang_invariants(c.ns)
    after = decisions(c)
    delta = {k: d for k in after if (d := after[k] - before.get(k, 0.0))}
    assert delta == {"pinned": 6, "gated": 2}, delta
    assert failed_open_since_start(c) == 0


def test_a_pin_whose_create_is_refused_later_gives_its_gang_back_within_seconds(
    cluster: ClusterFactory,
) -> None:
    """A validating step after the webhook (here a ValidatingAdmissionPolicy) refuses a member
    the webhook had pinned, with its gang's whole plan reserved: Lockstep never sees the pod,
    and gives the reservation back within PIN_LANDING_SECONDS, not at the gang's deadline."""
    c = with_webhook(cluster)
    policy = {"apiVersion": "admissionregistration.k8s.io/v1",
              "kind": "ValidatingAdmissionPolicy", "metadata": {"name": f"refuse-{c.ns}"},
              "spec": {"failurePolicy": "Fail", "matchConstraints": {"resourceRules": [
                  {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                   "resources": ["pods"]}]},
                  "validations": [{"expression": "!object.metadata.name.startsWith('refused-')",
                                   "message": "refused by the test's policy"}]}}
    binding = {"apiVersion": "admissionregistration.k8s.io/v1",
               "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": f"refuse-{c.ns}"},
               "spec": {"policyName": f"refuse-{c.ns}", "validationActions": ["Deny"],
                        "matchResources": {"namespaceSelector": {"matchLabels": {
                            "kubernetes.io/metadata.name": c.ns}}}}}
    vap = "/apis/admissionregistration.k8s.io/v1"
    c.kube.create(f"{vap}/validatingadmissionpolicies", policy)
    c.kube.create(f"{vap}/validatingadmissionpolicybindings", binding)
    probe = pod("refused-probe").build()
    probe["metadata"]["namespace"] = c.ns

    def refused() -> bool:
        try:
            c.kube.request("POST", f"/api/v1/namespaces/{c.ns}/pods", probe,
                           params={"dryRun": "All"})
        except KubeError as e:
            return "refused by the test's policy" in e.message
        return False
    c.kube.wait("the policy in force", refused, 30, interval=0.5)

    before = decisions(c)
    refused_all = burst(c, gang("refused", 3))  # created together: pinned, then refused
    for name, outcome in refused_all.items():
        assert isinstance(outcome, KubeError), (name, outcome)
        assert "refused by the test's policy" in outcome.message, outcome.message
    assert decisions(c).get("pinned", 0) == before.get("pinned", 0) + 3
    assert c.metric("lockstep_reserved_gpus") == 3  # the whole plan, held for a pod not there
    t0 = time.monotonic()
    c.kube.wait("the pin given back", lambda: c.metric("lockstep_reserved_gpus") == 0,
                PIN_LANDING_SECONDS + 10, interval=0.5)
    assert time.monotonic() - t0 < PIN_LANDING_SECONDS + 10
    # All 6 GPUs are free for the next gang, pinned at creation.
    made = stored(burst(c, gang("whole", 3, gpus=2)))
    assert all(gates(m) == [] and pin(m) for m in made.values()), made
    c.wait_bound(c.names("whole", 3), 60)
    c.recorder.assert_gang_invariants(c.ns)


def test_unanswered_webhook_times_out_and_pods_are_created_ungated_and_scheduled(
    cluster: ClusterFactory, tmp_path: Path,
) -> None:
    """A webhook that accepts connections and never answers: the API server gives up after
    ``timeoutSeconds`` (2 s) and, ``failurePolicy: Ignore``, creates the pod without the gate;
    Lockstep, its extender up, schedules the gang as it always has. Lockstep runs without
    its own webhook (``webhook=False``): the configuration points at the silent server
    instead, and Lockstep must not be the one putting its caBundle into it."""
    c = cluster("tiny-3x2", webhook=False)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)  # connections queue in the backlog; nothing ever accepts them
    try:
        url = f"https://127.0.0.1:{silent.getsockname()[1]}"
        c.bed.register_webhook(url, make_certs(tmp_path / "certs").ca.read_bytes(), wait=False)
        probe = pod("probe").gang("probe", 4).build()
        probe["metadata"]["namespace"] = c.ns
        c.kube.wait("the API server calling the webhook and failing open", lambda: (
            c.kube.request("POST", f"/api/v1/namespaces/{c.ns}/pods", probe,
                           params={"dryRun": "All"}) and fail_open(c) > 0), 30, interval=0.5)
        for obj in gang("g", 4):
            t0 = time.monotonic()
            created = create(c, obj)
            took = time.monotonic() - t0
            assert gates(created) == [], obj["metadata"]["name"]
            assert 1.5 < took < 6, took  # the 2 s timeout, not the API server's 30 s default
        c.wait_bound(c.names("g", 4), 30)
        c.recorder.assert_gang_invariants(c.ns)
    finally:
        silent.close()
    assert fail_open(c) >= 5


def test_lockstep_down_pods_are_created_ungated_and_scheduled_when_it_is_back(
    cluster: ClusterFactory,
) -> None:
    c = with_webhook(cluster)
    c.bed.stop_process("lockstep")  # webhook and extender down: connection refused
    for obj in gang("g", 4):
        t0 = time.monotonic()
        assert gates(create(c, obj)) == [], obj["metadata"]["name"]
        assert time.monotonic() - t0 < 2
    assert fail_open(c) >= 4
    plain = create(c, pod("plain").gpu(1).build())
    assert gates(plain) == []
    c.bed.restart("lockstep")
    c.wait_bound([*c.names("g", 4), "plain"], 60)
    c.recorder.assert_gang_invariants(c.ns)
    # Back up, the webhook gates new gang pods again.
    assert gates(create(c, pod("late-0").gang("late", 4).gpu(1).build())) == [GANG_GATE]


def test_deploy_with_cert_manager_instead_passes_server_side_dry_run(
    cluster: ClusterFactory, tmp_path: Path,
) -> None:
    """deploy/ with `webhook/cert-manager` added below `webhook`, as the kustomization says,
    builds; the API server accepts all of it but cert-manager's kinds (the test bed has no
    cert-manager); Lockstep's own-certificate RBAC is gone and the sidecar reads files."""
    c = cluster("tiny-3x2", lockstep=False)
    deploy = tmp_path / "deploy"
    shutil.copytree(REPO / "deploy", deploy)
    kustomization = deploy / "kustomization.yaml"
    on = "components:\n  - webhook\n"
    assert on in kustomization.read_text()
    kustomization.write_text(kustomization.read_text().replace(
        on, "components:\n  - webhook\n  - webhook/cert-manager\n"))
    objs = [d for d in yaml.safe_load_all(c.bed.kubectl("kustomize", str(deploy)).stdout) if d]
    kinds = {d["kind"] for d in objs}
    assert {"MutatingWebhookConfiguration", "Service", "Certificate", "Issuer",
            "Deployment"} <= kinds, kinds
    names = {(d["kind"], d["metadata"]["name"]) for d in objs}
    assert ("Role", "lockstep-webhook-cert") not in names
    assert ("ClusterRole", "lockstep-webhook-ca-bundle") not in names
    (sidecar,) = [ctr for d in objs if d["kind"] == "Deployment"
                  for ctr in d["spec"]["template"]["spec"]["containers"]
                  if ctr["name"] == "lockstep"]
    env = {e["name"]: e["value"] for e in sidecar["env"]}
    assert env["LOCKSTEP_WEBHOOK_CERT_SECRET"] == ""
    assert env["LOCKSTEP_WEBHOOK_CERT"].endswith("/tls.crt")
    rest = [d for d in objs if not d["apiVersion"].startswith("cert-manager.io/")]
    c.bed.kubectl("apply", "--server-side", "-f", str(REPO / "deploy" / "namespace.yaml"))
    out = c.bed.kubectl("apply", "--server-side", "--dry-run=server", "-f", "-",
                        input=yaml.safe_dump_all(rest)).stdout
    for want in ("mutatingwebhookconfiguration.admissionregistration.k8s.io/lockstep",
                 "service/lockstep-webhook", "deployment.apps/lockstep-scheduler"):
        assert want in out, out


def test_own_certificate_under_exactly_its_rbac_survives_a_wiped_ca_bundle_and_a_restart(
    cluster: ClusterFactory,
) -> None:
    """The default install's certificate: Lockstep, with a token bound to its ClusterRole and
    deploy/webhook/rbac.yaml alone, creates the Secret, fills in the caBundle the API server
    then trusts (gang pods are pinned or gated), puts the caBundle back when a re-apply of the
    configuration wipes it, and after a restart serves the same certificate."""
    token, user = "lockstep-webhook-rbac-token", "lockstep-webhook-rbac"
    c = cluster("tiny-3x2", lockstep=False, extra_tokens={token: (user, ["system:authenticated"])})
    bed = c.bed
    bed.kubectl("apply", "--server-side", "-f", str(REPO / "deploy" / "namespace.yaml"),
                "-f", str(REPO / "deploy" / "rbac.yaml"))
    grants = []
    for d in yaml.safe_load_all((REPO / "deploy" / "webhook" / "rbac.yaml").read_text()):
        if d["kind"].endswith("Binding"):  # bound to a user standing in for the account
            d["subjects"] = [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                              "name": user}]
        grants.append(d)
    grants.append({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "lockstep-webhook-rbac-test"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "lockstep"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})
    bed.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(grants))
    # The name deploy/ uses, so the Role's resourceNames apply as deployed.
    url = bed.start_lockstep(kubeconfig=bed.kubeconfig_for(token, "lockstep-webhook"),
                             extra_args=("--backoff=3", "--webhook-cert-check=1"),
                             webhook=True, name="lockstep")
    c.lockstep_url = url
    bed.start_scheduler(SCHEDULER_CONFIG, name="lockstep-scheduler", extender_url=url)
    secret_path = "/api/v1/namespaces/lockstep-system/secrets/lockstep-webhook-cert"
    mwc_path = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/lockstep"
    secret = c.kube.get(secret_path)
    assert secret["type"] == "kubernetes.io/tls"
    assert set(secret["data"]) >= {"ca.crt", "ca.key", "tls.crt", "tls.key"}
    hooks = c.kube.get(mwc_path)["webhooks"]  # the pod gate and claim narrowing (dra.md)
    assert [h["name"] for h in hooks] == ["gang-gate.lockstep.dev", "claim-narrow.lockstep.dev"]
    assert all(h["clientConfig"]["caBundle"] == secret["data"]["ca.crt"] for h in hooks)
    first = stored(burst(c, gang("g", 2)))  # created together, its gang fits: pinned
    assert all(gates(m) == [] and pin(m) for m in first.values()), first
    # A re-apply of the configuration as shipped (no caBundle) wipes it; Lockstep puts it back.
    bed.register_webhook(bed.webhooks["lockstep"], None, wait=False)
    c.kube.wait("the caBundle put back", lambda: c.kube.get(mwc_path)["webhooks"][0][
        "clientConfig"].get("caBundle") == secret["data"]["ca.crt"], 30, interval=0.5)
    bed.wait_webhook_called(bed.webhooks["lockstep"])
    # Restarted, it serves the certificate in the Secret: nothing is rewritten.
    bed.restart("lockstep")
    bed.wait_webhook_called(bed.webhooks["lockstep"])
    assert c.kube.get(secret_path)["metadata"]["resourceVersion"] == (
        secret["metadata"]["resourceVersion"])
    second = create(c, pod("h-0").gang("h", 2).gpu(1).build())
    assert gates(second) == [GANG_GATE], second["spec"]  # the webhook answered: 1 of 2, gated
    assert pin(create(c, pod("h-1").gang("h", 2).gpu(1).build()))  # its quorum: pinned
    c.wait_bound(["g-0", "g-1", "h-0", "h-1"], 60)
    c.recorder.assert_gang_invariants(c.ns)
    assert_not_forbidden(bed.dir / "lockstep.log")
