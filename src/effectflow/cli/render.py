"""Rich renderings of the runtime's records for the operator CLI.

Pure functions from records to rich renderables: the commands in ``cli/ops.py`` decide what to show,
these decide how it looks. Nothing here reads the ledger.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from effectflow import digests

if TYPE_CHECKING:
    from effectflow.ledger import records
    from effectflow.runtime import views

#: Colours by status value, shared by runs, steps and effects so one glance reads them alike.
_STYLES = {
    "succeeded": "green",
    "confirmed": "green",
    "compensated": "cyan",
    "committed": "green",
    "running": "blue",
    "intent_recorded": "blue",
    "awaiting_completion": "blue",
    "cancelling": "blue",
    "pending": "yellow",
    "awaiting_approval": "yellow",
    "paused": "yellow",
    "unknown": "bold yellow",
    "needs_attention": "bold red",
    "cancelled_pending_reconciliation": "bold yellow",
    "compensation_pending": "yellow",
    "compensating": "yellow",
    "compensation_failed": "bold red",
    "failed": "red",
    "rejected": "red",
    "conflict": "magenta",
    "not_committed": "dim",
    "cancelled": "dim",
    "cancelled_with_effects": "cyan",
    "skipped": "dim",
}


def status(value: object) -> Text:
    """A status (an enum or its value) in its colour."""
    text = str(value) if value is not None else "-"
    return Text(text, style=_STYLES.get(text, ""))


def when(epoch: float | None) -> str:
    """Epoch seconds as local wall-clock time, to the second."""
    if epoch is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def short(value: object, width: int = 48) -> str:
    """A value on one line: digests cut to 12 hex digits, long text cut with an ellipsis."""
    if value is None:
        return "-"
    if isinstance(value, str):
        text = value
        if text.startswith("sha256:") and len(text) > 19:
            return text[:19] + "…"
    else:
        text = json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))
    return text if len(text) <= width else text[: width - 1] + "…"


def details(detail: dict[str, Any], width: int = 96) -> str:
    """An audit event's details as ``key=value`` pairs on one line."""
    line = "  ".join(f"{k}={short(v, 40)}" for k, v in detail.items() if v is not None)
    return line if len(line) <= width else line[: width - 1] + "…"


#: How much of a step's recorded arguments a line shows (``--json`` shows them all).
ARGUMENTS_WIDTH = 400


def arguments(value: dict[str, Any]) -> str:
    """A step's recorded arguments (already redacted and capped) as canonical JSON on one line,
    cut past ``ARGUMENTS_WIDTH`` characters with the full size said."""
    text = digests.canonical_json(value)
    if len(text) <= ARGUMENTS_WIDTH:
        return text
    return f"{text[: ARGUMENTS_WIDTH - 1]}… ({len(text)} characters; --json shows them all)"


def error(err: dict[str, Any] | None) -> str:
    """An error document as ``code: message``."""
    if not err:
        return ""
    code = err.get("code", "error")
    message = err.get("message")
    return f"{code}: {message}" if message else str(code)


def run_status(view: views.RunView) -> Text:
    """A run's status in its colour, marked ``interrupted`` when nobody executes it."""
    text = status(view.run.status)
    if view.interrupted:
        text.append(" (interrupted)", style="bold red")
    return text


def runs_table(runs: Sequence[views.RunView]) -> Table:
    """``effectflow runs``: one row per run, newest first; an interrupted run says why, and that
    ``effectflow recover`` continues it."""
    table = Table(title=f"{len(runs)} run(s)", title_justify="left")
    # The host's ids of guarded calls (a thread, a tool-call id), when the listing has any.
    hosted = any(v.run.scope is not None for v in runs)
    columns = ["run", "workflow", *(["scope", "call"] if hosted else []), "status", "next", "gen"]
    for column in (*columns, "updated", "error"):
        table.add_column(column, overflow="fold")
    for view in runs:
        run = view.run
        host = [run.scope or "", run.call_id or ""] if hosted else []
        table.add_row(
            run.run_id,
            f"{run.workflow}@{run.workflow_version}",
            *host,
            run_status(view),
            view.next_action,
            str(run.generation),
            when(run.updated_at),
            view.interruption or error(run.error),
        )
    interrupted = sum(1 for v in runs if v.interrupted)
    if interrupted:
        table.caption = (
            f"{interrupted} interrupted run(s): their owner died or their lease expired; "
            "effectflow recover --app <module> continues them now"
        )
        table.caption_justify = "left"
    return table


