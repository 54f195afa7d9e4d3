"""Tools that call an HTTP API, with every network failure mapped to what the runtime must know.

``http_tool`` builds a write (or read) tool from a method and a URL template; ``http_lookup``
builds the confirm tool that finds an effect by its idempotency key (which the tool must send: as
``Idempotency-Key``, or as a tag with ``key_header``, ``key_field`` or ``key_query``). Install with
``pip install 'effectflow[http]'``.
"""

from effectflow.contrib.http.tools import (
    DEFAULT_NOT_COMMITTED_STATUSES,
    HttpIdempotencyConflict,
    http_lookup,
    http_tool,
    signal_for_response,
    signal_for_transport_error,
)

__all__ = [
    "DEFAULT_NOT_COMMITTED_STATUSES",
    "HttpIdempotencyConflict",
    "http_lookup",
    "http_tool",
    "signal_for_response",
    "signal_for_transport_error",
]
