"""How every command says no: one refusal document on stderr and an exit status."""

from __future__ import annotations

import json
from typing import NoReturn

import typer

from app.domain.errors import QossError

__all__ = ["fail"]


def fail(exc: QossError, code: int = 2) -> NoReturn:
    """Print a refusal on stderr, ``{"error": <name>, "detail": ...}``, and exit with ``code``: one
    line when the detail is a message, indented when it has parts (each unmet requirement)."""
    detail = exc.detail()
    body = {"error": type(exc).__name__, "detail": detail}
    typer.echo(json.dumps(body) if isinstance(detail, str) else json.dumps(body, indent=2), err=True)
    raise typer.Exit(code)