def _attempt(attempt: records.AttemptRecord) -> Text:
    line = Text(f"attempt {attempt.number} {attempt.kind} (gen {attempt.generation}) → ")
    line.append_text(status(attempt.outcome) if attempt.outcome else Text("in flight", "blue"))
    if attempt.error:
        line.append(f"  {error(attempt.error)}", style="dim")
    if attempt.response_digest:
        line.append(f"  resp {short(attempt.response_digest)}", style="dim")
    return line


def _effect(label: str, effect: records.EffectRecord) -> Text:
    line = Text(f"{label} {effect.effect_id} ")
    line.append_text(status(effect.status))
    parts = [
        f"v{effect.version}",
        f"ext {effect.external_system or '-'}:{effect.external_effect_id or '-'}",
        f"req {short(effect.request_digest)}",
        f"resp {short(effect.response_digest)}",
    ]
    if effect.approval_id:
        parts.append(f"approval {effect.approval_id}")
    parts.append(f"compensation {effect.compensation_status}")
    if effect.resolved_by:
        parts.append(f"resolved by {effect.resolved_by}")
    line.append("  " + "  ".join(parts), style="dim")
    return line


def _step(view: views.StepView) -> Tree:
    step = view.step
    head = Text(f"{step.seq}. {step.step_id} ", style="bold")
    head.append_text(status(step.status))
    if step.completion_state:
        head.append(f" ({step.completion_state})")
    head.append(f"  {step.tool} [{step.effect_class}]  next {step.next_action}", style="dim")
    if step.error:
        head.append(f"  {error(step.error)}", style="red")
    node = Tree(head)
    if step.arguments is not None:
        node.add(Text(f"arguments {arguments(step.arguments)}", style="cyan"))
    for attempt in view.attempts:
        node.add(_attempt(attempt))
    if view.effect is not None:
        node.add(_effect("effect", view.effect))
    if view.compensation is not None:
        node.add(_effect("answered by compensation", view.compensation))
    return node


def timeline(tl: views.Timeline, view: views.RunView) -> Group:
    """``effectflow show RUN``: the run (``view``: whether it is interrupted), a tree of its steps,
    then its audit events in order."""
    run = tl.run
    head = Text(f"run {run.run_id} ", style="bold")
    head.append_text(run_status(view))
    head.append(
        f"  {run.workflow}@{run.workflow_version}  generation {run.generation}"
        f"  next {view.next_action}  tenant {run.tenant}",
        style="dim",
    )
    if run.scope is not None:
        head.append(f"\nguarded call {run.call_id!r} in scope {run.scope!r}", style="cyan")
    if view.interruption:
        head.append(f"\n{view.interruption}", style="bold red")
    if run.error:
        head.append(f"\n{error(run.error)}", style="red")
    if run.control:
        control = {**run.control, "at": when(run.control.get("at"))}
        head.append(f"\ncontrol: {details(control)}", style="yellow")
    tree = Tree(head)
    for step_view in tl.steps:
        tree.add(_step(step_view))
    if not tl.steps:
        tree.add(Text("no steps yet", style="dim"))
    events = Table(title="audit events", title_justify="left")
    for column in ("seq", "at", "kind", "actor", "step", "details"):
        events.add_column(column, overflow="fold")
    for event in tl.events:
        events.add_row(
            str(event.seq),
            when(event.at),
            event.kind,
            event.actor,
            event.step_id or "",
            details(event.detail),
        )
    return Group(tree, Text(""), events)


