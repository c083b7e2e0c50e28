"""deploy/ against a real API server: server-side dry run, and Lockstep, as installed (its
webhook on, keeping its own certificate), running under exactly the `lockstep` ClusterRole and
deploy/webhook/rbac.yaml (sufficient, and no broader than needed)."""

from __future__ import annotations

import yaml

from testbed.bins import REPO
from testbed.kube import Kube
from testbed.runner import TestBed
from testbed.workloads import pod, podgroup

from .conftest import SCHEDULER_CONFIG, ClusterFactory, assert_not_forbidden, grant_as_deployed

DEPLOY = REPO / "deploy"
TOKEN = "lockstep-rbac-test-token"
USER = "lockstep-rbac-test"

# Every API call Lockstep makes (app/kube/client.py, app/kube/cache.py, app/service.py) and its
# rule.
USES = [
    ("list", "nodes", "", "cache: node capacity and topology labels"),
    ("watch", "nodes", "", "cache"),
    ("list", "pods", "", "cache: usage and gang members"),
    ("get", "pods", "", "a pod named in a bind call before the watch shows it"),
    ("watch", "pods", "", "cache"),
    ("patch", "pods", "", "the gate's lift (with a pin); the requeue annotation"),
    ("delete", "pods", "", "preemption victims"),
    ("patch", "pods/status", "", "the DisruptionTarget condition on preemption victims"),
    ("list", "poddisruptionbudgets", "policy", "victims whose budgets allow it first"),
    ("watch", "poddisruptionbudgets", "policy", "cache"),
    ("create", "pods/binding", "", "binding gang members"),
    ("create", "events", "", "GangWaiting / GangAdmitted / GangTimedOut / GangBound"),
    ("list", "podgroups", "scheduling.x-k8s.io", "scheduler-plugins PodGroups"),
    ("watch", "podgroups", "scheduling.x-k8s.io", "cache"),
    ("patch", "podgroups/status", "scheduling.x-k8s.io", "PodGroup phase and counts"),
    ("list", "noderesourcetopologies", "topology.node.k8s.io", "per-NUMA free GPUs"),
    ("watch", "noderesourcetopologies", "topology.node.k8s.io", "cache"),
]
NOT_NEEDED = [
    ("create", "pods", ""), ("update", "pods", ""), ("deletecollection", "pods", ""),
    ("get", "secrets", ""), ("list", "secrets", ""), ("patch", "nodes", ""),
    ("update", "nodes", ""), ("delete", "nodes", ""), ("list", "configmaps", ""),
    ("create", "podgroups", "scheduling.x-k8s.io"), ("delete", "podgroups", "scheduling.x-k8s.io"),
    ("create", "clusterrolebindings", "rbac.authorization.k8s.io"),
    ("create", "pods/exec", ""), ("delete", "events", ""),
]


def can(kube: Kube, verb: str, resource: str, group: str) -> bool:
    res, _, sub = resource.partition("/")
    review = kube.create("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"verb": verb, "resource": res, "subresource": sub,
                                        "group": group, "namespace": "e2e"}}})
    return bool(review["status"]["allowed"])


LEASE = "lockstep-system/lockstep-scheduler"


def grant_lease_role(bed: TestBed, user: str) -> None:
    """deploy/rbac.yaml's leader-election Role (applied by ``grant_as_deployed``), bound to
    ``user`` standing in for the pod's service account."""
    bed.kubectl("apply", "-f", "-", input=yaml.safe_dump({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": f"lease-{user}", "namespace": "lockstep-system"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": "lockstep-scheduler-leader-election"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                      "name": user}]}))


def can_lease(kube: Kube, verb: str, name: str) -> bool:
    review = kube.create("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"verb": verb, "resource": "leases", "name": name,
                                        "group": "coordination.k8s.io",
                                        "namespace": "lockstep-system"}}})
    return bool(review["status"]["allowed"])


