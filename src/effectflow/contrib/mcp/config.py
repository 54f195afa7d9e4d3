"""The gateway's configuration: the upstream MCP servers and a contract per upstream tool.

A ``gateway.yaml``::

    default: refuse            # refuse | passthrough: what happens to tools without a contract
    timeout: 30                # seconds a contracted call may take before its outcome is unknown
    upstreams:
      mail:                    # a name for the upstream, used in the ledger's tool names
        command: python
        args: [mail_server.py]
        env: {MAIL_DB: /tmp/mail.db}
        tools:
          send_email:
            effect: external_write
            idempotency_key: idempotency_key   # the upstream argument that receives the key
            effect_id: email_id                # the result field holding the provider's id
            timeout: 2
            lookup:                            # how to confirm an unknown outcome
              tool: find_email
              key: idempotency_key             # the lookup's argument that receives the key
              found: email_id                  # the result field that is null when not found
            compensation: {tool: recall_email, arg: email_id}
            redact: {drop: [api_key], mask: [card.number]}  # what the ledger records of the call
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from effectflow import errors
from effectflow.contracts import redaction
from effectflow.contracts import tool as tool_mod


class Default(enum.StrEnum):
    """What the gateway does with an upstream tool that has no contract."""

    #: Answer every call with an error result that says why (the safe default).
    REFUSE = "refuse"
    #: Forward the call to the upstream unrecorded.
    PASSTHROUGH = "passthrough"


@dataclasses.dataclass(frozen=True)
class LookupConfig:
    """How to ask the upstream whether an effect exists."""

    #: The upstream tool to call.
    tool: str
    #: Its argument that receives the idempotency key.
    key: str = "idempotency_key"
    #: The result field that is null (or missing) when the effect does not exist.
    found: str = "id"


@dataclasses.dataclass(frozen=True)
class CompensationConfig:
    """The upstream tool that answers a confirmed effect."""

    #: The upstream tool to call.
    tool: str
    #: Its argument that receives the original's external effect id.
    arg: str
    #: Whether it runs without a person.
    automatic: bool = False


@dataclasses.dataclass(frozen=True)
class ToolConfig:
    """One upstream tool's contract."""

    #: The tool's name at the upstream (and as the gateway lists it).
    name: str
    #: What the call does to the world.
    effect: tool_mod.EffectClass
    #: The upstream argument that receives the idempotency key; None when it honours none.
    idempotency_key: str | None = None
    #: The result field holding the provider's id of the effect.
    effect_id: str | None = None
    #: How to confirm an unknown outcome; None when it cannot be confirmed.
    lookup: LookupConfig | None = None
    #: How to answer a confirmed effect; None when it cannot be answered.
    compensation: CompensationConfig | None = None
    #: Seconds before the call's outcome is unknown; None = the gateway's default.
    timeout: float | None = None
    #: What the ledger records of the call's arguments (paths into the upstream tool's own
    #: arguments); the upstream still receives the whole call.
    redact: redaction.Redact | None = None


#: The fields a tool's contract in the gateway's configuration may have.
_TOOL_FIELDS = (
    "effect",
    "idempotency_key",
    "effect_id",
    "lookup",
    "compensation",
    "timeout",
    "redact",
)


@dataclasses.dataclass(frozen=True)
class UpstreamConfig:
    """One upstream MCP server, launched over stdio."""

    #: Its name in the configuration and in the ledger's tool names (``mail.send_email``).
    name: str
    #: The program to launch.
    command: str
    #: Its arguments.
    args: tuple[str, ...] = ()
    #: Environment variables added to the SDK's safe default environment.
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: The contracts of its tools, by tool name.
    tools: Mapping[str, ToolConfig] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class GatewayConfig:
    """The whole gateway."""

    #: The upstream servers, in order.
    upstreams: tuple[UpstreamConfig, ...]
    #: What happens to tools without a contract.
    default: Default = Default.REFUSE
    #: Seconds a contracted call may take before its outcome is unknown.
    timeout: float = 30.0


