"""``effectflow demo --scenario agent``: a model uses tools; its worker dies; nothing is asked twice.

The application is a support agent (``contrib.agents.run_agent``) with three tools: look an order
up, refund a payment, email the customer. The model is scripted (no network, no key), and counts
every time it is asked in a file, so the count spans processes. The story:

1. Worker 1 starts run ``agent-order-17``. Model turn 1 asks to look the order up; turn 2 asks to
   refund it and to email the customer. The mail provider accepts the email, and the worker is
   SIGKILLed before the ledger learns it.
2. Worker 2 (a fresh process) recovers the run. Turns 1 and 2 are replayed from the ledger: the
   model is not asked again. The refund is already recorded; the email is in doubt, retried with
   its original key, and the mail provider replays the first answer. Turn 3 is asked: the answer.
3. The truth: the model was asked three times, one refund and one email exist.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

import effectflow as ef
from effectflow import testing
from effectflow.contrib import agents
from effectflow.demo import _show
from effectflow.testing import FaultPlan, FaultPoint

RUN_ID = "agent-order-17"
REQUEST = "Order A-17 arrived broken. Please refund it and let me know."
ORDER = {"order_id": "A-17", "payment_id": "pay_17", "amount": 4900, "email": "sam@example.com"}
#: One line per time the model is asked, from every process.
ASKS_FILE = "model_asks.log"
#: The step worker 1 dies in: after the provider accepted the email, before the ledger knows.
EMAIL_STEP = "turn_2_call_2_support_email_customer"

#: What the scripted model answers, turn by turn.
TURNS: list[dict[str, Any]] = [
    {
        "id": "msg_01",
        "content": "Let me look the order up.",
        "tool_calls": [
            {
                "id": "call_1",
                "function": {"name": "support_lookup_order", "arguments": {"order_id": "A-17"}},
            }
        ],
    },
    {
        "id": "msg_02",
        "content": "Refunding the payment and telling the customer.",
        "tool_calls": [
            {
                "id": "call_1",
                "function": {
                    "name": "support_refund_payment",
                    "arguments": {"payment_id": "pay_17", "amount": 4900},
                },
            },
            {
                "id": "call_2",
                "function": {
                    "name": "support_email_customer",
                    "arguments": {
                        "to": "sam@example.com",
                        "subject": "Your refund for order A-17",
                        "body": "We refunded 49.00 EUR to your card.",
                    },
                },
            },
        ],
    },
    {"id": "msg_03", "content": "Refunded 49.00 EUR for order A-17 and emailed the customer."},
]

_folder: Path | None = None


def use_folder(folder: str | os.PathLike[str]) -> Path:
    """Point the tools and the model at the demo's files in ``folder``."""
    global _folder
    _folder = Path(folder)
    _folder.mkdir(parents=True, exist_ok=True)
    return _folder


def _file(name: str) -> Path:
    if _folder is None:
        raise RuntimeError("call use_folder(folder) before running the agent demo")
    return _folder / name


def _speak(exc: testing.ProviderError) -> Exception:
    if isinstance(exc, testing.ProviderUnavailable):
        return ef.NotCommitted(str(exc))
    return ef.Rejected(str(exc))


# -- the tools ----------------------------------------------------------------------------------------


@ef.tool("support_lookup_order", effect="read")
def lookup_order(order_id: str) -> dict[str, Any]:
    """Look an order up: its payment id, amount in cents and the customer's email."""
    if order_id != ORDER["order_id"]:
        raise ef.Rejected(f"no order {order_id}")
    return dict(ORDER)


@ef.tool("support_refund_status", effect="read")
def refund_status(*, idempotency_key: str | None = None) -> ef.Lookup:
    """Whether the refund made under our key exists."""
    with testing.PaymentsProvider(_file("payments.db")) as payments:
        found = payments.get_refund_by_idempotency_key(idempotency_key) if idempotency_key else None
    if found is None:
        return ef.Lookup.not_committed()
    return ef.Lookup.confirmed(external_effect_id=found["refund_id"], result=found)


