"""DBOS: effectflow's write path inside a ``@DBOS.workflow`` (``pip install 'effectflow[dbos]'``).

One import, one line::

    from effectflow.contrib.dbos import guarded

    send = guarded(rt, send_email)          # an ef.tool, unchanged

    @DBOS.workflow()
    def answer_case(case_id: str) -> None:
        send(to="ann@example.com", body="...")   # a DBOS step through rt.guard
                                                 # (async workflows: await send.run_async(...))

Scope = the workflow id, call id = the step's function id (DBOS's step counter, stable across
DBOS's recovery) or a name you give. "Needs a person" waits inside the workflow on DBOS's own
messages (``DBOS.recv``); ``decide`` sends the person's decision (``DBOS.send``) and ``asked``
reads what the workflow waits for (``DBOS.get_event``). What DBOS's ``@DBOS.step`` guarantees and
what the guard adds: docs/integrations/dbos.md.
"""

from effectflow.contrib.dbos.steps import (
    ASKED_EVENT,
    DECISION_TOPIC,
    GuardedStep,
    NoDecision,
    apply_decision,
    asked,
    decide,
    guarded,
    scope_of,
)

__all__ = [
    "ASKED_EVENT",
    "DECISION_TOPIC",
    "GuardedStep",
    "NoDecision",
    "apply_decision",
    "asked",
    "decide",
    "guarded",
    "scope_of",
]
