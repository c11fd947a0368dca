"""HTTP between the agent's roles (httpx): client -> Host, Host -> Target.

A message travels as ``{"message": "<the wire bytes>"}``; the answer the same way. An
answer other than 200 becomes :class:`RemoteRefused` with the remote status and its
error document (already free of secrets: the remote side's one error shape), a network
failure :class:`GatewayUnreachable` naming the URL.
"""

from __future__ import annotations

import atexit
import threading
from typing import Any

import httpx

from app.domain.agent import MAX_WIRE_BYTES, AgentRejected
from app.domain.errors import GatewayUnreachable, QossError

__all__ = ["PeerUnreachable", "RemoteRefused", "post_message"]


class PeerUnreachable(GatewayUnreachable):
    """The other role (Host or Target) did not answer (503)."""

    def __init__(self, url: str, reason: str) -> None:
        QossError.__init__(self, f"agent peer unreachable at {url}: {reason}")
        self.socket_path = url


class RemoteRefused(QossError):
    """The other role answered with an error; ``status`` is its HTTP status (relayed as is)."""

    def __init__(self, status: int, detail: Any) -> None:
        super().__init__(f"the remote party answered {status}")
        self.status = status
        self.remote_detail = detail

    def detail(self) -> Any:
        return self.remote_detail


_SHARED: httpx.Client | None = None
_SHARED_LOCK = threading.Lock()


def _shared() -> httpx.Client:
    """One connection pool per process: building an httpx client (its TLS context) costs tens of ms."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = httpx.Client(timeout=20.0, limits=httpx.Limits(max_connections=64))
            atexit.register(_SHARED.close)
        return _SHARED


def post_message(url: str, wire: bytes, *, timeout: float = 20.0, client: httpx.Client | None = None) -> bytes:
    """POST one agent message; the answer's message bytes.

    Raises:
        AgentRejected: the remote side rejected it (403: deliberately without a reason).
        RemoteRefused: another error status.
        PeerUnreachable: no answer.
    """
    try:
        reply = (client or _shared()).post(url, json={"message": wire.decode("ascii")}, timeout=timeout)
    except httpx.HTTPError as exc:
        raise PeerUnreachable(url, type(exc).__name__) from exc
    if reply.status_code == 403:
        raise AgentRejected(f"{url} rejected the message")
    try:
        doc = reply.json()
    except ValueError:
        doc = None
    if reply.status_code != 200:
        detail = doc.get("detail") if isinstance(doc, dict) else None
        raise RemoteRefused(reply.status_code, detail if detail is not None else reply.text[:200])
    message = doc.get("message") if isinstance(doc, dict) else None
    if not isinstance(message, str) or len(message) > MAX_WIRE_BYTES or not message.isascii():
        raise RemoteRefused(502, "the remote party's answer is malformed")
    return message.encode("ascii")
