"""Typed ``ctx.call`` usage mypy must refuse: each marked line fails with the code it names, no
other line fails (checked by tests/unit/test_typed_call.py). Never imported at run time.
"""

from __future__ import annotations

import effectflow as ef
from effectflow.contrib import dbos as ef_dbos


@ef.tool("lookup_customer", effect="read", register=False)
def lookup_customer(customer_id: str, *, with_history: bool = False) -> dict[str, str]:
    """A read tool."""
    return {"id": customer_id, "history": str(with_history)}


@ef.tool(
    "send_mail",
    effect="external_write",
    idempotency=ef.Idempotency(supported=True),
    register=False,
)
def send_mail(to: str, body: str, *, idempotency_key: str = "") -> int:
    """The key has a default, so typed calls may leave it out."""
    return len(to) + len(body) + len(idempotency_key)


@ef.tool(
    "send_mail_required_key",
    effect="external_write",
    idempotency=ef.Idempotency(supported=True),
    register=False,
)
def send_mail_required_key(to: str, *, idempotency_key: str) -> int:
    """The limit docs/typing.md states: a required injected parameter is required in typed calls."""
    return len(to) + len(idempotency_key)


@ef.tool("summarize", effect="pure", register=False)
async def summarize(text: str) -> str:
    """An async tool."""
    return text[:10]


@ef.workflow("bad_sync", register=False)
def bad_sync(ctx: ef.Context) -> None:
    """Wrong arguments, wrong result types, a tool named by a string."""
    ctx.call("lookup", lookup_customer, 42)  # E: call-overload
    ctx.call("lookup", lookup_customer)  # E: call-overload
    # Where one overload fits best mypy names that one's error, not ``call-overload``.
    ctx.call("lookup", lookup_customer, "c1", with_history="yes")  # E: arg-type
    ctx.call("lookup", lookup_customer, "c1", colour="red")  # E: call-arg
    ctx.call("mail", send_mail, to="a@b.c")  # E: call-overload
    ctx.call("mail", send_mail, to="a@b.c", body=3, operation_id="op_1")  # E: call-overload
    ctx.call("mail", send_mail, to="a@b.c", body="hi", operation_id=7)  # E: call-overload
    count: str = ctx.call("mail", send_mail, "a@b.c", "hi")  # E: assignment
    text: int = ctx.call("short", summarize, "a long text")  # E: assignment
    ctx.call("mail", "send_mail@1", to="a@b.c", body="hi")  # E: call-overload
    ctx.call("mail", send_mail_required_key, to="a@b.c")  # E: call-overload
    # With an option, a tool's arguments go by keyword (docs/typing.md: the call's options).
    ctx.call("mail", send_mail, "a@b.c", "hi", operation_id="op_1")  # E: call-arg
    print(count, text)


@ef.workflow("bad_async", register=False)
async def bad_async(ctx: ef.AsyncContext) -> None:
    """The async twin refuses the same."""
    await ctx.call("lookup", lookup_customer, 42)  # E: call-overload
    await ctx.call("mail", send_mail, to="a@b.c", body=b"hi", observe="lookup")  # E: call-overload
    # Under ``await`` the declared type is inferred into R, so the overload, not the assignment, fails.
    found: int = await ctx.call("lookup", lookup_customer, "c1")  # E: call-overload
    print(found)


def dbos_guarded(rt: ef.Runtime) -> None:
    """A DBOS workflow's guarded call refuses what ``ctx.call`` refuses."""
    send = ef_dbos.guarded(rt, send_mail)
    send(to="a@b.c", body=3)  # E: arg-type
    send("a@b.c")  # E: call-arg
    send("a@b.c", "hi", colour="red")  # E: call-arg
    sent: str = send("a@b.c", "hi")  # E: assignment
    summary: int = ef_dbos.guarded(rt, summarize)("a long text")  # E: assignment
    ef_dbos.guarded(rt, "send_mail@1")  # E: call-overload
    print(sent, summary)


async def dbos_guarded_async(rt: ef.Runtime) -> None:
    """The async twin."""
    await ef_dbos.guarded(rt, lookup_customer).run_async(42)  # E: arg-type
