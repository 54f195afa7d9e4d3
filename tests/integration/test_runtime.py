"""The runtime end to end, in one process, against the simulated providers (each in its own file).

The providers' files are the truth of what happened in the world; the ledger is what the runtime
knows. Every test compares the two.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

import effectflow as ef
from effectflow.testing import (
    CrmProvider,
    Fault,
    FaultAction,
    FaultPlan,
    FaultPoint,
    InjectedCrash,
    MailProvider,
    NotifyProvider,
    ProviderError,
    ProviderUnavailable,
)
from worlds import Current, FakeClock

T = TypeVar("T")

# Retries and lookups back off for milliseconds, so budgets are spent quickly.
FAST = ef.RetryPolicy(max_attempts=3, max_lookups=2, initial_backoff=0.001, max_backoff=0.005)


class World:
    """The outside world the tools of this module talk to (one per test)."""

    def __init__(self, tmp_path: Path, clock: Callable[[], float] = time.time) -> None:
        self.mail = MailProvider(tmp_path / "mail.db", clock=clock, key_retention=3600)
        self.crm = CrmProvider(tmp_path / "crm.db", clock=clock)
        self.notify = NotifyProvider(tmp_path / "notify.db", clock=clock)
        #: How many times the pure draft tool really ran.
        self.drafts = 0
        #: Posts that raise a plain exception after the provider accepted them.
        self.fail_after_post = 0
        #: While True, the notify search lags and cannot tell whether a post exists.
        self.search_lagging = False

    def close(self) -> None:
        for provider in (self.mail, self.crm, self.notify):
            provider.close()


#: The world of the running test, for the tools below.
world = Current[World]()


def speak(call: Callable[[], T]) -> T:
    """Translate a provider's definite errors into the runtime's signals (timeouts pass through)."""
    try:
        return call()
    except ProviderUnavailable as exc:
        raise ef.NotCommitted(str(exc), evidence={"code": exc.code}) from exc
    except ProviderError as exc:
        raise ef.Rejected(str(exc), evidence={"code": exc.code, "status": exc.status}) from exc


# -- tools ------------------------------------------------------------------------------------------


@ef.tool("it_draft_email", effect="pure")
def draft_email(case_id: str) -> str:
    world().drafts += 1
    return f"Draft #{world().drafts} about case {case_id}"


@ef.tool("it_get_email_status", effect="read")
def get_email_status(
    *, idempotency_key: str | None = None, external_effect_id: str | None = None
) -> ef.Lookup:
    found = world().mail.status(idempotency_key=idempotency_key)
    if found is None:
        return ef.Lookup.not_committed()
    return ef.Lookup.confirmed(
        external_effect_id=found["provider_message_id"],
        state=found["status"],
        evidence={"status": found["status"]},
    )


@ef.tool(
    "it_send_email",
    version=4,
    effect="external_write",
    reversible=False,
    idempotency=ef.Idempotency(supported=True, retention="PT1H"),
    confirm=get_email_status,
    effect_id="provider_message_id",
    completion=ef.Completion(states=["accepted", "sent", "delivered"], required="accepted"),
    retry=FAST,
    external_system="mail",
)
def send_email(to: str, subject: str, body: str, *, idempotency_key: str) -> dict[str, Any]:
    return speak(lambda: world().mail.send(to, subject, body, idempotency_key=idempotency_key))


@ef.tool(
    "it_send_email_no_lookup",
    effect="external_write",
    idempotency=ef.Idempotency(supported=True, retention="PT1H"),
    effect_id="provider_message_id",
    retry=FAST,
)
def send_email_no_lookup(to: str, body: str, *, idempotency_key: str) -> dict[str, Any]:
    return speak(lambda: world().mail.send(to, "Notice", body, idempotency_key=idempotency_key))


@ef.tool(
    "it_create_crm_task",
    effect="idempotent_write",
    idempotency=ef.Idempotency(supported=True, retention="P365D"),
    effect_id="task_id",
    retry=FAST,
    external_system="crm",
)
def create_crm_task(case_id: str, title: str, *, idempotency_key: str) -> dict[str, Any]:
    return speak(lambda: world().crm.upsert_task(case_id, title, idempotency_key=idempotency_key))


@ef.tool("it_notify_owner", effect="external_write", effect_id="notification_id", retry=FAST)
def notify_owner(channel: str, text: str) -> dict[str, Any]:
    posted = speak(lambda: world().notify.post(channel, text))
    if world().fail_after_post:
        world().fail_after_post -= 1
        raise RuntimeError("connection reset by peer")
    return posted


@ef.tool("it_find_post", effect="read")
def find_post(*, idempotency_key: str) -> ef.Lookup:
    if world().search_lagging:
        return ef.Lookup.unknown(reason="the search index is behind")
    found = world().notify.search(client_tag=idempotency_key)
    if not found:
        return ef.Lookup.not_committed()
    return ef.Lookup.confirmed(external_effect_id=found[0]["notification_id"], result=found[0])


# Not idempotent (every post is a new message), but each post is tagged with the key and can be
# searched for: the "not idempotent, has lookup" row.
@ef.tool(
    "it_post_tagged",
    effect="external_write",
    confirm=find_post,
    effect_id="notification_id",
    retry=FAST,
    # The in-process provider commits inside the call or not at all.
    settles_within=0,
)
def post_tagged(channel: str, text: str, *, idempotency_key: str) -> dict[str, Any]:
    return speak(lambda: world().notify.post(channel, text, client_tag=idempotency_key))


@ef.tool("it_slow_post", effect="external_write", timeout=0.2)
def slow_post(text: str) -> dict[str, Any]:
    time.sleep(1.0)
    return {"posted": text}


@ef.tool("it_async_draft", effect="pure")
async def async_draft(case_id: str) -> str:
    await asyncio.sleep(0)
    world().drafts += 1
    return f"Async draft about case {case_id}"


@ef.tool(
    "it_async_send",
    effect="external_write",
    idempotency=ef.Idempotency(supported=True),
    effect_id="provider_message_id",
    retry=FAST,
)
async def async_send(to: str, body: str, *, idempotency_key: str) -> dict[str, Any]:
    await asyncio.sleep(0)
    return speak(lambda: world().mail.send(to, "Async", body, idempotency_key=idempotency_key))


def plain_function(x: int) -> int:
    return x


class Opaque:
    """A value with no JSON form."""


# -- workflows --------------------------------------------------------------------------------------


@ef.workflow("it_customer_case")
def customer_case(ctx: ef.Context, case_id: str, email: str) -> dict[str, Any]:
    draft = ctx.call("draft_email", draft_email, case_id=case_id)
    sent = ctx.call(
        "send_case_email",
        send_email,
        to=email,
        subject="Your case",
        body=draft,
        operation_id=f"op_case_{case_id}_email",
    )
    task = ctx.call(
        "create_crm_followup",
        create_crm_task,
        case_id=case_id,
        title=f"Follow up on {sent['provider_message_id']}",
    )
    note = ctx.call("notify_owner", notify_owner, channel="#cases", text=f"{task['task_id']} open")
    return {
        "draft": draft,
        "message": sent["provider_message_id"],
        "task": task["task_id"],
        "note": note["notification_id"],
    }


@ef.workflow("it_send_once")
def send_once(ctx: ef.Context, to: str, op: str) -> str:
    sent = ctx.call("send", send_email, to=to, subject="Refund", body="Done", operation_id=op)
    return str(sent["provider_message_id"])


@ef.workflow("it_send_twice")
def send_twice(ctx: ef.Context, op: str) -> dict[str, Any]:
    first = ctx.call(
        "first", send_email, to="a@example.com", subject="s", body="1", operation_id=op
    )
    try:
        ctx.call("second", send_email, to="b@example.com", subject="s", body="2", operation_id=op)
    except ef.IdempotencyConflict as exc:
        return {"first": first["provider_message_id"], "refused": exc.code, "step": exc.step_id}
    return {"first": first["provider_message_id"], "refused": None}


@ef.workflow("it_send_paused", steps=[ef.StepContract("send", when_unknown=ef.WhenUnknown.PAUSE)])
def send_paused(ctx: ef.Context, to: str) -> str:
    sent = ctx.call("send", send_email, to=to, subject="Hello", body="Hi")
    return str(sent["provider_message_id"])


@ef.workflow("it_send_no_lookup")
def send_no_lookup(ctx: ef.Context, to: str) -> str:
    sent = ctx.call("send", send_email_no_lookup, to=to, body="Your refund is on its way")
    return str(sent["provider_message_id"])


@ef.workflow("it_post_then_notify")
def post_then_notify(ctx: ef.Context, text: str) -> dict[str, Any]:
    posted = ctx.call("post", post_tagged, channel="#ops", text=text)
    note = ctx.call("notify", notify_owner, channel="#ops", text=f"posted {text}")
    return {"post": posted["notification_id"], "note": note["notification_id"]}


@ef.workflow("it_slow")
def slow(ctx: ef.Context) -> Any:
    return ctx.call("post", slow_post, text="hello")


@ef.workflow("it_calls_plain")
def calls_plain(ctx: ef.Context) -> Any:
    return ctx.call("plain", plain_function, x=1)


@ef.workflow("it_bad_args")
def bad_args(ctx: ef.Context) -> Any:
    return ctx.call("notify", notify_owner, channel="#c", text=[1, 2, {"x": Opaque()}])


@ef.workflow("it_async_case")
async def async_case(ctx: ef.AsyncContext, case_id: str, email: str) -> str:
    draft = await ctx.call("draft", async_draft, case_id=case_id)
    sent = await ctx.call("send", async_send, to=email, body=draft)
    return str(sent["provider_message_id"])


# -- fixtures and helpers ---------------------------------------------------------------------------


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    return tmp_path / "ledger.db"


@pytest.fixture
def url(ledger: Path) -> str:
    return f"sqlite:///{ledger}"


@pytest.fixture
def w(tmp_path: Path) -> Iterator[World]:
    with world.entered(World(tmp_path)) as made:
        yield made


@pytest.fixture
def rt(url: str, w: World) -> Iterator[ef.Runtime]:
    with ef.Runtime(url) as runtime:
        yield runtime


LEDGER_TABLES = ("runs", "steps", "effects", "attempts", "operations", "decisions", "audit")


def ledger_rows(ledger: Path) -> dict[str, int]:
    """Row counts of every ledger table, read behind the runtime's back."""
    conn = sqlite3.connect(ledger)
    try:
        return {
            table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            for table in LEDGER_TABLES
        }
    finally:
        conn.close()


