"""Temporal activities whose side effects go through effectflow, run offline.

What it shows, against a provider that is a local file (its lines are the proof), with each
activity attempt run under ``temporalio.testing.ActivityEnvironment`` exactly as Temporal's worker
would start it (the workflow id and run id, the activity id, the attempt number):

(a) attempt 1 of activity ``1`` sends an email through ``effectflow.contrib.temporal.guarded``;
    its heartbeats carry the ledger run id and a state name, nothing else;
(b) Temporal's retry of the same activity id (attempt 2: the worker died before the server got
    the completion) gets the recorded result, and the workflow scheduling the same call again
    under a new activity id gets it too: one email;
(c) a refund ends its attempt with a non-retryable ``EffectflowNeedsPerson`` error; the workflow
    (``SupportCase`` below) waits for a signal with the person's decision and runs the decision
    activity, which records the approval and makes the refund, once.

No Temporal server runs here (its test server is a download, and this runs offline), so
``SupportCase`` is defined — Temporal checks the definition when this file is imported — but its
run is not executed; docs/integrations/temporal.md says what that leaves untested::

    pip install 'effectflow[temporal]'
    python examples/temporal_agent.py

tests/contrib/test_temporal_example.py runs this.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.testing import ActivityEnvironment

with workflow.unsafe.imports_passed_through():
    import effectflow as ef
    from effectflow.contrib import temporal as ef_temporal


class Provider:
    """The outside world: every effect it commits is one JSON line in its file."""

    path = Path("provider.jsonl")  # main() points it into a temporary folder

    def records(self, kind: str | None = None) -> list[dict[str, Any]]:
        lines = self.path.read_text().splitlines() if self.path.exists() else []
        return [r for r in map(json.loads, lines) if kind in (None, r["kind"])]

    def commit(self, kind: str, key: str, **fields: Any) -> dict[str, Any]:
        record = {"id": f"{kind}_{len(self.records()) + 1}", "kind": kind, "key": key, **fields}
        with self.path.open("a") as fh:
            fh.write(json.dumps(record) + "\n")
        return {k: v for k, v in record.items() if k != "key"}


PROVIDER = Provider()


@ef.tool("find_email", effect="read")
def find_email(*, idempotency_key: str) -> ef.Lookup:
    """The lookup: after a crash or a lost answer, effectflow asks the provider."""
    for record in PROVIDER.records("email"):
        if record["key"] == idempotency_key:
            result = {k: v for k, v in record.items() if k != "key"}
            return ef.Lookup.confirmed(external_effect_id=record["id"], result=result)
    return ef.Lookup.not_committed()


# Not idempotent, but each email carries its key, so the lookup can find it.
@ef.tool("send_email", effect="external_write", confirm=find_email, effect_id="id",
         settles_within=0)  # fmt: skip
def send_email(to: str, subject: str, *, idempotency_key: str) -> dict[str, Any]:
    """Send an email to a customer."""
    return PROVIDER.commit("email", idempotency_key, to=to, subject=subject)


# A financial write waits for a person's approval by default; the provider deduplicates by key.
@ef.tool("refund", effect="financial_write", idempotency=ef.Idempotency(supported=True),
         effect_id="id")  # fmt: skip
def refund(order: str, amount_cents: int, *, idempotency_key: str) -> dict[str, Any]:
    """Refund an order."""
    for record in PROVIDER.records("refund"):
        if record["key"] == idempotency_key:
            return {k: v for k, v in record.items() if k != "key"}
    return PROVIDER.commit("refund", idempotency_key, order=order, amount_cents=amount_cents)


@workflow.defn(name="support_case")
class SupportCase:
    """The workflow side of "needs a person" (defined, not run here: no server). The refund's
    attempt fails with ``EffectflowNeedsPerson``; the workflow waits durably for the ``decide``
    signal, then runs the decision activity, which completes the call from the ledger."""

    def __init__(self) -> None:
        self.decision: dict[str, Any] | None = None

    @workflow.signal
    def decide(self, decision: dict[str, Any]) -> None:
        """A person's decision, e.g. ``{"approved": True, "approver": "alice"}``."""
        self.decision = decision

    @workflow.run
    async def run(self, order: str, amount_cents: int) -> Any:
        """Refund the order; wait for a person when the guard says one must decide."""
        timeout = timedelta(seconds=30)
        try:
            return await workflow.execute_activity(
                "refund", args=[order, amount_cents], start_to_close_timeout=timeout
            )
        except ActivityError as error:
            asked = ef_temporal.asked_of(error)
            if asked is None:
                raise
            await workflow.wait_condition(lambda: self.decision is not None)
            return await workflow.execute_activity(
                ef_temporal.DECIDE, args=[asked, self.decision], start_to_close_timeout=timeout
            )


