"""An MCP server that puts side-effect contracts in front of other MCP servers' tools.

Each call of a contracted tool becomes a one-step run in the ledger, so a crash, a timeout or a
repeated request never sends an email twice. The MCP SDK is asynchronous and the runtime is
synchronous: the runtime runs in a worker thread (one call at a time), and each tool function it
calls hands the upstream request back to the event loop that owns the upstream sessions with
``asyncio.run_coroutine_threadsafe``. When the runtime's timeout gives up on a call, the request stays
in flight on the loop and its late answer is dropped: exactly why that outcome is unknown.

Each call is a guarded call (``Runtime.guard``, the one mechanism the LangGraph middleware and
the agent loop use too): the MCP client is the host. With an ``operation_id`` argument (the gateway
adds it to every contracted tool's schema and strips it before forwarding) the scope is ``mcp`` and
the call id ``<tool>:<operation_id>``, a request of its own across sessions; without one the scope
is this MCP session and the call id ``<tool>:<digest of the arguments>``. So a client that repeats a
call (a model retrying after a lost answer) is a host replay — the recorded answer, or the settling
of a call in doubt, never a second email — while a later session asking for the same arguments is
a new operation unless it names the same ``operation_id``. ``effectflow runs --scope mcp`` finds
the named calls.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from collections.abc import Mapping
from contextlib import AsyncExitStack
from typing import Any

import anyio
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, get_default_environment, stdio_client
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

import effectflow as ef
from effectflow import digests, errors
from effectflow.contracts import registry as registry_mod
from effectflow.contrib.mcp import config as config_mod
from effectflow.ledger import records
from effectflow.runtime import guard

#: What an unknown outcome tells the caller (docs/concepts.md#agents-and-models): the words a model
#: must not retry past.
UNKNOWN_PHRASE = "this may or may not have happened; do not repeat it; it is being checked"
#: The argument through which a caller names its logical operation.
OPERATION_ARG = "operation_id"
#: The gateway's own tool that settles unknown outcomes through the upstreams' lookup tools.
RECONCILE_TOOL = "effectflow_reconcile"
#: The workflow gateway calls ran as before they were guarded calls (kept for their recovery).
WORKFLOW = "mcp_gateway_call"
#: The guarded-call scope of calls that name their operation (across sessions).
NAMED_SCOPE = "mcp"

_IN_DOUBT = {s.value for s in records.IN_DOUBT_STATUSES}


def payload(result: types.CallToolResult) -> Any:
    """What an upstream answered: its structured content, else its text parsed as JSON if it is."""
    if result.structuredContent is not None:
        return result.structuredContent
    text = "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))
    try:
        return json.loads(text)
    except ValueError:
        return text


def _text(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


class Upstreams:
    """The sessions with the upstream servers, callable from the runtime's worker threads."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        #: Each upstream's session, by its configured name.
        self.sessions: dict[str, ClientSession] = {}
        #: Each upstream's tools as it lists them, by upstream name then tool name.
        self.tools: dict[str, dict[str, types.Tool]] = {}

    async def connect(self, stack: AsyncExitStack, upstream: config_mod.UpstreamConfig) -> None:
        """Launch ``upstream`` over stdio, initialize the session and list its tools."""
        params = StdioServerParameters(
            command=upstream.command,
            args=list(upstream.args),
            env={**get_default_environment(), **upstream.env},
        )
        read, write = await stack.enter_async_context(stdio_client(params))
        session = await stack.enter_async_context(ClientSession(read, write))
        await session.initialize()
        listed = await session.list_tools()
        self.sessions[upstream.name] = session
        self.tools[upstream.name] = {t.name: t for t in listed.tools}
        for name in upstream.tools:
            if name not in self.tools[upstream.name]:
                raise errors.ContractError(
                    f"upstream {upstream.name!r} has no tool {name!r} (it lists "
                    f"{sorted(self.tools[upstream.name])})"
                )

    def call(self, upstream: str, tool: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """Call an upstream tool from a worker thread, waiting for its answer."""
        future = asyncio.run_coroutine_threadsafe(
            self.sessions[upstream].call_tool(tool, arguments), self.loop
        )
        return future.result()


def _write_fn(up: Upstreams, upstream: str, cfg: config_mod.ToolConfig) -> Any:
    def call(*, arguments: dict[str, Any], idempotency_key: str | None = None) -> Any:
        forwarded = dict(arguments)
        if cfg.idempotency_key is not None:
            forwarded[cfg.idempotency_key] = idempotency_key
        result = up.call(upstream, cfg.name, forwarded)
        if result.isError:
            # An error result may come from a tool that failed half way: not proof of nothing.
            raise errors.OutcomeUnknown(
                f"{upstream}.{cfg.name} answered with an error: {_text(result)}"
            )
        return payload(result)

    return call


def _lookup_fn(up: Upstreams, upstream: str, lookup: config_mod.LookupConfig) -> Any:
    def find(*, idempotency_key: str | None = None) -> ef.Lookup:
        if idempotency_key is None:
            return ef.Lookup.unknown(reason="no idempotency key to look the effect up by")
        result = up.call(upstream, lookup.tool, {lookup.key: idempotency_key})
        if result.isError:
            return ef.Lookup.unknown(reason=f"{lookup.tool} failed: {_text(result)}")
        body = payload(result)
        if not isinstance(body, dict):
            return ef.Lookup.unknown(reason=f"{lookup.tool} did not answer an object: {body!r}")
        found = body.get(lookup.found)
        if found is None:
            return ef.Lookup.not_committed(evidence=body)
        return ef.Lookup.confirmed(external_effect_id=str(found), evidence=body, result=body)

    return find


def _compensation_fn(up: Upstreams, upstream: str, comp: config_mod.CompensationConfig) -> Any:
    def compensate(external_effect_id: str, *, idempotency_key: str | None = None) -> Any:
        result = up.call(upstream, comp.tool, {comp.arg: external_effect_id})
        if result.isError:
            raise errors.OutcomeUnknown(f"{comp.tool} answered with an error: {_text(result)}")
        return payload(result)

    return compensate


def build_tool(
    up: Upstreams, upstream: str, cfg: config_mod.ToolConfig, *, default_timeout: float
) -> tuple[ef.Tool[..., Any], list[ef.Tool[..., Any]]]:
    """The ledger's tool for one contracted upstream tool, and its helpers (lookup, compensation)."""
    name = f"{upstream}.{cfg.name}"
    timeout = cfg.timeout or default_timeout
    helpers: list[ef.Tool[..., Any]] = []
    confirm = None
    if cfg.lookup is not None:
        confirm = ef.tool(f"{name}.lookup", effect="read", timeout=timeout, register=False)(
            _lookup_fn(up, upstream, cfg.lookup)
        )
        helpers.append(confirm)
    compensation = None
    if cfg.compensation is not None and cfg.effect.writes:
        comp_tool = ef.tool(
            f"{name}.compensation", effect="external_write", timeout=timeout, register=False
        )(_compensation_fn(up, upstream, cfg.compensation))
        helpers.append(comp_tool)
        compensation = ef.Compensation(
            tool=comp_tool, automatic=cfg.compensation.automatic, param="external_effect_id"
        )
    made = ef.tool(
        name,
        effect=cfg.effect,
        idempotency=ef.Idempotency(supported=cfg.idempotency_key is not None),
        confirm=confirm,
        effect_id=cfg.effect_id if cfg.effect.writes else None,
        compensation=compensation,
        timeout=timeout,
        external_system=upstream,
        redact=_under_arguments(cfg.redact),
        register=False,
    )(_write_fn(up, upstream, cfg))
    return made, helpers


def _under_arguments(rule: ef.Redact | None) -> ef.Redact | None:
    """The configuration's rule names the upstream tool's own arguments; the ledger's tool takes
    them as its one parameter, ``arguments``."""
    if rule is None:
        return None
    return ef.Redact(
        drop=[f"arguments.{path}" for path in rule.drop],
        mask=[f"arguments.{path}" for path in rule.mask],
    )


def _listed(tool: types.Tool, cfg: config_mod.ToolConfig) -> types.Tool:
    """The upstream's tool as the gateway lists it: the key argument hidden, ``operation_id`` added."""
    schema = dict(tool.inputSchema)
    properties = dict(schema.get("properties") or {})
    required = [r for r in schema.get("required") or [] if r != cfg.idempotency_key]
    if cfg.idempotency_key is not None:
        properties.pop(cfg.idempotency_key, None)
    properties[OPERATION_ARG] = {
        "type": "string",
        "description": "Names this logical operation: a repeat with the same id is not done twice.",
    }
    schema["properties"] = properties
    schema["required"] = required
    note = (
        f"[effectflow gateway: {cfg.effect} effect, recorded; repeating an operation never "
        "repeats its effect]"
    )
    description = f"{tool.description}\n\n{note}" if tool.description else note
    return tool.model_copy(update={"inputSchema": schema, "description": description})


def _result(body: dict[str, Any], *, error: bool = False) -> types.CallToolResult:
    text = json.dumps(body, indent=2, default=str)
    if body.get("status") in _IN_DOUBT:
        text = f"{UNKNOWN_PHRASE}\n\n{text}"
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structuredContent=body, isError=error
    )