def step_of(rt: ef.Runtime, run_id: str, step_id: str) -> ef.StepRecord:
    return next(s for s in rt.steps(run_id) if s.step_id == step_id)


def start_case(rt: ef.Runtime, run_id: str = "case-92") -> ef.RunRecord:
    return rt.start(customer_case, run_id=run_id, case_id="92", email="alice@example.com")


# -- the write path ---------------------------------------------------------------------------------


def test_happy_path_records_every_fact(rt: ef.Runtime, w: World) -> None:
    """A successful run leaves confirmed steps, effects with digests, attempts and a sound audit."""
    run = start_case(rt)

    assert run.status is ef.RunStatus.SUCCEEDED
    assert run.output == {
        "draft": "Draft #1 about case 92",
        "message": "msg_1",
        "task": "task_1",
        "note": "ntf_1",
    }
    steps = rt.steps(run.run_id)
    assert [(s.step_id, s.status) for s in steps] == [
        ("draft_email", ef.StepStatus.CONFIRMED),
        ("send_case_email", ef.StepStatus.CONFIRMED),
        ("create_crm_followup", ef.StepStatus.CONFIRMED),
        ("notify_owner", ef.StepStatus.CONFIRMED),
    ]
    assert [s.next_step for s in steps] == [
        "send_case_email",
        "create_crm_followup",
        "notify_owner",
        None,
    ]
    send = steps[1]
    assert send.logical_operation_id == "op_case_92_email"
    assert send.external_effect_id == "msg_1"
    assert send.completion_state == "accepted"
    assert send.request_digest.startswith("sha256:")
    assert "alice" not in (send.idempotency_key or "")
    assert [c["key"] for c in w.mail.calls("send")] == [send.idempotency_key]

    effects = rt.effects(run_id=run.run_id)
    assert [(e.step_id, e.status, e.external_effect_id) for e in effects] == [
        ("send_case_email", ef.StepStatus.CONFIRMED, "msg_1"),
        ("create_crm_followup", ef.StepStatus.CONFIRMED, "task_1"),
        ("notify_owner", ef.StepStatus.CONFIRMED, "ntf_1"),
    ]
    for effect in effects:
        assert effect.request_digest.startswith("sha256:")
        assert (effect.response_digest or "").startswith("sha256:")
        assert effect.committed_at is not None
    attempts = rt.attempts(run.run_id)
    assert [(a.step_id, a.kind, a.outcome) for a in attempts] == [
        (s, "call", "committed") for s in ("send_case_email", "create_crm_followup", "notify_owner")
    ]
    kinds = [e.kind for e in rt.audit(run.run_id)]
    assert kinds[0] == "run_started"
    assert kinds[-1] == "run_succeeded"
    assert kinds.count("intent") == 3
    assert kinds.count("outcome") == 3
    assert rt.verify_audit(run.run_id) == []
    assert len(w.mail.messages()) == len(w.crm.tasks()) == len(w.notify.notifications()) == 1


