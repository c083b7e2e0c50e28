"""The ``lockstep`` command: ``serve``, ``status``, ``explain``, ``label-node``.

``serve`` runs the extender (and debug API) on ``--host``/``--port``; with ``--webhook-port``
it also serves the mutating admission webhook over HTTPS on a second server in the same
process and event loop (``app/http/webhook.py``), so the extender can stay on plain loopback HTTP.

Every ``serve`` flag also reads an environment variable (``LOCKSTEP_<FLAG>``), so a
Deployment can configure it either way; flags win.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import ssl
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .process import LeaseOptions

__all__ = ["main"]


MAX_GANG_SIZE = 1000
"""``--max-gang-size``'s default (``coscheduling.podgroup.DEFAULT_MAX_GANG_SIZE``, kept here
so the parser does not import the core)."""


def _env(name: str, default: Any) -> Any:
    return os.environ.get("LOCKSTEP_" + name.upper().replace("-", "_"), default)


def _int_env(name: str) -> int | None:
    value = _env(name, None)
    return int(value) if value else None


def _seconds_0_3600(value: str) -> float:
    """``--defrag-after``: seconds in 0..3600, bounded before any use."""
    try:
        got = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {value!r}") from None
    if not 0 <= got <= 3600:
        raise argparse.ArgumentTypeError(f"{value} is outside 0..3600 seconds")
    return got


def _count_0_1000(value: str) -> int:
    """``--defrag-rate``: a whole number in 0..1000, bounded before any use."""
    if not value.isascii() or not value.isdigit() or len(value) > 4 or int(value) > 1000:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number in 0..1000")
    return int(value)


def _flag(value: str) -> bool:
    """A boolean flag's value: --ui=false, LOCKSTEP_UI=0."""
    v = str(value).strip().lower()
    if v in ("true", "1", "yes", "on"):
        return True
    if v in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{value!r} is not true or false")


