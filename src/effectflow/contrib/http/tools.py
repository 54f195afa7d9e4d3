"""Build effectflow tools from HTTP endpoints, mapping every answer to what the runtime must know.

A hand-written HTTP tool usually gets the failure cases wrong in the one direction that matters:
it lets a read timeout escape as "failed" and the caller retries a payment. Here the mapping is
written once, as data a test walks row by row:

==========================================================  =====================================
What happened                                               Signal
==========================================================  =====================================
connect error, connect or pool timeout, bad scheme/URL      ``NotCommitted`` (nothing was sent)
deadline already past before sending (``deadline_header``)  ``NotCommitted`` (not sent at all)
read or write timeout, reset or closed after sending        ``OutcomeUnknown``
any other transport error                                   ``OutcomeUnknown``
2xx                                                         the JSON body (text if not JSON,
                                                            None if empty)
409 "request in progress" for our key (IETF draft)          ``NotCommitted``: retry later, same key
4xx saying the key was used with another payload            ``IdempotencyConflict``
412 Precondition Failed                                     ``Conflict``
429, 503 (``not_committed_statuses``)                       ``NotCommitted`` (refused unprocessed)
any other 4xx (a plain 409 included)                        ``Rejected`` (status and code as
                                                            evidence)
500, 502, 504 and every other 5xx                           ``OutcomeUnknown``
1xx, 3xx                                                    ``OutcomeUnknown``
==========================================================  =====================================

Decisions:

- A 409 is a definite "no" (``Rejected``) unless its body says the key's first request is still
  in progress (the IETF draft's concurrent-request 409, Stripe's ``idempotency_key_in_use``):
  that one committed nothing *for this request*, so retrying later with the same key is exactly
  what the draft asks for. If an earlier attempt of ours is in doubt the runtime keeps the step in
  doubt anyway.
- The key-reuse answer is recognised by its code or title (``idempotency_key_reused``, the draft's
  "Idempotency-Key is already used", Stripe's ``idempotency_error``) on any 4xx, not only 422:
  providers answer it with 400, 409 or 422. Both idempotency rows apply only when a key was sent.
- 503 means "unavailable, not processed" (RFC 9110 §15.6.4, and the simulated providers' service
  answers it only when nothing was committed); 429 means the request was throttled before any
  processing. Both are ``NotCommitted``. Behind a gateway that can answer 503 after forwarding,
  pass ``not_committed_statuses=()`` and they become ``OutcomeUnknown``.
- A 504 is unknown even when its body says ``deadline_exceeded``: a gateway's 504 looks the same,
  and the lookup settles it cheaply.
- A key sent as a tag (``key_header``, ``key_field``, ``key_query``) is a value the provider
  stores, not one it deduplicates by: the idempotency rows do not apply to it, and a lookup by key
  is refused for a tool that sends the key nowhere (see :mod:`effectflow.contrib.http.tagging`).
- The runtime's deadline is sent only when the tool names the header the provider enforces it by
  (``deadline_header``). A tool that takes ``deadline`` tells the runtime the provider refuses the
  call after it, so a lookup that finds nothing past it is proof
  (docs/decision-table.md#when-not-found-is-proof); a real API ignores a header it does not know,
  so claiming that by default would make "not found" proof of nothing
  and re-send calls that may still land. Without it, a non-idempotent tool with a lookup declares
  ``settles_within`` (the provider's documented bound, or ``"unbounded"``).
"""

from __future__ import annotations

import dataclasses
import inspect
import string
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any
from urllib.parse import quote

try:
    import httpx
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the installed extras
    raise ModuleNotFoundError(
        "effectflow.contrib.http needs the 'http' extra: pip install 'effectflow[http]'",
        name=exc.name,
    ) from exc

from effectflow import errors
from effectflow.contracts.lookup import Lookup
from effectflow.contracts.precondition import Expect
from effectflow.contracts.tool import (
    UNBOUNDED,
    CommitSemantics,
    EffectClass,
    Idempotency,
    Tool,
    tool,
)
from effectflow.contrib.http import tagging

#: Statuses that prove the provider refused the request before processing it.
DEFAULT_NOT_COMMITTED_STATUSES: frozenset[int] = frozenset({429, 503})

#: Seconds a call waits to connect, send or read when neither the tool nor the client says.
DEFAULT_TIMEOUT_S = 30.0