def test_resume_skips_confirmed_steps_and_returns_their_recorded_output(url: str, w: World) -> None:
    """After a crash, resume calls no confirmed step again and hands the workflow their records."""
    crash = FaultPlan([Fault(FaultPoint.AFTER_RECORD, "create_crm_followup", 1, FaultAction.RAISE)])
    with ef.Runtime(url, faults=crash) as rt:
        with pytest.raises(InjectedCrash):
            start_case(rt)
        assert [s.step_id for s in rt.steps("case-92")] == [
            "draft_email",
            "send_case_email",
            "create_crm_followup",
        ]
        run = rt.resume("case-92")

    assert run.status is ef.RunStatus.SUCCEEDED
    assert run.output == {
        "draft": "Draft #1 about case 92",
        "message": "msg_1",
        "task": "task_1",
        "note": "ntf_1",
    }
    assert len(w.mail.calls("send")) == 1
    assert len(w.crm.calls("upsert_task")) == 1
    assert len(w.notify.calls("post")) == 1
    assert w.drafts == 1


def test_a_fault_plan_assigned_to_a_runtime_applies_to_the_runs_it_starts_next(
    url: str, w: World
) -> None:
    """``rt.faults = plan`` after the runtime is made is the plan its next run hits (it once was
    kept on the runtime only, and the runs went on without it: a crash test that crashed nothing).
    Assigning None restores the no-op plan."""
    with ef.Runtime(url) as rt:
        rt.faults = FaultPlan(
            [Fault(FaultPoint.AFTER_INTENT, "send_case_email", 1, FaultAction.RAISE)]
        )
        with pytest.raises(InjectedCrash):
            start_case(rt)
        assert w.mail.messages() == []
        assert step_of(rt, "case-92", "send_case_email").status is ef.StepStatus.INTENT_RECORDED
        rt.faults = None
        run = rt.resume("case-92")

    assert run.status is ef.RunStatus.SUCCEEDED
    assert len(w.mail.messages()) == 1


