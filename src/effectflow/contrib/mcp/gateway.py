"""An MCP server that puts side-effect contracts in front of other MCP servers' tools.

Each call of a contracted tool becomes a one-step run in the ledger, so a crash, a timeout or a
repeated request never sends an email twice. The MCP SDK is asynchronous and the runtime is
synchronous: the runtime runs in a worker thread (one call at a time), and each tool function it
calls hands the upstream request back to the event loop that owns the upstream sessions with
``asyncio.run_coroutine_threadsafe``. When the runtime's timeout gives up on a call, the request stays
in flight on the loop and its late answer is dropped: exactly why that outcome is unknown.

The logical operation of a call (which decides its idempotency key and its run) is the tool's name
plus the ``operation_id`` argument when the caller passes one (the gateway adds it to every
contracted tool's schema and strips it before forwarding); otherwise it is the digest of the
arguments within this MCP session. So a client that repeats a call (a model retrying after a lost
answer) is deduplicated, while a later session asking for the same arguments is a new operation
unless it names the same ``operation_id``.
"""

from __future__ import annotations

import asyncio
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

#: What an unknown outcome tells the caller (DESIGN §8): the words a model must not retry past.
UNKNOWN_PHRASE = "this may or may not have happened; do not repeat it; it is being checked"
#: The argument through which a caller names its logical operation.
OPERATION_ARG = "operation_id"
#: The gateway's own tool that settles unknown outcomes through the upstreams' lookup tools.
RECONCILE_TOOL = "effectflow_reconcile"
#: The workflow every gateway call runs as.
WORKFLOW = "mcp_gateway_call"

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
        register=False,
    )(_write_fn(up, upstream, cfg))
    return made, helpers


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

    def operation_of(self, tool: str, arguments: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        """The logical operation of a call and the arguments to forward (see the module doc)."""
        forwarded = dict(arguments)
        named = forwarded.pop(OPERATION_ARG, None)
        if named is not None:
            return f"mcp:{tool}:{named}", forwarded
        digest = digests.digest(digests.to_jsonable(forwarded, path="arguments"))
        return f"mcp:{tool}:session:{self.session_id}:{digest}", forwarded

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

    def _status(self, run: records.RunRecord, operation_id: str) -> dict[str, Any]:
        steps = self.runtime.steps(run.run_id)
        step = steps[0] if steps else None
        body: dict[str, Any] = {
            "status": step.status.value if step is not None else run.status.value,
            "operation_id": operation_id,
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
        operation_id, forwarded = self.operation_of(name, arguments)
        run_id = f"mcp-{digests.sha256_hex(operation_id)[:32]}"
        try:
            existed = self.runtime.store.get_run(run_id) is not None
            run = self.runtime.start(
                self.workflow,
                run_id=run_id,
                tool=tool_ref,
                arguments=forwarded,
                operation_id=operation_id,
            )
            if existed and run.status is records.RunStatus.PAUSED:
                # A repeat of an operation still in doubt: look again instead of calling again.
                run = self.runtime.resume(run_id, by="mcp-gateway")
        except errors.IdempotencyConflict:
            return _refusal(
                f"operation {operation_id!r} was already requested with other arguments; a new "
                "request needs a new operation_id"
            )
        except errors.EffectflowError as exc:
            return _refusal(f"{exc.code}: {exc}")
        body = self._status(run, operation_id)
        return _result(body, error=body["status"] not in {"confirmed", *_IN_DOUBT})

    def _reconcile(self) -> types.CallToolResult:
        touched = self.runtime.reconcile()
        settled = [self._status(run, str(run.input.get("operation_id"))) for run in touched]
        return _result({"status": "reconciled", "runs": settled})


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