#: Keyword arguments the runtime passes; no request argument may take these names.
_RESERVED = frozenset({"idempotency_key", "precondition", "deadline", "external_effect_id"})

#: Methods that carry a JSON body even when no argument goes into it.
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})

#: Words in a 409's code or title meaning "the first request with this key is still running".
_IN_PROGRESS_MARKERS = ("in_progress", "in progress", "in_use", "outstanding", "concurrent")

#: Words in a 4xx's code or title meaning "this key was used with another payload".
_REUSED_MARKERS = (
    "reused",
    "already used",
    "idempotency_error",
    "key_mismatch",
    "different payload",
    "conflicting payload",
)

#: Transport errors raised before any byte of the request left this process.
_NOTHING_SENT: tuple[type[Exception], ...] = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.UnsupportedProtocol,
    httpx.InvalidURL,
)

#: Static headers (authorization...), or a callable returning them on every call (fresh tokens).
Headers = Mapping[str, str] | Callable[[], Mapping[str, str]] | None


class HttpIdempotencyConflict(errors.IdempotencyConflict):
    """The provider refused a key already used with another payload; the answer is the evidence."""

    def __init__(self, message: str, *, idempotency_key: str, evidence: dict[str, Any]) -> None:
        super().__init__(message, idempotency_key=idempotency_key)
        #: The HTTP status and the provider's error code and title, recorded on the attempt.
        self.evidence = evidence


# -- the mapping ---------------------------------------------------------------------------------


def signal_for_transport_error(exc: Exception, *, method: str, url: str) -> errors.ToolSignal:
    """The signal for a request that got no HTTP answer (see the module's table)."""
    evidence = {"error": type(exc).__name__, "detail": str(exc), "method": method, "url": url}
    if isinstance(exc, _NOTHING_SENT):
        return errors.NotCommitted(f"{method} {url}: nothing sent ({exc})", evidence=evidence)
    return errors.OutcomeUnknown(
        f"{method} {url}: sent, but no answer ({type(exc).__name__}: {exc}); outcome unknown",
        evidence=evidence,
    )


def signal_for_response(
    response: httpx.Response,
    *,
    idempotency_key: str | None = None,
    not_committed_statuses: Collection[int] = DEFAULT_NOT_COMMITTED_STATUSES,
) -> errors.ToolSignal | errors.IdempotencyConflict | None:
    """The signal for an HTTP answer, or None for a 2xx (see the module's table).

    Args:
        response: The answer, its body read.
        idempotency_key: The key sent as ``Idempotency-Key``, if any: only then can a 409 mean
            "in progress" or a 4xx mean "key reused".
        not_committed_statuses: Statuses that prove nothing was processed.
    """
    status = response.status_code
    if 200 <= status < 300:
        return None
    evidence = _evidence(response)
    where = f"{response.request.method} {response.request.url}"
    words = " ".join(str(evidence.get(k, "")) for k in ("code", "title", "type")).lower()
    if idempotency_key is not None and status == 409 and _has(words, _IN_PROGRESS_MARKERS):
        return errors.NotCommitted(
            f"{where}: 409, the first request with this key is still in progress; retry later",
            evidence=evidence,
        )
    if status == 412:
        return errors.Conflict(f"{where}: 412, the precondition failed", evidence=evidence)
    if idempotency_key is not None and 400 <= status < 500 and _has(words, _REUSED_MARKERS):
        return HttpIdempotencyConflict(
            f"{where}: {status}, the key was already used with another payload",
            idempotency_key=idempotency_key,
            evidence=evidence,
        )
    if status in not_committed_statuses:
        return errors.NotCommitted(f"{where}: {status}, refused unprocessed", evidence=evidence)
    if 400 <= status < 500:
        return errors.Rejected(f"{where}: {status} {evidence.get('code', '')}", evidence=evidence)
    return errors.OutcomeUnknown(
        f"{where}: {status} after sending; outcome unknown", evidence=evidence
    )


def _has(words: str, markers: Sequence[str]) -> bool:
    return any(marker in words for marker in markers)


