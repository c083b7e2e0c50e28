"""The ``lockstep`` command: ``serve``, ``status``, ``explain``, ``label-node``.

``serve`` runs the extender (and debug API) on ``--host``/``--port``; with ``--webhook-port``
it also serves the mutating admission webhook over HTTPS on a second server in the same
process and event loop (``app/admission.py``), so the extender can stay on plain loopback HTTP.

Every ``serve`` flag also reads an environment variable (``LOCKSTEP_<FLAG>``), so a
Deployment can configure it either way; flags win.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import ssl
import sys
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["main"]


MAX_GANG_SIZE = 1000
"""``--max-gang-size``'s default (``coscheduling.podgroup.DEFAULT_MAX_GANG_SIZE``, kept here
so the parser does not import the core)."""


def _env(name: str, default: Any) -> Any:
    return os.environ.get("LOCKSTEP_" + name.upper().replace("-", "_"), default)


def _int_env(name: str) -> int | None:
    value = _env(name, None)
    return int(value) if value else None


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
    add("--topology-levels", default=_env("topology-levels", ""),
        help="topology levels between nodes, coarse to fine: name=label-key[,label-key...] "
             "separated by ';', ending with hostname=kubernetes.io/hostname (default: zone, "
             "block, rack, clique, hostname in the common vendors' label spellings)")
    add("--preemption", type=_flag, default=_env("preemption", "true"),
        help="a gang that does not fit evicts whole gangs and plain pods of strictly lower "
             "priority (default true; --preemption=false: priority only orders waiting gangs)")
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
    from coscheduling import Coscheduler, GangDefaults, Settings

    from .kube import KubeClient, load_config
    from .service import Lockstep

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
    )
    if args.topology_levels:
        from .levels import LevelsError, parse_levels

        try:
            settings = dataclasses.replace(settings, levels=parse_levels(args.topology_levels))
        except LevelsError as e:
            print(f"lockstep: --topology-levels: {e}", file=sys.stderr)
            return 2

    async def run() -> int:
        service = Lockstep(Coscheduler(settings), KubeClient(load_config(args.kubeconfig,
                                                                         args.token)))
        # List and watch first: the API server encodes the lists while uvicorn and the verbs
        # load below. Held gangs wait for the verbs to be served: a lifted
        # member's filter call must find them.
        service.verbs_served = False
        await service.start()
        await asyncio.to_thread(_import_verbs_side)  # the loop keeps listing meanwhile
        try:
            return await serve(service)
        finally:
            await service.stop()  # when the server never started (its own shutdown stops it)

    async def serve(service: Lockstep) -> int:
        import uvicorn

        from .verbs import VerbsApp

        async def load_rest() -> Any:
            await asyncio.to_thread(_import_rest_side)
            from .routes import create_rest_app

            return create_rest_app(service, debug_token=args.debug_token,
                                   manage_lifecycle=False, ui=args.ui)

        # The verbs and probes answer from the start. FastAPI (metrics, debug, the webhook)
        # is imported on the first request for another path, or at once for --webhook-port:
        # importing it while kube-scheduler sends the first gangs cost 100-185 ms per cycle.
        app = VerbsApp(service, load_rest=load_rest)
        config = uvicorn.Config(
            app, host=args.host, port=args.port, log_level=args.log_level.lower(),
            ssl_certfile=args.tls_cert, ssl_keyfile=args.tls_key, access_log=False,
            timeout_keep_alive=75,
        )
        server = _make_server_class()(config, service)
        serving_failed = False  # the webhook server, or loading the routes it needs
        webhook: Any = None

        async def watchdog() -> None:
            await service.stopped.wait()
            server.should_exit = True

        async def serve_webhook(port: int) -> None:
            nonlocal serving_failed, webhook
            try:
                await app.load_rest()
            except Exception:
                logging.getLogger("lockstep").exception("loading the webhook's routes failed")
                serving_failed = True
                server.should_exit = True
                return
            from .admission import create_webhook_app

            cert_file, key_file = args.webhook_cert, args.webhook_key
            certs = None
            if args.webhook_cert_secret is not None:
                certs = await _own_certificate(service.kube, args)
                if certs is None:
                    serving_failed = True
                    server.should_exit = True
                    return
                cert_file, key_file = str(certs.cert_file), str(certs.key_file)
            webhook = _make_webhook_server_class()(service, uvicorn.Config(
                create_webhook_app(service), host=args.webhook_host, port=port,
                log_level=args.log_level.lower(), ssl_certfile=cert_file,
                ssl_keyfile=key_file, access_log=False, lifespan="off",
            ))
            rotation = None
            if certs is not None:
                def reload() -> None:  # new handshakes use the new certificate
                    if webhook.config.ssl is None:  # not loaded yet: it reads the new files
                        return
                    webhook.config.ssl.load_cert_chain(certs.cert_file, certs.key_file)
                    logging.getLogger("lockstep").info("webhook certificate reloaded")

                rotation = asyncio.create_task(
                    certs.run(reload, period=args.webhook_cert_check), name="webhook-certs")
            try:
                await webhook.serve()
            except SystemExit:  # uvicorn could not start it (the port is taken)
                pass
            finally:
                if rotation is not None:
                    rotation.cancel()
                if not server.should_exit:  # it stopped on its own: stop everything
                    logging.getLogger("lockstep").error("the webhook server stopped")
                    serving_failed = True
                    server.should_exit = True

        guard = asyncio.create_task(watchdog(), name="watchdog")
        webhook_task = None
        if args.webhook_port is not None:
            service.webhook_listening = False
            webhook_task = asyncio.create_task(serve_webhook(args.webhook_port), name="webhook")
        try:
            await server.serve()
        finally:
            guard.cancel()
            if webhook_task is not None:
                if webhook is not None:
                    webhook.should_exit = True
                else:
                    webhook_task.cancel()  # still importing: nothing to stop
                with contextlib.suppress(asyncio.CancelledError):
                    await webhook_task
        return 1 if service.failed is not None or serving_failed else 0

    # uvloop when installed (uvicorn[standard] brings it): the event loop runs every verb,
    # binding and watch, and kube-scheduler's scheduling thread waits on it.
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.run(run())
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(run())


async def _own_certificate(kube: Any, args: argparse.Namespace) -> Any:
    """The webhook's certificate from its Secret, issued there first when missing; retried
    while the API server cannot be reached (the webhook's ``failurePolicy: Ignore`` admits
    pods meanwhile). None when the Secret cannot be written: Lockstep then stops, saying why,
    rather than serve a webhook the API server cannot trust."""
    from .certs import WebhookCerts
    from .errors import APIError, APIUnreachable

    ns, _, name = args.webhook_cert_secret.partition("/")
    certs = WebhookCerts(kube, namespace=ns, secret=name,
                         webhook_config=args.webhook_configuration, hosts=_webhook_hosts(args))
    log = logging.getLogger("lockstep")
    for attempt in range(60):
        try:
            await certs.ensure()
            return certs
        except APIUnreachable as e:
            log.warning("webhook certificate: API server unreachable, retrying: %s", e)
        except APIError as e:
            if e.status in (401, 403):
                log.error("webhook certificate: not allowed to keep Secret %s/%s or the "
                          "caBundle of %s (RBAC: deploy/webhook/rbac.yaml): %s", ns, name,
                          args.webhook_configuration, e)
                return None
            log.warning("webhook certificate: %s, retrying", e)
        await asyncio.sleep(min(2.0 * (attempt + 1), 10.0))
    log.error("webhook certificate: gave up after 60 attempts")
    return None


def _import_verbs_side() -> None:
    """uvicorn and the verbs: imported in a thread while the loop lists."""
    import uvicorn
    import uvicorn.lifespan.on
    import uvicorn.protocols.http.httptools_impl  # noqa: F401

    from . import verbs  # noqa: F401


def _import_rest_side() -> None:
    """FastAPI and the routes beside the verbs: imported in a thread, the verbs answering."""
    from . import admission, routes  # noqa: F401


def _make_server_class() -> Any:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, answering parked bind calls the moment SIGTERM arrives.

        uvicorn waits for in-flight requests before it runs the lifespan shutdown, and a
        parked bind is an in-flight request that may last until its gang's deadline: without
        this a rolling update would stall for minutes. kube-scheduler retries the
        answered calls against the next Lockstep.
        """

        def __init__(self, config: uvicorn.Config, service: Any) -> None:
            super().__init__(config)
            self._service = service
            self._loop: asyncio.AbstractEventLoop | None = None

        async def serve(self, sockets: Any = None) -> None:
            self._loop = asyncio.get_running_loop()
            await super().serve(sockets)

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if not self.should_exit:  # listening: held gangs may be lifted now
                self._service.serve_verbs()

        async def shutdown(self, sockets: Any = None) -> None:
            # The service stops here, not after serve() returns: uvicorn then re-raises
            # the signal it caught, and asyncio's SIGINT handler would cancel the stop
            # half way (a watch still closing while the client is closed under it).
            await super().shutdown(sockets)
            await self._service.stop()

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.call_soon_threadsafe(
                    self._service.answer_parked,
                    "Lockstep is shutting down; kube-scheduler will retry this bind")
            super().handle_exit(sig, frame)

    return Server


def _make_webhook_server_class() -> Any:
    import uvicorn

    class WebhookServer(uvicorn.Server):
        """A second server in the same loop: signals are the extender server's to handle
        (it answers parked binds first); this one stops when that one has. Lockstep is
        ready only once it listens."""

        def __init__(self, service: Any, config: uvicorn.Config) -> None:
            super().__init__(config)
            self._service = service

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if not self.should_exit:
                self._service.webhook_listening = True

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return WebhookServer


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


def _explain(args: argparse.Namespace) -> int:
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
            p.add_argument("pod", help="namespace/name")
        p.add_argument("--url", default=_env("url", "http://127.0.0.1:8888"))
        p.add_argument("--token", default=_env("debug-token", None))
    probe = sub.add_parser("probe", help="exit 0 when a local endpoint answers 200 (for probes)")
    probe.add_argument("path", choices=["/healthz", "/readyz"])
    probe.add_argument("--url", default=_env("url", "http://127.0.0.1:8888"))
    sub.add_parser("label-node", help="label this node with its GPU topology", add_help=False)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["label-node"]:
        from .labeller import main as label_main

        return int(label_main(argv[1:]))
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "status":
        return _status(args)
    if args.command == "probe":
        return _probe(args)
    return _explain(args)
