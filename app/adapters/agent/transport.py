"""HTTP between the agent's roles: client -> Host, Host -> Target.

A message travels as ``{"message": "<the wire bytes>"}``; the answer the same way. An
answer other than 200 becomes :class:`RemoteRefused` with the remote status and its
error document (already free of secrets: the remote side's one error shape), a network
failure :class:`GatewayUnreachable` naming the URL.

A plain ``http://`` peer is reached with :mod:`http.client` over a kept-alive connection
per origin (a fraction of httpx's cost per request, which a connect pays
twice); ``https://``, a proxy from the environment, or an explicit ``client`` go through
httpx. A kept connection the peer closed while idle is noticed before use and replaced.
"""

from __future__ import annotations

import atexit
import http.client
import json
import threading
import urllib.parse
import urllib.request
from typing import Any

import httpx

from app.adapters.sockets import idle_and_open
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


class _Kept:
    """Idle kept-alive connections to plain-HTTP peers, per origin (at most ``max_idle`` each); a
    connection is used by one request at a time. Closed at exit."""

    def __init__(self, max_idle: int = 8) -> None:
        self.max_idle = max_idle
        self._lock = threading.Lock()
        self._idle: dict[tuple[str, int], list[http.client.HTTPConnection]] = {}

    def take(self, origin: tuple[str, int]) -> http.client.HTTPConnection | None:
        while True:
            with self._lock:
                idle = self._idle.get(origin)
                conn = idle.pop() if idle else None
            if conn is None or _idle_and_open(conn):
                return conn
            conn.close()

    def give(self, origin: tuple[str, int], conn: http.client.HTTPConnection) -> None:
        with self._lock:
            idle = self._idle.setdefault(origin, [])
            if len(idle) < self.max_idle:
                idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            conns = [c for idle in self._idle.values() for c in idle]
            self._idle.clear()
        for conn in conns:
            conn.close()


def _idle_and_open(conn: http.client.HTTPConnection) -> bool:
    """False if the kept connection's socket is gone or readable (the peer closed it while idle)."""
    return conn.sock is not None and idle_and_open(conn.sock)


#: An answer is one sealed message in a small JSON document (or an error document): more is refused unread.
_MAX_REPLY_BYTES = MAX_WIRE_BYTES + 4096
_KEPT = _Kept()
atexit.register(_KEPT.close)


def _plain_post(url: str, parts: urllib.parse.SplitResult, body: bytes, timeout: float) -> tuple[int, bytes]:
    """POST over a kept-alive connection to the origin (a new one if none is idle).

    A kept connection that the peer resets or closes as the request goes out (it was closing
    it at that moment, e.g. after a 500) is replaced once by a new one. The message may have
    reached the peer: sent twice, it is refused as a replay, never acted on twice.
    """
    origin = (parts.hostname or "", parts.port or 80)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    conn = _KEPT.take(origin)
    for attempt in (1, 2):
        reused = conn is not None
        if conn is None:
            conn = http.client.HTTPConnection(origin[0], origin[1], timeout=timeout)
        elif conn.sock is not None:
            conn.sock.settimeout(timeout)
        try:
            conn.request("POST", path, body=body,
                         headers={"Content-Type": "application/json", "Accept": "application/json"})
            reply = conn.getresponse()
            content = reply.read(_MAX_REPLY_BYTES + 1)
        except (ConnectionResetError, BrokenPipeError):
            conn.close()
            if not reused or attempt == 2:
                raise
            conn = None
            continue
        except BaseException:
            conn.close()
            raise
        if len(content) > _MAX_REPLY_BYTES:  # the rest is never read: the connection cannot be kept
            conn.close()
            raise RemoteRefused(502, "the remote party's answer is too large")
        if reply.will_close:
            conn.close()
        else:
            _KEPT.give(origin, conn)
        return reply.status, content
    raise AssertionError("unreachable")  # pragma: no cover


def post_message(url: str, wire: bytes, *, timeout: float = 20.0, client: httpx.Client | None = None) -> bytes:
    """POST one agent message; the answer's message bytes.

    Raises:
        AgentRejected: the remote side rejected it (403: deliberately without a reason).
        RemoteRefused: another error status.
        PeerUnreachable: no answer.
    """
    parts = urllib.parse.urlsplit(url)
    proxied = any(k in urllib.request.getproxies() for k in ("http", "all"))
    if client is None and parts.scheme == "http" and not proxied:
        body = json.dumps({"message": wire.decode("ascii")}, separators=(",", ":")).encode("ascii")
        try:
            status, content = _plain_post(url, parts, body, timeout)
        except (OSError, http.client.HTTPException) as exc:
            raise PeerUnreachable(url, type(exc).__name__) from exc
    else:
        try:
            reply = (client or _shared()).post(url, json={"message": wire.decode("ascii")}, timeout=timeout)
        except httpx.HTTPError as exc:
            raise PeerUnreachable(url, type(exc).__name__) from exc
        status, content = reply.status_code, reply.content
    if status == 403:
        raise AgentRejected(f"{url} rejected the message")
    try:
        doc = json.loads(content)
    except ValueError:
        doc = None
    if status != 200:
        detail = doc.get("detail") if isinstance(doc, dict) else None
        raise RemoteRefused(status, detail if detail is not None else content.decode("utf-8", "replace")[:200])
    message = doc.get("message") if isinstance(doc, dict) else None
    if not isinstance(message, str) or len(message) > MAX_WIRE_BYTES or not message.isascii():
        raise RemoteRefused(502, "the remote party's answer is malformed")
    return message.encode("ascii")
