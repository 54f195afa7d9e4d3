"""``effectflow demo --scenario refund``: a refund that needs approval, then is taken back.

The application (tools and the ``refund_case`` workflow) is written the way a user writes one;
``run`` is the scenario script. The story, in the order the ledger records it:

1. The run starts; ``create_refund`` is a financial write, so the run pauses for an approval.
2. While it waits, the customer writes in: the parcel arrived after all, they withdraw the
   complaint (``complaint.json`` in the demo folder flips to ``withdrawn``).
3. ``ops-lead`` approves the refund (``APR-1``). The payments provider refunds, and the response
   is lost on the way back; the provider honours our key, so the runtime retries with the
   *original* key and the provider replays the first answer: one refund, not two.
4. The customer is emailed about the refund; then the workflow checks the complaint, finds it
   withdrawn and abandons the goal (``ef.AbandonGoal``).
5. The email cannot be unsent: it stays a confirmed effect (``kept``). The refund has a
   compensation, ``cancel_refund``, which moves money and so waits for its own approval;
   ``finance`` gives it (``APR-2``), the refund is cancelled, and the run ends
   ``cancelled_with_effects``: the goal is given up, and one effect (the email) remains.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

import effectflow as ef
from effectflow import testing
from effectflow.demo import _show

RUN_ID = "refund-case-117"
INPUT = {
    "case_id": "117",
    "payment_id": "pay_117",
    "amount": 4900,
    "email": "ana.silva@example.com",
    "customer": "Ana Silva",
}
#: Who approves what in the scenario (approver, approval id).
REFUND_APPROVAL = ("ops-lead", "APR-1")
CANCEL_APPROVAL = ("finance", "APR-2")


@dataclasses.dataclass
class World:
    """The outside world of the refund demo: two providers and the customer's complaint."""

    payments: testing.PaymentsProvider
    mail: testing.MailProvider
    #: The complaint as the support desk sees it; the customer may withdraw it at any time.
    complaint: Path

    def withdraw_complaint(self) -> None:
        """The customer writes in: they no longer want the refund."""
        self.complaint.write_text(json.dumps({"case_id": INPUT["case_id"], "status": "withdrawn"}))

    def close(self) -> None:
        """Close the provider files."""
        self.payments.close()
        self.mail.close()


_world: World | None = None


def use_world(folder: str | Path) -> World:
    """Point the tools at a world whose files live in ``folder`` (the complaint starts open)."""
    global _world
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    complaint = folder / "complaint.json"
    complaint.write_text(json.dumps({"case_id": INPUT["case_id"], "status": "open"}))
    _world = World(
        payments=testing.PaymentsProvider(folder / "payments.db"),
        mail=testing.MailProvider(folder / "mail.db"),
        complaint=complaint,
    )
    return _world


def world() -> World:
    """The world in use."""
    if _world is None:
        raise RuntimeError("call use_world(folder) before running the refund case")
    return _world


def _speak(exc: testing.ProviderError) -> Exception:
    """The provider's definite answers, in the runtime's words: nothing happened, or no."""
    if isinstance(exc, testing.ProviderUnavailable):
        return ef.NotCommitted(str(exc), evidence={"code": exc.code, "status": exc.status})
    if isinstance(exc, testing.IdempotencyKeyReused):
        return ef.IdempotencyConflict(str(exc))
    return ef.Rejected(str(exc), evidence={"code": exc.code, "status": exc.status})


# -- the refund, its lookup and its compensation ----------------------------------------------------


