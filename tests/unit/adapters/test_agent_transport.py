"""post_message over plain HTTP: kept-alive connections, a peer's idle close, the status table."""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from app.adapters.agent import transport
from app.adapters.agent.transport import PeerUnreachable, RemoteRefused, post_message
from app.domain.agent import AgentRejected


class Peer(ThreadingHTTPServer):
    """An agent peer on 127.0.0.1: echoes the message, or answers ``status`` with ``doc``."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.connections = 0
        self.status = 200
        self.doc: object = None
        self.bodies: list[bytes] = []
        self.reset_next = False  # reset the connection instead of answering (once)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1/agent/requests"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Peer

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.bodies.append(body)
        if self.server.reset_next:
            self.server.reset_next = False
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            return
        doc = self.server.doc if self.server.status != 200 else {"message": json.loads(body)["message"][::-1]}
        data = json.dumps(doc).encode()
        self.send_response(self.server.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def peer() -> Iterator[Peer]:
    server = Peer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    transport._KEPT.close()
    try:
        yield server
    finally:
        transport._KEPT.close()
        server.shutdown()
        server.server_close()


def test_one_kept_connection_carries_many_messages(peer: Peer) -> None:
    for wire in (b"abc", b"de-f_0", b"xyz"):
        assert post_message(peer.url, wire) == wire[::-1]
    assert peer.connections == 1
    assert json.loads(peer.bodies[0]) == {"message": "abc"}


def test_a_connection_the_peer_closed_while_idle_is_replaced(peer: Peer) -> None:
    assert post_message(peer.url, b"one") == b"eno"
    kept = transport._KEPT.take(("127.0.0.1", peer.server_address[1]))
    assert kept is not None
    assert kept.sock is not None
    kept.sock.shutdown(socket.SHUT_RDWR)  # as if the peer had closed it (its keep-alive timeout)
    transport._KEPT.give(("127.0.0.1", peer.server_address[1]), kept)
    assert post_message(peer.url, b"two") == b"owt"
    assert len(peer.bodies) == 2  # each message sent once
    assert peer.connections == 2


def test_statuses(peer: Peer) -> None:
    peer.status, peer.doc = 403, {"error": "AgentRejected", "detail": "the request was rejected"}
    with pytest.raises(AgentRejected):
        post_message(peer.url, b"m")
    peer.status, peer.doc = 409, {"error": "NoFeasibleSuite", "detail": "nothing meets the minimums"}
    with pytest.raises(RemoteRefused) as info:
        post_message(peer.url, b"m")
    assert (info.value.status, info.value.detail()) == (409, "nothing meets the minimums")
    peer.status, peer.doc = 200, None
    assert post_message(peer.url, b"ok") == b"ko"  # the connection survived the error answers
    assert peer.connections == 1


def test_malformed_answer_is_502(peer: Peer) -> None:
    peer.status, peer.doc = 500, "oops"
    with pytest.raises(RemoteRefused) as info:
        post_message(peer.url, b"m")
    assert info.value.status == 500


def test_nobody_listening_is_unreachable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(PeerUnreachable, match=f"127.0.0.1:{port}") as info:
        post_message(f"http://127.0.0.1:{port}/v1/agent/requests", b"m", timeout=1.0)
    assert isinstance(info.value.__cause__, ConnectionRefusedError)


def test_a_kept_connection_reset_as_the_request_goes_out_is_replaced_once(peer: Peer) -> None:
    assert post_message(peer.url, b"one") == b"eno"
    peer.reset_next = True
    assert post_message(peer.url, b"two") == b"owt"
    assert peer.connections == 2
    assert [json.loads(b)["message"] for b in peer.bodies] == ["one", "two", "two"]


def test_a_new_connection_reset_is_not_retried(peer: Peer) -> None:
    peer.reset_next = True
    with pytest.raises(PeerUnreachable):
        post_message(peer.url, b"one")
    assert len(peer.bodies) == 1


def test_an_oversized_answer_is_refused_unread_and_its_connection_not_kept(peer: Peer) -> None:
    peer.status, peer.doc = 409, {"detail": "x" * (transport._MAX_REPLY_BYTES + 10)}
    with pytest.raises(RemoteRefused) as info:
        post_message(peer.url, b"m")
    assert (info.value.status, info.value.detail()) == (502, "the remote party's answer is too large")
    peer.status, peer.doc = 200, None
    assert post_message(peer.url, b"ok") == b"ko"
    assert peer.connections == 2  # the oversized answer's connection was closed, a new one made


def _raw_peer(answer: bytes) -> tuple[str, threading.Thread, socket.socket]:
    """A peer that reads one request and writes ``answer`` as is, then closes."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return f"http://127.0.0.1:{server.getsockname()[1]}/v1/agent/requests", thread, server