def _serve_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the extender (filter, prioritize, bind) and debug API")
    add = p.add_argument
    add("--kubeconfig", default=_env("kubeconfig", os.environ.get("KUBECONFIG")),
        help="kubeconfig file; in-cluster service account when unset")
    add("--host", default=_env("host", "127.0.0.1"), help="listen address (default 127.0.0.1)")
    add("--port", type=int, default=int(_env("port", 8888)), help="listen port (default 8888)")
    add("--scheduler-name", action="append", default=None,
        help="schedulerName(s) whose pods form gangs (default lockstep; repeatable; env: "
             "comma-separated)")
    add("--default-timeout", type=float, default=float(_env("default-timeout", 60)),
        help="gang timeout when a gang does not set one (seconds, default 60)")
    add("--max-timeout", type=float, default=float(_env("max-timeout", 240)),
        help="cap on any gang's timeout; keep below kube-scheduler's extender httpTimeout "
             "(default 240 for httpTimeout 300s)")
    add("--max-gang-size", type=int, default=int(_env("max-gang-size", MAX_GANG_SIZE)),
        help="the most members a gang may declare (minMember, a Kueue total count, "
             "Koordinator's total-number); a larger gang is invalid, with a reason naming "
             f"the field and this limit (default {MAX_GANG_SIZE})")
    add("--backoff", type=float, default=float(_env("backoff", 30)),
        help="seconds a timed-out gang waits before trying again (default 30)")
    add("--debug-token", default=_env("debug-token", None),
        help="bearer token that opens /debug/* to non-loopback clients")
    add("--tls-cert", default=_env("tls-cert", None), help="serve HTTPS with this certificate")
    add("--tls-key", default=_env("tls-key", None), help="private key for --tls-cert")
    add("--webhook-port", type=int, default=_int_env("webhook-port"),
        help="also serve the mutating admission webhook (POST /mutate/pods) on this port, "
             "over HTTPS with a certificate of Lockstep's own (--webhook-cert-secret) or "
             "given as files (--webhook-cert and --webhook-key) (default: off)")
    add("--webhook-host", default=_env("webhook-host", "0.0.0.0"),
        help="listen address of the webhook port (default 0.0.0.0: the API server calls "
             "it through a Service)")
    add("--webhook-cert", default=_env("webhook-cert", None),
        help="serving certificate of the webhook port")
    add("--webhook-key", default=_env("webhook-key", None),
        help="private key for --webhook-cert")
    add("--webhook-cert-secret", default=_env("webhook-cert-secret", None) or None,
        metavar="NAMESPACE/NAME",
        help="issue and rotate the webhook's certificate itself, kept in this Secret, and "
             "keep the caBundle of --webhook-configuration in step (no cert-manager needed)")
    add("--webhook-configuration", default=_env("webhook-configuration", "lockstep"),
        help="the MutatingWebhookConfiguration whose caBundle Lockstep keeps "
             "(with --webhook-cert-secret; default lockstep)")
    add("--webhook-service", default=_env("webhook-service", "lockstep-webhook"),
        help="the Service the API server calls the webhook through, in the Secret's "
             "namespace: its DNS names go in the certificate (default lockstep-webhook)")
    add("--webhook-hosts", default=_env("webhook-hosts", ""),
        help="more DNS names or IPs for the certificate, comma-separated")
    add("--webhook-cert-check", type=float, default=float(_env("webhook-cert-check", 60)),
        help="seconds between checks of the Secret (renewal, another replica's rotation) and "
             "of the caBundle (put back when a re-apply wiped it) (default 60)")
    add("--leader-elect-lease", default=_env("leader-elect-lease", "") or None,
        metavar="NAMESPACE/NAME",
        help="act only while the sidecar kube-scheduler holds this Lease (its "
             "leaderElection resourceNamespace/resourceName); run two replicas with it "
             "(default: off, a single replica that always acts)")
    add("--leader-identity", default=_env("leader-identity", "") or None,
        help="the hostname kube-scheduler's holder identity starts with (default: this "
             "pod's hostname, which both containers of a pod share)")
    add("--lease-duration", type=float, default=float(_env("lease-duration", 15)),
        help="the sidecar's leaderElection.leaseDuration, seconds (default 15)")
    add("--renew-deadline", type=float, default=float(_env("renew-deadline", 10)),
        help="the sidecar's leaderElection.renewDeadline, seconds: this replica stops "
             "acting this long after the last renewal it saw (default 10)")
    add("--retry-period", type=float, default=float(_env("retry-period", 0.5)),
        help="the sidecar's leaderElection.retryPeriod, seconds; the Lease is read every "
             "half of it (default 0.5)")
    add("--topology-levels", default=_env("topology-levels", ""),
        help="topology levels between nodes, coarse to fine: name=label-key[,label-key...] "
             "separated by ';', ending with hostname=kubernetes.io/hostname (default: zone, "
             "block, rack, clique, hostname in the common vendors' label spellings)")
    add("--preemption", type=_flag, default=_env("preemption", "true"),
        help="a gang that does not fit evicts whole gangs and plain pods of strictly lower "
             "priority (default true; --preemption=false: priority only orders waiting gangs)")
    add("--defrag", type=_flag, default=_env("defrag", "true"),
        help="a gang that fits the free capacity overall but on no node it needs has the "
             "fewest movable pods moved off one node, each with room reserved elsewhere "
             "(default true; --defrag=false: it waits for room to come free)")
    add("--defrag-after", type=_seconds_0_3600, default=_env("defrag-after", "30"),
        help="seconds a gang waits before any pod moves for it (default 30)")
    add("--defrag-rate", type=_count_0_1000, default=_env("defrag-rate", "10"),
        help="pods moved per minute in the whole cluster, at most (default 10; 0: none)")
    add("--ui", type=_flag, default=_env("ui", "true"),
        help="serve the read-only web page at /ui on --port (default true; --ui=false)")
    add("--token", default=_env("token", None),
        help="API bearer token overriding the kubeconfig's (for least-privilege testing)")
    add("--log-level", default=_env("log-level", "info"))


def _webhook_problem(args: argparse.Namespace) -> str | None:
    """Why the webhook flags cannot work, or None (also None when the webhook is off)."""
    files = (args.webhook_cert, args.webhook_key)
    secret = args.webhook_cert_secret
    if args.webhook_port is None:
        if secret is not None or any(v is not None for v in files):
            return "--webhook-cert, --webhook-key and --webhook-cert-secret need --webhook-port"
        return None
    if not 0 < args.webhook_port < 65536:
        return f"--webhook-port {args.webhook_port} is not a port"
    if args.webhook_cert_check <= 0:
        return "--webhook-cert-check must be positive"
    if secret is not None:
        if any(v is not None for v in files):
            return ("--webhook-cert-secret and --webhook-cert/--webhook-key are two ways to "
                    "give the webhook a certificate: use one")
        ns, _, name = secret.partition("/")
        if not ns or not name or "/" in name:
            return f"--webhook-cert-secret {secret!r} is not NAMESPACE/NAME"
        return None
    if any(v is None for v in files):
        return ("--webhook-port needs a certificate: --webhook-cert-secret NAMESPACE/NAME "
                "(Lockstep's own), or --webhook-cert with --webhook-key (admission webhooks "
                "are served over HTTPS)")
    try:  # a bad certificate stops Lockstep here, before anything listens
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
            args.webhook_cert, args.webhook_key)
    except (OSError, ssl.SSLError) as e:
        return f"--webhook-cert/--webhook-key: {e}"
    return None


