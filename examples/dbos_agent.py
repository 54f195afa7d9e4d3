"""An agent turn inside a DBOS workflow whose side-effecting tools go through effectflow.

What it shows, against a provider that is a local file (its lines are the proof):

(a) a scripted model (a DBOS step, checkpointed like any model call) asks for an email, which is
    sent once through ``effectflow.contrib.dbos.guarded``;
(b) DBOS running the workflow again without the step's checkpoint — what its recovery does when
    the process died inside the step, before DBOS recorded the step's output — does not send it
    twice: the same workflow id and step id reach the same ledger run;
(c) a refund waits for a person inside the workflow (``DBOS.recv``): the question is the workflow
    event ``effectflow.asked``, the decision goes in with ``DBOS.send`` (``decide``), and the
    refund is made once.

Runs offline on DBOS's SQLite system database and a SQLite ledger, in a temporary folder::

    pip install 'effectflow[dbos]'
    python examples/dbos_agent.py

The guide is docs/integrations/dbos.md; tests/contrib/test_dbos_example.py runs this. The real
SIGKILL and DBOS's own recovery in a fresh process: tests/contrib/test_dbos_crash.py.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from dbos import DBOS, SetWorkflowID

import effectflow as ef
from effectflow.contrib.dbos import asked, decide, guarded


class Provider:
    """The outside world: every effect it commits is one JSON line in its file."""

    path = Path("provider.jsonl")  # main() points it into a temporary folder

    def records(self, kind: str | None = None) -> list[dict[str, Any]]:
        lines = self.path.read_text().splitlines() if self.path.exists() else []
        return [r for r in map(json.loads, lines) if kind in (None, r["kind"])]

    def commit(self, kind: str, key: str, **fields: Any) -> dict[str, Any]:
        record = {"id": f"{kind}_{len(self.records()) + 1}", "kind": kind, "key": key, **fields}
        with self.path.open("a") as fh:
            fh.write(json.dumps(record) + "\n")
        return {k: v for k, v in record.items() if k != "key"}


PROVIDER = Provider()


@ef.tool("find_email", effect="read")
def find_email(*, idempotency_key: str) -> ef.Lookup:
    """The lookup: after a crash or a lost answer, effectflow asks the provider."""
    for record in PROVIDER.records("email"):
        if record["key"] == idempotency_key:
            result = {k: v for k, v in record.items() if k != "key"}
            return ef.Lookup.confirmed(external_effect_id=record["id"], result=result)
    return ef.Lookup.not_committed()


# Not idempotent, but each email carries its key, so the lookup can find it.
@ef.tool("send_email", effect="external_write", confirm=find_email, effect_id="id",
         settles_within=0)  # fmt: skip
def send_email(to: str, subject: str, *, idempotency_key: str) -> dict[str, Any]:
    """Send an email to a customer."""
    return PROVIDER.commit("email", idempotency_key, to=to, subject=subject)


# A financial write waits for a person's approval by default; the provider deduplicates by key.
@ef.tool("refund", effect="financial_write", idempotency=ef.Idempotency(supported=True),
         effect_id="id")  # fmt: skip
def refund(order: str, amount_cents: int, *, idempotency_key: str) -> dict[str, Any]:
    """Refund an order."""
    for record in PROVIDER.records("refund"):
        if record["key"] == idempotency_key:
            return {k: v for k, v in record.items() if k != "key"}
    return PROVIDER.commit("refund", idempotency_key, order=order, amount_cents=amount_cents)


TOOLS: dict[str, Any] = {}  # main() fills it: the guarded calls, one line each


@DBOS.step()
def model(request: str) -> dict[str, Any]:
    """A scripted model (no network): the tool call it makes for the request."""
    script = {
        "Tell Ada her parcel shipped.": ("send_email", {"to": "ada@example.com",
                                                        "subject": "Your parcel shipped"}),
        "Refund order 17.": ("refund", {"order": "o-17", "amount_cents": 4200}),
    }  # fmt: skip
    name, arguments = script[request]
    return {"tool": name, "arguments": arguments}


@DBOS.workflow(name="agent_turn")
def agent_turn(request: str) -> Any:
    """One turn: the model's tool call, made through the guard."""
    call = model(request)
    return TOOLS[call["tool"]](**call["arguments"])


def launch(folder: Path, name: str) -> None:
    """DBOS on a SQLite system database in ``folder``."""
    url = f"sqlite:///{folder / name}"
    config: Any = {"name": "effectflow-dbos-example", "system_database_url": url,
                   "log_level": "WARNING"}  # fmt: skip
    DBOS(config=config)
    DBOS.launch()


def main() -> None:
    """The three scenes, each checked against the provider's records."""
    with tempfile.TemporaryDirectory() as tmp, ef.Runtime(f"sqlite:///{tmp}/ledger.db") as rt:
        folder = Path(tmp)
        PROVIDER.path = folder / "provider.jsonl"
        TOOLS.update(send_email=guarded(rt, send_email), refund=guarded(rt, refund))
        launch(folder, "dbos.sqlite")

        print("(a) the model asks for an email")
        with SetWorkflowID("case-ada"):
            print(f"  the workflow got: {agent_turn('Tell Ada her parcel shipped.')}")

        print("(b) DBOS runs the workflow again without the step's checkpoint")
        DBOS.destroy()
        launch(folder, "dbos-after-the-crash.sqlite")  # DBOS knows nothing of the first run
        with SetWorkflowID("case-ada"):
            print(f"  the workflow got: {agent_turn('Tell Ada her parcel shipped.')}")
        emails = PROVIDER.records("email")
        print(f"  the provider's outbox: {len(emails)} email ({emails[0]['id']})")
        assert len(emails) == 1

        print("(c) a refund waits for a person")
        handle = DBOS.start_workflow(agent_turn, "Refund order 17.")
        question = asked(handle.workflow_id, timeout_seconds=30)
        assert question is not None
        for field in ("kind", "next_action", "for_model", "resume_with"):
            print(f"  {field}: {json.dumps(question[field])}")
        assert PROVIDER.records("refund") == [], "nothing is refunded before the approval"
        print("  decide(workflow_id, {'approved': True, 'approver': 'alice@support'})")
        decide(handle.workflow_id, {"approved": True, "approver": "alice@support"})
        print(f"  the workflow got: {handle.get_result()}")
        refunds = PROVIDER.records("refund")
        print(f"  the provider's refunds: {len(refunds)} ({refunds[0]['id']})")
        assert len(refunds) == 1

        print("the ledger: one guarded call per (workflow, step)")
        for run in sorted(rt.runs(), key=lambda r: r.created_at):
            print(f"  {run.input['scope']} {run.input['call_id']}: {run.status}")
        DBOS.destroy()
    print("ok: 1 email and 1 refund, whatever DBOS ran again")


if __name__ == "__main__":
    main()
