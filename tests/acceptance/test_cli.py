"""The operator CLI, driven as an operator drives it: `effectflow` in a subprocess, on a real ledger
file that ``cli_app.prepare`` leaves with a post in doubt and two refunds waiting for approval."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from effectflow.cli import main as cli_main

EFFECTFLOW = shutil.which("effectflow", path=str(Path(sys.executable).parent)) or "effectflow"
ROOT = Path(__file__).resolve().parents[2]
APP = ("--app", "tests.acceptance.cli_app")


@dataclasses.dataclass
class Ledger:
    """A prepared ledger and the environment the CLI runs in."""

    url: str
    env: dict[str, str]

    def cli(self, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
        """Run ``effectflow ARGS`` and check its exit code."""
        done = subprocess.run(
            [EFFECTFLOW, *args],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=self.env,
            timeout=60,
            check=False,
        )
        assert done.returncode == code, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done

    def json(self, *args: str, code: int = 0) -> Any:
        """Run ``effectflow ARGS --json`` and parse what it printed."""
        return json.loads(self.cli(*args, "--json", code=code).stdout)


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Ledger:
    url = f"sqlite:///{tmp_path / 'effects.db'}"
    monkeypatch.setenv("CLI_APP_DIR", str(tmp_path))
    monkeypatch.syspath_prepend(str(ROOT))
    from tests.acceptance import cli_app

    try:
        cli_app.prepare(url)
    finally:
        cli_app.close()
    env = {
        **os.environ,
        "CLI_APP_DIR": str(tmp_path),
        "EFFECTFLOW_DB": url,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    return Ledger(url, env)


def test_a_post_in_doubt_is_listed_resolved_and_resumed(ledger: Ledger) -> None:
    """attention exits 3 and lists the unknown post; resolve --committed then resume finishes it."""
    items = ledger.json("attention", code=3)
    [doubt] = [i for i in items if i["kind"] == "unknown_effect"]
    assert (doubt["run_id"], doubt["step_id"]) == ("announce-1", "post")
    assert "resolve" in doubt["actions"]
    text = ledger.cli("attention", code=3).stdout
    assert "unknown_effect" in text
    assert "announce-1" in text

    timeline = ledger.json("show", "announce-1")
    assert timeline["run"]["status"] == "paused"
    assert [s["step"]["step_id"] for s in timeline["steps"]] == ["draft", "post"]
    post = timeline["steps"][1]
    assert post["effect"]["effect_id"] == doubt["effect_id"]
    assert post["effect"]["status"] == "needs_attention"
    assert [a["outcome"] for a in post["attempts"]] == ["unknown"]
    assert "run_paused" in [e["kind"] for e in timeline["events"]]
    assert ledger.json("effects", "--status", "needs_attention", "--run", "announce-1") != []

    evidence = json.dumps({"external_effect_id": "ntf_1", "seen_in": "#ops"})
    resolved = ledger.json(
        "resolve", doubt["effect_id"], "--committed", "--evidence", evidence, "--by", "alice",
        "--expected-version", str(doubt["version"]), *APP,
    )  # fmt: skip
    assert resolved["status"] == "confirmed"
    assert resolved["resolved_by"] == "alice"
    done = ledger.json("resume", "announce-1", *APP)
    assert done["status"] == "succeeded"
    assert done["output"] == "ntf_1"

    assert ledger.json("effects", "--status", "unknown") == []
    assert ledger.json("effects", "--status", "needs_attention") == []
    shown = ledger.cli("show", "announce-1").stdout
    assert "resolution" in shown
    assert "alice" in shown


def test_approve_then_compensate_with_its_own_approval(ledger: Ledger) -> None:
    """approve runs the refund; compensate pauses for the refund's cancel approval (exit 3)."""
    approved = ledger.json(
        "approve", "refund-1", "create_refund", "--approver", "lead", "--approval-id", "APR-1",
        *APP,
    )  # fmt: skip
    assert approved["status"] == "succeeded"

    paused = ledger.json(
        "compensate", "refund-1", "--reason", "duplicate complaint", "--by", "agent-7", *APP,
        code=3,
    )  # fmt: skip
    assert paused["status"] == "paused"
    steps = [i["step_id"] for i in ledger.json("attention", code=3) if i["run_id"] == "refund-1"]
    assert steps == ["compensate:create_refund"]

    done = ledger.json(
        "approve", "refund-1", "compensate:create_refund", "--approver", "finance",
        "--approval-id", "APR-2", *APP,
    )  # fmt: skip
    assert done["status"] == "compensated"
    [step] = [s for s in ledger.json("show", "refund-1")["steps"] if s["compensation"]]
    assert step["effect"]["approval_id"] == "APR-1"
    assert step["compensation"]["approval_id"] == "APR-2"
    assert "answered by compensation" in ledger.cli("show", "refund-1").stdout