def _webhook_hosts(args: argparse.Namespace) -> list[str]:
    """The names the API server may call the webhook by: the Service's, then any given."""
    ns = args.webhook_cert_secret.partition("/")[0]
    svc = args.webhook_service
    extra = [h.strip() for h in args.webhook_hosts.split(",") if h.strip()]
    return [f"{svc}.{ns}.svc", f"{svc}.{ns}.svc.cluster.local", *extra]


def _serve(args: argparse.Namespace) -> int:
    from coscheduling import GangDefaults, Settings

    from .process import ProcessOptions, WebhookOptions, run

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if args.default_timeout <= 0 or args.max_timeout <= 0 or args.backoff < 0:
        print("lockstep: timeouts must be positive and --backoff not negative", file=sys.stderr)
        return 2
    if not 1 <= args.max_gang_size <= 2**31 - 1:
        print("lockstep: --max-gang-size must be between 1 and 2147483647", file=sys.stderr)
        return 2
    if bool(args.tls_cert) != bool(args.tls_key):
        print("lockstep: --tls-cert and --tls-key go together", file=sys.stderr)
        return 2
    if (problem := _webhook_problem(args)) is not None:
        print(f"lockstep: {problem}", file=sys.stderr)
        return 2
    names = args.scheduler_name or _env("scheduler-name", "lockstep").split(",")
    settings = Settings(
        scheduler_names=frozenset(n.strip() for n in names if n.strip()),
        defaults=GangDefaults(min(args.default_timeout, args.max_timeout), args.max_timeout,
                              max_gang_size=args.max_gang_size),
        backoff_seconds=args.backoff,
        preemption=args.preemption,
        defrag=args.defrag,
        defrag_after=args.defrag_after,
        defrag_rate=args.defrag_rate,
    )
    if args.topology_levels:
        from .kube.levels import LevelsError, parse_levels

        try:
            settings = dataclasses.replace(settings, levels=parse_levels(args.topology_levels))
        except LevelsError as e:
            print(f"lockstep: --topology-levels: {e}", file=sys.stderr)
            return 2
    webhook = None
    if args.webhook_port is not None:
        webhook = WebhookOptions(
            port=args.webhook_port, host=args.webhook_host, cert_file=args.webhook_cert,
            key_file=args.webhook_key, cert_secret=args.webhook_cert_secret,
            configuration=args.webhook_configuration,
            hosts=tuple(_webhook_hosts(args)) if args.webhook_cert_secret else (),
            cert_check=args.webhook_cert_check)
    lease = _lease_options(args)
    if isinstance(lease, str):
        print(f"lockstep: {lease}", file=sys.stderr)
        return 2
    return run(ProcessOptions(
        settings=settings, host=args.host, port=args.port, log_level=args.log_level,
        kubeconfig=args.kubeconfig, token=args.token, tls_cert=args.tls_cert,
        tls_key=args.tls_key, debug_token=args.debug_token, ui=args.ui, webhook=webhook,
        lease=lease))


def _lease_options(args: argparse.Namespace) -> LeaseOptions | str | None:
    """The Lease to follow, None when off, or why the flags cannot work."""
    if args.leader_elect_lease is None:
        return None
    from .kube.lease import LeaseTiming, pod_identity
    from .process import LeaseOptions

    ns, _, name = args.leader_elect_lease.partition("/")
    if not (ns and name) or "/" in name:
        return f"--leader-elect-lease {args.leader_elect_lease!r} is not NAMESPACE/NAME"
    try:
        timing = LeaseTiming(args.lease_duration, args.renew_deadline, args.retry_period)
    except ValueError as e:
        return str(e)
    return LeaseOptions(ns, name, args.leader_identity or pod_identity(), timing)


def _get(url: str, path: str, token: str | None) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    import httpx

    r = httpx.get(url.rstrip("/") + path, headers=headers, verify=False, timeout=10)
    if r.status_code >= 400:
        try:
            msg = r.json().get("error", r.text)
        except ValueError:
            msg = r.text
        raise SystemExit(f"lockstep: {r.status_code} from {path}: {msg}")
    return r.json()


