"""The console's pages, one module per area, each a thin view over the services the REST API
calls: a handler reads its input, calls a service through the request's unit of work, and
renders a template; a change answers htmx with a fragment and a plain browser with a redirect
(reading works without JavaScript).

A new area registers here twice: its router in :data:`routers`, and, if it has a place in the
navigation bar, its link in :data:`navigation`."""

from __future__ import annotations

from fastapi import APIRouter

from app.ui.pages import (
    agent,
    agent_devices,
    audit,
    device,
    gateways,
    handoff,
    join,
    join_sso,
    measurements,
    my_devices,
    oidc,
    peers,
    playground,
    policies,
    signin,
    table_changes,
    tables,
    tokens,
    tunnels,
)
from app.ui.render import share
from app.ui.routing import NavLink

__all__ = ["navigation", "routers"]

#: Every area's router, in the order their routes are matched.
routers: tuple[APIRouter, ...] = tuple(area.router for area in (
    signin, oidc, table_changes, tables, playground, policies, tunnels, gateways, peers, agent, agent_devices,
    device, my_devices, join_sso, handoff, join, measurements, audit, tokens))

#: The navigation bar's links, in its order; ``base.html`` shows those the signed-in token may see.
navigation: tuple[NavLink, ...] = (
    NavLink("tables", "/ui/tables", "Rating tables"),
    NavLink("negotiate", "/ui/negotiate", "Playground"),
    NavLink("policies", "/ui/policies", "Policies"),
    NavLink("tunnels", "/ui/tunnels", "Tunnels", ("tunnels:read",)),
    NavLink("gateways", "/ui/gateways", "Gateways", ("tunnels:read",)),
    NavLink("peers", "/ui/peers", "Peers"),
    NavLink("agent", "/ui/agent", "Agent", ("agent:enroll", "tunnels:read")),
    NavLink("measurements", "/ui/measurements", "Measurements"),
    NavLink("audit", "/ui/audit", "Audit", ("audit:read",)),
    NavLink("tokens", "/ui/tokens", "Tokens", ("admin",)),
)
share(navigation=navigation)
