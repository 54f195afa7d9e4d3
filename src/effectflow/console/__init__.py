"""The web console: what an operator on call needs, server-rendered, no front-end build step.

Pages: the runs list (status filters), a run's page (steps with their states, attempts, effects with
external ids and digests, compensations beside what they compensate, audit events) and the attention
queue with its actions (confirm with evidence, declare not committed, approve, cancel, compensate).
Pages refresh themselves while nobody is typing. Sign-in is the API's bearer token, kept in an
HttpOnly, SameSite=Strict cookie; each form also carries a token derived from it (CSRF).

The console is mounted by ``effectflow.api.create_app`` (``effectflow serve``), which puts on
``app.state`` the ``tokens`` (token -> tenant) and ``runtimes`` (``.get(tenant) -> ef.Runtime``).
"""

from effectflow.console.pages import routes

__all__ = ["routes"]
