"""Misuse is refused before anything is recorded, with an error that says what to write instead,
and never leaves a run hanging under a live lease (docs/concepts.md#bad-input-changes-nothing)."""

from __future__ import annotations

import re
from typing import Any

import pytest

import effectflow as ef

CALLS: list[int] = []


@ef.tool("mis_post", effect="external_write")
def post(x: int) -> dict[str, Any]:
    CALLS.append(x)
    return {"x": x}


def plain(x: int) -> int:
    return x


@ef.workflow("mis_swapped")
def swapped(ctx: ef.Context) -> Any:
    return ctx.call(post, "step", x=1)  # type: ignore[arg-type]


@ef.workflow("mis_not_a_tool")
def not_a_tool(ctx: ef.Context) -> Any:
    return ctx.call("step", plain, x=1)  # type: ignore[arg-type]


@ef.workflow("mis_missing_argument")
def missing_argument(ctx: ef.Context) -> Any:
    return ctx.call("post", post)


@ef.workflow("mis_needs_input")
def needs_input(ctx: ef.Context, order_id: str, amount: int = 0) -> Any:
    return ctx.call("post", post, x=amount)


@pytest.fixture(autouse=True)
def _fresh() -> None:
    CALLS.clear()


@pytest.mark.parametrize(
    ("workflow", "says"),
    [
        (swapped, r"the step id comes first and the tool second; write ctx.call\('step', mis_post"),
        (not_a_tool, r"step step: <function plain .*> is not a tool; decorate it"),
        (missing_argument, r"tool mis_post@1: missing a required argument: 'x'"),
    ],
)
def test_a_call_out_of_order_or_of_a_non_tool_fails_the_run_cleanly(
    any_ledger: str, workflow: ef.Workflow[..., Any], says: str
) -> None:
    """The run ends failed with a clear, JSON-recorded error and no lease; nothing was called."""
    with ef.Runtime(any_ledger) as rt:
        run = rt.start(workflow, run_id="bad")
        assert run.status is ef.RunStatus.FAILED
        assert run.error is not None
        assert run.error["code"] in ("contract_error", "bad_argument")
        assert re.search(says, run.error["message"])
        assert run.lease_owner is None
        assert rt.steps("bad") == []
        assert rt.attention() == []
        assert rt.verify_audit("bad") == []
    assert CALLS == []


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({}, r"missing a required argument: 'order_id'; it takes \(order_id, amount=...\)"),
        ({"order_id": "o1", "colour": "red"}, r"unexpected keyword argument 'colour'"),
    ],
)
def test_a_workflow_started_with_the_wrong_inputs_records_no_run(
    any_ledger: str, given: dict[str, Any], says: str
) -> None:
    with ef.Runtime(any_ledger) as rt:
        with pytest.raises(ef.ArgumentError, match=says):
            rt.start(needs_input, run_id="bad", **given)
        with pytest.raises(ef.ArgumentError, match=says):
            rt.submit(needs_input, run_id="bad", **given)
        assert rt.runs() == []
    assert CALLS == []
