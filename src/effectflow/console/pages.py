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

import json
from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

import effectflow as ef
from effectflow import errors
from effectflow.api import hardening
from effectflow.console import rendering, session, signin
from effectflow.console.session import COOKIE as COOKIE
from effectflow.console.session import FLASH_COOKIE as FLASH_COOKIE
from effectflow.console.session import LOGIN_COOKIE as LOGIN_COOKIE
from effectflow.console.session import LOGIN_MAX_AGE as LOGIN_MAX_AGE
from effectflow.ledger.records import RunStatus

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


async def home(request: Request) -> Response:
    return RedirectResponse("/runs", status_code=303)


async def runs_page(request: Request) -> Response:
    signed = session.signed_in(request)
    if isinstance(signed, Response):
        return signed
    rt = session.tenant_runtime(request, signed[1])
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

    return rendering.page(
        request,
        "runs.html",
        statuses=[s.value for s in RunStatus],
        wanted=set(wanted),
        scope=scope or "",
        call_id=call_id or "",
        **await run_in_threadpool(read),
    )


async def run_page(request: Request) -> Response:
    signed = session.signed_in(request)
    if isinstance(signed, Response):
        return signed
    rt = session.tenant_runtime(request, signed[1])
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
        return rendering.page(request, "missing.html", status=404, what=f"run {run_id}")
    return rendering.page(request, "run.html", **found)


async def attention_page(request: Request) -> Response:
    signed = session.signed_in(request)
    if isinstance(signed, Response):
        return signed
    rt = session.tenant_runtime(request, signed[1])
    return rendering.page(request, "attention.html", items=await run_in_threadpool(rt.attention))


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
    signed = session.signed_in(request)
    if isinstance(signed, Response):
        return signed
    token, tenant = signed
    form = await request.form()
    back = session.local_path(str(form.get("back") or "/attention"), "/attention")
    if session.cross_site(request) or not session.same_text(
        str(form.get("csrf", "")), session.csrf_token(token)
    ):
        return rendering.page(
            request, "missing.html", status=403, what="a valid form (reload the page)"
        )
    verb = request.path_params["verb"]
    if verb not in TYPED:
        return rendering.page(request, "missing.html", status=404, what=f"the action {verb!r}")
    fields = {name: value.strip() for name, value in form.items() if isinstance(value, str)}

    def field(name: str) -> str:
        return fields.get(name, "")

    rt = session.tenant_runtime(request, tenant)
    try:
        said = await run_in_threadpool(_act, rt, verb, field, session.settings_of(request))
    except (errors.EffectflowError, ValueError) as exc:
        typed = {name: field(name) for name in TYPED[verb]}
        return session.go_back(
            request,
            back,
            tenant,
            session.Flash(error=str(exc), form=session.form_key(verb, fields), fields=typed),
        )
    return session.go_back(request, back, tenant, session.Flash(message=said))


def routes() -> list[BaseRoute]:
    """The console's routes, to mount at ``/``; its stylesheet and script are static files under
    ``/static/`` (the CSP allows no inline script or style)."""
    return [
        Route("/", home),
        Route("/login", signin.login_form, methods=["GET"]),
        Route("/login", signin.login, methods=["POST"]),
        Route("/logout", signin.logout, methods=["POST"]),
        Route("/runs", runs_page),
        Route("/runs/{run_id}", run_page),
        Route("/attention", attention_page),
        Route("/actions/{verb}", action, methods=["POST"]),
        Mount("/static", StaticFiles(packages=[("effectflow.console", "static")]), name="static"),
    ]
