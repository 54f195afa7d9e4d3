"""Temporal: the guard inside an activity (``pip install 'effectflow[temporal]'``).

One import, one line::

    from effectflow.contrib.temporal import guarded

    send_email_activity = guarded(rt, send_email)     # an ef.tool, unchanged
    Worker(client, task_queue="q", workflows=[...], activities=[send_email_activity])

Scope = the workflow id and run id, call id = the activity id (shared by every attempt of one
scheduled activity): Temporal's retry of an attempt whose completion was lost reaches the same
ledger run. "Needs a person" ends the attempt with a non-retryable ``ApplicationError`` of type
``NEEDS_PERSON``; the workflow waits for a signal and runs ``decision_activity``. What is tested
here and what is not (no Temporal server runs in these tests): docs/integrations/temporal.md.
"""

from effectflow.contrib.temporal.activities import (
    DECIDE,
    FAILURE_PREFIX,
    NEEDS_PERSON,
    apply_decision,
    asked_of,
    decision_activity,
    guarded,
    heartbeat_details,
    scope_of,
)

__all__ = [
    "DECIDE",
    "FAILURE_PREFIX",
    "NEEDS_PERSON",
    "apply_decision",
    "asked_of",
    "decision_activity",
    "guarded",
    "heartbeat_details",
    "scope_of",
]
