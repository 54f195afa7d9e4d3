"""A workflow whose code changes between a SIGKILL and its recovery, and its provider.

The provider is a file of JSON lines (one per post it committed), shared by the child process that
is killed and the test that recovers: the provider's own record the ledger is checked against.
``app(variant, provider)`` builds the tools and the workflow of one version of the code, each in a
registry of its own, under the same names (as a deploy between crash and recovery would).

Run as a script (``python changed_app.py LEDGER_URL PROVIDER_FILE``) it starts the original
workflow and SIGKILLs itself right after the provider committed, before the outcome is recorded.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import effectflow as ef
from effectflow.contracts import registry as registry_mod

VARIANTS = ("original", "argument_changed", "step_renamed", "step_removed")


def posts(provider: Path) -> list[dict[str, Any]]:
    """What the provider committed, in order."""
    if not provider.exists():
        return []
    return [json.loads(line) for line in provider.read_text().splitlines()]


def app(
    variant: str, provider: Path, *, kill: bool = False
) -> tuple[registry_mod.Registry, ef.Workflow[..., Any]]:
    registry = registry_mod.Registry()

    def find(*, idempotency_key: str) -> ef.Lookup:
        for post in posts(provider):
            if post["key"] == idempotency_key:
                return ef.Lookup.confirmed(external_effect_id=post["id"], result=post)
        return ef.Lookup.not_committed()

    find_tool = ef.tool("chg_find", effect="read", register=False)(find)

    def send(to: str, text: str, *, idempotency_key: str) -> dict[str, Any]:
        post = {
            "id": f"p{len(posts(provider)) + 1}",
            "key": idempotency_key,
            "to": to,
            "text": text,
        }
        with provider.open("a") as fh:
            fh.write(json.dumps(post) + "\n")
        if kill:  # committed at the provider; the outcome never reaches the ledger
            os.kill(os.getpid(), signal.SIGKILL)
        return post

    send_tool = ef.tool(
        "chg_send",
        effect="external_write",
        confirm=find_tool,
        effect_id="id",
        settles_within=0,  # a local append lands inside the call or never
        register=False,
    )(send)

    def note(text: str) -> str:
        return text.upper()

    note_tool = ef.tool("chg_note", effect="pure", register=False)(note)

    def original(ctx: ef.Context, to: str) -> Any:
        sent = ctx.call("send", send_tool, to=to, text="hello")
        return ctx.call("note", note_tool, text=sent["id"])

    def argument_changed(ctx: ef.Context, to: str) -> Any:
        sent = ctx.call("send", send_tool, to=to, text="hello again")
        return ctx.call("note", note_tool, text=sent["id"])

    def step_renamed(ctx: ef.Context, to: str) -> Any:
        sent = ctx.call("send_v2", send_tool, to=to, text="hello")
        return ctx.call("note", note_tool, text=sent["id"])

    def step_removed(ctx: ef.Context, to: str) -> Any:
        return ctx.call("note", note_tool, text="nothing sent")

    body = {
        "original": original,
        "argument_changed": argument_changed,
        "step_renamed": step_renamed,
        "step_removed": step_removed,
    }[variant]
    workflow = ef.workflow(
        "chg_flow", version="2" if variant != "original" else "1", register=False
    )(body)
    for made in (find_tool, send_tool, note_tool):
        registry.add_tool(made)
    registry.add_workflow(workflow)
    return registry, workflow


if __name__ == "__main__":
    ledger, provider_file = sys.argv[1:3]
    registry, flow = app("original", Path(provider_file), kill=True)
    with ef.Runtime(ledger, registry=registry) as rt:
        rt.start(flow, run_id="changed", to="a@example.com")