def test_pure_results_are_replayed_not_recomputed(url: str, w: World) -> None:
    """A pure step's recorded result is replayed on resume, so later requests keep their digests."""
    crash = FaultPlan([Fault(FaultPoint.AFTER_INTENT, "send_case_email", 1, FaultAction.RAISE)])
    with ef.Runtime(url, faults=crash) as rt:
        with pytest.raises(InjectedCrash):
            start_case(rt)
        assert w.drafts == 1
        draft = step_of(rt, "case-92", "draft_email")
        assert draft.output == "Draft #1 about case 92"
        run = rt.resume("case-92")

    # Recomputing would have produced "Draft #2", another body, and a refused send.
    assert w.drafts == 1
    assert run.status is ef.RunStatus.SUCCEEDED
    assert run.output["draft"] == "Draft #1 about case 92"
    assert [m["body"] for m in w.mail.messages()] == ["Draft #1 about case 92"]


# -- identity: operations and runs ------------------------------------------------------------------


def test_same_operation_with_another_payload_raises_and_writes_nothing(
    rt: ef.Runtime, w: World, ledger: Path
) -> None:
    """Reusing an operation with another payload raises IdempotencyConflict and writes nothing."""
    run = rt.start(send_twice, run_id="twice", op="op_refund_7")

    assert run.status is ef.RunStatus.SUCCEEDED
    assert run.output == {"first": "msg_1", "refused": "idempotency_conflict", "step": "second"}
    assert [s.step_id for s in rt.steps("twice")] == ["first"]
    assert [e.step_id for e in rt.effects(run_id="twice")] == ["first"]
    assert [a.step_id for a in rt.attempts("twice")] == ["first"]
    rows = ledger_rows(ledger)
    assert (rows["steps"], rows["effects"], rows["attempts"], rows["operations"]) == (1, 1, 1, 1)
    binding = rt.store.get_operation("default", "op_refund_7")
    assert binding is not None
    assert binding.step_id == "first"
    assert [m["to"] for m in w.mail.messages()] == ["a@example.com"]


def test_operation_reused_by_another_run_with_another_payload_is_refused(
    rt: ef.Runtime, w: World, ledger: Path
) -> None:
    """A second run claiming a bound operation with another payload fails before anything is sent."""
    first = rt.start(send_once, run_id="r1", to="a@example.com", op="op_refund_7")
    assert first.status is ef.RunStatus.SUCCEEDED
    binding = rt.store.get_operation("default", "op_refund_7")
    before = ledger_rows(ledger)

    second = rt.start(send_once, run_id="r2", to="b@example.com", op="op_refund_7")

    assert second.status is ef.RunStatus.FAILED
    assert second.error is not None
    assert (second.error["code"], second.error["type"]) == (
        "idempotency_conflict",
        "IdempotencyConflict",
    )
    after = ledger_rows(ledger)
    for table in ("steps", "effects", "attempts", "operations"):
        assert after[table] == before[table], table
    assert rt.store.get_operation("default", "op_refund_7") == binding
    assert [m["to"] for m in w.mail.messages()] == ["a@example.com"]


def test_start_with_an_existing_run_id(rt: ef.Runtime, w: World, ledger: Path) -> None:
    """The same run id and input returns the run; another input is refused and changes nothing."""
    first = rt.start(send_once, run_id="r1", to="a@example.com", op="op_1")
    before = ledger_rows(ledger)

    again = rt.start(send_once, run_id="r1", to="a@example.com", op="op_1")
    assert again == first
    with pytest.raises(ef.IdempotencyConflict, match="started with another input") as caught:
        rt.start(send_once, run_id="r1", to="b@example.com", op="op_1")
    assert caught.value.run_id == "r1"

    assert ledger_rows(ledger) == before
    assert len(w.mail.calls("send")) == 1