def _status(args: argparse.Namespace) -> int:
    gangs = _get(args.url, "/debug/gangs", args.token)["gangs"]
    if not gangs:
        print("no gangs")
        return 0
    cols = ("GANG", "PHASE", "MIN", "MEMBERS", "BOUND", "PARKED", "RESERVED", "DEADLINE", "REASON")
    rows = [
        (
            g["gang"], g["phase"], str(g["minMember"] or "-"), str(g["members"]),
            str(g["bound"]), str(g["parked"]), str(len(g["reservation"])),
            f"{g['deadlineInSeconds']}s" if g["deadlineInSeconds"] is not None else "-",
            g["reason"] or "",
        )
        for g in gangs
    ]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols[:-1])]
    for r in (cols, *rows):
        print("  ".join(v.ljust(w) for v, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1])
    return 0


def _what_if(args: argparse.Namespace) -> int:
    """``explain --what-if FILE``: the dry plan's answer; exit 0 fits now, 1 must wait or
    preempt, 2 bad input or never fits (``app.http.whatif.EXIT_CODES``)."""
    import httpx

    from .http.whatif import MAX_BODY, WhatIfAnswer

    try:
        with open(args.what_if, "rb") if args.what_if != "-" else sys.stdin.buffer as f:
            body = f.read(MAX_BODY + 1)
    except OSError as e:
        print(f"lockstep: --what-if {args.what_if}: {e.strerror or e}", file=sys.stderr)
        return 2
    headers = {"Content-Type": "application/yaml"}
    if args.token:
        headers["Authorization"] = f"Bearer {args.token}"
    try:
        r = httpx.post(args.url.rstrip("/") + "/debug/what-if", content=body, headers=headers,
                       verify=False, timeout=60)
    except httpx.TransportError as e:
        print(f"lockstep: cannot reach {args.url}: {e}", file=sys.stderr)
        return 2
    if r.status_code >= 400:
        try:
            msg = r.json().get("error", r.text)
        except ValueError:
            msg = r.text
        print(f"lockstep: {args.what_if}: {msg}", file=sys.stderr)
        return 2
    answer = WhatIfAnswer.model_validate(r.json())
    print(r.text if args.output == "json" else answer.text)
    return answer.exitCode


def _explain(args: argparse.Namespace) -> int:
    if args.what_if is not None:
        return _what_if(args)
    if args.pod is None:
        print("lockstep explain: give a pod (namespace/name) or --what-if FILE",
              file=sys.stderr)
        return 2
    ns, _, name = args.pod.partition("/")
    if not name:
        ns, name = "default", ns
    info = _get(args.url, f"/debug/pods/{ns}/{name}", args.token)
    print(f"{info['pod']}: {info['explanation']}")
    if "gang" in info:
        g = info["gang"]
        print(f"  gang {g['gang']}: {g['phase']}, {g['bound']}/{g['minMember']} bound, "
              f"{g['parked']} parked, {g['members']} members")
    return 0


def _probe(args: argparse.Namespace) -> int:
    import httpx

    try:
        r = httpx.get(args.url.rstrip("/") + args.path, verify=False, timeout=3)
    except httpx.TransportError as e:
        print(f"lockstep probe: {e}", file=sys.stderr)
        return 1
    print(r.text.strip())
    return 0 if r.status_code == 200 else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lockstep", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    for name, helptext in (("status", "table of gangs from a running instance"),
                           ("explain", "why a pod is pending, or where it went")):
        p = sub.add_parser(name, help=helptext)
        if name == "explain":
            p.add_argument("pod", nargs="?", help="namespace/name")
            p.add_argument("--what-if", metavar="FILE", default=None,
                           help="would the objects in FILE (YAML; - for stdin) fit now, "
                                "after preemption, later or never? Creates nothing")
            p.add_argument("-o", "--output", choices=("text", "json"), default="text")
        p.add_argument("--url", default=_env("url", "http://127.0.0.1:8888"))
        p.add_argument("--token", default=_env("debug-token", None))
    probe = sub.add_parser("probe", help="exit 0 when a local endpoint answers 200 (for probes)")
    probe.add_argument("path", choices=["/healthz", "/readyz"])
    probe.add_argument("--url", default=_env("url", "http://127.0.0.1:8888"))
    sub.add_parser("label-node", help="label this node with its GPU topology", add_help=False)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["label-node"]:
        from .kube.labeller import main as label_main

        return int(label_main(argv[1:]))
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "status":
        return _status(args)
    if args.command == "probe":
        return _probe(args)
    return _explain(args)
