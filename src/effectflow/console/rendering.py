"""Rendering a console page: the Jinja environment, its filters, and the answer every page gets
(the flash shown once, the form tokens, no caching of tenant data).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import HTMLResponse

from effectflow.console import session

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


def page(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
    """A page rendered for the signed-in tenant (if any): its form token, the flash shown once,
    and what the operator typed before an error, to fill the form in again."""
    signed = session.signed_tenant(request)
    tenant = None if signed is None else signed[1]
    flash = session.read_flash(request, tenant)

    def keep(form: str) -> dict[str, str]:
        """What the operator typed into ``form`` before an error, to fill it in again."""
        return flash.fields if flash.form == form else {}

    html = _env.get_template(template).render(
        request=request,
        tenant=tenant,
        csrf=None if signed is None else session.csrf_token(signed[0]),
        message=flash.message,
        error=flash.error,
        keep=keep,
        refresh=REFRESH_S,
        **context,
    )
    # Tenant data is never kept by a shared cache or shown again from the browser's history.
    response = HTMLResponse(html, status_code=status, headers={"Cache-Control": "no-store"})
    if session.FLASH_COOKIE in request.cookies:  # shown once
        session.delete_cookie(request, response, session.FLASH_COOKIE)
    return response
