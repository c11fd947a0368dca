"""A peer's API over HTTP, both ways the link can send (plain kept-alive connections, httpx): the
same answer, the same errors naming the peer, against a real HTTP server on loopback."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from app.adapters.peering import HttpPeerLink
from app.domain.errors import PeerTimeout, PeerUnreachable


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, str | None, bytes]] = []

    def do_POST(self) -> None:
        data = self.rfile.read(int(self.headers.get("content-length", "0")))
        type(self).seen.append((self.path, self.headers.get("content-type"), data))
        if self.path == "/slow":
            time.sleep(1.5)
        status, body = {"/big": (200, b"x" * (300 * 1024)), "/refused": (409, b'{"detail": "no"}')}.get(
            self.path, (200, b"answer:" + data))
        with contextlib.suppress(OSError):  # the client gave up
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that gave up (the timeout case) is no error here


@pytest.fixture
def server() -> Iterator[str]:
    httpd = _Server(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    _Handler.seen = []
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


@pytest.fixture(params=[True, False], ids=["plain", "httpx"])
def link(request: pytest.FixtureRequest) -> Iterator[HttpPeerLink]:
    sender = HttpPeerLink(plain=request.param)
    try:
        yield sender
    finally:
        sender.close()


def test_a_message_is_posted_as_json_and_its_answer_read(server: str, link: HttpPeerLink) -> None:
    for i in range(3):  # the connection is kept between messages
        assert link.post("site-b", f"{server}/v1/peering/messages", b"sealed%d" % i, 5) == (200, b"answer:sealed%d" % i)
    assert [(path, kind) for path, kind, _ in _Handler.seen] == [("/v1/peering/messages", "application/json")] * 3


def test_an_error_status_is_the_peers_answer(server: str, link: HttpPeerLink) -> None:
    assert link.post("site-b", f"{server}/refused", b"m", 5) == (409, b'{"detail": "no"}')


def test_an_answer_over_the_cap_names_the_peer(server: str, link: HttpPeerLink) -> None:
    with pytest.raises(PeerUnreachable, match="site-b"):
        link.post("site-b", f"{server}/big", b"m", 5)


def test_no_answer_in_time_is_a_timeout_naming_the_peer(server: str, link: HttpPeerLink) -> None:
    with pytest.raises(PeerTimeout, match="site-b"):
        link.post("site-b", f"{server}/slow", b"m", 0.3)


def test_nobody_listening_is_unreachable_naming_the_peer(link: HttpPeerLink) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(PeerUnreachable, match="site-b"):
        link.post("site-b", f"http://127.0.0.1:{port}/v1/peering/messages", b"m", 2)