def test_manifests_pass_server_side_dry_run(cluster: ClusterFactory) -> None:
    c = cluster("tiny-3x2", lockstep=False)
    c.bed.kubectl("apply", "--server-side", "-f", str(DEPLOY / "namespace.yaml"))
    out = c.bed.kubectl("apply", "--server-side", "--dry-run=server", "-k", str(DEPLOY)).stdout
    for want in ("customresourcedefinition.apiextensions.k8s.io/podgroups.scheduling.x-k8s.io",
                 "clusterrole.rbac.authorization.k8s.io/lockstep",
                 "serviceaccount/lockstep-scheduler", "configmap/lockstep-scheduler-config-",
                 "deployment.apps/lockstep-scheduler",
                 # the webhook, on by default, with the RBAC for its own certificate
                 "mutatingwebhookconfiguration.admissionregistration.k8s.io/lockstep",
                 "service/lockstep-webhook", "role.rbac.authorization.k8s.io/lockstep-webhook-cert",
                 "clusterrole.rbac.authorization.k8s.io/lockstep-webhook-ca-bundle"):
        assert want in out, out
    labeller = c.bed.kubectl("apply", "--server-side", "--dry-run=server", "-k",
                             str(DEPLOY / "labeller")).stdout
    assert "daemonset.apps/lockstep-labeller" in labeller
    # Dry run changed nothing.
    assert c.bed.kubectl("get", "deploy", "-A", "-o", "name").stdout.strip() == ""


def test_lockstep_runs_under_exactly_its_cluster_role(cluster: ClusterFactory) -> None:
    c = cluster("tiny-3x2", lockstep=False,
                extra_tokens={TOKEN: (USER, ["system:authenticated"])})
    bed = c.bed
    grant_as_deployed(bed, USER)  # the ClusterRole and the webhook's certificate RBAC
    restricted = Kube(bed.api_url, TOKEN)
    try:
        # No broader than needed: exactly the calls Lockstep makes are allowed.
        for verb, resource, group, why in USES:
            assert can(restricted, verb, resource, group), f"{verb} {resource}: for {why}"
        for verb, resource, group in NOT_NEEDED:
            assert not can(restricted, verb, resource, group), f"{verb} {resource} is granted"
    finally:
        restricted.close()

    # The Lease it follows (as deployed, Lockstep shares its pod's service account with the
    # kube-scheduler that holds it): readable by name, and nothing more of it.
    grant_lease_role(bed, USER)
    restricted = Kube(bed.api_url, TOKEN)
    try:
        assert can_lease(restricted, "get", "lockstep-scheduler")
        assert not can_lease(restricted, "get", "another-lease")
        assert not can_lease(restricted, "delete", "lockstep-scheduler")
    finally:
        restricted.close()

    # Sufficient: Lockstep does all of its work with that token alone, following the Lease
    # its kube-scheduler holds (deploy/'s leader election, the pod's hostname).
    url = bed.start_lockstep(kubeconfig=bed.kubeconfig_for(TOKEN, "lockstep-rbac"),
                             extra_args=("--backoff=3", f"--leader-elect-lease={LEASE}",
                                         "--leader-identity=lockstep-rbac"))
    c.lockstep_url = url
    election = yaml.safe_load((DEPLOY / "scheduler-config.yaml").read_text())["leaderElection"]
    bed.start_scheduler(SCHEDULER_CONFIG, name="lockstep-scheduler", extender_url=url,
                        hostname="lockstep-rbac", overrides={"leaderElection": election})
    c.kube.create(f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{c.ns}/podgroups",
                  podgroup("pg", 3, c.ns))
    c.recorder.min_member_of[f"{c.ns}/pg"] = 3
    members = [pod(f"pg-{i}").sp_group("pg").gpu(1).build() for i in range(3)]
    c.create(*members[:2])
    c.wait_held("pg-0", "2/3 members exist")  # the webhook called, its certificate trusted
    c.create(members[2])
    c.wait_bound(c.names("pg", 3), 30)                                 # pods/binding: create
    c.wait_event(None, "GangBound", "3 of 3 member(s) bound together")  # events: create
    path = f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{c.ns}/podgroups/pg"
    c.kube.wait("PodGroup status", lambda: c.kube.get(path).get("status", {}).get(
        "phase") == "Running", 30)                                     # podgroups/status: patch
    # pods: patch -- the members gated at creation had the gate lifted, with a pin
    assert c.metric('lockstep_gate_lifts_total{outcome="pinned"}') >= 2
    assert_not_forbidden(bed.dir / "lockstep.log")
    assert c.metric("lockstep_leading") == 1.0
    c.recorder.assert_gang_invariants(c.ns)