def _evidence(response: httpx.Response) -> dict[str, Any]:
    """The status plus the provider's code, title and message, whatever error shape it uses."""
    evidence: dict[str, Any] = {"status": response.status_code}
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        nested = body.get("error")
        if isinstance(nested, dict):  # Stripe's {"error": {"type", "code", "message"}}
            body = {**nested, "type": nested.get("type")}
        elif isinstance(nested, str) and "code" not in body:
            body = {**body, "code": nested}
        for field in ("code", "title", "type"):
            if isinstance(body.get(field), str):
                evidence[field] = body[field]
        message = body.get("message", body.get("detail"))
        if isinstance(message, str):
            evidence["message"] = message[:500]
    elif response.text:
        evidence["message"] = response.text[:500]
    retry_after = response.headers.get("retry-after")
    if retry_after is not None:
        evidence["retry_after"] = retry_after
    return evidence


# -- sending -------------------------------------------------------------------------------------


class _Sender:
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
    ) -> httpx.Response:
        """Send one request; a transport error becomes its signal, raised ``from`` it."""
        static = self.headers() if callable(self.headers) else (self.headers or {})
        merged = {**static, **headers}
        try:
            if self.client is None:
                with httpx.Client(timeout=self.timeout or DEFAULT_TIMEOUT_S) as client:
                    return client.request(method, url, headers=merged, json=json, params=params)
            timeout: Any = httpx.USE_CLIENT_DEFAULT if self.timeout is None else self.timeout
            return self.client.request(
                method, url, headers=merged, json=json, params=params, timeout=timeout
            )
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise signal_for_transport_error(exc, method=method, url=url) from exc


def _template_fields(url_template: str) -> list[str]:
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


def _keyword(name: str, *, required: bool) -> inspect.Parameter:
    default = inspect.Parameter.empty if required else None
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default)


class _HttpCall:
    """The function behind an HTTP tool, with a signature naming exactly its arguments.

    The signature is what the runtime reads: it names the request's arguments (so the request
    digest and argument binding are exact), and it takes the idempotency key only when the
    request carries it (as ``Idempotency-Key`` or as a tag) - a tool that takes a key sends it.
    """

    def __init__(
        self,
        *,
        name: str,
        method: str,
        url_template: str,
        path_args: list[str],
        body: Sequence[str],
        query: Sequence[str],
        key_param: str | None,
        key_tags: tagging.KeyTags,
        deadline_header: str | None,
        sender: _Sender,
        not_committed_statuses: Collection[int],
    ) -> None:
        self.__name__ = self.__qualname__ = name
        self.method = method
        self.url_template = url_template
        self.path_args = path_args
        self.body = list(body)
        self.query = list(query)
        self.key_param = key_param
        self.key_tags = key_tags
        self.deadline_header = deadline_header
        self.sender = sender
        self.not_committed_statuses = frozenset(not_committed_statuses)
        params = [_keyword(n, required=True) for n in path_args]
        params += [_keyword(n, required=False) for n in [*self.body, *self.query]]
        if key_param is not None:
            params.append(_keyword(key_param, required=False))
        params.append(_keyword("precondition", required=False))
        if deadline_header is not None:
            # Only then: taking ``deadline`` tells the runtime the provider refuses late calls.
            params.append(_keyword("deadline", required=False))
        self.__signature__ = inspect.Signature(params)

    def __call__(self, **arguments: Any) -> Any:
        key = arguments.pop(self.key_param, None) if self.key_param else None
        precondition: Expect | None = arguments.pop("precondition", None)
        deadline: float | None = (
            arguments.pop("deadline", None) if self.deadline_header is not None else None
        )
        missing = [n for n in self.path_args if arguments.get(n) is None]
        unknown = sorted(set(arguments) - {*self.path_args, *self.body, *self.query})
        if missing or unknown:
            # Refused here, before anything is sent: a definite failure, never retried.
            raise errors.Rejected(
                f"{self.__name__}: missing {missing}, unknown {unknown}; nothing was sent",
                evidence={"missing": missing, "unknown": unknown},
            )
        path = self.url_template.format(
            **{n: quote(str(arguments[n]), safe="") for n in self.path_args}
        )
        url = self.sender.url(path)
        headers: dict[str, str] = {}
        if precondition is not None:
            headers["If-Match"] = precondition.if_match
        if deadline is not None and self.deadline_header is not None:
            if time.time() >= deadline:
                raise errors.NotCommitted(
                    f"{self.method} {url}: its deadline passed before sending; nothing was sent",
                    evidence={"deadline": deadline},
                )
            headers[self.deadline_header] = repr(float(deadline))
        json = {n: arguments[n] for n in self.body if arguments.get(n) is not None}
        params = {n: str(arguments[n]) for n in self.query if arguments.get(n) is not None}
        if key is not None:
            self.key_tags.apply(str(key), headers=headers, json=json, params=params)
        has_body = self.body or self.method in _BODY_METHODS or self.key_tags.field is not None
        response = self.sender.send(
            self.method,
            url,
            headers=headers,
            json=json if has_body else None,
            params=params or None,
        )
        # Only a key the provider deduplicates by gives meaning to "in progress" or "key reused";
        # a tag is just a value the provider stores.
        deduplicated = key is not None and self.key_tags.idempotency_header
        signal = signal_for_response(
            response,
            idempotency_key=str(key) if deduplicated else None,
            not_committed_statuses=self.not_committed_statuses,
        )
        if signal is not None:
            raise signal
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            return response.text