def _refusal(message: str) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=message)],
        structuredContent={"status": "refused", "message": message},
        isError=True,
    )


class Gateway:
    """The contracts, the ledger and the routing of each client call."""

    def __init__(self, config: config_mod.GatewayConfig, upstreams: Upstreams, db_url: str) -> None:
        self.config = config
        self.upstreams = upstreams
        self.registry = registry_mod.Registry()
        #: A fresh id per gateway process: one stdio process serves one MCP session.
        self.session_id = uuid.uuid4().hex
        #: Ledger tool name by client-visible tool name, for contracted tools.
        self.contracted: dict[str, tuple[str, config_mod.ToolConfig]] = {}
        #: The upstream of each tool the client may see, by tool name.
        self.owner: dict[str, str] = {}
        for up in config.upstreams:
            for name in upstreams.tools[up.name]:
                if name in self.owner or name == RECONCILE_TOOL:
                    raise errors.ContractError(
                        f"tool {name!r} is offered by two upstreams ({self.owner.get(name)!r} and "
                        f"{up.name!r}); the gateway cannot route it"
                    )
                self.owner[name] = up.name
            for cfg in up.tools.values():
                made, helpers = build_tool(upstreams, up.name, cfg, default_timeout=config.timeout)
                for t in (made, *helpers):
                    self.registry.add_tool(t)
                self.contracted[cfg.name] = (made.ref, cfg)
        registry = self.registry

        def gateway_call(
            ctx: ef.Context, *, tool: str, arguments: dict[str, Any], operation_id: str
        ) -> Any:
            return ctx.call(
                "call", registry.tool(tool), arguments=arguments, operation_id=operation_id
            )

        # Calls are guarded calls now; runs an earlier gateway recorded as this workflow still
        # recover (``reconcile``) with it.
        self.workflow: ef.Workflow[..., Any] = ef.workflow(WORKFLOW, register=False)(gateway_call)
        self.registry.add_workflow(self.workflow)
        self.runtime = ef.Runtime(db_url, registry=self.registry)
        # The runtime is used from one worker thread at a time.
        self.lock = anyio.Lock()

    def close(self) -> None:
        """Close the ledger."""
        self.runtime.close()

    def list_tools(self) -> list[types.Tool]:
        """Contracted tools (key hidden), passthrough tools as they are, and the reconcile tool."""
        listed = []
        for up in self.config.upstreams:
            for name, tool in self.upstreams.tools[up.name].items():
                if name in self.contracted:
                    listed.append(_listed(tool, self.contracted[name][1]))
                elif self.config.default is config_mod.Default.PASSTHROUGH:
                    listed.append(tool)
        listed.append(
            types.Tool(
                name=RECONCILE_TOOL,
                description="Settle calls whose outcome is unknown through the upstreams' lookup "
                "tools; answers each settled operation's status.",
                inputSchema={"type": "object", "properties": {}},
            )
        )
        return listed

    def operation_of(self, tool: str, arguments: Mapping[str, Any]) -> Operation:
        """The guarded call a client call is, and the arguments to forward (see the module doc)."""
        forwarded = dict(arguments)
        named = forwarded.pop(OPERATION_ARG, None)
        if named is not None:
            return Operation(NAMED_SCOPE, f"{tool}:{named}", True, forwarded, f"mcp:{tool}:{named}")
        digest = digests.digest(digests.to_jsonable(forwarded, path="arguments"))
        scope = f"mcp:session:{self.session_id}"
        return Operation(scope, f"{tool}:{digest}", False, forwarded, f"{scope}:{tool}:{digest}")

    async def call(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """Answer one client call: refuse, forward, reconcile, or run it through its contract."""
        if name == RECONCILE_TOOL:
            async with self.lock:
                return await anyio.to_thread.run_sync(self._reconcile)
        if name in self.contracted:
            async with self.lock:
                return await anyio.to_thread.run_sync(self._contracted, name, arguments)
        upstream = self.owner.get(name)
        if upstream is None:
            return _refusal(f"no upstream offers a tool named {name!r}")
        if self.config.default is config_mod.Default.PASSTHROUGH:
            return await self.upstreams.sessions[upstream].call_tool(name, arguments)
        return _refusal(
            f"the effectflow gateway refuses {name!r}: it has no side-effect contract in the "
            "gateway's configuration, and the configuration's default is 'refuse'. Ask an operator "
            "to add a contract for it."
        )

    def _status(self, run: records.RunRecord) -> dict[str, Any]:
        steps = self.runtime.steps(run.run_id)
        step = steps[0] if steps else None
        body: dict[str, Any] = {
            "status": step.status.value if step is not None else run.status.value,
            "operation_id": _client_operation(run),
            "run_id": run.run_id,
            "external_effect_id": step.external_effect_id if step is not None else None,
        }
        if run.status is records.RunStatus.SUCCEEDED:
            body["result"] = run.output
        elif run.error:
            body["error"] = run.error
        return body

    def _contracted(self, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        tool_ref, _ = self.contracted[name]
        op = self.operation_of(name, arguments)
        try:
            self.runtime.guard(
                tool_ref,
                {"arguments": op.forwarded},
                scope=op.scope,
                call_id=op.call_id,
                new_request=op.new_request,
            )
        except errors.IdempotencyConflict:
            return _refusal(
                f"operation {op.operation_id!r} was already requested with other arguments; a "
                "new request needs a new operation_id"
            )
        except errors.NeedsPerson:
            pass  # in doubt (or waiting for a person): the run's status says so
        except errors.EffectflowError as exc:
            if not isinstance(exc, errors.StepFailed):
                return _refusal(f"{exc.code}: {exc}")
        run = self.runtime.store.get_run(
            guard.run_id_of(self.runtime.tenant, op.scope, op.call_id), tenant=self.runtime.tenant
        )
        if run is None:  # refused before anything was recorded
            return _refusal(f"operation {op.operation_id!r} could not be recorded")
        body = self._status(run)
        return _result(body, error=body["status"] not in {"confirmed", *_IN_DOUBT})

    def _reconcile(self) -> types.CallToolResult:
        touched = self.runtime.reconcile()
        return _result({"status": "reconciled", "runs": [self._status(run) for run in touched]})


@dataclasses.dataclass(frozen=True)
class Operation:
    """A client call as a guarded call."""

    #: The guarded call's scope: ``mcp`` for a named operation, else the MCP session.
    scope: str
    #: Its call id in the scope: the tool and the operation id, or the digest of the arguments.
    call_id: str
    #: Whether the client named the request (a named operation is never another's answer).
    new_request: bool
    #: The arguments the upstream gets (``operation_id`` stripped).
    forwarded: dict[str, Any]
    #: The operation as the client sees it in answers.
    operation_id: str


def _client_operation(run: records.RunRecord) -> str | None:
    """The operation id an answer names: the client's own for a named call."""
    if run.scope == NAMED_SCOPE and run.call_id is not None:
        return f"mcp:{run.call_id}"
    if run.scope is not None:
        return f"{run.scope}:{run.call_id}"
    return run.input.get("operation_id")  # a run an earlier gateway recorded


async def serve(config: config_mod.GatewayConfig, db_url: str) -> None:
    """Connect to every upstream, then serve MCP over this process's stdin and stdout."""
    upstreams = Upstreams(asyncio.get_running_loop())
    async with AsyncExitStack() as stack:
        for up in config.upstreams:
            await upstreams.connect(stack, up)
        gateway = Gateway(config, upstreams, db_url)
        stack.callback(gateway.close)
        server: Server[Any, Any] = Server("effectflow-mcp-gateway")

        async def list_tools() -> list[types.Tool]:
            return gateway.list_tools()

        # The SDK's list_tools() decorator factory is unannotated, hence the narrow ignore.
        server.list_tools()(list_tools)  # type: ignore[no-untyped-call]
        # The gateway validates nothing itself: the upstream validates its own arguments.
        server.call_tool(validate_input=False)(gateway.call)
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())