# -- bad input --------------------------------------------------------------------------------------


def test_plain_function_is_not_a_tool(rt: ef.Runtime) -> None:
    """Calling a function without a contract fails with ContractError and records no step."""
    run = rt.start(calls_plain, run_id="plain")

    assert run.status is ef.RunStatus.FAILED
    assert run.error is not None
    assert (run.error["type"], run.error["code"]) == ("ContractError", "contract_error")
    assert "decorate it with @ef.tool" in run.error["message"]
    assert rt.steps("plain") == []


def test_unserializable_arguments_name_the_path_and_write_nothing(
    rt: ef.Runtime, w: World, ledger: Path
) -> None:
    """Arguments or input with no JSON form give ArgumentError naming the path; nothing is written."""
    run = rt.start(bad_args, run_id="bad")

    assert run.status is ef.RunStatus.FAILED
    assert run.error is not None
    assert run.error["type"] == "ArgumentError"
    assert run.error["message"].startswith("notify.args.text[2].x: a Opaque cannot be recorded")
    assert rt.steps("bad") == []
    assert w.notify.calls() == []

    before = ledger_rows(ledger)
    with pytest.raises(ef.ArgumentError, match=r"input\.when\[0\]: a Opaque"):
        rt.start(send_once, run_id="bad-input", to="a@example.com", op="x", when=[Opaque()])
    assert ledger_rows(ledger) == before


# -- definite failures ------------------------------------------------------------------------------


def test_rejected_call_fails_the_step_without_retry(rt: ef.Runtime, w: World) -> None:
    """A provider's refusal marks the step rejected and fails the run after exactly one call."""
    run = rt.start(send_once, run_id="rej", to="not-an-address", op="op_rej")

    assert run.status is ef.RunStatus.FAILED
    assert run.error is not None
    assert run.error["code"] == "step_rejected"
    step = step_of(rt, "rej", "send")
    assert step.status is ef.StepStatus.REJECTED
    assert step.next_action is ef.NextAction.NONE
    assert [a.outcome for a in rt.attempts("rej")] == ["rejected"]
    assert [c["outcome"] for c in w.mail.calls("send")] == ["invalid_address"]


def fail_on_crm_budget(rt: ef.Runtime, w: World) -> ef.RunRecord:
    """Run the customer case while the CRM refuses every call before committing."""
    w.crm.inject("upsert_task", "fail_before_commit", times=FAST.max_attempts)
    return start_case(rt)


def test_not_committed_is_retried_up_to_the_budget_then_the_run_fails(
    rt: ef.Runtime, w: World
) -> None:
    """NotCommitted is retried to the budget; the failed run lists its effects, compensates nothing."""
    run = fail_on_crm_budget(rt, w)

    assert run.status is ef.RunStatus.FAILED
    assert run.error is not None
    assert run.error["code"] == "retry_budget_exhausted"
    send = step_of(rt, run.run_id, "send_case_email")
    assert run.error["confirmed_effects"] == [send.effect_id]
    crm_step = step_of(rt, run.run_id, "create_crm_followup")
    assert crm_step.status is ef.StepStatus.FAILED
    calls = w.crm.calls("upsert_task")
    assert [c["outcome"] for c in calls] == ["not_committed"] * FAST.max_attempts
    assert {c["key"] for c in calls} == {crm_step.idempotency_key}
    assert [a.outcome for a in rt.attempts(run.run_id, "create_crm_followup")] == [
        "not_committed"
    ] * FAST.max_attempts

    assert len(w.mail.calls("send")) == 1
    assert w.notify.calls() == []
    effects = rt.effects(run_id=run.run_id)
    assert [e.step_id for e in effects] == ["send_case_email", "create_crm_followup"]
    assert all(e.compensates is None for e in effects)
    assert effects[0].status is ef.StepStatus.CONFIRMED
    assert effects[0].compensation_status == "not_required"
    assert not [e for e in rt.audit(run.run_id) if "compensat" in e.kind]


def test_redrive_after_the_provider_recovers_reuses_the_key(rt: ef.Runtime, w: World) -> None:
    """A redriven run succeeds with the original key and keeps the steps it had confirmed."""
    failed = fail_on_crm_budget(rt, w)
    assert failed.status is ef.RunStatus.FAILED
    send_before = step_of(rt, failed.run_id, "send_case_email")

    run = rt.resume(failed.run_id, by="operator")

    assert run.status is ef.RunStatus.SUCCEEDED
    assert run.generation == 1
    assert run.output is not None
    assert run.output["message"] == "msg_1"
    assert step_of(rt, run.run_id, "send_case_email") == send_before
    crm_step = step_of(rt, run.run_id, "create_crm_followup")
    assert crm_step.status is ef.StepStatus.CONFIRMED
    calls = w.crm.calls("upsert_task")
    assert [c["outcome"] for c in calls] == ["not_committed"] * FAST.max_attempts + ["ok"]
    assert {c["key"] for c in calls} == {crm_step.idempotency_key}
    assert len(w.mail.calls("send")) == 1
    assert w.drafts == 1
    assert len(w.crm.tasks()) == 1
    redriven = [e for e in rt.audit(run.run_id) if e.kind == "run_redriven"]
    assert [e.actor for e in redriven] == ["operator"]


