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
- A provider that does not deduplicate can still be searched by a tag the caller attached: with
  ``key_header``, ``key_field`` or ``key_query`` each request carries the key there (the tool then
  takes the key, whatever its idempotency), the contract's ``idempotency.tagged_as`` says where,
  and an :func:`http_lookup` by key can find the effect after a lost response. Such a tag is a
  value the provider stores, not one it deduplicates by: the idempotency rows do not apply to it,
  and a lookup by key is refused for a tool that sends the key nowhere (see
  :mod:`effectflow.contrib.http.tagging`).
- The runtime's deadline is sent only when the tool names the header the provider enforces it by
  (``deadline_header``). A tool that takes ``deadline`` tells the runtime the provider refuses the
  call after it, so a lookup that finds nothing past it is proof
  (docs/decision-table.md#when-not-found-is-proof); a real API ignores a header it does not know,
  so claiming that by default would make "not found" proof of nothing
  and re-send calls that may still land (effectflow's simulated providers honour
  ``X-Request-Deadline``). Without it, a non-idempotent tool with a lookup declares
  ``settles_within`` (the provider's documented bound, or ``"unbounded"``).

The code is split by concept: :mod:`.mapping` (this table), :mod:`.request` (a call's arguments
into one request), :mod:`.sending` (the client, templates), :mod:`.tagging` (where the key
travels), :mod:`.lookup` (:func:`http_lookup`); this module declares the tool.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from typing import Any

# Every submodule is reached through the package, whose first import is this module: the one
# place a missing extra is named.
try:
    import httpx
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the installed extras
    raise ModuleNotFoundError(
        "effectflow.contrib.http needs the 'http' extra: pip install 'effectflow[http]'",
        name=exc.name,
    ) from exc

from effectflow import errors
from effectflow.contracts.tool import (
    UNBOUNDED,
    CommitSemantics,
    EffectClass,
    Idempotency,
    Tool,
    tool,
)
from effectflow.contrib.http import lookup, request, sending, tagging
from effectflow.contrib.http.lookup import http_lookup
from effectflow.contrib.http.mapping import (
    DEFAULT_NOT_COMMITTED_STATUSES,
    HttpIdempotencyConflict,
    signal_for_response,
    signal_for_transport_error,
)
from effectflow.contrib.http.sending import DEFAULT_TIMEOUT_S, Headers

__all__ = [
    "DEFAULT_NOT_COMMITTED_STATUSES",
    "DEFAULT_TIMEOUT_S",
    "Headers",
    "HttpIdempotencyConflict",
    "http_lookup",
    "http_tool",
    "signal_for_response",
    "signal_for_transport_error",
]


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
    percent-encoded into the path), each name in ``body`` (a JSON object; None values left out)
    and each name in ``query``. A declared idempotency sends the key as ``Idempotency-Key``,
    ``precondition=ef.Expect(...)`` goes in ``If-Match``, ``deadline_header`` carries the
    runtime's ``deadline``; the module's decisions say when to name it and when to tag the key.

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
            (epoch seconds), such as ``X-Request-Deadline``. None: no deadline is taken or sent.
        version: The tool's version.
        register: Add the tool to the default registry.
        client: An ``httpx.Client`` to send with; without one each call opens and closes its own.
        base_url: Prefixed to the formatted path.
        headers: Sent with every request (authorization...), or a callable returning them.
        not_committed_statuses: Statuses that prove the request was refused unprocessed.
        **contract: Any other ``ef.tool`` argument (``completion``, ``compensation``, ``retry``...).

    Raises:
        errors.ContractError: A bad template; an argument named twice or reserved; a tag taking
            an argument's name or a header the tool sets; a lookup by key for a tool that sends
            no key; a non-idempotent write with a lookup but no deadline_header/settles_within.
    """
    idem = idempotency or Idempotency()
    tags = tagging.KeyTags(
        idempotency_header=idem.supported, header=key_header, field=key_field, query=key_query
    )
    sender = sending.Sender(client, base_url, headers, timeout)
    not_committed = not_committed_statuses
    call = _request(
        name, method, url_template, body, query, idem, tags, deadline_header, sender, not_committed
    )
    contract.update(version=version, effect=effect, idempotency=_tagged(name, effect, idem, tags))
    _check_lookup_by_key(name, confirm, tags)
    contract.update(confirm=confirm, effect_id=effect_id, timeout=timeout, register=register)
    if settles_within is not None:  # only when given: an engine may not know the field yet
        contract["settles_within"] = settles_within
    bounded = deadline_header is not None or settles_within is not None  # the engine's words stand
    return _declared(name, call, contract, bounded=bounded)


def _request(
    name: str,
    method: str,
    url_template: str,
    body: Sequence[str],
    query: Sequence[str],
    idem: Idempotency,
    tags: tagging.KeyTags,
    deadline_header: str | None,
    sender: sending.Sender,
    not_committed_statuses: Collection[int],
) -> request.HttpCall:
    """The function behind the tool, its arguments checked before anything is declared.

    Raises:
        errors.ContractError: A bad template, an argument named twice or reserved, or a tag (or
            deadline header) that would overwrite something else the request carries.
    """
    path_args = sending.template_fields(url_template)
    key_param = idem.key_param if tags.sends_key else None
    request.check_arguments(name, [*path_args, *body, *query], key_param)
    tags.check(name, body=body, query=query, deadline_header=deadline_header)
    return request.HttpCall(
        name=name,
        method=method.upper(),
        url_template=url_template,
        path_args=path_args,
        body=body,
        query=query,
        key_param=key_param,
        key_tags=tags,
        deadline_header=deadline_header,
        sender=sender,
        not_committed_statuses=not_committed_statuses,
    )


def _declared(
    name: str, call: request.HttpCall, declaration: dict[str, Any], *, bounded: bool
) -> Tool[..., Any]:
    """The declared tool, the engine's refusal of an unbounded lookup worded for an http_tool.

    Args:
        name: The tool's name.
        call: The function behind it.
        declaration: ``ef.tool``'s keyword arguments.
        bounded: The tool names a ``deadline_header`` or ``settles_within``: the engine's words
            stand.
    """
    declare = tool(name, **declaration)
    try:
        return declare(call)
    except errors.ContractError as exc:
        if bounded:
            raise
        effect, idem, confirm = (declaration[k] for k in ("effect", "idempotency", "confirm"))
        if not _needs_a_bound(effect, idem, confirm, declaration.get("commit")):
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
    fn = confirm.fn
    if not isinstance(fn, lookup.HttpLookup) or not fn.searches_by_key:
        return
    raise errors.ContractError(
        f"tool {name}: its lookup {confirm.ref} searches by idempotency key "
        f"({fn.searches_by}), but the request never carries the key, so the lookup can only "
        'ever find nothing, and "not found" would re-send a call that may have landed. Tag the '
        "request with the key (key_header='X-Client-Key', key_field='client_reference' or "
        "key_query='ref', whichever the provider stores and can be searched by), declare "
        "idempotency=ef.Idempotency(supported=True) if the provider deduplicates by "
        "Idempotency-Key, or look up by external id (http_lookup(..., key_query=None) with "
        "{external_effect_id} in its URL)"
    )
