"""What the scenario demos print: the ledger's steps, effects and audit timeline, read back with rich.

Everything shown here is read from the ledger after the fact (``rt.steps``, ``rt.effects``,
``rt.audit``), never from what the demo believes happened, so the tables are the evidence.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

import effectflow as ef

#: The step columns a scenario can ask for, in the order they print.
STEP_COLUMNS = (
    "step",
    "rev",
    "tool",
    "effect",
    "status",
    "attempts",
    "approval",
    "compensation",
    "external id",
)

_COLOURS = {
    "confirmed": "green",
    "succeeded": "green",
    "compensated": "green",
    "kept": "cyan",
    "canceled": "cyan",
    "conflict": "magenta",
    "pending": "yellow",
    "awaiting_approval": "yellow",
    "paused": "yellow",
    "unknown": "yellow",
    "intent_recorded": "yellow",
    "compensating": "yellow",
    "cancelled_with_effects": "cyan",
    "needs_attention": "red",
    "failed": "red",
    "compensation_failed": "red",
}


def status(value: str) -> str:
    """A status word, coloured by what it means for the reader."""
    return f"[{_COLOURS.get(value, 'white')}]{value}[/]"


def steps(
    console: Console,
    rt: ef.Runtime,
    run_id: str,
    *,
    title: str,
    columns: Sequence[str] = STEP_COLUMNS,
) -> None:
    """One row per step record, with its attempts summarised by their outcomes."""
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column, overflow="fold")
    for step in rt.steps(run_id):
        attempts = rt.attempts(run_id, step.step_id)
        cells = {
            "step": step.step_id,
            "rev": str(step.step_revision),
            "tool": step.tool,
            "effect": step.effect_class,
            "status": status(step.status),
            "attempts": ", ".join(_attempt(a) for a in attempts) or "-",
            "approval": step.approval_id or "-",
            "compensation": status(step.compensation_status),
            "external id": step.external_effect_id or "-",
        }
        table.add_row(*(cells[c] for c in columns))
    console.print(table)


def short_id(effect_id: str) -> str:
    """An effect id cut to what tells the rows of one run apart (the ledger has it whole)."""
    return effect_id[:12] + "…" if len(effect_id) > 13 else effect_id


def _attempt(attempt: ef.AttemptRecord) -> str:
    """A call shows as its outcome alone; lookups and a person's resolutions say what they were."""
    outcome = attempt.outcome or "in flight"
    return outcome if attempt.kind == "call" else f"{attempt.kind}:{outcome}"


#: The effect columns a scenario can ask for, in the order they print.
EFFECT_COLUMNS = (
    "effect",
    "step",
    "tool",
    "status",
    "external id",
    "approval",
    "compensation",
    "compensates",
    "logical operation",
)


def effects(
    console: Console,
    rt: ef.Runtime,
    run_id: str,
    *,
    title: str,
    columns: Sequence[str] = EFFECT_COLUMNS,
) -> None:
    """One row per External Effect Record of the run, compensations pointing at what they answer."""
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column, no_wrap=column in ("effect", "compensates", "status"))
    for effect in rt.effects(run_id=run_id):
        cells = {
            "effect": short_id(effect.effect_id),
            "step": effect.step_id,
            "tool": effect.tool,
            "status": status(effect.status),
            "external id": effect.external_effect_id or "-",
            "approval": effect.approval_id or "-",
            "compensation": status(effect.compensation_status),
            "compensates": short_id(effect.compensates) if effect.compensates else "-",
            "logical operation": effect.logical_operation_id or "-",
        }
        table.add_row(*(cells[c] for c in columns))
    console.print(table)


#: Audit detail fields worth a glance in the timeline (the rest stays in the ledger).
_DETAIL_KEYS = (
    "approval_id",
    "attempt",
    "outcome",
    "replayed",
    "external_effect_id",
    "answer",
    "observe",
    "observe_revision",
    "step_revision",
    "compensates",
    "compensation_step",
    "reason",
    "row",
    "error",
)


def timeline(console: Console, rt: ef.Runtime, run_id: str) -> None:
    """The run's audit events in order, with milliseconds since the first one."""
    tree = Tree(f"[bold]audit timeline of {run_id}[/]")
    first_at: float | None = None
    for event in rt.audit(run_id):
        first_at = first_at if first_at is not None else event.at
        where = f" {event.step_id}" if event.step_id else ""
        actor = f" by {event.actor}" if event.actor != "runtime" else ""
        tree.add(
            f"+{(event.at - first_at) * 1000:7.1f} ms  [bold]{event.kind}[/]{where}{actor}"
            f"  {_summary(event.detail)}"
        )
    console.print(tree)


def _summary(detail: dict[str, Any]) -> str:
    parts = []
    for key in _DETAIL_KEYS:
        value = detail.get(key)
        if value is None or value == [] or value == {}:
            continue
        if key == "error" and isinstance(value, dict):
            value = value.get("code") or value.get("type")
        if key == "compensates" and isinstance(value, str):
            value = short_id(value)
        parts.append(escape(f"{key}={value}"))
    return "[dim]" + "  ".join(parts) + "[/]"


def audit_chain(console: Console, rt: ef.Runtime) -> bool:
    """Recompute the audit hash chains; print and return whether they are intact."""
    problems = rt.verify_audit()
    console.print(
        "audit chain: "
        + ("[green]intact[/]" if not problems else f"[red]{len(problems)} problem(s)[/]")
    )
    return not problems


def checks(console: Console, claims: Sequence[tuple[bool, str]]) -> bool:
    """Print every claim about the world with a tick or a cross; True when all of them hold.

    Each claim is printed even after one fails, so a broken run shows everything that is off.
    """
    held = True
    for ok, claim in claims:
        console.print(("[green]✓[/] " if ok else "[red]✗[/] ") + claim)
        held = held and ok
    return held


def used_folder(console: Console, folder: Path) -> bool:
    """Whether ``folder`` already holds a demo's ledger; if so, say so.

    A scenario replays a fixed story with fixed run ids: on an old ledger the runs already exist
    and the story cannot happen again, so the demo asks for an empty folder instead.
    """
    ledger = folder / "effects.db"
    if ledger.exists():
        console.print(f"[red]{escape(str(ledger))} exists: give --dir an empty folder[/]")
        return True
    return False


def play(
    name: str,
    folder: Path | None,
    console: Console | None,
    scenario: Callable[[Path, Console, float], int],
) -> int:
    """Run a scenario in ``folder`` (a temporary one by default, removed afterwards).

    Returns the scenario's exit code, or 2 when ``folder`` already holds a ledger.
    """
    console = console or Console()
    started = time.perf_counter()
    tmp = tempfile.TemporaryDirectory(prefix=f"effectflow-{name}-") if folder is None else None
    where = Path(tmp.name) if tmp is not None else Path(folder or ".")
    try:
        if used_folder(console, where):
            return 2
        return scenario(where, console, started)
    finally:
        if tmp is not None:
            tmp.cleanup()