# -- unknown outcomes -------------------------------------------------------------------------------


def pause_on_notify(rt: ef.Runtime, w: World) -> ef.RunRecord:
    """Run the customer case while the notify post raises a plain error after it was accepted."""
    w.fail_after_post = 1
    return start_case(rt)


def test_plain_exception_after_sending_asks_a_person(rt: ef.Runtime, w: World) -> None:
    """A keyless, lookup-less write that raises after sending is not retried: the run pauses."""
    run = pause_on_notify(rt, w)

    assert run.status is ef.RunStatus.PAUSED
    assert run.next_action is ef.NextAction.ASK_A_PERSON
    assert run.error is not None
    assert run.error["row"] == "in_doubt_no_lookup"
    step = step_of(rt, run.run_id, "notify_owner")
    assert step.status is ef.StepStatus.NEEDS_ATTENTION
    assert step.next_action is ef.NextAction.ASK_A_PERSON
    [effect] = rt.effects(run_id=run.run_id, status="needs_attention")
    assert effect.step_id == "notify_owner"
    assert [a.outcome for a in rt.attempts(run.run_id, "notify_owner")] == ["unknown"]
    assert len(w.notify.calls("post")) == 1
    assert len(w.notify.notifications()) == 1


def test_resolve_committed_then_resume_uses_the_resolution(rt: ef.Runtime, w: World) -> None:
    """A person's confirmation is used on resume without a new call, and the audit names them."""
    run = pause_on_notify(rt, w)
    [effect] = rt.effects(run_id=run.run_id, status="needs_attention")

    resolved = rt.resolve(
        effect.effect_id,
        committed=True,
        evidence={"external_effect_id": "ntf_1", "seen_in": "#cases"},
        by="alice",
    )
    assert resolved.status is ef.StepStatus.CONFIRMED
    assert resolved.resolved_by == "alice"
    assert resolved.external_effect_id == "ntf_1"

    done = rt.resume(run.run_id)
    assert done.status is ef.RunStatus.SUCCEEDED
    assert done.output is not None
    assert done.output["note"] == "ntf_1"
    assert len(w.notify.calls("post")) == 1
    [resolution] = [e for e in rt.audit(run.run_id) if e.kind == "resolution"]
    assert resolution.actor == "alice"
    assert resolution.effect_id == effect.effect_id
    assert resolution.detail["committed"] is True
    assert resolution.detail["evidence"] == {"external_effect_id": "ntf_1", "seen_in": "#cases"}
    assert rt.verify_audit() == []


def test_resolve_not_committed_then_resume_retries_with_the_original_key(
    rt: ef.Runtime, w: World
) -> None:
    """A person says the unknown call did not happen; resume retries it with the same key."""
    w.mail.inject("send", "timeout_before_commit")
    run = rt.start(send_paused, run_id="paused", to="a@example.com")
    assert run.status is ef.RunStatus.PAUSED
    assert run.error is not None
    assert run.error["row"] == "in_doubt_policy_pause"
    step = step_of(rt, "paused", "send")
    assert step.effect_id is not None

    rt.resolve(step.effect_id, committed=False, evidence={"checked": "mail dashboard"}, by="bob")
    done = rt.resume("paused")

    assert done.status is ef.RunStatus.SUCCEEDED
    assert done.output == "msg_1"
    calls = w.mail.calls("send")
    assert [c["outcome"] for c in calls] == ["not_committed", "ok"]
    assert [c["key"] for c in calls] == [step.idempotency_key] * 2
    assert len(w.mail.messages()) == 1


def test_resolve_with_a_stale_version_is_refused(rt: ef.Runtime, w: World, ledger: Path) -> None:
    """A decision taken on an old version of the effect changes nothing."""
    run = pause_on_notify(rt, w)
    [effect] = rt.effects(run_id=run.run_id, status="needs_attention")
    before = ledger_rows(ledger)

    with pytest.raises(ef.StaleState, match=f"at version {effect.version}"):
        rt.resolve(
            effect.effect_id,
            committed=True,
            evidence={},
            by="alice",
            expected_version=effect.version - 1,
        )
    assert ledger_rows(ledger) == before

    rt.resolve(
        effect.effect_id,
        committed=True,
        evidence={},
        by="alice",
        expected_version=effect.version,
    )
    with pytest.raises(ef.StaleState, match="nothing to resolve"):
        rt.resolve(effect.effect_id, committed=False, evidence={}, by="bob")