def _require(body: Mapping[str, Any], field: str, where: str) -> Any:
    if field not in body:
        raise errors.ContractError(f"{where}: missing {field!r}")
    return body[field]


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise errors.ContractError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _tool(name: str, body: Mapping[str, Any], where: str) -> ToolConfig:
    unknown = sorted(str(k) for k in body if k not in _TOOL_FIELDS)
    if unknown:
        raise errors.ContractError(
            f"{where}: unknown field {unknown[0]!r}; a tool's contract takes "
            f"{', '.join(_TOOL_FIELDS)}"
        )
    try:
        redact = redaction.Redact.of(body.get("redact"))
    except errors.ContractError as exc:
        raise errors.ContractError(f"{where}.redact: {exc.message}") from None
    try:
        effect = tool_mod.EffectClass(_require(body, "effect", where))
    except ValueError:
        raise errors.ContractError(
            f"{where}: effect {body['effect']!r} is not one of "
            f"{[e.value for e in tool_mod.EffectClass]}"
        ) from None
    lookup = None
    if body.get("lookup") is not None:
        raw = _mapping(body["lookup"], f"{where}.lookup")
        lookup = LookupConfig(
            tool=str(_require(raw, "tool", f"{where}.lookup")),
            key=str(raw.get("key", "idempotency_key")),
            found=str(raw.get("found", body.get("effect_id") or "id")),
        )
    compensation = None
    if body.get("compensation") is not None:
        raw = _mapping(body["compensation"], f"{where}.compensation")
        compensation = CompensationConfig(
            tool=str(_require(raw, "tool", f"{where}.compensation")),
            arg=str(_require(raw, "arg", f"{where}.compensation")),
            automatic=bool(raw.get("automatic", False)),
        )
    if lookup is not None and body.get("idempotency_key") is None:
        raise errors.ContractError(
            f"{where}: a lookup finds the effect by its key; name the upstream argument that "
            "receives it with idempotency_key"
        )
    timeout = body.get("timeout")
    return ToolConfig(
        name=name,
        effect=effect,
        idempotency_key=body.get("idempotency_key"),
        effect_id=body.get("effect_id"),
        lookup=lookup,
        compensation=compensation,
        timeout=None if timeout is None else float(timeout),
        redact=redact,
    )


def parse(data: Any, *, source: str = "gateway config") -> GatewayConfig:
    """Build a ``GatewayConfig`` from parsed YAML.

    Raises:
        errors.ContractError: a missing or malformed field, named with where it is.
    """
    body = _mapping(data, source)
    try:
        default = Default(body.get("default", "refuse"))
    except ValueError:
        raise errors.ContractError(
            f"{source}: default must be 'refuse' or 'passthrough', not {body['default']!r}"
        ) from None
    upstreams = []
    for name, raw in _mapping(_require(body, "upstreams", source), f"{source}.upstreams").items():
        where = f"{source}.upstreams.{name}"
        up = _mapping(raw, where)
        tools = {
            tool_name: _tool(
                str(tool_name),
                _mapping(tool_body, f"{where}.tools.{tool_name}"),
                f"{where}.tools.{tool_name}",
            )
            for tool_name, tool_body in _mapping(up.get("tools") or {}, f"{where}.tools").items()
        }
        upstreams.append(
            UpstreamConfig(
                name=str(name),
                command=str(_require(up, "command", where)),
                args=tuple(str(a) for a in up.get("args") or ()),
                env={str(k): str(v) for k, v in _mapping(up.get("env") or {}, where).items()},
                tools=tools,
            )
        )
    if not upstreams:
        raise errors.ContractError(f"{source}: name at least one upstream")
    return GatewayConfig(
        upstreams=tuple(upstreams), default=default, timeout=float(body.get("timeout", 30.0))
    )


def load(path: str | Path) -> GatewayConfig:
    """Read and parse a ``gateway.yaml``.

    Raises:
        errors.ContractError: the file is not valid YAML or a field is wrong.
    """
    text = Path(path).read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise errors.ContractError(f"{path}: not valid YAML: {exc}") from exc
    return parse(data, source=str(path))
