"""The application the worker tests run: tools over the simulated providers and two workflows.

Worker processes import it with ``effectflow worker --app tests.workers.app``. Where the providers
live comes from the environment, so a subprocess finds the test's files:
``EFFECTFLOW_TEST_DIR`` (provider SQLite files, the slow-step gate) and, when set,
``EFFECTFLOW_PROVIDERS_URL`` (the providers' HTTP service: calls then cross a real network hop).
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path
from typing import Any

import effectflow as ef
from effectflow import testing
from effectflow.testing import (
    CrmProvider,
    MailProvider,
    NotifyProvider,
    ProviderError,
    ProviderUnavailable,
)

FAST = ef.RetryPolicy(max_attempts=4, max_lookups=3, initial_backoff=0.01, max_backoff=0.2)


def folder() -> Path:
    return Path(os.environ["EFFECTFLOW_TEST_DIR"])


@functools.cache
def providers() -> tuple[Any, Any, Any]:
    """Mail, CRM and notify: over HTTP when a service URL is given, else their local files."""
    url = os.environ.get("EFFECTFLOW_PROVIDERS_URL")
    if url:
        from effectflow.testing import HttpCrm, HttpMail, HttpNotify

        timeout = float(os.environ.get("EFFECTFLOW_PROVIDERS_TIMEOUT", "2"))
        return (
            HttpMail(url, timeout=timeout),
            HttpCrm(url, timeout=timeout),
            HttpNotify(url, timeout=timeout),
        )
    base = folder()
    return (
        MailProvider(base / "mail.db"),
        CrmProvider(base / "crm.db"),
        NotifyProvider(base / "notify.db"),
    )


def speak(call: Any) -> Any:
    """Call a provider (after the test's simulated network latency), translating its definite
    errors into the runtime's signals; timeouts pass through as unknown outcomes."""
    delay = float(os.environ.get("EFFECTFLOW_TEST_CALL_DELAY", "0"))
    if delay:
        time.sleep(delay)
    try:
        return call()
    except (ProviderUnavailable, testing.DeadlineExceeded) as exc:
        raise ef.NotCommitted(str(exc)) from exc
    except ProviderError as exc:
        raise ef.Rejected(str(exc)) from exc


@ef.tool("wk_draft", effect="pure")
def draft(case_id: str) -> str:
    return f"About case {case_id}"


@ef.tool("wk_mail_status", effect="read")
def mail_status(
    *, idempotency_key: str | None = None, external_effect_id: str | None = None
) -> ef.Lookup:
    found = providers()[0].status(idempotency_key=idempotency_key)
    if found is None:
        return ef.Lookup.not_committed()
    return ef.Lookup.confirmed(
        external_effect_id=found["provider_message_id"], state=found["status"]
    )


@ef.tool(
    "wk_send_email",
    effect="external_write",
    idempotency=ef.Idempotency(supported=True),
    confirm=mail_status,
    effect_id="provider_message_id",
    retry=FAST,
    external_system="mail",
)
def send_email(to: str, body: str, *, idempotency_key: str) -> dict[str, Any]:
    return dict(
        speak(lambda: providers()[0].send(to, "Case", body, idempotency_key=idempotency_key))
    )


@ef.tool(
    "wk_crm_task",
    effect="idempotent_write",
    idempotency=ef.Idempotency(supported=True, retention="P365D"),
    effect_id="task_id",
    retry=FAST,
    external_system="crm",
)
def crm_task(case_id: str, title: str, *, idempotency_key: str) -> dict[str, Any]:
    return dict(
        speak(lambda: providers()[1].upsert_task(case_id, title, idempotency_key=idempotency_key))
    )


@ef.tool("wk_find_post", effect="read")
def find_post(*, idempotency_key: str) -> ef.Lookup:
    found = providers()[2].search(client_tag=idempotency_key)
    if not found:
        return ef.Lookup.not_committed()
    return ef.Lookup.confirmed(external_effect_id=found[0]["notification_id"], result=found[0])


# Not idempotent, but searchable by tag. It takes the runtime's deadline and passes it on, so the
# provider refuses a late call: after a takeover, "not found" then proves the post did not happen.
@ef.tool(
    "wk_notify",
    effect="external_write",
    confirm=find_post,
    effect_id="notification_id",
    retry=FAST,
    external_system="notify",
    timeout=3.0,
)
def notify(channel: str, text: str, *, idempotency_key: str, deadline: float) -> dict[str, Any]:
    # The provider refuses the post after the deadline the runtime gives (within its lease).
    with testing.deadline(deadline):
        return dict(speak(lambda: providers()[2].post(channel, text, client_tag=idempotency_key)))


@ef.tool("wk_slow", effect="pure")
def slow(case_id: str) -> str:
    """Blocks while the gate file exists: the test decides when the step may end."""
    gate = folder() / "gate"
    (folder() / f"entered-{case_id}").touch()
    deadline = time.monotonic() + 30
    while gate.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return "done"


@ef.workflow("wk_case")
def case(ctx: ef.Context, case_id: str) -> dict[str, Any]:
    """Four steps, three of them effects: the chaos and worker tests' unit of work."""
    body = ctx.call("draft", draft, case_id=case_id)
    sent = ctx.call("send_email", send_email, to=f"c{case_id}@example.com", body=body)
    task = ctx.call("crm_task", crm_task, case_id=case_id, title=sent["provider_message_id"])
    note = ctx.call("notify", notify, channel="#cases", text=f"{case_id}: {task['task_id']}")
    return {
        "message": sent["provider_message_id"],
        "task": task["task_id"],
        "note": note["notification_id"],
    }


@ef.workflow("wk_slow_case")
def slow_case(ctx: ef.Context, case_id: str) -> str:
    """An effect, a slow step, then another effect: SIGTERM arrives during the slow step."""
    ctx.call("send_email", send_email, to=f"s{case_id}@example.com", body="first")
    ctx.call("wait", slow, case_id=case_id)
    ctx.call("notify", notify, channel="#slow", text=case_id)
    return "ok"


@ef.tool(
    "wk_gated_send",
    effect="external_write",
    idempotency=ef.Idempotency(supported=True),
    confirm=mail_status,
    effect_id="provider_message_id",
    retry=FAST,
    external_system="mail",
)
def gated_send(to: str, body: str, *, idempotency_key: str) -> dict[str, Any]:
    """Waits at the gate (after the intent is durable, before the provider hears of it)."""
    (folder() / f"entered-{to}").touch()
    deadline = time.monotonic() + 30
    while (folder() / "gate").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return dict(
        speak(lambda: providers()[0].send(to, "Case", body, idempotency_key=idempotency_key))
    )


@ef.workflow("wk_gated")
def gated(ctx: ef.Context, case_id: str) -> str:
    sent = ctx.call("send_email", gated_send, to=f"z{case_id}@example.com", body="once")
    ctx.call("notify", notify, channel="#zombie", text=case_id)
    return str(sent["provider_message_id"])
