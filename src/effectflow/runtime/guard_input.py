"""What can be a guarded call: a host's ids, arguments and tool are checked before anything is
recorded, so a refused call leaves no run behind."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from effectflow import errors
from effectflow.contracts.registry import Registry
from effectflow.contracts.tool import Tool

#: The most UTF-8 bytes a scope and a call id may hold together: both are indexed, and
#: PostgreSQL's index rows are bounded (about 2.7 kB, for the scope index and for the operation
#: key a request makes of both).
MAX_HOST_ID_BYTES = 2048
#: The largest canonical arguments of a guarded call (the limit of every recorded step).
MAX_PAYLOAD_BYTES = 1_000_000


def json_values_only(value: Any, path: str) -> None:
    """Refuse bytes in a guarded call's arguments: the run records their JSON form, and a replay
    (or a worker recovering the call) would hand the tool that form, not the bytes. A host's tool
    call is JSON; pass text (e.g. base64) instead."""
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, bytes | bytearray | memoryview):
            raise errors.ArgumentError(
                f"{where}: bytes cannot be a guarded call's argument (a recovered call would get "
                "their JSON form, not the bytes); pass text, e.g. base64. Nothing was recorded"
            )
        if isinstance(item, Mapping) and len(stack) < 100_000:
            stack.extend((v, f"{where}.{k}") for k, v in item.items())
        elif isinstance(item, list | tuple) and len(stack) < 100_000:
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(item))


def checked_tool(
    registry: Registry, tool: Tool[..., Any] | str, scope: Any, call_id: Any
) -> Tool[..., Any]:
    """The tool to call, after refusing what cannot be a guarded call (nothing is recorded)."""
    for name, value in (("scope", scope), ("call_id", call_id)):
        if not isinstance(value, str) or not value.strip():
            raise errors.ArgumentError(
                f"guarded call: {name} must be a non-empty string (the host's durable id), not "
                f"{value!r}; nothing was recorded"
            )
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError:
            raise errors.ArgumentError(
                f"guarded call: {name} holds a lone surrogate, which has no UTF-8 form; nothing "
                "was recorded"
            ) from None
        if "\x00" in value:
            raise errors.ArgumentError(
                f"guarded call: {name} holds a NUL character, which PostgreSQL cannot store; "
                "nothing was recorded"
            )
        if size > MAX_HOST_ID_BYTES:
            raise errors.ArgumentError(
                f"guarded call: {name} is {size} bytes, over the {MAX_HOST_ID_BYTES}-byte limit "
                "for a host id (it is indexed); pass a shorter id or a digest of it. Nothing was "
                "recorded"
            )
    together = len(scope.encode("utf-8")) + len(call_id.encode("utf-8"))
    if together > MAX_HOST_ID_BYTES:
        raise errors.ArgumentError(
            f"guarded call: scope and call_id are {together} bytes together, over the "
            f"{MAX_HOST_ID_BYTES}-byte limit (a request's operation key holds both); pass shorter "
            "ids. Nothing was recorded"
        )
    if isinstance(tool, str):
        return registry.tool(tool)
    if not isinstance(tool, Tool):
        raise errors.ContractError(
            f"guarded call: {tool!r} is not a tool; decorate it with @ef.tool(...) so its "
            "side-effect contract is known. Nothing was recorded."
        )
    try:
        known = registry.tool(tool.ref)
    except errors.ContractError:
        registry.add_tool(tool)  # a worker recovering the call must find it the same way
        return tool
    if known is not tool and known.fn.__qualname__ != tool.fn.__qualname__:
        raise errors.ContractError(
            f"guarded call: another tool is registered as {tool.ref} "
            f"({known.fn.__qualname__}); give this one another name or version"
        )
    return known