def http_tool(
    name: str,
    method: str,
    url_template: str,
    *,
    effect: EffectClass | str,
    body: Sequence[str] = (),
    query: Sequence[str] = (),
    idempotency: Idempotency | None = None,
    key_header: str | None = None,
    key_field: str | None = None,
    key_query: str | None = None,
    confirm: Tool[..., Any] | str | None = None,
    effect_id: str | None = None,
    timeout: float | None = None,
    settles_within: str | float | None = None,
    deadline_header: str | None = None,
    version: str | int = 1,
    register: bool = True,
    client: httpx.Client | None = None,
    base_url: str = "",
    headers: Headers = None,
    not_committed_statuses: Collection[int] = DEFAULT_NOT_COMMITTED_STATUSES,
    **contract: Any,
) -> Tool[..., Any]:
    """An ``ef.Tool`` that sends one HTTP request per call (see the module's mapping table).

    The tool takes keyword arguments only: each ``{field}`` of ``url_template`` (required,
    percent-encoded into the path), each name in ``body`` (sent as a JSON object; None values
    left out) and each name in ``query`` (the query string). When the contract declares
    idempotency the key goes in the ``Idempotency-Key`` header; ``precondition=ef.Expect(...)``
    goes in ``If-Match``; with ``deadline_header`` the runtime's ``deadline`` goes in that header.

    A deadline is opt-in because the runtime trusts it: a tool that takes one tells the runtime
    the provider refuses the call after it, so a lookup that finds nothing past it proves the call
    did not commit. Name ``deadline_header`` only for a provider that enforces it (effectflow's
    simulated providers honour ``X-Request-Deadline``; a real API ignores a header it does not
    know). A non-idempotent tool with a lookup and no ``deadline_header`` must declare
    ``settles_within`` (its documented bound, or ``"unbounded"``), or it is refused here.

    A provider that does not deduplicate can still be searched by a tag the caller attached: with
    ``key_header``, ``key_field`` or ``key_query`` each request carries the key there (the tool
    then takes the key, whatever its idempotency), the contract's ``idempotency.tagged_as`` says
    where, and an :func:`http_lookup` by key can find the effect after a lost response. A lookup
    by key for a tool that sends the key nowhere is refused here: it would find nothing, always.

    Args:
        name: The tool's name.
        method: The HTTP method (``POST``).
        url_template: The path (or full URL) with ``{argument}`` fields: ``/deploy/{target}/deploy``.
        effect: The effect class, as for ``ef.tool``.
        body: Arguments sent in the JSON body; POST, PUT and PATCH send ``{}`` when empty.
        query: Arguments sent in the query string.
        idempotency: As for ``ef.tool``; with ``supported=True`` the key is sent.
        key_header: A header that carries the key as a tag (``X-Client-Key``).
        key_field: A JSON body field that carries the key as a tag (``client_reference``).
        key_query: A query parameter that carries the key as a tag (``ref``).
        confirm: The lookup tool (see :func:`http_lookup`).
        effect_id: The response field holding the provider's id of the effect.
        timeout: Seconds before the call counts as timed out, for the runtime and for httpx.
        settles_within: How long after a call starts the provider may still commit it (seconds,
            ISO 8601 or ``"unbounded"``), as for ``ef.tool``; passed on only when given.
        deadline_header: The header by which the provider refuses a request after a deadline
            (epoch seconds), such as ``X-Request-Deadline``; only then does the tool take the
            runtime's ``deadline`` and send it. None: no deadline is taken or sent.
        version: The tool's version.
        register: Add the tool to the default registry.
        client: An ``httpx.Client`` to send with (its base URL, auth, pool and transport);
            without one each call opens and closes its own.
        base_url: Prefixed to the formatted path.
        headers: Sent with every request (authorization...), or a callable returning them.
        not_committed_statuses: Statuses that prove the request was refused unprocessed.
        **contract: Any other ``ef.tool`` argument (``completion``, ``compensation``, ``retry``...).

    Raises:
        errors.ContractError: A bad template, an argument named twice, a reserved name, a tag that
            collides with an argument or a header the tool sets, a lookup by key (``confirm=``
            an :func:`http_lookup` that searches by key) for a tool that does not send the key,
            or a non-idempotent write with a lookup but neither ``deadline_header`` nor
            ``settles_within``.
    """
    idem = idempotency or Idempotency()
    path_args = _template_fields(url_template)
    names = [*path_args, *body, *query]
    tags = tagging.KeyTags(
        idempotency_header=idem.supported, header=key_header, field=key_field, query=key_query
    )
    key_param = idem.key_param if tags.sends_key else None
    reserved = _RESERVED | ({key_param} if key_param else set())
    if len(set(names)) != len(names) or reserved & set(names):
        raise errors.ContractError(
            f"tool {name}: the arguments {names} must be distinct and none of {sorted(reserved)}"
        )
    tags.check(name, body=body, query=query, deadline_header=deadline_header)
    idem = _tagged(name, effect, idem, tags)
    _check_lookup_by_key(name, confirm, tags)
    call = _HttpCall(
        name=name,
        method=method.upper(),
        url_template=url_template,
        path_args=path_args,
        body=body,
        query=query,
        key_param=key_param,
        key_tags=tags,
        deadline_header=deadline_header,
        sender=_Sender(client, base_url, headers, timeout),
        not_committed_statuses=not_committed_statuses,
    )
    if settles_within is not None:
        # Only when given, so this works with an engine that does not know the field yet.
        contract["settles_within"] = settles_within
    declare = tool(
        name,
        version=version,
        effect=effect,
        idempotency=idem,
        confirm=confirm,
        effect_id=effect_id,
        timeout=timeout,
        register=register,
        **contract,
    )
    try:
        return declare(call)
    except errors.ContractError as exc:
        if deadline_header is not None or settles_within is not None:
            raise
        if not _needs_a_bound(effect, idem, confirm, contract.get("commit")):
            raise
        # The engine's own words name a `deadline` parameter, which an http_tool never writes.
        raise errors.ContractError(_no_bound_message(name, effect, confirm)) from exc


