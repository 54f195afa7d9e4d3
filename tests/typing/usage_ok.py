"""Typed ``ctx.call`` usage that must pass ``mypy --strict`` (checked by tests/unit/test_typed_call.py).

Never imported at run time: the tools here are declared with ``register=False`` all the same, so
importing it by accident adds nothing to the process-wide registry.
"""

from __future__ import annotations

from typing import Any, assert_type, cast

import effectflow as ef
from effectflow.contracts import registry
from effectflow.contrib import dbos as ef_dbos


@ef.tool("lookup_customer", effect="read", register=False)
def lookup_customer(customer_id: str, *, with_history: bool = False) -> dict[str, str]:
    """A read tool: every parameter is the caller's."""
    return {"id": customer_id, "history": str(with_history)}


@ef.tool(
    "send_mail",
    effect="external_write",
    idempotency=ef.Idempotency(supported=True),
    redact=ef.Redact(mask=["to"], drop=[]),  # lists, as the documentation writes them
    register=False,
)
def send_mail(to: str, body: str, *, idempotency_key: str = "") -> int:
    """The runtime passes the key; the default lets typed calls leave it out."""
    return len(to) + len(body) + len(idempotency_key)


@ef.tool(
    "send_mail_required_key",
    effect="external_write",
    idempotency=ef.Idempotency(supported=True),
    register=False,
)
def send_mail_required_key(to: str, *, idempotency_key: str) -> int:
    """A key without a default: typed calls go through a cast (docs/typing.md)."""
    return len(to) + len(idempotency_key)


@ef.tool("summarize", effect="pure", register=False)
async def summarize(text: str) -> str:
    """An async tool: the runtime awaits it, so the step's value is a ``str``."""
    return text[:10]


@ef.workflow("typed_sync", register=False)
def typed_sync(ctx: ef.Context, customer_id: str) -> int:
    """Checked calls without and with the call's options."""
    customer = ctx.call("lookup", lookup_customer, customer_id)
    assert_type(customer, dict[str, str])
    assert_type(
        ctx.call("lookup_full", lookup_customer, customer_id, with_history=True), dict[str, str]
    )
    sent = ctx.call(
        "mail",
        send_mail,
        to=customer["id"],
        body="hello",
        operation_id=f"op_{customer_id}_mail",
        key_target=customer_id,
    )
    assert_type(sent, int)
    assert_type(ctx.call("short", summarize, "a long text"), str)
    return sent


@ef.workflow("typed_async", register=False)
async def typed_async(ctx: ef.AsyncContext, customer_id: str) -> str:
    """The async twin: ``await`` gives the tool's result type."""
    customer = await ctx.call("lookup", lookup_customer, customer_id=customer_id)
    assert_type(customer, dict[str, str])
    assert_type(await ctx.call("mail", send_mail, "a@b.c", "hi"), int)
    assert_type(await ctx.call("mail2", send_mail, to="a@b.c", body="hi", observe="lookup"), int)
    return await ctx.call("short", summarize, text=customer["id"])


@ef.workflow("untyped", register=False)
def untyped(ctx: ef.Context) -> None:
    """A tool known only by its ``name@version`` (a YAML contract's) is ``Tool[..., Any]``."""
    loaded = registry.DEFAULT.tool("send_mail@1")
    assert_type(loaded, ef.Tool[..., Any])
    assert_type(ctx.call("mail", loaded, "anything", 1, 2, whatever=True), Any)
    keyed = cast("ef.Tool[..., int]", send_mail_required_key)
    assert_type(ctx.call("mail_keyed", keyed, to="a@b.c"), int)


def dbos_guarded(rt: ef.Runtime) -> int:
    """``guarded(rt, tool)`` keeps the tool's ``Tool[P, R]``: a DBOS workflow's calls are checked
    and typed as ``ctx.call``'s are (an async tool's result is its coroutine's)."""
    send = ef_dbos.guarded(rt, send_mail)
    assert_type(send("a@b.c", "hi"), int)
    assert_type(send(to="a@b.c", body="hi"), int)
    assert_type(ef_dbos.guarded(rt, summarize, name="short")("a long text"), str)
    assert_type(ef_dbos.GuardedStep(rt, lookup_customer)("c1", with_history=True), dict[str, str])
    assert_type(ef_dbos.guarded(rt, registry.DEFAULT.tool("send_mail@1"))(1, x=2), Any)
    return send(to="a@b.c", body="hi")


async def dbos_guarded_async(rt: ef.Runtime) -> str:
    """``run_async`` from an async workflow: the same types under ``await``."""
    assert_type(await ef_dbos.guarded(rt, send_mail).run_async("a@b.c", "hi"), int)
    return await ef_dbos.guarded(rt, summarize).run_async(text="a long text")
