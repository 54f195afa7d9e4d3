"""HTTP clients for the providers' service, with the in-process providers' API and exceptions.

``HttpMail(url).send(...)`` takes the same arguments, returns the same dict and raises the same
exceptions as ``MailProvider(path).send(...)``, so a test or benchmark can swap one for the other
and put a real network boundary between the caller and the provider. What the network adds is
mapped the way a careful client maps it:

- Nothing was sent (connection refused, connect or pool timeout): :class:`ProviderUnavailable`.
- The request was sent and no answer came (read timeout, connection reset or closed before the
  response, a 504, or an unexpected 5xx to a write): :class:`ProviderTimeout`, outcome unknown.
- An answer came: its status and ``code`` give back the provider's own exception
  (see :mod:`effectflow.testing.service`).

:class:`ProviderService` starts the service as a subprocess for a test and stops it again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Self

try:
    import httpx
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the installed extras
    raise ModuleNotFoundError(
        "effectflow.testing.http_clients needs the 'testing' extra:"
        " pip install 'effectflow[testing]'",
        name=exc.name,
    ) from exc

from effectflow.testing import _base, crm, deploy, http_api, mail, notify, payments
from effectflow.testing.deploy import RevisionConflict

#: Seconds an HTTP client waits to connect, send, or read an answer.
DEFAULT_TIMEOUT_S = 5.0


class _HttpProvider:
    """One provider behind the service: an httpx client plus the shared admin operations.

    Each subclass adds its provider's table (``HttpMail(_HttpProvider, mail.MailApi)``), whose
    entries, read on the client, are the provider's operations sent through
    :meth:`call_endpoint`.

    Args:
        url: The service's base URL, as ``effectflow testing serve-providers`` prints it.
        timeout: Seconds (or an :class:`httpx.Timeout`) before a call gives up. A read timeout
            raises :class:`ProviderTimeout`; keep it below the service's ``--hang``.
    """

    #: The provider's name in the service's paths and admin calls (from its table).
    KIND: ClassVar[str]

    def __init__(self, url: str, *, timeout: float | httpx.Timeout = DEFAULT_TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        # trust_env=False: a proxy from the environment must never sit between a test and
        # a loopback service.
        self._client = httpx.Client(base_url=self.url, timeout=timeout, trust_env=False)

    # -- the call path ---------------------------------------------------------------------------

    def call_endpoint(
        self, endpoint: http_api.Endpoint[..., Any], request: http_api.Request
    ) -> Any:
        """Send one operation's request; its answer as the table says, or the provider's
        exception (see the module docstring)."""
        if request.verb == "POST":
            answer = self._write(
                request.path,
                operation=endpoint.operation,
                key=request.key,
                json=request.json or {},
                headers=request.headers,
            )
        else:
            answer = self._read(request.path, operation=endpoint.operation, params=request.params)
        return endpoint.answer.decode(endpoint.operation, answer)

    def _write(
        self,
        path: str,
        *,
        operation: str,
        key: str | None,
        json: dict[str, Any],
        headers: Mapping[str, str | None] | None = None,
    ) -> Any:
        """POST a call that may take effect; an answer lost on the way is an unknown outcome."""
        sent = {name: value for name, value in (headers or {}).items() if value is not None}
        response = self._send("POST", path, operation, key, json=json, headers=sent)
        return _answer(response, operation=operation, key=key, write=True)

    def _read(
        self, path: str, *, operation: str, params: Mapping[str, str | None] | None = None
    ) -> Any:
        """GET a lookup; 404 ``not_found`` answers None."""
        query = {name: value for name, value in (params or {}).items() if value is not None}
        response = self._send("GET", path, operation, None, params=query)
        if response.status_code == 404 and _code(response) == "not_found":
            return None
        return _answer(response, operation=operation, key=None, write=False)

    def _send(
        self, method: str, path: str, operation: str, key: str | None, **kwargs: Any
    ) -> httpx.Response:
        due = _base.REQUEST_DEADLINE.get()
        if due is not None:
            if time.time() > due:  # too late already: do not send at all
                raise _base.DeadlineExceeded(operation, due)
            kwargs["headers"] = {**kwargs.get("headers", {}), "X-Request-Deadline": repr(due)}
        try:
            return self._client.request(method, path, **kwargs)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            # The request never left this process: nothing can have happened.
            raise _base.ProviderUnavailable(
                f"{operation}: cannot reach the provider at {self.url} ({exc})",
                operation=operation,
            ) from exc
        except (
            httpx.ReadTimeout,
            httpx.WriteTimeout,
            httpx.ReadError,
            httpx.WriteError,
            httpx.RemoteProtocolError,
        ) as exc:
            # Sent (or partly sent) and never answered: the provider may have committed.
            raise _base.ProviderTimeout(operation, key=key) from exc

    # -- fault rules and the call log ------------------------------------------------------------

    def inject(
        self, operation: str, fault: _base.FaultKind, *, times: int = 1, after: int = 0
    ) -> None:
        """Persist a fault rule in the provider's file (see ``SqliteProvider.inject``).

        Raises:
            ValueError: Unknown operation or fault, ``times < 1`` or ``after < 0``.
        """
        body = {
            "provider": self.KIND,
            "operation": operation,
            "fault": fault,
            "times": times,
            "after": after,
        }
        self._write("/_admin/inject", operation="inject", key=None, json=body)

    def clear_faults(self) -> None:
        """Remove every pending fault rule of this provider."""
        body = {"provider": self.KIND}
        self._write("/_admin/clear_faults", operation="clear_faults", key=None, json=body)

    def calls(self, operation: str | None = None) -> list[dict[str, Any]]:
        """Every call the provider received, oldest first (see ``SqliteProvider.calls``)."""
        return _data(
            self._read(
                f"/_admin/calls/{self.KIND}", operation="calls", params={"operation": operation}
            )
        )

    def close(self) -> None:
        """Close the HTTP client's connections; calling it again is harmless."""
        self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class HttpMail(_HttpProvider, mail.MailApi):
    """:class:`~effectflow.testing.MailProvider` over HTTP (its operations: ``mail.MailApi``)."""


