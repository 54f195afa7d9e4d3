"""The MCP gateway end to end: the SDK's real client, the gateway process, a real upstream process."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

pytest.importorskip("mcp")

from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import get_default_environment, stdio_client

import effectflow as ef

UPSTREAM = Path(__file__).with_name("mcp_upstream.py")
#: Seconds before the gateway counts a send_email call as unknown.
SEND_TIMEOUT = 1.5

T = TypeVar("T")


def _config(tmp_path: Path, *, default: str = "refuse") -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "default": default,
                "upstreams": {
                    "mail": {
                        "command": sys.executable,
                        "args": [str(UPSTREAM)],
                        "env": {"MCP_UPSTREAM_DB": str(tmp_path / "mail.db")},
                        "tools": {
                            "send_email": {
                                "effect": "external_write",
                                "idempotency_key": "idempotency_key",
                                "effect_id": "email_id",
                                "timeout": SEND_TIMEOUT,
                                "lookup": {
                                    "tool": "find_email",
                                    "key": "idempotency_key",
                                    "found": "email_id",
                                },
                            },
                        },
                    }
                },
            }
        )
    )
    return path


def _with_gateway(tmp_path: Path, use: Callable[[ClientSession], Awaitable[T]]) -> T:
    params = StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "effectflow.cli.main",
            "mcp-gateway",
            "--config",
            str(_config(tmp_path)),
            "--db",
            f"sqlite:///{tmp_path / 'ledger.db'}",
        ],
        env=get_default_environment(),
        cwd=str(tmp_path),
    )

    async def main() -> T:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            return await use(session)

    return asyncio.run(main())


def _emails(tmp_path: Path) -> list[tuple[str, str]]:
    conn = sqlite3.connect(tmp_path / "mail.db")
    try:
        return conn.execute("SELECT email_id, idempotency_key FROM emails").fetchall()
    finally:
        conn.close()


def _body(result: types.CallToolResult) -> dict[str, Any]:
    assert result.structuredContent is not None, result
    return result.structuredContent


def _send(session: ClientSession, **extra: Any) -> Awaitable[types.CallToolResult]:
    return session.call_tool("send_email", {"to": "a@example.com", "body": "hello", **extra})


@pytest.mark.timeout(30)
def test_a_call_sends_one_email_and_answers_confirmed_with_the_external_id(
    tmp_path: Path,
) -> None:
    """A contracted call goes through the ledger with a key and answers the provider's id."""

    async def use(session: ClientSession) -> types.CallToolResult:
        return await _send(session, operation_id="op-a")

    result = _with_gateway(tmp_path, use)
    body = _body(result)
    emails = _emails(tmp_path)
    assert not result.isError
    assert body["status"] == "confirmed"
    assert [e[0] for e in emails] == [body["external_effect_id"]]
    assert emails[0][1]  # the gateway injected a key
    with ef.Runtime(f"sqlite:///{tmp_path / 'ledger.db'}") as rt:
        effects = rt.effects()
    assert [(e.status, e.external_effect_id) for e in effects] == [
        ("confirmed", body["external_effect_id"])
    ]


@pytest.mark.timeout(40)
def test_the_same_operation_again_is_deduplicated(tmp_path: Path) -> None:
    """Repeats (same operation_id, or same arguments within a session) send no second email."""

    async def use(session: ClientSession) -> list[dict[str, Any]]:
        first = _body(await _send(session, operation_id="op-b"))
        again = _body(await _send(session, operation_id="op-b"))
        plain = _body(await _send(session))
        plain_again = _body(await _send(session))
        return [first, again, plain, plain_again]

    first, again, plain, plain_again = _with_gateway(tmp_path, use)

    async def later_session(session: ClientSession) -> dict[str, Any]:
        return _body(await _send(session, operation_id="op-b"))

    later = _with_gateway(tmp_path, later_session)
    assert first["external_effect_id"] == again["external_effect_id"]
    assert later["external_effect_id"] == first["external_effect_id"]
    assert plain["external_effect_id"] == plain_again["external_effect_id"]
    assert plain["external_effect_id"] != first["external_effect_id"]
    assert len(_emails(tmp_path)) == 2


@pytest.mark.timeout(40)
def test_a_commit_whose_answer_outlives_the_timeout_is_waited_for_not_repeated(
    tmp_path: Path,
) -> None:
    """The upstream commits, then answers after the gateway's timeout while its lookup is down:
    the call still running is not abandoned; its late answer confirms the effect
    (docs/decision-table.md#when-not-found-is-proof), and the upstream holds one email."""
    mail_db = tmp_path / "mail.db"
    Path(f"{mail_db}.slow").write_text(str(SEND_TIMEOUT * 2))
    Path(f"{mail_db}.lookup_down").write_text("")

    async def use(session: ClientSession) -> tuple[types.CallToolResult, dict[str, Any]]:
        answer = await _send(session, operation_id="op-c")
        Path(f"{mail_db}.lookup_down").unlink()
        Path(f"{mail_db}.slow").unlink()
        reconciled = _body(await session.call_tool("effectflow_reconcile", {}))
        return answer, reconciled

    answer, reconciled = _with_gateway(tmp_path, use)
    emails = _emails(tmp_path)
    assert len(emails) == 1
    assert _body(answer)["status"] == "confirmed"
    assert _body(answer)["external_effect_id"] == emails[0][0]
    assert reconciled["runs"] == []


@pytest.mark.timeout(30)
def test_a_tool_without_a_contract_is_refused(tmp_path: Path) -> None:
    """Under ``default: refuse`` an uncontracted tool is neither listed nor forwarded."""

    async def use(session: ClientSession) -> tuple[list[str], types.CallToolResult]:
        listed = await session.list_tools()
        return [t.name for t in listed.tools], await session.call_tool("ping", {})

    names, result = _with_gateway(tmp_path, use)
    assert "ping" not in names
    assert "send_email" in names
    assert result.isError
    text = result.content[0]
    assert isinstance(text, types.TextContent)
    assert "no side-effect contract" in text.text


@pytest.mark.timeout(40)
def test_gateway_calls_are_guarded_calls_found_by_the_clients_ids(tmp_path: Path) -> None:
    """The gateway stands on ``rt.guard``: a named operation is a request of its own (two names,
    the same arguments: two emails), the same name with other arguments is refused, and the
    operator finds the calls by scope and call id."""

    async def use(session: ClientSession) -> list[types.CallToolResult]:
        return [
            await _send(session, operation_id="op-x"),
            await _send(session, operation_id="op-y"),
            await session.call_tool(
                "send_email", {"to": "b@example.com", "body": "other", "operation_id": "op-x"}
            ),
        ]

    x, y, conflict = _with_gateway(tmp_path, use)
    assert _body(x)["status"] == _body(y)["status"] == "confirmed"
    assert _body(x)["operation_id"] == "mcp:send_email:op-x"
    assert conflict.isError
    assert "already requested with other arguments" in _body(conflict)["message"]
    assert len(_emails(tmp_path)) == 2
    with ef.Runtime(f"sqlite:///{tmp_path / 'ledger.db'}") as rt:
        [found] = rt.runs(scope="mcp", call_id="send_email:op-x")
        assert found.workflow == "effectflow.guarded_call"
        assert found.run_id == _body(x)["run_id"]
        assert len(rt.runs(scope="mcp")) == 2