def test_resolve_is_pinned_by_decision_id(rt: ef.Runtime, w: World, ledger: Path) -> None:
    """The same decision id with the same parameters is a no-op; with others it is refused."""
    run = pause_on_notify(rt, w)
    [effect] = rt.effects(run_id=run.run_id, status="needs_attention")
    decide = {"evidence": {"ticket": "OPS-1"}, "by": "alice", "decision_id": "dec-1"}

    first = rt.resolve(effect.effect_id, committed=True, **decide)
    after_first = ledger_rows(ledger)
    again = rt.resolve(effect.effect_id, committed=True, **decide)

    assert again == first
    assert ledger_rows(ledger) == after_first
    with pytest.raises(ef.IdempotencyConflict, match="dec-1"):
        rt.resolve(effect.effect_id, committed=False, **decide)
    assert ledger_rows(ledger) == after_first
    assert [e.kind for e in rt.audit(run.run_id)].count("resolution") == 1


def test_reconcile_settles_a_paused_run_through_its_lookup(rt: ef.Runtime, w: World) -> None:
    """Reconcile confirms a paused unknown post through its lookup, without reposting, and goes on."""
    w.notify.inject("post", "lose_response")
    w.search_lagging = True
    run = rt.start(post_then_notify, run_id="recon", text="deploy done")

    assert run.status is ef.RunStatus.PAUSED
    assert run.error is not None
    assert run.error["row"] == "in_doubt_budget_spent"
    assert [a.kind for a in rt.attempts("recon", "post")] == ["call"] + ["lookup"] * 2

    w.search_lagging = False
    touched = rt.reconcile()

    assert [r.run_id for r in touched] == ["recon"]
    assert touched[0].status is ef.RunStatus.SUCCEEDED
    post = step_of(rt, "recon", "post")
    assert post.status is ef.StepStatus.CONFIRMED
    assert post.external_effect_id == "ntf_1"
    assert touched[0].output == {"post": "ntf_1", "note": "ntf_2"}
    assert [n["channel"] for n in w.notify.notifications()] == ["#ops", "#ops"]
    assert len(w.notify.search(client_tag=post.idempotency_key or "")) == 1
    lookups = [e for e in rt.audit("recon") if e.kind == "lookup"]
    assert [e.detail["answer"] for e in lookups] == ["unknown", "unknown", "confirmed"]
    assert [e.actor for e in rt.audit("recon") if e.kind == "run_resumed"] == ["reconciler"]


def test_timeout_is_unknown_not_failed(rt: ef.Runtime) -> None:
    """A call that outlives its timeout may still land: its outcome is unknown, never failed."""
    started = time.monotonic()
    run = rt.start(slow, run_id="slow")
    assert time.monotonic() - started < 0.9

    assert run.status is ef.RunStatus.PAUSED
    step = step_of(rt, "slow", "post")
    assert step.status is ef.StepStatus.NEEDS_ATTENTION
    [attempt] = rt.attempts("slow")
    assert attempt.outcome == "unknown"
    assert attempt.error is not None
    assert "did not answer within 0.2 s" in attempt.error["message"]


def crash_after_send(url: str, clock: FakeClock) -> None:
    """Send once, then crash before the outcome is recorded (the provider has the message)."""
    crash = FaultPlan([Fault(FaultPoint.AFTER_CALL_BEFORE_RECORD, "send", 1, FaultAction.RAISE)])
    with ef.Runtime(url, clock=clock, faults=crash) as rt, pytest.raises(InjectedCrash):
        rt.start(send_no_lookup, run_id="short", to="a@example.com")


@pytest.fixture
def w_clocked(tmp_path: Path, clock: FakeClock) -> Iterator[World]:
    with world.entered(World(tmp_path, clock=clock)) as made:
        yield made


def test_key_within_retention_is_retried_with_the_original_key(
    url: str, clock: FakeClock, w_clocked: World
) -> None:
    """Within the key's retention an unknown call is retried with its key and replayed, not resent."""
    crash_after_send(url, clock)
    clock.advance(600)  # past the 300 s lease, within the 1 h retention

    with ef.Runtime(url, clock=clock) as rt:
        [run] = rt.recover()

    assert run.status is ef.RunStatus.SUCCEEDED
    assert [c["outcome"] for c in w_clocked.mail.calls("send")] == ["ok", "replayed"]
    assert len(w_clocked.mail.messages()) == 1


