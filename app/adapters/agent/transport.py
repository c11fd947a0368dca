"""HTTP between the agent's roles: client -> Host, Host -> Target.

A message travels as ``{"message": "<the wire bytes>"}``; the answer the same way. An
answer other than 200 becomes :class:`RemoteRefused` with the remote status and its
error document (already free of secrets: the remote side's one error shape), a network
failure :class:`GatewayUnreachable` naming the URL.

A plain ``http://`` peer is reached over a kept-alive connection per origin: the request
goes out in one write and the answer is read with httptools' parser (uvicorn's; a fraction
of httpx's or :mod:`http.client`'s cost per request, which a connect pays twice);
``https://``, a proxy from the environment, an explicit ``client``, or ``fast_paths=False``
(the ``QOSS_FAST_PATHS`` setting) go through httpx. A kept connection the peer closed while
idle is noticed before use and replaced. An answer framed by neither Content-Length nor
chunked encoding ends where the peer closes the connection (RFC 9112 §6.3), as httpx reads it.

What of httptools this relies on (the response parser's callbacks, ``should_keep_alive``,
``get_status_code``, ``HttpParserError``) and that it answers as httpx does are checked by
``tests/unit/adapters/test_transport_library_shape.py`` against the pinned version.
"""

from __future__ import annotations

import atexit
import functools
import json
import socket
import threading
import urllib.parse
import urllib.request
from typing import Any

import httptools
import httpx

from app.adapters.sockets import idle_and_open
from app.domain.agent import MAX_RESPONSE_WIRE_BYTES, AgentRejected
from app.domain.errors import GatewayUnreachable, QossError

__all__ = ["PeerUnreachable", "RemoteRefused", "plain_post", "post_message"]


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


