"""A real worker running an agent is SIGKILLed mid-turn; a fresh process recovers without asking the
model again for a recorded turn, and without a second refund or email
(docs/concepts.md#agents-and-models)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import effectflow as ef
from effectflow import testing

from . import agent_app

CHILD = Path(__file__).with_name("agent_child.py")
REQUEST = "Please refund order A-17, the parcel arrived broken."


def _child(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHILD), str(directory), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _asks(directory: Path) -> list[str]:
    path = directory / agent_app.ASKS_FILE
    return path.read_text().splitlines() if path.exists() else []


def test_killed_after_the_email_recovers_without_reasking_or_repeating(tmp_path: Path) -> None:
    """Killed right after the email is recorded: recovery asks the model only for turn 3; one
    refund, one email."""
    killed = _child(
        tmp_path,
        "--kill",
        f"after_record:{agent_app.EMAIL_STEP}",
        "--start",
        agent_app.RUN_ID,
        REQUEST,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert _asks(tmp_path) == ["turn 1", "turn 2"]

    recovered = _child(tmp_path, "--recover")
    assert recovered.returncode == 0, recovered.stderr
    assert json.loads(recovered.stdout) == {agent_app.RUN_ID: "succeeded"}
    # Turns 1 and 2 were recorded before the crash: only turn 3 is asked, once.
    assert _asks(tmp_path) == ["turn 1", "turn 2", "turn 3"]

    with testing.PaymentsProvider(tmp_path / agent_app.PAYMENTS_FILE) as payments:
        assert payments.count_refunds("pay_17") == 1
    with testing.MailProvider(tmp_path / agent_app.MAIL_FILE) as mail:
        assert len(mail.messages(to="ana@example.com")) == 1
    with ef.Runtime(f"sqlite:///{tmp_path / agent_app.LEDGER_FILE}") as rt:
        run = rt.runs()[0]
        assert run.output == {
            "answer": "Refunded 49.00 EUR and emailed ana@example.com.",
            "turns": 3,
            "finished": True,
        }
        ops = {e.step_id: e.logical_operation_id for e in rt.effects(run_id=agent_app.RUN_ID)}
    # The refund reuses turn 1's tool-call id ``call_1``: its operation names its own message.
    assert ops == {
        "turn_2_call_1_agent_refund_payment": f'guard:["agent:{agent_app.RUN_ID}","msg_2:call_1"]',
        agent_app.EMAIL_STEP: f'guard:["agent:{agent_app.RUN_ID}","msg_2:call_2"]',
    }


def _recorded_turns(directory: Path) -> int:
    """How many model turns the ledger holds (pure results ride with the next commit)."""
    with ef.Runtime(f"sqlite:///{directory / agent_app.LEDGER_FILE}") as rt:
        steps = rt.steps(agent_app.RUN_ID)
    return sum(1 for s in steps if s.step_id.startswith("model_turn_"))


def test_killed_after_a_model_answer_asks_only_unrecorded_turns(tmp_path: Path) -> None:
    """Killed right after turn 2's answer, before it is recorded: recovery asks again only the
    turns the ledger does not hold, and makes each write once."""
    killed = _child(
        tmp_path, "--kill", "after_pure_result:model_turn_2", "--start", agent_app.RUN_ID, REQUEST
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    asked_before = len(_asks(tmp_path))
    recorded = _recorded_turns(tmp_path)
    assert asked_before == 2
    assert recorded == 1, "turn 1's answer was committed as soon as it came (durable)"

    recovered = _child(tmp_path, "--recover")
    assert json.loads(recovered.stdout) == {agent_app.RUN_ID: "succeeded"}, recovered.stderr
    assert len(_asks(tmp_path)) == asked_before + len(agent_app.TURNS) - recorded
    assert _recorded_turns(tmp_path) == len(agent_app.TURNS)
    with testing.PaymentsProvider(tmp_path / agent_app.PAYMENTS_FILE) as payments:
        assert payments.count_refunds("pay_17") == 1
    with testing.MailProvider(tmp_path / agent_app.MAIL_FILE) as mail:
        assert len(mail.messages(to="ana@example.com")) == 1


def test_killed_after_the_refund_keeps_both_turns(tmp_path: Path) -> None:
    """Killed right after the refund is recorded (turns 1 and 2 were committed as they came):
    recovery asks only turn 3, and the email goes out once."""
    killed = _child(
        tmp_path,
        "--kill",
        "after_record:turn_2_call_1_agent_refund_payment",
        "--start",
        agent_app.RUN_ID,
        REQUEST,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert _recorded_turns(tmp_path) == 2
    recovered = _child(tmp_path, "--recover")
    assert json.loads(recovered.stdout) == {agent_app.RUN_ID: "succeeded"}, recovered.stderr
    assert _asks(tmp_path) == ["turn 1", "turn 2", "turn 3"]
    with testing.PaymentsProvider(tmp_path / agent_app.PAYMENTS_FILE) as payments:
        assert payments.count_refunds("pay_17") == 1
    with testing.MailProvider(tmp_path / agent_app.MAIL_FILE) as mail:
        assert len(mail.messages(to="ana@example.com")) == 1