class HttpCrm(_HttpProvider, crm.CrmApi):
    """:class:`~effectflow.testing.CrmProvider` over HTTP (its operations: ``crm.CrmApi``)."""


class HttpNotify(_HttpProvider, notify.NotifyApi):
    """:class:`~effectflow.testing.NotifyProvider` over HTTP (its operations:
    ``notify.NotifyApi``)."""


class HttpPayments(_HttpProvider, payments.PaymentsApi):
    """:class:`~effectflow.testing.PaymentsProvider` over HTTP (its operations:
    ``payments.PaymentsApi``)."""

    def count_refunds(self, payment_id: str | None = None, *, status: str | None = None) -> int:
        """How many refunds were created (for one payment, in one status), counted from
        :meth:`refunds`."""
        return payments.count_refunds(self.refunds(payment_id=payment_id), status=status)


class HttpDeploy(_HttpProvider, deploy.DeployApi):
    """:class:`~effectflow.testing.DeployTarget` over HTTP (its operations: ``deploy.DeployApi``)."""


# -- answers to results or exceptions ------------------------------------------------------------


def _answer(response: httpx.Response, *, operation: str, key: str | None, write: bool) -> Any:
    """The JSON of a success (None for 204), or the provider's exception for an error."""
    if response.is_success:
        return None if response.status_code == 204 else response.json()
    raise _error(response, operation=operation, key=key, write=write)


def _error(response: httpx.Response, *, operation: str, key: str | None, write: bool) -> Exception:
    status = response.status_code
    body = _body(response)
    code = str(body.get("code") or f"http_{status}")
    message = str(body.get("message") or response.text[:200] or response.reason_phrase)
    if status == 504 and code == "deadline_exceeded":
        return _base.DeadlineExceeded(operation, float(_base.REQUEST_DEADLINE.get() or 0.0))
    if status == 504 or (write and status >= 500 and status != 503):
        # A gateway timeout, or a server error to a write: the request arrived, the outcome
        # is unknown, and calling it "not committed" is the bug this library exists to prevent.
        return _base.ProviderTimeout(operation, key=key)
    if status >= 500:
        return _base.ProviderUnavailable(message, operation=operation)
    if status == 412 and code == "revision_mismatch":
        return RevisionConflict(
            str(body["target"]), expected=int(body["expected"]), current=int(body["current"])
        )
    if status == 422 and code == "idempotency_key_reused":
        return _base.IdempotencyKeyReused(str(body.get("idempotency_key", key)))
    if status == 400 and code == "invalid_argument":
        return ValueError(message)
    return _base.ProviderRejected(message, code=code, status=status)