@ef.tool("get_refund_by_idempotency_key", effect="read")
def get_refund_by_idempotency_key(
    *, idempotency_key: str | None = None, external_effect_id: str | None = None
) -> ef.Lookup:
    """Ask the payments provider whether our refund exists (by our key, else by its id).

    The provider remembers keys for 24 hours, as the contract's retention says; within it a
    missing key means the refund was never created.
    """
    payments = world().payments
    found = (
        payments.get_refund_by_idempotency_key(idempotency_key)
        if idempotency_key
        else payments.get_refund(external_effect_id)
        if external_effect_id
        else None
    )
    if found is None:
        return ef.Lookup.not_committed(evidence={"searched_key": idempotency_key})
    result = {k: found[k] for k in ("refund_id", "payment_id", "amount", "status", "created_at")}
    return ef.Lookup.confirmed(
        external_effect_id=found["refund_id"],
        evidence={"status": found["status"], "created_at": found["created_at"]},
        result=result,
    )


@ef.tool(
    "cancel_refund",
    effect="financial_write",
    idempotency=ef.Idempotency(supported=True, retention="PT24H", tagged_as="Idempotency-Key"),
    effect_id="refund_id",
    external_system="payments",
)
def cancel_refund(refund_id: str, *, idempotency_key: str) -> dict[str, Any]:
    """Cancel a refund (possible for 10 minutes after it was created).

    A rejection (window expired, already cancelled) is a definite no; a timeout is left to the
    runtime as an unknown outcome, which it settles with the original key.
    """
    try:
        return world().payments.cancel_refund(refund_id, idempotency_key=idempotency_key)
    except testing.ProviderError as exc:
        raise _speak(exc) from exc


@ef.tool(
    "create_refund",
    version="3.1",
    effect="financial_write",
    idempotency=ef.Idempotency(supported=True, retention="PT24H", tagged_as="Idempotency-Key"),
    confirm=get_refund_by_idempotency_key,
    effect_id="refund_id",
    compensation=ef.Compensation(tool=cancel_refund, deadline="PT10M", automatic=False),
    external_system="payments",
    target="payment_id",
)
def create_refund(payment_id: str, amount: int, *, idempotency_key: str = "") -> dict[str, Any]:
    """Refund ``amount`` (minor units) of a payment; the provider replays a repeated key."""
    try:
        return world().payments.create_refund(payment_id, amount, idempotency_key=idempotency_key)
    except testing.ProviderError as exc:
        raise _speak(exc) from exc


# -- the email: sent once, never unsent --------------------------------------------------------------


@ef.tool("get_refund_email_status", effect="read")
def get_refund_email_status(*, idempotency_key: str | None = None) -> ef.Lookup:
    """Ask the mail provider whether the message sent under our key exists."""
    found = world().mail.status(idempotency_key=idempotency_key) if idempotency_key else None
    if found is None:
        return ef.Lookup.not_committed()
    return ef.Lookup.confirmed(
        external_effect_id=found["provider_message_id"],
        state=found["status"],
        result={k: found[k] for k in ("provider_message_id", "status", "accepted_at")},
    )


@ef.tool(
    "email_refund_notice",
    effect="external_write",
    reversible=False,
    idempotency=ef.Idempotency(supported=True, retention="PT24H", tagged_as="Idempotency-Key"),
    confirm=get_refund_email_status,
    effect_id="provider_message_id",
    external_system="mail-provider",
    target="to",
)
def email_refund_notice(
    to: str, subject: str, body: str, *, idempotency_key: str = ""
) -> dict[str, Any]:
    """Tell the customer about the refund. There is no unsending an email: no compensation."""
    try:
        return world().mail.send(to, subject, body, idempotency_key=idempotency_key)
    except testing.ProviderError as exc:
        raise _speak(exc) from exc


# -- the business check ---------------------------------------------------------------------------


@ef.tool("get_complaint", effect="read")
def get_complaint(case_id: str) -> dict[str, Any]:
    """Read the complaint as the support desk sees it now (``open`` or ``withdrawn``)."""
    complaint = json.loads(world().complaint.read_text())
    if complaint.get("case_id") != case_id:
        raise ef.Rejected(f"no complaint for case {case_id}")
    return {"case_id": case_id, "status": complaint["status"]}


# -- the workflow -----------------------------------------------------------------------------------