def _needs_a_bound(
    effect: EffectClass | str,
    idem: Idempotency,
    confirm: Tool[..., Any] | str | None,
    commit: CommitSemantics | str | None,
) -> bool:
    """Whether the engine asks this tool when "not found" is proof (``Tool``'s declaration check).

    Used only to word an error the engine already raised, so the engine stays the one judge.
    """
    try:
        effect_class = EffectClass(effect)
    except ValueError:
        return False
    repeatable = idem.supported or effect_class is EffectClass.IDEMPOTENT_WRITE
    local = commit is not None and commit == CommitSemantics.LOCAL_TRANSACTION
    return effect_class.writes and not repeatable and confirm is not None and not local


def _no_bound_message(
    name: str, effect: EffectClass | str, confirm: Tool[..., Any] | str | None
) -> str:
    lookup = confirm.ref if isinstance(confirm, Tool) else confirm
    return (
        f"tool {name} ({EffectClass(effect).value}, no idempotency) is confirmed by the lookup "
        f"{lookup}, so it must say when a lookup that finds nothing proves the request did not "
        "commit (docs/decision-table.md#when-not-found-is-proof). An http_tool sends no deadline "
        "unless told how: pass "
        "deadline_header='X-Request-Deadline' (the header's name) only if the provider refuses "
        "a request after the deadline it carries; otherwise declare settles_within=<seconds or "
        "ISO 8601>, how long after a request starts the provider may still commit it (its "
        f"documented bound), or settles_within={UNBOUNDED!r} if it gives none: the lookup then "
        "confirms effects but never disproves one, and a person decides. If the provider "
        "deduplicates by Idempotency-Key, declare idempotency=ef.Idempotency(supported=True)."
    )


