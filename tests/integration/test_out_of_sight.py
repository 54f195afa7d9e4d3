"""No effect out of sight (docs/concepts.md#no-effect-out-of-sight): whatever happens after a call
committed, the effect is confirmed or listed for a person — never dropped with a failed run.

- a result that cannot be recorded (no JSON form, nested 100k deep, 20 MB, a NUL);
- workflow code that changed between a SIGKILL and the recovery (an argument changed, the step
  renamed, the step removed): the effect is settled from its *recorded* request and key, and the
  run waits for a person, the change named; its version change is audited.

Checked against the providers' own records on both backends.
"""

from __future__ import annotations

import datetime as dt
import math
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import changed_app
import pytest

import effectflow as ef
from effectflow.ledger.records import StepStatus

# -- results that cannot be recorded ----------------------------------------------------------------

#: The provider's own record of what it committed.
POSTS: list[str] = []
#: What the tool returns after committing (set by each test).
RETURNS: list[Any] = []


@ef.tool("oos_post", effect="external_write", effect_id="post_id", settles_within=0)
def post(text: str, *, idempotency_key: str) -> Any:
    POSTS.append(idempotency_key)
    return RETURNS[0]


@ef.workflow("oos_flow")
def flow(ctx: ef.Context) -> Any:
    return ctx.call("post", post, text="hello")


def _deep(levels: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels):
        value = [value]
    return value


class Opaque:
    """An object with no JSON form."""


UNRECORDABLE = {
    "nan": float("nan"),
    "infinity": math.inf,
    "object": Opaque(),
    "naive_datetime": dt.datetime(2026, 12, 1, 12, 0),  # no tzinfo: the point of the test
    "lone_surrogate": "\ud800",
    "nested_100k": _deep(100_000),
    "twenty_mb": "x" * 20_000_000,
    "nul": "a\x00b",
    "set_of_objects": {Opaque()},
}


@pytest.fixture(autouse=True)
def _fresh() -> None:
    POSTS.clear()
    RETURNS.clear()


@pytest.mark.parametrize("shape", ["bare", "in_a_result_with_its_id"])
@pytest.mark.parametrize("kind", list(UNRECORDABLE))
def test_an_unrecordable_result_after_a_commit_leaves_the_effect_confirmed(
    any_ledger: str, kind: str, shape: str
) -> None:
    raw = UNRECORDABLE[kind]
    RETURNS.append(raw if shape == "bare" else {"post_id": "p1", "body": raw})
    with ef.Runtime(any_ledger) as rt:
        run = rt.start(flow, run_id="weird")
        assert run.status is ef.RunStatus.FAILED
        assert run.error is not None
        assert run.error["code"] == "result_not_recordable"
        [step] = rt.steps("weird")
        [effect] = rt.effects(run_id="weird")
        assert step.status is StepStatus.CONFIRMED
        assert effect.status is StepStatus.CONFIRMED
        assert run.error["confirmed_effects"] == [effect.effect_id]
        assert effect.evidence is not None
        assert effect.evidence["code"] == "result_not_recordable"
        assert effect.evidence["raw_digest"].startswith("sha256:")
        if shape == "in_a_result_with_its_id":
            assert effect.external_effect_id == "p1"
        # A redrive replays the confirmed step: nothing is sent again.
        rt.resume("weird")
        assert rt.verify_audit("weird") == []
    assert len(POSTS) == 1


# -- workflow code changed between a SIGKILL and the recovery ------------------------------------


@pytest.mark.parametrize("variant", ["argument_changed", "step_renamed", "step_removed"])
def test_code_changed_before_recovery_settles_the_recorded_step_and_waits_for_a_person(
    any_ledger: str, tmp_path: Path, variant: str
) -> None:
    provider = tmp_path / "posts.jsonl"
    child = subprocess.run(
        [sys.executable, changed_app.__file__, any_ledger, str(provider)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    [sent] = changed_app.posts(provider)

    registry, _ = changed_app.app(variant, provider)
    with ef.Runtime(any_ledger, registry=registry) as rt:
        [run] = rt.recover()
        assert run.status is ef.RunStatus.PAUSED
        assert run.error is not None
        assert run.error["code"] == "workflow_changed"
        assert "send" in run.error["message"]
        steps = {s.step_id: s for s in rt.steps("changed")}
        # Settled from what was recorded: the provider's post, by the recorded key.
        assert steps["send"].status is StepStatus.CONFIRMED
        assert steps["send"].external_effect_id == sent["id"]
        assert steps["send"].idempotency_key == sent["key"]
        assert "send_v2" not in steps
        [item] = rt.attention()
        assert (item.kind, item.run_id) == ("workflow_changed", "changed")
        kinds = [e.kind for e in rt.audit("changed")]
        assert "workflow_version_changed" in kinds
        assert "workflow_changed" in kinds
        assert rt.run("changed").workflow_version == "2"
        # Resuming under the changed code pauses again; nothing is sent twice.
        assert rt.resume("changed").status is ef.RunStatus.PAUSED
    assert changed_app.posts(provider) == [sent]

    # The code the run was started with, restored: the run finishes from its records.
    registry, _ = changed_app.app("original", provider)
    with ef.Runtime(any_ledger, registry=registry) as rt:
        done = rt.resume("changed")
        assert done.status is ef.RunStatus.SUCCEEDED, done.error
        assert done.output == sent["id"].upper()
    assert changed_app.posts(provider) == [sent]


def test_a_set_result_is_recorded_as_a_sorted_list(any_ledger: str) -> None:
    """A set has one JSON form (its items sorted canonically): it is recorded, not refused."""
    RETURNS.append({"post_id": "p1", "tags": {"b", "a", 3}})
    with ef.Runtime(any_ledger) as rt:
        run = rt.start(flow, run_id="set")
        assert run.status is ef.RunStatus.SUCCEEDED, run.error
        assert run.output == {"post_id": "p1", "tags": ["a", "b", 3]}  # by canonical JSON
    assert len(POSTS) == 1
