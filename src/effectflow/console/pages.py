"""The console's routes: HTML pages and the form actions behind them.

Everything that touches the ledger (reads for a page, and above all the actions, which may run a
resumed workflow's tools for seconds) runs in Starlette's thread pool, so one slow action never
stalls the event loop and every other request (``/api/v1/health`` included) keeps answering.

Cookies, all HttpOnly, SameSite=Strict, ``Secure`` on HTTPS (see ``hardening.secure``):

* ``effectflow_token``: the sign-in (the API token).
* ``effectflow_login``: the sign-in form's token, signed with the app's secret; the form carries the
  same value in a hidden field, so a form on another site (which can read neither) cannot sign a
  browser in to the attacker's tenant.
* ``effectflow_flash``: the outcome of the last action, signed and bound to the tenant, with what
  the operator typed when it failed (so the form is filled in again). Messages never come from the
  URL: a link with ``?msg=`` shows nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import secrets
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

import effectflow as ef
from effectflow import errors
from effectflow.api import hardening
from effectflow.ledger.records import RunStatus

COOKIE = "effectflow_token"
LOGIN_COOKIE = "effectflow_login"
FLASH_COOKIE = "effectflow_flash"
#: Seconds between refreshes of a page nobody is typing on.
REFRESH_S = 5
#: How long a sign-in form stays valid.
LOGIN_MAX_AGE = 3600
#: How long an action's outcome waits to be shown (it is shown once, on the page gone back to).
FLASH_MAX_AGE = 120
#: The longest flash cookie kept: browsers drop cookies past about 4 KB, so typed input longer
#: than this is not kept (the message says so).
FLASH_MAX_CHARS = 3800
#: Messages are cut to this many characters before they go into the flash.
MESSAGE_MAX_CHARS = 600

#: The fields an operator types on each action's form: kept after an error, so nothing is lost.
TYPED: dict[str, tuple[str, ...]] = {
    "resolve": ("evidence", "by"),
    "approve": ("approver", "approval_id"),
    "reject": ("by", "reason"),
    "cancel": ("reason",),
    "compensate": ("reason",),
    "resume": (),
}
#: The longest text each field takes, as the API's request schemas allow.
FIELD_MAX_CHARS = {"by": 200, "approver": 200, "approval_id": 200, "reason": 2000}

_env = Environment(
    loader=PackageLoader("effectflow.console", "templates"),
    autoescape=select_autoescape(["html"]),
    trim_blocks=True,
    lstrip_blocks=True,
)


def _short(value: Any, n: int = 12) -> str:
    text = "" if value is None else str(value)
    return text[:n] + ("…" if len(text) > n else "")


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def when(epoch: float | None) -> Markup:
    """An epoch time as ``<time>``: ISO 8601 UTC in ``datetime`` and the tooltip, readable UTC as
    the text; ``static/console.js`` then shows it in the browser's own time zone."""
    if epoch is None:
        return Markup("")
    at = datetime.fromtimestamp(epoch, tz=UTC)
    iso = at.isoformat(timespec="seconds").replace("+00:00", "Z")
    shown = at.strftime("%Y-%m-%d %H:%M:%S UTC")
    return Markup('<time datetime="{0}" title="{1}">{1}</time>').format(iso, shown)


_env.filters["short"] = _short
_env.filters["json"] = _json
_env.filters["when"] = when


def _csrf(token: str) -> str:
    return hmac.new(token.encode(), b"effectflow-console-form", hashlib.sha256).hexdigest()[:32]


def _same(given: str, expected: str) -> bool:
    """Constant-time equality of two texts (``compare_digest`` refuses non-ASCII ``str``)."""
    return hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode("utf-8"))


def _tenant(request: Request) -> tuple[str, str] | None:
    token = request.cookies.get(COOKIE)
    if not token:
        return None
    tenant = hardening.tenant_of(request.app.state.tokens, token)
    return None if tenant is None else (token, tenant)


def _runtime(request: Request, tenant: str) -> ef.Runtime:
    runtime: ef.Runtime = request.app.state.runtimes.get(tenant)
    return runtime


def _settings(request: Request) -> hardening.Settings:
    return hardening.settings_of(request)