def _tagged(
    name: str, effect: EffectClass | str, idem: Idempotency, tags: tagging.KeyTags
) -> Idempotency:
    """The contract's idempotency with ``tagged_as`` saying where the request carries the key.

    A ``tagged_as`` the caller gave is kept (it may name where the provider stores the tag, such
    as ``metadata.client_reference``), but only if the request really carries the key.

    Raises:
        errors.ContractError: A tag on a tool that does not write, or a ``tagged_as`` for a tool
            that sends the key nowhere.
    """
    writes = effect not in (EffectClass.PURE, EffectClass.READ)  # ef.tool refuses a bad class
    if tags.tagged and not writes:
        raise errors.ContractError(
            f"tool {name}: a {effect} tool has no key to tag; remove key_header, key_field and "
            "key_query or declare a write effect class"
        )
    if not tags.sends_key:
        if idem.tagged_as is not None:
            raise errors.ContractError(
                f"tool {name}: idempotency.tagged_as={idem.tagged_as!r}, but the request does not "
                "carry the key; tag it with key_header=..., key_field=... or key_query=..."
            )
        return idem
    if idem.tagged_as is not None:
        return idem
    return dataclasses.replace(idem, tagged_as=tags.tagged_as)


def _check_lookup_by_key(
    name: str, confirm: Tool[..., Any] | str | None, tags: tagging.KeyTags
) -> None:
    """Refuse a lookup by key for a tool whose requests never carry the key
    (docs/concepts.md#what-a-tool-tells-the-runtime).

    Such a lookup always finds nothing, and "nothing" would pass for "not committed": a lost
    response would be sent again. Only a lookup built by :func:`http_lookup` says what it searches
    by; a lookup named by its ``name@version`` is not known until the runtime calls it.

    Raises:
        errors.ContractError: The pairing is of that kind, naming both fixes.
    """
    if tags.sends_key or not isinstance(confirm, Tool):
        return
    lookup = confirm.fn
    if not isinstance(lookup, _HttpLookup) or not lookup.searches_by_key:
        return
    raise errors.ContractError(
        f"tool {name}: its lookup {confirm.ref} searches by idempotency key "
        f"({lookup.searches_by}), but the request never carries the key, so the lookup can only "
        'ever find nothing, and "not found" would re-send a call that may have landed. Tag the '
        "request with the key (key_header='X-Client-Key', key_field='client_reference' or "
        "key_query='ref', whichever the provider stores and can be searched by), declare "
        "idempotency=ef.Idempotency(supported=True) if the provider deduplicates by "
        "Idempotency-Key, or look up by external id (http_lookup(..., key_query=None) with "
        "{external_effect_id} in its URL)"
    )


# -- lookups -------------------------------------------------------------------------------------