def _body(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _code(response: httpx.Response) -> str | None:
    code = _body(response).get("code")
    return None if code is None else str(code)


def _optional(answer: Any) -> dict[str, Any] | None:
    return None if answer is None else dict(answer)


def _data(answer: Any) -> list[dict[str, Any]]:
    return [dict(item) for item in answer["data"]]


# -- the service as a subprocess -----------------------------------------------------------------


class ProviderService:
    """``effectflow testing serve-providers`` running in a subprocess, for one test or session.

    Use :meth:`start`, then point the HTTP clients at :attr:`url`; :meth:`stop` (or leaving the
    ``with`` block) sends SIGTERM and waits for a clean exit. The service's output goes to
    ``provider-service.log`` in its directory.

    Attributes:
        directory: Where the providers' files live; open them directly to read the truth.
        url: The service's base URL.
        process: The subprocess.
    """

    #: The service's stdout and stderr, in its directory.
    LOG_NAME: ClassVar[str] = "provider-service.log"

    def __init__(self, directory: Path, url: str, process: subprocess.Popen[bytes]) -> None:
        self.directory = directory
        self.url = url
        self.process = process

    @classmethod
    def start(
        cls,
        directory: str | os.PathLike[str],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        hang: float | None = None,
        startup_timeout: float = 20.0,
    ) -> ProviderService:
        """Start the service and wait until it listens.

        Args:
            directory: Folder of the providers' files (created if missing).
            host: Interface to listen on.
            port: TCP port; 0 picks a free one.
            hang: Seconds a lost response is held back (the command's default when None).
            startup_timeout: Seconds to wait for the service to listen.

        Raises:
            RuntimeError: The service exited or did not listen in time; the message ends with
                its log.
        """
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        ready = folder / f".provider-service-{uuid.uuid4().hex}.url"
        command = [
            sys.executable,
            "-m",
            "effectflow.cli.main",
            "testing",
            "serve-providers",
            "--dir",
            str(folder),
            "--host",
            host,
            "--port",
            str(port),
            "--ready-file",
            str(ready),
        ]
        if hang is not None:
            command += ["--hang", str(hang)]
        log_path = folder / cls.LOG_NAME
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + startup_timeout
        while not ready.exists():
            if process.poll() is not None:
                raise RuntimeError(
                    f"the provider service exited with {process.returncode} before listening:\n"
                    + _tail(log_path)
                )
            if time.monotonic() > deadline:
                process.kill()
                process.wait()
                raise RuntimeError(
                    f"the provider service did not listen within {startup_timeout:g}s:\n"
                    + _tail(log_path)
                )
            time.sleep(0.01)
        url = ready.read_text(encoding="utf-8").strip()
        ready.unlink()
        return cls(folder, url, process)

    def path(self, kind: str) -> Path:
        """The SQLite file of provider ``kind`` (``"mail"``, ``"crm"``...), to read the truth."""
        from effectflow.testing import service

        return service.provider_path(self.directory, kind)

    def stop(self, timeout: float = 10.0) -> int:
        """Send SIGTERM and wait for the service to exit; calling it again is harmless.

        Returns:
            The exit status: 0 after a clean shutdown.

        Raises:
            RuntimeError: The service did not exit within ``timeout`` and was killed.
        """
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise RuntimeError(
                    f"the provider service ignored SIGTERM for {timeout:g}s and was killed"
                ) from None
        return self.process.returncode

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _tail(path: Path, size: int = 4000) -> str:
    return path.read_text(encoding="utf-8", errors="replace")[-size:]
