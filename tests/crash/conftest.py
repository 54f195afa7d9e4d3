"""Helpers of the crash tests: one ``World`` per test (a ledger, provider files, a journal) whose
worker processes are real subprocesses that a fault plan SIGKILLs."""

from __future__ import annotations

import collections
import dataclasses
import json
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import effectflow as ef
from effectflow.testing.providers import CrmProvider, MailProvider, NotifyProvider

from . import app

CHILD = Path(__file__).with_name("child.py")

#: How long one worker process may take before the test fails instead of hanging.
CHILD_TIMEOUT_S = 60

#: Which provider holds the effects of each write tool.
PROVIDER_OF_TOOL = {
    "crash_send_email": "mail",
    "crash_crm_upsert": "crm",
    "crash_notify_tagged": "notify",
    "crash_notify_untagged": "notify",
}


@dataclasses.dataclass(frozen=True)
class World:
    """One test's outside world and ledger, in one directory."""

    directory: Path

    @property
    def url(self) -> str:
        """The ledger's URL."""
        return f"sqlite:///{self.directory / app.LEDGER_FILE}"

    # -- worker processes -------------------------------------------------------------------------

    def child(
        self,
        *,
        kill: str | None = None,
        recover: bool = False,
        reconcile: bool = False,
        start: tuple[tuple[str, str, Mapping[str, Any]], ...] = (),
        apps: tuple[str, ...] = (),
        approve: tuple[tuple[str, str, str], ...] = (),
    ) -> subprocess.CompletedProcess[str]:
        """Run ``child.py`` to its end (or its SIGKILL); ``start`` holds (workflow, run_id, input),
        ``apps`` more application modules to import, ``approve`` (run_id, step_id, approval_id)."""
        cmd = [sys.executable, str(CHILD), str(self.directory)]
        for module in apps:
            cmd += ["--app", module]
        if kill:
            cmd += ["--kill", kill]
        if recover:
            cmd.append("--recover")
        if reconcile:
            cmd.append("--reconcile")
        for workflow, run_id, input in start:
            cmd += ["--start", workflow, run_id, json.dumps(dict(input))]
        for run_id, step_id, approval_id in approve:
            cmd += ["--approve", run_id, step_id, approval_id]
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, check=False
        )

    # -- reading the truth ------------------------------------------------------------------------

    @contextmanager
    def ledger(self) -> Iterator[ef.Runtime]:
        """The ledger, opened by the test process itself (no faults, no tools needed)."""
        with ef.Runtime(self.url) as rt:
            yield rt

    def provider_effects(self, case_id: str) -> dict[str, list[str]]:
        """What each provider really holds for one case: its effect ids, oldest first."""
        with MailProvider(self.directory / app.MAIL_FILE) as mail:
            messages = [m["provider_message_id"] for m in mail.messages(to=app.address_of(case_id))]
        with CrmProvider(self.directory / app.CRM_FILE) as crm:
            tasks = [t["task_id"] for t in crm.tasks(case_id=case_id)]
        with NotifyProvider(self.directory / app.NOTIFY_FILE) as notify:
            posts = [
                n["notification_id"] for n in notify.notifications(channel=app.channel_of(case_id))
            ]
        return {"mail": messages, "crm": tasks, "notify": posts}

    def provider_calls(self, provider: str) -> list[dict[str, Any]]:
        """Every call one provider received, from any process."""
        cls = {"mail": MailProvider, "crm": CrmProvider, "notify": NotifyProvider}[provider]
        with cls(self.directory / f"{provider}.db") as opened:
            return opened.calls()

    def inject(self, provider: str, operation: str, fault: Any, *, times: int, after: int) -> None:
        """Persist a provider fault rule that the worker processes will meet."""
        cls = {"mail": MailProvider, "crm": CrmProvider, "notify": NotifyProvider}[provider]
        with cls(self.directory / f"{provider}.db") as opened:
            opened.inject(operation, fault, times=times, after=after)

    def journal(self) -> collections.Counter[str]:
        """How many times each tool really ran, across every process."""
        return collections.Counter(line.split()[0] for line in app.read_journal(self.directory))

    def problems(self, rt: ef.Runtime, run_id: str, case_id: str) -> list[str]:
        """Every disagreement between the providers and the ledger for one run.

        - a duplicate: a provider holds more than one effect for one step;
        - a missing effect: a provider holds an effect that no confirmed ledger effect names, while
          the step is not waiting for a person (``needs_attention``);
        - a phantom: the ledger confirms an external id that the provider does not hold.
        """
        found: list[str] = []
        truth = self.provider_effects(case_id)
        for step in rt.steps(run_id):
            provider = PROVIDER_OF_TOOL.get(step.tool.split("@", 1)[0])
            if provider is None:
                continue
            held = truth[provider]
            if len(held) > 1:
                found.append(f"{run_id}/{step.step_id}: duplicate effects at {provider}: {held}")
            confirmed = {
                e.external_effect_id
                for e in rt.effects(run_id=run_id)
                if e.step_id == step.step_id and e.status is ef.StepStatus.CONFIRMED
            }
            if step.status is not ef.StepStatus.NEEDS_ATTENTION:
                for effect_id in held:
                    if effect_id not in confirmed:
                        found.append(
                            f"{run_id}/{step.step_id}: {provider} holds {effect_id} but the step "
                            f"is {step.status} and no confirmed effect names it"
                        )
            for effect_id in confirmed:
                if effect_id not in held:
                    found.append(
                        f"{run_id}/{step.step_id}: the ledger confirms {effect_id}, which "
                        f"{provider} does not hold ({held})"
                    )
        return found


def assert_killed(proc: subprocess.CompletedProcess[str]) -> None:
    """The child died by SIGKILL: the fault point was reached (never a silent pass)."""
    assert proc.returncode == -signal.SIGKILL, (
        f"expected the child to be SIGKILLed at its fault point, got rc={proc.returncode}\n"
        f"stdout: {proc.stdout}\nstderr: {proc.stderr}"
    )


def assert_clean(proc: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """The child ran to its end; returns the run statuses it printed."""
    assert proc.returncode == 0, (
        f"rc={proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    )
    statuses: dict[str, str] = json.loads(proc.stdout)
    return statuses


@pytest.fixture
def world(tmp_path: Path) -> World:
    """A fresh world in the test's own directory."""
    return World(tmp_path)
