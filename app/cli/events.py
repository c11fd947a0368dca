"""``qoss events``: follow a running qoss's live events (``GET /v1/events``) as JSON lines."""

from __future__ import annotations

import json
import time
from typing import Annotated

import typer

__all__ = ["events"]


def events(
    url: Annotated[str | None, typer.Option(help="the qoss API (default: QOSS_URL or the context's)")] = None,
    token: Annotated[str | None, typer.Option(help="an API token (default: QOSS_TOKEN or the context's)")] = None,
    after: Annotated[int | None, typer.Option(min=0, help="start after this event id (default: from now)")] = None,
    count: Annotated[int | None, typer.Option(min=1, help="stop after this many events")] = None,
) -> None:
    """Print each event as one JSON line as it happens; reconnect and resume where it stopped."""
    import httpx

    from app.cli.client import chosen, refuse

    target = chosen(url=url)
    url, token = target.url, token or target.token
    if not token:
        raise typer.BadParameter("give an API token with --token, QOSS_TOKEN or a context (qoss context set)")
    if target.url_from is None:  # a token goes only to a service someone named
        refuse("a token is set (--token) but no service is named: give --url, set QOSS_URL or choose a context "
               "('qoss context use NAME'); a token is never sent to a default address")
    headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
    last, seen, wait = after, 0, 1.0
    while True:
        params = {"after": last} if last is not None else {}
        try:
            with httpx.stream("GET", f"{url.rstrip('/')}/v1/events", headers=headers, params=params,
                              timeout=httpx.Timeout(10.0, read=60.0), verify=target.verify) as answer:
                if answer.status_code in (401, 403):
                    typer.echo(f"events: refused ({answer.status_code}): check the token", err=True)
                    raise typer.Exit(2)
                kind = answer.headers.get("content-type", "").split(";")[0].strip().lower()
                if kind in ("text/html", "application/xhtml+xml") or answer.is_redirect:
                    refuse(f"{url} (named by {target.url_from}) is not qoss's API: GET /v1/events answered "
                           f"{'a redirect' if answer.is_redirect else 'an HTML page'}; name the service's address "
                           "without a page's path (e.g. http://HOST:8000, not .../ui)")
                answer.raise_for_status()
                wait = 1.0
                for line in answer.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    event = json.loads(line[6:])
                    typer.echo(json.dumps(event, separators=(",", ":")))
                    last, seen = int(event["id"]), seen + 1
                    if count is not None and seen >= count:
                        return
        except (httpx.TransportError, httpx.HTTPStatusError) as exc:
            typer.echo(f"events: {type(exc).__name__}: {exc}; reconnecting in {wait:g} s", err=True)
        time.sleep(wait)
        wait = min(wait * 2, 30.0)