def test_a_chunked_answer_is_read_whole() -> None:
    doc = json.dumps({"message": "olleh"}).encode()
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (doc[:5], doc[5:])) + b"0\r\n\r\n"
    url, thread, server = _raw_peer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                                    + chunks)
    with server:
        assert post_message(url, b"hello") == b"olleh"
        thread.join(timeout=5)


@pytest.mark.parametrize("answer", [b"SSH-2.0-OpenSSH_9.2\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{"])
def test_an_answer_that_is_not_http_or_cut_short_is_unreachable(answer: bytes) -> None:
    url, thread, server = _raw_peer(answer)
    with server, pytest.raises(PeerUnreachable):
        post_message(url, b"hello", timeout=2.0)
    thread.join(timeout=5)


def test_a_proxy_in_the_environment_sends_plain_http_through_httpx(monkeypatch: pytest.MonkeyPatch) -> None:
    """With http_proxy set (read once per process), the message goes through httpx, which honours
    it: here a proxy that is not there, so the peer is unreachable although it listens."""
    url, thread, server = _raw_peer(b"HTTP/1.1 200 OK\r\nContent-Length: 19\r\n\r\n" + b'{"message":"olleh"}')
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.setattr(transport, "_SHARED", None)  # a client of its own: it takes the proxy along
    transport._proxied.cache_clear()
    with server:
        try:
            with pytest.raises(PeerUnreachable):
                post_message(url, b"hello", timeout=2.0)
        finally:
            transport._proxied.cache_clear()
            if transport._SHARED is not None:
                transport._SHARED.close()
                transport._SHARED = None
        monkeypatch.delenv("http_proxy")
        assert post_message(url, b"hello") == b"olleh"  # read again without the proxy: straight there
    thread.join(timeout=5)


def scripted_peer(connections: list[list[bytes]]) -> tuple[str, threading.Thread, socket.socket, list[int]]:
    """A peer that takes ``len(connections)`` connections one after another and answers each
    request on the n-th with the n-th script's next answer, then closes that connection."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[int] = []

    def read_request(conn: socket.socket, pending: bytes) -> bytes:
        while b"\r\n\r\n" not in pending:
            pending += conn.recv(65536)
        head, _, rest = pending.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")))
        while len(rest) < length:
            rest += conn.recv(65536)
        return rest[length:]

    def serve() -> None:
        for script in connections:
            conn, _ = server.accept()
            accepted.append(1)
            with conn:
                pending = b""
                for answer in script:
                    pending = read_request(conn, pending)
                    conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return f"http://127.0.0.1:{server.getsockname()[1]}/v1/agent/requests", thread, server, accepted


_DOC = b'{"message":"olleh"}'
_FRAMED = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 19\r\n\r\n" + _DOC


@pytest.mark.parametrize("head", [
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n",
    b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n",
], ids=["1.1-close", "1.1-no-length", "1.0"])
def test_an_answer_ended_by_closing_the_connection_is_read_whole(head: bytes) -> None:
    """No Content-Length, not chunked: the body is what comes before the peer closes (RFC 9112
    §6.3), not a reset connection; that connection is not kept."""
    transport._KEPT.close()
    url, thread, server, accepted = scripted_peer([[head + _DOC]])
    origin = ("127.0.0.1", server.getsockname()[1])
    with server:
        assert post_message(url, b"hello", timeout=5.0) == b"olleh"
        thread.join(timeout=5)
    assert accepted == [1]
    assert transport._KEPT.take(origin) is None


def test_an_error_answer_ended_by_closing_the_connection_keeps_its_status_and_detail() -> None:
    transport._KEPT.close()
    url, thread, server, _ = scripted_peer([[
        b'HTTP/1.1 409 Conflict\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n'
        b'{"error":"Conflict","detail":"taken"}']])
    with server, pytest.raises(RemoteRefused) as caught:
        post_message(url, b"hello", timeout=5.0)
    thread.join(timeout=5)
    assert (caught.value.status, caught.value.remote_detail) == (409, "taken")


def test_after_an_answer_ended_by_close_the_next_connection_is_kept_alive_and_reused() -> None:
    transport._KEPT.close()
    close_delimited = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n" + _DOC
    url, thread, server, accepted = scripted_peer([[close_delimited], [_FRAMED, _FRAMED, _FRAMED]])
    with server:
        for _ in range(4):
            assert post_message(url, b"hello", timeout=5.0) == b"olleh"
        thread.join(timeout=5)
    assert len(accepted) == 2  # one for the closed answer, one kept for the three after it
    transport._KEPT.close()


def test_with_fast_paths_off_plain_http_goes_through_httpx(peer: Peer) -> None:
    for wire in (b"abc", b"xyz"):
        assert post_message(peer.url, wire, fast_paths=False) == wire[::-1]
    assert transport._KEPT.take(("127.0.0.1", peer.server_address[1])) is None  # no socket of ours kept
    assert peer.connections == 1  # httpx keeps its own connection alive
