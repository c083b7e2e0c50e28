"""One Lockstep process: the service, the extender's server and the webhook's, in one loop.

``lockstep serve`` parses its flags into :class:`ProcessOptions` and hands them to
:func:`run`; everything between (the order things start in, who stops whom, what a failure
of each part means for the exit code) lives here, where a test can run it in-process
with an API client of its own.

The start-up order is for kube-scheduler's sake: the cache lists the cluster first (the API
server encodes the lists while uvicorn and the verbs are imported in a thread), then the
extender's server listens and answers verbs and probes, and FastAPI (metrics, debug, the
webhook's routes) is imported on the first request for another path, or at once when the
webhook is served. A process that cannot serve its webhook stops, saying why, rather than
run without the placement users expect (the webhook fails open).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from coscheduling import Coscheduler, Settings

from .kube.client import KubeClient, load_config
from .kube.errors import APIError, APIUnreachable
from .kube.lease import LeaseFollower, LeaseTiming
from .service import Lockstep

if TYPE_CHECKING:
    from starlette.types import ASGIApp

    from .http.verbs import VerbsApp
    from .kube.certs import WebhookCerts
    from .servers import ExtenderServer, WebhookServer

__all__ = ["LeaseOptions", "LockstepProcess", "ProcessOptions", "WebhookOptions",
           "extender_app", "run", "webhook_app"]

log = logging.getLogger("lockstep")

CERT_ATTEMPTS = 60
"""How often the webhook's certificate is tried while the API server cannot be reached
(the webhook's ``failurePolicy: Ignore`` admits pods meanwhile), backing off to 10 s."""


@dataclass(frozen=True)
class WebhookOptions:
    """The admission webhook's server: where it listens and where its certificate comes
    from, either files (``cert_file``/``key_file``) or a Secret Lockstep issues and rotates
    itself (``cert_secret``, ``NAMESPACE/NAME``), keeping ``configuration``'s caBundle in
    step."""

    port: int
    host: str = "0.0.0.0"
    cert_file: str | None = None
    key_file: str | None = None
    cert_secret: str | None = None
    configuration: str = "lockstep"
    hosts: tuple[str, ...] = ()
    """The names the API server may call the webhook by (in the issued certificate)."""
    cert_check: float = 60.0
    """Seconds between checks of the issued certificate (rotation, a wiped caBundle)."""


@dataclass(frozen=True)
class LeaseOptions:
    """The Lease the sidecar kube-scheduler holds (its ``leaderElection``), which this
    replica follows (``app.kube.lease``): it acts only while its sidecar leads."""

    namespace: str
    name: str
    identity: str
    """This pod's hostname: the part of kube-scheduler's holder identity before ``_``."""
    timing: LeaseTiming = LeaseTiming()


@dataclass(frozen=True)
class ProcessOptions:
    """What ``lockstep serve`` was told, checked: the core's settings and the servers'."""

    settings: Settings
    host: str = "0.0.0.0"
    port: int = 8888
    log_level: str = "info"
    kubeconfig: str | None = None
    token: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    debug_token: str | None = None
    ui: bool = True
    webhook: WebhookOptions | None = None
    lease: LeaseOptions | None = None
    """None: a single replica, acting always."""


def extender_app(service: Lockstep, *, debug_token: str | None = None, ui: bool = True,
                 max_body: int | None = None, lazy: bool = False) -> VerbsApp:
    """Everything Lockstep answers on the extender's port, as one ASGI app: the verbs and
    probes (``app.http.verbs``), then metrics, debug, the page and the webhook's route
    (``app.http.routes``). The process, the tests and the benchmarks all build it here.

    ``lazy``: the routes beside the verbs (FastAPI) are imported, in a thread, on the first
    request for one of them, as the process serves them: importing FastAPI while
    kube-scheduler sends the first gangs cost 100-185 ms per cycle."""
    from .http.verbs import DEFAULT_MAX_BODY, VerbsApp

    def rest() -> ASGIApp:
        from .http.routes import create_rest_app

        return create_rest_app(service, debug_token=debug_token, ui=ui)

    async def load_rest() -> ASGIApp:
        await asyncio.to_thread(_import_rest_side)
        return rest()

    body = DEFAULT_MAX_BODY if max_body is None else max_body
    if lazy:
        return VerbsApp(service, max_body=body, load_rest=load_rest)
    return VerbsApp(service, max_body=body, rest=rest())


def webhook_app(service: Lockstep) -> ASGIApp:
    """The admission webhook's own app (``/mutate/pods`` and a probe), served over TLS."""
    from .http.webhook import create_webhook_app

    return create_webhook_app(service)


class LockstepProcess:
    """Runs one :class:`~app.service.Lockstep` behind its servers until it stops.

    The exit code of :meth:`run` is 0 after a clean stop (SIGTERM, :meth:`stop`), 1 when a
    background task of the service failed or a server could not serve (the port taken, the
    webhook's routes or certificate out of reach)."""

    def __init__(self, options: ProcessOptions, *, kube: KubeClient | None = None) -> None:
        self.options = options
        self._kube = kube
        self.service: Lockstep | None = None
        self._extender: ExtenderServer | None = None
        self._webhook: WebhookServer | None = None
        self._serving_failed = False
        self._stop_asked = False

    async def run(self) -> int:
        o = self.options
        kube = self._kube or KubeClient(load_config(o.kubeconfig, o.token))
        leader = None if o.lease is None else LeaseFollower(
            kube, o.lease.namespace, o.lease.name, o.lease.identity, timing=o.lease.timing)
        service = self.service = Lockstep(Coscheduler(o.settings), kube, verbs_later=True,
                                          webhook_later=o.webhook is not None, leader=leader)
        await service.start()  # lists and watches first
        await asyncio.to_thread(_import_verbs_side)  # the loop keeps listing meanwhile
        try:
            return await self._serve(service)
        finally:
            await service.stop()  # when the server never started (its own shutdown stops it)

    def stop(self) -> None:
        """Stop as SIGTERM would, from inside the loop (tests, embedding)."""
        self._stop_asked = True
        if self._extender is not None:
            self._extender.stop()

    def _fail(self, why: str) -> None:
        """A server could not serve: everything stops, and the process exits 1."""
        log.error("%s; stopping", why)
        self._serving_failed = True
        if self._extender is not None:
            self._extender.should_exit = True

    async def _serve(self, service: Lockstep) -> int:
        import uvicorn

        from .servers import ExtenderServer

        o = self.options
        app = extender_app(service, debug_token=o.debug_token, ui=o.ui, lazy=True)
        self._extender = ExtenderServer(uvicorn.Config(
            app, host=o.host, port=o.port, log_level=o.log_level.lower(),
            ssl_certfile=o.tls_cert, ssl_keyfile=o.tls_key, access_log=False,
            timeout_keep_alive=75), service)
        if self._stop_asked:
            self._extender.should_exit = True
        watchdog = asyncio.create_task(self._stop_when_stopped(service), name="watchdog")
        webhook = None if o.webhook is None else asyncio.create_task(
            self._serve_webhook(service, app, o.webhook), name="webhook")
        try:
            await self._extender.serve()
        except SystemExit:  # uvicorn could not listen (the port is taken); it said why
            self._fail("the extender's server cannot listen")
        finally:
            watchdog.cancel()
            if webhook is not None:
                if self._webhook is not None:
                    self._webhook.should_exit = True
                else:
                    webhook.cancel()  # still loading its routes: nothing to stop
                with contextlib.suppress(asyncio.CancelledError):
                    await webhook
        return 1 if service.failed is not None or self._serving_failed else 0

    async def _stop_when_stopped(self, service: Lockstep) -> None:
        """A background task of the service failed: the servers stop too."""
        await service.stopped.wait()
        if self._extender is not None:
            self._extender.should_exit = True

    async def _serve_webhook(self, service: Lockstep, app: VerbsApp, w: WebhookOptions
                             ) -> None:
        import uvicorn

        from .servers import WebhookServer

        try:
            await app.load_rest()
        except Exception:
            log.exception("loading the webhook's routes failed")
            self._fail("the webhook cannot be served")
            return
        cert_file, key_file, certs = w.cert_file, w.key_file, None
        if w.cert_secret is not None:
            certs = await own_certificate(service.kube, w)
            if certs is None:
                self._fail("the webhook has no certificate")
                return
            cert_file, key_file = str(certs.cert_file), str(certs.key_file)
        server = self._webhook = WebhookServer(uvicorn.Config(
            webhook_app(service), host=w.host, port=w.port,
            log_level=self.options.log_level.lower(), ssl_certfile=cert_file,
            ssl_keyfile=key_file, access_log=False, lifespan="off"), service)
        rotation = None
        if certs is not None:
            issued = certs

            def reload() -> None:
                if server.reload_certificate(str(issued.cert_file), str(issued.key_file)):
                    log.info("webhook certificate reloaded")

            rotation = asyncio.create_task(issued.run(reload, period=w.cert_check),
                                           name="webhook-certs")
        try:
            await server.serve()
        except SystemExit:  # uvicorn could not start it (the port is taken)
            pass
        finally:
            if rotation is not None:
                rotation.cancel()
            if self._extender is not None and not self._extender.should_exit:
                self._fail("the webhook server stopped")


async def own_certificate(kube: KubeClient, w: WebhookOptions) -> WebhookCerts | None:
    """The webhook's certificate from its Secret, issued there first when missing; retried
    while the API server cannot be reached. None when the Secret cannot be written: Lockstep
    then stops, saying why, rather than serve a webhook the API server cannot trust."""
    from .kube.certs import WebhookCerts

    if w.cert_secret is None:
        return None
    ns, _, name = w.cert_secret.partition("/")
    certs = WebhookCerts(kube, namespace=ns, secret=name, webhook_config=w.configuration,
                         hosts=list(w.hosts))
    for attempt in range(CERT_ATTEMPTS):
        try:
            await certs.ensure()
            return certs
        except APIUnreachable as e:
            log.warning("webhook certificate: API server unreachable, retrying: %s", e)
        except APIError as e:
            if e.status in (401, 403):
                log.error("webhook certificate: not allowed to keep Secret %s/%s or the "
                          "caBundle of %s (RBAC: deploy/webhook/rbac.yaml): %s", ns, name,
                          w.configuration, e)
                return None
            log.warning("webhook certificate: %s, retrying", e)
        await asyncio.sleep(min(2.0 * (attempt + 1), 10.0))
    log.error("webhook certificate: gave up after %d attempts", CERT_ATTEMPTS)
    return None


def run(options: ProcessOptions) -> int:
    """Run a Lockstep process to its end; returns its exit code.

    On uvloop when installed (uvicorn[standard] brings it): the event loop runs every verb,
    binding and watch, and kube-scheduler's scheduling thread waits on it."""
    process = LockstepProcess(options)
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.run(process.run())
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(process.run())


def _import_verbs_side() -> None:
    """uvicorn and the verbs: imported in a thread while the loop lists."""
    import uvicorn
    import uvicorn.lifespan.on
    import uvicorn.protocols.http.httptools_impl  # noqa: F401

    from . import servers  # noqa: F401
    from .http import verbs  # noqa: F401


def _import_rest_side() -> None:
    """FastAPI and the routes beside the verbs: imported in a thread, the verbs answering."""
    from .http import routes, webhook  # noqa: F401