def _signer(request: Request) -> hardening.Signer:
    return hardening.Signer(_settings(request).secret)


def _set_cookie(
    request: Request, response: Response, name: str, value: str, max_age: int | None = None
) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path="/",
        secure=hardening.secure(request, _settings(request)),
        httponly=True,
        samesite="strict",
    )


def _delete_cookie(request: Request, response: Response, name: str) -> None:
    response.delete_cookie(
        name,
        path="/",
        secure=hardening.secure(request, _settings(request)),
        httponly=True,
        samesite="strict",
    )


def _cross_site(request: Request) -> bool:
    """The browser says the request comes from another site (``Sec-Fetch-Site``): refused for
    every form post, whatever else it carries."""
    return request.headers.get("sec-fetch-site", "").lower() == "cross-site"


# -- flash messages -------------------------------------------------------------------------------


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


def _back(request: Request, path: str, tenant: str, flash: Flash) -> RedirectResponse:
    """Go back to ``path`` (303) carrying ``flash`` in a signed cookie bound to the tenant."""
    signer = _signer(request)
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
    _set_cookie(request, response, FLASH_COOKIE, value, max_age=FLASH_MAX_AGE)
    return response


def _read_flash(request: Request, tenant: str | None) -> Flash:
    data = _signer(request).loads("flash", request.cookies.get(FLASH_COOKIE))
    if not isinstance(data, dict) or tenant is None or data.get("t") != tenant:
        return Flash()
    fields = data.get("fields")
    return Flash(
        message=data.get("msg") if isinstance(data.get("msg"), str) else None,
        error=data.get("err") if isinstance(data.get("err"), str) else None,
        form=data.get("form") if isinstance(data.get("form"), str) else None,
        fields={str(k): str(v) for k, v in fields.items()} if isinstance(fields, dict) else {},
    )


# -- rendering ------------------------------------------------------------------------------------