def effects_table(effects: Sequence[records.EffectRecord]) -> Table:
    """``effectflow effects``: one row per External Effect Record."""
    table = Table(title=f"{len(effects)} effect(s)", title_justify="left")
    for column in ("effect", "run", "step", "tool", "status", "v", "external id", "compensation"):
        table.add_column(column, overflow="fold")
    for effect in effects:
        table.add_row(
            effect.effect_id,
            effect.run_id,
            effect.step_id,
            effect.tool,
            status(effect.status),
            str(effect.version),
            effect.external_effect_id or "-",
            effect.compensation_status,
        )
    return table


def attention_table(items: Sequence[views.AttentionItem]) -> Table:
    """``effectflow attention``: what waits for a person, oldest first."""
    table = Table(title=f"{len(items)} item(s) need a person", title_justify="left")
    for column in ("kind", "run", "step", "effect", "v", "since", "reason", "arguments", "actions"):
        table.add_column(column, overflow="fold")
    for item in items:
        table.add_row(
            Text(item.kind, style="yellow" if item.kind == "approval" else "bold red"),
            item.run_id,
            item.step_id,
            item.effect_id or "-",
            "-" if item.version is None else str(item.version),
            when(item.since),
            item.reason,
            "-" if item.arguments is None else arguments(item.arguments),
            ", ".join(item.actions),
        )
    return table


def inventory(inv: records.Inventory) -> Table:
    """``effectflow cancel``: what the run left in the world, by effect id."""
    table = Table(title=f"run {inv.run_id}: {inv.status}", title_justify="left", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("ids", overflow="fold")
    rows: list[tuple[str, list[str]]] = [
        ("confirmed (stay happened)", inv.confirmed),
        ("in flight", inv.in_flight),
        ("unknown (queued for reconciliation)", inv.unknown),
        ("compensated", inv.compensated),
        ("compensation pending", inv.compensation_pending),
        ("stopped by cancel", inv.stopped),
        ("steps never started", inv.cancelled_steps),
    ]
    for label, ids in rows:
        table.add_row(label, ", ".join(ids) if ids else "-")
    return table


def run_line(run: records.RunRecord, view: views.RunView | None = None) -> Text:
    """One run on one line: what an action left it in (interrupted, when ``view`` says so)."""
    line = Text(f"run {run.run_id}: ")
    line.append_text(status(run.status) if view is None else run_status(view))
    line.append(f"  next {run.next_action if view is None else view.next_action}", style="dim")
    if run.error:
        line.append(f"  {error(run.error)}", style="red")
    if view is not None and view.interruption:
        line.append(f"  {view.interruption}", style="red")
    return line


def resolved_line(effect: records.EffectRecord) -> Text:
    """An effect a person just settled, and what to do next."""
    line = Text(f"effect {effect.effect_id} (run {effect.run_id}): ")
    line.append_text(status(effect.status))
    line.append(f"  version {effect.version}; next: effectflow resume {effect.run_id}", "dim")
    return line


def bench_table(results: Sequence[dict[str, Any]]) -> Table:
    """``effectflow bench``: throughput and per-step overhead by workload and durability."""
    table = Table(
        title="effectflow on the peer-comparison workloads (SQLite, this machine, one sample)",
        title_justify="left",
        caption="overhead = time through the runtime minus the same functions called directly.\n"
        "Side by side with DBOS and LangGraph: python benchmarks/compare/run.py in the effectflow "
        'repository; published figures: BENCHMARKS.md, "Against the peers".',
        caption_justify="left",
    )
    table.add_column("workload")
    table.add_column("steps", justify="right")
    table.add_column("steps/s", justify="right")
    table.add_column("overhead µs/step", justify="right")
    table.add_column("ledger")
    table.add_column("durability")
    for row in results:
        table.add_row(
            str(row["workload"]),
            str(row["steps"]),
            f"{row['steps_per_s']:,.0f}",
            f"{row['overhead_us_per_step']:,.0f}",
            f"{row['mode']} (?{row['ledger_options']})",
            str(row["durability"]),
        )
    return table
