"""The function behind an HTTP tool: one call's arguments become one request, its answer a result
or a signal.

Where each argument goes (path, body, query), where the key travels (:mod:`.tagging`), the
``If-Match`` of a precondition and the deadline header are decided here; what the answer means is
:mod:`.mapping`'s.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Collection, Sequence
from typing import Any
from urllib.parse import quote

import httpx

from effectflow import errors
from effectflow.contracts.precondition import Expect
from effectflow.contrib.http import mapping, sending, tagging

#: Keyword arguments the runtime passes; no request argument may take these names.
_RESERVED = frozenset({"idempotency_key", "precondition", "deadline", "external_effect_id"})

#: Methods that carry a JSON body even when no argument goes into it.
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def check_arguments(name: str, names: Sequence[str], key_param: str | None) -> None:
    """Refuse a request argument named twice or taking a name the runtime passes.

    Raises:
        errors.ContractError: Naming every argument and every reserved name.
    """
    reserved = _RESERVED | ({key_param} if key_param else set())
    if len(set(names)) != len(names) or reserved & set(names):
        raise errors.ContractError(
            f"tool {name}: the arguments {names} must be distinct and none of {sorted(reserved)}"
        )


class HttpCall:
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
        sender: sending.Sender,
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
        params = [sending.keyword(n, required=True) for n in path_args]
        params += [sending.keyword(n, required=False) for n in [*self.body, *self.query]]
        if key_param is not None:
            params.append(sending.keyword(key_param, required=False))
        params.append(sending.keyword("precondition", required=False))
        if deadline_header is not None:
            # Only then: taking ``deadline`` tells the runtime the provider refuses late calls.
            params.append(sending.keyword("deadline", required=False))
        self.__signature__ = inspect.Signature(params)

    def __call__(self, **arguments: Any) -> Any:
        key = arguments.pop(self.key_param, None) if self.key_param else None
        precondition: Expect | None = arguments.pop("precondition", None)
        deadline: float | None = (
            arguments.pop("deadline", None) if self.deadline_header is not None else None
        )
        self._refuse_bad_arguments(arguments)
        path = self.url_template.format(
            **{n: quote(str(arguments[n]), safe="") for n in self.path_args}
        )
        url = self.sender.url(path)
        # What messages and evidence quote: the template, never the path arguments or the query
        # values (an api_key, a webhook secret a redaction rule keeps out of the ledger).
        shown = self.sender.url(self.url_template)
        headers = self._headers(shown, precondition, deadline)
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
            shown=shown,
        )
        return self._result(response, key, f"{self.method} {shown}")

    def _refuse_bad_arguments(self, arguments: dict[str, Any]) -> None:
        missing = [n for n in self.path_args if arguments.get(n) is None]
        unknown = sorted(set(arguments) - {*self.path_args, *self.body, *self.query})
        if missing or unknown:
            # Refused here, before anything is sent: a definite failure, never retried.
            raise errors.Rejected(
                f"{self.__name__}: missing {missing}, unknown {unknown}; nothing was sent",
                evidence={"missing": missing, "unknown": unknown},
            )

    def _headers(
        self, url: str, precondition: Expect | None, deadline: float | None
    ) -> dict[str, str]:
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
        return headers

    def _result(self, response: httpx.Response, key: Any, where: str) -> Any:
        # Only a key the provider deduplicates by gives meaning to "in progress" or "key reused";
        # a tag is just a value the provider stores.
        deduplicated = key is not None and self.key_tags.idempotency_header
        signal = mapping.signal_for_response(
            response,
            idempotency_key=str(key) if deduplicated else None,
            not_committed_statuses=self.not_committed_statuses,
            where=where,
        )
        if signal is not None:
            raise signal
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            return response.text
