"""Signing in and out of the console: the sign-in form carries a token of its own (login CSRF),
the API token is checked in constant time, and signing out needs the page's form token.
"""

from __future__ import annotations

import secrets

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from effectflow.api import hardening
from effectflow.console import rendering, session


def _login_nonce(request: Request) -> str | None:
    value = session.signer_of(request).loads("login", request.cookies.get(session.LOGIN_COOKIE))
    return value if isinstance(value, str) else None


def _login_page(
    request: Request, nonce: str, target: str, status: int = 200, failed: str | None = None
) -> Response:
    response = rendering.page(
        request, "login.html", status=status, next=target, login_csrf=nonce, failed=failed
    )
    signed = session.signer_of(request).dumps("login", nonce, session.LOGIN_MAX_AGE)
    session.set_cookie(
        request, response, session.LOGIN_COOKIE, signed, max_age=session.LOGIN_MAX_AGE
    )
    return response


async def login_form(request: Request) -> Response:
    """The sign-in form, with a form token (kept across tabs while its cookie is valid)."""
    nonce = _login_nonce(request) or secrets.token_urlsafe(32)
    target = session.local_path(request.query_params.get("next", "/runs"), "/runs")
    return _login_page(request, nonce, target)


async def login(request: Request) -> Response:
    """Sign in: the form token must match its signed cookie (login CSRF), then the API token must
    be known (checked in constant time)."""
    form = await request.form()
    token = str(form.get("token", "")).strip()
    target = session.local_path(str(form.get("next") or "/runs"), "/runs")
    expected = _login_nonce(request)
    given = str(form.get("login_csrf", ""))
    if session.cross_site(request) or expected is None or not session.same_text(given, expected):
        return _login_page(
            request,
            secrets.token_urlsafe(32),
            target,
            status=403,
            failed="This sign-in form has expired or was not sent from this site, so nobody was "
            "signed in. Sign in again here.",
        )
    tenant = hardening.tenant_of(request.app.state.tokens, token)
    if tenant is None:
        return _login_page(
            request, expected, target, status=401, failed="That token is not known here."
        )
    response = RedirectResponse(target, status_code=303)
    session.set_cookie(request, response, session.COOKIE, token)
    session.delete_cookie(request, response, session.LOGIN_COOKIE)
    return response


async def logout(request: Request) -> Response:
    """Sign out; the form carries the form token, so another site cannot sign an operator out."""
    signed = session.signed_tenant(request)
    form = await request.form()
    if signed is not None and (
        session.cross_site(request)
        or not session.same_text(str(form.get("csrf", "")), session.csrf_token(signed[0]))
    ):
        return rendering.page(
            request, "missing.html", status=403, what="a valid form (reload the page)"
        )
    response = RedirectResponse("/login", status_code=303)
    session.delete_cookie(request, response, session.COOKIE)
    return response