def test_key_past_retention_is_not_blindly_retried(
    url: str, clock: FakeClock, w_clocked: World
) -> None:
    """Past the key's retention an unknown call is not retried (it would resend): a person decides."""
    crash_after_send(url, clock)
    clock.advance(2 * 3600)

    with ef.Runtime(url, clock=clock) as rt:
        [run] = rt.recover()
        step = step_of(rt, "short", "send")

    assert run.status is ef.RunStatus.PAUSED
    assert run.error is not None
    assert run.error["row"] == "in_doubt_no_lookup"
    assert step.status is ef.StepStatus.NEEDS_ATTENTION
    assert len(w_clocked.mail.calls("send")) == 1
    assert len(w_clocked.mail.messages()) == 1


# -- tenants ----------------------------------------------------------------------------------------


def test_tenants_are_isolated_and_part_of_the_key(url: str, w: World) -> None:
    """Another tenant cannot see or act on a run, and one operation in two tenants is two keys."""
    with ef.Runtime(url, tenant="acme") as acme, ef.Runtime(url, tenant="globex") as globex:
        run_a = acme.start(send_once, run_id="a-1", to="a@example.com", op="op_shared")
        run_b = globex.start(send_once, run_id="b-1", to="a@example.com", op="op_shared")
        assert run_a.status is run_b.status is ef.RunStatus.SUCCEEDED

        for read in (globex.run, globex.resume, globex.steps, globex.audit):
            with pytest.raises(ef.RunNotFound):
                read("a-1")
        with pytest.raises(ef.RunNotFound):
            globex.effects(run_id="a-1")
        [effect_a] = acme.effects(run_id="a-1")
        with pytest.raises(ef.EffectNotFound):
            globex.resolve(effect_a.effect_id, committed=True, evidence={}, by="mallory")
        assert [r.run_id for r in globex.runs()] == ["b-1"]

        key_a = step_of(acme, "a-1", "send").idempotency_key
        key_b = step_of(globex, "b-1", "send").idempotency_key
    assert key_a != key_b
    assert [c["key"] for c in w.mail.calls("send")] == [key_a, key_b]


# -- async ------------------------------------------------------------------------------------------


def test_async_workflow_with_async_tools(rt: ef.Runtime, w: World) -> None:
    """An async workflow of async tools runs through start_async and through start."""
    run = asyncio.run(rt.start_async(async_case, run_id="async-1", case_id="1", email="a@x.io"))
    assert run.status is ef.RunStatus.SUCCEEDED
    assert run.output == "msg_1"

    run = rt.start(async_case, run_id="async-2", case_id="2", email="b@x.io")
    assert run.status is ef.RunStatus.SUCCEEDED
    assert run.output == "msg_2"

    assert w.drafts == 2
    assert [m["body"] for m in w.mail.messages()] == [
        "Async draft about case 1",
        "Async draft about case 2",
    ]
    for run_id in ("async-1", "async-2"):
        assert [s.status for s in rt.steps(run_id)] == [ef.StepStatus.CONFIRMED] * 2
    assert rt.verify_audit() == []


@ef.workflow(
    "it_send_policy_pause",
    steps=[ef.StepContract("send", when_not_committed=ef.WhenNotCommitted.PAUSE)],
)
def send_policy_pause(ctx: ef.Context, to: str) -> str:
    sent = ctx.call("send", send_email, to=to, subject="Hello", body="Hi")
    return str(sent["provider_message_id"])


@ef.workflow(
    "it_send_policy_fail",
    steps=[ef.StepContract("send", when_not_committed=ef.WhenNotCommitted.FAIL)],
)
def send_policy_fail(ctx: ef.Context, to: str) -> str:
    sent = ctx.call("send", send_email, to=to, subject="Hello", body="Hi")
    return str(sent["provider_message_id"])


def test_step_policy_pause_on_not_committed_asks_a_person(rt: ef.Runtime, w: World) -> None:
    """Row "not committed; when_not_committed=pause": no retry, the run waits for a person."""
    w.mail.inject("send", "fail_before_commit")
    run = rt.start(send_policy_pause, run_id="p1", to="a@example.com")
    assert run.status is ef.RunStatus.PAUSED
    assert run.error is not None
    assert run.error["row"] == "not_committed_policy_pause"
    assert [c["outcome"] for c in w.mail.calls()] == ["not_committed"]
    assert w.mail.messages() == []


def test_step_policy_fail_on_not_committed_fails_the_run(rt: ef.Runtime, w: World) -> None:
    """Row "not committed; when_not_committed=fail": the step fails at once, no retry."""
    w.mail.inject("send", "fail_before_commit")
    run = rt.start(send_policy_fail, run_id="f1", to="a@example.com")
    assert run.status is ef.RunStatus.FAILED
    assert step_of(rt, "f1", "send").status is ef.StepStatus.FAILED
    assert [c["outcome"] for c in w.mail.calls()] == ["not_committed"]
    assert w.mail.messages() == []
