"""The lookup side: a read tool that finds an effect by its idempotency key (or the provider's id).

It is what a tool's ``confirm=`` names, so the runtime can settle a lost response by asking the
provider (docs/concepts.md#what-a-tool-tells-the-runtime).
"""

from __future__ import annotations

import inspect
from typing import Any
from urllib.parse import quote

import httpx

from effectflow import errors
from effectflow.contracts.lookup import Lookup
from effectflow.contracts.tool import EffectClass, Tool, tool
from effectflow.contrib.http import mapping, sending


class HttpLookup:
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
        sender: sending.Sender,
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
                sending.keyword("idempotency_key", required=False),
                sending.keyword("external_effect_id", required=False),
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
            return Lookup.not_committed(evidence=mapping.response_evidence(response))
        if not 200 <= response.status_code < 300:
            evidence = mapping.response_evidence(response)
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
    headers: sending.Headers = None,
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
    path_args = sending.template_fields(url_template)
    strange = set(path_args) - {"idempotency_key", "external_effect_id"}
    if strange:
        raise errors.ContractError(
            f"lookup {name}: the URL template may name only {{idempotency_key}} or "
            f"{{external_effect_id}}, not {sorted(strange)}"
        )
    lookup = HttpLookup(
        name=name,
        url_template=url_template,
        path_args=path_args,
        key_query=key_query,
        items=items,
        effect_id=effect_id,
        state=state,
        sender=sending.Sender(client, base_url, headers, timeout),
    )
    declare = tool(
        name, version=version, effect=EffectClass.READ, timeout=timeout, register=register
    )
    return declare(lookup)