def attempt(fn: Any, *args: Any, activity_id: str, number: int = 1, beats: list[Any]) -> Any:
    """One attempt of an activity, as Temporal's worker would start it."""
    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        ActivityEnvironment.default_info(),
        activity_id=activity_id,
        attempt=number,
        workflow_id="case-ada",
        workflow_run_id="run-1",
        workflow_type="support_case",
    )
    env.on_heartbeat = lambda *details: beats.append(details[0])

    async def run() -> Any:
        return await env.run(fn, *args)

    return asyncio.run(run())


def main() -> None:
    """The three scenes, each checked against the provider's records."""
    with tempfile.TemporaryDirectory() as tmp, ef.Runtime(f"sqlite:///{tmp}/ledger.db") as rt:
        PROVIDER.path = Path(tmp) / "provider.jsonl"
        send_activity = ef_temporal.guarded(rt, send_email)  # the one line per tool
        refund_activity = ef_temporal.guarded(rt, refund)
        decide_activity = ef_temporal.decision_activity(rt)
        beats: list[Any] = []

        print("(a) attempt 1 of activity 1 sends the email")
        sent = attempt(send_activity, "ada@example.com", "Shipped", activity_id="1", beats=beats)
        print(f"  the activity returned: {sent}")
        print(f"  heartbeats: {json.dumps(beats)}")

        print("(b) Temporal retries activity 1; the workflow schedules the call again as 2")
        again = attempt(
            send_activity, "ada@example.com", "Shipped", activity_id="1", number=2, beats=beats
        )
        regenerated = attempt(
            send_activity, "ada@example.com", "Shipped", activity_id="2", beats=beats
        )
        print(f"  attempt 2 of activity 1 returned: {again}")
        print(f"  activity 2 returned: {regenerated}")
        emails = PROVIDER.records("email")
        print(f"  the provider's outbox: {len(emails)} email ({emails[0]['id']})")
        assert len(emails) == 1
        assert again == regenerated == sent

        print("(c) a refund waits for a person")
        try:
            attempt(refund_activity, "o-17", 4200, activity_id="3", beats=beats)
            raise AssertionError("a financial write waits for an approval")
        except ApplicationError as error:
            print(f"  the attempt failed: type={error.type} non_retryable={error.non_retryable}")
            asked = ef_temporal.asked_of(error)
        assert asked is not None
        for field in ("kind", "next_action", "for_model", "resume_with"):
            print(f"  {field}: {json.dumps(asked[field])}")
        assert PROVIDER.records("refund") == [], "nothing is refunded before the approval"
        decision = {"approved": True, "approver": "alice@support"}
        print(f"  the workflow gets the signal {decision} and runs {ef_temporal.DECIDE}")
        refunded = attempt(decide_activity, asked, decision, activity_id="4", beats=beats)
        print(f"  the decision activity returned: {refunded}")
        refunds = PROVIDER.records("refund")
        print(f"  the provider's refunds: {len(refunds)} ({refunds[0]['id']})")
        assert len(refunds) == 1

        print("the ledger: one guarded call per (workflow run, activity id)")
        for run in sorted(rt.runs(), key=lambda r: r.created_at):
            print(f"  {run.input['scope']} {run.input['call_id']}: {run.status}")
    print("ok: 1 email and 1 refund, whatever Temporal retried")


if __name__ == "__main__":
    main()