def _page(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
    signed = _tenant(request)
    tenant = None if signed is None else signed[1]
    flash = _read_flash(request, tenant)

    def keep(form: str) -> dict[str, str]:
        """What the operator typed into ``form`` before an error, to fill it in again."""
        return flash.fields if flash.form == form else {}

    html = _env.get_template(template).render(
        request=request,
        tenant=tenant,
        csrf=None if signed is None else _csrf(signed[0]),
        message=flash.message,
        error=flash.error,
        keep=keep,
        refresh=REFRESH_S,
        **context,
    )
    # Tenant data is never kept by a shared cache or shown again from the browser's history.
    response = HTMLResponse(html, status_code=status, headers={"Cache-Control": "no-store"})
    if FLASH_COOKIE in request.cookies:  # shown once
        _delete_cookie(request, response, FLASH_COOKIE)
    return response


def _signed_in(request: Request) -> tuple[str, str] | Response:
    signed = _tenant(request)
    if signed is None:
        return RedirectResponse(f"/login?next={quote(request.url.path)}", status_code=303)
    return signed


def _local_path(text: str, default: str) -> str:
    """``text`` when it is a path on this site, else ``default`` (no open redirect)."""
    if not text.startswith("/") or text.startswith("//") or "\\" in text:
        return default
    return text


# -- sign-in --------------------------------------------------------------------------------------


def _login_nonce(request: Request) -> str | None:
    value = _signer(request).loads("login", request.cookies.get(LOGIN_COOKIE))
    return value if isinstance(value, str) else None


def _login_page(
    request: Request, nonce: str, target: str, status: int = 200, failed: str | None = None
) -> Response:
    response = _page(
        request, "login.html", status=status, next=target, login_csrf=nonce, failed=failed
    )
    signed = _signer(request).dumps("login", nonce, LOGIN_MAX_AGE)
    _set_cookie(request, response, LOGIN_COOKIE, signed, max_age=LOGIN_MAX_AGE)
    return response


async def login_form(request: Request) -> Response:
    """The sign-in form, with a form token (kept across tabs while its cookie is valid)."""
    nonce = _login_nonce(request) or secrets.token_urlsafe(32)
    target = _local_path(request.query_params.get("next", "/runs"), "/runs")
    return _login_page(request, nonce, target)


async def login(request: Request) -> Response:
    """Sign in: the form token must match its signed cookie (login CSRF), then the API token must
    be known (checked in constant time)."""
    form = await request.form()
    token = str(form.get("token", "")).strip()
    target = _local_path(str(form.get("next") or "/runs"), "/runs")
    expected = _login_nonce(request)
    given = str(form.get("login_csrf", ""))
    if _cross_site(request) or expected is None or not _same(given, expected):
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
    _set_cookie(request, response, COOKIE, token)
    _delete_cookie(request, response, LOGIN_COOKIE)
    return response


async def logout(request: Request) -> Response:
    """Sign out; the form carries the form token, so another site cannot sign an operator out."""
    signed = _tenant(request)
    form = await request.form()
    if signed is not None and (
        _cross_site(request) or not _same(str(form.get("csrf", "")), _csrf(signed[0]))
    ):
        return _page(request, "missing.html", status=403, what="a valid form (reload the page)")
    response = RedirectResponse("/login", status_code=303)
    _delete_cookie(request, response, COOKIE)
    return response


# -- pages ----------------------------------------------------------------------------------------


async def home(request: Request) -> Response:
    return RedirectResponse("/runs", status_code=303)


async def runs_page(request: Request) -> Response:
    signed = _signed_in(request)
    if isinstance(signed, Response):
        return signed
    rt = _runtime(request, signed[1])
    wanted = [
        s for s in request.query_params.getlist("status") if s in RunStatus.__members__.values()
    ]
    # A host's ids (a LangGraph thread, a tool-call id) find its guarded calls.
    scope = request.query_params.get("scope", "").strip() or None
    call_id = request.query_params.get("call_id", "").strip() or None

    def read() -> dict[str, Any]:
        listed = rt.runs(status=wanted or None, limit=200, scope=scope, call_id=call_id)
        runs = [rt.run_view(r) for r in listed]
        return {
            "runs": runs,
            "hosted": any(v.run.scope is not None for v in runs),
            "attention": len(rt.attention()),
        }

    return _page(
        request,
        "runs.html",
        statuses=[s.value for s in RunStatus],
        wanted=set(wanted),
        scope=scope or "",
        call_id=call_id or "",
        **await run_in_threadpool(read),
    )


async def run_page(request: Request) -> Response:
    signed = _signed_in(request)
    if isinstance(signed, Response):
        return signed
    rt = _runtime(request, signed[1])
    run_id = request.path_params["run_id"]

    def read() -> dict[str, Any] | None:
        try:
            view = rt.timeline(run_id)
        except errors.RunNotFound:
            return None
        items = [i for i in rt.attention() if i.run_id == run_id]
        return {"view": view, "run_view": rt.run_view(view.run), "items": items}

    found = await run_in_threadpool(read)
    if found is None:
        return _page(request, "missing.html", status=404, what=f"run {run_id}")
    return _page(request, "run.html", **found)


async def attention_page(request: Request) -> Response:
    signed = _signed_in(request)
    if isinstance(signed, Response):
        return signed
    rt = _runtime(request, signed[1])
    return _page(request, "attention.html", items=await run_in_threadpool(rt.attention))


# -- actions --------------------------------------------------------------------------------------


class Refused(ValueError):
    """The operator's input cannot be acted on (bad evidence, a field too long): explained on the
    form, which keeps what they typed."""


def _evidence(text: str, settings: hardening.Settings) -> dict[str, Any]:
    """The evidence typed into a form, held to the limits the API holds its bodies to."""
    try:
        evidence = hardening.loads_limited(text, settings.max_json_depth)
    except hardening.JSONTooDeep:
        raise Refused(
            f"evidence nests deeper than {settings.max_json_depth} levels; record the provider's "
            "ids and the facts, not whole documents"
        ) from None
    except json.JSONDecodeError as exc:
        raise Refused(f"evidence is not JSON: {exc.msg} (line {exc.lineno})") from None
    if not isinstance(evidence, dict):
        raise Refused('evidence must be a JSON object, e.g. {"external_effect_id": "msg_1"}')
    size = hardening.json_size(evidence)
    if size > settings.max_evidence_bytes:
        raise Refused(
            f"evidence is {size} bytes as JSON; this server stores at most "
            f"{settings.max_evidence_bytes}: keep the provider's ids and the facts"
        )
    return evidence


def _act(
    rt: ef.Runtime, verb: str, field: Callable[[str], str], settings: hardening.Settings
) -> str:
    """Carry out one action (in a worker thread: it may run the resumed workflow's tools); the
    message for the operator.

    Raises:
        Refused: the input cannot be acted on.
        errors.EffectflowError: the runtime refused (stale state, a step not waiting...).
    """
    for name, limit in FIELD_MAX_CHARS.items():
        if len(field(name)) > limit:
            raise Refused(f"{name} is longer than {limit} characters")
    if verb == "resolve":
        evidence = _evidence(field("evidence") or "{}", settings)
        committed = field("committed") == "yes"
        version = field("expected_version")
        if version and not version.isdigit():
            raise Refused("expected_version must be a number (reload the page)")
        effect = rt.resolve(
            field("effect_id"),
            committed=committed,
            evidence=evidence,
            by=field("by"),
            expected_version=int(version) if version else None,
        )
        run = rt.run(effect.run_id)
        if run.status is not RunStatus.FAILED:  # a failed run is redriven only when asked
            run = rt.resume(effect.run_id, by=field("by") or "console")
        said = "confirmed" if committed else "declared not committed"
        return f"{effect.effect_id} {said}; run {run.run_id} is {run.status}"
    if verb == "approve":
        run = rt.approve(
            field("run_id"),
            field("step_id"),
            approver=field("approver"),
            approval_id=field("approval_id"),
        )
        return f"approved {field('step_id')}; run {run.run_id} is {run.status}"
    if verb == "reject":
        run = rt.reject(field("run_id"), field("step_id"), by=field("by"), reason=field("reason"))
        return f"declined {field('step_id')}; run {run.run_id} is {run.status}"
    if verb == "cancel":
        inv = rt.cancel(
            field("run_id"), reason=field("reason") or None, by=field("by") or "console"
        )
        return (
            f"run {inv.run_id} is {inv.status}: {len(inv.confirmed)} confirmed, "
            f"{len(inv.unknown)} unknown, {len(inv.compensated)} compensated"
        )
    if verb == "compensate":
        run = rt.compensate(field("run_id"), reason=field("reason"), by=field("by") or "console")
        return f"run {run.run_id} is {run.status}"
    assert verb == "resume"
    run = rt.resume(field("run_id"), by=field("by") or "console")
    return f"run {run.run_id} is {run.status}"


async def action(request: Request) -> Response:
    """One form post: check the sign-in and the form token, call one runtime method in the thread
    pool, go back with the outcome (and, on an error, what was typed)."""
    signed = _signed_in(request)
    if isinstance(signed, Response):
        return signed
    token, tenant = signed
    form = await request.form()
    back = _local_path(str(form.get("back") or "/attention"), "/attention")
    if _cross_site(request) or not _same(str(form.get("csrf", "")), _csrf(token)):
        return _page(request, "missing.html", status=403, what="a valid form (reload the page)")
    verb = request.path_params["verb"]
    if verb not in TYPED:
        return _page(request, "missing.html", status=404, what=f"the action {verb!r}")
    fields = {name: value.strip() for name, value in form.items() if isinstance(value, str)}

    def field(name: str) -> str:
        return fields.get(name, "")

    rt = _runtime(request, tenant)
    try:
        said = await run_in_threadpool(_act, rt, verb, field, _settings(request))
    except (errors.EffectflowError, ValueError) as exc:
        typed = {name: field(name) for name in TYPED[verb]}
        return _back(
            request, back, tenant, Flash(error=str(exc), form=form_key(verb, fields), fields=typed)
        )
    return _back(request, back, tenant, Flash(message=said))


def routes() -> list[BaseRoute]:
    """The console's routes, to mount at ``/``; its stylesheet and script are static files under
    ``/static/`` (the CSP allows no inline script or style)."""
    return [
        Route("/", home),
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/runs", runs_page),
        Route("/runs/{run_id}", run_page),
        Route("/attention", attention_page),
        Route("/actions/{verb}", action, methods=["POST"]),
        Mount("/static", StaticFiles(packages=[("effectflow.console", "static")]), name="static"),
    ]
