"""The application the crash tests kill: tools over the simulated providers, and two workflows.

The child process (``child.py``) imports this module, so a fresh process after a SIGKILL finds the
same tools and workflows by the names the ledger recorded. The tools translate provider errors into
the signals a tool gives the runtime (docs/concepts.md#what-a-tool-tells-the-runtime:
``ProviderUnavailable`` proves nothing was sent: ``NotCommitted``; a rejection is ``Rejected``; a
timeout stays ambiguous), exactly as a real integration must.

Every tool invocation is appended to a journal file before it returns, so a test can count how often
a pure or read step really ran, across processes, even when the process died right after.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import effectflow as ef
from effectflow.testing.providers import (
    CrmProvider,
    MailProvider,
    NotifyProvider,
    ProviderRejected,
    ProviderTimeout,
    ProviderUnavailable,
)

#: The files one test's world lives in, relative to its directory.
LEDGER_FILE = "ledger.db"
MAIL_FILE = "mail.db"
CRM_FILE = "crm.db"
NOTIFY_FILE = "notify.db"
JOURNAL_FILE = "journal.log"

#: Workflow names.
WINDOW_WORKFLOW = "crash_window"
CASE_WORKFLOW = "crash_case"

#: Step ids of ``crash_window``.
PREPARE, UNDER_TEST, FINISH = "prepare", "under_test", "finish"
#: Step ids of ``crash_case``.
DRAFT, SEND_EMAIL, CRM_TASK, NOTIFY = "draft", "send_email", "crm_task", "notify_owner"
CASE_STEPS = (DRAFT, SEND_EMAIL, CRM_TASK, NOTIFY)

_world: Path | None = None


def configure(directory: str | os.PathLike[str]) -> None:
    """Point the tools at one test's provider files and journal."""
    global _world
    _world = Path(directory)


def _path(name: str) -> Path:
    if _world is None:
        raise RuntimeError("app.configure(directory) was not called")
    return _world / name


def journal(entry: str) -> None:
    """Append one line to the journal; a single O_APPEND write survives a SIGKILL right after."""
    fd = os.open(_path(JOURNAL_FILE), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (entry + "\n").encode())
    finally:
        os.close(fd)


def read_journal(directory: str | os.PathLike[str]) -> list[str]:
    """Every journal line of a test's world, in order."""
    path = Path(directory) / JOURNAL_FILE
    return path.read_text().splitlines() if path.exists() else []


P = TypeVar("P", MailProvider, CrmProvider, NotifyProvider)


@contextmanager
def _provider(cls: type[P], name: str) -> Iterator[P]:
    provider = cls(_path(name))
    try:
        yield provider
    finally:
        provider.close()


