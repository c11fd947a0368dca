"""Who sent a request and which one it is: the client's address behind trusted proxies, and
the request id the audit log and the ``X-Request-ID`` answer carry.

The request id is ours, made per request: a client's ``X-Request-ID`` could collide with
another's or name a request it never made, so it is only kept beside ours
(``client_request_id``) when it is a short safe token. Forwarded headers name the client
only when the connection comes from a configured proxy (``QOSS_TRUSTED_PROXIES``, none by
default); ``qoss serve`` switches uvicorn's own proxy-header handling off, so this is the
one place that decides.
"""

from __future__ import annotations

import ipaddress
import re
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.types import Scope

from app.web.log_redaction import REDACTED

__all__ = ["TrustedProxies", "audit_fields", "client_request_id", "new_request_id"]

_TOKEN = re.compile(r"[A-Za-z0-9._-]{1,64}")
_Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def new_request_id() -> str:
    """A fresh request id (32 hex digits)."""
    return uuid.uuid4().hex


def client_request_id(supplied: str | None) -> str | None:
    """The client's ``X-Request-ID`` if it is a safe token (1-64 of ``[A-Za-z0-9._-]``), else None."""
    return supplied if supplied and _TOKEN.fullmatch(supplied) else None


def _address(text: str) -> _Address | None:
    """An address as a forwarded header writes it: ``192.0.2.1``, ``192.0.2.1:80``, ``[2001:db8::1]:80``."""
    text = text.strip().strip('"')
    if text.startswith("["):
        text = text[1:].split("]", 1)[0]
    elif text.count(":") == 1:
        text = text.split(":", 1)[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _forwarded_for(value: str) -> list[str]:
    """The ``for=`` of each element of RFC 7239 ``Forwarded``, in order."""
    hops = []
    for element in value.split(","):
        for pair in element.split(";"):
            name, _, found = pair.strip().partition("=")
            if name.strip().lower() == "for":
                hops.append(found)
    return hops


class TrustedProxies:
    """The proxies whose forwarded headers name the client.

    Args:
        networks: addresses or networks (``10.0.0.5``, ``10.0.0.0/8``); none trusts no one.
        header: the header those proxies write: ``x-forwarded-for`` or ``forwarded``
            (RFC 7239). Only that one is read: a header the proxy passes through untouched
            is the client's to forge.
    """

    def __init__(self, networks: Iterable[str], header: str = "x-forwarded-for") -> None:
        self.networks: tuple[_Network, ...] = tuple(ipaddress.ip_network(n, strict=False) for n in networks)
        if header not in ("x-forwarded-for", "forwarded"):
            raise ValueError("the forwarded header is x-forwarded-for or forwarded")
        self.header = header.encode("latin-1")

    def __bool__(self) -> bool:
        return bool(self.networks)

    def _trusted(self, address: _Address) -> bool:
        return any(address in network for network in self.networks)

    def client(self, peer: str, headers: Iterable[tuple[bytes, bytes]]) -> str:
        """The client's address: ``peer`` itself unless it is a trusted proxy that says whom
        it forwards for. Hops are read from the right (the nearest proxy's entry first); the
        first one that is not a trusted proxy is the client. An entry that is not an address
        stops the walk: the peer is kept."""
        try:
            if not self.networks or not self._trusted(ipaddress.ip_address(peer)):
                return peer
        except ValueError:
            return peer
        values = [v.decode("latin-1") for k, v in headers if k == self.header]
        if not values:
            return peer
        joined = ",".join(values)
        hops = _forwarded_for(joined) if self.header == b"forwarded" else joined.split(",")
        found = None
        for hop in reversed(hops):
            address = _address(hop)
            if address is None:
                return peer
            found = address
            if not self._trusted(address):
                break
        return str(found) if found is not None else peer

    def rewrite(self, scope: Scope) -> None:
        """Put the forwarded client's address in ``scope["client"]``, and the scheme the client
        used (``X-Forwarded-Proto``: ``http`` or ``https``) in ``scope["scheme"]`` — from a
        trusted proxy only. The scheme decides whether the console's cookie is ``Secure``."""
        client = scope.get("client")
        if self.networks and client:
            headers = scope.get("headers", ())
            scheme = self.forwarded_proto(client[0], headers)
            address = self.client(client[0], headers)
            if address != client[0]:
                scope["client"] = (address, 0)
            if scheme is not None:
                scope["scheme"] = scheme

    def forwarded_proto(self, peer: str, headers: Iterable[tuple[bytes, bytes]]) -> str | None:
        """The scheme a trusted proxy ``peer`` says the client used: the nearest proxy's
        ``X-Forwarded-Proto`` entry (the last one), if it is ``http`` or ``https``; else None."""
        try:
            if not self.networks or not self._trusted(ipaddress.ip_address(peer)):
                return None
        except ValueError:
            return None
        values = [v.decode("latin-1") for k, v in headers if k == b"x-forwarded-proto"]
        if not values:
            return None
        last = ",".join(values).split(",")[-1].strip().lower()
        return last if last in ("http", "https") else None


#: The one path whose last segment is a secret: a device profile's one-time download link.
_LINK_PATH = "/v1/agent/handoffs/"


def _object(path: str) -> str:
    """The path a record names, without the secret of a one-time link (whatever its form)."""
    return _LINK_PATH + REDACTED if path.startswith(_LINK_PATH) else path


def audit_fields(request: Request, outcome: int) -> dict[str, Any]:
    """The audit record of one request: ids, who, what, the outcome (never a body or a secret)."""
    state: Mapping[str, Any] = request.scope.get("state", {})
    principal = state.get("principal")
    return {
        "request_id": state.get("request_id") or new_request_id(),
        "client_request_id": state.get("client_request_id"),
        "token_id": principal.token_id if principal else None,
        "token_name": principal.name if principal else None,
        "scopes": sorted(principal.scopes) if principal else [],
        "source": (request.client.host if request.client else "")[:64],
        "action": request.method[:16],
        "object": _object(request.url.path)[:300],
        "outcome": outcome,
        "detail": str(state.get("audit_detail", "") or state.get("error_name", ""))[:200],
    }
