"""The MCP gateway's configuration: a tool's contract is read whole or refused, saying where."""

from __future__ import annotations

import re
from typing import Any

import pytest

import effectflow as ef
from effectflow.contrib.mcp import config


def _with_tool(**fields: Any) -> dict[str, Any]:
    tool = {"effect": "external_write", "idempotency_key": "idempotency_key", **fields}
    return {"upstreams": {"hooks": {"command": "unused", "tools": {"post": tool}}}}


def test_a_redaction_rule_is_read_as_the_tool_contract_s() -> None:
    parsed = config.parse(_with_tool(redact={"drop": ["api_key"], "mask": ["card.number"]}))
    rule = parsed.upstreams[0].tools["post"].redact
    assert rule == ef.Redact(drop=("api_key",), mask=("card.number",))


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"redcat": {"drop": ["api_key"]}}, "unknown field 'redcat'; a tool's contract takes"),
        ({"redact": {"drop": "api_key"}}, "upstreams.hooks.tools.post.redact: redact drop must"),
        ({"redact": {"hide": ["api_key"]}}, "redact has unknown key 'hide'"),
        ({"redact": {"drop": ["card..number"]}}, "is not a parameter name or a dotted path"),
    ],
)
def test_a_field_the_gateway_would_ignore_is_refused_saying_where(
    fields: dict[str, Any], says: str
) -> None:
    """A misspelt or malformed field, a redaction rule above all, must not be silently skipped:
    the arguments it was meant to keep out of the ledger would be recorded in full."""
    with pytest.raises(
        ef.ContractError, match=re.escape("gateway config.upstreams.hooks.tools.post")
    ) as bad:
        config.parse(_with_tool(**fields))
    assert says in str(bad.value)
