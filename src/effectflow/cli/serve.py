"""``effectflow serve``: the HTTP API (and the web console, when installed) under uvicorn.

Each hardening option of ``create_app`` is an option here (and an ``EFFECTFLOW_*`` variable). uvicorn's
own proxy-header handling is switched off: by default it believes ``X-Forwarded-Proto`` from
127.0.0.1, so any local client could claim HTTPS; ``--trust-proxy`` names the proxies instead.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import typer
import yaml


def parse_tokens(text: str) -> dict[str, str]:
    """Tokens from ``tok1=tenant1,tok2=tenant2`` (the ``EFFECTFLOW_TOKENS`` form).

    Raises:
        typer.BadParameter: an entry is not ``token=tenant``.
    """
    tokens: dict[str, str] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        token, sep, tenant = entry.partition("=")
        if not sep or not token.strip() or not tenant.strip():
            raise typer.BadParameter(
                f"{entry!r} is not token=tenant", param_hint="EFFECTFLOW_TOKENS"
            )
        tokens[token.strip()] = tenant.strip()
    return tokens


def load_tokens(path: Path) -> dict[str, str]:
    """Tokens from a YAML or JSON file holding one mapping of token to tenant.

    Raises:
        typer.BadParameter: the file cannot be read or is not such a mapping.
    """
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise typer.BadParameter(f"cannot read {path}: {exc}", param_hint="--tokens") from exc
    if not isinstance(data, dict) or not data:
        raise typer.BadParameter(
            f"{path} must hold a mapping of token to tenant", param_hint="--tokens"
        )
    tokens = {str(k): str(v) for k, v in data.items() if k and v}
    if len(tokens) != len(data):
        raise typer.BadParameter(f"{path}: empty token or tenant", param_hint="--tokens")
    return tokens


def load_secret(path: Path | None) -> str | None:
    """The cookie-signing secret from ``path`` (its text, stripped), else ``EFFECTFLOW_SECRET``,
    else None (a random one per process).

    Raises:
        typer.BadParameter: the file cannot be read.
    """
    if path is not None:
        try:
            return path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise typer.BadParameter(
                f"cannot read {path}: {exc}", param_hint="--secret-file"
            ) from exc
    return os.environ.get("EFFECTFLOW_SECRET") or None


# ``serve``'s options, declared here so its signature reads as a list. The limits stay in the
# signature: their help states create_app's defaults, and a test reads them there.
TokensOption = Annotated[
    Path | None,
    typer.Option(
        "--tokens",
        help="YAML or JSON file mapping each bearer token to its tenant. Without it, "
        "EFFECTFLOW_TOKENS='tok1=tenant1,tok2=tenant2' is read.",
    ),
]
AppOption = Annotated[
    str | None,
    typer.Option(
        "--app",
        help="module, module:object or path/to/app.py to import so the application's tools and "
        "workflows are registered (approve, resume, cancel and compensate drive runs here).",
    ),
]
RequestKeysOption = Annotated[
    str | None,
    typer.Option(
        "--idempotency-db",
        help="SQLite file of the Idempotency-Key table (default: beside a SQLite ledger).",
    ),
]
TrustProxyOption = Annotated[
    str | None,
    typer.Option(
        "--trust-proxy",
        envvar="EFFECTFLOW_TRUST_PROXY",
        help="Comma-separated IPs or CIDRs of reverse proxies (or '*') whose "
        "X-Forwarded-Proto / X-Forwarded-For are believed; without it they are ignored.",
    ),
]
SecureCookiesOption = Annotated[
    bool,
    typer.Option(
        "--secure-cookies",
        envvar="EFFECTFLOW_SECURE_COOKIES",
        help="Mark the console's cookies Secure always (default: on HTTPS requests).",
    ),
]
SecretFileOption = Annotated[
    Path | None,
    typer.Option(
        "--secret-file",
        help="File holding the key that signs the console's cookies (at least 16 bytes); "
        "else EFFECTFLOW_SECRET; else random per process.",
    ),
]


def serve(
    db: Annotated[
        str,
        typer.Option("--db", envvar="EFFECTFLOW_DB", help="Ledger URL (sqlite:///path.db)."),
    ] = "sqlite:///effectflow.db",
    tokens_file: TokensOption = None,
    host: Annotated[str, typer.Option("--host", help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port.")] = 8000,
    app: AppOption = None,
    request_keys: RequestKeysOption = None,
    max_body_bytes: Annotated[
        int | None,
        typer.Option(
            "--max-body-bytes",
            envvar="EFFECTFLOW_MAX_BODY_BYTES",
            min=1,
            help="Larger request bodies answer 413 before any route reads them "
            "(default: 1048576, 1 MiB).",
        ),
    ] = None,
    max_evidence_bytes: Annotated[
        int | None,
        typer.Option(
            "--max-evidence-bytes",
            envvar="EFFECTFLOW_MAX_EVIDENCE_BYTES",
            min=1,
            help="Larger evidence (as compact JSON) is refused: 413 from the API, explained on "
            "the console's form (default: 65536, 64 KiB).",
        ),
    ] = None,
    max_json_depth: Annotated[
        int | None,
        typer.Option(
            "--max-json-depth",
            envvar="EFFECTFLOW_MAX_JSON_DEPTH",
            min=1,
            help="Deeper JSON bodies and evidence answer 400 json_too_deep (default: 32).",
        ),
    ] = None,
    trust_proxy: TrustProxyOption = None,
    secure_cookies: SecureCookiesOption = False,
    secret_file: SecretFileOption = None,
) -> None:
    """Serve the HTTP API under /api/v1 (OpenAPI at /api/v1/openapi.json); SIGTERM exits 0."""
    import uvicorn

    tokens = _tokens(tokens_file)
    # Limits not given keep create_app's defaults (this module imports no server package, so the
    # CLI works without the server extra).
    given = {"max_body_bytes": max_body_bytes, "max_evidence_bytes": max_evidence_bytes}
    given["max_json_depth"] = max_json_depth
    limits = {name: value for name, value in given.items() if value is not None}
    if app is not None:  # found and its errors said as for every verb's --app
        from effectflow.cli import worker as worker_cli

        app = worker_cli.imported_app(app)
    application = _application(
        db,
        tokens,
        app_module=app,
        request_keys_path=request_keys,
        trust_proxy=trust_proxy,
        secure_cookies=secure_cookies,
        secret=load_secret(secret_file),
        **limits,
    )
    signal.signal(signal.SIGTERM, _stopped)
    uvicorn.run(application, host=host, port=port, log_level="info", proxy_headers=False)


def _tokens(tokens_file: Path | None) -> dict[str, str]:
    """The tokens from ``--tokens``, else ``EFFECTFLOW_TOKENS``.

    Raises:
        typer.BadParameter: neither is given, or what is given is not a mapping of token to
            tenant.
    """
    if tokens_file is not None:
        tokens = load_tokens(tokens_file)
    elif os.environ.get("EFFECTFLOW_TOKENS"):
        tokens = parse_tokens(os.environ["EFFECTFLOW_TOKENS"])
    else:
        raise typer.BadParameter(
            "give --tokens FILE or set EFFECTFLOW_TOKENS", param_hint="--tokens"
        )
    return tokens


def _application(db: str, tokens: dict[str, str], **options: Any) -> Any:
    """``create_app(db, tokens, **options)``; an application that cannot be imported is a usage
    error, and the app's refusal (a bad limit, a short secret) exits 2 with its words."""
    from effectflow import errors
    from effectflow.api import create_app

    try:
        return create_app(db, tokens, **options)
    except (ImportError, AttributeError) as exc:
        app = options.get("app_module")
        raise typer.BadParameter(f"cannot load {app!r}: {exc}", param_hint="--app") from exc
    except errors.EffectflowError as exc:
        typer.echo(f"effectflow serve: {exc}", err=True)
        raise typer.Exit(2) from None


def _stopped(signum: int, frame: FrameType | None) -> None:
    """uvicorn shuts down gracefully on SIGTERM, then re-raises the signal it caught; this handler
    receives that re-raise, so a requested stop ends with exit code 0 instead of death by signal."""
