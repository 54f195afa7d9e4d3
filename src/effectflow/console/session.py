"""The console's session: the sign-in cookie and the tenant it names, the form tokens (CSRF), and
the flash cookie that carries an action's outcome back to the page.

Cookies, all HttpOnly, SameSite=Strict, ``Secure`` on HTTPS (see ``hardening.secure``); what each
holds is in :mod:`effectflow.console.pages`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
from typing import Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

import effectflow as ef
from effectflow.api import hardening

COOKIE = "effectflow_token"
LOGIN_COOKIE = "effectflow_login"
FLASH_COOKIE = "effectflow_flash"
#: How long a sign-in form stays valid.
LOGIN_MAX_AGE = 3600
#: How long an action's outcome waits to be shown (it is shown once, on the page gone back to).
FLASH_MAX_AGE = 120
#: The longest flash cookie kept: browsers drop cookies past about 4 KB, so typed input longer
#: than this is not kept (the message says so).
FLASH_MAX_CHARS = 3800
#: Messages are cut to this many characters before they go into the flash.
MESSAGE_MAX_CHARS = 600


def csrf_token(token: str) -> str:
    """The form token of a signed-in browser, derived from its API token (a form on another
    site can read neither)."""
    return hmac.new(token.encode(), b"effectflow-console-form", hashlib.sha256).hexdigest()[:32]


def same_text(given: str, expected: str) -> bool:
    """Constant-time equality of two texts (``compare_digest`` refuses non-ASCII ``str``)."""
    return hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode("utf-8"))


def signed_tenant(request: Request) -> tuple[str, str] | None:
    """The sign-in cookie's token and the tenant it maps to, or None when not signed in."""
    token = request.cookies.get(COOKIE)
    if not token:
        return None
    tenant = hardening.tenant_of(request.app.state.tokens, token)
    return None if tenant is None else (token, tenant)


def tenant_runtime(request: Request, tenant: str) -> ef.Runtime:
    """The tenant's runtime, from the app the console is mounted in."""
    runtime: ef.Runtime = request.app.state.runtimes.get(tenant)
    return runtime


def settings_of(request: Request) -> hardening.Settings:
    """The app's limits, cookie flags and signing secret."""
    return hardening.settings_of(request)


def signer_of(request: Request) -> hardening.Signer:
    """What signs the console's cookies, with the app's secret."""
    return hardening.Signer(settings_of(request).secret)


def set_cookie(
    request: Request, response: Response, name: str, value: str, max_age: int | None = None
) -> None:
    """Set one of the console's cookies: HttpOnly, SameSite=Strict, Secure on HTTPS."""
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path="/",
        secure=hardening.secure(request, settings_of(request)),
        httponly=True,
        samesite="strict",
    )


def delete_cookie(request: Request, response: Response, name: str) -> None:
    """Delete a cookie set by :func:`set_cookie` (the same path and flags, or browsers keep it)."""
    response.delete_cookie(
        name,
        path="/",
        secure=hardening.secure(request, settings_of(request)),
        httponly=True,
        samesite="strict",
    )


def cross_site(request: Request) -> bool:
    """The browser says the request comes from another site (``Sec-Fetch-Site``): refused for
    every form post, whatever else it carries."""
    return request.headers.get("sec-fetch-site", "").lower() == "cross-site"


@dataclasses.dataclass(frozen=True)
class Flash:
    """An action's outcome, shown once on the page the operator goes back to."""

    #: What happened, when it worked.
    message: str | None = None
    #: Why it did not, when it failed.
    error: str | None = None
    #: Which form the kept fields belong to (see :func:`form_key`).
    form: str | None = None
    #: What the operator typed into that form.
    fields: dict[str, str] = dataclasses.field(default_factory=dict)


def form_key(verb: str, fields: dict[str, str]) -> str:
    """Names one form on a page: the action and what it acts on (a resolve form also by whether
    it confirms or declares not committed, as each effect has one of each)."""
    if verb == "resolve":
        return f"resolve:{fields.get('effect_id', '')}:{fields.get('committed', '')}"
    if verb in ("approve", "reject"):
        return f"{verb}:{fields.get('run_id', '')}:{fields.get('step_id', '')}"
    return f"{verb}:{fields.get('run_id', '')}"


def _cut(text: str | None) -> str | None:
    if text is None or len(text) <= MESSAGE_MAX_CHARS:
        return text
    return text[: MESSAGE_MAX_CHARS - 1] + "…"


def go_back(request: Request, path: str, tenant: str, flash: Flash) -> RedirectResponse:
    """Go back to ``path`` (303) carrying ``flash`` in a signed cookie bound to the tenant."""
    signer = signer_of(request)
    data: dict[str, Any] = {"t": tenant, "msg": _cut(flash.message), "err": _cut(flash.error)}
    if flash.form and any(flash.fields.values()):
        data.update(form=flash.form, fields=flash.fields)
    value = signer.dumps("flash", data, FLASH_MAX_AGE)
    if len(value) > FLASH_MAX_CHARS:
        data.pop("form", None)
        data.pop("fields", None)
        data["err"] = f"{data['err'] or ''} (What you typed was too long to keep; type it again.)"
        value = signer.dumps("flash", data, FLASH_MAX_AGE)
    response = RedirectResponse(path, status_code=303)
    set_cookie(request, response, FLASH_COOKIE, value, max_age=FLASH_MAX_AGE)
    return response


def read_flash(request: Request, tenant: str | None) -> Flash:
    """The flash cookie's outcome, if it is signed and bound to this tenant; else nothing."""
    data = signer_of(request).loads("flash", request.cookies.get(FLASH_COOKIE))
    if not isinstance(data, dict) or tenant is None or data.get("t") != tenant:
        return Flash()
    fields = data.get("fields")
    return Flash(
        message=data.get("msg") if isinstance(data.get("msg"), str) else None,
        error=data.get("err") if isinstance(data.get("err"), str) else None,
        form=data.get("form") if isinstance(data.get("form"), str) else None,
        fields={str(k): str(v) for k, v in fields.items()} if isinstance(fields, dict) else {},
    )


def signed_in(request: Request) -> tuple[str, str] | Response:
    """The signed-in token and tenant, or the redirect to the sign-in form (coming back here)."""
    signed = signed_tenant(request)
    if signed is None:
        return RedirectResponse(f"/login?next={quote(request.url.path)}", status_code=303)
    return signed


def local_path(text: str, default: str) -> str:
    """``text`` when it is a path on this site, else ``default`` (no open redirect)."""
    if not text.startswith("/") or text.startswith("//") or "\\" in text:
        return default
    return text