@ef.workflow("refund_case")
def refund_case(
    ctx: ef.Context, case_id: str, payment_id: str, amount: int, email: str, customer: str
) -> dict[str, Any]:
    """Refund the customer, tell them, and give the goal up if they withdrew the complaint."""
    refund = ctx.call(
        "create_refund",
        create_refund,
        payment_id=payment_id,
        amount=amount,
        operation_id=f"op_case_{case_id}_refund",
    )
    sent = ctx.call(
        "email_customer",
        email_refund_notice,
        to=email,
        subject=f"Your refund for case {case_id}",
        body=(
            f"Dear {customer},\n\nwe refunded {amount / 100:.2f} EUR to your card "
            f"(refund {refund['refund_id']}).\n\nKind regards,\nSupport"
        ),
        operation_id=f"op_case_{case_id}_refund_email",
    )
    complaint = ctx.call("check_still_wanted", get_complaint, case_id=case_id)
    if complaint["status"] == "withdrawn":
        raise ef.AbandonGoal("customer withdrew the complaint")
    return {"refund_id": refund["refund_id"], "provider_message_id": sent["provider_message_id"]}


# -- the scenario -----------------------------------------------------------------------------------


def run(folder: Path | None = None, console: Console | None = None) -> int:
    """Play the scenario in ``folder`` (a temporary one by default).

    Returns 0 when the ledger and the providers tell the expected story, 1 when they do not, and
    2 when ``folder`` already holds a ledger.
    """
    return _show.play("refund", folder, console, _run)


def _run(folder: Path, console: Console, started: float) -> int:
    url = f"sqlite:///{folder / 'effects.db'}"
    console.rule("[bold]effectflow demo: refund case 117")
    console.print(f"ledger  {url}\nworld   {folder}/{{payments,mail}}.db, complaint.json\n")
    w = use_world(folder)
    w.payments.inject("create_refund", "lose_response")
    console.print(
        "[dim]fault plan:[/] the payments provider commits the first create_refund call, "
        "then its response is lost (a timeout)."
    )
    try:
        with ef.Runtime(url) as rt:
            return _play(console, rt, w, started)
    finally:
        w.close()


def _play(console: Console, rt: ef.Runtime, w: World, started: float) -> int:
    run = rt.start(refund_case, run_id=RUN_ID, **INPUT)
    console.print(
        f"\n[bold]1. start[/] run {RUN_ID} is {_show.status(run.status)}: "
        f"{escape(str((run.error or {}).get('message', '')))}"
    )
    console.print(f"   payments provider: {w.payments.count_refunds()} refund(s) so far")

    w.withdraw_complaint()
    console.print(
        "\n[bold]2. the customer writes in[/] while the refund waits: the parcel arrived, "
        "they withdraw the complaint (complaint.json -> withdrawn). Nobody tells the approver."
    )

    approver, approval_id = REFUND_APPROVAL
    run = rt.approve(RUN_ID, "create_refund", approver=approver, approval_id=approval_id)
    refund_step = _step(rt, "create_refund")
    console.print(
        f"\n[bold]3. {approver} approves {approval_id}[/]: create_refund runs; its response is "
        "lost, the runtime retries with the original key and the provider replays "
        f"{refund_step.external_effect_id} (replayed={_replayed(refund_step)}). The email goes "
        "out; the check finds the complaint withdrawn: the goal is abandoned. The email is "
        "kept; the refund's compensation, cancel_refund, moves money and waits for its own "
        f"approval. Run: {_show.status(run.status)}."
    )
    _show.steps(console, rt, RUN_ID, title="ledger while the compensation waits", columns=_STEPS)

    approver, approval_id = CANCEL_APPROVAL
    run = rt.approve(RUN_ID, "compensate:create_refund", approver=approver, approval_id=approval_id)
    console.print(
        f"\n[bold]4. {approver} approves {approval_id}[/]: cancel_refund runs once. "
        f"Run: {_show.status(run.status)} - the goal is given up, the refund is answered by "
        "its cancellation, and the email stays sent.\n"
    )
    _show.steps(console, rt, RUN_ID, title=f"run {RUN_ID}: {run.status}", columns=_STEPS)
    _show.effects(
        console,
        rt,
        RUN_ID,
        title="external effect records",
        columns=(
            "effect",
            "step",
            "status",
            "external id",
            "approval",
            "compensation",
            "compensates",
        ),
    )
    _show.timeline(console, rt, RUN_ID)
    ok = _truth(console, rt, w, run)
    ok = _show.audit_chain(console, rt) and ok
    console.print(f"\n[dim]demo took {time.perf_counter() - started:.2f} s[/]")
    return 0 if ok else 1


