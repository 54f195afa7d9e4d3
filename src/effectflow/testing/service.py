"""The simulated providers as a local HTTP service, so tests cross a real network boundary.

In process, a lost response is an exception raised after a commit. Over HTTP it is what it is in
production: the provider commits, then never answers in time, and the client's read timeout
fires while the server is still holding the connection. Chaos tests and benchmarks that go
through this service therefore exercise real sockets, real timeouts and a real second process.

Every provider operation is JSON over HTTP. Idempotency keys travel in the ``Idempotency-Key``
header (IETF draft ``httpapi-idempotency-key-header``), preconditions in ``If-Match``; lists
answer ``{"data": [...]}``; a lookup that finds nothing answers 404 ``not_found``.

Each provider's routes are made from its table (``MailApi`` in ``mail.py``, ``CrmApi``,
``NotifyApi``, ``PaymentsApi``, ``DeployApi``; see :mod:`effectflow.testing.http_api`): one entry
per operation, the provider method it calls and where each argument travels, from which the HTTP
clients are made too. Beside them, the service's own endpoints::

    POST /_admin/inject                             [inject: provider, operation, fault, times, after]
    POST /_admin/clear_faults                       [clear_faults: provider]
    GET  /_admin/calls/{provider}?operation=        [calls]
    GET  /_admin/health                             {"status": "ok", "providers": {kind: file}}

Errors answer ``{"code", "message", ...}`` with the status the provider's exception carries:
:class:`ProviderUnavailable` 503, :class:`ProviderRejected` its 4xx, :class:`IdempotencyKeyReused`
422 (with ``idempotency_key``), :class:`RevisionConflict` 412 (with ``target``, ``expected``,
``current``), a ``ValueError`` of the provider's API 400 ``invalid_argument``, a malformed
request 400 ``invalid_request``. A :class:`ProviderTimeout` is not answered: the server holds the
request until the client hangs up, the service shuts down or ``hang`` seconds pass, and only then
answers 504 ``timeout`` (a gateway's "outcome unknown").
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any, cast

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from effectflow.testing import _base, crm, deploy, http_api, mail, notify, payments
from effectflow.testing.crm import CrmProvider
from effectflow.testing.deploy import DeployTarget, RevisionConflict
from effectflow.testing.mail import MailProvider
from effectflow.testing.notify import NotifyProvider
from effectflow.testing.payments import PaymentsProvider

#: The file each provider keeps its state in, inside the service's directory.
PROVIDER_FILES: dict[str, str] = {
    "mail": "mail.db",
    "crm": "crm.db",
    "notify": "notify.db",
    "payments": "payments.db",
    "deploy": "deploy.db",
}

#: Each provider's HTTP API, in the order its routes are matched.
TABLES: tuple[type[http_api.Table], ...] = (
    mail.MailApi,
    crm.CrmApi,
    notify.NotifyApi,
    payments.PaymentsApi,
    deploy.DeployApi,
)

#: Seconds a lost response is held back at most; it must exceed the clients' read timeout.
DEFAULT_HANG_S = 60.0

#: How often a held-back request checks whether its client hung up or the service is stopping.
_POLL_S = 0.02

#: Idle keep-alive connections live longer on the server than in an httpx client (5 s), so the
#: client always closes first: a request sent on a connection the server just closed would look
#: like a lost response.
_KEEP_ALIVE_S = 30.0

#: A bound on graceful shutdown, in case a request hangs somewhere other than a held response.
_GRACEFUL_SHUTDOWN_S = 5.0


def provider_path(directory: str | os.PathLike[str], kind: str) -> Path:
    """The SQLite file of provider ``kind`` in a service directory, to read the truth directly.

    Raises:
        ValueError: ``kind`` is not one of :data:`PROVIDER_FILES`.
    """
    if kind not in PROVIDER_FILES:
        raise ValueError(f"unknown provider {kind!r} (known: {', '.join(PROVIDER_FILES)})")
    return Path(directory) / PROVIDER_FILES[kind]


@dataclasses.dataclass(frozen=True)
class ProviderSet:
    """The five simulated providers one service answers for, each on its own file."""

    #: Transactional mail (``mail.db``).
    mail: MailProvider
    #: CRM tasks (``crm.db``).
    crm: CrmProvider
    #: Chat notifications (``notify.db``).
    notify: NotifyProvider
    #: Refunds (``payments.db``).
    payments: PaymentsProvider
    #: Deployments (``deploy.db``).
    deploy: DeployTarget

    @classmethod
    def open(cls, directory: str | os.PathLike[str]) -> ProviderSet:
        """Open (creating if needed) every provider's file in ``directory``."""
        Path(directory).mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as stack:
            providers = cls(
                mail=stack.enter_context(MailProvider(provider_path(directory, "mail"))),
                crm=stack.enter_context(CrmProvider(provider_path(directory, "crm"))),
                notify=stack.enter_context(NotifyProvider(provider_path(directory, "notify"))),
                payments=stack.enter_context(
                    PaymentsProvider(provider_path(directory, "payments"))
                ),
                deploy=stack.enter_context(DeployTarget(provider_path(directory, "deploy"))),
            )
            stack.pop_all()
        return providers

    def get(self, kind: str) -> _base.SqliteProvider:
        """The provider named ``kind``.

        Raises:
            ValueError: No such provider.
        """
        if kind not in PROVIDER_FILES:
            raise ValueError(f"unknown provider {kind!r} (known: {', '.join(PROVIDER_FILES)})")
        provider: _base.SqliteProvider = getattr(self, kind)
        return provider

    def close(self) -> None:
        """Close every provider's connection."""
        for kind in PROVIDER_FILES:
            self.get(kind).close()


