"""Where an HTTP request carries its idempotency key, so a lookup by that key can find the effect.

A provider that does not deduplicate by key can still be searched by a value the caller attached
to the request (Slack-style client tags, Stripe ``metadata``, a ``client_reference`` field). Such
a search settles a lost response only if the request carried our key: a lookup for a key the
provider never saw always finds nothing, and "nothing" would be mistaken for "not committed"
(docs/concepts.md#what-a-tool-tells-the-runtime). So a tool that is looked up by key must say where
it sends the key, and a lookup by key is refused for a tool that sends it nowhere.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any

from effectflow import errors

#: The header that asks the provider to deduplicate by the key (IETF draft); only for tools whose
#: contract says the provider does.
IDEMPOTENCY_HEADER = "Idempotency-Key"

#: Headers the tool sets for its own reasons, or that a provider may read as a deadline; a key tag
#: may not take them over (nor the tool's ``deadline_header``).
_OWN_HEADERS = frozenset({"idempotency-key", "if-match", "x-request-deadline"})


@dataclasses.dataclass(frozen=True)
class KeyTags:
    """The places one request carries its idempotency key."""

    #: Sent as ``Idempotency-Key``: the contract says the provider deduplicates by it.
    idempotency_header: bool = False
    #: A header carrying the key as a tag the provider stores (``X-Client-Key``).
    header: str | None = None
    #: A field of the JSON body carrying it (``client_reference``).
    field: str | None = None
    #: A query parameter carrying it (``ref``).
    query: str | None = None

    @property
    def sends_key(self) -> bool:
        """Whether the request carries the key anywhere."""
        return self.idempotency_header or self.tagged

    @property
    def tagged(self) -> bool:
        """Whether the key is attached as a tag (a header, body field or query parameter)."""
        return any(place is not None for place in (self.header, self.field, self.query))

    @property
    def tagged_as(self) -> str | None:
        """Where the key travels, for the contract: ``header:X-Client-Key, body:ref``."""
        places = [
            f"header:{IDEMPOTENCY_HEADER}" if self.idempotency_header else None,
            None if self.header is None else f"header:{self.header}",
            None if self.field is None else f"body:{self.field}",
            None if self.query is None else f"query:{self.query}",
        ]
        named = [place for place in places if place is not None]
        return ", ".join(named) or None

    def check(
        self,
        tool: str,
        *,
        body: Collection[str],
        query: Collection[str],
        deadline_header: str | None = None,
    ) -> None:
        """Refuse a tag (or a deadline header) that would overwrite something else the request
        carries.

        Raises:
            errors.ContractError: The tag takes a header the tool sets itself, or the name of
                a body or query argument; or the deadline header is one the tool sets otherwise.
        """
        if deadline_header is not None and (
            not deadline_header.strip()
            or deadline_header.lower() in {IDEMPOTENCY_HEADER.lower(), "if-match"}
        ):
            raise errors.ContractError(
                f"tool {tool}: deadline_header={deadline_header!r} must name a header of its own "
                "(the one the provider reads the deadline from, such as X-Request-Deadline)"
            )
        own = _OWN_HEADERS | ({deadline_header.lower()} if deadline_header else set())
        if self.header is not None and self.header.lower() in own:
            hint = (
                "declare idempotency=ef.Idempotency(supported=True) to send Idempotency-Key"
                if self.header.lower() == IDEMPOTENCY_HEADER.lower()
                else "choose another header"
            )
            raise errors.ContractError(
                f"tool {tool}: key_header={self.header!r} is a header the tool sets itself; {hint}"
            )
        if self.field is not None and self.field in body:
            raise errors.ContractError(
                f"tool {tool}: key_field={self.field!r} is also a body argument; name another field"
            )
        if self.query is not None and self.query in query:
            raise errors.ContractError(
                f"tool {tool}: key_query={self.query!r} is also a query argument; name another"
            )

    def apply(
        self, key: str, *, headers: dict[str, str], json: dict[str, Any], params: dict[str, str]
    ) -> None:
        """Put the key in every place this request carries it."""
        if self.idempotency_header:
            headers[IDEMPOTENCY_HEADER] = key
        if self.header is not None:
            headers[self.header] = key
        if self.field is not None:
            json[self.field] = key
        if self.query is not None:
            params[self.query] = key