def test_cancel_prints_the_inventory(ledger: Ledger) -> None:
    """cancel of a run waiting for approval: nothing happened (exit 0); of a run with an effect in
    doubt: the effect is listed unknown and the run waits for reconciliation (exit 3)."""
    clean = ledger.json("cancel", "refund-2", "--reason", "customer withdrew", *APP)
    assert clean["status"] == "cancelled"
    assert clean["confirmed"] == []
    assert clean["cancelled_steps"] == ["create_refund"]

    doubt = ledger.json("cancel", "announce-1", "--by", "bob", *APP, code=3)
    assert doubt["status"] == "cancelled_pending_reconciliation"
    assert len(doubt["unknown"]) == 1
    assert "unknown" in ledger.cli("cancel", "announce-1", *APP, code=3).stdout


def test_reads_render_and_reconcile_reports_what_still_waits(ledger: Ledger) -> None:
    """runs lists every run; reconcile cannot settle a post with no lookup, so it exits 3."""
    runs = ledger.json("runs")
    assert sorted(r["run_id"] for r in runs) == ["announce-1", "refund-1", "refund-2"]
    assert [r["run_id"] for r in ledger.json("runs", "--status", "succeeded")] == []
    assert "refund-1" in ledger.cli("runs", "--status", "paused").stdout
    assert "audit events" in ledger.cli("show", "refund-2").stdout
    assert "needs_attention" in ledger.cli("effects").stdout

    report = ledger.json("reconcile", *APP, code=3)
    assert report["runs"] == []
    assert report["attention"] == 3


def test_what_does_not_exist_exits_1_and_is_named(ledger: Ledger) -> None:
    """RunNotFound, EffectNotFound and a stale approval exit 1 with a message on stderr."""
    assert "no-such-run" in ledger.cli("show", "no-such-run", code=1).stderr
    assert "no-such-run" in ledger.cli("resume", "no-such-run", *APP, code=1).stderr
    error = json.loads(ledger.cli("show", "no-such-run", "--json", code=1).stderr)
    assert error["error"]["code"] == "run_not_found"
    missing = ledger.cli(
        "resolve", "eff_missing", "--committed", "--evidence", "{}", "--by", "x", *APP, code=1
    )
    assert "eff_missing" in missing.stderr
    stale = ledger.cli(
        "approve", "announce-1", "post", "--approver", "x", "--approval-id", "A", *APP, code=1
    )
    assert "not waiting for an approval" in stale.stderr
    assert "--app" in ledger.cli("resume", "announce-1", code=1).stderr


def test_bad_resolve_arguments_are_usage_errors(ledger: Ledger) -> None:
    """Bad --evidence JSON and conflicting or missing --committed flags exit 2, changing nothing."""
    [effect] = ledger.json("effects", "--status", "needs_attention")
    for args in [
        ("--committed", "--evidence", "{not json", "--by", "x"),
        ("--committed", "--evidence", "[1, 2]", "--by", "x"),
        ("--committed", "--not-committed", "--evidence", "{}", "--by", "x"),
        ("--evidence", "{}", "--by", "x"),
    ]:
        ledger.cli("resolve", effect["effect_id"], *args, *APP, code=2)
    assert ledger.json("effects", "--status", "needs_attention") == [effect]


def test_a_missing_ledger_file_is_a_usage_error(tmp_path: Path, ledger: Ledger) -> None:
    """A --db naming no file exits 2 and creates no empty ledger there."""
    ledger.cli("runs", "--db", f"sqlite:///{tmp_path / 'nope.db'}", code=2)
    assert not (tmp_path / "nope.db").exists()


def _commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command under ``command`` with its path (typer's groups have ``commands``)."""
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def test_every_command_has_help() -> None:
    """Every command and sub-command has help text, and `--help` exits 0 for each."""
    root = typer.main.get_command(cli_main.app)
    found = dict(_commands(root))
    assert {("runs",), ("show",), ("attention",), ("resolve",), ("bench",)} <= set(found)
    assert ("contracts", "check") in found
    runner = CliRunner()
    for path, command in found.items():
        assert (command.help or "").strip(), f"{' '.join(path) or 'effectflow'} has no help"
        result = runner.invoke(cli_main.app, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        assert "Usage" in result.output
