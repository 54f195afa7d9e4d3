"""The web console: what an operator on call needs, server-rendered, no front-end build step.

Pages: the runs list (status filters), a run's page (steps with their states, attempts, effects with
external ids and digests, compensations beside what they compensate, audit events) and the attention
queue with its actions (confirm with evidence, declare not committed, approve, cancel, compensate).
Pages refresh themselves while nobody is typing. Sign-in is the API's bearer token, kept in an
HttpOnly, SameSite=Strict cookie (Secure on HTTPS); each form also carries a token derived from it
(CSRF), and the sign-in form one of its own (login CSRF). An action's outcome comes back in a signed
cookie, never in the URL. No inline script or style: ``static/console.css`` and ``static/console.js``
(live refresh, times in the browser's zone) are served under ``/static/`` so the CSP can forbid both.

The console is mounted by ``effectflow.api.create_app`` (``effectflow serve``), which puts on
``app.state`` the ``tokens`` (token -> tenant), ``runtimes`` (``.get(tenant) -> ef.Runtime``) and
``settings`` (``effectflow.api.hardening.Settings``: limits, cookie flags, the signing secret).
"""

from effectflow.console.pages import routes

__all__ = ["routes"]