def _signals(call: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Map provider errors to what they prove (docs/concepts.md#what-a-tool-tells-the-runtime)."""
    try:
        return call()
    except ProviderUnavailable as exc:
        raise ef.NotCommitted(str(exc)) from exc
    except ProviderRejected as exc:
        raise ef.Rejected(str(exc)) from exc
    except ProviderTimeout as exc:
        raise ef.OutcomeUnknown(str(exc)) from exc


# -- pure and read --------------------------------------------------------------------------------


@ef.tool("crash_draft", effect="pure")
def draft(case_id: str) -> str:
    """A stand-in for a model call: deterministic text for the case."""
    journal(f"draft {case_id}")
    return f"Dear customer, about case {case_id}: it is being handled."


@ef.tool("crash_summarize", effect="pure")
def summarize(case_id: str, text: str) -> dict[str, Any]:
    """A second pure step, so the crash tests see what happens after the step under test."""
    journal(f"summarize {case_id}")
    return {"case_id": case_id, "length": len(text)}


@ef.tool("crash_compose", effect="pure")
def compose(case_id: str, text: str) -> dict[str, Any]:
    """The pure step under test."""
    journal(f"compose {case_id}")
    return {"case_id": case_id, "words": len(text.split())}


@ef.tool("crash_read_tasks", effect="read")
def read_tasks(case_id: str) -> dict[str, Any]:
    """Observe the CRM: how many tasks the case has."""
    journal(f"read_tasks {case_id}")
    with _provider(CrmProvider, CRM_FILE) as crm:
        return {"case_id": case_id, "tasks": len(crm.tasks(case_id=case_id))}


# -- lookups --------------------------------------------------------------------------------------


@ef.tool("crash_mail_status", effect="read")
def mail_status(
    *, idempotency_key: str | None = None, external_effect_id: str | None = None
) -> ef.Lookup:
    """Confirm a send by its key (or by the provider's message id)."""
    journal("mail_status")
    with _provider(MailProvider, MAIL_FILE) as mail:
        if idempotency_key is not None:
            found = mail.status(idempotency_key=idempotency_key)
        elif external_effect_id is not None:
            found = mail.status(message_id=external_effect_id)
        else:
            return ef.Lookup.unknown(reason="neither a key nor a message id to look up")
    if found is None:
        return ef.Lookup.not_committed(evidence={"searched_key": idempotency_key})
    msg_id = found["provider_message_id"]
    return ef.Lookup.confirmed(
        external_effect_id=msg_id,
        state=found["status"],
        evidence={"provider_message_id": msg_id, "status": found["status"]},
        result={"provider_message_id": msg_id, "status": "accepted", "replayed": True},
    )


@ef.tool("crash_notify_search", effect="read")
def notify_search(*, idempotency_key: str) -> ef.Lookup:
    """Confirm a post by the client tag it carries (our idempotency key)."""
    journal("notify_search")
    with _provider(NotifyProvider, NOTIFY_FILE) as notify:
        found = notify.search(client_tag=idempotency_key)
    if not found:
        return ef.Lookup.not_committed(evidence={"client_tag": idempotency_key, "found": 0})
    first = found[0]
    return ef.Lookup.confirmed(
        external_effect_id=first["notification_id"],
        evidence={"notification_id": first["notification_id"], "found": len(found)},
        result=first,
    )


# -- writes ---------------------------------------------------------------------------------------


@ef.tool(
    "crash_send_email",
    effect="external_write",
    idempotency=ef.Idempotency(supported=True, retention="PT24H"),
    confirm=mail_status,
    effect_id="provider_message_id",
    completion=ef.Completion(states=["accepted", "sent", "delivered"], required="accepted"),
    external_system="mail",
)
def send_email(to: str, subject: str, body: str, *, idempotency_key: str) -> dict[str, Any]:
    """Mail send: the provider deduplicates by key and can be asked by key."""
    journal(f"send_email {to}")
    with _provider(MailProvider, MAIL_FILE) as mail:
        return _signals(lambda: mail.send(to, subject, body, idempotency_key=idempotency_key))


@ef.tool(
    "crash_crm_upsert",
    effect="idempotent_write",
    idempotency=ef.Idempotency(supported=True, retention="P365D"),
    effect_id="task_id",
    external_system="crm",
)
def crm_upsert(case_id: str, title: str, *, idempotency_key: str) -> dict[str, Any]:
    """CRM upsert by external id (our key): repeats return the same task; no lookup declared."""
    journal(f"crm_upsert {case_id}")
    with _provider(CrmProvider, CRM_FILE) as crm:
        return _signals(lambda: crm.upsert_task(case_id, title, idempotency_key=idempotency_key))


@ef.tool(
    "crash_notify_tagged",
    effect="external_write",
    confirm=notify_search,
    effect_id="notification_id",
    external_system="notify",
    # The in-process provider commits inside the call or never (a SIGKILL takes the call with
    # it): a second after the call started, a search that finds nothing is proof.
    settles_within=1,
)
def notify_tagged(channel: str, text: str, *, idempotency_key: str) -> dict[str, Any]:
    """Not idempotent, but tags each post with our key so a lookup can find it."""
    journal(f"notify_tagged {channel}")
    with _provider(NotifyProvider, NOTIFY_FILE) as notify:
        return _signals(lambda: notify.post(channel, text, client_tag=idempotency_key))


@ef.tool(
    "crash_notify_untagged",
    effect="external_write",
    effect_id="notification_id",
    external_system="notify",
)
def notify_untagged(channel: str, text: str) -> dict[str, Any]:
    """Not idempotent and not searchable: after a crash in flight only a person can tell."""
    journal(f"notify_untagged {channel}")
    with _provider(NotifyProvider, NOTIFY_FILE) as notify:
        return _signals(lambda: notify.post(channel, text))


# -- workflows ------------------------------------------------------------------------------------


class Kind(enum.StrEnum):
    """The tool kinds the window tests put under test."""

    PURE = "pure"
    READ = "read"
    IDEMPOTENT = "idempotent"
    LOOKUP = "lookup"
    NO_LOOKUP = "no_lookup"


def channel_of(case_id: str) -> str:
    """The notify channel of one case (so a test can count a run's notifications)."""
    return f"owner-{case_id}"


def address_of(case_id: str) -> str:
    """The mail address of one case (so a test can count a run's messages)."""
    return f"{case_id}@example.com"


def _under_test(ctx: ef.Context, kind: Kind, case_id: str, text: str) -> Any:
    if kind is Kind.PURE:
        return ctx.call(UNDER_TEST, compose, case_id=case_id, text=text)
    if kind is Kind.READ:
        return ctx.call(UNDER_TEST, read_tasks, case_id=case_id)
    if kind is Kind.IDEMPOTENT:
        return ctx.call(
            UNDER_TEST, send_email, to=address_of(case_id), subject="Your case", body=text
        )
    if kind is Kind.LOOKUP:
        return ctx.call(UNDER_TEST, notify_tagged, channel=channel_of(case_id), text=text)
    return ctx.call(UNDER_TEST, notify_untagged, channel=channel_of(case_id), text=text)


@ef.workflow(WINDOW_WORKFLOW)
def crash_window(ctx: ef.Context, case_id: str, kind: str) -> dict[str, Any]:
    """A pure step, the step under test, a final pure step."""
    text = ctx.call(PREPARE, draft, case_id=case_id)
    result = _under_test(ctx, Kind(kind), case_id, text)
    done = ctx.call(FINISH, summarize, case_id=case_id, text=f"{text}|{sorted(result)}")
    return {"result": result, "done": done}


@ef.workflow(CASE_WORKFLOW)
def crash_case(ctx: ef.Context, case_id: str) -> dict[str, Any]:
    """The customer case (docs/concepts.md#the-customer-case): draft, send the email, CRM
    follow-up, notify the owner."""
    body = ctx.call(DRAFT, draft, case_id=case_id)
    sent = ctx.call(SEND_EMAIL, send_email, to=address_of(case_id), subject="Your case", body=body)
    task = ctx.call(
        CRM_TASK, crm_upsert, case_id=case_id, title=f"Follow up {sent['provider_message_id']}"
    )
    posted = ctx.call(
        NOTIFY,
        notify_tagged,
        channel=channel_of(case_id),
        text=f"Case {case_id}: {task['task_id']}",
    )
    return {"message": sent["provider_message_id"], "task": task["task_id"], "notice": posted}