class _HttpLookup:
    """The function behind a lookup tool: GET the effect by key (or id), answer an ``ef.Lookup``."""

    def __init__(
        self,
        *,
        name: str,
        url_template: str,
        path_args: list[str],
        key_query: str | None,
        items: str | None,
        effect_id: str | None,
        state: str | None,
        sender: _Sender,
    ) -> None:
        self.__name__ = self.__qualname__ = name
        self.url_template = url_template
        self.path_args = path_args
        self.key_query = key_query
        self.items = items
        self.effect_id = effect_id
        self.state = state
        self.sender = sender
        self.__signature__ = inspect.Signature(
            [
                _keyword("idempotency_key", required=False),
                _keyword("external_effect_id", required=False),
            ]
        )

    @property
    def searches_by(self) -> str:
        """What the search names the effect by (``query:idempotency_key``, ``path:{...}``)."""
        places = [f"path:{{{n}}}" for n in self.path_args]
        if self.key_query is not None:
            places.insert(0, f"query:{self.key_query}")
        return ", ".join(places) or "nothing"

    @property
    def searches_by_key(self) -> bool:
        """Whether the search names the idempotency key (it then needs the call to have sent it)."""
        return self.key_query is not None or "idempotency_key" in self.path_args

    def __call__(
        self, *, idempotency_key: str | None = None, external_effect_id: str | None = None
    ) -> Lookup:
        given = {"idempotency_key": idempotency_key, "external_effect_id": external_effect_id}
        if any(given[n] is None for n in self.path_args):
            return Lookup.unknown(reason=f"{self.__name__}: no {self.path_args} to look up by")
        path = self.url_template.format(
            **{n: quote(str(given[n]), safe="") for n in self.path_args}
        )
        params: dict[str, str] | None = None
        if self.key_query is not None:
            if idempotency_key is None:
                return Lookup.unknown(reason=f"{self.__name__}: no idempotency key to look up by")
            params = {self.key_query: idempotency_key}
        url = self.sender.url(path)
        try:
            response = self.sender.send("GET", url, headers={}, params=params)
        except errors.ToolSignal as signal:
            return Lookup.unknown(reason=signal.message, evidence=signal.evidence)
        if response.status_code == 404:
            return Lookup.not_committed(evidence=_evidence(response))
        if not 200 <= response.status_code < 300:
            evidence = _evidence(response)
            return Lookup.unknown(
                reason=f"GET {url}: {response.status_code}, cannot tell", evidence=evidence
            )
        return self._answer(response)

    def _answer(self, response: httpx.Response) -> Lookup:
        try:
            found: Any = response.json()
        except ValueError:
            return Lookup.unknown(reason=f"{self.__name__}: the answer is not JSON")
        if self.items is not None:
            listed = found.get(self.items) if isinstance(found, dict) else None
            if not isinstance(listed, list):
                return Lookup.unknown(reason=f"{self.__name__}: no {self.items!r} list")
            if not listed:
                return Lookup.not_committed(evidence={"status": response.status_code})
            found = listed[0]
        if not isinstance(found, dict):
            return Lookup.unknown(reason=f"{self.__name__}: the answer is not a JSON object")
        evidence: dict[str, Any] = {"status": response.status_code}
        ext_id = None
        if self.effect_id is not None and found.get(self.effect_id) is not None:
            ext_id = str(found[self.effect_id])
            evidence[self.effect_id] = ext_id
        state = None
        if self.state is not None and isinstance(found.get(self.state), str):
            state = found[self.state]
            evidence[self.state] = state
        return Lookup.confirmed(
            external_effect_id=ext_id, state=state, evidence=evidence, result=found
        )


def http_lookup(
    name: str,
    url_template: str,
    *,
    key_query: str | None = "idempotency_key",
    items: str | None = None,
    effect_id: str | None = None,
    state: str | None = "status",
    version: str | int = 1,
    register: bool = True,
    client: httpx.Client | None = None,
    base_url: str = "",
    headers: Headers = None,
    timeout: float | None = None,
) -> Tool[..., Lookup]:
    """A read tool that GETs an effect by its key and answers ``ef.Lookup`` (for ``confirm=``).

    404 (or an empty ``items`` list) is ``not_committed``; a found object is ``confirmed`` with
    its ``effect_id`` and ``state`` fields and the object itself as the result; anything else
    (no answer, 5xx, another 4xx) is ``unknown``, so the runtime looks again or asks a person.

    Args:
        name: The tool's name.
        url_template: The path; it may contain ``{idempotency_key}`` or ``{external_effect_id}``.
        key_query: The query parameter carrying the key (None: the key is not sent as a query).
        items: The field of a list answer (``{"data": [...]}``) whose first item is the effect.
        effect_id: The field holding the provider's id of the effect.
        state: The field holding the effect's completion state.
        version: The tool's version.
        register: Add the tool to the default registry.
        client: An ``httpx.Client`` to send with; without one each call opens its own.
        base_url: Prefixed to the formatted path.
        headers: Sent with every request, or a callable returning them.
        timeout: Seconds before the lookup gives up (it then answers ``unknown``).

    Raises:
        errors.ContractError: A template field other than the two above.
    """
    path_args = _template_fields(url_template)
    strange = set(path_args) - {"idempotency_key", "external_effect_id"}
    if strange:
        raise errors.ContractError(
            f"lookup {name}: the URL template may name only {{idempotency_key}} or "
            f"{{external_effect_id}}, not {sorted(strange)}"
        )
    lookup = _HttpLookup(
        name=name,
        url_template=url_template,
        path_args=path_args,
        key_query=key_query,
        items=items,
        effect_id=effect_id,
        state=state,
        sender=_Sender(client, base_url, headers, timeout),
    )
    declare = tool(
        name, version=version, effect=EffectClass.READ, timeout=timeout, register=register
    )
    return declare(lookup)
