"""``effectflow demo``: the customer case, with a real SIGKILL and a real recovery.

1. A worker process starts run ``customer-case-92``. It is SIGKILLed right after the mail provider
   accepted S2 — before the ledger learned the outcome.
2. The CRM is set to commit S3's task and then lose the response (a timeout after committing).
3. A fresh process recovers the run: S1 is replayed from the ledger; S2 is in doubt, and the provider
   honours our key, so it is retried with the *original* key and the provider replays msg_1; S3 times
   out, is retried with its key, and the CRM replays the task; S4 runs once.
4. The timeline is printed from the ledger, then the providers' own truth: one email, one task, one
   notification.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.tree import Tree

import effectflow as ef
from effectflow.demo import customer_case as app
from effectflow.testing import FaultPlan, FaultPoint

RUN_ID = "customer-case-92"
INPUT = {
    "case_id": "92",
    "email": "li.wei@example.com",
    "customer": "Li Wei",
    "owner": "maria",
}


def _ledger_url(folder: Path) -> str:
    return f"sqlite:///{folder / 'effects.db'}"


def worker(argv: list[str]) -> int:
    """The worker process: start the run (optionally crashing at a fault point), or recover."""
    parser = argparse.ArgumentParser(prog="effectflow-demo-worker")
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--kill-at", default=None, help="POINT:STEP to SIGKILL this process at")
    parser.add_argument("--recover", action="store_true")
    args = parser.parse_args(argv)
    app.use_providers(args.dir)
    faults = None
    if args.kill_at:
        point, _, step = args.kill_at.partition(":")
        faults = FaultPlan.kill_at(FaultPoint(point), step or None)
    with ef.Runtime(_ledger_url(args.dir), faults=faults) as rt:
        if args.recover:
            rt.recover()
        else:
            rt.start(app.customer_case, run_id=RUN_ID, **INPUT)
    return 0


def _spawn(folder: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.setdefault("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    return subprocess.run(
        [sys.executable, "-m", "effectflow.demo.runner", "worker", "--dir", str(folder), *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def _describe_exit(code: int) -> str:
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exited {code}"


def run(folder: Path | None = None, console: Console | None = None) -> int:
    """Run the demo; returns the exit code (0 when the providers' truth is exactly one of each)."""
    console = console or Console()
    started = time.perf_counter()
    owned = folder is None
    tmp = tempfile.TemporaryDirectory(prefix="effectflow-demo-") if owned else None
    where = Path(tmp.name) if tmp is not None else Path(folder or ".")
    try:
        return _run(where, console, started)
    finally:
        if tmp is not None:
            tmp.cleanup()


def _run(folder: Path, console: Console, started: float) -> int:
    console.rule("[bold]effectflow demo: customer case 92")
    console.print(f"ledger  {_ledger_url(folder)}\nworld   {folder}/{{mail,crm,notify}}.db\n")
    world = app.use_providers(folder)
    world.crm.inject("upsert_task", "lose_response")
    console.print(
        "[dim]fault plan:[/] the worker is SIGKILLed right after the mail provider accepts S2; "
        "the CRM commits S3's task, then the response is lost (timeout)."
    )

    first = _spawn(folder, "--kill-at", f"{FaultPoint.AFTER_CALL_BEFORE_RECORD}:send_case_email")
    console.print(f"\n[bold]worker 1[/] {_describe_exit(first.returncode)}")
    if first.returncode != -signal.SIGKILL:
        console.print(f"[red]expected the worker to be SIGKILLed[/]\n{first.stderr}")
        return 1
    with ef.Runtime(_ledger_url(folder)) as rt:
        _show_steps(console, rt, title="ledger after the crash")
    console.print(
        f"provider truth so far: {len(world.mail.messages())} email accepted, "
        "the ledger does not know its outcome.\n"
    )

    second = _spawn(folder, "--recover")
    console.print(
        f"[bold]worker 2[/] (fresh process, rt.recover()) {_describe_exit(second.returncode)}"
    )
    if second.returncode != 0:
        console.print(f"[red]recovery failed[/]\n{second.stderr}")
        return 1

    with ef.Runtime(_ledger_url(folder)) as rt:
        run_record = rt.run(RUN_ID)
        _show_steps(console, rt, title=f"run {RUN_ID}: {run_record.status}")
        _show_timeline(console, rt)
        _show_effects(console, rt)
        problems = rt.verify_audit()
    ok = _show_truth(console, world, run_record)
    console.print(
        "audit chain: "
        + ("[green]intact[/]" if not problems else f"[red]{len(problems)} problem(s)[/]")
    )
    world.close()
    elapsed = time.perf_counter() - started
    console.print(f"\n[dim]demo took {elapsed:.1f} s[/]")
    return 0 if ok and not problems and run_record.status is ef.RunStatus.SUCCEEDED else 1


def _show_steps(console: Console, rt: ef.Runtime, *, title: str) -> None:
    table = Table(title=title, title_justify="left")
    for column in ("step", "tool", "effect", "status", "attempts", "external id", "next"):
        table.add_column(column)
    for step in rt.steps(RUN_ID):
        attempts = rt.attempts(RUN_ID, step.step_id)
        outcomes = (
            ", ".join(f"{a.kind}:{a.outcome or 'in flight'}" for a in attempts) or "recorded once"
        )
        table.add_row(
            step.step_id,
            step.tool,
            step.effect_class,
            _status(step.status),
            outcomes,
            step.external_effect_id or "",
            step.next_action,
        )
    console.print(table)


def _status(status: str) -> str:
    colour = {"confirmed": "green", "needs_attention": "red", "unknown": "yellow"}.get(
        status, "yellow" if status == "intent_recorded" else "white"
    )
    return f"[{colour}]{status}[/]"


def _show_timeline(console: Console, rt: ef.Runtime) -> None:
    tree = Tree(f"[bold]audit timeline of {RUN_ID}[/]")
    first_at: float | None = None
    for event in rt.audit(RUN_ID):
        first_at = first_at if first_at is not None else event.at
        detail = _summary(event.detail)
        where = f" {event.step_id}" if event.step_id else ""
        tree.add(f"+{(event.at - first_at) * 1000:7.1f} ms  [bold]{event.kind}[/]{where}  {detail}")
    console.print(tree)


def _summary(detail: dict[str, Any]) -> str:
    keep = (
        "attempt",
        "outcome",
        "replayed",
        "external_effect_id",
        "row",
        "idempotency_key",
        "error",
    )
    parts = []
    for key in keep:
        if key not in detail:
            continue
        value = detail[key]
        if key == "idempotency_key":
            value = str(value)[:14] + "…"
        if key == "error" and isinstance(value, dict):
            value = value.get("code") or value.get("type")
        parts.append(f"{key}={value}")
    return "[dim]" + "  ".join(parts) + "[/]"


def _show_effects(console: Console, rt: ef.Runtime) -> None:
    table = Table(title="external effect records", title_justify="left")
    for column in ("effect", "step", "system", "status", "external id", "key", "request digest"):
        table.add_column(column)
    for effect in rt.effects(run_id=RUN_ID):
        table.add_row(
            effect.effect_id,
            effect.step_id,
            effect.external_system or "",
            _status(effect.status),
            effect.external_effect_id or "",
            (effect.idempotency_key or "")[:14] + "…",
            effect.request_digest[:19] + "…",
        )
    console.print(table)


def _show_truth(console: Console, world: app.Providers, run_record: ef.RunRecord) -> bool:
    messages = world.mail.messages(to=INPUT["email"])
    tasks = world.crm.tasks(case_id=INPUT["case_id"])
    notes = world.notify.notifications()
    table = Table(title="the providers' own truth", title_justify="left")
    for column in ("provider", "effects", "ids", "ledger agrees"):
        table.add_column(column)
    output = run_record.output or {}
    rows = [
        ("mail", messages, "provider_message_id"),
        ("crm", tasks, "task_id"),
        ("chat", notes, "notification_id"),
    ]
    ok = True
    for name, found, field in rows:
        ids = [item[field] for item in found]
        agrees = len(ids) == 1 and output.get(field) == ids[0]
        ok = ok and agrees
        table.add_row(
            name,
            f"[{'green' if len(ids) == 1 else 'red'}]{len(ids)}[/]",
            ", ".join(ids),
            "[green]yes[/]" if agrees else "[red]no[/]",
        )
    console.print(table)
    calls = world.mail.calls("send")
    console.print(
        f"mail API calls: {len(calls)} "
        f"({', '.join(str(c['outcome']) for c in calls)}) -> exactly one email exists"
    )
    return ok


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        sys.exit(worker(sys.argv[2:]))
    sys.exit(run())
