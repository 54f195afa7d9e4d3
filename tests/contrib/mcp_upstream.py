"""A small upstream MCP server (stdio) for the gateway's tests: a mail provider that keys sends.

``MCP_UPSTREAM_DB`` names its SQLite file. When the file ``$MCP_UPSTREAM_DB.slow`` exists,
``send_email`` commits and then sleeps for that many seconds before answering (a lost response
behind a gateway timeout); when ``$MCP_UPSTREAM_DB.lookup_down`` exists, ``find_email`` fails (a
provider whose lookup is briefly unavailable).
"""

from __future__ import annotations

import os
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import anyio
from mcp.server.fastmcp import FastMCP

DB = Path(os.environ["MCP_UPSTREAM_DB"])
server = FastMCP("mail-upstream")


def _connect() -> sqlite3.Connection:
    conn = sqlite3.connect(DB, isolation_level=None, timeout=10)
    conn.execute(
        "CREATE TABLE IF NOT EXISTS emails (email_id TEXT PRIMARY KEY, "
        "idempotency_key TEXT UNIQUE, recipient TEXT, body TEXT)"
    )
    return conn


def _row(conn: sqlite3.Connection, key: str) -> dict[str, Any] | None:
    row = conn.execute(
        "SELECT email_id, recipient, body FROM emails WHERE idempotency_key = ?", (key,)
    ).fetchone()
    if row is None:
        return None
    return {"email_id": row[0], "to": row[1], "body": row[2], "idempotency_key": key}


@server.tool()
async def send_email(to: str, body: str, idempotency_key: str) -> dict[str, Any]:
    """Send an email once per key: a repeated key returns the first send."""
    conn = _connect()
    try:
        existing = _row(conn, idempotency_key)
        if existing is None:
            conn.execute(
                "INSERT INTO emails VALUES (?, ?, ?, ?)",
                (f"em_{uuid.uuid4().hex[:12]}", idempotency_key, to, body),
            )
            existing = _row(conn, idempotency_key)
            assert existing is not None
    finally:
        conn.close()
    slow = Path(f"{DB}.slow")
    if slow.exists():
        # Asleep on the loop, not in it: the lookup must still be answered meanwhile.
        await anyio.sleep(float(slow.read_text() or "5"))
    return existing


@server.tool()
def find_email(idempotency_key: str) -> dict[str, Any]:
    """The email sent with this key; ``email_id`` is null when there is none."""
    if Path(f"{DB}.lookup_down").exists():
        raise RuntimeError("lookup temporarily unavailable")
    conn = _connect()
    try:
        found = _row(conn, idempotency_key)
    finally:
        conn.close()
    return found or {"email_id": None}


@server.tool()
def ping() -> str:
    """Answer pong (a tool without a contract)."""
    return "pong"


if __name__ == "__main__":
    server.run("stdio")