Handler = Callable[[Request], Awaitable[Any]]


def create_app(
    providers: ProviderSet,
    *,
    hang: float = DEFAULT_HANG_S,
    stopping: Callable[[], bool] = lambda: False,
) -> Starlette:
    """The ASGI app answering for ``providers`` (see the module docstring for the endpoints).

    Args:
        providers: Open providers; the caller closes them after the app is done.
        hang: Seconds a lost response is held back at most before answering 504.
        stopping: True once the server is shutting down, so held-back requests end early.
    """
    return _Service(providers, hang=hang, stopping=stopping).app()


class _Service:
    """The endpoints, as methods over one :class:`ProviderSet`."""

    def __init__(
        self, providers: ProviderSet, *, hang: float, stopping: Callable[[], bool]
    ) -> None:
        self._p = providers
        self._hang = hang
        self._stopping = stopping

    def app(self) -> Starlette:
        shared: dict[tuple[str, str], tuple[str, list[http_api.Endpoint[..., Any]]]] = {}
        for table in TABLES:
            for entry in table.endpoints():
                kind, entries = shared.setdefault((entry.route, entry.verb), (table.KIND, []))
                entries.append(entry)
        routes = []
        for (path, verb), (kind, entries) in shared.items():
            http_api.check_shared(entries)
            routes.append(
                Route(path, self._endpoint(self._operation(kind, entries)), methods=[verb])
            )
        get, post = ["GET"], ["POST"]
        admin: list[tuple[str, list[str], Handler]] = [
            ("/_admin/inject", post, self.admin_inject),
            ("/_admin/clear_faults", post, self.admin_clear_faults),
            ("/_admin/calls/{provider}", get, self.admin_calls),
            ("/_admin/health", get, self.admin_health),
        ]
        routes += [Route(path, self._endpoint(h), methods=m) for path, m, h in admin]
        return Starlette(routes=routes)

    def _operation(self, kind: str, entries: list[http_api.Endpoint[..., Any]]) -> Handler:
        """The handler of one route: the provider's method its request selects, called with the
        arguments the table says where to find."""

        async def handler(request: Request) -> Any:
            entry = http_api.choose(entries, request.query_params)
            body = await _json_body(request) if entry.body else {}
            arguments = entry.arguments(
                request.path_params, request.query_params, request.headers, body
            )
            method = getattr(self._p.get(kind), entry.operation)
            result = await run_in_threadpool(method, **arguments)
            status, content, headers = entry.answer.encode(entry.operation, result)
            if content is None:
                return Response(status_code=status)
            return JSONResponse(content, status_code=status, headers=headers)

        return handler

    # -- the edge: exceptions to HTTP ------------------------------------------------------------

    def _endpoint(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                due = _deadline_header(request)
                token = _base.REQUEST_DEADLINE.set(due)
                try:
                    result = await handler(request)
                finally:
                    _base.REQUEST_DEADLINE.reset(token)
            except _base.ProviderTimeout as exc:
                return await self._hold(request, exc)
            except _base.ProviderError as exc:
                return _problem(exc.status, exc.code, str(exc), **_details(exc))
            except http_api.BadRequest as exc:
                return _problem(400, "invalid_request", str(exc))
            except ValueError as exc:
                return _problem(400, "invalid_argument", str(exc))
            if isinstance(result, Response):
                return result
            return JSONResponse(result)

        return endpoint

    async def _hold(self, request: Request, exc: _base.ProviderTimeout) -> Response:
        """Do not answer: a lost response, seen from the client, is a read timeout.

        The effect (for ``lose_response``) committed before the provider raised, so by the time
        the client gives up the provider's file already shows it. Waking early when the client
        hangs up frees the task; waking on shutdown lets SIGTERM stop the service promptly.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._hang
        while loop.time() < deadline and not self._stopping():
            if await request.is_disconnected():
                break
            await asyncio.sleep(_POLL_S)
        return _problem(504, "timeout", str(exc))

    # -- admin -----------------------------------------------------------------------------------

    async def admin_inject(self, request: Request) -> Any:
        body = await _json_body(request)
        provider = self._p.get(http_api.TEXT.read(body, "provider"))
        times, after = (
            http_api.OPTIONAL_INT.read(body, "times"),
            http_api.OPTIONAL_INT.read(body, "after"),
        )
        await run_in_threadpool(
            provider.inject,
            http_api.TEXT.read(body, "operation"),
            _fault(http_api.TEXT.read(body, "fault")),
            times=1 if times is None else times,
            after=0 if after is None else after,
        )
        return Response(status_code=204)

    async def admin_clear_faults(self, request: Request) -> Any:
        body = await _json_body(request)
        await run_in_threadpool(self._p.get(http_api.TEXT.read(body, "provider")).clear_faults)
        return Response(status_code=204)

    async def admin_calls(self, request: Request) -> Any:
        provider = self._p.get(request.path_params["provider"])
        operation = request.query_params.get("operation")
        return {"data": await run_in_threadpool(provider.calls, operation)}

    async def admin_health(self, request: Request) -> Any:
        files = {kind: self._p.get(kind).path for kind in PROVIDER_FILES}
        return {"status": "ok", "providers": files}


# -- request and response helpers ----------------------------------------------------------------


async def _json_body(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError as exc:
        raise http_api.BadRequest("the body is not JSON") from exc
    if not isinstance(body, dict):
        raise http_api.BadRequest("the body must be a JSON object")
    return body


def _fault(value: str) -> _base.FaultKind:
    # Unchecked on purpose: ``inject`` refuses an unknown fault with the same ValueError as in
    # process, which answers 400 invalid_argument.
    return cast(_base.FaultKind, value)


def _problem(status: int, code: str, message: str, **details: Any) -> JSONResponse:
    return JSONResponse({"code": code, "message": message, **details}, status_code=status)


def _details(exc: _base.ProviderError) -> dict[str, Any]:
    """The attributes a client needs to raise the same exception the provider raised."""
    if isinstance(exc, RevisionConflict):
        return {"target": exc.target, "expected": exc.expected, "current": exc.current}
    if isinstance(exc, _base.IdempotencyKeyReused):
        return {"idempotency_key": exc.idempotency_key}
    if isinstance(exc, _base.ProviderUnavailable):
        return {"operation": exc.operation}
    return {}


# -- running the service -------------------------------------------------------------------------


def serve(
    directory: str | os.PathLike[str],
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    hang: float = DEFAULT_HANG_S,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Run the service in this process until SIGINT or SIGTERM, then return normally.

    One uvicorn worker, in-process. The providers' files live in ``directory`` (created if
    missing) and are closed on the way out.

    Args:
        directory: Where the providers' SQLite files live.
        host: Interface to listen on.
        port: TCP port; 0 picks a free one.
        hang: Seconds a lost response is held back at most (see :func:`create_app`).
        on_ready: Called with the base URL (``http://127.0.0.1:PORT``) once listening.

    Raises:
        RuntimeError: The service could not listen (uvicorn has logged why).
    """
    providers = ProviderSet.open(directory)
    try:
        stopping = threading.Event()
        app = create_app(providers, hang=hang, stopping=stopping.is_set)
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            loop="asyncio",
            http="h11",
            ws="none",
            lifespan="off",
            log_level="warning",
            access_log=False,
            timeout_keep_alive=int(_KEEP_ALIVE_S),
            timeout_graceful_shutdown=int(_GRACEFUL_SHUTDOWN_S),
        )
        server = _Server(config, stopping=stopping, on_ready=on_ready)
        with _signals_end_cleanly():
            try:
                server.run()
            except SystemExit as exc:
                # uvicorn logs why it could not start (address in use...) and then exits.
                raise RuntimeError(f"could not listen on {host}:{port}") from exc
    finally:
        providers.close()


