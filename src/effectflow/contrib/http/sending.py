"""Sending one request, and the pieces the tool and the lookup both build their calls from.

A transport error leaves here already mapped to its signal (:mod:`.mapping`), so neither the tool
nor the lookup ever sees a raw ``httpx`` exception.
"""

from __future__ import annotations

import inspect
import string
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from effectflow import errors, telemetry
from effectflow.contrib.http import mapping

#: Seconds a call waits to connect, send or read when neither the tool nor the client says.
DEFAULT_TIMEOUT_S = 30.0

#: Static headers (authorization...), or a callable returning them on every call (fresh tokens).
Headers = Mapping[str, str] | Callable[[], Mapping[str, str]] | None


class Sender:
    """One way of sending requests: a caller's client, or a fresh client per call."""

    def __init__(
        self, client: httpx.Client | None, base_url: str, headers: Headers, timeout: float | None
    ) -> None:
        self.client = client
        self.base_url = base_url.rstrip("/")
        self.headers = headers
        self.timeout = timeout

    def url(self, path: str) -> str:
        return f"{self.base_url}{path}" if self.base_url else path

    def send(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        json: Any = None,
        params: Mapping[str, str] | None = None,
        shown: str | None = None,
    ) -> httpx.Response:
        """Send one request; a transport error becomes its signal, raised ``from`` it, quoting
        ``shown`` (the URL template) rather than ``url`` when given."""
        static = self.headers() if callable(self.headers) else (self.headers or {})
        merged = {**static, **headers}
        telemetry.inject(merged)  # traceparent: the provider's trace joins the attempt's
        try:
            if self.client is None:
                with httpx.Client(timeout=self.timeout or DEFAULT_TIMEOUT_S) as client:
                    return client.request(method, url, headers=merged, json=json, params=params)
            timeout: Any = httpx.USE_CLIENT_DEFAULT if self.timeout is None else self.timeout
            return self.client.request(
                method, url, headers=merged, json=json, params=params, timeout=timeout
            )
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise mapping.signal_for_transport_error(exc, method=method, url=shown or url) from exc


def template_fields(url_template: str) -> list[str]:
    """The ``{field}`` names of a URL template, in order, each once.

    Raises:
        errors.ContractError: A field that is not a plain argument name (a format spec, a
            conversion, an attribute or an index).
    """
    fields: list[str] = []
    for _, field, spec, conversion in string.Formatter().parse(url_template):
        if field is None:
            continue
        if not field.isidentifier() or spec or conversion:
            raise errors.ContractError(
                f"URL template {url_template!r}: {{{field}}} must be a plain argument name"
            )
        if field not in fields:
            fields.append(field)
    return fields


def keyword(name: str, *, required: bool) -> inspect.Parameter:
    """A keyword-only parameter for a built signature (optional ones default to None)."""
    default = inspect.Parameter.empty if required else None
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default)