@ef.tool(
    "support_refund_payment",
    effect="idempotent_write",
    reversible=True,
    idempotency=ef.Idempotency(supported=True, retention="PT24H"),
    confirm=refund_status,
    effect_id="refund_id",
    approval=False,
    external_system="payments",
)
def refund_payment(payment_id: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
    """Refund ``amount`` cents of a payment."""
    try:
        with testing.PaymentsProvider(_file("payments.db")) as payments:
            return payments.create_refund(payment_id, amount, idempotency_key=idempotency_key)
    except testing.ProviderError as exc:
        raise _speak(exc) from exc


@ef.tool("support_email_status", effect="read")
def email_status(*, idempotency_key: str | None = None) -> ef.Lookup:
    """Whether the message sent under our key exists."""
    with testing.MailProvider(_file("mail.db")) as mail:
        found = mail.status(idempotency_key=idempotency_key) if idempotency_key else None
    if found is None:
        return ef.Lookup.not_committed()
    return ef.Lookup.confirmed(
        external_effect_id=found["provider_message_id"], state=found["status"], result=found
    )


@ef.tool(
    "support_email_customer",
    effect="external_write",
    reversible=False,
    idempotency=ef.Idempotency(supported=True, retention="PT24H"),
    confirm=email_status,
    effect_id="provider_message_id",
    external_system="mail",
)
def email_customer(to: str, subject: str, body: str, *, idempotency_key: str) -> dict[str, Any]:
    """Email the customer. An email cannot be unsent."""
    try:
        with testing.MailProvider(_file("mail.db")) as mail:
            return mail.send(to, subject, body, idempotency_key=idempotency_key)
    except testing.ProviderError as exc:
        raise _speak(exc) from exc


TOOLS: list[ef.Tool[..., Any]] = [lookup_order, refund_payment, email_customer]


@ef.workflow("support_agent")
def support_agent(ctx: ef.Context, request: str) -> dict[str, Any]:
    """Let the (scripted) model handle a customer's request with the support tools."""
    model = agents.ScriptedModel(TURNS, count_file=_file(ASKS_FILE))
    result = agents.run_agent(ctx, model, TOOLS, [{"role": "user", "content": request}])
    return {"answer": result.output, "turns": result.turns}


# -- the worker processes -------------------------------------------------------------------------


def _ledger_url(folder: Path) -> str:
    return f"sqlite:///{folder / 'effects.db'}"


def worker(argv: list[str]) -> int:
    """The worker process: start the run (optionally dying at a fault point), or recover."""
    parser = argparse.ArgumentParser(prog="effectflow-agent-demo-worker")
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--kill-at", default=None, help="POINT:STEP to SIGKILL this process at")
    parser.add_argument("--recover", action="store_true")
    args = parser.parse_args(argv)
    use_folder(args.dir)
    faults = None
    if args.kill_at:
        point, _, step = args.kill_at.partition(":")
        faults = FaultPlan.kill_at(FaultPoint(point), step or None)
    with ef.Runtime(_ledger_url(args.dir), faults=faults) as rt:
        if args.recover:
            rt.recover()
        else:
            rt.start(support_agent, run_id=RUN_ID, request=REQUEST)
    return 0


def _spawn(folder: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.setdefault("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    return subprocess.run(
        [sys.executable, "-m", "effectflow.demo.agent", "worker", "--dir", str(folder), *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def _exit(code: int) -> str:
    return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited {code}"


def _asks(folder: Path) -> list[str]:
    path = folder / ASKS_FILE
    return path.read_text().splitlines() if path.exists() else []


# -- the scenario -----------------------------------------------------------------------------------


def run(folder: Path | None = None, console: Console | None = None) -> int:
    """Play the scenario in ``folder`` (a temporary one by default).

    Returns 0 when the ledger and the providers tell the expected story, 1 when they do not, and
    2 when ``folder`` already holds a ledger.
    """
    return _show.play(
        "agent", folder, console, lambda where, out, started: _play(use_folder(where), out, started)
    )


_STEPS = ("step", "tool", "effect", "status", "attempts")


def _play(folder: Path, console: Console, started: float) -> int:
    console.rule("[bold]effectflow demo: a support agent, killed mid-turn")
    console.print(
        f"ledger  {_ledger_url(folder)}\nworld   {folder}/{{payments,mail}}.db, {ASKS_FILE}\n"
        f"request {escape(REQUEST)!r}\n"
        "[dim]model:[/] scripted (3 turns), counting every ask in a file\n"
        "[dim]fault plan:[/] worker 1 is SIGKILLed right after the mail provider accepts the "
        "email, before the ledger records it."
    )
    first = _spawn(folder, "--kill-at", f"{FaultPoint.AFTER_CALL_BEFORE_RECORD}:{EMAIL_STEP}")
    console.print(f"\n[bold]1. worker 1[/] {_exit(first.returncode)}")
    if first.returncode != -signal.SIGKILL:
        console.print(f"[red]expected the worker to be SIGKILLed[/]\n{escape(first.stderr)}")
        return 1
    asked_before = len(_asks(folder))
    with ef.Runtime(_ledger_url(folder)) as rt:
        _show.steps(console, rt, RUN_ID, title="ledger after the crash", columns=_STEPS)
    console.print(f"the model was asked {asked_before} time(s) so far")

    second = _spawn(folder, "--recover")
    console.print(
        f"\n[bold]2. worker 2[/] (fresh process, rt.recover()) {_exit(second.returncode)}"
    )
    if second.returncode != 0:
        console.print(f"[red]recovery failed[/]\n{escape(second.stderr)}")
        return 1
    with ef.Runtime(_ledger_url(folder)) as rt:
        run = rt.run(RUN_ID)
        _show.steps(console, rt, RUN_ID, title=f"run {RUN_ID}: {run.status}", columns=_STEPS)
        operations = {e.step_id: e.logical_operation_id for e in rt.effects(run_id=RUN_ID)}
        answer = (run.output or {}).get("answer")
        console.print(f"\n[bold]3. the model's answer[/] {escape(str(answer))!r}\n")
        ok = _truth(console, folder, run, operations)
        ok = _show.audit_chain(console, rt) and ok
    console.print(f"\n[dim]demo took {time.perf_counter() - started:.2f} s[/]")
    return 0 if ok else 1


def _truth(
    console: Console, folder: Path, run: ef.RunRecord, operations: dict[str, str | None]
) -> bool:
    """The providers' and the model's own counts, against the story."""
    with testing.PaymentsProvider(folder / "payments.db") as payments:
        refunds = payments.count_refunds(str(ORDER["payment_id"]))
    with testing.MailProvider(folder / "mail.db") as mail:
        emails = len(mail.messages(to=str(ORDER["email"])))
        sends = [str(c["outcome"]) for c in mail.calls("send")]
    asks = _asks(folder)
    return _show.checks(
        console,
        [
            (
                asks == ["turn 1", "turn 2", "turn 3"],
                f"the model was asked {len(asks)} times ({', '.join(asks)}): no recorded turn "
                "was asked again",
            ),
            (refunds == 1, f"exactly one refund exists ({refunds})"),
            (
                emails == 1,
                f"exactly one email exists ({emails}; mail API calls: {', '.join(sends)})",
            ),
            (
                operations.get(EMAIL_STEP) == f'guard:["agent:{RUN_ID}","msg_02:call_2"]'
                and operations.get("turn_2_call_1_support_refund_payment")
                == f'guard:["agent:{RUN_ID}","msg_02:call_1"]',
                "each tool call's operation names the run, the model message and the tool-call "
                "id (turn 2 reuses turn 1's call_1: a new operation, not a replay)",
            ),
            (run.status is ef.RunStatus.SUCCEEDED, f"the run {run.status}"),
        ],
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        sys.exit(worker(sys.argv[2:]))
    sys.exit(run())