#: The step columns this story needs (every step is at revision 1; external ids are in the effects).
_STEPS = ("step", "tool", "status", "attempts", "approval", "compensation")


def _step(rt: ef.Runtime, step_id: str) -> ef.StepRecord:
    return next(s for s in rt.steps(RUN_ID) if s.step_id == step_id)


def _replayed(step: ef.StepRecord) -> bool:
    return isinstance(step.output, dict) and step.output.get("replayed") is True


def _truth(console: Console, rt: ef.Runtime, w: World, run: ef.RunRecord) -> bool:
    """The providers' own records, and whether the ledger agrees with them."""
    refunds = w.payments.refunds(payment_id=str(INPUT["payment_id"]))
    table = Table(title="the payments provider's own truth", title_justify="left")
    for column in ("refund", "amount", "status", "created", "canceled"):
        table.add_column(column)
    for refund in refunds:
        table.add_row(
            refund["refund_id"],
            str(refund["amount"]),
            _show.status(refund["status"]),
            refund["created_at"],
            refund.get("canceled_at", "-"),
        )
    console.print(table)
    creates = w.payments.calls("create_refund")
    cancels = w.payments.calls("cancel_refund")
    console.print(
        "create_refund calls: "
        + ", ".join(f"{c['outcome']}" + (f" ({c['fault']})" if c["fault"] else "") for c in creates)
    )
    console.print("cancel_refund calls: " + ", ".join(str(c["outcome"]) for c in cancels))
    effects = rt.effects(run_id=RUN_ID)
    refund_effect = next((e for e in effects if e.step_id == "create_refund"), None)
    cancel_effect = next((e for e in effects if e.compensates is not None), None)
    email_effect = next((e for e in effects if e.step_id == "email_customer"), None)
    checks = [
        (
            len(refunds) == 1 and refunds[0]["status"] == "canceled",
            f"exactly one refund exists, and it is canceled ({len(refunds)} refund(s))",
        ),
        (
            [c["outcome"] for c in cancels] == ["ok"],
            f"exactly one cancel call ({len(cancels)})",
        ),
        (
            refund_effect is not None
            and refund_effect.status is ef.StepStatus.CONFIRMED
            and refund_effect.compensation_status == "compensated"
            and refund_effect.approval_id == REFUND_APPROVAL[1],
            "the ledger keeps the refund confirmed (approved under APR-1), compensation_status "
            "compensated",
        ),
        (
            refund_effect is not None
            and cancel_effect is not None
            and cancel_effect.compensates == refund_effect.effect_id
            and cancel_effect.status is ef.StepStatus.CONFIRMED
            and cancel_effect.approval_id == CANCEL_APPROVAL[1],
            "the cancellation is its own confirmed effect (approved under APR-2), "
            "compensating the refund",
        ),
        (
            email_effect is not None
            and email_effect.compensation_status == "kept"
            and len(w.mail.messages()) == 1,
            "exactly one email was sent, and the ledger keeps it as an effect",
        ),
        (
            run.status is ef.RunStatus.CANCELLED_WITH_EFFECTS,
            f"the run ends {run.status}: the goal is given up, the email remains",
        ),
    ]
    return _show.checks(console, checks)