class _Connection:
    """One kept-alive HTTP/1.1 connection to a plain-HTTP peer (used by one request at a time)."""

    __slots__ = ("_body", "_done", "_framed", "_headed", "_host", "_keep", "_parser", "_size", "sock")

    def __init__(self, origin: tuple[str, int], timeout: float) -> None:
        self.sock: socket.socket | None = socket.create_connection(origin, timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        host = origin[0] if ":" not in origin[0] else f"[{origin[0]}]"
        self._host = f"{host}:{origin[1]}".encode("idna")
        self._body: list[bytes] = []
        self._size = 0
        self._done = self._keep = self._framed = self._headed = False
        self._parser: httptools.HttpResponseParser | None = None

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    # httptools' callbacks
    def on_header(self, name: bytes, _value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self._framed = True

    def on_headers_complete(self) -> None:
        assert self._parser is not None
        self._keep = self._parser.should_keep_alive()
        self._headed = True

    def on_body(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._size <= _MAX_REPLY_BYTES:
            self._body.append(chunk)

    def on_message_complete(self) -> None:
        self._done = True

    def post(self, path: str, body: bytes, timeout: float) -> tuple[int, bytes, bool]:
        """Send the request in one write and read the whole answer: (status, body, keep alive).

        Raises:
            _TooLarge: the answer's body is over :data:`_MAX_REPLY_BYTES` (the rest is unread).
            ConnectionResetError: the peer closed the connection before the answer was complete
                (an answer without Content-Length or chunked encoding is complete when it closes).
            OSError, httptools.HttpParserError: the network or the answer failed.
        """
        assert self.sock is not None
        self.sock.settimeout(timeout)
        self.sock.sendall(
            b"POST " + path.encode("ascii") + b" HTTP/1.1\r\nHost: " + self._host
            + b"\r\nContent-Type: application/json\r\nAccept: application/json\r\nContent-Length: "
            + str(len(body)).encode("ascii") + b"\r\n\r\n" + body)
        self._body, self._size = [], 0
        self._done = self._keep = self._framed = self._headed = False
        self._parser = parser = httptools.HttpResponseParser(self)
        while not self._done:
            data = self.sock.recv(65536)
            if not data:
                if self._headed and not self._framed:  # read until close: this is its end
                    return parser.get_status_code(), b"".join(self._body), False
                raise ConnectionResetError("the peer closed the connection")
            parser.feed_data(data)
            if self._size > _MAX_REPLY_BYTES:
                raise _TooLarge
        return parser.get_status_code(), b"".join(self._body), self._keep


class _TooLarge(Exception):
    """An answer over the cap."""


class _Kept:
    """Idle kept-alive connections to plain-HTTP peers, per origin (at most ``max_idle`` each); a
    connection is used by one request at a time. Closed at exit."""

    def __init__(self, max_idle: int = 8) -> None:
        self.max_idle = max_idle
        self._lock = threading.Lock()
        self._idle: dict[tuple[str, int], list[_Connection]] = {}

    def take(self, origin: tuple[str, int]) -> _Connection | None:
        while True:
            with self._lock:
                idle = self._idle.get(origin)
                conn = idle.pop() if idle else None
            if conn is None or (conn.sock is not None and idle_and_open(conn.sock)):
                return conn
            conn.close()

    def give(self, origin: tuple[str, int], conn: _Connection) -> None:
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


#: An answer is one sealed message in a small JSON document (or an error document): more is refused unread.
_MAX_REPLY_BYTES = MAX_RESPONSE_WIRE_BYTES + 4096
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
            conn = _Connection(origin, timeout)
        try:
            status, content, keep = conn.post(path, body, timeout)
        except (ConnectionResetError, BrokenPipeError):
            conn.close()
            if not reused or attempt == 2:
                raise
            conn = None
            continue
        except _TooLarge:  # the rest is never read: the connection cannot be kept
            conn.close()
            raise RemoteRefused(502, "the remote party's answer is too large") from None
        except BaseException:
            conn.close()
            raise
        if keep:
            _KEPT.give(origin, conn)
        else:
            conn.close()
        return status, content
    raise AssertionError("unreachable")  # pragma: no cover


def plain_post(url: str, body: bytes, timeout: float) -> tuple[int, bytes] | None:
    """POST ``body`` (JSON) to a plain ``http://`` URL over this process's kept-alive connections,
    as the agent's messages go; (status, answer), or None where that path does not apply
    (``https://``, or a proxy from the environment: send it with httpx).

    Raises:
        RemoteRefused: the answer's body is over the cap (502).
        OSError, httptools.HttpParserError: the network or the answer failed (``TimeoutError``:
            no answer within ``timeout`` seconds, connecting or reading).
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or _proxied():
        return None
    return _plain_post(url, parts, body, timeout)


@functools.cache
def _proxied() -> bool:
    """Whether the environment names an HTTP proxy (then httpx, which honours it, carries plain
    HTTP too). Read once per process, like the environment it comes from: reading it costs
    about 40 us, on every message."""
    return any(k in urllib.request.getproxies() for k in ("http", "all"))


def post_message(url: str, wire: bytes, *, timeout: float = 20.0, client: httpx.Client | None = None,
                 fast_paths: bool = True) -> bytes:
    """POST one agent message; the answer's message bytes.

    Args:
        url: the peer's message route.
        wire: the sealed message.
        timeout: seconds for the connection and each read.
        client: an httpx client to send it with (else one shared per process).
        fast_paths: the ``fast_paths`` setting: plain HTTP on kept sockets (see the module); False: httpx.

    Raises:
        AgentRejected: the remote side rejected it (403: deliberately without a reason).
        RemoteRefused: another error status.
        PeerUnreachable: no answer.
    """
    parts = urllib.parse.urlsplit(url)
    if fast_paths and client is None and parts.scheme == "http" and not _proxied():
        body = json.dumps({"message": wire.decode("ascii")}, separators=(",", ":")).encode("ascii")
        try:
            status, content = _plain_post(url, parts, body, timeout)
        except (OSError, httptools.HttpParserError) as exc:
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
    if not isinstance(message, str) or len(message) > MAX_RESPONSE_WIRE_BYTES or not message.isascii():
        raise RemoteRefused(502, "the remote party's answer is malformed")
    return message.encode("ascii")
