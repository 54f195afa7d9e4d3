"""The seed's customer case 92: S1 draft → S2 send email → S3 CRM follow-up → S4 notify owner.

This module is an *application*, written the way a user writes one: tools with side-effect
contracts over three simulated providers, and a workflow that calls them. The providers keep their
state in their own SQLite files in the demo's folder, so a worker process killed mid-call leaves
the outside world exactly as a real crash would.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import effectflow as ef
from effectflow import testing


@dataclasses.dataclass
class Providers:
    """The outside world of the demo."""

    mail: testing.MailProvider
    crm: testing.CrmProvider
    notify: testing.NotifyProvider

    def close(self) -> None:
        """Close the provider files."""
        self.mail.close()
        self.crm.close()
        self.notify.close()


_providers: Providers | None = None


def use_providers(folder: str | Path) -> Providers:
    """Point the tools at the providers whose files live in ``folder``."""
    global _providers
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    _providers = Providers(
        mail=testing.MailProvider(folder / "mail.db"),
        crm=testing.CrmProvider(folder / "crm.db"),
        notify=testing.NotifyProvider(folder / "notify.db"),
    )
    return _providers


def providers() -> Providers:
    """The providers in use."""
    if _providers is None:
        raise RuntimeError("call use_providers(folder) before running the customer case")
    return _providers


def _speak(exc: testing.ProviderError) -> Exception:
    """Translate the provider's errors into what the runtime must know: did anything happen?"""
    if isinstance(exc, testing.ProviderUnavailable | testing.DeadlineExceeded):
        return ef.NotCommitted(str(exc), evidence={"code": exc.code, "status": exc.status})
    if isinstance(exc, testing.IdempotencyKeyReused):
        return ef.IdempotencyConflict(str(exc))
    return ef.Rejected(str(exc), evidence={"code": exc.code, "status": exc.status})


# -- S1: pure ---------------------------------------------------------------------------------------


@ef.tool("draft_email", effect="pure")
def draft_email(case_id: str, customer: str) -> str:
    """Write the reply (in a real agent: a model call, recorded so recovery never re-asks it)."""
    return (
        f"Dear {customer},\n\nwe have looked into case {case_id}: the replacement ships today.\n"
        "\nKind regards,\nSupport"
    )


# -- S2: an external write the provider deduplicates by key, confirmable by lookup -------------------


@ef.tool("get_email_status", effect="read")
def get_email_status(
    *, idempotency_key: str | None = None, external_effect_id: str | None = None
) -> ef.Lookup:
    """Ask the mail provider whether a message exists (by our key, else by its message id)."""
    mail = providers().mail
    found = (
        mail.status(idempotency_key=idempotency_key)
        if idempotency_key
        else mail.status(message_id=external_effect_id)
        if external_effect_id
        else None
    )
    if found is None:
        return ef.Lookup.not_committed()
    result = {k: found[k] for k in ("provider_message_id", "status", "accepted_at")}
    return ef.Lookup.confirmed(
        external_effect_id=found["provider_message_id"],
        state=found["status"],
        evidence={"status": found["status"], "accepted_at": found["accepted_at"]},
        result=result,
    )


@ef.tool(
    "send_email",
    version=4,
    effect="external_write",
    commit="async_accepted",
    reversible=False,
    idempotency=ef.Idempotency(supported=True, retention="PT24H", tagged_as="Idempotency-Key"),
    confirm=get_email_status,
    effect_id="provider_message_id",
    completion=ef.Completion(states=["accepted", "sent", "delivered"], required="accepted"),
    external_system="mail-provider",
    target="to",
)
def send_email(to: str, subject: str, body: str, *, idempotency_key: str = "") -> dict[str, Any]:
    """Send the customer email; the provider replays the original answer for a repeated key."""
    try:
        return providers().mail.send(to, subject, body, idempotency_key=idempotency_key)
    except testing.ProviderError as exc:
        raise _speak(exc) from exc


# -- S3: an idempotent write (upsert by key) ---------------------------------------------------------


@ef.tool("get_crm_task", effect="read")
def get_crm_task(*, idempotency_key: str | None = None) -> ef.Lookup:
    """Ask the CRM whether the follow-up task exists."""
    found = providers().crm.get_task(idempotency_key=idempotency_key)
    if found is None:
        return ef.Lookup.not_committed()
    return ef.Lookup.confirmed(external_effect_id=found["task_id"], result=found)


@ef.tool(
    "create_crm_task",
    effect="idempotent_write",
    idempotency=ef.Idempotency(supported=True, retention="P30D"),
    confirm=get_crm_task,
    effect_id="task_id",
    external_system="crm",
    target="case_id",
)
def create_crm_task(
    case_id: str, message_id: str, owner: str, *, idempotency_key: str = ""
) -> dict[str, Any]:
    """Create the follow-up task, linked to the email the customer got."""
    try:
        return providers().crm.upsert_task(
            case_id, f"Follow up on {message_id}", idempotency_key=idempotency_key, owner=owner
        )
    except testing.ProviderError as exc:
        raise _speak(exc) from exc


# -- S4: an external write that is NOT idempotent, confirmable by a tag search ------------------------


@ef.tool("find_owner_notification", effect="read")
def find_owner_notification(*, idempotency_key: str | None = None) -> ef.Lookup:
    """Search the chat for a post tagged with our key."""
    if not idempotency_key:
        return ef.Lookup.unknown(reason="no key to search by")
    found = providers().notify.search(client_tag=idempotency_key)
    if not found:
        return ef.Lookup.not_committed(evidence={"searched_tag": idempotency_key})
    first = found[0]
    return ef.Lookup.confirmed(external_effect_id=first["notification_id"], result=first)


@ef.tool(
    "notify_owner",
    effect="external_write",
    reversible=False,
    confirm=find_owner_notification,
    effect_id="notification_id",
    external_system="chat",
)
def notify_owner(
    owner: str,
    case_id: str,
    task_id: str,
    *,
    idempotency_key: str = "",
    deadline: float = 0.0,
) -> dict[str, Any]:
    """Tell the case owner; the chat API does not deduplicate, so the key travels as a tag, and
    the call carries a deadline the API enforces, so a search that finds nothing after it is proof.
    """
    try:
        with testing.deadline(deadline):
            return providers().notify.post(
                f"@{owner}",
                f"Case {case_id}: customer emailed, follow-up {task_id} is yours.",
                client_tag=idempotency_key,
            )
    except testing.ProviderError as exc:
        raise _speak(exc) from exc


# -- the workflow -----------------------------------------------------------------------------------


@ef.workflow("customer_case")
def customer_case(
    ctx: ef.Context, case_id: str, email: str, customer: str, owner: str
) -> dict[str, Any]:
    """S1 → S4 of the seed's email scenario."""
    body = ctx.call("draft_email", draft_email, case_id=case_id, customer=customer)
    sent = ctx.call(
        "send_case_email",
        send_email,
        to=email,
        subject=f"Your case {case_id}",
        body=body,
        operation_id=f"op_case_{case_id}_email",
    )
    task = ctx.call(
        "create_crm_followup",
        create_crm_task,
        case_id=case_id,
        message_id=sent["provider_message_id"],
        owner=owner,
        operation_id=f"op_case_{case_id}_crm",
    )
    note = ctx.call(
        "notify_owner",
        notify_owner,
        owner=owner,
        case_id=case_id,
        task_id=task["task_id"],
        operation_id=f"op_case_{case_id}_notify",
    )
    return {
        "provider_message_id": sent["provider_message_id"],
        "task_id": task["task_id"],
        "notification_id": note["notification_id"],
    }