class _Server(uvicorn.Server):
    """uvicorn's server, telling the app when shutdown starts and the caller when it listens."""

    def __init__(
        self,
        config: uvicorn.Config,
        *,
        stopping: threading.Event,
        on_ready: Callable[[str], None] | None,
    ) -> None:
        super().__init__(config)
        self._stopping = stopping
        self._on_ready = on_ready

    async def startup(self, sockets: list[Any] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and self._on_ready is not None:
            listening = self.servers[0].sockets[0].getsockname()
            host, port = str(listening[0]), int(listening[1])
            self._on_ready(f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}")

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._stopping.set()
        super().handle_exit(sig, frame)


@contextlib.contextmanager
def _signals_end_cleanly() -> Iterator[None]:
    """Make a SIGINT/SIGTERM that uvicorn has already handled end the process with status 0.

    uvicorn shuts down gracefully on these signals and then re-raises the signal into the
    handlers that were installed before it ran, so that the process dies "of" the signal. A
    service that shut down cleanly should exit 0, so those handlers do nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handled = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, _already_handled) for sig in handled}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _already_handled(sig: int, frame: FrameType | None) -> None:
    """The signal was uvicorn's to handle, and it has: nothing is left to do."""


def _deadline_header(request: Request) -> float | None:
    """The caller's deadline (``X-Request-Deadline``, epoch seconds), if it sent one."""
    raw = request.headers.get("x-request-deadline")
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError:
        raise http_api.BadRequest(
            f"X-Request-Deadline must be epoch seconds, not {raw!r}"
        ) from None
