"""The console's routes: HTML pages and the form actions behind them."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any
from urllib.parse import quote, urlencode

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

import effectflow as ef
from effectflow import errors
from effectflow.ledger.records import RunStatus

COOKIE = "effectflow_token"
#: Seconds between refreshes of a page nobody is typing on.
REFRESH_S = 5

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


_env.filters["short"] = _short
_env.filters["json"] = _json


def _csrf(token: str) -> str:
    return hmac.new(token.encode(), b"effectflow-console-form", hashlib.sha256).hexdigest()[:32]


def _tenant(request: Request) -> tuple[str, str] | None:
    token = request.cookies.get(COOKIE)
    tokens: dict[str, str] = request.app.state.tokens
    if not token or token not in tokens:
        return None
    return token, tokens[token]


def _runtime(request: Request, tenant: str) -> ef.Runtime:
    runtime: ef.Runtime = request.app.state.runtimes.get(tenant)
    return runtime


def _page(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
    signed = _tenant(request)
    html = _env.get_template(template).render(
        request=request,
        tenant=None if signed is None else signed[1],
        csrf=None if signed is None else _csrf(signed[0]),
        message=request.query_params.get("msg"),
        error=request.query_params.get("err"),
        refresh=REFRESH_S,
        **context,
    )
    return HTMLResponse(html, status_code=status)


def _back(path: str, *, msg: str | None = None, err: str | None = None) -> RedirectResponse:
    query = urlencode({k: v for k, v in (("msg", msg), ("err", err)) if v})
    return RedirectResponse(f"{path}?{query}" if query else path, status_code=303)


def _signed_in(request: Request) -> tuple[str, str] | Response:
    signed = _tenant(request)
    if signed is None:
        return RedirectResponse(f"/login?next={quote(request.url.path)}", status_code=303)
    return signed


# -- sign-in --------------------------------------------------------------------------------------


async def login_form(request: Request) -> Response:
    return _page(request, "login.html", next=request.query_params.get("next", "/runs"))


async def login(request: Request) -> Response:
    form = await request.form()
    token = str(form.get("token", "")).strip()
    target = str(form.get("next") or "/runs")
    if not target.startswith("/") or target.startswith("//"):
        target = "/runs"
    if token not in request.app.state.tokens:
        return _page(request, "login.html", status=401, next=target, failed=True)
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/")
    return response


async def logout(request: Request) -> Response:
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE, path="/")
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
    listed = rt.runs(status=wanted or None, limit=200, scope=scope, call_id=call_id)
    runs = [rt.run_view(r) for r in listed]
    return _page(
        request,
        "runs.html",
        runs=runs,
        statuses=[s.value for s in RunStatus],
        wanted=set(wanted),
        scope=scope or "",
        call_id=call_id or "",
        hosted=any(v.run.scope is not None for v in runs),
        attention=len(rt.attention()),
    )


async def run_page(request: Request) -> Response:
    signed = _signed_in(request)
    if isinstance(signed, Response):
        return signed
    rt = _runtime(request, signed[1])
    run_id = request.path_params["run_id"]
    try:
        view = rt.timeline(run_id)
    except errors.RunNotFound:
        return _page(request, "missing.html", status=404, what=f"run {run_id}")
    items = [i for i in rt.attention() if i.run_id == run_id]
    return _page(request, "run.html", view=view, run_view=rt.run_view(view.run), items=items)


async def attention_page(request: Request) -> Response:
    signed = _signed_in(request)
    if isinstance(signed, Response):
        return signed
    rt = _runtime(request, signed[1])
    return _page(request, "attention.html", items=rt.attention())


# -- actions --------------------------------------------------------------------------------------


async def action(request: Request) -> Response:
    """One form post: check the sign-in and the form token, call one runtime method, go back."""
    signed = _signed_in(request)
    if isinstance(signed, Response):
        return signed
    token, tenant = signed
    form = await request.form()
    back = str(form.get("back") or "/attention")
    if not back.startswith("/") or back.startswith("//"):
        back = "/attention"
    if not hmac.compare_digest(str(form.get("csrf", "")), _csrf(token)):
        return _page(request, "missing.html", status=403, what="a valid form (reload the page)")
    rt = _runtime(request, tenant)
    verb = request.path_params["verb"]

    def field(name: str) -> str:
        return str(form.get(name, "")).strip()

    try:
        if verb == "resolve":
            evidence_text = field("evidence") or "{}"
            try:
                evidence = json.loads(evidence_text)
            except json.JSONDecodeError as exc:
                return _back(back, err=f"evidence is not JSON: {exc.msg} (line {exc.lineno})")
            if not isinstance(evidence, dict):
                return _back(
                    back,
                    err='evidence must be a JSON object, e.g. {"external_effect_id": "msg_1"}',
                )
            committed = field("committed") == "yes"
            version = field("expected_version")
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
            return _back(back, msg=f"{effect.effect_id} {said}; run {run.run_id} is {run.status}")
        if verb == "approve":
            run = rt.approve(
                field("run_id"),
                field("step_id"),
                approver=field("approver"),
                approval_id=field("approval_id"),
            )
            return _back(back, msg=f"approved {field('step_id')}; run {run.run_id} is {run.status}")
        if verb == "reject":
            run = rt.reject(
                field("run_id"), field("step_id"), by=field("by"), reason=field("reason")
            )
            return _back(back, msg=f"declined {field('step_id')}; run {run.run_id} is {run.status}")
        if verb == "cancel":
            inv = rt.cancel(
                field("run_id"), reason=field("reason") or None, by=field("by") or "console"
            )
            return _back(
                back,
                msg=f"run {inv.run_id} is {inv.status}: {len(inv.confirmed)} confirmed, "
                f"{len(inv.unknown)} unknown, {len(inv.compensated)} compensated",
            )
        if verb == "compensate":
            run = rt.compensate(
                field("run_id"), reason=field("reason"), by=field("by") or "console"
            )
            return _back(back, msg=f"run {run.run_id} is {run.status}")
        if verb == "resume":
            run = rt.resume(field("run_id"), by=field("by") or "console")
            return _back(back, msg=f"run {run.run_id} is {run.status}")
    except (errors.EffectflowError, ValueError) as exc:
        return _back(back, err=str(exc))
    return _page(request, "missing.html", status=404, what=f"the action {verb!r}")


def routes() -> list[BaseRoute]:
    """The console's routes, to mount at ``/``."""
    return [
        Route("/", home),
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/runs", runs_page),
        Route("/runs/{run_id}", run_page),
        Route("/attention", attention_page),
        Route("/actions/{verb}", action, methods=["POST"]),
    ]
