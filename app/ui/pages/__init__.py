"""The console's pages, one module per area, each a thin view over the services the REST API
calls: a handler reads its input, calls a service through the request's unit of work, and
renders a template; a change answers htmx with a fragment and a plain browser with a redirect
(reading works without JavaScript)."""

from __future__ import annotations

from fastapi import APIRouter

from app.ui.pages import (
    agent,
    audit,
    device,
    gateways,
    handoff,
    measurements,
    oidc,
    playground,
    policies,
    signin,
    table_changes,
    tables,
    tokens,
    tunnels,
)

__all__ = ["routers"]

#: Every area's router, in the order their routes are matched.
routers: tuple[APIRouter, ...] = tuple(area.router for area in (
    signin, oidc, table_changes, tables, playground, policies, tunnels, gateways, agent, device, handoff,
    measurements, audit, tokens))
